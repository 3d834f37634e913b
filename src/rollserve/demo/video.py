"""Render a recorded episode to a video file, after the run, from the env snapshots taken each tick.

Rendering is slow on a CPU (software GL), so nothing is rendered while the robot runs on the
clock: snapshots are exact and cost microseconds, and a second env replays them here. MP4 needs
``imageio-ffmpeg``; without it the video is written as a GIF next to the requested path.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

FRAME_SIZE = (192, 192)  # per camera; the scene's offscreen buffer is 256x256
STALL_BORDER = 6


def mp4_available() -> bool:
    return importlib.util.find_spec("imageio_ffmpeg") is not None


def video_path(requested: str | Path) -> Path:
    """The path that will really be written: ``.mp4`` only when an encoder is installed."""
    path = Path(requested)
    if path.suffix.lower() == ".gif":
        return path
    if path.suffix.lower() == ".mp4" and mp4_available():
        return path
    return path.with_suffix(".gif")


def render_frames(snapshots: Sequence[bytes], stalls: Sequence[bool]) -> list[np.ndarray]:
    """Exterior and wrist views side by side; a red frame marks a tick where the robot stalled."""
    from rollserve.sim.env import TabletopPickPlaceEnv

    env = TabletopPickPlaceEnv(image_size=FRAME_SIZE)
    env.reset(seed=0)
    frames = []
    try:
        for snapshot, stalled in zip(snapshots, stalls, strict=True):
            env.set_snapshot(snapshot)
            views = env.render_cameras()
            frame = np.concatenate([views["exterior"], views["wrist"]], axis=1)
            if stalled:
                frame = frame.copy()
                frame[:STALL_BORDER], frame[-STALL_BORDER:] = (220, 30, 30), (220, 30, 30)
                frame[:, :STALL_BORDER], frame[:, -STALL_BORDER:] = (220, 30, 30), (220, 30, 30)
            frames.append(frame)
    finally:
        env.close()
    return frames


def write_video(
    snapshots: Sequence[bytes], stalls: Sequence[bool], requested: str | Path, fps: float
) -> Path:
    """Render and write; returns the path written (see :func:`video_path`)."""
    import imageio.v3 as iio

    path = video_path(requested)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = render_frames(snapshots, stalls)
    if path.suffix.lower() == ".mp4":
        iio.imwrite(path, np.stack(frames), fps=fps, codec="libx264", plugin="FFMPEG")
    else:
        iio.imwrite(path, np.stack(frames), duration=1000.0 / fps, loop=0)
    return path
