"""`rollserve train world --video`: render frames of expert and perturbed rollouts of the tabletop
task, fit the video world model, and measure its error against the simulator per horizon.

Data: the scripted expert with Gaussian noise on the *executed* joint targets, at several noise
levels (the executed action is recorded), rendered from the exterior camera at 64x64. Training has
three phases, sized for a couple of CPU cores: an autoencoder on single frames, then the latent
dynamics and state head unrolled over several steps (with latent, state and frame losses), all
from fixed seeds. The report replays held-out episodes' actions open-loop in both worlds from the
same start and compares frames (PSNR, SSIM) and the predicted cube position.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from rollserve.cli import (
    UsageError,
    checked,
    non_negative_float,
    non_negative_int,
    output_dir,
    output_file,
    positive_int,
)
from rollserve.models.net_checkpoint import CONFIG_FILE
from rollserve.models.video_world import (
    VideoWorldConfig,
    VideoWorldNet,
    default_checkpoint_dir,
    save_video_world,
    uint8_to_frames,
)

HORIZONS = (1, 10, 40)
DEFAULT_IMAGE_SIZE = 64
MIN_IMAGE_SIZE = 16
"""SSIM's 11x11 window needs frames at least this wide (a multiple of 8 for the 1/8 latent)."""
MAX_IMAGE_SIZE = 256
"""The scene's offscreen framebuffer (``offwidth`` in ``rollserve.sim.scene``)."""


@dataclass(frozen=True)
class VideoEpisodes:
    """``frames`` (N, T+1, H, W, 3) uint8, ``states`` (N, T+1, S), ``actions`` (N, T, A), ``seeds`` (N,)."""

    frames: np.ndarray
    states: np.ndarray
    actions: np.ndarray
    seeds: np.ndarray

    def save(self, path: Path) -> None:
        """Write atomically: a save cut short (Ctrl-C, a full disk) leaves no half file for the next
        run to load as its cache."""
        from rollserve.sim.dataset import write_npz  # the sim extra: rendering needed it already

        arrays = {k: getattr(self, k) for k in ("frames", "states", "actions", "seeds")}
        write_npz(path, arrays, compress=True)

    @classmethod
    def load(cls, path: Path) -> VideoEpisodes:
        with np.load(path, allow_pickle=False) as npz:
            return cls(npz["frames"], npz["states"], npz["actions"], npz["seeds"])


def collect(
    num_episodes: int,
    seed: int,
    noise_levels: tuple[float, ...],
    steps: int,
    image_size: int,
    camera: str = "exterior",
    log: Any = print,
) -> VideoEpisodes:
    """Expert episodes with noisy executed actions (the level cycles), one camera rendered per step."""
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.expert import ScriptedExpert
    from rollserve.sim.rendering import CameraRig

    env = TabletopPickPlaceEnv(max_episode_steps=steps, terminate_on_success=False)
    rig = CameraRig(env.model, (image_size, image_size), (camera,))
    expert = ScriptedExpert()
    noise_rng = np.random.default_rng([seed, 11])
    seeds = np.random.SeedSequence(seed).generate_state(num_episodes, dtype=np.uint32).astype(np.int64)
    frames, states, actions = [], [], []
    started = time.perf_counter()
    for i, ep_seed in enumerate(seeds):
        sigma = noise_levels[i % len(noise_levels)]
        obs, _ = env.reset(seed=int(ep_seed))
        expert.reset(obs)
        ep_frames, ep_states, ep_actions = [rig.render(env.data)[camera]], [obs["state"]], []
        for _ in range(steps):
            action = expert.act(obs).copy()
            action[:7] += noise_rng.normal(0.0, sigma, size=7).astype(np.float32)
            action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, _, _, _, _ = env.step(action)
            ep_frames.append(rig.render(env.data)[camera])
            ep_states.append(obs["state"])
            ep_actions.append(action)
        frames.append(np.stack(ep_frames))
        states.append(np.stack(ep_states))
        actions.append(np.stack(ep_actions))
        if (i + 1) % 8 == 0 or i + 1 == num_episodes:
            log(f"rendered {i + 1}/{num_episodes} episodes ({time.perf_counter() - started:.0f} s)")
    rig.close()
    env.close()
    return VideoEpisodes(
        np.stack(frames), np.stack(states).astype(np.float32), np.stack(actions).astype(np.float32), seeds
    )


