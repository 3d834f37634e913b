"""The simulator world: bit-identical to the gymnasium env, functional over exact snapshots."""

from __future__ import annotations

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
