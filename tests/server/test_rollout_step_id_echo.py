"""A refused step reports the request's step_id only when it is a valid one.

An out-of-range step_id (2**64, sent in a JSON body) with a msgpack answer used to crash the route
(msgpack cannot encode it: a 500 and a traceback in the log); every invalid one now reads -1.
"""

from __future__ import annotations

import httpx
import msgpack
import pytest

SESSIONS = "/v1/realtime/sessions"


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
