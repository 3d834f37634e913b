"""The simulator's camera frames next to the video world's imagined frames, for the same actions from
the same start: an animated GIF and a PNG strip.

    python examples/video_world_side_by_side.py --seed 3 --steps 40 --out-dir docs
    python examples/video_world_side_by_side.py --checkpoint DIR  # rollserve train world --video --out DIR

The scripted expert acts in the simulator; its actions are then replayed open-loop in the video world
(``rollserve serve --world video``'s model, or with ``--checkpoint DIR`` the one
``rollserve serve --world video --world-arg path=DIR`` serves), called in process through the same
``WorldModel`` API the server uses. Left / top: simulator. Right / bottom: video world. Trains nothing.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import imageio.v2 as imageio
import numpy as np

from rollserve.models.world import RenderSpec, WorldInit, WorldModel, WorldStep
from rollserve.models.worlds import WorldLoadError, load_world

STRIP_STEPS = (0, 5, 10, 20, 30, 40)
GAP = 2  # white pixels between panels
SEED_END = 2**63  # seeds the rollout API accepts: 0 <= seed < 2**63


def simulator_rollout(seed: int, steps: int, size: int, camera: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The expert's episode in the simulator: the camera frame before each action and after the last."""
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.expert import ScriptedExpert

    env = TabletopPickPlaceEnv(image_size=(size, size), max_episode_steps=steps, terminate_on_success=False)
    expert = ScriptedExpert()
    obs, _ = env.reset(seed=seed)
    expert.reset(obs)
    frames, actions = [env.render_cameras()[camera]], []
    for _ in range(steps):
        action = expert.act(obs)
        obs, *_ = env.step(action)
        frames.append(env.render_cameras()[camera])
        actions.append(action)
    env.close()
    return frames, np.asarray(actions, dtype=np.float32)


def world_frame(world: WorldModel) -> tuple[str, int]:
    """The camera and (square) frame size the world imagines: the simulator renders the same."""
    height, _ = world.spec.frame_size or (64, 64)
    return world.spec.cameras[0], height


def imagined_rollout(world: WorldModel, seed: int, actions: np.ndarray) -> list[np.ndarray]:
    """The video world's frames for the same start and actions (open loop: it never sees the sim again)."""
    camera = world.spec.cameras[0]
    height, width = world.spec.frame_size or (64, 64)
    (start,) = world.initial_states([WorldInit(seed=seed, render=RenderSpec((camera,), height, width))])
    if isinstance(start, BaseException):
        raise start
    frames, state = [start.images[camera]], start.state
    for action in actions:
        (out,) = world.step_batch([WorldStep(state, action)])
        if isinstance(out, BaseException):
            raise out
        frames.append(out.images[camera])
        state = out.state
    return frames


def _scaled(image: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)


def side_by_side(sim: np.ndarray, model: np.ndarray, scale: int) -> np.ndarray:
    a, b = _scaled(sim, scale), _scaled(model, scale)
    gap = np.full((a.shape[0], GAP * scale, 3), 255, dtype=np.uint8)
    return np.concatenate([a, gap, b], axis=1)


def strip(sim: list[np.ndarray], model: list[np.ndarray], steps: tuple[int, ...], scale: int) -> np.ndarray:
    """Top row: the simulator at ``steps``; bottom row: the video world at the same steps."""
    rows = []
    for frames in (sim, model):
        tiles = []
        for t in steps:
            tiles.append(_scaled(frames[t], scale))
            tiles.append(np.full((tiles[-1].shape[0], GAP * scale, 3), 255, dtype=np.uint8))
        rows.append(np.concatenate(tiles[:-1], axis=1))
    gap = np.full((GAP * scale, rows[0].shape[1], 3), 255, dtype=np.uint8)
    return np.concatenate([rows[0], gap, rows[1]], axis=0)


