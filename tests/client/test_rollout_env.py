"""The gymnasium wrappers: the env checker passes, and the vector env equals independent envs."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings


@pytest.fixture(scope="module")
def url():
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        yield server.http_url


def test_env_passes_gymnasiums_checker(url: str) -> None:
    env = RolloutEnv(url)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_env_episode_is_seeded_and_truncates(url: str) -> None:
    env = RolloutEnv(url, max_episode_steps=3)
    try:
        obs, _ = env.reset(seed=5)
        assert env.observation_space.contains(obs)
        action = env.action_space.sample()
        ends = [env.step(action)[2:4] for _ in range(3)]
        assert ends[-1] == (False, True) and all(e == (False, False) for e in ends[:-1])
        again, _ = env.reset(seed=5)
        np.testing.assert_array_equal(obs, again)
    finally:
        env.close()


def test_vector_env_matches_independent_envs(url: str) -> None:
    n, steps = 3, 5
    venv = RolloutVectorEnv(n, url, max_episode_steps=4)
    envs = [RolloutEnv(url, max_episode_steps=4) for _ in range(n)]
    try:
        obs, _ = venv.reset(seed=10)
        assert venv.observation_space.contains(obs)
        singles = np.stack([env.reset(seed=10 + i)[0] for i, env in enumerate(envs)])
        np.testing.assert_array_equal(obs, singles)
        rng = np.random.default_rng(0)
        last = obs
        for t in range(steps):
            actions = rng.uniform(-1, 1, size=(n, 8)).astype(np.float32)
            v_obs, v_rew, v_term, v_trunc, _ = venv.step(actions)
            if t == 4:  # sub-envs truncated at t == 3 are reset by this step (next-step autoreset)
                assert not v_rew.any() and not (v_term | v_trunc).any()
                new_targets = ~np.isclose(v_obs[:, 8:], last[:, 8:]).all(axis=1)
                assert new_targets.all()
                continue
            last = v_obs
            outs = [env.step(a) for env, a in zip(envs, actions, strict=True)]
            np.testing.assert_array_equal(v_obs, np.stack([o[0] for o in outs]))
            np.testing.assert_array_equal(v_rew, [o[1] for o in outs])
            np.testing.assert_array_equal(v_trunc, [o[3] for o in outs])
    finally:
        venv.close()
        for env in envs:
            env.close()


@pytest.mark.parametrize("world", ["sim", "learned"])
def test_env_checker_passes_on_the_real_worlds(world: str) -> None:
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world(world), settings))) as server:
        env = RolloutEnv(server.http_url)
        try:
            check_env(env, skip_render_check=True)
            assert env.observation_space.shape == (13,) and env.action_space.shape == (8,)
        finally:
            env.close()


def test_pixel_envs_pass_the_checker_and_batch_like_single_envs() -> None:
    """Training from pixels: a rendering session gives a Dict of state and uint8 camera images."""
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)
    render = {"cameras": ["exterior"], "height": 32, "width": 48}
    with serving(create_app(settings, rollout=RolloutService(load_world("sim"), settings))) as server:
        env = RolloutEnv(server.http_url, render=render)
        venv = RolloutVectorEnv(2, server.http_url, render=render)
        try:
            check_env(env, skip_render_check=True)
            assert env.observation_space["images"]["exterior"].shape == (32, 48, 3)
            obs, _ = env.reset(seed=4)
            v_obs, _ = venv.reset(seed=4)
            assert venv.observation_space.contains(v_obs)
            np.testing.assert_array_equal(v_obs["images"]["exterior"][0], obs["images"]["exterior"])
            action = np.r_[obs["state"][:7], 1.0].astype(np.float32)
            one = env.step(action)[0]
            both = venv.step(np.stack([action, action]))[0]
            assert venv.observation_space.contains(both)
            np.testing.assert_array_equal(both["state"][0], one["state"])
            np.testing.assert_array_equal(both["images"]["exterior"][0], one["images"]["exterior"])
        finally:
            env.close()
            venv.close()
