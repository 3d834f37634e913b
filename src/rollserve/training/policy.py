"""`rollserve train policy`: behaviour-clone the reference flow-matching policy from expert demos.

Reads a dataset ``.npz`` (``states``, ``actions``, ``episode_index``, ``frame_index``, ``success``,
``meta_json``; see ``rollserve.sim.dataset``), generating it first when the file is absent, trains
with the flow-matching loss, shows live progress, and writes a checkpoint directory.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollserve.cli import (
    UsageError,
    checked,
    non_negative_float,
    non_negative_int,
    output_dir,
    output_file,
    positive_float,
    positive_int,
)
from rollserve.models.checkpoint import save_flow_policy
from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import DEFAULT_RTC, FlowMatchingPolicy
from rollserve.models.flow_stats import NormStats

DEFAULT_EPISODES = 200
DEFAULT_ACTION_NOISE = 0.02
"""DART-style noise (rad) on the expert's executed joint targets: the clone learns to recover."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and architecture knobs; stored in the checkpoint's provenance."""

    steps: int = 8_000
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 500
    seed: int = 0
    chunk_size: int = 16
    hidden_dim: int = 256
    depth: int = 3
    time_embed_dim: int = 64
    num_steps: int = 10
    """Euler steps at inference."""
    state_noise: float = 0.0
    """Std of Gaussian noise added to normalised training states (robustness to drift)."""
    ema_decay: float = 0.999


@dataclass
class ChunkDataset:
    """Normalised states ``(N, S)`` and action-chunk targets ``(N, H, A)``, one row per frame."""

    states: np.ndarray
    chunks: np.ndarray
    stats: NormStats
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_arrays(cls, data: dict[str, Any], chunk_size: int) -> ChunkDataset:
        states = np.asarray(data["states"], np.float32)
        actions = np.asarray(data["actions"], np.float32)
        episodes = np.asarray(data["episode_index"], np.int64)
        if "success" in data:  # clone only the demonstrations that worked
            keep = np.asarray(data["success"], bool)[episodes]
            states, actions, episodes = states[keep], actions[keep], episodes[keep]
        stats = NormStats.fit(states, actions)
        index = chunk_indices(episodes, chunk_size)
        meta_raw = data.get("meta_json")
        meta = json.loads(str(meta_raw)) if meta_raw is not None else {}
        return cls(stats.normalize_state(states), stats.normalize_actions(actions)[index], stats, meta)


def chunk_indices(episode_index: np.ndarray, chunk_size: int) -> np.ndarray:
    """``(N, H)`` frame indices of ``actions[t:t+H]`` within each episode, repeating its last frame.

    Frames of one episode must be contiguous (as the dataset writes them).
    """
    n = len(episode_index)
    starts = np.flatnonzero(np.r_[True, episode_index[1:] != episode_index[:-1]])
    ends = np.r_[starts[1:], n] - 1
    last = np.repeat(ends, np.diff(np.r_[starts, n]))
    offsets = np.arange(n)[:, None] + np.arange(chunk_size)[None, :]
    return np.minimum(offsets, last[:, None])


def load_npz(path: str | Path) -> dict[str, Any]:
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def _lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to 0 by the last step.

    The warm-up is fixed (500 steps by default), not a share of ``steps``: with ``steps <=
    warmup_steps`` it never finishes, the rate only climbs to ``lr * steps / warmup_steps`` and
    never decays.
    """
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def flow_matching_loss(
    net: VelocityNet, states: torch.Tensor, chunks: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """MSE to the straight-path velocity ``A - noise`` at ``A_tau = tau A + (1 - tau) noise``."""
    noise = torch.randn(chunks.shape, generator=generator)
    tau = torch.rand(chunks.shape[0], generator=generator)
    x_tau = tau[:, None, None] * chunks + (1.0 - tau[:, None, None]) * noise
    return torch.mean((net(x_tau, states, tau) - (chunks - noise)) ** 2)


SAVED_NET_LOSS_ROWS = 8192
"""Rows of the fixed batch that scores the saved net (all rows of a smaller dataset)."""


def fixed_batch_loss(net: VelocityNet, data: dict[str, Any], chunk_size: int, *, seed: int = 0) -> float:
    """Flow-matching loss of ``net`` on a fixed batch of the training data.

    Rows, noise and tau come from a generator of their own, so scoring the saved (EMA) net never
    touches the RNG that training or evaluation use; the same net and data always give the same
    number.
    """
    dataset = ChunkDataset.from_arrays(data, chunk_size)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(dataset.states), generator=generator)[:SAVED_NET_LOSS_ROWS]
    states, chunks = torch.from_numpy(dataset.states)[rows], torch.from_numpy(dataset.chunks)[rows]
    with torch.no_grad():
        return float(flow_matching_loss(net, states, chunks, generator))


