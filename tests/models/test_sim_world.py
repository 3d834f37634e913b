"""The simulator world: bit-identical to the gymnasium env, functional over exact snapshots."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rollserve.models.sim_world import SimWorld
from rollserve.models.world import WorldInit, WorldOutput, WorldStep
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.expert import ScriptedExpert


@pytest.fixture(scope="module")
def world():
    w = SimWorld()
    yield w
    w.close()


def start(world: SimWorld, seed: int) -> WorldOutput:
    (out,) = world.initial_states([WorldInit(seed=seed)])
    assert isinstance(out, WorldOutput)
    return out


def test_steps_match_the_env_exactly(world: SimWorld) -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=11)
    out = start(world, 11)
    np.testing.assert_array_equal(out.observation, obs["state"])
    expert = ScriptedExpert()
    expert.reset(obs)
    state = out.state
    for _ in range(40):
        action = expert.act(obs)
        obs, reward, terminated, _, info = env.step(action)
        (out,) = world.step_batch([WorldStep(state, action)])
        np.testing.assert_array_equal(out.observation, obs["state"])
        assert (out.reward, out.terminated, out.info) == (reward, terminated, info)
        state = out.state


def test_a_state_can_be_stepped_again_and_sessions_interleave(world: SimWorld) -> None:
    a, b = start(world, 1), start(world, 2)
    act = np.array([0.1, -0.3, 0.0, -2.4, 0.0, 0.8, 0.0, 1.0], dtype=np.float32)
    first_a, first_b, again_a = world.step_batch(
        [WorldStep(a.state, act), WorldStep(b.state, act), WorldStep(a.state, act)]
    )
    np.testing.assert_array_equal(first_a.observation, again_a.observation)
    assert not np.array_equal(first_a.observation, first_b.observation)
    with pytest.raises(ValueError):
        a.state.snapshot.physics[0] = 0.0  # committed physics is read-only


def test_bad_items_fail_alone(world: SimWorld) -> None:
    s = start(world, 3)
    good = np.zeros(8, dtype=np.float32)
    outs = world.step_batch(
        [WorldStep(s.state, good), WorldStep(s.state, np.zeros(5)), WorldStep("not a state", good)]
    )
    assert isinstance(outs[0], WorldOutput)
    assert isinstance(outs[1], ValueError) and isinstance(outs[2], TypeError)
    (refused,) = world.initial_states([WorldInit(state=np.zeros(13))])
    assert isinstance(refused, ValueError)


def test_unseeded_starts_each_draw_from_a_generator_of_their_own(world: SimWorld) -> None:
    # The one env serves every session: an unseeded reset used to go on with the generator of the
    # session it restored last, so a start after stepping A repeated B's layout exactly.
    a, b = world.initial_states([WorldInit(), WorldInit()])
    (stepped,) = world.step_batch([WorldStep(a.state, np.zeros(8, dtype=np.float32))])
    assert isinstance(stepped, WorldOutput)
    (c,) = world.initial_states([WorldInit()])
    assert not np.array_equal(c.observation, b.observation)
    # Independent PCG64 streams, not three points of one stream (which share the increment).
    increments = {out.state.snapshot.rng_state["state"]["inc"] for out in (a, b, c)}
    assert len(increments) == 3


def test_a_snapshot_restored_twice_continues_identically_and_independently(world: SimWorld) -> None:
    s = start(world, 5).state
    saved = copy.deepcopy(s.snapshot.rng_state)
    act = np.array([0.1, -0.3, 0.0, -2.4, 0.0, 0.8, 0.0, 1.0], dtype=np.float32)
    other = start(world, 6).state
    first, _, second = world.step_batch([WorldStep(s, act), WorldStep(other, act), WorldStep(s, act)])
    np.testing.assert_array_equal(first.observation, second.observation)
    np.testing.assert_array_equal(first.state.snapshot.physics, second.state.snapshot.physics)
    assert first.state.snapshot.rng_state == second.state.snapshot.rng_state == saved
    assert s.snapshot.rng_state == saved  # restoring and stepping never touched the committed state
    # Each restore gets its own copy of the generator: the draws after one restore are the draws
    # after the next, whatever was drawn in between.
    env = TabletopPickPlaceEnv()
    env.set_snapshot(s.snapshot)
    draws = env.np_random.random(4)
    env.set_snapshot(s.snapshot)
    np.testing.assert_array_equal(env.np_random.random(4), draws)
    assert s.snapshot.rng_state == saved
    env.close()
