"""Review of the `worlds_acting` mutation run: world-action models and the simulator world, one layer.

``ActingWorld`` is driven over the toy world with a scripted policy whose chunk, processors and
camera names the test sets, so every expected action is written down here: the policy's rows after
its ``post`` processor, ``execute`` of them per chunk, the noise seed as sha256 of the state's
little-endian float32 bytes (packed with ``struct``, not numpy), and the toy world's rule (the
first 8 values move halfway to the action) for what applying it gives. ``SimWorld`` is checked
against the gymnasium env and the layout docs/rollout.md publishes. Tests of what a constructor
sets up build their own world (a module fixture's setup is credited to its first test only).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest

from rollserve.models import sim_world
from rollserve.models.policy import PolicyMetadata, Processors
from rollserve.models.sim_world import SimWorld, frames_tensor
from rollserve.models.world import RenderSpec, WorldInit, WorldOutput, WorldStep
from rollserve.models.world_action import ActingState, ActingWorld, policy_state, seed_of
from rollserve.models.worlds import ToyWorld
from rollserve.sim.env import TabletopPickPlaceEnv

TOY_NOTE = "acts with policy 'scripted' when a step has no action"
SIM_STATE_NAMES = (
    *(f"joint_{i}" for i in range(1, 8)),
    "gripper",
    "cube_x",
    "cube_y",
    "cube_z",
    "target_x",
    "target_y",
)


def sha_seed(state: np.ndarray) -> int:
    """The documented noise seed: sha256 of the float32 little-endian bytes, first 8 bytes, >> 1."""
    values = [float(v) for v in np.asarray(state).reshape(-1)]
    digest = hashlib.sha256(struct.pack(f"<{len(values)}f", *values)).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def model_chunk(chunk_size: int, action_dim: int = 8) -> np.ndarray:
    """Row t, column a: 0.01 (10 t + a), in the policy's model space."""
    rows = np.arange(chunk_size, dtype=np.float32)[:, None] * 10 + np.arange(action_dim, dtype=np.float32)
    return (np.float32(0.01) * rows).astype(np.float32)


def to_robot(chunk: np.ndarray) -> np.ndarray:
    """What the scripted policy's ``post`` makes of a float32 chunk: twice each value."""
    return (np.asarray(chunk, np.float32) * np.float32(2.0)).astype(np.float32)


class ScriptedPolicy:
    """A chunking policy whose answer the test chooses (``answer(batch) -> chunk``, default
    :func:`model_chunk`), recording every batch it gets (after its ``pre``, which tags it)."""

    def __init__(
        self,
        *,
        state_dim: int = 15,
        action_dim: int = 8,
        chunk_size: int = 8,
        cameras: tuple[str, ...] = (),
        answer: Any = None,
    ) -> None:
        self.metadata = PolicyMetadata(
            name="scripted",
            action_names=tuple(f"a{i}" for i in range(action_dim)),
            chunk_size=chunk_size,
            state_dim=state_dim,
            camera_names=cameras,
        )
        self.batches: list[dict[str, Any]] = []
        self.answer = answer or (lambda batch: model_chunk(chunk_size, action_dim))

    def make_processors(self) -> Processors:
        # post keeps the chunk's dtype (twice each value): a float64 chunk reaches the world's checks as is
        return Processors(
            pre=lambda observation: {**observation, "pre": True}, post=lambda chunk: chunk * 2.0
        )

    def predict_action_chunk(self, batch: dict[str, Any], **kwargs: Any) -> np.ndarray:
        self.batches.append(batch)
        return self.answer(batch)