def ema_init_share(config: TrainConfig) -> float:
    """Weight the EMA (no bias correction) still gives the untrained initial net after training."""
    return config.ema_decay**config.steps if config.ema_decay > 0 else 0.0


ProgressFn = Callable[[int, float], None]
"""Called after each step with ``(step, loss)``."""


def train_flow_policy(
    data: dict[str, Any], config: TrainConfig, *, on_step: ProgressFn | None = None
) -> tuple[FlowMatchingPolicy, list[float]]:
    """Train on dataset arrays; returns the (EMA) policy and the per-step training losses.

    Deterministic for a given ``config.seed`` and thread count.
    """
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    dataset = ChunkDataset.from_arrays(data, config.chunk_size)
    net_config = FlowNetConfig(
        chunk_size=config.chunk_size,
        action_dim=dataset.chunks.shape[-1],
        state_dim=dataset.states.shape[-1],
        hidden_dim=config.hidden_dim,
        depth=config.depth,
        time_embed_dim=config.time_embed_dim,
    )
    net = VelocityNet(net_config)
    ema = VelocityNet(net_config)
    ema.load_state_dict(net.state_dict())
    ema.requires_grad_(False)
    optimizer = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    states = torch.from_numpy(dataset.states)
    chunks = torch.from_numpy(dataset.chunks)
    losses: list[float] = []
    for step in range(config.steps):
        rows = torch.randint(len(states), (config.batch_size,), generator=generator)
        batch_states = states[rows]
        if config.state_noise > 0:
            batch_states = batch_states + config.state_noise * torch.randn(
                batch_states.shape, generator=generator
            )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        loss = flow_matching_loss(net, batch_states, chunks[rows], generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), net.parameters(), strict=True):
                e.lerp_(p, 1.0 - config.ema_decay)
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    meta = dataset.meta
    action_names = meta.get("action_names") or [f"action_{i}" for i in range(net_config.action_dim)]
    policy = FlowMatchingPolicy(
        ema if config.ema_decay > 0 else net,
        dataset.stats,
        action_names,
        state_names=meta.get("state_names"),
        control_hz=float(meta.get("control_hz", 15.0)),
        num_steps=config.num_steps,
        rtc=DEFAULT_RTC,
        seed=config.seed,
    )
    return policy, losses


# -- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    parser.add_argument(
        "--data",
        type=output_file,
        default=None,
        help="dataset .npz, generated if absent (default data/tabletop_<episodes>ep_seed<s>_noise<n>.npz)",
    )
    parser.add_argument(
        "--episodes", type=positive_int, default=DEFAULT_EPISODES, help="episodes when generating"
    )
    parser.add_argument(
        "--data-seed", type=non_negative_int, default=0, help="seed when generating the dataset"
    )
    parser.add_argument(
        "--action-noise", type=non_negative_float, default=DEFAULT_ACTION_NOISE,
        help="expert noise when generating",
    )  # fmt: skip
    parser.add_argument("--out", type=output_dir, default="runs/flow_policy", help="checkpoint directory")
    parser.add_argument(
        "--steps", type=positive_int, default=defaults.steps,
        help=f"optimiser steps (default {defaults.steps}); the learning rate warms up linearly over the "
        f"first {defaults.warmup_steps} (never finishing in a shorter run), then decays to 0; the saved "
        f"net is an EMA (decay {defaults.ema_decay}) that needs about 3000 steps to forget the untrained "
        "initial weights",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=non_negative_int, default=defaults.seed,
        help="seed of the initial weights, the batches and the training noise, and of the saved "
        "policy's own sampling noise",
    )  # fmt: skip
    parser.add_argument(
        "--batch-size", type=positive_int, default=defaults.batch_size, help="frames per optimiser step"
    )
    parser.add_argument(
        "--lr", type=positive_float, default=defaults.lr, help="peak learning rate (AdamW, after the warm-up)"
    )
    parser.add_argument(
        "--chunk-size", type=positive_int, default=defaults.chunk_size,
        help="actions the policy predicts per call",
    )  # fmt: skip
    parser.add_argument(
        "--hidden-dim", type=positive_int, default=defaults.hidden_dim, help="width of the velocity net"
    )
    parser.add_argument(
        "--depth", type=non_negative_int, default=defaults.depth, help="residual blocks of the velocity net"
    )
    parser.add_argument(
        "--state-noise", type=non_negative_float, default=defaults.state_noise,
        help="std of Gaussian noise on the normalised training states (robustness to drift; 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch CPU threads (1 = reproducible)"
    )
    parser.add_argument(
        "--eval-episodes", type=non_negative_int, default=0, help="evaluate in the sim afterwards (0: no)"
    )


