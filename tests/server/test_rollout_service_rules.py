"""RolloutService rules pinned number by number, called directly: the exact error codes, messages and
counters each refusal carries, what reaches the world (folded inputs, start conditions, seeds,
render specs), what a rendering or acting world's answer looks like on both wires, and what a lost
compare-and-set answers. Every expected value is computed here, not read back from the service.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import threading
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from rollserve.engine import Completed
from rollserve.models.world import WorldInit, WorldOutput, WorldSpec, WorldStep, run_world_calls
from rollserve.models.worlds import ToyWorld
from rollserve.server.metrics import METRICS
from rollserve.server.rollout import service as service_module
from rollserve.server.rollout.protocol import (
    FLOAT32_MAX,
    MAX_VECTOR,
    Action,
    BatchStepColumnsRequest,
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    ForkSessionRequest,
    Observation,
    RenderRequest,
    ResetSessionRequest,
    RolloutStepRequest,
)
from rollserve.server.rollout.service import (
    RolloutError,
    RolloutService,
    _fingerprint,
    _finite_array,
    _json_safe,
    fold_action_into_observation,
)
from rollserve.server.rollout.store import Commit, RolloutSession, RolloutStore, apply_commit
from rollserve.server.settings import ServerSettings
from rollserve.wire.images import IMAGE_KEY

FAST = ServerSettings(max_batch_wait_ms=0.0)
GRIPPER_COUNT = "DROID gripper_position must have 1 value"


class PinWorld:
    """Three numbers that move by the action's first three values; renders its cameras as images
    filled with ``10 * camera index + x``. Records every init and step it is asked for."""

    spec = WorldSpec(
        name="pin",
        observation_names=("x", "y", "z"),
        aliases=("pin-v1",),
        requires_action=False,
        cameras=("front", "wrist"),
    )

    def __init__(self) -> None:
        self.inits: list[WorldInit] = []
        self.steps: list[WorldStep] = []
        self.reward: Any = 0.25
        self.uncertainty: Any = None
        self.info: dict[str, Any] = {}
        self.chosen: Any = None  # the action an acting world picks for an empty one
        self.bad_image = False
        self.vector: Any = "pos"  # "pos": the position; anything else: that value
        self.replace_output: Any = None  # a step answers this instead of a WorldOutput
        self.start_error: BaseException | None = None
        self.start_observation: Any = None

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        self.inits.extend(inits)
        if self.start_error is not None:
            return [self.start_error for _ in inits]
        outs: list[WorldOutput | BaseException] = []
        for init in inits:
            if init.state is not None:
                pos = np.asarray(init.state, dtype=np.float32)
                if pos.shape != (3,):
                    outs.append(ValueError(f"pin start state must have 3 values, got {pos.size}"))
                    continue
            else:
                pos = np.full(3, float(init.seed % 50), dtype=np.float32)
            out = self._out(pos, init.render)
            if self.start_observation is not None:
                out = dataclasses.replace(out, observation=self.start_observation)
            outs.append(out)
        return outs

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        self.steps.extend(steps)
        outs: list[WorldOutput | BaseException] = []
        for step in steps:
            if self.replace_output is not None:
                outs.append(self.replace_output)
                continue
            pos, render = step.state
            move = np.zeros(3) if step.action is None else np.asarray(step.action[:3], dtype=np.float64)
            chosen = None
            if step.action is None and self.chosen is not None:
                chosen = self.chosen
                move = np.asarray(chosen, dtype=np.float64).reshape(-1)[:3]
            out = self._out((pos + move).astype(np.float32), render)
            outs.append(
                dataclasses.replace(
                    out,
                    reward=self.reward,
                    uncertainty=self.uncertainty,
                    info=dict(self.info),
                    action=chosen,
                    terminated=bool(pos[0] + move[0] >= 100),
                )
            )
        return outs

    def _out(self, pos: np.ndarray, render: Any) -> WorldOutput:
        images = None
        if render is not None:
            images = {
                cam: np.full((render.height, render.width, 3), 10 * k + int(pos[0]), dtype=np.uint8)
                for k, cam in enumerate(render.cameras)
            }
            if self.bad_image:
                images = {cam: image.astype(np.float32) for cam, image in images.items()}
        vector = (pos if render is not None else None) if isinstance(self.vector, str) else self.vector
        return WorldOutput(state=(pos, render), observation=pos * 2, vector=vector, images=images)

    def close(self) -> None:
        pass


@pytest.fixture
def world() -> PinWorld:
    return PinWorld()


@pytest.fixture
async def service(world: PinWorld):
    svc = RolloutService(world, FAST)
    yield svc
    svc.close()


def move(step_id: int, dx: float = 1.0, *, context: bool = True, **obs: Any) -> RolloutStepRequest:
    return RolloutStepRequest(
        step_id=step_id,
        observation=Observation(**obs),
        action=Action(joint_positions=[dx, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], gripper_position=0.0),
        use_session_context=context,
    )


def latent(field: dict[str, Any]) -> np.ndarray:
    assert field["encoding"] == "base64_raw_tensor" and field["dtype"] == "float32"
    return np.frombuffer(base64.b64decode(field["video_latent"]), dtype="<f4").reshape(field["shape"])


async def create(service: RolloutService, seed: int = 3, **kw: Any) -> str:
    return (await service.create_session(CreateSessionRequest(model="pin", seed=seed, **kw))).session_id


def error_of(resp: Any) -> tuple[str, str, int | None, int, int, int]:
    """Everything a refused step tells the client, in one tuple."""
    err, meta = resp.error, resp.model_metadata
    assert err is not None and resp.step_id == err.step_id
    return (
        err.code,
        err.message,
        err.step_id,
        err.committed_step_id,
        meta.committed_step_id,
        meta.context_length,
    )


# -- fold_action_into_observation: what the world gets -----------------------------------------------
def test_fold_keeps_prompt_images_and_the_keys_worlds_read() -> None:
    extra = {
        "observation/state": [1, 2],
        "observation/joint_position": [0.5] * 7,
        "observation/other": {"kept": "as is"},
        "seed": 4,
        "embodiment_name": "franka",
        "unrelated": 1,
    }
    obs = Observation(prompt="pick the cube", images={"cam": "client-encoded"}, extra=extra)
    folded = fold_action_into_observation(obs, None)
    assert folded["prompt"] == "pick the cube" and folded["cam"] == "client-encoded"
    assert folded["observation/other"] is extra["observation/other"]
    assert folded["seed"] == 4 and folded["embodiment_name"] == "franka"
    assert "unrelated" not in folded
    state = folded["observation/state"]
    assert state.dtype == np.float64 and state.tolist() == [1.0, 2.0]
    assert folded["observation/joint_position"].tolist() == [0.5] * 7
    assert "observation/gripper_position" not in folded


@pytest.mark.parametrize(
    ("state", "joints", "gripper"),
    [
        ([0.1] * 7, [0.1] * 7, None),
        ([0.1] * 7 + [0.9], [0.1] * 7, [0.9]),
    ],
)
def test_fold_takes_joints_and_gripper_from_the_state(state, joints, gripper) -> None:
    folded = fold_action_into_observation(Observation(state=state), Action())
    assert folded["observation/joint_position"].tolist() == pytest.approx(joints)
    if gripper is None:
        assert "observation/gripper_position" not in folded
    else:
        assert folded["observation/gripper_position"].tolist() == pytest.approx(gripper)


def test_fold_state_beyond_eight_values_is_not_the_gripper() -> None:
    folded = fold_action_into_observation(Observation(state=[0.1] * 7 + [0.9, 0.4]), None)
    assert folded["observation/gripper_position"].tolist() == pytest.approx([0.9])


def test_fold_an_action_wins_over_the_state_and_state_fallback_can_be_off() -> None:
    state = [0.2] * 7 + [0.7]
    given = Action(gripper_position=0.3)
    folded = fold_action_into_observation(Observation(state=state), given)
    assert folded["observation/joint_position"].tolist() == pytest.approx([0.2] * 7)
    assert folded["observation/gripper_position"].tolist() == pytest.approx([0.3])
    both = fold_action_into_observation(Observation(state=state), Action(joint_positions=[0.5] * 7))
    assert both["observation/joint_position"].tolist() == [0.5] * 7
    assert "observation/gripper_position" not in both
    off = fold_action_into_observation(Observation(state=state), Action(), state_fallback=False)
    assert "observation/joint_position" not in off and "observation/gripper_position" not in off


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Action(joint_positions=[1.0, 2.0]), "DROID joint_positions must have 7 values, got 2"),
        (Action(joint_positions=[0.0] * 7, gripper_position=[0.1, 0.2]), f"{GRIPPER_COUNT}, got 2"),
        (Action(joint_positions=[0.0] * 7, gripper_position=[]), f"{GRIPPER_COUNT}, got 0"),
    ],
)  # fmt: skip
def test_fold_refuses_wrong_counts_with_the_droid_name(action: Action, message: str) -> None:
    with pytest.raises(ValueError) as err:
        fold_action_into_observation(Observation(), action)
    assert str(err.value) == message


def test_fold_vector_keys_limits() -> None:
    edge = fold_action_into_observation(
        Observation(extra={"observation/state": [FLOAT32_MAX, -FLOAT32_MAX]}), None
    )
    assert edge["observation/state"].tolist() == [FLOAT32_MAX, -FLOAT32_MAX]  # the range is inclusive
    for bad in ([float("nan")], [FLOAT32_MAX * 2]):
        with pytest.raises(ValueError) as err:
            fold_action_into_observation(Observation(extra={"observation/state": bad}), None)
        assert (
            str(err.value) == "observation.extra['observation/state'] must be finite and within float32 range"
        )
    full = fold_action_into_observation(Observation(extra={"observation/state": [[0.5] * MAX_VECTOR]}), None)
    assert full["observation/state"].shape == (MAX_VECTOR,)  # nested lists are flattened
    assert fold_action_into_observation(Observation(extra={"observation/state": np.zeros(MAX_VECTOR)}), None)
    for over in ([0.0] * (MAX_VECTOR + 1), np.zeros(MAX_VECTOR + 1)):
        with pytest.raises(ValueError) as err:
            fold_action_into_observation(Observation(extra={"observation/state": over}), None)
        assert str(err.value) == f"observation.extra['observation/state'] holds more than {MAX_VECTOR} values"


# -- what a step hands the world ------------------------------------------------------------------------
async def test_the_world_gets_the_folded_inputs_and_a_float32_action(service, world) -> None:
    sid = await create(service)
    resp = await service.step(sid, move(0, 2.0, prompt="go", extra={"embodiment_name": "franka"}))
    assert resp.error is None
    (step,) = world.steps
    assert step.action.dtype == np.float32 and step.action.tolist() == [2.0] + [0.0] * 7
    assert step.inputs["prompt"] == "go" and step.inputs["embodiment_name"] == "franka"
    empty = await service.step(sid, RolloutStepRequest(step_id=1, observation=Observation(), action=Action()))
    assert empty.error is None  # requires_action off: zeros for what is missing
    assert world.steps[-1].action.tolist() == [0.0] * 8
    gripper_only = RolloutStepRequest(
        step_id=2, observation=Observation(), action=Action(gripper_position=0.5)
    )
    assert (await service.step(sid, gripper_only)).error is None
    assert world.steps[-1].action.tolist() == [0.0] * 7 + [0.5]


async def test_a_world_that_requires_an_action_names_what_is_missing() -> None:
    svc = RolloutService(ToyWorld(), FAST)
    try:
        sid = (await svc.create_session(CreateSessionRequest(model="toy", seed=0))).session_id
        joints_only = RolloutStepRequest(
            step_id=0, observation=Observation(), action=Action(joint_positions=[0.0] * 7)
        )
        resp = await svc.step(sid, joints_only)
        assert error_of(resp) == (
            "invalid_request",
            "world 'toy' needs action.joint_positions (7 values) and action.gripper_position (1 value), or "
            "an observation.state that starts with them; it has no policy to act by itself (serve it with "
            "--world-policy)",
            0,
            -1,
            -1,
            0,
        )
    finally:
        svc.close()


async def test_an_acting_world_without_an_action_is_told_without_the_policy_hint(world) -> None:
    world.spec = dataclasses.replace(PinWorld.spec, acts=True, requires_action=True)
    svc = RolloutService(world, FAST)
    try:
        sid = await create(svc)
        gripper_only = RolloutStepRequest(
            step_id=0, observation=Observation(), action=Action(gripper_position=0.5)
        )
        resp = await svc.step(sid, gripper_only)
        assert resp.error.code == "invalid_request"
        assert resp.error.message.endswith("or an observation.state that starts with them")
    finally:
        svc.close()


async def test_start_conditions_of_a_fresh_context_reach_the_world(service, world) -> None:
    sid = await create(service, seed=3)
    seeded = await service.step(sid, move(0, 1.0, context=False, extra={"seed": 7}))
    np.testing.assert_array_equal(latent(seeded.next_observation), [16.0, 14.0, 14.0])  # (7 + move) * 2
    init = world.inits[-1]
    assert init.seed == 7 and init.state is None
    placed = await service.step(sid, move(0, 0.0, context=False, extra={"observation/state": [[1, 2, 3]]}))
    assert placed.error is None
    init = world.inits[-1]
    assert init.seed is None and init.state.dtype == np.float64 and init.state.tolist() == [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(latent(placed.next_observation), [2.0, 4.0, 6.0])
    edge = await service.step(sid, move(0, 0.0, context=False, extra={"seed": 0}))
    np.testing.assert_array_equal(latent(edge.next_observation), [0.0, 0.0, 0.0])
    big = await service.step(sid, move(0, 0.0, context=False, extra={"seed": 2**63 - 1}))
    assert big.error is None and world.inits[-1].seed == 2**63 - 1
    mid = await service.step(sid, move(0, 0.0, context=False, extra={"seed": 1000}))
    assert mid.error is None and world.inits[-1].seed == 1000


@pytest.mark.parametrize("seed", [-1, 2**63, True, "3", 1.0])
async def test_a_bad_start_seed_is_an_invalid_request(service, world, seed) -> None:
    sid = await create(service)
    inits = len(world.inits)
    resp = await service.step(sid, move(0, context=False, extra={"seed": seed}))
    assert error_of(resp) == (
        "invalid_request", "observation.extra.seed must be an integer in [0, 2**63)", 0, -1, -1, 0
    )  # fmt: skip
    assert len(world.inits) == inits and world.steps == []


async def test_a_bad_start_state_names_the_key(service) -> None:
    sid = await create(service)
    resp = await service.step(sid, move(0, context=False, extra={"observation/state": [float("inf")]}))
    assert error_of(resp)[:2] == (
        "invalid_request", "observation.extra['observation/state'] must be finite and within float32 range"
    )  # fmt: skip


# -- rendering sessions -----------------------------------------------------------------------------------
def image_of(field: dict[str, Any]) -> np.ndarray:
    assert field["format"] == "raw"
    return np.frombuffer(base64.b64decode(field["data"]), dtype=np.uint8).reshape(field["shape"])


async def test_a_rendering_session_gets_state_and_images_on_every_answer(service, world) -> None:
    render = RenderRequest(cameras=["wrist", "front"], height=16, width=24)
    created = await service.create_session(CreateSessionRequest(model="pin", seed=5, render=render))
    assert world.inits[-1].render.cameras == ("wrist", "front")
    assert (world.inits[-1].render.height, world.inits[-1].render.width) == (16, 24)
    obs = created.observation
    assert obs["state"] == [5.0, 5.0, 5.0]
    assert list(obs["images"]) == ["wrist", "front"]
    assert image_of(obs["images"]["wrist"]).shape == (16, 24, 3)
    assert (image_of(obs["images"]["wrist"]) == 5).all() and (image_of(obs["images"]["front"]) == 15).all()
    sid = created.session_id
    step = await service.step(sid, move(0, 2.0))
    nxt = step.next_observation
    assert nxt["state"] == [7.0, 5.0, 5.0] and (image_of(nxt["images"]["front"]) == 17).all()
    np.testing.assert_array_equal(latent(nxt), [14.0, 10.0, 10.0])
    fork = await service.fork_session(sid)
    assert fork.observation["state"] == [7.0, 5.0, 5.0]
    assert (image_of(fork.observation["images"]["wrist"]) == 7).all()
    forked_step = await service.step(fork.session_id, move(1, 1.0))
    assert (image_of(forked_step.next_observation["images"]["wrist"]) == 8).all()
    reset = await service.reset_session(sid, ResetSessionRequest(seed=9))
    assert reset.observation["state"] == [9.0, 9.0, 9.0] and world.inits[-1].render.cameras == (
        "wrist",
        "front",
    )
    assert (image_of(reset.observation["images"]["front"]) == 19).all()
    dup = await service.step(fork.session_id, move(1, 1.0))
    assert dup.replayed and dup.next_observation == forked_step.next_observation
    scratch = await service.step(sid, move(3, 1.0, context=False, extra={"seed": 2}))
    assert world.inits[-1].render.cameras == ("wrist", "front")  # a fresh context renders too
    assert (image_of(scratch.next_observation["images"]["wrist"]) == 3).all()


async def test_jpeg_quality_and_the_msgpack_wire(service, world) -> None:
    render = RenderRequest(height=16, width=16, jpeg_quality=80)
    created = await service.create_session(
        CreateSessionRequest(model="pin", seed=4, render=render), raw_tensors=True
    )
    assert world.inits[-1].render.cameras == ("front", "wrist")  # all the world's cameras by default
    obs = created.observation
    assert obs["encoding"] == "tensor" and obs["dtype"] == "float32" and obs["shape"] == [3]
    np.testing.assert_array_equal(obs["video_latent"], [8.0, 8.0, 8.0])
    front = obs["images"]["front"]
    assert front[IMAGE_KEY] is True and front[b"format"] == "jpeg"
    sid = created.session_id
    raw = await service.step(sid, move(0, 1.0), raw_tensors=True)
    assert raw.next_observation["encoding"] == "tensor"
    assert raw.next_observation["images"]["wrist"][b"format"] == "jpeg"
    as_json = await service.step(sid, move(1, 1.0))
    assert as_json.next_observation["images"]["wrist"]["format"] == "jpeg"
    reset = await service.reset_session(sid, ResetSessionRequest(seed=1), raw_tensors=True)
    assert (
        reset.observation["encoding"] == "tensor"
        and reset.observation["images"]["front"][b"format"] == "jpeg"
    )
    fork = await service.fork_session(sid, raw_tensors=True)
    assert fork.observation["images"]["front"][b"format"] == "jpeg"
    assert (await service.fork_session(sid)).observation["images"]["front"]["format"] == "jpeg"


async def test_raw_images_on_the_msgpack_wire_are_the_arrays(service) -> None:
    render = RenderRequest(cameras=["front"], height=16, width=16)
    created = await service.create_session(
        CreateSessionRequest(model="pin", seed=6, render=render), raw_tensors=True
    )
    front = created.observation["images"]["front"]
    assert front[b"format"] == "raw" and (front[b"pixels"] == 6).all()
    assert (await service.get_status(created.session_id)).model == "pin"


async def test_a_session_that_does_not_render_has_no_state_or_images(service) -> None:
    created = await service.create_session(CreateSessionRequest(model="pin-v1", seed=2))
    assert created.model == "pin"  # the alias serves; the world's own name is reported
    assert "state" not in created.observation and "images" not in created.observation
    resp = await service.step(created.session_id, move(0))
    assert "state" not in resp.next_observation and "images" not in resp.next_observation


async def test_a_world_vector_without_images_is_the_state(service, world) -> None:
    world.vector = np.array([1.5, 2.5], dtype=np.float64)
    created = await service.create_session(CreateSessionRequest(model="pin", seed=2))
    assert created.observation["state"] == [1.5, 2.5] and "images" not in created.observation
    resp = await service.step(created.session_id, move(0))
    assert resp.next_observation["state"] == [1.5, 2.5]


async def test_render_requests_are_checked_against_the_world(service) -> None:
    async def refused(render: RenderRequest, model: str = "pin", svc: RolloutService = service) -> str:
        with pytest.raises(RolloutError) as err:
            await svc.create_session(CreateSessionRequest(model=model, render=render))
        assert err.value.code == "invalid_request"
        return err.value.message

    has = "world 'pin' has ['front', 'wrist']"
    assert await refused(RenderRequest(cameras=["top"])) == f"render.cameras: unknown camera 'top'; {has}"
    assert (
        await refused(RenderRequest(cameras=["front", "front"])) == "render.cameras: 'front' is named twice"
    )
    assert await refused(RenderRequest(cameras=["front", "wrist", "wrist", "front"])) == (
        "render.cameras: 'wrist' is named twice"  # the first name seen again
    )
    assert await refused(RenderRequest(cameras=["front", "top", "bot"])) == (
        f"render.cameras: unknown camera 'top'; {has}"  # the first unknown one
    )
    assert (
        await refused(RenderRequest(cameras=["top", "top"])) == f"render.cameras: unknown camera 'top'; {has}"
    )
    toy = RolloutService(ToyWorld(), FAST)
    try:
        assert await refused(RenderRequest(), "toy", toy) == "world 'toy' does not render camera frames"
    finally:
        toy.close()


async def test_a_world_with_one_frame_size_refuses_others(world) -> None:
    world.spec = dataclasses.replace(PinWorld.spec, frame_size=(32, 48))
    svc = RolloutService(world, FAST)
    try:
        for render in (RenderRequest(height=16), RenderRequest(width=16), RenderRequest(height=48, width=32)):
            with pytest.raises(RolloutError) as err:
                await svc.create_session(CreateSessionRequest(model="pin", render=render))
            assert (err.value.code, err.value.message) == (
                "invalid_request",
                "world 'pin' renders 32x48 frames only",
            )
        await svc.create_session(CreateSessionRequest(model="pin", render=RenderRequest()))
        assert (world.inits[-1].render.height, world.inits[-1].render.width) == (32, 48)
        await svc.create_session(CreateSessionRequest(model="pin", render=RenderRequest(height=32, width=48)))
        assert (world.inits[-1].render.height, world.inits[-1].render.width) == (32, 48)
    finally:
        svc.close()


async def test_a_bad_world_image_commits_nothing(service, world) -> None:
    render = RenderRequest(cameras=["wrist"], height=16, width=16)
    sid = (await service.create_session(CreateSessionRequest(model="pin", seed=1, render=render))).session_id
    world.bad_image = True
    resp = await service.step(sid, move(0))
    code, message, *counters = error_of(resp)
    assert code == "inference_error" and counters == [0, -1, -1, 0]
    wire = "bad_image: world image 'wrist' must be uint8 HxWx3 RGB, got float32 (16, 16, 3)"
    assert message == f"world step failed: WireError: {wire}"
    with pytest.raises(RolloutError) as err:
        await service.reset_session(sid)
    assert err.value.code == "inference_error" and "world image 'wrist'" in err.value.message


# -- what the world answers -------------------------------------------------------------------------------
async def test_reward_uncertainty_and_info_reach_the_client(service, world) -> None:
    sid = await create(service)
    world.reward, world.uncertainty = np.float32(0.5), np.float64(0.125)
    world.info = {"success": np.bool_(True), "dist": np.float32(0.25), "joints": np.arange(3), "name": "ok"}
    resp = await service.step(sid, move(0))
    nxt, meta = resp.next_observation, resp.model_metadata
    assert nxt["reward"] == 0.5 and type(nxt["reward"]) is float
    assert nxt["terminated"] is False
    assert nxt["info"] == {"success": True, "dist": 0.25, "joints": [0, 1, 2], "name": "ok"}
    assert meta.uncertainty == 0.125 and meta.batch_size == 1 and meta.steps_generated == 1
    assert meta.context_length == 1 and meta.committed_step_id == 0
    assert "actions" not in nxt
    dup = await service.step(sid, move(0))
    assert dup.model_metadata.uncertainty == 0.125 and dup.next_observation == nxt
    done = await service.step(sid, move(1, 200.0))
    assert done.next_observation["terminated"] is True


async def test_step_timings_are_milliseconds_rounded_to_microseconds(world) -> None:
    class SlowWorld(PinWorld):
        def step_batch(self, steps):
            import time

            time.sleep(0.03)
            return super().step_batch(steps)

    svc = RolloutService(SlowWorld(), FAST)
    try:
        a, b = await create(svc, 1), await create(svc, 2)
        first, second = await asyncio.gather(svc.step(a, move(0)), svc.step(b, move(0)))
        for resp in (first, second):
            meta = resp.model_metadata
            assert 30.0 <= meta.latency_ms < 5000.0 and meta.latency_ms == round(meta.latency_ms, 3)
            assert 0.0 <= meta.queue_wait_ms < meta.latency_ms and meta.queue_wait_ms == round(
                meta.queue_wait_ms, 3
            )
        waits = sorted(r.model_metadata.queue_wait_ms for r in (first, second))
        if first.model_metadata.batch_size == 1:  # the second waited for the first batch to run
            assert waits[1] >= 20.0
    finally:
        svc.close()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("reward", float("nan"), "world step failed: ValueError: world reward is not finite"),
        ("uncertainty", float("inf"), "world step failed: ValueError: world uncertainty is not finite"),
        ("info", {"x": float("nan")}, "world step failed: ValueError: Out of range float values are not JSON "
         "compliant"),
        ("info", {"x": object()}, "world step failed: TypeError: info value of type object cannot be sent"),
        ("replace_output", "no", "world step failed: TypeError: world returned str, not a WorldOutput"),
        ("chosen", [0.0] * 5, "world step failed: ValueError: world chose an action of 5 values, not 8"),
    ],
)  # fmt: skip
async def test_a_bad_world_answer_is_an_inference_error_that_commits_nothing(
    service, world, setting: str, value: Any, message: str
) -> None:
    world.spec = dataclasses.replace(PinWorld.spec, acts=True)
    sid = await create(service)
    assert (await service.step(sid, move(0))).error is None
    setattr(world, setting, value)
    acting = RolloutStepRequest(step_id=1, observation=Observation(), action=Action())
    resp = await service.step(sid, acting if setting == "chosen" else move(1))
    assert error_of(resp) == ("inference_error", message, 1, 0, 0, 1)
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (0, 1)


async def test_a_failed_step_is_logged_with_its_traceback(service, world, caplog) -> None:
    sid = await create(service)
    world.replace_output = RuntimeError("boom")
    with caplog.at_level(logging.WARNING, logger="rollserve.server.rollout.service"):
        resp = await service.step(sid, move(0))
    assert resp.error.message == "world step failed: RuntimeError: boom"
    (record,) = [r for r in caplog.records if r.name == "rollserve.server.rollout.service"]
    assert record.getMessage() == f"step 0 of session {sid!r} failed".replace("'", "")
    assert record.exc_info is not None and record.exc_info[1] is world.replace_output


async def test_error_messages_are_one_line_and_bounded(service, world) -> None:
    sid = await create(service)
    world.replace_output = RuntimeError("first line\nsecond line")
    assert (await service.step(sid, move(0))).error.message == "world step failed: RuntimeError: first line"
    world.replace_output = RuntimeError("x" * 1000)
    assert (await service.step(sid, move(0))).error.message == "world step failed: RuntimeError: " + "x" * 300
    world.replace_output = KeyError()
    assert (await service.step(sid, move(0))).error.message == "world step failed: KeyError: KeyError"


async def test_an_acting_world_chooses_the_action_and_the_client_sees_it(world) -> None:
    world.spec = dataclasses.replace(PinWorld.spec, acts=True)
    world.chosen = np.array([[2.0, 0, 0, 0, 0, 0, 0, 1.0]], dtype=np.float64)
    svc = RolloutService(world, FAST)
    try:
        sid = await create(svc, seed=1)
        empty = RolloutStepRequest(step_id=0, observation=Observation(state=[0.5] * 8), action=Action())
        resp = await svc.step(sid, empty)
        assert resp.error is None and world.steps[-1].action is None
        assert "observation/joint_position" not in world.steps[-1].inputs  # the state does not act for it
        assert resp.next_observation["actions"] == [[2.0, 0, 0, 0, 0, 0, 0, 1.0]]
        np.testing.assert_array_equal(latent(resp.next_observation), [6.0, 2.0, 2.0])
        given = await svc.step(sid, move(1, 1.0))
        assert world.steps[-1].action is not None and "actions" not in given.next_observation
        dup = await svc.step(sid, move(1, 1.0))
        assert dup.replayed
    finally:
        svc.close()


# -- starts, resets and forks -----------------------------------------------------------------------------
async def test_seeds_of_resets_and_forks_follow_the_session_seed(service, world) -> None:
    sid = await create(service, seed=11)
    assert world.inits[-1].seed == 11
    draws = np.random.default_rng(11)
    await service.reset_session(sid)
    assert world.inits[-1].seed == int(draws.integers(2**31))
    fork = await service.fork_session(sid)
    fork_seeds = np.random.default_rng(draws.integers(2**63))
    await service.reset_session(fork.session_id)
    assert world.inits[-1].seed == int(fork_seeds.integers(2**31))
    await service.reset_session(sid)
    assert world.inits[-1].seed == int(draws.integers(2**31))
    world.start_error = RuntimeError("down")
    with pytest.raises(RolloutError):
        await service.reset_session(sid)  # a failed reset draws nothing
    world.start_error = None
    expected = int(draws.integers(2**31))
    assert world.inits[-1].seed == expected
    await service.reset_session(sid)
    assert world.inits[-1].seed == expected
    await service.reset_session(sid, ResetSessionRequest(seed=5))
    assert world.inits[-1].seed == 5
    await service.reset_session(sid)
    assert world.inits[-1].seed == int(np.random.default_rng(5).integers(2**31))


async def test_an_unseeded_create_draws_a_31_bit_seed(service, world) -> None:
    created = await service.create_session(CreateSessionRequest(model="pin"))
    seed = world.inits[-1].seed
    assert type(seed) is int and 0 <= seed < 2**31
    np.testing.assert_array_equal(latent(created.observation), [2.0 * (seed % 50)] * 3)


async def test_reset_to_a_start_state(service, world) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    reset = await service.reset_session(sid, ResetSessionRequest(state=[1.0, 2.0, 3.0]))
    assert (reset.session_id, reset.committed_step_id, reset.context_length) == (sid, -1, 0)
    assert world.inits[-1].state.dtype == np.float64  # as sent: the world checks, then rounds
    np.testing.assert_array_equal(latent(reset.observation), [2.0, 4.0, 6.0])
    step = await service.step(sid, move(0, 1.0))
    np.testing.assert_array_equal(latent(step.next_observation), [4.0, 4.0, 6.0])
    scratch = await service.step(sid, move(5, 1.0, context=False))  # the reset's state is the new root
    np.testing.assert_array_equal(latent(scratch.next_observation), [4.0, 4.0, 6.0])


async def test_a_refused_start_state_is_the_clients_error_and_changes_nothing(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    with pytest.raises(RolloutError) as err:
        await service.reset_session(sid, ResetSessionRequest(state=[1.0, 2.0]))
    assert (err.value.code, err.value.message) == (
        "invalid_request",
        "pin start state must have 3 values, got 2",
    )
    assert err.value.committed_step_id == 0
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (0, 1)


async def test_a_first_step_from_a_refused_start_state_is_the_clients_error(service, world) -> None:
    sid = await create(service)
    step = await service.step(sid, move(0, extra={"observation/state": [1.0, 2.0]}))
    assert error_of(step) == ("invalid_request", "pin start state must have 3 values, got 2", 0, -1, -1, 0)
    assert step.next_observation is None
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (-1, 0)


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (ValueError("no start\nmore"), "inference_error", "world start failed: no start"),
        (RuntimeError("gpu gone"), "inference_error", "world start failed: RuntimeError: gpu gone"),
    ],
)
async def test_a_failed_world_start(service, world, caplog, error, code, message) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    world.start_error = error
    with caplog.at_level(logging.WARNING, logger="rollserve.server.rollout.service"):
        with pytest.raises(RolloutError) as err:
            await service.reset_session(sid)
        assert (err.value.code, err.value.message, err.value.committed_step_id) == (code, message, 0)
        with pytest.raises(RolloutError) as err:
            await service.create_session(CreateSessionRequest(model="pin", seed=1))
        assert (err.value.code, err.value.message, err.value.committed_step_id) == (code, message, -1)
    logged = [r for r in caplog.records if r.name == "rollserve.server.rollout.service"]
    if isinstance(error, ValueError):
        assert logged == []
    else:
        assert [r.getMessage() for r in logged] == ["world start failed"] * 2
        assert all(r.exc_info is not None and r.exc_info[1] is error for r in logged)
    assert len(service.store) == 1  # the failed create took no slot


async def test_an_unusable_start_observation_is_logged(service, world, caplog) -> None:
    world.start_observation = np.array([np.nan, 0.0, 0.0])
    with (
        caplog.at_level(logging.WARNING, logger="rollserve.server.rollout.service"),
        pytest.raises(RolloutError) as err,
    ):
        await service.create_session(CreateSessionRequest(model="pin", seed=1))
    assert (err.value.code, err.value.message) == (
        "inference_error", "world start failed: ValueError: world output is not finite"
    )  # fmt: skip
    (record,) = [r for r in caplog.records if r.name == "rollserve.server.rollout.service"]
    assert (
        record.getMessage() == "world start returned an unusable observation" and record.exc_info is not None
    )


async def test_after_the_engine_shuts_down(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    service.engine.close()
    resp = await service.step(sid, move(1))
    assert error_of(resp) == ("engine_unavailable", "the world engine is shut down", 1, 0, 0, 1)
    for call in (service.reset_session(sid), service.create_session(CreateSessionRequest(model="pin"))):
        with pytest.raises(RolloutError) as err:
            await call
        assert (err.value.code, err.value.message) == ("engine_unavailable", "the world engine is shut down")
    assert err.value.committed_step_id == -1
    with pytest.raises(RolloutError) as err:
        await service.reset_session(sid)
    assert err.value.committed_step_id == 0


async def test_fork_copies_the_committed_session(service, world) -> None:
    sid = await create(service, seed=4)
    await service.step(sid, move(0, 1.0))
    await service.step(sid, move(1, 1.0, context=False))
    fork = await service.fork_session(sid, ForkSessionRequest(session_id="b-1"))
    assert (fork.session_id, fork.forked_from, fork.model, fork.mode) == (
        "b-1",
        sid,
        "pin",
        "world_model_env",
    )
    assert (fork.committed_step_id, fork.context_length) == (0, 1)
    np.testing.assert_array_equal(latent(fork.observation), [10.0, 8.0, 8.0])
    status = await service.get_status("b-1")
    assert (status.committed_step_id, status.context_length, status.model) == (0, 1, "pin")
    dup = await service.step("b-1", move(0, 1.0))
    assert dup.replayed  # the stored last result came along
    scratch = await service.step("b-1", move(9, 0.0, context=False))  # and the episode start
    np.testing.assert_array_equal(latent(scratch.next_observation), [8.0, 8.0, 8.0])
    again = await service.fork_session(sid, ForkSessionRequest(session_id="b-1"))
    assert again.session_id == "b-1" and again.created_at == fork.created_at


async def test_a_chosen_id_of_another_kind_is_taken(service) -> None:
    sid = await create(service, session_id="s-1")
    with pytest.raises(RolloutError) as err:
        await service.fork_session(sid, ForkSessionRequest(session_id="s-1"))
    assert err.value.code == "session_exists"  # a plain session, not a fork of it
    await service.fork_session(sid, ForkSessionRequest(session_id="f-1"))
    with pytest.raises(RolloutError) as err:
        await service.create_session(CreateSessionRequest(model="pin", session_id="f-1"))
    assert err.value.code == "session_exists"  # a fork, not a plain session
    await service.close_session(sid)
    with pytest.raises(RolloutError) as err:
        await service.create_session(CreateSessionRequest(model="pin", session_id="s-1"))
    assert err.value.code == "session_exists"  # closed ids are not reused


async def test_forking_a_closed_session(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    await service.close_session(sid)
    with pytest.raises(RolloutError) as err:
        await service.fork_session(sid)
    assert (err.value.code, err.value.committed_step_id) == ("session_closed", 0)


# -- lost compare-and-set (another replica wrote first) -----------------------------------------------------
class RacedStore(RolloutStore):
    """A store where, once, another writer commits ``rival`` just before this process's commit."""

    def __init__(self) -> None:
        super().__init__(16, 600.0)
        self.rival: Any = None

    async def commit(self, session: RolloutSession, change: Commit) -> bool:
        if self.rival is not None:
            rival, self.rival = self.rival(session), None
            apply_commit(session, rival)
        return await super().commit(session, change)


