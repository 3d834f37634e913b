"""``close`` and ``status`` take no body (docs/rollout.md's route table) and ignore one that comes.

A close with a body that was not JSON (``text/plain`` "bye", a form) was refused as
``invalid_request``, and the session stayed open: a client that meant to close it held its
capacity until the TTL.
"""

from __future__ import annotations

import httpx
import pytest

SESSIONS = "/v1/realtime/sessions"
BODIES = [
    (b"bye", "text/plain"),
    (b"reason=done", "application/x-www-form-urlencoded"),
    (b"\xc1", "application/msgpack"),
    (b'{"reason": "done"}', "application/json"),
]


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
