"""A client's start state (``reset`` with ``state``, or ``observation.extra["observation/state"]`` on a
fresh-context step) must lie within the observation bounds the world publishes on ``/v1/models``
(inclusive, as ``observation_space`` is): outside them it is ``invalid_request`` naming the bound and
the first offending index, with nothing committed; at or inside them the episode starts exactly
there. A clamp would start from a state the client did not ask for, so the worlds refuse instead."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

FAST = ServerSettings(max_batch_wait_ms=0.0)
# world -> (state length, published bound): written down here, not read from the world
WORLDS = {"toy": (15, 1.0), "learned": (13, 4.0)}
NAMES = {
    "toy": (*(f"joint_{i}" for i in range(7)), "gripper", *(f"target_{i}" for i in range(7))),
    "learned": (
        *(f"joint_{i}" for i in range(1, 8)),
        *("gripper", "cube_x", "cube_y", "cube_z", "target_x", "target_y"),
    ),
}
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}


@pytest.fixture(scope="module", params=list(WORLDS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, httpx.Client]]:
    world = load_world(request.param)
    app = create_app(FAST, rollout=RolloutService(world, FAST))
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=60.0) as client:
        yield request.param, client


def _create(http: httpx.Client, model: str) -> str:
    resp = http.post("/v1/realtime/sessions", json={"model": model, "seed": 3})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def _step(step_id: int, state: list[float] | None, context: bool = True) -> dict:
    extra = {} if state is None else {"observation/state": state}
    observation = {"extra": extra}
    return {"step_id": step_id, "observation": observation, "action": ACTION, "use_session_context": context}


def _observation(obs: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(obs["video_latent"]), dtype=np.float32)


def _status(http: httpx.Client, sid: str) -> tuple[int, int]:
    body = http.get(f"/v1/realtime/sessions/{sid}/status").json()
    return body["committed_step_id"], body["context_length"]


def _just_outside(bound: float) -> float:
    """The first float32 past ``bound`` (the state reaches the world as float32)."""
    return float(np.nextafter(np.float32(bound), np.float32(2 * bound)))


def _out_of_bounds(model: str) -> tuple[list[float], str]:
    """A state that leaves the bounds first at index 3 (below) and again at index 9 (above)."""
    n, bound = WORLDS[model]
    state = [0.0] * n
    state[3] = _just_outside(-bound)
    state[9] = 100.0
    value = repr(state[3])  # the value as sent (float64), not rounded to float32
    message = f"start state value {value} at index 3 ({NAMES[model][3]}) is below observation_low {-bound}"
    return state, message


def _at_bounds(model: str) -> list[float]:
    n, bound = WORLDS[model]
    return [bound if i % 2 else -bound for i in range(n)]


def test_the_worlds_publish_the_bounds_the_tests_use(served: tuple[str, httpx.Client]) -> None:
    model, http = served
    (entry,) = [m for m in http.get("/v1/models").json()["data"] if m["id"] == model]
    n, bound = WORLDS[model]
    assert entry["observation"]["low"] == [-bound] * n
    assert entry["observation"]["high"] == [bound] * n
    assert entry["observation"]["names"] == list(NAMES[model])


def test_a_reset_outside_the_bounds_is_invalid_request_and_keeps_the_episode(
    served: tuple[str, httpx.Client],
) -> None:
    model, http = served
    sid = _create(http, model)
    assert http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, None)).status_code == 200
    state, message = _out_of_bounds(model)
    above = [0.0] * WORLDS[model][0]
    above[-1] = _just_outside(WORLDS[model][1])
    above_message = (
        f"start state value {above[-1]!r} at index {len(above) - 1} ({NAMES[model][-1]}) "
        f"is above observation_high {WORLDS[model][1]}"
    )
    for bad, said in ((state, message), (above, above_message), ([100.0] * WORLDS[model][0], None)):
        resp = http.post(f"/v1/realtime/sessions/{sid}/reset", json={"state": bad})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["reason"] == "invalid_request"
        if said is not None:
            assert error["message"] == said
        assert _status(http, sid) == (0, 1)
    resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(1, None))  # the episode goes on
    assert resp.status_code == 200 and resp.json()["error"] is None


@pytest.mark.parametrize("context", [True, False], ids=["step 0", "stateless step"])
def test_a_step_from_a_start_outside_the_bounds_is_invalid_request(
    served: tuple[str, httpx.Client], context: bool
) -> None:
    model, http = served
    sid = _create(http, model)
    state, message = _out_of_bounds(model)
    for bad, said in ((state, message), ([1e30] * WORLDS[model][0], None)):
        resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, bad, context))
        assert resp.status_code == 400, resp.text
        body = resp.json()
        assert body["error"]["code"] == "invalid_request"
        if said is not None:
            assert body["error"]["message"] == said
        assert body["next_observation"] is None
        assert _status(http, sid) == (-1, 0)


@pytest.mark.parametrize("where", ["at the bounds", "inside the bounds"])
def test_a_start_within_the_bounds_starts_there(served: tuple[str, httpx.Client], where: str) -> None:
    model, http = served
    n, bound = WORLDS[model]
    start = _at_bounds(model) if where == "at the bounds" else [bound * (i - n / 2) / n for i in range(n)]
    sid = _create(http, model)
    reset = http.post(f"/v1/realtime/sessions/{sid}/reset", json={"state": start})
    assert reset.status_code == 200, reset.text
    assert _observation(reset.json()["observation"]).tolist() == np.float32(start).tolist()
    after_reset = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, None))
    assert after_reset.status_code == 200, after_reset.text
    fresh = _create(http, model)  # the same start chosen on step 0 steps the same way
    stepped = http.post(f"/v1/realtime/sessions/{fresh}/step", json=_step(0, start))
    assert stepped.status_code == 200, stepped.text
    assert stepped.json()["error"] is None
    nxt = _observation(stepped.json()["next_observation"])
    assert nxt.tolist() == _observation(after_reset.json()["next_observation"]).tolist()
    assert _status(http, fresh) == (0, 1)
    if model == "toy":  # joints and gripper move halfway to the action; the targets stay
        target = np.float32([*ACTION["joint_positions"], ACTION["gripper_position"]])
        joints = np.float32(start[:8])
        np.testing.assert_allclose(nxt[:8], joints + 0.5 * (target - joints), rtol=0, atol=1e-6)
        assert nxt[8:].tolist() == np.float32(start[8:]).tolist()
