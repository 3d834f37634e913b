"""A bool where a number belongs (``gripper_position: true``, an item of ``joint_positions`` or
``observation.state``, a reset's ``state``, a create's ``render`` sizes) is refused like any other
value of the wrong type, JSON or msgpack (numpy bool arrays too), and commits nothing; lax
validation used to read ``true`` as 1.0. Ints still stand for floats. Real server over the toy
world, default (vLLM-Omni) status codes: invalid_request is a 400."""

from __future__ import annotations

import base64
import copy
from typing import Any

import httpx
import numpy as np
import pytest
from toy_rule import moved

from rollserve.wire.codec import packb

MSGPACK = "application/msgpack"
SESSIONS = "/v1/realtime/sessions"
JOINTS = [0.1] * 7
STATE = [0.2] * 15  # the toy world's observation size
WRONG_TYPE: dict[str, Any] = {}  # an ordinary value of the wrong type, refused before this fix too


def _step(step_id: int = 0) -> dict[str, Any]:
    return {
        "step_id": step_id,
        "observation": {"prompt": "reach", "state": list(STATE)},
        "action": {"joint_positions": list(JOINTS), "gripper_position": 0.5},
    }


def _with(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """``body`` with the value at ``path`` replaced."""
    out = copy.deepcopy(body)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _post(http: httpx.Client, path: str, body: dict[str, Any], *, as_msgpack: bool) -> httpx.Response:
    if as_msgpack:
        headers = {"content-type": MSGPACK, "accept": "application/json"}
        return http.post(path, content=packb(body), headers=headers)
    return http.post(path, json=body)


def _create(http: httpx.Client, seed: int = 3) -> tuple[str, np.ndarray]:
    resp = http.post(SESSIONS, json={"model": "toy", "seed": seed})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"], _latent(resp.json()["observation"])


def _latent(observation: dict[str, Any]) -> np.ndarray:
    data = base64.b64decode(observation["video_latent"])
    return np.frombuffer(data, dtype="<f4").reshape(-1)


def _near(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float32 rounding (the world and ``moved`` round in another order)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def _committed(http: httpx.Client, sid: str) -> int:
    return http.get(f"{SESSIONS}/{sid}/status").json()["committed_step_id"]


def _refused_step(http: httpx.Client, body: dict[str, Any], *, as_msgpack: bool) -> str:
    """The message of a refused step 0 on a fresh session; checks that nothing was committed."""
    sid, _ = _create(http)
    resp = _post(http, f"{SESSIONS}/{sid}/step", body, as_msgpack=as_msgpack)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["step_id"], error["committed_step_id"]) == ("invalid_request", 0, -1)
    assert resp.json()["next_observation"] is None
    assert _committed(http, sid) == -1
    ok = http.post(f"{SESSIONS}/{sid}/step", json=_step(0))  # the session still takes its step 0
    assert ok.status_code == 200 and ok.json()["error"] is None and _committed(http, sid) == 0
    return str(error["message"])


BOOL_PLACES = {
    "gripper_position": ("action", "gripper_position"),
    "joint_positions item": ("action", "joint_positions", 3),
    "observation.state item": ("observation", "state", 14),
    "gripper_position list item": ("action", "gripper_position"),
}


@pytest.mark.parametrize("as_msgpack", [False, True], ids=["json", "msgpack"])
@pytest.mark.parametrize("place", list(BOOL_PLACES))
def test_a_bool_where_a_number_belongs_is_refused_like_a_wrong_type(
    http: httpx.Client, place: str, as_msgpack: bool
) -> None:
    path = BOOL_PLACES[place]
    wrap = (lambda v: [v]) if place.endswith("list item") else (lambda v: v)
    for flag in (True, False):
        message = _refused_step(http, _with(_step(), path, wrap(flag)), as_msgpack=as_msgpack)
        wrong = _refused_step(http, _with(_step(), path, wrap(WRONG_TYPE)), as_msgpack=as_msgpack)
        assert message == wrong  # the very answer an ordinary wrong type gets
        assert "Input should be a valid number" in message


@pytest.mark.parametrize(
    "action",
    [
        {"joint_positions": np.ones(7, dtype=bool), "gripper_position": 0.5},
        {"joint_positions": np.full(7, 0.1), "gripper_position": np.bool_(True)},
        {"joint_positions": np.full(7, 0.1), "gripper_position": np.ones(1, dtype=bool)},
    ],
    ids=["bool joint array", "numpy bool gripper", "bool gripper array"],
)
def test_numpy_bools_in_a_msgpack_body_are_refused(http: httpx.Client, action: dict[str, Any]) -> None:
    message = _refused_step(http, {**_step(), "action": action}, as_msgpack=True)
    assert "Input should be a valid number" in message


@pytest.mark.parametrize("as_msgpack", [False, True], ids=["json", "msgpack"])
def test_ints_and_numpy_arrays_still_stand_for_floats(http: httpx.Client, as_msgpack: bool) -> None:
    sid, start = _create(http)
    action = {"joint_positions": [1, 0, -1, 0, 1, 0, -1], "gripper_position": 1}
    body = {"step_id": 0, "observation": {"state": [0] * 15}, "action": action}
    resp = _post(http, f"{SESSIONS}/{sid}/step", body, as_msgpack=as_msgpack)
    assert resp.status_code == 200 and resp.json()["error"] is None, resp.text
    target = np.array([1, 0, -1, 0, 1, 0, -1, 1], dtype=np.float32)
    _near(_latent(resp.json()["next_observation"]), moved(start, target))
    if as_msgpack:
        arrays = {"joint_positions": np.zeros(7, np.float32), "gripper_position": np.float32(0.0)}
        then = {**body, "step_id": 1, "action": arrays}
        resp = _post(http, f"{SESSIONS}/{sid}/step", then, as_msgpack=True)
        assert resp.status_code == 200 and resp.json()["error"] is None, resp.text
        _near(_latent(resp.json()["next_observation"]), moved(start, target, np.zeros(8, np.float32)))


@pytest.mark.parametrize("as_msgpack", [False, True], ids=["json", "msgpack"])
def test_a_bool_fails_only_its_own_batch_item(http: httpx.Client, as_msgpack: bool) -> None:
    (bad, _), (good, start) = _create(http), _create(http)
    items = [
        {**_with(_step(), ("action", "joint_positions", 0), True), "session_id": bad},
        {**_step(), "session_id": good},
    ]
    resp = _post(http, "/v1/realtime/batch_step", {"items": items}, as_msgpack=as_msgpack)
    assert resp.status_code == 200, resp.text
    refused, stepped = resp.json()["results"]
    assert (refused["session_id"], refused["status"]) == (bad, "error")
    assert refused["error"]["code"] == "invalid_request"
    assert refused["error"]["message"] == "action.joint_positions.0: Input should be a valid number"
    assert (stepped["session_id"], stepped["status"], stepped["error"]) == (good, "ok", None)
    target = np.array([*JOINTS, 0.5], dtype=np.float32)
    _near(_latent(stepped["next_observation"]), moved(start, target))
    assert (_committed(http, bad), _committed(http, good)) == (-1, 0)


def test_a_bool_in_a_reset_state_is_refused_and_ints_are_not(http: httpx.Client) -> None:
    sid, _ = _create(http)
    assert http.post(f"{SESSIONS}/{sid}/step", json=_step(0)).status_code == 200
    refusals = []
    for value in (True, WRONG_TYPE):
        resp = http.post(f"{SESSIONS}/{sid}/reset", json={"state": [0] * 14 + [value]})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["reason"] == "invalid_request"
        refusals.append(resp.json()["detail"])
    assert refusals[0] == refusals[1] == "state.14: Input should be a valid number"
    assert _committed(http, sid) == 0  # the refused reset left the episode as it was
    resp = http.post(f"{SESSIONS}/{sid}/reset", json={"state": [0] * 15})
    assert resp.status_code == 200, resp.text
    np.testing.assert_array_equal(_latent(resp.json()["observation"]), np.zeros(15, np.float32))


@pytest.mark.parametrize("field", ["height", "width", "jpeg_quality"])
def test_a_bool_render_size_is_refused_like_a_wrong_type(http: httpx.Client, field: str) -> None:
    details = []
    for value in (True, WRONG_TYPE):
        resp = http.post(SESSIONS, json={"model": "toy", "render": {field: value}})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["reason"] == "invalid_request"
        details.append(resp.json()["detail"])
    assert details[0] == details[1] == f"render.{field}: Input should be a valid integer"


EXTRA_BOOLS = {
    "joint list": ("observation/joint_position", [0.1, 0.1, True, 0.1, 0.1, 0.1, 0.1]),
    "gripper scalar": ("observation/gripper_position", True),
    "nested state": ("observation/state", [[0.2] * 7, [0.2] * 7 + [False]]),
}


@pytest.mark.parametrize("as_msgpack", [False, True], ids=["json", "msgpack"])
@pytest.mark.parametrize("case", list(EXTRA_BOOLS))
def test_a_bool_in_an_extra_vector_the_world_reads_is_refused(
    http: httpx.Client, case: str, as_msgpack: bool
) -> None:
    """``observation.extra``'s DROID vectors are numbers the world reads, checked like the action's:
    numpy read ``true`` there as 1.0 and the step committed."""
    key, value = EXTRA_BOOLS[case]
    body = _step()
    if key != "observation/state":
        body["action"] = {}  # the extra vector stands in for the action's own
    body["observation"]["extra"] = {key: value}
    message = _refused_step(http, body, as_msgpack=as_msgpack)
    assert message == f"observation.extra[{key!r}] must hold numbers, not booleans", message


def test_a_numpy_bool_array_in_an_extra_vector_is_refused(http: httpx.Client) -> None:
    body = _step()
    body["observation"]["extra"] = {"observation/gripper_position": np.ones(1, dtype=bool)}
    message = _refused_step(http, body, as_msgpack=True)
    assert "must hold numbers, not booleans" in message