def reset_elsewhere(session: RolloutSession) -> Commit:
    """Another writer's reset of ``session`` (a new epoch at step -1), for ``RacedStore.rival``."""
    base = (session.epoch, session.committed_step_id)
    return Commit(base, session.root, session.observation, -1, 0, None, base[0] + 1)


@contextlib.asynccontextmanager
async def raced(world: PinWorld) -> AsyncIterator[tuple[RolloutService, RacedStore, str]]:
    """A service over a ``RacedStore`` and a session of it at committed step 0."""
    store = RacedStore()
    svc = RolloutService(world, FAST, store=store)
    try:
        sid = await create(svc, seed=2)
        await svc.step(sid, move(0))
        yield svc, store, sid
    finally:
        svc.close()


async def test_a_step_that_loses_to_a_reset_elsewhere_is_out_of_order(world) -> None:
    async with raced(world) as (svc, store, sid):
        store.rival = reset_elsewhere
        resp = await svc.step(sid, move(1))  # checked again against the new episode
        assert error_of(resp) == ("step_out_of_order", "expected step_id 0, got 1", 1, -1, -1, 0)
        assert resp.next_observation is None
        store.rival = reset_elsewhere
        fresh = await svc.step(sid, move(0))  # valid in the new episode too, but planned for the old one
        assert error_of(fresh) == (
            "step_out_of_order", "the session moved while the step ran; retry", 0, -1, -1, 0
        )  # fmt: skip
        assert fresh.next_observation is None
        assert (await svc.step(sid, move(0))).error is None  # the retry the message asks for


