"""The WorldModel protocol, the engine's batch runner, the toy world and ``load_world``."""

from __future__ import annotations

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
