"""The gymnasium env: API conformance, seeding, spaces, images, and the success rule."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rollserve.sim import ACTION_NAMES, CAMERA_NAMES, ENV_ID, STATE_DIM, STATE_NAMES
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.task import CUBE_REST_Z


def _quiet_check(env: gymnasium.Env, **kwargs: object) -> None:
    with warnings.catch_warnings():
        # Advisory only: joint-target actions are not [-1, 1] and the cube can fall off the table.
        warnings.filterwarnings(
            "ignore", message=".*(symmetric and normalized|infinity|alternative render modes).*"
        )
        check_env(env, **kwargs)


def test_env_checker_passes_state_only() -> None:
    _quiet_check(TabletopPickPlaceEnv(), skip_render_check=True)


def test_env_checker_passes_with_images_and_render() -> None:
    _quiet_check(TabletopPickPlaceEnv(render_images=True, image_size=(32, 32), render_mode="rgb_array"))


def test_registered_id_makes_the_env() -> None:
    env = gymnasium.make(ENV_ID)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (STATE_DIM,)
    env.close()


def test_layout_names_match_spaces() -> None:
    env = TabletopPickPlaceEnv()
    assert env.action_space.shape == (len(ACTION_NAMES),)
    assert env.observation_space["state"].shape == (len(STATE_NAMES),)
    assert env.action_space.low[-1] == 0.0 and env.action_space.high[-1] == 1.0


def test_reset_is_seeded() -> None:
    env = TabletopPickPlaceEnv()
    a, _ = env.reset(seed=7)
    b, _ = env.reset(seed=7)
    c, _ = env.reset(seed=8)
    assert np.array_equal(a["state"], b["state"])
    assert not np.array_equal(a["state"], c["state"])


def test_state_layout_reads_the_scene() -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=0, options={"cube_xy": [0.5, 0.12], "target_xy": [0.55, -0.1]})
    state = obs["state"]
    assert state.dtype == np.float32
    np.testing.assert_allclose(state[8:11], [0.5, 0.12, CUBE_REST_Z], atol=1e-6)
    np.testing.assert_allclose(state[11:13], [0.55, -0.1], atol=1e-6)
    assert state[7] == pytest.approx(0.0)  # starts open


def test_holding_still_keeps_the_arm_still() -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=1)
    hold = np.append(obs["state"][:7], 0.0).astype(np.float32)
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(hold)
    np.testing.assert_allclose(obs["state"][:7], hold[:7], atol=5e-3)
    assert not terminated and not truncated and not info["success"]
    assert reward < 0


def test_cube_put_on_target_is_success_and_held_above_is_not() -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=0, options={"cube_xy": [0.5, -0.1], "target_xy": [0.51, -0.11]})
    hold = np.append(obs["state"][:7], 0.0).astype(np.float32)
    _, reward, terminated, _, info = env.step(hold)
    assert info["success"] and terminated and reward > 0

    obs, _ = env.reset(seed=0, options={"cube_xy": [0.5, -0.1], "target_xy": [0.56, -0.1]})
    assert not env.step(hold)[4]["success"]  # 6 cm away

    assert not env.task.is_success(np.array([0.5, -0.1, CUBE_REST_Z + 0.05]), np.array([0.5, -0.1]))


def test_truncates_at_max_episode_steps() -> None:
    env = TabletopPickPlaceEnv(max_episode_steps=3)
    obs, _ = env.reset(seed=0)
    hold = np.append(obs["state"][:7], 0.0).astype(np.float32)
    flags = [env.step(hold)[3] for _ in range(3)]
    assert flags == [False, False, True] and env.step_count == 3


def test_bad_actions_are_refused_without_stepping() -> None:
    env = TabletopPickPlaceEnv()
    env.reset(seed=0)
    before = env.get_snapshot().to_bytes()
    with pytest.raises(ValueError):
        env.step(np.zeros(7, dtype=np.float32))
    with pytest.raises(ValueError):
        env.step(np.full(8, np.nan, dtype=np.float32))
    assert env.get_snapshot().to_bytes() == before


def test_images_have_the_promised_shape() -> None:
    env = TabletopPickPlaceEnv(render_images=True, image_size=(48, 64))
    obs, _ = env.reset(seed=0)
    assert set(obs["images"]) == set(CAMERA_NAMES)
    for image in obs["images"].values():
        assert image.shape == (48, 64, 3) and image.dtype == np.uint8
        assert image.std() > 5  # a scene, not a blank frame
    hold = np.append(obs["state"][:7], 0.0).astype(np.float32)
    assert env.step(hold)[0]["images"]["wrist"].shape == (48, 64, 3)
    env.close()


def test_state_only_env_does_not_render() -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=0)
    assert "images" not in obs and env._cameras is None


def test_rendering_env_can_be_stepped_from_another_thread() -> None:
    """The rollout service steps sessions on worker threads; EGL binds contexts per thread."""
    env = TabletopPickPlaceEnv(render_images=True, image_size=(24, 24))
    obs, _ = env.reset(seed=0)
    hold = np.append(obs["state"][:7], 0.0).astype(np.float32)
    with ThreadPoolExecutor(max_workers=1) as pool:
        image = pool.submit(lambda: env.step(hold)[0]["images"]["wrist"]).result()
    assert image.shape == (24, 24, 3)
    assert env.step(hold)[0]["images"]["wrist"].shape == (24, 24, 3)  # and back on this thread
    env.close()
