"""A ``batch_step`` item that fails validation on its own (non-finite or float32-overflowing
numbers, a list over the vector cap, a bool step_id) is that item's ``invalid_request`` result:
the other items step, as docs/rollout.md promises ("one bad item never fails the others"). Only
a body that is wrong as a whole (no list of items, an item that is not a map or names no session)
is still refused whole. Real server, default (vLLM-Omni) status codes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutRequestError
from rollserve.client.rollout_env import RolloutVectorEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import packb

MSGPACK = "application/msgpack"
GOOD_ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
FINITE_F32 = "Value error, must be finite and within float32 range"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with serving(app) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        yield client


def _create(http: httpx.Client) -> str:
    resp = http.post(
        "/v1/realtime/sessions", json={"model": "toy", "seed": 1, "session_id": uuid.uuid4().hex}
    )
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def _item(sid: str, step_id: object = 0, action: object = None, **observation: object) -> dict:
    return {
        "session_id": sid,
        "step_id": step_id,
        "observation": {"prompt": "reach", **observation},
        "action": GOOD_ACTION if action is None else action,
    }


def _batch(http: httpx.Client, items: list, *, as_msgpack: bool = False) -> httpx.Response:
    if as_msgpack:
        headers = {"content-type": MSGPACK, "accept": "application/json"}
        return http.post("/v1/realtime/batch_step", content=packb({"items": items}), headers=headers)
    return http.post("/v1/realtime/batch_step", json={"items": items})


def _committed(http: httpx.Client, sid: str) -> int:
    return http.get(f"/v1/realtime/sessions/{sid}/status").json()["committed_step_id"]


def _joints(first: float) -> dict:
    return {"joint_positions": [first] + [0.0] * 6, "gripper_position": 0.0}


# name -> (bad item's step_id, action, observation, msgpack?, the item's error message)
BAD_ITEMS = {
    "NaN joint": (0, _joints(float("nan")), {}, True, f"action.joint_positions.0: {FINITE_F32}"),
    "inf joint": (0, _joints(float("inf")), {}, True, f"action.joint_positions.0: {FINITE_F32}"),
    "1e308 joint (inf as float32)": (0, _joints(1e308), {}, False, f"action.joint_positions.0: {FINITE_F32}"),
    "NaN gripper": (0, {**GOOD_ACTION, "gripper_position": float("nan")}, {}, True, None),
    "state of 2000 values": (
        0,
        GOOD_ACTION,
        {"state": [0.0] * 2000},
        False,
        "observation.state: List should have at most 1024 items after validation, not 2000",
    ),
    "bool step_id": (True, GOOD_ACTION, {}, False, "step_id: Input should be a valid integer"),
}


@pytest.mark.parametrize("name", list(BAD_ITEMS))
@pytest.mark.parametrize("bad_first", [False, True])
def test_a_bad_item_fails_alone_and_the_others_commit(http: httpx.Client, name: str, bad_first: bool) -> None:
    step_id, action, observation, as_msgpack, message = BAD_ITEMS[name]
    good, bad = _create(http), _create(http)
    items = [_item(good), _item(bad, step_id, action, **observation)]
    if bad_first:
        items.reverse()
    resp = _batch(http, items, as_msgpack=as_msgpack)
    assert resp.status_code == 200, resp.text
    results = {r["session_id"]: r for r in resp.json()["results"]}
    assert [r["session_id"] for r in resp.json()["results"]] == [i["session_id"] for i in items]
    assert results[good]["status"] == "ok" and results[good]["error"] is None
    assert results[good]["model_metadata"]["committed_step_id"] == 0
    refused = results[bad]
    assert refused["status"] == "error" and refused["next_observation"] is None
    assert refused["error"]["code"] == "invalid_request"
    if message is not None:
        assert refused["error"]["message"] == message
    # a valid step_id is echoed; a bool one is not a step_id (-1, as the step route answers it)
    assert refused["step_id"] == refused["error"]["step_id"] == (-1 if step_id is True else 0)
    assert refused["error"]["committed_step_id"] == refused["model_metadata"]["committed_step_id"] == -1
    assert "Traceback" not in resp.text
    assert (_committed(http, good), _committed(http, bad)) == (0, -1)
    again = _batch(http, [_item(bad, 0)])  # nothing of the refused item stuck
    assert again.json()["results"][0]["status"] == "ok" and _committed(http, bad) == 0


def test_a_refused_item_reports_its_session_as_the_batch_left_it(http: httpx.Client) -> None:
    sid = _create(http)
    assert _batch(http, [_item(sid, 0)]).json()["results"][0]["status"] == "ok"
    other = _create(http)
    resp = _batch(http, [_item(other, 0), _item(sid, 1, _joints(1e308))])
    refused = resp.json()["results"][1]
    assert (refused["step_id"], refused["error"]["code"]) == (1, "invalid_request")
    assert refused["error"]["committed_step_id"] == refused["model_metadata"]["committed_step_id"] == 0
    assert refused["model_metadata"]["context_length"] == 1
    assert (_committed(http, sid), _committed(http, other)) == (0, 0)


def test_a_session_still_appears_once_per_batch_when_one_of_its_items_is_refused(http: httpx.Client) -> None:
    sid, other = _create(http), _create(http)
    bad_then_good = [_item(sid, 0, _joints(1e308)), _item(sid, 0), _item(other, 0)]
    results = _batch(http, bad_then_good).json()["results"]
    assert [r["status"] for r in results] == ["error", "error", "ok"]
    assert results[0]["error"]["message"] == f"action.joint_positions.0: {FINITE_F32}"
    assert results[1]["error"]["message"] == "a session may appear only once per batch_step"
    assert _committed(http, sid) == -1
    good_then_bad = [_item(sid, 0), _item(sid, 1, _joints(1e308))]
    results = _batch(http, good_then_bad).json()["results"]
    assert [r["status"] for r in results] == ["ok", "error"]
    assert results[1]["error"]["message"] == f"action.joint_positions.0: {FINITE_F32}"
    assert results[1]["error"]["committed_step_id"] == 0 and _committed(http, sid) == 0


def test_every_item_refused_still_answers_each(http: httpx.Client) -> None:
    a, b = _create(http), _create(http)
    resp = _batch(http, [_item(a, 0, _joints(1e308)), _item(b, 0, state=[0.0] * 2000)])
    assert resp.status_code == 200, resp.text
    assert [r["error"]["code"] for r in resp.json()["results"]] == ["invalid_request"] * 2
    assert (_committed(http, a), _committed(http, b)) == (-1, -1)


WHOLE_BODY = {
    "an item that is not a map": (
        ["not a map"],
        "items.1: Input should be a valid dictionary or instance of BatchStepItem",
    ),
    "a bad item without a session_id": ([{"step_id": 0, "observation": {}, "action": _joints(1e308)}], None),
    "a bad item with a number for session_id": ([{**_item("x", 0, _joints(1e308)), "session_id": 7}], None),
}


@pytest.mark.parametrize("name", list(WHOLE_BODY))
def test_an_item_that_names_no_session_still_fails_the_whole_body(http: httpx.Client, name: str) -> None:
    extra, message = WHOLE_BODY[name]
    sid = _create(http)
    resp = _batch(http, [_item(sid, 0), *extra])
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["error"]["reason"] == "invalid_request"
    assert body["error"]["message"].startswith("items.1")
    if message is not None:
        assert body["error"]["message"] == message
    assert _committed(http, sid) == -1


@pytest.mark.parametrize("items", [[], "not a list", None])
def test_a_body_without_a_list_of_items_still_fails_whole(http: httpx.Client, items: object) -> None:
    resp = http.post("/v1/realtime/batch_step", json={"items": items})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["reason"] == "invalid_request"
    assert resp.json()["error"]["message"].startswith("items: ")


def test_the_vector_env_advances_the_sub_envs_whose_actions_are_finite(base_url: str) -> None:
    env = RolloutVectorEnv(4, base_url, model="toy")
    try:
        env.reset(seed=0)
        actions = np.zeros((4, 8), np.float32)
        actions[3, 0] = np.nan  # sub-env 3's policy diverged
        with pytest.raises(RolloutRequestError) as raised:
            env.step(actions)
        assert raised.value.code == "invalid_request"
        assert "must be finite" in str(raised.value)
        sessions = [s.session_id for s in env._sessions]
        assert [env.client.status(s)["committed_step_id"] for s in sessions] == [0, 0, 0, -1]
    finally:
        env.close()