def _ensure_dataset(args: argparse.Namespace) -> Path:
    """The dataset file: ``--data`` as is when it exists, else generated from the generation flags."""
    if args.data is None:
        name = f"tabletop_{args.episodes}ep_seed{args.data_seed}_noise{args.action_noise:g}.npz"
        args.data = checked("--data", output_file, Path("data") / name)  # before generating, not after
    if args.data.exists():
        return args.data
    from rollserve.sim.dataset import generate_dataset

    print(f"generating {args.episodes} expert episodes (seed {args.data_seed}) -> {args.data}")
    generate_dataset(args.episodes, args.data_seed, args.data, action_noise=args.action_noise)
    return args.data


def _load_training_data(path: Path) -> dict[str, Any]:
    """The dataset's arrays, refused up front when training on them could only crash or learn nothing."""
    try:
        data = load_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UsageError(f"argument --data: cannot read {path}: {exc}") from None
    missing = [key for key in ("states", "actions", "episode_index") if key not in data]
    if missing:
        raise UsageError(f"argument --data: {path} is not a demonstration dataset (no {', '.join(missing)})")
    if len(data["states"]) == 0:
        raise UsageError(f"argument --data: {path} holds no frames")
    if "success" in data and not np.asarray(data["success"], bool).any():
        raise UsageError(f"argument --data: {path} holds no successful episode to clone")
    return data


def _train_with_progress(data: dict[str, Any], config: TrainConfig) -> tuple[FlowMatchingPolicy, list[float]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("[bold]train policy"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[rate]:.0f} steps/s"),
        TimeRemainingColumn(),
    )
    started = time.perf_counter()
    with Progress(*columns, refresh_per_second=4) as progress:
        task = progress.add_task("train", total=config.steps, loss=float("nan"), rate=0.0)
        recent: list[float] = []

        def on_step(step: int, loss: float) -> None:
            recent.append(loss)
            if (step + 1) % 50 == 0 or step + 1 == config.steps:
                rate = (step + 1) / max(time.perf_counter() - started, 1e-9)
                progress.update(task, completed=step + 1, loss=float(np.mean(recent)), rate=rate)
                recent.clear()

        return train_flow_policy(data, config, on_step=on_step)


GENERATION_FLAGS = {"episodes": "episodes", "data_seed": "seed", "action_noise": "action_noise"}
"""Dataset-generation flag -> its key in the recorded ``generated_with``."""


def _generated_with(data: dict[str, Any]) -> dict[str, Any] | None:
    """How the dataset file says it was generated (from its ``meta_json``), or None when it does not.

    Read from the file rather than the flags: a ``--data`` file that already exists is used as is,
    whatever ``--episodes``, ``--data-seed`` and ``--action-noise`` say.
    """
    meta_raw = data.get("meta_json")
    meta = json.loads(str(meta_raw)) if meta_raw is not None else {}
    keys = {"episodes": "num_episodes", "seed": "seed", "action_noise": "action_noise"}
    if not all(key in meta for key in keys.values()):
        return None
    return {name: meta[key] for name, key in keys.items()}


