"""Record scripted-expert demonstrations of the tabletop task into one ``.npz`` file, and load it.

Arrays (N frames over all episodes): ``states`` (N, 13) float32, ``actions`` (N, 8) float32,
``episode_index`` (N,) int64, ``frame_index`` (N,) int64, ``success`` (episodes,) bool,
``episode_seeds`` (episodes,) int64, ``meta_json`` (0-d str: state_names, action_names,
control_hz, seed, num_episodes, ...), and with images ``images_<camera>`` (N, H, W, 3) uint8.
Frame t holds the observation *before* action t. Failed episodes are kept (``success`` says which).

CLI: ``rollserve dataset --episodes 200 --seed 0 --out data/tabletop.npz [--images]``.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rollserve.cli import non_negative_float, non_negative_int, output_file, positive_int
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.expert import ScriptedExpert
from rollserve.sim.layout import ACTION_NAMES, CAMERA_NAMES, CONTROL_HZ, STATE_NAMES

FORMAT_VERSION = 1


@dataclass(frozen=True)
class DatasetSummary:
    """What ``generate_dataset`` wrote."""

    path: Path
    num_episodes: int
    num_frames: int
    success_rate: float
    seconds: float


@dataclass(frozen=True)
class Dataset:
    """A loaded demonstration file; see the module docstring for the arrays."""

    states: np.ndarray
    actions: np.ndarray
    episode_index: np.ndarray
    frame_index: np.ndarray
    success: np.ndarray
    meta: dict[str, Any]
    images: dict[str, np.ndarray] | None = None

    @property
    def num_episodes(self) -> int:
        return len(self.success)

    def episode_slices(self) -> Iterator[slice]:
        """Frame range of each episode, in episode order (frames are stored contiguously)."""
        ends = np.cumsum(np.bincount(self.episode_index, minlength=self.num_episodes))
        starts = np.concatenate([[0], ends[:-1]])
        for start, end in zip(starts, ends, strict=True):
            yield slice(int(start), int(end))


def episode_seeds(seed: int, num_episodes: int) -> np.ndarray:
    """Reset seeds of the episodes, derived from ``seed`` (distinct datasets don't share layouts)."""
    return np.random.SeedSequence(seed).generate_state(num_episodes, dtype=np.uint32).astype(np.int64)


def generate_dataset(
    num_episodes: int,
    seed: int,
    out_path: str | os.PathLike[str],
    render_images: bool = False,
    progress: bool = True,
    *,
    action_noise: float = 0.0,
) -> DatasetSummary:
    """Run the scripted expert for ``num_episodes`` seeded episodes and write them to ``out_path``.

    ``action_noise`` (rad, std) perturbs the executed joint targets while the clean expert action
    is recorded (DART-style), so a cloned policy also sees how to recover from small deviations.
    Raises ``ValueError`` before creating anything unless ``num_episodes`` >= 1, ``seed`` >= 0 and
    ``action_noise`` is finite and >= 0 (no episodes would write an empty file that training only
    refuses much later; a negative or NaN noise would be skipped while the file's meta names it).
    """
    num_episodes, seed, action_noise = _checked_arguments(num_episodes, seed, action_noise)
    started = time.perf_counter()
    noise_rng = np.random.default_rng([seed, 1])
    env = TabletopPickPlaceEnv(render_images=render_images)
    expert = ScriptedExpert()
    seeds = episode_seeds(seed, num_episodes)
    states: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    episode_index: list[int] = []
    frame_index: list[int] = []
    images: dict[str, list[np.ndarray]] = {name: [] for name in CAMERA_NAMES} if render_images else {}
    success = np.zeros(num_episodes, dtype=bool)

    with _progress_bar(num_episodes, enabled=progress) as advance:
        for episode, episode_seed in enumerate(seeds):
            obs, _ = env.reset(seed=int(episode_seed))
            expert.reset(obs)
            for frame in range(env.max_episode_steps):
                action = expert.act(obs)
                states.append(obs["state"])
                actions.append(action)
                episode_index.append(episode)
                frame_index.append(frame)
                for name in images:
                    images[name].append(obs["images"][name])
                if action_noise > 0:
                    action = action.copy()
                    action[:7] += noise_rng.normal(0.0, action_noise, size=7).astype(np.float32)
                obs, _, terminated, truncated, info = env.step(action)
                if terminated or truncated:
                    break
            success[episode] = info["success"]
            advance(bool(success[episode]))
    env.close()

    meta = {
        "format_version": FORMAT_VERSION,
        "state_names": list(STATE_NAMES),
        "action_names": list(ACTION_NAMES),
        "camera_names": list(CAMERA_NAMES) if render_images else [],
        "image_size": list(env.image_size) if render_images else None,
        "control_hz": CONTROL_HZ,
        "max_episode_steps": env.max_episode_steps,
        "seed": seed,
        "num_episodes": num_episodes,
        "action_noise": action_noise,
        "success_rate": float(success.mean()),
    }
    arrays: dict[str, np.ndarray] = {
        "states": np.asarray(states, dtype=np.float32).reshape(-1, len(STATE_NAMES)),
        "actions": np.asarray(actions, dtype=np.float32).reshape(-1, len(ACTION_NAMES)),
        "episode_index": np.asarray(episode_index, dtype=np.int64),
        "frame_index": np.asarray(frame_index, dtype=np.int64),
        "success": success,
        "episode_seeds": seeds,
        "meta_json": np.array(json.dumps(meta)),
    }
    for name, frames in images.items():
        arrays[f"images_{name}"] = np.stack(frames) if frames else np.zeros((0, *env.image_size, 3), np.uint8)
    path = write_npz(Path(out_path), arrays, compress=render_images)
    return DatasetSummary(
        path=path,
        num_episodes=num_episodes,
        num_frames=len(states),
        success_rate=meta["success_rate"],
        seconds=time.perf_counter() - started,
    )


def _checked_arguments(num_episodes: int, seed: int, action_noise: float) -> tuple[int, int, float]:
    """The arguments as plain Python numbers (numpy ones too), or ``ValueError`` naming the bad one."""
    if not _is_whole(num_episodes) or num_episodes < 1:
        raise ValueError(f"num_episodes must be a whole number >= 1, got {num_episodes!r}")
    if not _is_whole(seed) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    if (
        isinstance(action_noise, bool)
        or not isinstance(action_noise, numbers.Real)
        or not 0 <= action_noise < math.inf
    ):
        raise ValueError(f"action_noise must be a finite number >= 0 (rad), got {action_noise!r}")
    return int(num_episodes), int(seed), float(action_noise)


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def load_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Read a file written by ``generate_dataset`` (no pickle involved)."""
    with np.load(Path(path), allow_pickle=False) as npz:
        images = {key.removeprefix("images_"): npz[key] for key in npz.files if key.startswith("images_")}
        return Dataset(
            states=npz["states"],
            actions=npz["actions"],
            episode_index=npz["episode_index"],
            frame_index=npz["frame_index"],
            success=npz["success"],
            meta=json.loads(str(npz["meta_json"])),
            images=images or None,
        )


def write_npz(path: Path, arrays: dict[str, np.ndarray], compress: bool) -> Path:
    """Write atomically (a reader never sees half a file) to exactly ``path``.

    The arrays go to ``<name>.partial`` beside ``path``, then ``os.replace`` puts it in place: a
    write cut short leaves ``path`` as it was (absent, or the previous file), never truncated.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **arrays)
        os.replace(partial, path)
    except BaseException:  # a full disk, a folder where the file should go: leave no stray partial
        partial.unlink(missing_ok=True)
        raise
    return path


