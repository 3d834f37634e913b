"""A session the server no longer holds (closed, or idle past its TTL during a long policy update)
ends its episode as truncated, and the env replaces it on its own: a ``RolloutVectorEnv`` sub-env
autoresets onto a new session on the next ``step`` (a trainer with next-step autoreset never calls
``reset``), the other sub-envs keep their results; a ``RolloutEnv`` returns ``truncated=True`` so
the trainer resets. The step on the lost session is not retried. Real server, the toy world.

Expiry moves the service's idle clock (injected, as ``test_rollout_env_recovery.py`` does), so
nothing waits for the TTL; closing goes through the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from manual_clock import Clock
from toy_rule import moved

from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

TTL_S = 60.0


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def url(clock: Clock) -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=TTL_S)
    service = RolloutService(ToyWorld(), settings, clock=clock)
    with serving(create_app(settings, rollout=service)) as server:
        yield server.http_url


def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float32 rounding (the server computes in float32, the test too, in another order)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def action(value: float) -> np.ndarray:
    return np.full(8, value, dtype=np.float32)


def committed(env: RolloutEnv | RolloutVectorEnv, session_id: str) -> int:
    return env.client.status(session_id)["committed_step_id"]


def session_ids(venv: RolloutVectorEnv) -> list[str]:
    return [s.session_id for s in venv._sessions]  # type: ignore[misc]


def test_a_closed_sub_env_is_truncated_then_autoresets_onto_a_new_session(url: str) -> None:
    venv = RolloutVectorEnv(3, url)
    try:
        venv.reset(seed=0)
        before, *_ = venv.step(np.stack([action(0.1)] * 3))
        old = session_ids(venv)
        venv.client.close_session(old[1])  # gone, as after a close by another process
        obs, rewards, terminated, truncated, info = venv.step(np.stack([action(0.2)] * 3))
        assert truncated.tolist() == [False, True, False] and not terminated.any()
        np.testing.assert_array_equal(obs[1], before[1])  # its last observation, reward 0
        assert rewards[1] == 0.0
        for i in (0, 2):  # the others stepped
            assert_near(obs[i], moved(before[i], action(0.2)))
        assert info["session_lost"].tolist() == [None, "session_closed", None]
        assert info["_session_lost"].tolist() == [False, True, False]
        assert [committed(venv, s) for s in old] == [1, 0, 1]  # the lost step was not retried
        obs, _, terminated, truncated, info = venv.step(np.stack([action(0.3)] * 3))  # autoreset
        new = session_ids(venv)
        assert new[1] != old[1] and new[0::2] == old[0::2]
        assert not (terminated | truncated).any() and info == {}
        np.testing.assert_array_equal(obs[1], next_episode_start(url, seed=1))
        assert [committed(venv, s) for s in new] == [2, -1, 2]
        venv.step(np.stack([action(0.4)] * 3))
        assert [committed(venv, s) for s in new] == [3, 0, 3]
    finally:
        venv.close()


def next_episode_start(url: str, seed: int) -> np.ndarray:
    """The start of a ``RolloutEnv``'s second episode after ``reset(seed=seed)``: an autoreset of
    sub-env ``i`` seeded ``seed`` draws the same (the docs' promise, ``SyncVectorEnv``'s rule)."""
    env = RolloutEnv(url)
    try:
        env.reset(seed=seed)
        return env.reset()[0]
    finally:
        env.close()


def test_expired_sub_envs_are_truncated_then_autoreset(url: str, clock: Clock) -> None:
    venv = RolloutVectorEnv(2, url)
    try:
        venv.reset(seed=5)
        before, *_ = venv.step(np.stack([action(0.1)] * 2))
        old = session_ids(venv)
        clock.now += TTL_S + 1  # idle past the TTL (a long policy update)
        obs, rewards, terminated, truncated, info = venv.step(np.stack([action(0.2)] * 2))
        assert truncated.tolist() == [True, True] and not terminated.any() and not rewards.any()
        np.testing.assert_array_equal(obs, before)
        assert info["session_lost"].tolist() == ["session_expired"] * 2
        assert [venv.client.status(s)["closed_reason"] for s in old] == ["expired"] * 2
        obs, _, terminated, truncated, _ = venv.step(np.stack([action(0.3)] * 2))
        new = session_ids(venv)
        assert not set(new) & set(old) and not (terminated | truncated).any()
        np.testing.assert_array_equal(obs[0], next_episode_start(url, seed=5))
        venv.step(np.stack([action(0.4)] * 2))
        assert [committed(venv, s) for s in new] == [0, 0]
    finally:
        venv.close()


def close_it(env: RolloutEnv, clock: Clock) -> None:
    env.client.close_session(env.session_id)  # type: ignore[arg-type]


def expire_it(env: RolloutEnv, clock: Clock) -> None:
    clock.now += TTL_S + 1


LOSSES = [(close_it, "session_closed"), (expire_it, "session_expired")]


@pytest.mark.parametrize(("lose", "code"), LOSSES, ids=["closed", "expired"])
def test_a_single_env_whose_session_is_gone_truncates_and_resets_onto_a_new_one(
    url: str, clock: Clock, lose: Callable[[RolloutEnv, Clock], None], code: str
) -> None:
    env = RolloutEnv(url)
    try:
        env.reset(seed=7)
        before, *_ = env.step(action(0.1))
        old = env.session_id
        lose(env, clock)
        obs, reward, terminated, truncated, info = env.step(action(0.2))
        np.testing.assert_array_equal(obs, before)
        assert (reward, terminated, truncated, info) == (0.0, False, True, {"session_lost": code})
        assert committed(env, old) == 0  # type: ignore[arg-type]
        start, _ = env.reset(seed=8)
        assert env.session_id != old
        obs, *_ = env.step(action(0.3))
        assert_near(obs, moved(start, action(0.3)))
        assert committed(env, env.session_id) == 0  # type: ignore[arg-type]
    finally:
        env.close()
