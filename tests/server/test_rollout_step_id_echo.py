"""A refused step reports the request's step_id only when it is a valid one.

An out-of-range step_id (2**64, sent in a JSON body) with a msgpack answer used to crash the route
(msgpack cannot encode it: a 500 and a traceback in the log); every invalid one now reads -1.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgpack
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    config = ServerSettings(max_batch_wait_ms=0.0)
    service = RolloutService(ToyWorld(), config)
    with (
        serving(create_app(config, rollout=service)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as client,
    ):
        yield client
    service.close()


def _refused_step(http: httpx.Client, step_id: object, accept: str, action: object) -> dict:
    sid = http.post(SESSIONS, json={"model": "toy", "seed": 0}).json()["session_id"]
    body = {"step_id": step_id, "observation": {}, "action": action}
    resp = http.post(f"{SESSIONS}/{sid}/step", json=body, headers={"accept": accept})
    assert resp.status_code == 400, resp.text
    return resp.json() if accept == "application/json" else msgpack.unpackb(resp.content)


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
@pytest.mark.parametrize("step_id", [2**64, 2**63, -5, 1.5, True, "3"])
def test_an_invalid_step_id_reads_minus_one(http: httpx.Client, step_id: object, accept: str) -> None:
    answer = _refused_step(http, step_id, accept, {})
    assert (answer["step_id"], answer["error"]["code"]) == (-1, "invalid_request")


@pytest.mark.parametrize("accept", ["application/json", "application/msgpack"])
@pytest.mark.parametrize("step_id", [0, 3, 2**63 - 1])
def test_a_valid_step_id_of_a_refused_step_is_echoed(http: httpx.Client, step_id: int, accept: str) -> None:
    answer = _refused_step(http, step_id, accept, {"joint_positions": [1e39] * 7})
    assert (answer["step_id"], answer["error"]["code"]) == (step_id, "invalid_request")
