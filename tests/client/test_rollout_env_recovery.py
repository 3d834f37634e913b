"""The gymnasium wrappers recover from what a long run meets, over a real server.

- A session that idled past the server's TTL (the service's clock is moved, nothing sleeps), or was
  closed, is replaced at the next reset: ``RolloutEnv`` and ``RolloutVectorEnv`` reset again.
- A ``batch_step`` in which one item fails raises its error, but every sub-env whose item committed
  advances, and the episode ends it recorded are reported by the next ``step``, so the next ``step``
  works and the client's step ids stay one past the server's ``committed_step_id``.
- Seeds follow gymnasium's ``SyncVectorEnv``: sub-env ``i`` keeps its own generator, so a seeded
  vector env, given an int or a list, reproduces across autoresets and equals independent
  ``RolloutEnv`` s reset with the same seeds (``Env.reset()`` draws from the env's own generator).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from manual_clock import Clock

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.models.world import WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

TTL_S = 60.0


def serve(world: Any, clock: Clock | None = None) -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=TTL_S)
    service = RolloutService(world, settings, **({"clock": clock} if clock else {}))
    with serving(create_app(settings, rollout=service)) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def url(clock: Clock) -> Iterator[str]:
    yield from serve(ToyWorld(), clock)


def first_observation(url: str, seed: int) -> np.ndarray:
    """What a fresh session from ``seed`` starts with (a session of its own)."""
    with RolloutClient(url) as client:
        sid, obs = client.create_session("toy", seed=seed)
        client.close_session(sid)
    return obs


def test_an_env_whose_session_expired_or_closed_resets_again(url: str, clock: Clock) -> None:
    env = RolloutEnv(url)
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        old = env.session_id
        clock.now += TTL_S + 1  # idle past the TTL (a long policy update)
        obs, _ = env.reset(seed=1)
        np.testing.assert_array_equal(obs, first_observation(url, 1))
        assert env.session_id != old
        assert env.client.status(old)["closed_reason"] == "expired"  # type: ignore[arg-type]
        assert env.step(np.zeros(8, np.float32))[0].shape == (15,)
        assert env.client.status(env.session_id)["committed_step_id"] == 0  # type: ignore[arg-type]
        env.client.close_session(env.session_id)  # type: ignore[arg-type]
        obs, _ = env.reset(seed=2)
        np.testing.assert_array_equal(obs, first_observation(url, 2))
        env.step(np.zeros(8, np.float32))
    finally:
        env.close()


def test_a_vector_env_whose_sessions_expired_resets_again(url: str, clock: Clock) -> None:
    venv = RolloutVectorEnv(2, url)
    try:
        venv.reset(seed=0)
        venv.step(np.zeros((2, 8), np.float32))
        clock.now += TTL_S + 1
        obs, _ = venv.reset(seed=3)
        np.testing.assert_array_equal(obs, [first_observation(url, 3), first_observation(url, 4)])
        venv.step(np.zeros((2, 8), np.float32))
        committed = [venv.client.status(s)["committed_step_id"] for s in session_ids(venv)]
        assert committed == [0, 0]
    finally:
        venv.close()


class FailsOneItemOnce(ToyWorld):
    """The toy world, but the middle item of its first batch fails (a transient error of one row)."""

    def __init__(self) -> None:
        self.armed = True

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        outs = super().step_batch(steps)
        if self.armed and len(steps) == 3:
            self.armed = False
            outs[1] = RuntimeError("transient failure of one item")
        return outs


def session_ids(venv: RolloutVectorEnv) -> list[str]:
    return [session.session_id for session in venv._sessions]  # type: ignore[misc]


def test_a_failed_batch_item_leaves_the_vector_env_usable() -> None:
    for url in serve(FailsOneItemOnce()):
        venv = RolloutVectorEnv(3, url, max_episode_steps=1)  # every committed step ends an episode
        try:
            venv.reset(seed=0)
            with pytest.raises(RolloutRequestError) as err:
                venv.step(np.full((3, 8), 0.1, np.float32))
            assert err.value.code == "inference_error" and "one item" in err.value.message
            obs, rewards, terminated, truncated, info = venv.step(np.full((3, 8), 0.2, np.float32))
            # sub-envs 0 and 2 report the episode ends the raised step recorded (applying no action);
            # sub-env 1 retried its step, which ends its one-step episode too
            assert truncated.tolist() == [True, True, True] and not terminated.any()
            assert info["_reported_late"].tolist() == [True, False, True]
            start = first_observation(url, 1)  # sub-env 1's seed is 0 + 1
            moved = start[:8] + 0.5 * (0.2 - start[:8])  # the toy's rule, with the retry's action
            np.testing.assert_allclose(obs[1, :8], moved, rtol=1e-6)
            assert (rewards < 0).all()
            committed = [venv.client.status(s)["committed_step_id"] for s in session_ids(venv)]
            assert committed == [0, 0, 0]
            assert [s.next_step for s in venv._sessions] == [c + 1 for c in committed]
            venv.step(np.zeros((3, 8), np.float32))  # every sub-env autoresets
            committed = [venv.client.status(s)["committed_step_id"] for s in session_ids(venv)]
            assert committed == [-1, -1, -1]
            venv.step(np.zeros((3, 8), np.float32))  # and on it goes
            committed = [venv.client.status(s)["committed_step_id"] for s in session_ids(venv)]
            assert committed == [0, 0, 0]
            assert [s.next_step for s in venv._sessions] == [c + 1 for c in committed]
        finally:
            venv.close()


def vector_run(url: str, seed: int | list[int], steps: int = 5) -> list[np.ndarray]:
    """Observations of a 2-env vector run with episodes of 2 steps (autoresets at steps 3 and 6)."""
    venv = RolloutVectorEnv(2, url, max_episode_steps=2)
    try:
        out = [venv.reset(seed=seed)[0]]
        out += [venv.step(np.zeros((2, 8), np.float32))[0] for _ in range(steps)]
        return out
    finally:
        venv.close()


def single_run(url: str, seed: int, steps: int = 5) -> list[np.ndarray]:
    """The same run as one ``RolloutEnv``: seeded reset, then unseeded ``reset()`` at each end."""
    env = RolloutEnv(url, max_episode_steps=2)
    try:
        out = [env.reset(seed=seed)[0]]
        done = False
        for _ in range(steps):
            if done:
                out.append(env.reset()[0])
                done = False
                continue
            obs, _, terminated, truncated, _ = env.step(np.zeros(8, np.float32))
            out.append(obs)
            done = terminated or truncated
        return out
    finally:
        env.close()


@pytest.mark.parametrize("seed", [10, [10, 11], [7, 3]])
def test_seeded_vector_runs_reproduce_across_autoresets_like_independent_envs(url: str, seed: Any) -> None:
    first, again = vector_run(url, seed), vector_run(url, seed)
    for t, (a, b) in enumerate(zip(first, again, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}")
    seeds = [seed, seed + 1] if isinstance(seed, int) else seed
    singles = np.stack([single_run(url, s) for s in seeds], axis=1)
    np.testing.assert_array_equal(np.stack(first), singles)


def test_a_seed_list_of_the_wrong_length_is_refused(url: str) -> None:
    venv = RolloutVectorEnv(2, url)
    try:
        with pytest.raises(ValueError, match="num_envs=2"):
            venv.reset(seed=[1, 2, 3])
    finally:
        venv.close()


def test_envs_close_and_reset_cleanly_after_the_server_restarted() -> None:
    """A restarted server knows none of the old sessions: ``close`` has nothing to close (it raised
    ``session_not_found``), and ``reset`` opens a new session on the new server."""
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as first:
        port, url = first.port, first.http_url
        closing, resetting, venv = RolloutEnv(url), RolloutEnv(url), RolloutVectorEnv(2, url)
        for env in (closing, resetting, venv):
            env.reset(seed=0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings)), port=port):
        with pytest.raises(RolloutRequestError) as gone:
            closing.client.status(closing.session_id)  # type: ignore[arg-type]
        assert gone.value.code == "session_not_found"  # the new server never heard of it
        closing.close()
        venv.close()
        obs, _ = resetting.reset(seed=1)
        np.testing.assert_array_equal(obs, first_observation(url, 1))
        resetting.close()
