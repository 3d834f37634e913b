"""The rendered-episode cache of `rollserve train world --video`: a save cut short never leaves a
file at the cache path, so the next run renders again instead of loading (or failing on) half a file."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npy_format

from rollserve.training import video_world_model
from rollserve.training.video_world_model import VideoEpisodes

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("mujoco") is None,
        reason="needs the sim extra (the writer lives in rollserve.sim.dataset)",
    ),
    # numpy's savez leaves its ZipFile open when a write raises; collected later, it cannot write its
    # directory into the temporary file, already closed and removed: harmless, and not what is tested
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
REAL_WRITE_ARRAY = npy_format.write_array


def _episodes(seed: int) -> VideoEpisodes:
    rng = np.random.default_rng(seed)
    return VideoEpisodes(
        frames=rng.integers(0, 256, (2, 4, 16, 16, 3), dtype=np.uint8),
        states=rng.normal(size=(2, 4, 13)).astype(np.float32),
        actions=rng.normal(size=(2, 3, 8)).astype(np.float32),
        seeds=np.array([seed, seed + 1], np.int64),
    )


def _assert_same(a: VideoEpisodes, b: VideoEpisodes) -> None:
    for name in ("frames", "states", "actions", "seeds"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def _interrupt_the_second_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the second array is written: the frames are already in the file."""
    calls: list[int] = []

    def write_then_interrupt(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        REAL_WRITE_ARRAY(*args, **kwargs)

    monkeypatch.setattr(npy_format, "write_array", write_then_interrupt)


def _write_normally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(npy_format, "write_array", REAL_WRITE_ARRAY)


def test_a_save_round_trips_to_exactly_the_path(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "eps.cache"  # no .npz suffix: numpy's own savez would add one
    episodes = _episodes(0)
    episodes.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["eps.cache"]
    _assert_same(VideoEpisodes.load(path), episodes)


def test_an_interrupted_save_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "eps.npz"
    _interrupt_the_second_array(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _episodes(0).save(path)
    assert list(tmp_path.iterdir()) == []  # neither a truncated eps.npz nor a stray temporary file


def test_an_interrupted_save_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "eps.npz"
    old = _episodes(0)
    old.save(path)
    _interrupt_the_second_array(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        _episodes(1).save(path)
    _write_normally(monkeypatch)
    _assert_same(VideoEpisodes.load(path), old)
    assert [p.name for p in tmp_path.iterdir()] == ["eps.npz"]


def test_the_run_after_an_interrupted_save_renders_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered: list[int] = []

    def collect(count: int, seed: int, *args: object, **kwargs: object) -> VideoEpisodes:
        rendered.append(seed)
        return _episodes(seed)

    monkeypatch.setattr(video_world_model, "collect", collect)
    args = argparse.Namespace(data=tmp_path / "cache.npz", steps=3, image_size=16)
    _interrupt_the_second_array(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        video_world_model._episodes(args, "train", 2, 5, (0.0,))
    _write_normally(monkeypatch)
    episodes = video_world_model._episodes(args, "train", 2, 5, (0.0,))  # the next run
    assert rendered == [5, 5]  # rendered again: nothing half-written was taken for the cache
    _assert_same(episodes, _episodes(5))
    again = video_world_model._episodes(args, "train", 2, 5, (0.0,))  # and now the cache is used
    assert rendered == [5, 5]
    _assert_same(again, _episodes(5))