def task_config(latent_channels: int, width: int, dynamics_width: int, image_size: int) -> VideoWorldConfig:
    """The architecture plus the start distribution and rule copied from the simulator."""
    from rollserve.training.world_model import task_config as state_task_config

    base = state_task_config(1, 1, 1)
    return VideoWorldConfig(
        state_names=base.state_names,
        image_size=image_size,
        latent_channels=latent_channels,
        width=width,
        dynamics_width=dynamics_width,
        control_hz=base.control_hz,
        max_episode_steps=base.max_episode_steps,
        action_low=base.action_low,
        action_high=base.action_high,
        start=base.start,
        rule=base.rule,
    )


def _std(x: torch.Tensor) -> torch.Tensor:
    std = x.std(0)
    return torch.where(std < 1e-6, torch.ones_like(std), std)


def fit(
    config: VideoWorldConfig,
    data: VideoEpisodes,
    *,
    ae_iterations: int,
    dyn_iterations: int,
    decoder_iterations: int,
    batch: int,
    unroll: int,
    seed: int,
    log: Any = print,
) -> VideoWorldNet:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = VideoWorldNet(config)
    frames = torch.as_tensor(data.frames)  # uint8 (N, T+1, H, W, 3), converted per batch
    states = torch.as_tensor(data.states)
    actions = torch.as_tensor(data.actions)
    n, horizon = actions.shape[:2]
    flat_states = states.reshape(-1, states.shape[-1])
    net.state_mean.copy_(flat_states.mean(0))
    net.state_std.copy_(_std(flat_states))
    flat_actions = actions.reshape(-1, actions.shape[-1])
    net.action_mean.copy_(flat_actions.mean(0))
    net.action_std.copy_(_std(flat_actions))
    deltas = (states[:, 1:] - states[:, :-1]).reshape(-1, states.shape[-1])
    net.delta_mean.copy_(deltas.mean(0))
    net.delta_std.copy_(deltas.std(0).where(deltas.std(0) > 1e-6, 0.0))
    delta_scale = _std(deltas)

    def as_frames(x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2).float() / 255.0

    net.train()
    started = time.perf_counter()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, ae_iterations)
    for it in range(ae_iterations):
        ep = torch.randint(n, (batch,), generator=gen)
        t = torch.randint(horizon + 1, (batch,), generator=gen)
        x = as_frames(frames[ep, t])
        recon = net.decode(net.encode(x), states[ep, t])
        loss = F.mse_loss(recon, x)
        _descend(opt, loss)
        sched.step()
        if (it + 1) % 100 == 0:
            elapsed = time.perf_counter() - started
            log(f"autoencoder {it + 1}/{ae_iterations}: mse {loss.item():.5f} ({elapsed:.0f} s)")

    # phase 2: latent dynamics and state head on the frozen encoder's latents (cheap: 8x8 maps)
    with torch.no_grad():
        latents = torch.cat([net.encode(as_frames(frames[i])) for i in range(n)]).reshape(
            n, horizon + 1, *config.latent_shape
        )
    latent_scale = latents.std()
    dynamics = [
        *net.condition.parameters(),
        *net.dyn_in.parameters(),
        *net.dyn_body.parameters(),
        *net.latent_summary.parameters(),
        *net.state_head.parameters(),
    ]
    opt = torch.optim.AdamW(dynamics, lr=1e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, dyn_iterations)
    for it in range(dyn_iterations):
        ep = torch.randint(n, (batch,), generator=gen)
        t0 = torch.randint(horizon - unroll + 1, (batch,), generator=gen)
        z, s = latents[ep, t0], states[ep, t0]
        latent_loss = state_loss = torch.zeros(())
        for k in range(unroll):
            z, s = net.step(z, s, actions[ep, t0 + k])
            latent_loss = latent_loss + F.mse_loss(z / latent_scale, latents[ep, t0 + k + 1] / latent_scale)
            state_loss = state_loss + torch.mean(((s - states[ep, t0 + k + 1]) / delta_scale) ** 2)
        _descend(opt, (latent_loss + 0.01 * state_loss) / unroll)
        sched.step()
        if (it + 1) % 100 == 0:
            log(
                f"dynamics {it + 1}/{dyn_iterations}: latent {latent_loss.item() / unroll:.4f}, "
                f"state {state_loss.item() / unroll:.3f} ({time.perf_counter() - started:.0f} s)"
            )

    # phase 3: the decoder learns to draw the dynamics' own (imperfect) latents
    opt = torch.optim.AdamW([*net.decoder.parameters(), *net.decoder_state.parameters()], lr=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(decoder_iterations, 1))
    for it in range(decoder_iterations):
        ep = torch.randint(n, (batch,), generator=gen)
        t0 = torch.randint(horizon, (batch,), generator=gen)
        k = torch.randint(1, unroll + 1, (1,), generator=gen).item()
        k = min(int(k), horizon - int(t0.max()))
        z, s = latents[ep, t0], states[ep, t0]
        with torch.no_grad():
            for j in range(k):
                z, s = net.step(z, s, actions[ep, t0 + j])
        loss = F.mse_loss(net.decode(z, s), as_frames(frames[ep, t0 + k]))
        _descend(opt, loss)
        sched.step()
        if (it + 1) % 100 == 0:
            elapsed = time.perf_counter() - started
            log(f"decoder {it + 1}/{decoder_iterations}: mse {loss.item():.5f} ({elapsed:.0f} s)")
    return net.eval()