class RecordingWorld:
    """The toy world, recording each ``step_batch`` call; an item whose action's gripper is exactly
    0.75 fails with ``RuntimeError("inner failure")``."""

    def __init__(self, description: str | None = None) -> None:
        self.inner = ToyWorld()
        self.spec = (
            self.inner.spec if description is None else replace(self.inner.spec, description=description)
        )
        self.calls: list[list[WorldStep]] = []
        self.closed = False

    def initial_states(self, inits):
        return self.inner.initial_states(inits)

    def step_batch(self, steps):
        self.calls.append(list(steps))
        outs = self.inner.step_batch(steps)
        return [
            RuntimeError("inner failure") if float(np.asarray(s.action)[7]) == 0.75 else out
            for s, out in zip(steps, outs, strict=True)
        ]

    def close(self) -> None:
        self.closed = True


def toy_start(seed: int) -> np.ndarray:
    """The toy world's documented start: 7 joints U(-0.5, 0.5), gripper 0, 7 targets U(-0.9, 0.9)."""
    rng = np.random.default_rng(seed)
    joints, target = rng.uniform(-0.5, 0.5, 7), rng.uniform(-0.9, 0.9, 7)
    return np.concatenate([joints, [0.0], target]).astype(np.float32)


def toy_after(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """The toy rule: the first 8 values move halfway to the action (float32), clipped to its box."""
    act = np.clip(np.asarray(action, np.float32).astype(np.float64), [-1.0] * 7 + [0.0], [1.0] * 8)
    nxt = np.array(obs, np.float32, copy=True)
    nxt[:8] = obs[:8] + 0.5 * (act - obs[:8])  # in float64 (the box is float64), stored as float32
    return nxt


def start(world: ActingWorld, seed: int) -> WorldOutput:
    (out,) = world.initial_states([WorldInit(seed=seed)])
    assert isinstance(out, WorldOutput)
    return out


# -- ActingWorld: construction -------------------------------------------------------------------


def test_a_policy_with_another_state_size_is_refused_with_both_sizes() -> None:
    with pytest.raises(ValueError) as err:
        ActingWorld(ToyWorld(), ScriptedPolicy(state_dim=13))
    want = "policy 'scripted' takes a 13-value state, but world 'toy' has a 15-value state vector"
    assert str(err.value) == want


def test_a_policy_with_another_action_size_is_refused_with_both_sizes() -> None:
    with pytest.raises(ValueError) as err:
        ActingWorld(ToyWorld(), ScriptedPolicy(action_dim=7))
    assert str(err.value) == "policy 'scripted' outputs 7 actions, world 'toy' takes 8"


@pytest.mark.parametrize("execute", [0, 5, -1])
def test_execute_outside_one_to_the_chunk_size_is_refused(execute: int) -> None:
    with pytest.raises(ValueError) as err:
        ActingWorld(ToyWorld(), ScriptedPolicy(chunk_size=4), execute=execute)
    assert str(err.value) == f"execute must be in [1, 4], got {execute}"


@pytest.mark.parametrize("execute", [1, 4])
def test_execute_at_either_end_is_accepted_and_plays_that_many(execute: int) -> None:
    policy = ScriptedPolicy(chunk_size=4)
    world = ActingWorld(ToyWorld(), policy, execute=execute)
    state = start(world, 0).state
    played = []
    for _ in range(2 * execute):
        (out,) = world.step_batch([WorldStep(state, None)])
        played.append(out.action)
        state = out.state
    assert len(policy.batches) == 2  # a new chunk every `execute` steps
    rows = to_robot(model_chunk(4))[:execute]
    np.testing.assert_array_equal(np.stack(played), np.concatenate([rows, rows]))


def test_a_chunk_shorter_than_execute_is_played_whole_then_the_policy_is_asked_again() -> None:
    policy = ScriptedPolicy(chunk_size=8, answer=lambda batch: model_chunk(3))  # 3 rows, not 8
    world = ActingWorld(ToyWorld(), policy, execute=6)
    state = start(world, 2).state
    played, calls = [], []
    for _ in range(4):
        (out,) = world.step_batch([WorldStep(state, None)])
        played.append(out.action)
        calls.append(len(policy.batches))
        state = out.state
    assert calls == [1, 1, 1, 2]
    rows = to_robot(model_chunk(3))
    np.testing.assert_array_equal(np.stack(played), np.concatenate([rows, rows[:1]]))


def test_the_default_plays_eight_actions_per_chunk() -> None:
    policy = ScriptedPolicy(chunk_size=10)
    world = ActingWorld(ToyWorld(), policy)
    assert world.execute == 8
    state = start(world, 1).state
    calls = []
    for _ in range(9):
        (out,) = world.step_batch([WorldStep(state, None)])
        calls.append(len(policy.batches))
        state = out.state
    assert calls == [1] * 8 + [2]


def test_the_spec_says_it_acts_and_by_which_policy_and_keeps_the_rest() -> None:
    world = ActingWorld(ToyWorld(), ScriptedPolicy())
    assert world.spec.acts is True
    assert world.spec.description == f"toy reaching world (tests and benchmarks); {TOY_NOTE}"
    assert replace(world.spec, acts=False, description=ToyWorld.spec.description) == ToyWorld.spec
    assert ToyWorld.spec.acts is False  # the wrapped world's own spec is left alone


def test_a_world_without_a_description_gets_the_note_alone() -> None:
    world = ActingWorld(RecordingWorld(description=""), ScriptedPolicy())
    assert world.spec.description == TOY_NOTE


def test_close_closes_the_wrapped_world() -> None:
    inner = RecordingWorld()
    ActingWorld(inner, ScriptedPolicy()).close()
    assert inner.closed


# -- ActingWorld: starts and steps ---------------------------------------------------------------


def test_a_start_holds_the_state_vector_read_only_and_no_plan() -> None:
    world = ActingWorld(ToyWorld(), ScriptedPolicy())
    out = start(world, 3)
    assert isinstance(out.state, ActingState)
    np.testing.assert_array_equal(out.observation, toy_start(3))
    np.testing.assert_array_equal(out.state.observation, toy_start(3))
    assert out.state.observation.dtype == np.float32 and not out.state.observation.flags.writeable
    assert out.state.plan.shape == (0, 8) and out.state.plan.dtype == np.float32
    assert not out.state.plan.flags.writeable
    np.testing.assert_array_equal(out.state.inner, toy_start(3))
    (refused,) = world.initial_states([WorldInit(state=np.zeros(3))])
    assert isinstance(refused, ValueError) and str(refused) == "toy start state must have 15 values"


def test_an_empty_action_plays_the_policys_chunk_seeded_from_the_state() -> None:
    policy = ScriptedPolicy(chunk_size=4)
    world = ActingWorld(ToyWorld(), policy, execute=3)
    first = start(world, 5)
    robot = to_robot(model_chunk(4))
    obs, state = toy_start(5), first.state
    for t in range(3):
        (out,) = world.step_batch([WorldStep(state, None)])
        assert out.action.dtype == np.float32 and out.action.shape == (8,)
        np.testing.assert_array_equal(out.action, robot[t])
        obs = toy_after(obs, robot[t])
        np.testing.assert_array_equal(out.observation, obs)  # the chosen action is the one applied
        np.testing.assert_array_equal(out.state.plan, robot[t + 1 : 3])
        assert not out.state.plan.flags.writeable
        state = out.state
    (batch,) = policy.batches  # one chunk for three steps
    assert batch["seed"] == sha_seed(toy_start(5)) and batch["pre"] is True  # through the processors
    np.testing.assert_array_equal(batch["state"], toy_start(5))
    assert batch["state"].dtype == np.float32
    (out,) = world.step_batch([WorldStep(state, None)])  # the plan is spent: plan from the state now
    assert len(policy.batches) == 2 and policy.batches[1]["seed"] == sha_seed(obs)
    np.testing.assert_array_equal(policy.batches[1]["state"], obs)


def test_an_explicit_action_is_applied_as_given_drops_the_plan_and_is_not_returned() -> None:
    policy = ScriptedPolicy(chunk_size=4)
    world = ActingWorld(ToyWorld(), policy, execute=4)
    (planned,) = world.step_batch([WorldStep(start(world, 6).state, None)])
    assert len(planned.state.plan) == 3
    action = np.array([0.25, -0.5, 0.0, 0.125, 0.5, -0.25, 0.75, 1.0], np.float64)
    (out,) = world.step_batch([WorldStep(planned.state, action)])
    assert out.action is None
    np.testing.assert_array_equal(out.observation, toy_after(planned.observation, action))
    assert out.state.plan.shape == (0, 8) and out.state.plan.dtype == np.float32
    np.testing.assert_array_equal(out.state.observation, out.observation)
    world.step_batch([WorldStep(out.state, None)])  # the client took over: the next empty step replans
    assert len(policy.batches) == 2 and policy.batches[1]["seed"] == sha_seed(out.observation)


def test_a_mixed_batch_answers_each_item_in_order_and_steps_the_world_once() -> None:
    inner = RecordingWorld()
    policy = ScriptedPolicy(chunk_size=4)
    world = ActingWorld(inner, policy, execute=4)
    a, b = start(world, 1), start(world, 2)
    (mid,) = world.step_batch([WorldStep(a.state, None)])  # a plan of 3 left
    inner.calls.clear()
    explicit = np.full(8, 0.5, np.float32)
    outs = world.step_batch(
        [
            WorldStep("not a state", None),
            WorldStep(b.state, explicit),
            WorldStep(mid.state, None),
            WorldStep(b.state, None),
        ]
    )
    assert isinstance(outs[0], TypeError) and str(outs[0]) == "an acting world steps ActingState, not str"
    robot = to_robot(model_chunk(4))
    assert outs[1].action is None
    np.testing.assert_array_equal(outs[1].observation, toy_after(toy_start(2), explicit))
    np.testing.assert_array_equal(outs[2].action, robot[1])  # the plan's next action, no new call
    np.testing.assert_array_equal(outs[3].action, robot[0])  # planned now
    assert len(policy.batches) == 2 and policy.batches[1]["seed"] == sha_seed(toy_start(2))
    (call,) = inner.calls  # one batched step of the wrapped world, the foreign item left out
    assert len(call) == 3
    np.testing.assert_array_equal(call[0].action, explicit)
    np.testing.assert_array_equal(call[1].action, robot[1])
    np.testing.assert_array_equal(call[2].action, robot[0])


def test_the_wrapped_world_gets_each_steps_inputs_and_a_float32_action() -> None:
    """The request's prompt, images and extras reach the wrapped world, whoever chose the action."""
    inner = RecordingWorld()
    world = ActingWorld(inner, ScriptedPolicy(), execute=4)
    s = start(world, 1).state
    mine = {"prompt": "lift", "observation/state": [0.5] * 15}
    theirs = {"prompt": "stack", "seed": 3}
    world.step_batch([WorldStep(s, [0.5] * 7 + [1.0], mine), WorldStep(s, None, theirs)])
    (call,) = inner.calls
    assert [step.inputs for step in call] == [mine, theirs]
    assert call[0].action.dtype == np.float32 and call[1].action.dtype == np.float32
    np.testing.assert_array_equal(call[0].action, [0.5] * 7 + [1.0])


@pytest.mark.parametrize("extra", [-1, 1], ids=["one-short", "one-over"])
def test_a_wrapped_world_that_miscounts_fails_the_whole_call(extra: int) -> None:
    """As ``run_world_calls`` refuses a world that answers another number of results than items."""

    class Miscounting(RecordingWorld):
        def step_batch(self, steps):
            outs = super().step_batch(steps)
            return outs[:-1] if extra < 0 else [*outs, outs[-1]]

    world = ActingWorld(Miscounting(), ScriptedPolicy(), execute=4)
    a, b = start(world, 1).state, start(world, 2).state
    with pytest.raises(ValueError, match="zip"):
        world.step_batch([WorldStep(a, None), WorldStep(b, np.zeros(8, np.float32))])


def test_a_batch_with_nothing_to_step_never_calls_the_wrapped_world() -> None:
    inner = RecordingWorld()
    world = ActingWorld(inner, ScriptedPolicy())
    assert world.step_batch([]) == []
    (refused,) = world.step_batch([WorldStep(np.zeros(15, np.float32), None)])
    assert isinstance(refused, TypeError) and str(refused) == "an acting world steps ActingState, not ndarray"
    assert inner.calls == []


def test_the_wrapped_worlds_failure_fails_its_item_alone() -> None:
    inner = RecordingWorld()
    world = ActingWorld(inner, ScriptedPolicy(), execute=4)
    s = start(world, 4).state
    bad = np.array([0.0] * 7 + [0.75], np.float32)  # RecordingWorld fails this item
    outs = world.step_batch([WorldStep(s, bad), WorldStep(s, None)])
    assert isinstance(outs[0], RuntimeError) and str(outs[0]) == "inner failure"
    assert isinstance(outs[1], WorldOutput)
    np.testing.assert_array_equal(outs[1].action, to_robot(model_chunk(4))[0])


@pytest.mark.parametrize(
    ("answer", "shape"),
    [
        (lambda batch: model_chunk(4, action_dim=7), "(2, 7)"),
        (lambda batch: model_chunk(4)[0], "(2,)"),
        (lambda batch: np.where(np.eye(4, 8) > 0, np.nan, model_chunk(4)), "(2, 8)"),
        (lambda batch: np.where(np.eye(4, 8) > 0, -np.inf, model_chunk(4)), "(2, 8)"),
        (lambda batch: model_chunk(4)[None], "(1, 4, 8)"),
        (lambda batch: np.where(np.eye(4, 8) > 0, 1e300, model_chunk(4).astype(np.float64)), "(2, 8)"),
        (lambda batch: model_chunk(4)[:0], "(0, 8)"),
    ],
    ids=["7-actions", "1-d", "nan", "inf", "3-d", "float32-overflow", "no-actions"],
)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e300 as float32
def test_an_unusable_chunk_fails_its_own_item_with_its_shape(answer, shape: str) -> None:
    calls = []

    def one_bad(batch):
        calls.append(batch)
        return answer(batch) if len(calls) == 1 else model_chunk(4)

    inner = RecordingWorld()
    world = ActingWorld(inner, ScriptedPolicy(answer=one_bad), execute=2)
    a, b = start(world, 1), start(world, 2)
    bad, good = world.step_batch([WorldStep(a.state, None), WorldStep(b.state, None)])
    assert isinstance(bad, ValueError) and str(bad) == f"policy returned an unusable chunk of shape {shape}"
    np.testing.assert_array_equal(good.action, to_robot(model_chunk(4))[0])
    (call,) = inner.calls
    assert len(call) == 1  # the failed item is never stepped


def test_a_policy_error_is_that_items_answer() -> None:
    boom = RuntimeError("CUDA error: out of memory")

    def fail_first(batch):
        if batch["seed"] == sha_seed(toy_start(1)):
            raise boom
        return model_chunk(8)

    world = ActingWorld(ToyWorld(), ScriptedPolicy(answer=fail_first))
    outs = world.step_batch([WorldStep(start(world, 1).state, None), WorldStep(start(world, 2).state, None)])
    assert outs[0] is boom
    np.testing.assert_array_equal(outs[1].action, to_robot(model_chunk(8))[0])


def test_the_plan_is_a_copy_of_what_the_policy_returned() -> None:
    """A policy that reuses one output buffer must not rewrite a session's stored plan."""
    buffer = model_chunk(4)

    class InPlacePolicy(ScriptedPolicy):
        def make_processors(self) -> Processors:
            return Processors()  # identity: the plan would be a view of `buffer` without a copy

    world = ActingWorld(ToyWorld(), InPlacePolicy(answer=lambda batch: buffer), execute=4)
    (out,) = world.step_batch([WorldStep(start(world, 1).state, None)])
    buffer[:] = 9.0
    assert buffer.flags.writeable
    np.testing.assert_array_equal(out.state.plan, model_chunk(4)[1:4])


def test_the_policy_gets_the_prompt_as_its_task_and_only_its_cameras() -> None:
    policy = ScriptedPolicy(cameras=("exterior", "left"))
    world = ActingWorld(ToyWorld(), policy)
    s = start(world, 1).state
    image = np.zeros((2, 2, 3), np.uint8)
    inputs = {"prompt": "stack the cube", "exterior": image, "wrist": image, "other": 1}
    world.step_batch([WorldStep(s, None, inputs), WorldStep(s, None, {"prompt": None}), WorldStep(s, None)])
    tagged, none, missing = policy.batches
    assert tagged["task"] == "stack the cube" and set(tagged["images"]) == {"exterior"}
    assert tagged["images"]["exterior"] is image
    assert (none["task"], none["images"]) == ("", {})
    assert (missing["task"], missing["images"]) == ("", {})
    assert tagged["seed"] == none["seed"] == sha_seed(toy_start(1))  # the prompt never moves the seed


def test_the_policy_gets_its_own_copy_of_the_state() -> None:
    def scribble(batch):
        batch["state"][:] = 7.0  # a processor or policy that works in place
        return model_chunk(8)

    world = ActingWorld(ToyWorld(), ScriptedPolicy(answer=scribble))
    first = start(world, 2)
    world.step_batch([WorldStep(first.state, None)])
    (again,) = world.step_batch([WorldStep(first.state, None)])  # a retry from the same state
    np.testing.assert_array_equal(first.state.observation, toy_start(2))
    np.testing.assert_array_equal(again.observation, toy_after(toy_start(2), to_robot(model_chunk(8))[0]))


# -- the state vector and the seed ---------------------------------------------------------------


def test_policy_state_prefers_the_vector_flat_float32_and_read_only() -> None:
    frame = np.ones((1, 3, 4, 4), np.float32)
    vector = np.arange(13, dtype=np.float64)
    got = policy_state(WorldOutput(state=None, observation=frame, vector=vector))
    assert got.shape == (13,) and got.dtype == np.float32 and not got.flags.writeable
    np.testing.assert_array_equal(got, np.arange(13, dtype=np.float32))
    plain = policy_state(WorldOutput(state=None, observation=np.arange(6.0).reshape(2, 3)))
    assert plain.shape == (6,) and plain.dtype == np.float32 and not plain.flags.writeable
    np.testing.assert_array_equal(plain, [0, 1, 2, 3, 4, 5])


def test_seed_of_is_the_sha256_of_the_float32_bytes() -> None:
    state = np.array([0.5, -1.25, 3.0, 1e-3, 0.0, 2.5, -0.75], np.float64)
    assert seed_of(state) == sha_seed(state) == seed_of(state.astype(np.float32))
    assert 0 <= seed_of(state) < 2**63  # fits a signed 64-bit seed
    assert seed_of(state[::-1]) != seed_of(state)
    big_endian = state.astype(">f4")
    assert seed_of(big_endian) == sha_seed(state)  # the bytes are little-endian whatever the input


# -- SimWorld ------------------------------------------------------------------------------------


def test_the_sim_spec_is_the_published_layout() -> None:
    world = SimWorld()
    try:
        spec = world.spec
        env = TabletopPickPlaceEnv()
        assert spec.name == "sim" and spec.aliases == ("tabletop",)
        assert spec.observation_names == SIM_STATE_NAMES and spec.state_layout == SIM_STATE_NAMES
        assert spec.action_names == (*(f"joint_{i}" for i in range(1, 8)), "gripper")
        assert spec.action_low == tuple(float(x) for x in env.action_space.low)
        assert spec.action_high == tuple(float(x) for x in env.action_space.high)
        assert all(type(x) is float for x in spec.action_low + spec.action_high)
        assert (spec.action_low[7], spec.action_high[7]) == (0.0, 1.0)  # the gripper command
        assert spec.observation_low == (-4.0,) * 13 and spec.observation_high == (4.0,) * 13
        assert spec.fps == 10.0 and spec.max_episode_steps == 120
        assert spec.description == "MuJoCo tabletop pick-and-place (Franka Panda), exact physics"
        assert spec.cameras == ("exterior", "wrist") and spec.frame_size is None
        assert spec.acts is False and spec.requires_action is True
        env.close()
    finally:
        world.close()


def test_the_sim_world_refuses_a_start_state_and_a_foreign_state() -> None:
    world = SimWorld()
    try:
        (refused,) = world.initial_states([WorldInit(state=np.zeros(13))])
        assert isinstance(refused, ValueError)
        assert str(refused) == "the simulator world starts from a seed, not from a state vector"
        (foreign,) = world.step_batch([WorldStep("not a state", np.zeros(8, np.float32))])
        assert isinstance(foreign, TypeError) and str(foreign) == "not a simulator state: str"
    finally:
        world.close()


def test_frames_tensor_is_chw_in_zero_to_one() -> None:
    image = np.array([[[0, 51, 255], [102, 153, 204]], [[1, 2, 3], [250, 128, 64]]], np.uint8)  # 2x2 HWC
    got = frames_tensor(image)
    assert got.shape == (1, 3, 2, 2) and got.dtype == np.float32
    for h in range(2):
        for w in range(2):
            for c in range(3):
                assert got[0, c, h, w] == np.float32(image[h, w, c]) / np.float32(255.0)
    assert got[0, 2, 0, 0] == 1.0 and got[0, 1, 0, 0] == np.float32(0.2)


def test_a_rendering_start_and_step_show_the_first_asked_camera_and_keep_the_state() -> None:
    size = (24, 32)
    world = SimWorld()
    env = TabletopPickPlaceEnv(image_size=size, max_episode_steps=10_000)
    try:
        render = RenderSpec(("wrist", "exterior"), *size)
        framed, plain = world.initial_states([WorldInit(seed=7, render=render), WorldInit(seed=7)])
        obs, info = env.reset(seed=7)
        truth = env.render_cameras()
        assert plain.vector is None and plain.images is None
        np.testing.assert_array_equal(plain.observation, obs["state"])
        assert plain.info == framed.info == info  # env.reset's info, success false at step 0
        assert info["step_count"] == 0 and info["success"] is False
        np.testing.assert_array_equal(framed.vector, obs["state"])
        assert framed.state.render == render
        assert framed.observation.shape == (1, 3, *size) and framed.observation.dtype == np.float32
        expected = truth["wrist"].transpose(2, 0, 1)[None].astype(np.float32) / np.float32(255.0)
        np.testing.assert_array_equal(framed.observation, expected)  # the first camera asked for
        assert set(framed.images) == {"wrist", "exterior"}
        for camera in ("wrist", "exterior"):
            assert framed.images[camera].shape == (*size, 3) and framed.images[camera].dtype == np.uint8
            np.testing.assert_array_equal(framed.images[camera], truth[camera])
        action = np.r_[obs["state"][:7] + 0.05, 1.0].astype(np.float32)
        stepped, bare = world.step_batch([WorldStep(framed.state, action), WorldStep(plain.state, action)])
        obs, reward, *_ = env.step(action)
        truth = env.render_cameras()
        assert stepped.state.render == render and bare.state.render is None  # a step keeps the choice
        assert bare.images is None and bare.vector is None
        np.testing.assert_array_equal(stepped.vector, obs["state"])
        np.testing.assert_array_equal(bare.observation, obs["state"])
        assert stepped.reward == bare.reward == reward
        for camera in ("wrist", "exterior"):
            np.testing.assert_array_equal(stepped.images[camera], truth[camera])
    finally:
        env.close()
        world.close()


class FakeRig:
    """Stands in for ``CameraRig`` (no GL): records what was built and closed."""

    built: ClassVar[list[tuple[tuple[int, int], tuple[str, ...]]]] = []
    closed: ClassVar[list[tuple[tuple[int, int], tuple[str, ...]]]] = []

    def __init__(self, model, image_size, camera_names) -> None:
        self.key = (tuple(image_size), tuple(camera_names))
        FakeRig.built.append(self.key)

    def render(self, data):
        height, width = self.key[0]
        return {name: np.full((height, width, 3), i, np.uint8) for i, name in enumerate(self.key[1])}

    def close(self) -> None:
        FakeRig.closed.append(self.key)


@pytest.fixture
def fake_rigs(monkeypatch: pytest.MonkeyPatch) -> type[FakeRig]:
    monkeypatch.setattr(sim_world, "CameraRig", FakeRig)
    FakeRig.built, FakeRig.closed = [], []
    return FakeRig


def open_rendering(world: SimWorld, cameras: tuple[str, ...], size: int) -> WorldOutput | BaseException:
    (out,) = world.initial_states([WorldInit(seed=1, render=RenderSpec(cameras, size, size))])
    return out


def test_four_rigs_are_kept_and_the_least_recently_used_closes(fake_rigs) -> None:
    world = SimWorld()
    try:
        for size in (16, 20, 24, 28):
            open_rendering(world, ("exterior",), size)
        open_rendering(world, ("exterior",), 16)  # reused: 16 is now the most recent
        assert len(fake_rigs.built) == 4 and fake_rigs.closed == []
        open_rendering(world, ("exterior",), 32)  # a fifth: the least recently used (20) closes
        assert fake_rigs.built[-1] == ((32, 32), ("exterior",))
        assert fake_rigs.closed == [((20, 20), ("exterior",))]
        open_rendering(world, ("exterior",), 16)  # still kept
        assert len(fake_rigs.built) == 5
        open_rendering(world, ("wrist",), 24)  # another camera set is another rig: 24's exterior closes
        assert fake_rigs.closed[-1] == ((24, 24), ("exterior",))
        assert len(fake_rigs.built) == 6 and len(fake_rigs.closed) == 2
        open_rendering(world, ("exterior",), 24)  # it was closed: built again
        assert fake_rigs.built[-1] == ((24, 24), ("exterior",)) and len(fake_rigs.built) == 7
    finally:
        world.close()
    assert len(fake_rigs.closed) == 7  # close() closes the four still open
    assert world._rigs == {}


def test_a_rig_is_built_for_the_asked_size_and_cameras(fake_rigs) -> None:
    world = SimWorld()
    try:
        (out,) = world.initial_states([WorldInit(seed=1, render=RenderSpec(("wrist", "exterior"), 16, 40))])
        assert fake_rigs.built == [((16, 40), ("wrist", "exterior"))]
        assert out.observation.shape == (1, 3, 16, 40)
        np.testing.assert_array_equal(out.observation, np.zeros((1, 3, 16, 40), np.float32))  # wrist: 0s
        np.testing.assert_array_equal(out.images["exterior"], np.ones((16, 40, 3), np.uint8))
    finally:
        world.close()


@pytest.mark.parametrize(
    "cameras", [("front",), ("exterior", "front"), ()], ids=["unknown", "one-unknown", "none"]
)
def test_unknown_or_no_cameras_fail_the_start_alone(fake_rigs, cameras: tuple[str, ...]) -> None:
    world = SimWorld()
    try:
        bad = open_rendering(world, cameras, 16)
        assert isinstance(bad, ValueError) and str(bad) == "cameras must be among ['exterior', 'wrist']"
        assert fake_rigs.built == []
        good = open_rendering(world, ("wrist",), 16)
        assert isinstance(good, WorldOutput) and set(good.images) == {"wrist"}
    finally:
        world.close()


def test_close_closes_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    world = SimWorld()
    closed = []
    real = world.env.close
    monkeypatch.setattr(world.env, "close", lambda: (closed.append(True), real()))
    world.close()
    assert closed == [True]