async def test_a_step_that_loses_to_the_same_step_elsewhere_gets_that_result(world) -> None:
    store = RacedStore()
    svc = RolloutService(world, FAST, store=store)
    try:
        sid = await create(svc, seed=2)
        twin = await create(svc, seed=2)
        won = await svc.step(twin, move(0, 3.0))
        twin_session = store.peek(twin)

        def same_step(session: RolloutSession) -> Commit:
            base = (session.epoch, session.committed_step_id)
            last = twin_session.last
            return Commit(base, twin_session.state, last.observation, 0, 1, last, base[0])

        store.rival = same_step
        resp = await svc.step(sid, move(0, 3.0))
        assert resp.replayed and resp.error.code == "step_already_committed"
        assert resp.next_observation == won.next_observation
        assert (resp.model_metadata.committed_step_id, resp.model_metadata.context_length) == (0, 1)
        await svc.reset_session(sid, ResetSessionRequest(seed=2))
        await svc.reset_session(twin, ResetSessionRequest(seed=2))
        await svc.step(twin, move(0, 3.0))
        store.rival = same_step
        raw = await svc.step(sid, move(0, 3.0), raw_tensors=True)  # the stored result, on the asked wire
        assert raw.replayed and raw.next_observation["encoding"] == "tensor"
        np.testing.assert_array_equal(raw.next_observation["video_latent"], [10.0, 4.0, 4.0])
    finally:
        svc.close()


