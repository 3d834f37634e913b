"""A world refusing a client-chosen start state (``observation.extra["observation/state"]``) on a
fresh-context step (step 0, or a stateless step) is ``invalid_request`` with nothing committed, as
the same state sent to ``reset`` is; it is not the world failing (``inference_error``) and logs no
warning or traceback. The ``sim`` world starts from seeds only, so it refuses every start state.
The world's other failures on such a step stay ``inference_error``."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import httpx
import numpy as np
import pytest

from rollserve.models.sim_world import SimWorld
from rollserve.models.world import WorldInit, WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.protocol import (
    Action,
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    Observation,
    RolloutStepRequest,
)
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.status_codes import MODE_HEADER
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SERVICE_LOGGER = "rollserve.server.rollout.service"
SIM_REFUSAL = "the simulator world starts from a seed, not from a state vector"
START = [0.0, -0.3, 0.0, -2.5, 0.0, 0.7, 0.0, 0.0, 0.5, 0.1, 0.025, 0.5, -0.1]  # 13: sim's layout
ACTION = {"joint_positions": [0.0, 0.0, 0.0, -1.5, 0.0, 1.5, 0.7], "gripper_position": 0.0}
FAST = ServerSettings(max_batch_wait_ms=0.0)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    app = create_app(FAST, rollout=RolloutService(SimWorld(), FAST))
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=60.0) as client:
        yield client


def _create(http: httpx.Client) -> str:
    resp = http.post("/v1/realtime/sessions", json={"model": "sim", "seed": 4})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def _step(step_id: int, *, start: bool = True, context: bool = True) -> dict:
    extra = {"observation/state": START} if start else {}
    return {
        "step_id": step_id,
        "observation": {"extra": extra},
        "action": ACTION,
        "use_session_context": context,
    }


def _no_warnings(caplog: pytest.LogCaptureFixture) -> None:
    said = [r for r in caplog.records if r.name == SERVICE_LOGGER and r.levelno >= logging.WARNING]
    assert said == [], [r.getMessage() for r in said]
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize(("mode", "status"), [("vllm-omni", 400), ("strict", 422)])
@pytest.mark.parametrize("context", [True, False], ids=["step 0", "stateless step"])
def test_a_refused_start_state_is_invalid_request_like_on_reset(
    http: httpx.Client, caplog: pytest.LogCaptureFixture, mode: str, status: int, context: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVICE_LOGGER)
    sid = _create(http)
    url = f"/v1/realtime/sessions/{sid}"
    resp = http.post(f"{url}/step", json=_step(0, context=context), headers={MODE_HEADER: mode})
    assert resp.status_code == status, resp.text
    assert resp.json()["error"] == {
        "code": "invalid_request",
        "message": SIM_REFUSAL,
        "step_id": 0,
        "committed_step_id": -1,
    }
    assert resp.json()["next_observation"] is None
    reset = http.post(f"{url}/reset", json={"state": START}, headers={MODE_HEADER: mode})
    assert reset.status_code == status, reset.text
    assert reset.json()["error"]["message" if mode == "strict" else "reason"] == (
        SIM_REFUSAL if mode == "strict" else "invalid_request"
    )
    _no_warnings(caplog)
    assert http.get(f"{url}/status").json()["committed_step_id"] == -1
    ok = http.post(f"{url}/step", json=_step(0, start=False))  # the seeded start still steps
    assert ok.status_code == 200 and ok.json()["error"] is None


def test_a_refused_start_state_fails_only_its_batch_item(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVICE_LOGGER)
    refused, good = _create(http), _create(http)
    items = [{**_step(0), "session_id": refused}, {**_step(0, start=False), "session_id": good}]
    resp = http.post("/v1/realtime/batch_step", json={"items": items})
    assert resp.status_code == 200, resp.text
    first, second = resp.json()["results"]
    assert (first["status"], first["error"]["code"], first["error"]["message"]) == (
        "error",
        "invalid_request",
        SIM_REFUSAL,
    )
    assert first["error"]["committed_step_id"] == -1
    assert (second["status"], second["model_metadata"]["committed_step_id"]) == ("ok", 0)
    _no_warnings(caplog)


class StartWorld(ToyWorld):
    """The toy world, told how to fail: its start (``start_error``) or its step's answer (NaN)."""

    def __init__(self) -> None:
        self.start_error: BaseException | None = None
        self.nan_output = False

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        if self.start_error is not None:
            return [self.start_error for _ in inits]
        return super().initial_states(inits)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        outs = super().step_batch(steps)
        if self.nan_output:
            return [WorldOutput(state=o.state, observation=np.full(15, np.nan, np.float32)) for o in outs]
        return outs