class _progress_bar:
    """A rich progress bar with the running success rate; silent when off or not on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._total = total
        self._enabled = enabled and sys.stderr.isatty()
        self._progress: Any = None
        self._successes = 0
        self._done = 0

    def __enter__(self):
        if self._enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                )
            except ImportError:
                self._enabled = False
            else:
                self._progress = Progress(
                    TextColumn("expert demos"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("success {task.fields[rate]}"),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=False,
                )
                self._progress.start()
                self._task = self._progress.add_task("demos", total=self._total, rate="-")
        return self._advance

    def _advance(self, success: bool) -> None:
        self._done += 1
        self._successes += success
        if self._progress is not None:
            rate = f"{self._successes / self._done:.0%}"
            self._progress.update(self._task, advance=1, rate=rate)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rollserve dataset`` options."""
    parser.add_argument(
        "--episodes", type=positive_int, default=200, help="number of expert episodes (default 200)"
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="dataset seed; episode seeds derive from it"
    )
    parser.add_argument("--out", type=output_file, default="data/tabletop.npz", help="output .npz path")
    parser.add_argument("--images", action="store_true", help="also record both camera images (slow)")
    parser.add_argument(
        "--action-noise", type=non_negative_float, default=0.0,
        help="std (rad) of noise on executed joint targets",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    try:
        summary = generate_dataset(
            args.episodes,
            args.seed,
            args.out,
            render_images=args.images,
            progress=not args.quiet,
            action_noise=args.action_noise,
        )
    except OSError as exc:  # the path was checked up front; this is the disk failing at the end
        print(f"rollserve dataset: error: cannot write {args.out}: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {summary.path}: {summary.num_episodes} episodes, {summary.num_frames} frames in "
        f"{summary.seconds:.1f} s; expert success rate {summary.success_rate:.1%}"
    )
    return 0