async def test_reset_wins_over_a_step_committed_elsewhere(world) -> None:
    store = RacedStore()
    svc = RolloutService(world, FAST, store=store)
    try:
        sid = await create(svc, seed=2)

        def step_elsewhere(session: RolloutSession) -> Commit:
            base = (session.epoch, session.committed_step_id)
            return Commit(base, session.state, session.observation, base[1] + 1, 1, None, base[0])

        store.rival = step_elsewhere
        reset = await svc.reset_session(sid, ResetSessionRequest(seed=6))
        assert reset.committed_step_id == -1
        session = store.peek(sid)
        assert (session.epoch, session.committed_step_id, session.context_length) == (1, -1, 0)
        np.testing.assert_array_equal(latent(reset.observation), [12.0, 12.0, 12.0])
    finally:
        svc.close()


# -- batch_step and refusals that the transport asks for --------------------------------------------------
async def test_a_repeated_batch_item_reports_the_session_as_the_batch_left_it(service) -> None:
    sid = await create(service)
    first = BatchStepItem(session_id=sid, **move(0).model_dump())
    second = BatchStepItem(session_id=sid, **move(1).model_dump())
    resp = await service.batch_step(BatchStepRequest(items=[first, second]))
    assert resp.results[1].status == "error"
    assert error_of(resp.results[1]) == (
        "invalid_request", "a session may appear only once per batch_step", 1, 0, 0, 1
    )  # fmt: skip
    limit = service.max_batch_items
    assert limit == 256
    with pytest.raises(RolloutError) as err:
        await service.batch_step(BatchStepRequest(items=[first] * (limit + 1)))
    assert err.value.message == "batch_step takes at most 256 items"
    ok = await service.batch_step(
        BatchStepRequest(items=[BatchStepItem(session_id=sid, **move(1).model_dump())])
    )
    assert ok.results[0].status == "ok" and ok.results[0].session_id == sid


async def test_batch_step_answers_each_item_like_a_single_step(service, world) -> None:
    a, b = await create(service, seed=1), await create(service, seed=2)
    await service.close_session(b)
    items = [
        BatchStepItem(session_id=a, **move(0, 2.0).model_dump()),
        BatchStepItem(session_id=b, **move(0).model_dump()),
        BatchStepItem(session_id="nobody", **move(4).model_dump()),
    ]
    resp = await service.batch_step(BatchStepRequest(items=items))
    assert resp.object == "batch_step"
    np.testing.assert_array_equal(latent(resp.results[0].next_observation), [6.0, 2.0, 2.0])
    assert resp.results[0].model_metadata.committed_step_id == 0
    assert error_of(resp.results[1]) == ("session_closed", f"session {b!r} is closed", 0, -1, -1, 0)
    assert error_of(resp.results[2]) == ("session_not_found", "session 'nobody' does not exist", 4, -1, -1, 0)


