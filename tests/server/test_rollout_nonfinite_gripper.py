"""A NaN or infinite scalar ``gripper_position`` reads as one clean message on every way in.

``tests/server/test_rollout_validation_messages.py`` pins the JSON step route in vLLM-Omni mode; this
pins the rest: strict mode (422, the status unchanged), msgpack bodies carrying the scalar as a
Python float, a numpy scalar or a 0-d array, and a ``batch_step`` item. Each answers
``invalid_request`` with exactly the field and what is wrong with it: no pydantic type names, no
"should be a valid list" for a value that was a number, no echo of the input.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from rollserve.wire.codec import packb

SESSIONS = "/v1/realtime/sessions"
SAID = "action.gripper_position: Value error, must be finite and within float32 range"
STATUS = {"vllm-omni": 400, "strict": 422}  # invalid_request's status in each mode (docs/rollout.md)
NOT_FINITE: dict[str, Any] = {
    "float nan": float("nan"),
    "float -inf": float("-inf"),
    "np.float32 nan": np.float32("nan"),
    "np.float64 inf": np.float64("inf"),
    "0-d array nan": np.array(np.nan, dtype=np.float32),
}


def _step(gripper: Any) -> dict[str, Any]:
    action = {"joint_positions": np.zeros(7, np.float32), "gripper_position": gripper}
    return {"step_id": 0, "observation": {}, "action": action}


def _post(http: httpx.Client, path: str, body: dict[str, Any], mode: str) -> httpx.Response:
    headers = {"content-type": "application/msgpack", "accept": "application/json"}
    return http.post(path, content=packb(body), headers={**headers, "x-rollserve-status-codes": mode})


def _session(http: httpx.Client) -> str:
    return str(http.post(SESSIONS, json={"model": "toy"}).json()["session_id"])


@pytest.mark.parametrize("mode", list(STATUS))
@pytest.mark.parametrize("value", list(NOT_FINITE))
def test_a_step_with_a_non_finite_gripper_scalar_says_so_cleanly(
    http: httpx.Client, value: str, mode: str
) -> None:
    sid = _session(http)
    resp = _post(http, f"{SESSIONS}/{sid}/step", _step(NOT_FINITE[value]), mode)
    assert resp.status_code == STATUS[mode], resp.text
    error = resp.json()["error"]
    assert (error["code"], error["message"]) == ("invalid_request", SAID)


@pytest.mark.parametrize("mode", list(STATUS))
def test_a_batch_item_with_a_non_finite_gripper_scalar_says_so_cleanly(http: httpx.Client, mode: str) -> None:
    good, bad = _session(http), _session(http)
    items = [{**_step(0.5), "session_id": good}, {**_step(np.float32("nan")), "session_id": bad}]
    resp = _post(http, "/v1/realtime/batch_step", {"items": items}, mode)
    assert resp.status_code == 200, resp.text  # the batch answers; its bad item fails alone
    ok, refused = resp.json()["results"]
    assert ok["status"] == "ok" and refused["status"] == "error"
    assert (refused["error"]["code"], refused["error"]["message"]) == ("invalid_request", SAID)
