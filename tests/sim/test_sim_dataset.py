"""Dataset files: written by generate_dataset, read back by load_dataset with consistent shapes."""

from __future__ import annotations

import argparse

import numpy as np

from rollserve.sim import ACTION_NAMES, CAMERA_NAMES, CONTROL_HZ, STATE_NAMES
from rollserve.sim.dataset import add_arguments, generate_dataset, load_dataset, main


def test_round_trip_has_consistent_shapes(tmp_path) -> None:
    path = tmp_path / "demos.npz"
    summary = generate_dataset(3, seed=5, out_path=path, progress=False)
    data = load_dataset(path)
    n = summary.num_frames
    assert summary.path == path and summary.num_episodes == 3
    assert data.states.shape == (n, len(STATE_NAMES)) and data.states.dtype == np.float32
    assert data.actions.shape == (n, len(ACTION_NAMES)) and data.actions.dtype == np.float32
    assert data.episode_index.dtype == np.int64 and data.frame_index.dtype == np.int64
    assert data.success.shape == (3,) and data.success.dtype == bool
    assert data.success.mean() == summary.success_rate
    assert data.meta["state_names"] == list(STATE_NAMES)
    assert data.meta["action_names"] == list(ACTION_NAMES)
    assert data.meta["control_hz"] == CONTROL_HZ and data.meta["seed"] == 5 and data.meta["num_episodes"] == 3
    assert data.images is None
    for episode, frames in enumerate(data.episode_slices()):
        assert np.all(data.episode_index[frames] == episode)
        assert np.array_equal(data.frame_index[frames], np.arange(frames.stop - frames.start))
    assert not list(tmp_path.glob("*.partial"))


def test_same_seed_same_data(tmp_path) -> None:
    generate_dataset(2, seed=9, out_path=tmp_path / "a.npz", progress=False)
    generate_dataset(2, seed=9, out_path=tmp_path / "b.npz", progress=False)
    a, b = load_dataset(tmp_path / "a.npz"), load_dataset(tmp_path / "b.npz")
    assert np.array_equal(a.states, b.states) and np.array_equal(a.actions, b.actions)


def test_images_are_recorded_per_frame(tmp_path) -> None:
    summary = generate_dataset(1, seed=3, out_path=tmp_path / "img.npz", render_images=True, progress=False)
    data = load_dataset(summary.path)
    assert data.images is not None and set(data.images) == set(CAMERA_NAMES)
    for frames in data.images.values():
        assert frames.shape[0] == summary.num_frames and frames.shape[-1] == 3 and frames.dtype == np.uint8


def test_cli_hook(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--episodes", "1", "--seed", "2", "--out", str(tmp_path / "c.npz"), "--quiet"])
    assert main(args) == 0
    assert "success rate" in capsys.readouterr().out
    assert load_dataset(tmp_path / "c.npz").num_episodes == 1