def _descend(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def psnr(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-frame PSNR (dB) of ``(B, 3, H, W)`` frames in [0, 1]."""
    mse = np.mean((pred - true) ** 2, axis=(1, 2, 3))
    return 10.0 * np.log10(1.0 / np.maximum(mse, 1e-10))


def ssim(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-frame SSIM (Gaussian window 11, sigma 1.5, per channel, averaged) of frames in [0, 1]."""
    x, y = torch.as_tensor(pred, dtype=torch.float64), torch.as_tensor(true, dtype=torch.float64)
    coords = torch.arange(11, dtype=torch.float64) - 5
    g = torch.exp(-(coords**2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).expand(x.shape[1], 1, 11, 11)

    def blur(v: torch.Tensor) -> torch.Tensor:
        return F.conv2d(v, window, groups=x.shape[1])

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return s.mean(dim=(1, 2, 3)).numpy()


@torch.inference_mode()
def imagine(net: VideoWorldNet, start_frames: np.ndarray, start_states: np.ndarray, actions: np.ndarray):
    """Open-loop rollout from uint8 start frames: ``(frames (N, T, 3, H, W), states (N, T, S))``."""
    z = net.encode(torch.as_tensor(uint8_to_frames(start_frames)))
    s = torch.as_tensor(start_states)
    frames, states = [], []
    for t in range(actions.shape[1]):
        z, s = net.step(z, s, torch.as_tensor(actions[:, t]))
        frames.append(net.decode(z, s).numpy())
        states.append(s.numpy())
    return np.stack(frames, axis=1), np.stack(states, axis=1)


def horizon_errors(net: VideoWorldNet, data: VideoEpisodes) -> dict[str, Any]:
    """Error of the imagined frames (and cube position) against the simulator's, per horizon."""
    frames, states = imagine(net, data.frames[:, 0], data.states[:, 0], data.actions)
    table: dict[str, Any] = {}
    for h in (h for h in HORIZONS if h <= data.actions.shape[1]):
        true = uint8_to_frames(data.frames[:, h])
        held = uint8_to_frames(data.frames[:, 0])  # the "nothing moves" baseline
        cube = np.linalg.norm(states[:, h - 1, 8:11] - data.states[:, h, 8:11], axis=1)
        table[str(h)] = {
            "psnr_db": float(np.mean(psnr(frames[:, h - 1], true))),
            "ssim": float(np.mean(ssim(frames[:, h - 1], true))),
            "psnr_db_first_frame_baseline": float(np.mean(psnr(held, true))),
            "ssim_first_frame_baseline": float(np.mean(ssim(held, true))),
            "cube_pos_err_m": float(np.mean(cube)),
            "joint_rmse_rad": float(np.sqrt(np.mean((states[:, h - 1, :7] - data.states[:, h, :7]) ** 2))),
        }
    recon = uint8_to_frames(data.frames[:, 0])
    with torch.inference_mode():
        dec = net.decode(net.encode(torch.as_tensor(recon)), torch.as_tensor(data.states[:, 0])).numpy()
    return {
        "episodes": len(data.seeds),
        "autoencoder_psnr_db": float(np.mean(psnr(dec, recon))),
        "horizon_steps": table,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=positive_int, default=48, help="training episodes to render")
    parser.add_argument(
        "--eval-episodes", type=positive_int, default=8, help="held-out episodes for the report"
    )
    parser.add_argument("--steps", type=positive_int, default=50, help="control steps per episode")
    parser.add_argument(
        "--noise", type=non_negative_float, nargs="+", default=[0.0, 0.03, 0.08, 0.15],
        help="action noise (rad)",
    )  # fmt: skip
    parser.add_argument(
        "--image-size", type=positive_int, default=None,
        help=f"frame size: a multiple of 8 from {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} (default "
        f"{DEFAULT_IMAGE_SIZE}; with --evaluate-only, the checkpoint's)",
    )  # fmt: skip
    parser.add_argument("--latent-channels", type=positive_int, default=16, help="channels of the latent")
    parser.add_argument("--width", type=positive_int, default=64, help="encoder/decoder channels")
    parser.add_argument("--dynamics-width", type=positive_int, default=32, help="latent dynamics channels")
    parser.add_argument(
        "--ae-iterations", type=positive_int, default=1500, help="autoencoder phase iterations"
    )
    parser.add_argument("--dyn-iterations", type=positive_int, default=1500, help="dynamics phase iterations")
    parser.add_argument(
        "--decoder-iterations",
        type=non_negative_int,
        default=500,
        help="decoder fine-tuning iterations (0 skips it)",
    )
    parser.add_argument("--batch", type=positive_int, default=24, help="samples (episode, time) per batch")
    parser.add_argument("--unroll", type=positive_int, default=6, help="at most --steps")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="training seed")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument("--data", type=output_file, default=None, help="cache of rendered episodes (.npz)")
    parser.add_argument(
        "--out", type=output_dir, default=None, help="checkpoint dir (default: the shipped one)"
    )
    parser.add_argument("--evaluate-only", action="store_true", help="report the checkpoint at --out")


def _check_arguments(args: argparse.Namespace) -> None:
    """Cross-flag checks argparse cannot do, before minutes of rendering."""
    size = args.image_size
    if size is not None and (size % 8 or not MIN_IMAGE_SIZE <= size <= MAX_IMAGE_SIZE):
        raise UsageError(
            f"argument --image-size: must be a multiple of 8 (the latent is 1/8) from {MIN_IMAGE_SIZE} "
            f"(SSIM's 11x11 window) to {MAX_IMAGE_SIZE} (the offscreen framebuffer), got {size}"
        )
    if not args.evaluate_only and args.unroll > args.steps:
        raise UsageError(f"argument --unroll: must be at most --steps ({args.steps}), got {args.unroll}")


def _checkpoint_to_evaluate(out: Path | None) -> VideoWorldNet:
    """The net ``--evaluate-only`` reports on, loaded before the held-out episodes are rendered."""
    from rollserve.models.video_world import load_video_world_net

    path = out or default_checkpoint_dir()
    if not (path / CONFIG_FILE).is_file():
        raise UsageError(f"argument --out: no video world checkpoint in {path} (no {CONFIG_FILE})")
    try:
        return load_video_world_net(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"argument --out: cannot load the checkpoint in {path}: {exc}") from None


def _episodes(args: argparse.Namespace, name: str, count: int, seed: int, noise: tuple[float, ...]):
    tag = f"{name}-{count}x{args.steps}-seed{seed}-{args.image_size}px-noise{'_'.join(map(str, noise))}"
    path = None if args.data is None else args.data.with_name(f"{args.data.stem}-{tag}.npz")
    if path is not None and path.exists():
        return VideoEpisodes.load(path)
    eps = collect(count, seed, noise, args.steps, args.image_size, log=_log)
    if path is not None:
        eps.save(path)
    return eps


def _log(message: str) -> None:
    print(message, flush=True)


def _evaluate_only(args: argparse.Namespace) -> int:
    """``--evaluate-only``: the checkpoint at ``--out`` against freshly rendered held-out episodes,
    at the checkpoint's own frame size (its encoder takes no other)."""
    net = _checkpoint_to_evaluate(args.out)
    size = net.config.image_size
    if args.image_size not in (None, size):
        raise UsageError(
            f"argument --image-size: the checkpoint at {args.out or default_checkpoint_dir()} takes "
            f"{size}px frames, got {args.image_size} (leave it out with --evaluate-only)"
        )
    args.image_size = size
    eval_eps = _episodes(args, "eval", args.eval_episodes, args.seed + 10_000, (0.02,))
    print(json.dumps(horizon_errors(net, eval_eps), indent=2))
    return 0


def main(args: argparse.Namespace) -> int:
    _check_arguments(args)
    # Mesa's software rasteriser renders these small frames faster in-thread than with helper threads
    os.environ.setdefault("LP_NUM_THREADS", "0")
    torch.set_num_threads(args.threads)
    if args.evaluate_only:
        return _evaluate_only(args)
    out_dir = checked("--out", output_dir, args.out or default_checkpoint_dir())
    if args.image_size is None:
        args.image_size = DEFAULT_IMAGE_SIZE
    started = time.perf_counter()
    eval_eps = _episodes(args, "eval", args.eval_episodes, args.seed + 10_000, (0.02,))
    train_eps = _episodes(args, "train", args.episodes, args.seed, tuple(args.noise))
    render_s = time.perf_counter() - started
    _log(
        f"rendered {train_eps.actions.shape[0] * (train_eps.actions.shape[1] + 1)} frames in {render_s:.0f} s"
    )
    config = task_config(args.latent_channels, args.width, args.dynamics_width, args.image_size)
    net = fit(
        config,
        train_eps,
        ae_iterations=args.ae_iterations,
        dyn_iterations=args.dyn_iterations,
        decoder_iterations=args.decoder_iterations,
        batch=args.batch,
        unroll=args.unroll,
        seed=args.seed,
        log=_log,
    )
    training = {
        "episodes": args.episodes,
        "steps": args.steps,
        "noise_levels": list(args.noise),
        "ae_iterations": args.ae_iterations,
        "dyn_iterations": args.dyn_iterations,
        "decoder_iterations": args.decoder_iterations,
        "batch": args.batch,
        "unroll": args.unroll,
        "seed": args.seed,
        "threads": args.threads,
        "render_seconds": round(render_s, 1),
    }
    net.config = replace(config, training={**training, "seconds": round(time.perf_counter() - started, 1)})
    out = save_video_world(net, out_dir)  # before the report: a failing report loses no training
    report = horizon_errors(net, eval_eps)
    training.update(seconds=round(time.perf_counter() - started, 1), evaluation=report)
    net.config = replace(config, training=training)
    save_video_world(net, out)
    print(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0
