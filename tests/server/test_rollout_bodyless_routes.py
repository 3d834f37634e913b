"""``close`` and ``status`` take no body (docs/rollout.md's route table) and ignore one that comes.

A close with a body that was not JSON (``text/plain`` "bye", a form) was refused as
``invalid_request``, and the session stayed open: a client that meant to close it held its
capacity until the TTL.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
BODIES = [
    (b"bye", "text/plain"),
    (b"reason=done", "application/x-www-form-urlencoded"),
    (b"\xc1", "application/msgpack"),
    (b'{"reason": "done"}', "application/json"),
]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    settings = ServerSettings()
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with serving(app) as server, httpx.Client(base_url=server.http_url) as client:
        yield client


@pytest.mark.parametrize(("body", "media"), BODIES)
def test_close_ignores_its_body(http: httpx.Client, body: bytes, media: str) -> None:
    session_id = http.post(SESSIONS, json={"model": "toy"}).json()["session_id"]
    headers = {"content-type": media, "accept": "application/json"}  # JSON answers, whatever was sent
    closed = http.post(f"{SESSIONS}/{session_id}/close", content=body, headers=headers)
    assert closed.status_code == 200, closed.text
    assert closed.json()["closed"] is True
    status = http.request("GET", f"{SESSIONS}/{session_id}/status", content=body, headers=headers)
    assert status.status_code == 200, status.text
    assert status.json()["closed"] is True
