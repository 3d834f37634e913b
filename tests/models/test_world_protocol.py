"""The WorldModel protocol, the engine's batch runner, the toy world and ``load_world``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from rollserve.models.world import (
    FromStart,
    WorldCall,
    WorldInit,
    WorldModel,
    WorldOutput,
    WorldStep,
    run_world_calls,
)
from rollserve.models.worlds import ToyWorld, load_world

ACTION = np.array([0.3] * 7 + [1.0], dtype=np.float32)


def start(world: ToyWorld, seed: int) -> WorldOutput:
    (out,) = world.initial_states([WorldInit(seed=seed)])
    assert isinstance(out, WorldOutput)
    return out


def test_toy_world_is_a_functional_world_model() -> None:
    world = ToyWorld()
    assert isinstance(world, WorldModel)
    s0 = start(world, 1)
    before = np.array(s0.state)
    a, b = world.step_batch([WorldStep(s0.state, ACTION), WorldStep(s0.state, ACTION)])
    np.testing.assert_array_equal(a.observation, b.observation)  # same state, same action, same result
    np.testing.assert_array_equal(s0.state, before)  # the input state was not touched
    with pytest.raises(ValueError):
        s0.state[0] = 1.0  # states are read-only
    np.testing.assert_allclose(a.observation[:7], before[:7] + 0.5 * (0.3 - before[:7]), rtol=1e-6)


def test_seeded_starts_are_reproducible_and_a_start_state_can_be_given() -> None:
    world = ToyWorld()
    np.testing.assert_array_equal(start(world, 4).observation, start(world, 4).observation)
    assert not np.array_equal(start(world, 4).observation, start(world, 5).observation)
    given = np.linspace(-0.5, 0.5, 15, dtype=np.float32)
    (out,) = world.initial_states([WorldInit(state=given)])
    np.testing.assert_array_equal(out.observation, given)


def test_run_world_calls_batches_inits_and_steps_and_keeps_errors_per_item() -> None:
    calls: list[tuple[str, int]] = []

    class Counting(ToyWorld):
        def initial_states(self, inits):
            calls.append(("init", len(inits)))
            return super().initial_states(inits)

        def step_batch(self, steps):
            calls.append(("step", len(steps)))
            return super().step_batch(steps)

    world = Counting()
    root = start(world, 0).state
    calls.clear()
    outs = run_world_calls(
        world,
        [
            WorldCall(init=WorldInit(seed=1)),  # start only
            WorldCall(step=WorldStep(root, ACTION)),  # step only
            WorldCall(init=WorldInit(seed=2), step=WorldStep(None, ACTION)),  # fresh context, then step
            WorldCall(init=WorldInit(state=np.zeros(3)), step=WorldStep(None, ACTION)),  # bad start
        ],
    )
    assert calls == [("init", 3), ("step", 2)]
    assert isinstance(outs[3], ValueError)
    np.testing.assert_array_equal(outs[0].observation, start(world, 1).observation)
    expected = world.step_batch([WorldStep(start(world, 2).state, ACTION)])[0]
    np.testing.assert_array_equal(outs[2].observation, expected.observation)


def test_run_world_calls_keeps_the_start_of_a_step_from_a_fresh_context_when_asked() -> None:
    """The rollout service commits that start as the episode's root (``keep_starts``)."""
    world = ToyWorld()
    root = start(world, 0).state
    calls = [
        WorldCall(init=WorldInit(seed=1)),  # a start alone: its output, as without keep_starts
        WorldCall(step=WorldStep(root, ACTION)),  # a step from a kept state: its output
        WorldCall(init=WorldInit(seed=2), step=WorldStep(None, ACTION)),  # fresh, then step
    ]
    plain, kept = run_world_calls(world, calls), run_world_calls(world, calls, keep_starts=True)
    for i in (0, 1):
        assert isinstance(kept[i], WorldOutput)
        np.testing.assert_array_equal(kept[i].observation, plain[i].observation)
    assert isinstance(kept[2], FromStart) and not isinstance(plain[2], FromStart)
    np.testing.assert_array_equal(kept[2].out.observation, plain[2].observation)
    np.testing.assert_array_equal(kept[2].start, start(world, 2).state)