def _command_line(args: argparse.Namespace, generated_with: dict[str, Any] | None) -> str:
    """The full command that reproduces this run (every option spelled out, shell-quoted).

    The generation flags are the dataset's own (``generated_with``), so the command regenerates the
    same file where it is missing; they are left out when the file does not record them.
    """
    parts = ["rollserve", "train", "policy"]
    for key, value in vars(args).items():
        if key in {"command", "eval_episodes", "out"} or callable(value):
            continue
        if key in GENERATION_FLAGS:
            if generated_with is None:
                continue
            value = generated_with[GENERATION_FLAGS[key]]
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    data_path = _ensure_dataset(args)
    data = _load_training_data(data_path)
    config = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        chunk_size=args.chunk_size,
        hidden_dim=args.hidden_dim,
        depth=args.depth,
        state_noise=args.state_noise,
    )
    started = time.perf_counter()
    policy, losses = _train_with_progress(data, config)
    seconds = time.perf_counter() - started
    generated_with = _generated_with(data)
    policy.info = {
        "command": _command_line(args, generated_with),
        "train_config": asdict(config),
        "dataset": {
            "file": data_path.name,
            "frames": len(data["states"]),
            "episodes": len(data["success"]) if "success" in data else None,
            "generated_with": generated_with,
        },
        "final_loss_avg100": float(np.mean(losses[-100:])),  # the online net's, on its training batches
        "final_loss_saved_net": fixed_batch_loss(policy.net, data, config.chunk_size),
        "train_seconds": round(seconds, 1),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    out = save_flow_policy(policy, args.out)  # before evaluating: a failed evaluation loses no training
    _report(policy, config, seconds)
    if args.eval_episodes > 0:
        _evaluate(policy, args.eval_episodes)
        save_flow_policy(policy, out)  # the same weights, now with the evaluation in config.json
    print(f"checkpoint -> {out}")
    return 0


def _report(policy: FlowMatchingPolicy, config: TrainConfig, seconds: float) -> None:
    """Both losses, named: the online net's during training and the saved (EMA) net's."""
    print(
        f"trained {config.steps} steps in {seconds:.0f} s: training loss (online net, mean of the last "
        f"{min(100, config.steps)} steps) {policy.info['final_loss_avg100']:.4f}, "
        f"saved EMA net loss (fixed batch) {policy.info['final_loss_saved_net']:.4f}"
    )
    share = ema_init_share(config)
    if share > 0.05:
        print(
            f"note: the saved EMA net still weighs the untrained initial net {share:.0%}; "
            "it needs about 3000 steps (--steps) to leave it behind"
        )


def _evaluate(policy: FlowMatchingPolicy, episodes: int) -> None:
    """Closed-loop success in the sim, stored in ``policy.info``; chunks under 8 execute whole."""
    from rollserve.training.policy_eval import evaluate_policy

    result = evaluate_policy(policy, episodes=episodes, execute_steps=min(8, policy.metadata.chunk_size))
    policy.info["evaluation"] = result
    print(f"success {result['successes']}/{result['episodes']} = {result['success_rate']:.0%}")


def synthetic_dataset(
    episodes: int = 20, length: int = 40, action_dim: int = 8, seed: int = 0
) -> dict[str, Any]:
    """A tiny dataset in the sim dataset's format: smooth oscillations whose phase is in the state.

    For tests and smoke runs without the simulator.
    """
    rng = np.random.default_rng(seed)
    states, actions, episode_index, frame_index = [], [], [], []
    for episode in range(episodes):
        amp = rng.uniform(0.5, 1.5, action_dim)
        phase = rng.uniform(0, 2 * np.pi, action_dim)
        t = np.arange(length)[:, None]
        angle = 0.2 * t + phase
        actions.append(amp * np.sin(angle))
        states.append(np.concatenate([np.cos(angle[:, :2]), np.sin(angle[:, :2]), amp[None, :2] + 0 * t], 1))
        episode_index.append(np.full(length, episode))
        frame_index.append(np.arange(length))
    meta = {"action_names": [f"a{i}" for i in range(action_dim)], "state_names": None, "control_hz": 10.0}
    return {
        "states": np.concatenate(states).astype(np.float32),
        "actions": np.concatenate(actions).astype(np.float32),
        "episode_index": np.concatenate(episode_index).astype(np.int64),
        "frame_index": np.concatenate(frame_index).astype(np.int64),
        "success": np.ones(episodes, bool),
        "meta_json": np.array(json.dumps(meta)),
    }