def _request(step_id: int, extra: dict) -> RolloutStepRequest:
    action = Action(joint_positions=[0.1] * 7, gripper_position=0.5)
    return RolloutStepRequest(step_id=step_id, observation=Observation(extra=extra), action=action)


async def _first_step(extra: dict, **failures: object) -> tuple[str, str, int]:
    """Step 0 of a new session with ``extra``, the world told to fail (``failures``) once created."""
    world = StartWorld()
    service = RolloutService(world, FAST)
    try:
        sid = (await service.create_session(CreateSessionRequest(model="toy", seed=1))).session_id
        for name, value in failures.items():
            setattr(world, name, value)
        resp = await service.step(sid, _request(0, extra))
        status = await service.get_status(sid)
        assert resp.error is not None
        return resp.error.code, resp.error.message, status.committed_step_id
    finally:
        service.close()


async def test_a_toy_start_state_of_the_wrong_length_is_invalid_request() -> None:
    code = await _first_step({"observation/state": [0.0] * 14})
    assert code == ("invalid_request", "toy start state must have 15 values", -1)


async def test_the_worlds_own_failures_on_a_chosen_start_stay_inference_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=SERVICE_LOGGER)
    crashed = RuntimeError("start crashed")  # not a refusal: the world broke
    assert await _first_step({"observation/state": [0.0] * 15}, start_error=crashed) == (
        "inference_error",
        "world step failed: RuntimeError: start crashed",
        -1,
    )
    seed_refused = ValueError("no start for this seed")  # no state of the client's to refuse
    assert await _first_step({"seed": 3}, start_error=seed_refused) == (
        "inference_error",
        "world step failed: ValueError: no start for this seed",
        -1,
    )
    # the start was accepted; the world's answer is unusable
    assert await _first_step({"observation/state": [0.0] * 15}, nan_output=True) == (
        "inference_error",
        "world step failed: ValueError: world output is not finite",
        -1,
    )
    warned = [r for r in caplog.records if r.name == SERVICE_LOGGER and r.levelno == logging.WARNING]
    assert len(warned) == 3


async def test_a_batch_item_with_a_refused_start_fails_alone() -> None:
    service = RolloutService(StartWorld(), FAST)
    try:
        a = (await service.create_session(CreateSessionRequest(model="toy", seed=1))).session_id
        b = (await service.create_session(CreateSessionRequest(model="toy", seed=2))).session_id
        items = [
            BatchStepItem(session_id=a, **_request(0, {"observation/state": [0.0] * 3}).model_dump()),
            BatchStepItem(session_id=b, **_request(0, {}).model_dump()),
        ]
        first, second = (await service.batch_step(BatchStepRequest(items=items))).results
        assert first.error is not None
        assert (first.status, first.error.code, first.error.message) == (
            "error",
            "invalid_request",
            "toy start state must have 15 values",
        )
        assert (second.status, second.model_metadata.committed_step_id) == ("ok", 0)
        assert (await service.get_status(a)).committed_step_id == -1
    finally:
        service.close()


async def test_the_video_world_refuses_a_start_state_as_invalid_request() -> None:
    from rollserve.models.worlds import load_world

    service = RolloutService(load_world("video"), FAST)
    try:
        sid = (await service.create_session(CreateSessionRequest(model="video", seed=1))).session_id
        for context in (True, False):
            req = _request(0, {"observation/state": [0.0] * 13})
            req.use_session_context = context
            resp = await service.step(sid, req)
            assert resp.error is not None
            assert (resp.error.code, resp.error.message) == (
                "invalid_request",
                "the video world starts from a seed (its start frame is rendered)",
            )
        assert (await service.get_status(sid)).committed_step_id == -1
    finally:
        service.close()
