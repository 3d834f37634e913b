"""The learned state world's rules that its first mutation run (`learned_world` in tools/mutation.py)
found unchecked: the task's success and reward rule row by row (at its edges, and against the
simulator's own rule), the action box clipping every step, what each step's output says (end,
info, reward), a start state's checks, the checkpoint's task checks, the config's JSON round trip,
the fresh ensemble's initialisation and the spec a world publishes from its config.

The shipped checkpoint is loaded through the loading code users run (``load_default``); the
worlds built from a config here are untrained (their numbers are not the point, their rules are).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from rollserve.models.learned_world import (
    EnsembleMLP,
    LearnedState,
    LearnedWorld,
    LearnedWorldConfig,
    TaskRule,
    WorldNet,
    check_task_config,
    load_default,
)
from rollserve.models.world import WorldInit, WorldStep
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.task import CUBE_REST_Z, TaskConfig

# a rule whose numbers are exact in binary, so each edge below is met exactly
RULE = TaskRule(success_radius=0.25, rest_tolerance=0.125, cube_rest_z=0.5, success_bonus=10.0)


def _state(cube: tuple[float, float, float], target: tuple[float, float]) -> list[float]:
    """A 13-value state: 7 joints, the gripper, the cube's x, y, z, the target's x, y."""
    return [0.1] * 7 + [0.0, *cube, *target]


def test_the_task_rule_row_by_row_at_its_edges() -> None:
    states = np.array(
        [
            _state((0.5, 0.0, 0.5), (0.5, 0.0)),  # on the target, resting: success
            _state((0.5, 0.0, 0.75), (0.5, 0.0)),  # over the target, lifted
            _state((0.5, 0.0, 0.5), (0.75, 0.0)),  # exactly the radius away in x: not near
            _state((0.5, 0.0, 0.5), (0.5, -0.25)),  # exactly the radius away in y: not near
            _state((0.5, 0.0, 0.625), (0.5, 0.0)),  # exactly the tolerance above rest: not resting
            _state((0.5, 0.0, 0.5), (0.6875, 0.25)),  # 3-4-5: 0.3125 away
            _state((0.5, 0.25, 0.5), (0.5, 0.125)),  # 0.125 away in y, inside the radius: success
        ],
        dtype=np.float32,
    )
    success = RULE.success(states)
    assert success.tolist() == [True, False, False, False, False, False, True]
    reward = RULE.reward(states, success)
    assert reward.tolist() == pytest.approx([10.0, 0.0, -0.25, -0.25, 0.0, -0.3125, 10.0 - 0.125], abs=1e-7)


def test_the_shipped_worlds_rule_is_the_simulators() -> None:
    """The checkpoint's rule against the simulator's own (``TaskConfig``), on states around the
    target: the same success and the same reward, row by row."""
    rule = load_default().config.rule
    assert isinstance(rule, TaskRule)
    task = TaskConfig()
    rng = np.random.default_rng(0)
    target = rng.uniform([0.45, -0.2], [0.6, -0.05], size=(400, 2))
    cube_xy = target + rng.uniform(-0.06, 0.06, size=(400, 2))
    cube_z = CUBE_REST_Z + rng.uniform(-0.005, 0.02, size=400)
    states = np.zeros((400, 13), np.float32)
    states[:, 8:10], states[:, 10], states[:, 11:13] = cube_xy, cube_z, target
    success = rule.success(states)
    reward = rule.reward(states, success)
    for i, row in enumerate(states.astype(np.float64)):
        expected = task.is_success(row[8:11], row[11:13])
        assert bool(success[i]) == expected, row
        assert reward[i] == pytest.approx(task.reward(row[8:11], row[11:13], expected), abs=1e-6)
    assert 50 < success.sum() < 350  # both kinds of rows were there


@pytest.fixture(scope="module")
def shipped() -> LearnedWorld:
    torch.set_num_threads(1)
    return load_default()


def test_each_step_of_a_freshly_loaded_world_clips_the_action_into_its_box() -> None:
    """Its own world, not the module's: what the constructor sets up (the box) is checked by the
    tests that build it (see docs/testing.md on mutmut and shared fixtures)."""
    shipped = load_default()
    spec = shipped.spec
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    (start,) = shipped.initial_states([WorldInit(seed=1)])
    below, above = low - 0.5, high + 0.5
    outs = shipped.step_batch([WorldStep(start.state, below), WorldStep(start.state, above)])
    clipped = shipped.step_batch([WorldStep(start.state, low), WorldStep(start.state, high)])
    for out, same in zip(outs, clipped, strict=True):
        np.testing.assert_array_equal(out.observation, same.observation)
    obs, change = start.state.observation[None].copy(), start.state.change[None].copy()
    unclipped, _ = shipped.predict(obs, change, below[None])
    assert not np.allclose(unclipped[0], outs[0].observation)  # the box made a difference


def test_a_steps_output_says_whether_it_ended_and_its_reward_by_the_task_rule(shipped: LearnedWorld) -> None:
    task = TaskConfig()
    placed = np.array(_state((0.55, -0.1, CUBE_REST_Z), (0.55, -0.1)), np.float64)
    placed[:7] = shipped.config.start.home_qpos  # type: ignore[union-attr]
    away = placed.copy()
    away[8:10] = (0.5, 0.15)  # the cube at its start, far from the target
    starts = shipped.initial_states([WorldInit(state=placed), WorldInit(state=away)])
    hold = [np.append(s.observation[:7], 0.0).astype(np.float32) for s in starts]  # keep the arm still
    outs = shipped.step_batch([WorldStep(s.state, a) for s, a in zip(starts, hold, strict=True)])
    ended = []
    for out in outs:
        obs = np.asarray(out.observation, np.float64)
        expected = task.is_success(obs[8:11], obs[11:13])
        assert out.terminated is expected and out.info == {"success": expected}
        assert out.reward == pytest.approx(task.reward(obs[8:11], obs[11:13], expected), abs=1e-5)
        ended.append(expected)
    assert ended == [True, False]


def test_a_start_state_must_have_13_finite_values_and_starts_as_float32(shipped: LearnedWorld) -> None:
    good = np.linspace(-1.0, 1.0, 13)
    (out,) = shipped.initial_states([WorldInit(state=good)])
    assert out.observation.dtype == np.float32 and out.state.change.tolist() == [0.0] * 13
    np.testing.assert_array_equal(out.observation, good.astype(np.float32))
    np.testing.assert_array_equal(  # a nested list is read flat, as the client sent it
        shipped.initial_states([WorldInit(state=good.reshape(13, 1))])[0].observation, good.astype(np.float32)
    )
    for bad in (good[:12], np.append(good, 0.0), np.where(np.arange(13) == 4, np.nan, good)):
        (refused,) = shipped.initial_states([WorldInit(state=bad)])
        assert isinstance(refused, ValueError) and str(refused) == "a start state has 13 finite values"
    outside = good.copy()
    outside[2] = 4.5
    (refused,) = shipped.initial_states([WorldInit(state=outside)])
    assert isinstance(refused, ValueError) and "index 2" in str(refused)


def test_a_learned_state_is_float32_and_read_only() -> None:
    state = LearnedState.of([0.5, 1.5], [0.25, -0.25])  # float64 lists
    for array in (state.observation, state.change):
        assert array.dtype == np.float32 and not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 1.0


def test_stepping_a_foreign_state_names_its_type(shipped: LearnedWorld) -> None:
    with pytest.raises(TypeError, match=r"^not a learned-world state: dict$"):
        shipped.step_batch([WorldStep({"observation": [0.0] * 13}, np.zeros(8, np.float32))])


def _config(**changes: object) -> LearnedWorldConfig:
    return dataclasses.replace(load_default().config, **changes)


def test_the_checkpoints_task_checks_name_what_is_missing() -> None:
    for missing in ({"start": None}, {"rule": None}, {"start": None, "rule": None}):
        with pytest.raises(ValueError, match=r"^checkpoint lacks the task's start distribution or rule$"):
            check_task_config(_config(**missing))


def test_a_config_survives_a_json_round_trip_as_it_was() -> None:
    config = load_default().config
    again = LearnedWorldConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and hash(again.start) == hash(config.start)


def test_a_fresh_ensembles_weights_are_uniform_within_one_over_root_fan_in() -> None:
    torch.manual_seed(0)
    mlp = EnsembleMLP(ensemble=3, inputs=64, outputs=16, hidden=256, depth=2)
    for param, fan_in in zip(mlp.weights, (64, 256, 256), strict=True):
        weight = param.detach()
        bound = 1.0 / math.sqrt(fan_in)
        assert float(weight.min()) >= -bound and float(weight.max()) <= bound
        assert float(weight.min()) < -0.9 * bound and float(weight.max()) > 0.9 * bound
    assert all(float(b.detach().abs().max()) == 0.0 for b in mlp.biases)


def test_a_world_publishes_its_configs_names_rate_length_and_bounds() -> None:
    names = tuple(f"a{i}" for i in range(8))
    config = _config(
        action_names=names, control_hz=12.5, max_episode_steps=77, ensemble=3, hidden=32, depth=1
    )
    spec = LearnedWorld(WorldNet(config), name="mine").spec
    assert (spec.name, spec.action_names, spec.fps, spec.max_episode_steps) == ("mine", names, 12.5, 77)
    assert spec.description == "learned world model of the tabletop task (3-member MLP ensemble)"
    assert spec.observation_low == (-4.0,) * 13 and spec.observation_high == (4.0,) * 13
    assert spec.action_low == config.action_low and spec.action_high == config.action_high


def test_the_start_distribution_draws_what_the_simulators_reset_shows() -> None:
    start = load_default().config.start
    assert start is not None
    env = TabletopPickPlaceEnv()
    try:
        for seed in (0, 5, 99):
            drawn, shown = start.sample(seed), env.reset(seed=seed)[0]["state"]
            assert drawn.dtype == shown.dtype == np.float32
            np.testing.assert_array_equal(drawn, shown)
    finally:
        env.close()


def test_a_world_without_an_action_box_steps_any_action_as_it_is() -> None:
    torch.manual_seed(0)
    world = LearnedWorld(WorldNet(_config(action_low=(), action_high=(), ensemble=2, hidden=16, depth=1)))
    assert world.spec.action_low is None and world.spec.action_high is None
    (start,) = world.initial_states([WorldInit(seed=2)])
    far = np.full(8, 3.0, np.float32)
    (out,) = world.step_batch([WorldStep(start.state, far)])
    obs, change = start.state.observation[None].copy(), start.state.change[None].copy()
    expected, _ = world.predict(obs, change, far[None])
    np.testing.assert_array_equal(out.observation, expected[0])
