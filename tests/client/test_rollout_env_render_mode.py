"""``render_mode="rgb_array"``: a rendering env's ``render()`` is its last observation's first camera
frame, so gymnasium's ``RecordVideo`` records it. Real server, the video world (fast on a CPU)."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from gymnasium.utils.passive_env_checker import env_render_passive_checker
from gymnasium.wrappers import RecordVideo

from rollserve.client.rollout_client import RolloutClient
from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

UNREACHABLE = "http://127.0.0.1:9"  # a refusal must come before any request


@pytest.fixture(scope="module")
def url():
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("video"), settings))) as server:
        yield server.http_url


def action_of(state: np.ndarray) -> np.ndarray:
    return np.r_[state[:7] + 0.05, 0.5].astype(np.float32)


@pytest.mark.parametrize("make", [RolloutEnv, lambda url, **kw: RolloutVectorEnv(2, url, **kw)])
def test_render_mode_needs_a_rendering_session(make) -> None:
    with pytest.raises(ValueError, match="needs a rendering session"):
        make(UNREACHABLE, render_mode="rgb_array")
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        make(UNREACHABLE, render={}, render_mode="human")


def test_render_is_the_first_cameras_frame_after_reset_and_each_step(url: str) -> None:
    with RolloutClient(url) as client:
        fps = client.world("video")["fps"]
    env = RolloutEnv(url, render={"cameras": ["exterior"]}, render_mode="rgb_array")
    try:
        assert env.render_mode == "rgb_array"
        assert env.metadata["render_modes"] == ["rgb_array"] and env.metadata["render_fps"] == fps > 0
        obs, _ = env.reset(seed=0)
        frames = [env.render()]
        expected = [obs["images"]["exterior"].copy()]
        for _ in range(3):
            obs = env.step(action_of(obs["state"]))[0]
            frames.append(env.render())
            expected.append(obs["images"]["exterior"].copy())
            obs["images"]["exterior"][:] = 0  # the caller's in-place change leaves the frame alone
        for frame, image in zip(frames, expected, strict=True):
            assert frame.dtype == np.uint8 and frame.shape == (64, 64, 3)
            np.testing.assert_array_equal(frame, image)
        assert not np.array_equal(frames[0], frames[-1])  # the steps moved the imagined scene
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # gymnasium warns on a missing render_fps or mode
            env_render_passive_checker(env)
    finally:
        env.close()


def test_without_render_mode_render_is_none_and_modes_match(url: str) -> None:
    plain, rendering = RolloutEnv(url), RolloutEnv(url, render={})
    try:
        assert plain.metadata["render_modes"] == [] and plain.render_mode is None
        assert rendering.metadata["render_modes"] == ["rgb_array"] and rendering.render_mode is None
        rendering.reset(seed=0)
        assert rendering.render() is None
    finally:
        plain.close()
        rendering.close()


def test_vector_render_is_each_sub_envs_frame(url: str) -> None:
    venv = RolloutVectorEnv(2, url, render={}, render_mode="rgb_array")
    try:
        assert venv.metadata["render_modes"] == ["rgb_array"] and "autoreset_mode" in venv.metadata
        obs, _ = venv.reset(seed=[0, 5])
        for _ in range(2):
            frames = venv.render()
            assert isinstance(frames, tuple) and len(frames) == 2
            for i, frame in enumerate(frames):
                np.testing.assert_array_equal(frame, obs["images"]["exterior"][i])
            obs = venv.step(np.stack([action_of(s) for s in obs["state"]]))[0]
    finally:
        venv.close()


class FakeClip:
    """moviepy's ``ImageSequenceClip`` as RecordVideo uses it; writes the frames as .npy."""

    written: ClassVar[list[tuple[str, np.ndarray, float]]] = []

    def __init__(self, frames: list[np.ndarray], fps: float) -> None:
        self.frames, self.fps = np.stack(frames), fps

    def write_videofile(self, path: str, logger: object = None) -> None:
        with open(path, "wb") as file:  # a file object: np.save adds no .npy
            np.save(file, self.frames, allow_pickle=False)
        self.written.append((path, self.frames, self.fps))


@pytest.fixture
def fake_moviepy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, np.ndarray, float]]:
    """moviepy is not installed here: RecordVideo's only use of it, replaced."""
    FakeClip.written = []
    names = ["moviepy", "moviepy.video", "moviepy.video.io", "moviepy.video.io.ImageSequenceClip"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["moviepy.video.io.ImageSequenceClip"].ImageSequenceClip = FakeClip  # type: ignore[attr-defined]
    return FakeClip.written


def record_one_episode(url: str, folder: Path) -> list[np.ndarray]:
    """One 3-step episode through RecordVideo; the frames the env observed."""
    env = RolloutEnv(url, render={}, render_mode="rgb_array", max_episode_steps=3)
    recorder = RecordVideo(env, str(folder), episode_trigger=lambda _: True)
    try:
        obs, _ = recorder.reset(seed=1)
        seen = [obs["images"]["exterior"].copy()]
        done = False
        while not done:
            obs, _, terminated, truncated, _ = recorder.step(action_of(obs["state"]))
            seen.append(obs["images"]["exterior"].copy())
            done = terminated or truncated
    finally:
        recorder.close()  # writes the video
    return seen


def test_record_video_records_the_episodes_frames(url: str, tmp_path: Path, fake_moviepy) -> None:
    seen = record_one_episode(url, tmp_path / "videos")
    [(path, frames, fps)] = fake_moviepy
    assert Path(path) == tmp_path / "videos" / "rl-video-episode-0.mp4"
    np.testing.assert_array_equal(np.load(path), frames)
    assert len(seen) == 4  # the reset's frame and the three steps'
    np.testing.assert_array_equal(frames, np.stack(seen))
    with RolloutClient(url) as client:
        assert fps == client.world("video")["fps"]


def test_record_video_writes_a_video_with_moviepy(url: str, tmp_path: Path) -> None:
    pytest.importorskip("moviepy", reason="moviepy is gymnasium's `other` extra")
    record_one_episode(url, tmp_path / "videos")
    assert (tmp_path / "videos" / "rl-video-episode-0.mp4").stat().st_size > 0
