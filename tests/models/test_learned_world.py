"""The learned world: the shipped checkpoint loads, starts like the simulator, steps deterministically
in batches, stays close to the simulator over a short horizon; and `rollserve train world` runs."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from rollserve.models.learned_world import LearnedState, default_checkpoint_dir, load_default
from rollserve.models.world import WorldInit, WorldOutput, WorldStep
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.training import world_model as training


@pytest.fixture(scope="module")
def world():
    torch.set_num_threads(1)
    return load_default()


def test_starts_exactly_like_the_simulator(world) -> None:
    env = TabletopPickPlaceEnv()
    for seed in (0, 7, 123456):
        (out,) = world.initial_states([WorldInit(seed=seed)])
        np.testing.assert_array_equal(out.observation, env.reset(seed=seed)[0]["state"])


def test_batched_steps_equal_single_steps_and_are_deterministic(world) -> None:
    starts = world.initial_states([WorldInit(seed=s) for s in range(4)])
    rng = np.random.default_rng(0)
    actions = [np.append(o.observation[:7] + rng.normal(0, 0.05, 7), 0.0).astype(np.float32) for o in starts]
    batch = world.step_batch([WorldStep(o.state, a) for o, a in zip(starts, actions, strict=True)])
    for o, a, b in zip(starts, actions, batch, strict=True):
        (single,) = world.step_batch([WorldStep(o.state, a)])
        np.testing.assert_allclose(single.observation, b.observation, atol=1e-6)
        assert isinstance(b, WorldOutput) and b.uncertainty is not None and b.uncertainty >= 0
        assert isinstance(b.state, LearnedState)
    (again,) = world.step_batch([WorldStep(starts[0].state, actions[0])])
    np.testing.assert_array_equal(
        again.observation, world.step_batch([WorldStep(starts[0].state, actions[0])])[0].observation
    )


def test_observations_stay_inside_the_published_bounds_far_from_the_data(world) -> None:
    """Actions alternating between the action space's corners drive the ensemble far from its
    training data (the cube's y left +-4 before predictions were clamped); every observation must
    still be finite and inside the bounds the world publishes as its observation space."""
    spec = world.spec
    low, high = (np.asarray(b, dtype=np.float32) for b in (spec.observation_low, spec.observation_high))
    corners = [np.asarray(b, dtype=np.float32) for b in (spec.action_low, spec.action_high)]
    (out,) = world.initial_states([WorldInit(seed=0)])
    reached = 0.0
    for t in range(spec.max_episode_steps):
        (out,) = world.step_batch([WorldStep(out.state, corners[t % 2])])
        obs = np.asarray(out.observation)
        assert np.all(np.isfinite(obs)) and np.all((low <= obs) & (obs <= high)), f"step {t}: {obs}"
        np.testing.assert_array_equal(out.state.observation, obs)  # the next step starts from it
        reached = max(reached, float(np.max(obs - high)), float(np.max(low - obs)))
    assert reached == 0.0  # the rollout did reach a bound: the check above was not vacuous


def test_short_horizon_error_against_the_simulator_is_small(world) -> None:
    episodes = training.collect(3, seed=4242, noise_levels=(0.02,), steps=20)
    report = training.horizon_errors(world, episodes)["horizon_steps"]
    assert report["10"]["joint_rmse_rad"] < 0.01
    assert report["10"]["cube_pos_err_m"] < 0.01
    assert report["20"]["success_agreement"] == 1.0


def test_the_shipped_checkpoint_records_its_evaluation() -> None:
    config = json.loads((default_checkpoint_dir() / "config.json").read_text())
    horizons = config["training"]["evaluation"]["horizon_steps"]
    assert {"1", "10", "40", "80"} <= horizons.keys()
    assert horizons["40"]["cube_pos_err_m"] < 0.05


def test_training_command_writes_a_loadable_checkpoint(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    training.add_arguments(parser)
    tiny = "--episodes 2 --eval-episodes 1 --steps 12 --iterations 20 --unroll 3 --unroll-iterations 5"
    args = parser.parse_args([*tiny.split(), "--hidden", "16", "--ensemble", "2", "--out", str(tmp_path)])
    assert training.main(args) == 0
    trained = load_default(tmp_path)
    (out,) = trained.initial_states([WorldInit(seed=0)])
    (nxt,) = trained.step_batch([WorldStep(out.state, np.zeros(8, dtype=np.float32))])
    assert np.all(np.isfinite(nxt.observation))
    assert json.loads((tmp_path / "config.json").read_text())["training"]["episodes"] == 2