def test_toy_world_terminates_at_the_goal() -> None:
    world = ToyWorld()
    s = start(world, 3)
    goal = np.append(s.observation[8:15], 0.0).astype(np.float32)
    for _ in range(20):
        (s,) = world.step_batch([WorldStep(s.state, goal)])
        if s.terminated:
            break
    assert s.terminated and s.reward > -ToyWorld.success_radius


def test_load_world_specs() -> None:
    assert isinstance(load_world("toy"), ToyWorld)
    assert isinstance(load_world("rollserve.models.worlds:ToyWorld"), ToyWorld)
    with pytest.raises(ValueError, match="unknown world"):
        load_world("nonsense")
    with pytest.raises(TypeError, match="not a WorldModel"):
        load_world("builtins:dict")


def test_describe_is_an_openai_style_model_entry() -> None:
    entry = ToyWorld.spec.describe()
    assert {"id", "object", "kind", "observation", "action"} <= entry.keys()
    assert entry["action"]["fields"] == {"joint_positions": 7, "gripper_position": 1}


class _Recording(ToyWorld):
    """The toy world, keeping the inputs of every step it was asked to make."""

    def __init__(self) -> None:
        self.inputs: list[object] = []

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        self.inputs += [step.inputs for step in steps]
        return super().step_batch(steps)


class _Short(ToyWorld):
    """A broken world: one answer, however many steps it was given."""

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        return super().step_batch(steps)[:1]


def test_a_step_from_a_fresh_context_keeps_its_inputs() -> None:
    """The first step of a fresh context is made from the new start, with the request's own inputs
    (a world-action world's policy reads its prompt and images there)."""
    world = _Recording()
    calls = [WorldCall(init=WorldInit(seed=3), step=WorldStep(None, ACTION, {"prompt": "stack the cube"}))]
    (out,) = run_world_calls(world, calls)
    assert isinstance(out, WorldOutput)
    assert world.inputs == [{"prompt": "stack the cube"}]


def test_a_world_answering_the_wrong_number_of_items_fails_the_batch_with_a_clear_error() -> None:
    step = WorldStep(start(ToyWorld(), 1).state, ACTION)
    with pytest.raises(RuntimeError) as raised:
        run_world_calls(_Short(), [WorldCall(step=step), WorldCall(step=step)])
    assert str(raised.value) == "world returned 1 results for 2 items"


def test_a_call_with_nothing_to_do_is_answered_with_an_error() -> None:
    (out,) = run_world_calls(ToyWorld(), [WorldCall()])
    assert isinstance(out, RuntimeError) and str(out) == "world call did nothing"


def test_describe_publishes_the_frame_size_of_a_world_with_cameras() -> None:
    fixed = dataclasses.replace(ToyWorld.spec, cameras=("front",), frame_size=(48, 64)).describe()
    assert fixed["cameras"] == ["front"] and fixed["frame_size"] == [48, 64]
    assert dataclasses.replace(ToyWorld.spec, cameras=("front",)).describe()["frame_size"] is None
    assert "frame_size" not in ToyWorld.spec.describe()  # no cameras, no frames


def test_bounds_of_a_shaped_observation_are_published_as_floats_in_its_shape() -> None:
    """Bounds written as integers still go out as the float values of a float32 box."""
    spec = dataclasses.replace(
        ToyWorld.spec, observation_shape=(3, 5), observation_low=(-2,) * 15, observation_high=(2,) * 15
    )
    observation = spec.describe()["observation"]
    assert observation["low"] == [[-2.0] * 5] * 3 and observation["high"] == [[2.0] * 5] * 3
    assert {type(v) for row in observation["low"] + observation["high"] for v in row} == {float}


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        ((-1.0,) * 8, None, "action_low and action_high go together"),
        (None, (1.0,) * 8, "action_low and action_high go together"),
        ((-1.0,), (1.0,), "action bounds need 8 values each"),
    ],
)
def test_action_bounds_come_in_pairs_that_fit_the_action(
    low: tuple[float, ...] | None, high: tuple[float, ...] | None, message: str
) -> None:
    """As the observation's and the state's: one bound alone would publish no box at all, and a
    short one would be broadcast over every action value."""
    with pytest.raises(ValueError, match=f"toy: {message}"):
        dataclasses.replace(ToyWorld.spec, action_low=low, action_high=high)
