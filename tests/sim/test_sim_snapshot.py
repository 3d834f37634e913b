"""Snapshot/restore: the same actions after a restore give bit-identical results (exactly-once, fork)."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.expert import ScriptedExpert
from rollserve.sim.snapshot import EnvSnapshot


def _run(env: TabletopPickPlaceEnv, actions: list[np.ndarray]) -> list[tuple]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs["state"].tobytes(), reward, terminated, truncated, info))
    return out


@pytest.fixture(scope="module")
def mid_episode() -> tuple[TabletopPickPlaceEnv, EnvSnapshot, list[np.ndarray]]:
    """An env 25 steps into an expert episode (cube grasped or nearly), and the next 25 actions."""
    env, expert = TabletopPickPlaceEnv(terminate_on_success=False), ScriptedExpert()
    obs, _ = env.reset(seed=11)
    expert.reset(obs)
    for _ in range(25):
        obs, *_ = env.step(expert.act(obs))
    snapshot = env.get_snapshot()
    actions = []
    for _ in range(25):
        actions.append(expert.act(obs))
        obs, *_ = env.step(actions[-1])
    return env, snapshot, actions


def test_restore_replays_bit_identically(mid_episode) -> None:
    env, snapshot, actions = mid_episode
    env.set_snapshot(snapshot)
    first = _run(env, actions)
    env.set_snapshot(snapshot)
    assert _run(env, actions) == first


def test_restore_through_bytes_into_another_env(mid_episode) -> None:
    env, snapshot, actions = mid_episode
    env.set_snapshot(snapshot)
    expected = _run(env, actions)
    fork = TabletopPickPlaceEnv(terminate_on_success=False)
    fork.set_snapshot(snapshot.to_bytes())
    assert fork.step_count == snapshot.step_count
    assert _run(fork, actions) == expected


def test_snapshot_covers_step_count_and_rng(mid_episode) -> None:
    env, snapshot, _ = mid_episode
    env.set_snapshot(snapshot)
    after_restore = env.np_random.random()
    env.set_snapshot(snapshot)
    assert env.np_random.random() == after_restore
    assert env.step_count == 25


def test_bytes_round_trip_is_exact(mid_episode) -> None:
    _, snapshot, _ = mid_episode
    back = EnvSnapshot.from_bytes(snapshot.to_bytes())
    assert back.physics.tobytes() == snapshot.physics.tobytes()
    assert back.rng_state == snapshot.rng_state and back.step_count == snapshot.step_count
    with pytest.raises(ValueError):
        EnvSnapshot.from_bytes(b"garbage")


def test_snapshot_of_wrong_size_is_refused() -> None:
    env = TabletopPickPlaceEnv()
    with pytest.raises(ValueError):
        env.set_snapshot(EnvSnapshot(physics=np.zeros(3), step_count=0, rng_state={}))