def _name_problem(name: str) -> str | None:
    """Why ``name`` is no plain file name (it is joined to ``--out-dir``), or None."""
    separators = [sep for sep in (os.sep, os.altsep) if sep]
    if name in ("", ".", "..") or any(sep in name for sep in separators) or "\0" in name:
        return f"{name!r} is not a plain file name (no folders: use --out-dir)"
    return None


def _out_dir_problem(out_dir: Path, name: str) -> str | None:
    """Why ``out_dir`` cannot receive the outputs, or None: checked before the rollouts (20-30 s),
    so a typo costs no wait and leaves no half-written output."""
    if out_dir.exists():
        if not out_dir.is_dir():
            return f"{out_dir} exists and is not a directory"
        if not os.access(out_dir, os.W_OK | os.X_OK):
            return f"{out_dir} is not writable"
        taken = [p for p in (out_dir / f"{name}.gif", out_dir / f"{name}.png") if p.is_dir()]
        return f"{taken[0]} is a directory" if taken else None
    ancestor = next(p for p in out_dir.absolute().parents if p.exists())
    if not ancestor.is_dir():
        return f"cannot create {out_dir}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {out_dir}: {ancestor} is not writable"
    return None


def _load_video_world(parser: argparse.ArgumentParser, checkpoint: Path | None) -> WorldModel:
    """The shipped video world, or the one at ``checkpoint`` loaded as ``--world-arg path=DIR`` is."""
    if checkpoint is None:
        return load_world("video")
    if not checkpoint.is_dir():
        parser.error(f"argument --checkpoint: {checkpoint} is not a directory (train world --video --out)")
    try:
        return load_world("video", path=str(checkpoint))
    except WorldLoadError as exc:
        parser.error(f"argument --checkpoint: {checkpoint} holds no video world checkpoint: {exc}")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments, every one checked before any rollout (a bad one is a one-line usage error)."""
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"argument --steps: must be at least 1, got {args.steps}")
    if not 0 <= args.seed < SEED_END:
        parser.error(f"argument --seed: must be in [0, 2**63), got {args.seed}")
    for flag, value in (("--scale", args.scale), ("--gif-scale", args.gif_scale)):
        if value < 1:
            parser.error(f"argument {flag}: must be at least 1, got {value}")
    problem = _name_problem(args.name)
    if problem:
        parser.error(f"argument --name: {problem}")
    problem = _out_dir_problem(args.out_dir, args.name)
    if problem:
        parser.error(f"argument --out-dir: {problem}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="actions to play (at least 1)")
    parser.add_argument("--scale", type=int, default=2, help="pixel repeat factor of the PNG strip")
    parser.add_argument("--gif-scale", type=int, default=1, help="pixel repeat factor of the GIF")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--name", default="video_world_side_by_side", help="outputs' file name, no suffix")
    parser.add_argument(
        "--checkpoint", type=Path, default=None, metavar="DIR",
        help="a video world trained by `rollserve train world --video --out DIR` (default: the shipped one)",
    )  # fmt: skip
    args = parse_args(parser, argv)
    world = _load_video_world(parser, args.checkpoint)
    try:
        camera, size = world_frame(world)
        sim, actions = simulator_rollout(args.seed, args.steps, size, camera)
        model = imagined_rollout(world, args.seed, actions)
    finally:
        world.close()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    gif = args.out_dir / f"{args.name}.gif"
    png = args.out_dir / f"{args.name}.png"
    movie = [side_by_side(s, m, args.gif_scale) for s, m in zip(sim, model, strict=True)]
    imageio.mimsave(gif, movie, duration=100, loop=0)
    steps = tuple(t for t in STRIP_STEPS if t <= args.steps)
    imageio.imwrite(png, strip(sim, model, steps, args.scale))
    errors = [float(np.sqrt(np.mean((s / 255.0 - m / 255.0) ** 2))) for s, m in zip(sim, model, strict=True)]
    for t in steps:
        print(f"step {t:3d}: RMSE {errors[t]:.3f} (pixels in [0, 1])")
    print(f"wrote {gif} and {png}")
    return {"gif": gif, "png": png}


if __name__ == "__main__":
    main()