async def test_refused_step_carries_the_session_counters(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    resp = await service.refused_step(sid, 7, "invalid_request", "bad body")
    assert error_of(resp) == ("invalid_request", "bad body", 7, 0, 0, 1)
    assert resp.model_metadata.latency_ms == 0.0 and resp.model_metadata.steps_generated == 0
    unknown = await service.refused_step("nobody", 3, "invalid_request", "bad body")
    assert error_of(unknown) == ("invalid_request", "bad body", 3, -1, -1, 0)


async def test_step_refusal_messages(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    assert error_of(await service.step(sid, move(3))) == (
        "step_out_of_order", "expected step_id 1, got 3", 3, 0, 0, 1
    )  # fmt: skip
    await service.step(sid, move(1))
    assert error_of(await service.step(sid, move(0))) == (
        "step_already_committed", "step 0 is already committed (committed_step_id=1)", 0, 1, 1, 2
    )  # fmt: skip
    changed = await service.step(sid, move(1, 5.0))
    assert error_of(changed) == (
        "step_already_committed",
        "step 1 is already committed (committed_step_id=1); this request differs from the one committed, "
        "so its result is not returned",
        1, 1, 1, 2,
    )  # fmt: skip
    dup = await service.step(sid, move(1))
    assert error_of(dup) == (
        "step_already_committed", "step 1 is already committed; its stored result is returned", 1, 1, 1, 2
    )  # fmt: skip
    await service.close_session(sid)
    assert error_of(await service.step(sid, move(2))) == (
        "session_closed",
        f"session {sid!r} is closed",
        2,
        1,
        1,
        2,  # the closed session's context length, as its status gives it (it read 0)
    )


async def test_a_stateless_step_reports_the_committed_counters(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    resp = await service.step(sid, move(0, context=False))
    assert resp.error is None and resp.step_id == 0
    assert (resp.model_metadata.committed_step_id, resp.model_metadata.context_length) == (0, 1)


async def test_fingerprints_see_array_content_shape_and_dtype() -> None:
    base = RolloutStepRequest(step_id=0, observation=Observation(), action=Action())
    variants = [
        np.zeros(4, np.float32),
        np.zeros(4, np.float64),
        np.zeros((2, 2), np.float32),
        np.ones(4, np.float32),
        np.float32(0.0),
        "plain",
    ]
    prints = set()
    for value in variants:
        req = base.model_copy(deep=True)
        req.observation.extra["t"] = value
        prints.add(RolloutService.fingerprint(req))
    assert len(prints) == len(variants)
    a = RolloutStepRequest(step_id=0, observation=Observation(extra={"a": 1, "b": 2}), action=Action())
    b = RolloutStepRequest(step_id=0, observation=Observation(extra={"b": 2, "a": 1}), action=Action())
    assert RolloutService.fingerprint(a) == RolloutService.fingerprint(b)  # key order is not content
    c = RolloutStepRequest(
        step_id=0, observation=Observation(extra={"t": np.zeros(4, np.float32)}), action=Action()
    )
    d = RolloutStepRequest(
        step_id=0, observation=Observation(extra={"t": np.zeros(4, np.float32)}), action=Action()
    )
    assert RolloutService.fingerprint(c) == RolloutService.fingerprint(d)


# -- the service's own set-up, metrics and lifecycle answers ------------------------------------------------
def gauge(name: str, **labels: str) -> float:
    return METRICS.registry.get_sample_value(name, labels) or 0.0


async def test_the_engine_follows_the_settings_and_close_closes_the_world() -> None:
    threads: list[str] = []

    class Named(PinWorld):
        closed = False

        def step_batch(self, steps):
            threads.append(threading.current_thread().name)
            return super().step_batch(steps)

        def close(self) -> None:
            self.closed = True

    world = Named()
    settings = ServerSettings(max_batch_wait_ms=7.0)
    before = int(time.time())
    svc = RolloutService(world, settings)
    try:
        assert svc.settings is settings
        assert svc.engine.max_wait_s == pytest.approx(0.007) and svc.engine.max_batch_size == 256
        (entry,) = svc.describe_models()
        assert entry["id"] == "pin" and before <= entry["created"] <= int(time.time())
        assert type(entry["created"]) is int
        await svc.step(await create(svc), move(0))
        assert threads == ["rollserve-world"]
    finally:
        svc.close()
    assert world.closed


async def test_metrics_count_sessions_and_world_batches(service) -> None:
    a = await create(service, 1)
    assert gauge("rollserve_active_sessions", kind="rollout") == 1
    b = await create(service, 2)
    fork = await service.fork_session(a)
    assert gauge("rollserve_active_sessions", kind="rollout") == 3
    await service.close_session(fork.session_id)
    assert gauge("rollserve_active_sessions", kind="rollout") == 2
    sizes = gauge("rollserve_batch_size_sum", kind="world"), gauge("rollserve_batch_size_count", kind="world")
    runs = gauge("rollserve_inference_seconds_count", kind="world")
    waits = gauge("rollserve_queue_wait_seconds_count", kind="world")
    items = [BatchStepItem(session_id=s, **move(0).model_dump()) for s in (a, b)]
    await service.batch_step(BatchStepRequest(items=items))
    assert gauge("rollserve_batch_size_sum", kind="world") == sizes[0] + 2
    assert gauge("rollserve_batch_size_count", kind="world") == sizes[1] + 1
    assert gauge("rollserve_inference_seconds_count", kind="world") == runs + 1
    assert gauge("rollserve_queue_wait_seconds_count", kind="world") == waits + 1


async def test_status_and_close_answers(service) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    await service.step(sid, move(1))
    status = await service.get_status(sid)
    assert (status.session_id, status.committed_step_id, status.context_length) == (sid, 1, 2)
    assert (status.closed, status.closed_reason, status.model) == (False, None, "pin")
    closed = await service.close_session(sid)
    assert (closed.session_id, closed.closed, closed.committed_step_id) == (sid, True, 1)
    again = await service.close_session(sid)
    assert again.committed_step_id == 1
    status = await service.get_status(sid)
    assert (status.closed, status.closed_reason, status.committed_step_id) == (True, "closed", 1)


async def test_create_answers_with_the_new_session(service) -> None:
    before = time.time()
    created = await service.create_session(CreateSessionRequest(model="pin-v1", seed=5, session_id="c-1"))
    assert (created.session_id, created.mode, created.model, created.forked_from) == (
        "c-1",
        "world_model_env",
        "pin",
        None,
    )
    assert before <= created.created_at <= time.time()
    assert (created.committed_step_id, created.context_length) == (-1, 0)
    np.testing.assert_array_equal(latent(created.observation), [10.0, 10.0, 10.0])
    again = await service.create_session(CreateSessionRequest(model="pin-v1", seed=5, session_id="c-1"))
    assert again.created_at == created.created_at and again.observation == created.observation
    with pytest.raises(RolloutError) as err:  # another body under the same id: not a retry of it
        await service.create_session(CreateSessionRequest(model="pin", seed=9, session_id="c-1"))
    assert (err.value.code, err.value.committed_step_id) == ("session_exists", -1)
    with pytest.raises(RolloutError) as err:
        await service.create_session(CreateSessionRequest(model="other", session_id="c-1"))
    assert (err.value.code, err.value.message) == (
        "model_not_found",
        "this server serves world 'pin', not 'other'",
    )


class GatedWorld(PinWorld):
    """Steps wait at the gate while it is set: a step can be held inside the world."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.clock_after_step: list[float] | None = None

    def step_batch(self, steps):
        outs = super().step_batch(steps)
        gate = self.gate
        if gate is not None:
            gate.wait(5.0)
        if self.clock_after_step is not None:
            self.clock_after_step[0] += 8.0  # the step took 8 s of the service's clock
        return outs


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)


def item(sid: str, step_id: int) -> BatchStepItem:
    return BatchStepItem(session_id=sid, **move(step_id).model_dump())


async def test_crossed_batches_take_session_locks_in_one_order() -> None:
    world = GatedWorld()
    svc = RolloutService(world, FAST)
    try:
        await create(svc, 1, session_id="a")
        await create(svc, 2, session_id="b")
        gate = world.gate = threading.Event()
        held = asyncio.create_task(svc.step("b", move(0)))  # holds b's lock inside the world
        await until(lambda: len(world.steps) == 1)
        first = asyncio.create_task(svc.batch_step(BatchStepRequest(items=[item("b", 1), item("a", 0)])))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(svc.batch_step(BatchStepRequest(items=[item("a", 1), item("b", 2)])))
        await asyncio.sleep(0.01)
        world.gate = None
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(held, first, second), 5.0)
        assert answers[0].error is None
        assert [r.status for r in answers[1].results + answers[2].results] == ["ok"] * 4
    finally:
        svc.close()


Release = Callable[[], Awaitable[Any]]


@contextlib.asynccontextmanager
async def close_queued_behind_a_step() -> AsyncIterator[tuple[RolloutService, str, Release]]:
    """A session whose step 0 is held inside the world while its close waits behind it; yields the
    service, the session and ``release``, which lets the step finish and returns both answers."""
    world = GatedWorld()
    svc = RolloutService(world, FAST)
    try:
        sid = await create(svc)
        gate = world.gate = threading.Event()
        running = asyncio.create_task(svc.step(sid, move(0)))
        await until(lambda: len(world.steps) == 1)
        closing = asyncio.create_task(svc.close_session(sid))
        await asyncio.sleep(0.01)  # let the close reach the session's lock

        async def release() -> Any:
            await asyncio.sleep(0.01)  # let what the test queued reach the lock too
            world.gate = None
            gate.set()
            return await asyncio.wait_for(asyncio.gather(running, closing), 5.0)

        yield svc, sid, release
    finally:
        svc.close()


async def test_a_step_queued_behind_a_close_is_refused_with_the_final_counters() -> None:
    async with close_queued_behind_a_step() as (svc, sid, release):
        queued = asyncio.create_task(svc.step(sid, move(1)))
        done, closed = await release()
        refused = await asyncio.wait_for(queued, 5.0)
        assert done.error is None and closed.committed_step_id == 0
        assert error_of(refused) == ("session_closed", f"session {sid!r} is closed", 1, 0, 0, 1)


async def test_the_idle_clock_restarts_when_a_long_step_ends() -> None:
    now = [0.0]
    world = GatedWorld()
    world.clock_after_step = now
    settings = ServerSettings(rollout_idle_ttl_s=10.0, max_batch_wait_ms=0.0)
    svc = RolloutService(world, settings, clock=lambda: now[0])
    try:
        sid = await create(svc)
        assert (await svc.step(sid, move(0))).error is None  # started at 0, ended at 8
        now[0] = 15.0  # 15 s after it started, 7 s after it ended
        assert (await svc.step(sid, move(1))).error is None
    finally:
        svc.close()


async def test_a_request_whose_content_cannot_be_hashed_is_refused(service, world) -> None:
    sid = await create(service)
    await service.step(sid, move(0))
    req = move(1)
    req.observation.extra["loop"] = req.observation.extra  # no transport builds this; the check must hold
    code, message, *counters = error_of(await service.step(sid, req))
    assert code == "invalid_request" and "Circular reference" in message and counters == [1, 0, 0, 1]
    assert len(world.steps) == 1


async def test_a_repeated_batch_item_does_not_stop_the_items_after_it(service) -> None:
    a, b = await create(service, 1), await create(service, 2)
    resp = await service.batch_step(BatchStepRequest(items=[item(a, 0), item(a, 1), item(b, 0)]))
    assert [r.status for r in resp.results] == ["ok", "error", "ok"]
    assert (await service.get_status(b)).committed_step_id == 0


class DeviceTensor:
    """Behaves like a torch tensor that needs grad, is half precision and lives on a GPU: ``numpy()``
    works only after ``detach()``, ``float()`` and ``cpu()``, as with torch."""

    def __init__(self, values: list[float], done: frozenset[str] = frozenset()) -> None:
        self.values, self.done = values, done

    def _then(self, method: str) -> DeviceTensor:
        return DeviceTensor(self.values, self.done | {method})

    def detach(self) -> DeviceTensor:
        return self._then("detach")

    def float(self) -> DeviceTensor:
        return self._then("float")

    def cpu(self) -> DeviceTensor:
        return self._then("cpu")

    def numpy(self) -> np.ndarray:
        missing = {"detach", "float", "cpu"} - self.done
        if missing:
            raise TypeError(f"call {sorted(missing)} first")
        return np.asarray(self.values, dtype=np.float32)


async def test_world_outputs_may_be_device_tensors_or_plain_lists(world) -> None:
    class TensorWorld(PinWorld):
        def step_batch(self, steps):
            outs = super().step_batch(steps)
            return [
                dataclasses.replace(
                    o,
                    observation=DeviceTensor(o.observation.tolist())
                    if s.action[0] > 0
                    else o.observation.tolist(),
                    vector=DeviceTensor([1.0, 2.0]),
                    images=None,
                    action=None,
                )
                for o, s in zip(outs, steps, strict=True)
            ]

    svc = RolloutService(TensorWorld(), FAST)
    try:
        sid = await create(svc, seed=1)
        resp = await svc.step(sid, move(0, 1.0))
        assert resp.error is None
        np.testing.assert_array_equal(latent(resp.next_observation), [4.0, 2.0, 2.0])
        assert resp.next_observation["state"] == [1.0, 2.0]
        listed = await svc.step(sid, move(1, -1.0))
        assert listed.error is None
        np.testing.assert_array_equal(latent(listed.next_observation), [2.0, 2.0, 2.0])
    finally:
        svc.close()


async def test_images_without_a_state_vector(service, world) -> None:
    world.vector = None
    render = RenderRequest(cameras=["front"], height=16, width=16)
    created = await service.create_session(CreateSessionRequest(model="pin", seed=3, render=render))
    assert (
        "state" not in created.observation and (image_of(created.observation["images"]["front"]) == 3).all()
    )
    resp = await service.step(created.session_id, move(0))
    assert "state" not in resp.next_observation and list(resp.next_observation["images"]) == ["front"]


async def test_a_world_that_requires_an_action_takes_it_from_the_state() -> None:
    svc = RolloutService(ToyWorld(), FAST)
    try:
        a = (await svc.create_session(CreateSessionRequest(model="toy", seed=0))).session_id
        b = (await svc.create_session(CreateSessionRequest(model="toy", seed=0))).session_id
        state = [0.2] * 7 + [0.6]
        from_state = await svc.step(
            a, RolloutStepRequest(step_id=0, observation=Observation(state=state), action=Action())
        )
        explicit = RolloutStepRequest(
            step_id=0,
            observation=Observation(),
            action=Action(joint_positions=[0.2] * 7, gripper_position=0.6),
        )
        assert from_state.error is None
        assert from_state.next_observation == (await svc.step(b, explicit)).next_observation
    finally:
        svc.close()


async def test_bytes_in_extra_are_part_of_the_fingerprint(service, world) -> None:
    a = RolloutStepRequest(step_id=0, observation=Observation(extra={"blob": b"a"}), action=Action())
    b = RolloutStepRequest(step_id=0, observation=Observation(extra={"blob": b"b"}), action=Action())
    assert RolloutService.fingerprint(a) != RolloutService.fingerprint(b)
    sid = await create(service)
    await service.step(sid, a)
    other = await service.step(sid, b)
    assert not other.replayed and other.next_observation is None


async def test_steps_keep_the_epoch_and_each_reset_raises_it_by_one(service) -> None:
    sid = await create(service)
    session = service.store.peek(sid)
    for step_id in range(3):
        await service.step(sid, move(step_id))
        assert (session.epoch, session.committed_step_id) == (0, step_id)
    await service.reset_session(sid)
    assert (session.epoch, session.committed_step_id) == (1, -1)
    for step_id in range(3):
        await service.step(sid, move(step_id))
        assert (session.epoch, session.committed_step_id) == (1, step_id)
    await service.reset_session(sid)
    assert session.epoch == 2


async def test_every_answer_uses_the_wire_it_was_asked_on(service) -> None:
    sid = (
        await service.create_session(CreateSessionRequest(model="pin", seed=1, session_id="w-1"))
    ).session_id
    again = await service.create_session(
        CreateSessionRequest(model="pin", seed=1, session_id="w-1"), raw_tensors=True
    )
    assert again.observation["encoding"] == "tensor"
    first = await service.step(sid, move(0), raw_tensors=True)
    dup = await service.step(sid, move(0), raw_tensors=True)
    assert dup.replayed and dup.next_observation["encoding"] == "tensor"
    np.testing.assert_array_equal(
        dup.next_observation["video_latent"], first.next_observation["video_latent"]
    )
    items = [item(sid, 0), item(sid, 1)]
    batch = await service.batch_step(BatchStepRequest(items=items[1:]), raw_tensors=True)
    assert batch.results[0].next_observation["encoding"] == "tensor"
    replay = await service.batch_step(BatchStepRequest(items=items[1:]), raw_tensors=True)
    assert replay.results[0].replayed and replay.results[0].next_observation["encoding"] == "tensor"
    fork = await service.fork_session(sid, ForkSessionRequest(session_id="w-2"))
    same = await service.fork_session(sid, ForkSessionRequest(session_id="w-2"), raw_tensors=True)
    assert same.session_id == fork.session_id and same.observation["encoding"] == "tensor"
    req = CreateSessionRequest(model="pin", seed=2, session_id="w-3")
    raced = await asyncio.gather(*(service.create_session(req, raw_tensors=True) for _ in range(2)))
    assert [r.observation["encoding"] for r in raced] == ["tensor", "tensor"]


async def test_unseeded_creates_draw_31_bit_seeds(service, world) -> None:
    for _ in range(6):
        await service.create_session(CreateSessionRequest(model="pin"))
    seeds = [init.seed for init in world.inits]
    assert all(0 <= s < 2**31 for s in seeds) and max(seeds) >= 62  # all below 62: a 1e-46 chance
    assert len(set(seeds)) == 6


async def test_a_fork_of_a_rendering_session_renders_after_its_reset(service, world) -> None:
    render = RenderRequest(cameras=["wrist"], height=16, width=16)
    sid = (await service.create_session(CreateSessionRequest(model="pin", seed=1, render=render))).session_id
    fork = await service.fork_session(sid)
    reset = await service.reset_session(fork.session_id, ResetSessionRequest(seed=4))
    assert world.inits[-1].render.cameras == ("wrist",)
    assert (image_of(reset.observation["images"]["wrist"]) == 4).all()


async def test_a_reset_queued_behind_a_close_is_refused() -> None:
    async with close_queued_behind_a_step() as (svc, sid, release):
        resetting = asyncio.create_task(svc.reset_session(sid))
        forking = asyncio.create_task(svc.fork_session(sid))
        await release()
        for queued in (resetting, forking):
            with pytest.raises(RolloutError) as err:
                await asyncio.wait_for(queued, 5.0)
            assert (err.value.code, err.value.message, err.value.committed_step_id) == (
                "session_closed",
                f"session {sid!r} is closed",
                0,
            )


async def test_a_reset_that_loses_to_a_close_elsewhere_is_refused(world) -> None:
    store = RacedStore()
    svc = RolloutService(world, FAST, store=store)
    try:
        sid = await create(svc)
        await svc.step(sid, move(0))

        def closed(session: RolloutSession) -> Commit:
            store.close(session.session_id)
            return Commit((0, 0), None, session.observation, 0, 1, None, 0)

        store.rival = closed
        with pytest.raises(RolloutError) as err:
            await svc.reset_session(sid)
        assert (err.value.code, err.value.message, err.value.committed_step_id) == (
            "session_closed",
            f"session {sid!r} is closed",
            0,
        )
    finally:
        svc.close()


async def test_a_batch_may_hold_exactly_max_batch_items(world) -> None:
    svc = RolloutService(world, FAST, max_batch_items=2)
    try:
        a, b = await create(svc, 1), await create(svc, 2)
        resp = await svc.batch_step(BatchStepRequest(items=[item(a, 0), item(b, 0)]))
        assert [r.status for r in resp.results] == ["ok", "ok"]
        with pytest.raises(RolloutError) as err:
            await svc.batch_step(BatchStepRequest(items=[item(a, 1), item(b, 1), item("c", 0)]))
        assert err.value.message == "batch_step takes at most 2 items"
    finally:
        svc.close()


async def test_timings_have_sub_millisecond_resolution(service) -> None:
    a, b = await create(service, 1), await create(service, 2)
    metas = [(await service.step(sid, move(0))).model_metadata for sid in (a, b)]
    metas += [(await service.step(sid, move(1))).model_metadata for sid in (a, b)]
    assert any(m.latency_ms != int(m.latency_ms) for m in metas)  # not rounded to whole milliseconds
    assert any(m.queue_wait_ms != int(m.queue_wait_ms) for m in metas)


class NoTouchStore:
    """A SessionStore with no idle clock of its own (no ``touch``), as a shared store may be."""

    def __init__(self) -> None:
        self._inner = RolloutStore(8, 600.0)
        self.capacity = 8

    def __getattr__(self, name: str) -> Any:
        if name == "touch":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_store_without_an_idle_clock_serves_steps(world) -> None:
    svc = RolloutService(world, FAST, store=NoTouchStore())
    try:
        sid = await create(svc)
        assert (await svc.step(sid, move(0))).error is None
        items = [item(sid, 1)]
        assert (await svc.batch_step(BatchStepRequest(items=items))).results[0].status == "ok"
    finally:
        svc.close()


async def test_timings_are_milliseconds_of_the_services_clock_and_the_engines_wait(
    monkeypatch, world
) -> None:
    """Exact values: the service's clock is replaced (only in its module) and so is the engine."""
    ticks = iter([100.0, 100.25])
    clock = types.SimpleNamespace(perf_counter=lambda: next(ticks), time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(service_module, "time", clock)

    class FixedEngine:
        async def submit_many(self, calls):
            outs = run_world_calls(world, calls)
            return [Completed(o, queue_wait_s=0.0123, run_s=0.5, batch_size=3) for o in outs]

        def close(self) -> None:
            pass

    svc = RolloutService(world, FAST)
    svc.engine.close()
    try:
        session = RolloutSession("s", "pin", "world_model_env", 0.0, None, None, np.zeros(3), None)
        start = world.initial_states([WorldInit(seed=1)])[0]
        session.state = session.root = start.state
        await svc.store.insert(session)
        svc.engine = FixedEngine()
        meta = (await svc.step("s", move(0))).model_metadata
        assert (meta.latency_ms, meta.queue_wait_ms, meta.batch_size) == (250.0, 12.3, 3)
    finally:
        svc.close()


def test_every_field_of_a_plain_step_is_part_of_its_fingerprint() -> None:
    def req(**changes: Any) -> RolloutStepRequest:
        body: dict[str, Any] = {
            "step_id": 3,
            "observation": {"state": [0.5, 0.25], "prompt": "pick"},
            "action": {"joint_positions": [0.125] * 7, "gripper_position": 0.5},
            "use_session_context": True,
        }
        for key, value in changes.items():
            part, _, field = key.partition("__")
            if field:
                body[part] = {**body[part], field: value}
            else:
                body[part] = value
        return RolloutStepRequest.model_validate(body)

    variants = [
        req(),
        req(step_id=4),
        req(use_session_context=False),
        req(observation__state=[0.5, 0.5]),
        req(observation__prompt="place"),
        req(action__joint_positions=[0.125] * 6 + [0.25]),
        req(action__gripper_position=0.75),
        req(action__gripper_position=[0.5]),  # a list is not the scalar
        req(observation__extra={"k": 1}),
        req(action__extra={"k": 1}),
        req(observation__images={"cam": "client-encoded"}),
    ]
    prints = [_fingerprint(v) for v in variants]
    assert len(set(prints)) == len(variants)
    assert _fingerprint(req()) == prints[0]
    item = {"step_id": 3, "observation": {}, "action": {}}
    a = BatchStepItem.model_validate({**item, "session_id": "a"})
    b = BatchStepItem.model_validate({**item, "session_id": "b"})
    assert _fingerprint(a) == _fingerprint(b)  # where a step goes is not part of what it is
    rich = {**item, "observation": {"extra": {"k": 1}}}  # the JSON print leaves it out as well
    c = BatchStepItem.model_validate({**rich, "session_id": "a"})
    d = BatchStepItem.model_validate({**rich, "session_id": "b"})
    assert _fingerprint(c) == _fingerprint(d) == _fingerprint(RolloutStepRequest.model_validate(rich))


def test_a_fingerprint_is_computed_once_per_request() -> None:
    req = RolloutStepRequest(step_id=0, observation=Observation(), action=Action())
    first = RolloutService.fingerprint(req)
    assert first == _fingerprint(req)
    req._fingerprint = "set-off-the-loop"  # what the routes do for big bodies
    assert RolloutService.fingerprint(req) == "set-off-the-loop"


def test_info_keys_become_json_strings() -> None:
    assert _json_safe({1: True, "n": None, "i": 3, "s": "x", "f": 0.5}) == {
        "1": True,
        "n": None,
        "i": 3,
        "s": "x",
        "f": 0.5,
    }
    with pytest.raises(ValueError):
        _json_safe({"f": float("inf")})
    converted = _json_safe({"f": np.float32(0.5), "b": np.bool_(True)})
    assert converted == {"f": 0.5, "b": True}
    assert [type(v) for v in converted.values()] == [float, bool]  # plain JSON values, not numpy's


def test_fold_scalar_and_float_list_fast_paths_check_the_range() -> None:
    assert _finite_array(0.5, "g").tolist() == [0.5] and _finite_array(0.5, "g").dtype == np.float64
    assert _finite_array([FLOAT32_MAX, -FLOAT32_MAX], "v").tolist() == [FLOAT32_MAX, -FLOAT32_MAX]
    for bad in (float("nan"), FLOAT32_MAX * 2, -FLOAT32_MAX * 2, [0.0, float("nan")], [-FLOAT32_MAX * 2]):
        with pytest.raises(ValueError) as err:
            _finite_array(bad, "v")
        assert str(err.value) == "v must be finite and within float32 range"
    with pytest.raises(ValueError) as err:
        _finite_array([0.0] * (MAX_VECTOR + 1), "v")
    assert str(err.value) == f"v holds more than {MAX_VECTOR} values"
    assert _finite_array([0.0] * MAX_VECTOR, "v").shape == (MAX_VECTOR,)
    assert _finite_array([1, 2.5], "v").tolist() == [1.0, 2.5]


def test_vector_keys_also_take_scalars_and_arrays() -> None:
    for scalar in (3, np.float32(0.5)):
        folded = fold_action_into_observation(Observation(extra={"observation/state": scalar}), None)
        assert folded["observation/state"].tolist() == [float(scalar)]
    edge = _finite_array(np.array([FLOAT32_MAX, -FLOAT32_MAX]), "v")
    assert edge.tolist() == [FLOAT32_MAX, -FLOAT32_MAX]  # the range is inclusive on every path
    for bad in (np.array([np.nan]), np.array([[FLOAT32_MAX * 2]]), [[float("inf")]]):
        with pytest.raises(ValueError) as err:
            _finite_array(bad, "v")
        assert str(err.value) == "v must be finite and within float32 range"


def test_requests_that_differ_only_in_images_or_action_extra_get_different_prints() -> None:
    def req(images: Any = None, action_extra: Any = None) -> RolloutStepRequest:
        return RolloutStepRequest.model_validate(
            {
                "step_id": 0,
                "observation": {"images": images},
                "action": {"extra": action_extra or {}},
            }
        )

    assert _fingerprint(req(images={"cam": "a"})) != _fingerprint(req(images={"cam": "b"}))
    assert _fingerprint(req(action_extra={"k": 1})) != _fingerprint(req(action_extra={"k": 2}))
    assert _json_safe({1: True}) == {"1": True}


# -- answers built without validation: exactly what validating the same values gives ------------------
async def test_every_answer_model_is_what_validation_gives(service, world) -> None:
    """The service builds its answers without validating them again (``protocol.built``); each one
    equals the model validation builds from the same values, written down here field by field."""
    world.uncertainty = 0.125
    a, b = await create(service, seed=1), await create(service, seed=2)
    ok = await service.step(a, move(0, 2.0))
    meta = ok.model_metadata
    assert meta.model_dump().keys() == {
        "latency_ms", "steps_generated", "context_length", "committed_step_id",
        "session_memory_bytes", "uncertainty", "queue_wait_ms", "batch_size",
    }  # fmt: skip
    expected_meta = service_module.SessionMetadata(
        latency_ms=meta.latency_ms,
        steps_generated=1,
        context_length=1,
        committed_step_id=0,
        uncertainty=0.125,
        queue_wait_ms=meta.queue_wait_ms,
        batch_size=1,
    )
    assert meta == expected_meta and meta.session_memory_bytes is None
    expected = service_module.RolloutStepResponse(
        step_id=0, next_observation=ok.next_observation, model_metadata=expected_meta
    )
    assert ok == expected and ok.model_dump(mode="json") == expected.model_dump(mode="json")
    refused = await service.step(a, move(5))
    error = service_module.ErrorObject(
        code="step_out_of_order", message="expected step_id 1, got 5", step_id=5, committed_step_id=0
    )
    assert refused == service_module.RolloutStepResponse(
        step_id=5,
        model_metadata=service_module.SessionMetadata(
            latency_ms=0.0, steps_generated=0, context_length=1, committed_step_id=0
        ),
        error=error,
    )
    items = [
        BatchStepItem(session_id=a, **move(1).model_dump()),
        BatchStepItem(session_id=b, **move(3).model_dump()),
    ]
    batch = await service.batch_step(BatchStepRequest(items=items))
    validated = service_module.BatchStepResponse(
        results=[
            service_module.BatchStepResult(**r.model_dump(exclude={"session_id", "status"}), **extra)
            for r, extra in zip(
                batch.results,
                [{"session_id": a, "status": "ok"}, {"session_id": b, "status": "error"}],
                strict=True,
            )
        ]
    )
    assert batch == validated and batch.model_dump(mode="json") == validated.model_dump(mode="json")
    assert [r.status for r in batch.results] == ["ok", "error"]
    assert [r.replayed for r in batch.results] == [False, False]
    assert batch.results[0].model_metadata.batch_size == 1


def test_a_requests_print_is_computed_once_and_kept_on_it() -> None:
    req = move(3)
    first = RolloutService.fingerprint(req)
    assert first == _fingerprint(move(3)) and req._fingerprint == first
    assert RolloutService.fingerprint(req) is first  # the kept one, not computed again


# -- batch_step/columns: each row is its item, answered in columns ------------------------------------------
def columns(session_ids: list[str], step_ids: list[int], *rows: list[float]) -> BatchStepColumnsRequest:
    return BatchStepColumnsRequest(session_ids=session_ids, step_ids=step_ids, actions=np.array(rows))


ROW = [0.5, -1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.25]  # moves a pin world session by (0.5, -1, 2)


async def test_a_row_asks_the_world_what_its_item_asks(service, world) -> None:
    by_item, by_row = await create(service, seed=4), await create(service, seed=4)
    item = BatchStepItem(
        session_id=by_item,
        step_id=0,
        observation=Observation(),
        action=Action(joint_positions=ROW[:7], gripper_position=ROW[7]),
    )
    items = await service.batch_step(BatchStepRequest(items=[item]))
    rows = await service.batch_step_columns(columns([by_row], [0], ROW), raw_tensors=True)
    asked_item, asked_row = world.steps[-2:]
    assert asked_row.action.dtype == np.float32 and asked_row.action.shape == (8,)
    np.testing.assert_array_equal(asked_row.action, asked_item.action)
    assert asked_item.action.dtype == np.float32
    assert asked_row.inputs.keys() == asked_item.inputs.keys() == {
        "prompt", "observation/joint_position", "observation/gripper_position"
    }  # fmt: skip
    assert asked_row.inputs["prompt"] == asked_item.inputs["prompt"] == ""
    for key in ("observation/joint_position", "observation/gripper_position"):
        assert asked_row.inputs[key].dtype == asked_item.inputs[key].dtype == np.float64
        np.testing.assert_array_equal(asked_row.inputs[key], asked_item.inputs[key])
    np.testing.assert_array_equal(asked_row.state[0], asked_item.state[0])
    np.testing.assert_array_equal(
        rows.next_observation["video_latent"][0], latent(items.results[0].next_observation)
    )
    np.testing.assert_array_equal(
        rows.next_observation["video_latent"][0], [9.0, 6.0, 12.0]
    )  # (4.5, 3, 6) x 2


async def test_rows_answer_in_columns_each_with_its_own_counters(service, world) -> None:
    world.vector, world.uncertainty, world.info = np.arange(4, dtype=np.float32), 0.5, {"k": 1}
    a, b, c = [await create(service, seed=s) for s in (1, 2, 3)]
    edge = [0.0] * 7 + [FLOAT32_MAX]  # the largest float32 still counts as finite
    req = columns([a, "nobody", a, b, c], [0, 4, 0, 0, 0], ROW, ROW, ROW, [float("nan")] * 8, edge)
    before = time.perf_counter()
    out = await service.batch_step_columns(req, raw_tensors=True)
    took_ms = (time.perf_counter() - before) * 1000.0
    assert out.object == "batch_step.columns"
    assert out.session_ids == [a, "nobody", a, b, c] and out.step_ids == [0, 4, 0, 0, 0]
    assert out.status == ["ok", "error", "error", "error", "ok"]
    assert out.replayed == [False] * 5
    assert out.committed_step_ids == [0, -1, 0, -1, 0] and out.context_lengths == [1, 0, 1, 0, 1]
    assert out.errors == [
        None,
        {"code": "session_not_found", "message": "session 'nobody' does not exist"},
        {"code": "invalid_request", "message": "a session may appear only once per batch_step"},
        {"code": "invalid_request", "message": "actions[3] must be finite and within float32 range"},
        None,
    ]
    assert out.uncertainty == [0.5, None, None, None, 0.5]
    seen = out.next_observation
    assert (seen["encoding"], seen["dtype"], seen["shape"]) == ("tensor", "float32", [5, 3])
    assert seen["video_latent"].dtype == np.float32
    np.testing.assert_array_equal(
        seen["video_latent"], [[3.0, 0.0, 6.0], [0] * 3, [0] * 3, [0] * 3, [6.0] * 3]
    )
    assert isinstance(seen["state"], np.ndarray) and seen["state"].dtype == np.float32
    np.testing.assert_array_equal(seen["state"], [[0, 1, 2, 3], [0] * 4, [0] * 4, [0] * 4, [0, 1, 2, 3]])
    assert seen["reward"] == [0.25, 0.0, 0.0, 0.0, 0.25] and seen["terminated"] == [False] * 5
    assert seen["info"] == [{"k": 1}, {}, {}, {}, {"k": 1}]
    assert isinstance(out.latency_ms, float) and 0.0 < out.latency_ms <= took_ms
    assert round(out.latency_ms, 3) == out.latency_ms
    assert [(await service.get_status(s)).committed_step_id for s in (a, b, c)] == [0, -1, 0]


async def test_columns_in_json_carry_base64_and_lists(service, world) -> None:
    world.vector = np.arange(2, dtype=np.float32)
    sid = await create(service, seed=1)
    out = await service.batch_step_columns(columns([sid], [0], ROW))  # JSON, the default
    seen = out.next_observation
    assert (seen["encoding"], seen["shape"]) == ("base64_raw_tensor", [1, 3])
    np.testing.assert_array_equal(latent(seen), [[3.0, 0.0, 6.0]])
    assert seen["state"] == [[0.0, 1.0]]


async def test_a_replayed_row_holds_the_stored_result_and_another_action_holds_none(service, world) -> None:
    world.vector, world.uncertainty, world.info, world.reward = np.ones(2, np.float32), 0.75, {"n": 2}, 1.5
    sid = await create(service, seed=5)
    first = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    world.vector, world.uncertainty, world.info, world.reward = None, None, {}, 0.0  # a replay runs nothing
    steps = len(world.steps)
    again = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    assert len(world.steps) == steps
    assert again.status == ["error"] and again.replayed == [True] and again.step_ids == [0]
    assert again.errors == [
        {
            "code": "step_already_committed",
            "message": "step 0 is already committed; its stored result is returned",
        }
    ]
    assert (again.committed_step_ids, again.context_lengths, again.uncertainty) == ([0], [1], [0.75])
    seen, stored = again.next_observation, first.next_observation
    np.testing.assert_array_equal(seen["video_latent"], stored["video_latent"])
    np.testing.assert_array_equal(seen["state"], [[1.0, 1.0]])
    assert (seen["reward"], seen["terminated"], seen["info"]) == ([1.5], [False], [{"n": 2}])
    other = await service.batch_step_columns(columns([sid], [0], [0.0] * 8), raw_tensors=True)
    assert other.status == ["error"] and other.replayed == [False]
    assert other.errors[0]["code"] == "step_already_committed" and "differs" in other.errors[0]["message"]
    assert not other.next_observation["video_latent"].any() and other.uncertainty == [None]
    assert (other.next_observation["reward"], other.next_observation["terminated"]) == ([0.0], [False])


async def test_a_row_queued_behind_a_close_is_refused_with_the_final_counters() -> None:
    async with close_queued_behind_a_step() as (svc, sid, release):
        queued = asyncio.create_task(svc.batch_step_columns(columns([sid], [1], ROW), raw_tensors=True))
        await release()
        out = await asyncio.wait_for(queued, 5.0)
        assert out.status == ["error"] and out.step_ids == [1]
        assert out.errors == [{"code": "session_closed", "message": f"session {sid!r} is closed"}]
        assert (out.committed_step_ids, out.context_lengths) == ([0], [1])


async def test_a_rendering_session_and_a_misshapen_observation_commit_nothing(service, world) -> None:
    shown = await create(service, seed=1, render=RenderRequest(cameras=["front"]))
    plain = await create(service, seed=2)
    await service.step(plain, move(0))
    steps = len(world.steps)
    out = await service.batch_step_columns(columns([shown], [0], ROW), raw_tensors=True)
    assert len(world.steps) == steps  # refused before the world was asked
    message = "a rendering session's frames do not fit in columns: step it with batch_step items"
    assert out.errors == [{"code": "invalid_request", "message": message}] and out.step_ids == [0]
    assert (out.committed_step_ids, out.context_lengths) == ([-1], [0])
    world.replace_output = WorldOutput(state=(np.zeros(3, np.float32), None), observation=np.zeros(4))
    out = await service.batch_step_columns(columns([plain], [1], ROW), raw_tensors=True)
    message = "world step failed: its observation is not of the spec's shape [3]"
    assert out.errors == [{"code": "inference_error", "message": message}] and out.step_ids == [1]
    assert (out.committed_step_ids, out.context_lengths) == ([0], [1])
    assert (await service.get_status(plain)).committed_step_id == 0


async def test_a_row_that_loses_its_commit_to_a_reset_elsewhere_is_checked_again(world) -> None:
    async with raced(world) as (svc, store, sid):
        store.rival = reset_elsewhere
        out = await svc.batch_step_columns(columns([sid], [1], ROW), raw_tensors=True)
        assert out.errors == [{"code": "step_out_of_order", "message": "expected step_id 0, got 1"}]
        assert (out.committed_step_ids, out.context_lengths, out.step_ids) == ([-1], [0], [1])
        store.rival = reset_elsewhere
        out = await svc.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
        message = "the session moved while the step ran; retry"
        assert out.errors == [{"code": "step_out_of_order", "message": message}]
        assert (out.committed_step_ids, out.context_lengths) == ([-1], [0])
        assert not out.next_observation["video_latent"].any()
        out = await svc.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
        assert out.status == ["ok"]  # the retry the message asks for


async def test_columns_report_their_latency_in_ms_to_the_microsecond(service, monkeypatch) -> None:
    sid = await create(service, seed=1)
    ticks = iter([10.0, 10.0123456])  # the batch's start and end on the service's clock
    monkeypatch.setattr(service_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    out = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    assert out.status == ["ok"] and out.latency_ms == 12.346


async def test_an_observation_of_the_specs_size_in_another_shape_fills_its_row(service, world) -> None:
    sid = await create(service, seed=1)
    world.replace_output = WorldOutput(state=(np.ones(3, np.float32), None), observation=np.full((3, 1), 7.0))
    out = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    assert out.status == ["ok"]
    np.testing.assert_array_equal(out.next_observation["video_latent"], [[7.0, 7.0, 7.0]])
    again = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    assert again.replayed == [True]
    np.testing.assert_array_equal(again.next_observation["video_latent"], [[7.0, 7.0, 7.0]])


async def test_a_stored_result_that_does_not_fit_in_columns_is_refused_not_replayed(service, world) -> None:
    sid = await create(service, seed=1)
    world.replace_output = WorldOutput(state=(np.ones(3, np.float32), None), observation=np.full(4, 7.0))
    item = BatchStepItem(
        session_id=sid, step_id=0, observation=Observation(),
        action=Action(joint_positions=ROW[:7], gripper_position=ROW[7]),
    )  # fmt: skip
    assert (await service.batch_step(BatchStepRequest(items=[item]))).results[0].status == "ok"  # any shape
    out = await service.batch_step_columns(columns([sid], [0], ROW), raw_tensors=True)
    assert out.status == ["error"] and out.replayed == [False]
    assert out.errors == [
        {
            "code": "step_already_committed",
            "message": "step 0 is already committed; its stored result is returned; it does not fit in "
            "columns: resend it as a batch_step item",
        }
    ]
    assert not out.next_observation["video_latent"].any() and out.uncertainty == [None]


async def test_a_replayed_step_restarts_the_idle_clock_too() -> None:
    """A duplicate is answered without the world and without the end-of-step touch: it is use all
    the same, so opening the session for it restarts the idle clock."""
    now = [0.0]
    settings = ServerSettings(rollout_idle_ttl_s=10.0, max_batch_wait_ms=0.0)
    svc = RolloutService(PinWorld(), settings, clock=lambda: now[0])
    try:
        sid = await create(svc)
        await svc.step(sid, move(0))
        now[0] = 8.0
        assert (await svc.step(sid, move(0))).replayed
        now[0] = 15.0  # 7 s after the replay, 15 s after the step
        assert (await svc.get_status(sid)).closed is False
        now[0] = 18.5  # 10.5 s after the replay
        assert (await svc.get_status(sid)).closed_reason == "expired"
    finally:
        svc.close()
