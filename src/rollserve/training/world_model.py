"""`rollserve train world`: collect simulator transitions of the tabletop task, fit the learned world
model, and measure its error against the simulator over a horizon.

Data: the scripted expert with Gaussian noise on the *executed* joint targets (the executed action is
recorded, so each transition is what the physics really did), at several noise levels for coverage.
The error report replays held-out episodes' actions open-loop in both worlds from the same start.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollserve.cli import UsageError, checked, non_negative_float, non_negative_int, output_dir, positive_int
from rollserve.models.learned_world import (
    LearnedWorld,
    LearnedWorldConfig,
    StartDistribution,
    TaskRule,
    WorldNet,
    default_checkpoint_dir,
    save_world_model,
)
from rollserve.models.world import WorldInit, WorldStep

HORIZONS = (1, 5, 10, 20, 40, 80)

Log = Callable[[str], None]
"""Where progress lines go (``print`` on the command line)."""


@dataclass(frozen=True)
class Transitions:
    """Aligned arrays, one row per control step: state, its last change, executed action, next state."""

    states: np.ndarray
    changes: np.ndarray
    actions: np.ndarray
    next_states: np.ndarray


@dataclass(frozen=True)
class Episode:
    seed: int
    states: np.ndarray  # (T + 1, S)
    actions: np.ndarray  # (T, A)
    rewards: np.ndarray  # (T,)


def collect(
    num_episodes: int,
    seed: int,
    noise_levels: tuple[float, ...],
    steps: int,
    *,
    label: str = "",
    log: Log | None = None,
) -> list[Episode]:
    """Expert episodes in the simulator with noisy executed actions (the noise level cycles)."""
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.expert import ScriptedExpert

    env = TabletopPickPlaceEnv(max_episode_steps=steps, terminate_on_success=False)
    expert = ScriptedExpert()
    noise_rng = np.random.default_rng([seed, 7])
    seeds = np.random.SeedSequence(seed).generate_state(num_episodes, dtype=np.uint32)
    episodes = []
    started = time.perf_counter()
    for i, ep_seed in enumerate(seeds):
        sigma = noise_levels[i % len(noise_levels)]
        obs, _ = env.reset(seed=int(ep_seed))
        expert.reset(obs)
        states, actions, rewards = [obs["state"]], [], []
        for _ in range(steps):
            action = expert.act(obs).copy()
            action[:7] += noise_rng.normal(0.0, sigma, size=7).astype(np.float32)
            action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, reward, _, _, _ = env.step(action)
            states.append(obs["state"])
            actions.append(action)
            rewards.append(reward)
        episodes.append(Episode(int(ep_seed), np.asarray(states), np.asarray(actions), np.asarray(rewards)))
        if log is not None and _due(i, num_episodes, parts=4):
            log(f"collected {i + 1}/{num_episodes} {label} episodes ({time.perf_counter() - started:.0f} s)")
    env.close()
    return episodes


def to_transitions(episodes: list[Episode]) -> Transitions:
    parts: list[tuple[np.ndarray, ...]] = []
    for ep in episodes:
        s = ep.states[:-1]
        change = np.diff(ep.states, axis=0, prepend=ep.states[:1])[:-1]
        parts.append((s, change, ep.actions, ep.states[1:]))
    return Transitions(*(np.concatenate(cols).astype(np.float32) for cols in zip(*parts, strict=True)))


def task_config(ensemble: int, hidden: int, depth: int) -> LearnedWorldConfig:
    """The architecture plus everything the learned world copies from the simulator."""
    from rollserve.sim.env import HOME_NOISE, HOME_QPOS, TabletopPickPlaceEnv
    from rollserve.sim.layout import CONTROL_HZ, MAX_EPISODE_STEPS, STATE_NAMES
    from rollserve.sim.task import CUBE_REST_Z, TaskConfig

    task = TaskConfig()
    space = TabletopPickPlaceEnv().action_space
    return LearnedWorldConfig(
        state_names=tuple(STATE_NAMES),
        hidden=hidden,
        depth=depth,
        ensemble=ensemble,
        control_hz=CONTROL_HZ,
        max_episode_steps=MAX_EPISODE_STEPS,
        action_low=tuple(float(x) for x in space.low),
        action_high=tuple(float(x) for x in space.high),
        start=StartDistribution(
            home_qpos=tuple(float(x) for x in HOME_QPOS),
            home_noise=HOME_NOISE,
            cube_x=task.cube_x,
            cube_y=task.cube_y,
            target_x=task.target_x,
            target_y=task.target_y,
            cube_rest_z=CUBE_REST_Z,
        ),
        rule=TaskRule(task.success_radius, task.rest_tolerance, CUBE_REST_Z),
    )


def fit(
    config: LearnedWorldConfig,
    episodes: list[Episode],
    iterations: int,
    batch: int,
    seed: int,
    *,
    unroll: int = 8,
    unroll_iterations: int = 0,
    log: Log | None = None,
) -> WorldNet:
    """One-step regression of normalised state changes, then (optionally) a multi-step phase: each
    member rolls its own prediction forward ``unroll`` steps, so errors that compound are penalised."""
    torch.manual_seed(seed)
    net = WorldNet(config)
    data = to_transitions(episodes)
    s, c, a, n = (torch.as_tensor(x) for x in (data.states, data.changes, data.actions, data.next_states))
    feats = net.features(s, c, a)
    target = n - s
    net.in_mean.copy_(feats.mean(0))
    net.in_std.copy_(_std_floor(feats.std(0)))
    net.out_mean.copy_(target.mean(0))
    net.out_std.copy_(target.std(0).where(target.std(0) > 1e-6, 0.0))  # 0: never changes (the target)
    target_n = (target - net.out_mean) / _std_floor(net.out_std)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    opt = torch.optim.AdamW(net.mlp.parameters(), lr=2e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, iterations)
    started = time.perf_counter()
    for it in range(iterations):
        idx = torch.randint(len(s), (config.ensemble, batch), generator=gen)
        x = (feats[idx] - net.in_mean) / net.in_std
        loss = torch.nn.functional.mse_loss(net.mlp(x), target_n[idx])
        _descend(opt, loss)
        sched.step()
        if log is not None and _due(it, iterations):
            elapsed = time.perf_counter() - started
            log(f"one-step fit {it + 1}/{iterations}: mse {loss.item():.5f} ({elapsed:.0f} s)")
    if unroll_iterations:
        _fit_unrolled(net, episodes, unroll, unroll_iterations, batch, gen, log)
    return net.eval()


def _fit_unrolled(
    net: WorldNet,
    episodes: list[Episode],
    unroll: int,
    iterations: int,
    batch: int,
    gen: torch.Generator,
    log: Log | None = None,
) -> None:
    states = torch.as_tensor(np.stack([ep.states for ep in episodes]), dtype=torch.float32)  # (N, T+1, S)
    actions = torch.as_tensor(np.stack([ep.actions for ep in episodes]), dtype=torch.float32)  # (N, T, A)
    horizon = actions.shape[1]
    opt = torch.optim.AdamW(net.mlp.parameters(), lr=3e-4, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, iterations)
    e, scale = net.config.ensemble, _std_floor(net.out_std)
    started = time.perf_counter()
    for it in range(iterations):
        ep = torch.randint(len(episodes), (e, batch), generator=gen)
        t0 = torch.randint(horizon - unroll, (e, batch), generator=gen)
        state = states[ep, t0]
        change = torch.where((t0 > 0).unsqueeze(-1), state - states[ep, (t0 - 1).clamp(min=0)], 0.0)
        loss = torch.zeros(())
        for k in range(unroll):
            x = (net.features(state, change, actions[ep, t0 + k]) - net.in_mean) / net.in_std
            change = net.denormalise(net.mlp(x))
            state = state + change
            loss = loss + torch.mean(((state - states[ep, t0 + k + 1]) / scale) ** 2)
        _descend(opt, loss / unroll)
        sched.step()
        if log is not None and _due(it, iterations):
            elapsed = time.perf_counter() - started
            log(f"unrolled fit {it + 1}/{iterations}: loss {loss.item() / unroll:.5f} ({elapsed:.0f} s)")


def _due(index: int, total: int, parts: int = 10) -> bool:
    """Whether step ``index`` (0-based) of ``total`` gets a progress line: about ``parts`` a phase,
    so a 9-minute run shows it is alive without flooding the terminal."""
    return (index + 1) % max(1, total // parts) == 0 or index + 1 == total


def _log(message: str) -> None:
    print(message, flush=True)


def _descend(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _std_floor(std: torch.Tensor) -> torch.Tensor:
    """Quantities that never vary (the target's position) are left unscaled."""
    return torch.where(std < 1e-6, torch.ones_like(std), std)


def horizon_errors(world: LearnedWorld, episodes: list[Episode]) -> dict[str, Any]:
    """Open-loop error of the learned world against the simulator, from the same start and actions."""
    starts = world.initial_states([WorldInit(seed=ep.seed) for ep in episodes])
    states = [out.state for out in starts]  # type: ignore[union-attr]
    length = min(len(ep.actions) for ep in episodes)
    joint, gripper, cube, reward, agree = [], [], [], [], []
    for t in range(length):
        outs = world.step_batch(
            [WorldStep(st, ep.actions[t]) for st, ep in zip(states, episodes, strict=True)]
        )
        states = [o.state for o in outs]  # type: ignore[union-attr]
        pred = np.stack([o.observation for o in outs])  # type: ignore[union-attr]
        true = np.stack([ep.states[t + 1] for ep in episodes])
        joint.append(np.sqrt(np.mean((pred[:, :7] - true[:, :7]) ** 2, axis=1)))
        gripper.append(np.abs(pred[:, 7] - true[:, 7]))
        cube.append(np.linalg.norm(pred[:, 8:11] - true[:, 8:11], axis=1))
        rewards = np.array([o.reward for o in outs])  # type: ignore[union-attr]
        true_rewards = np.array([ep.rewards[t] for ep in episodes])
        reward.append(np.abs(rewards - true_rewards))
        agree.append((rewards > 5.0) == (true_rewards > 5.0))  # the success bonus is 10
    table = {}
    for h in (h for h in HORIZONS if h <= length):
        table[str(h)] = {
            "joint_rmse_rad": float(np.mean(joint[h - 1])),
            "gripper_abs": float(np.mean(gripper[h - 1])),
            "cube_pos_err_m": float(np.mean(cube[h - 1])),
            "cube_pos_err_m_p90": float(np.percentile(cube[h - 1], 90)),
            "reward_abs_err": float(np.mean(reward[h - 1])),
            "success_agreement": float(np.mean(agree[h - 1])),
        }
    return {"episodes": len(episodes), "horizon_steps": table}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=positive_int, default=240, help="training episodes to collect")
    parser.add_argument(
        "--eval-episodes", type=positive_int, default=40, help="held-out episodes for the error report"
    )
    parser.add_argument("--steps", type=positive_int, default=100, help="control steps per episode")
    parser.add_argument(
        "--noise", type=non_negative_float, nargs="+", default=[0.0, 0.02, 0.05, 0.1],
        help="action noise (rad)",
    )  # fmt: skip
    parser.add_argument("--ensemble", type=positive_int, default=5, help="networks in the ensemble")
    parser.add_argument("--hidden", type=positive_int, default=256, help="hidden units per layer")
    parser.add_argument("--depth", type=non_negative_int, default=2, help="hidden layers")
    parser.add_argument("--iterations", type=positive_int, default=6000, help="one-step training iterations")
    parser.add_argument("--batch", type=positive_int, default=256, help="transitions per batch")
    parser.add_argument(
        "--unroll", type=positive_int, default=12, help="steps of the multi-step phase (below --steps)"
    )
    parser.add_argument(
        "--unroll-iterations", type=non_negative_int, default=3000, help="0 skips the multi-step phase"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="training seed")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--out", type=output_dir, default=None, help="checkpoint directory (default: the shipped one)"
    )


def _check_arguments(args: argparse.Namespace) -> Path:
    """Cross-flag checks argparse cannot do; returns the checkpoint directory."""
    if args.unroll_iterations and args.unroll >= args.steps:
        raise UsageError(
            f"argument --unroll: must be below --steps ({args.steps}) for the multi-step phase "
            "(or --unroll-iterations 0)"
        )
    return checked("--out", output_dir, args.out or default_checkpoint_dir())


def main(args: argparse.Namespace) -> int:
    out_dir = _check_arguments(args)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    train_eps = collect(args.episodes, args.seed, tuple(args.noise), args.steps, label="training", log=_log)
    eval_eps = collect(
        args.eval_episodes, args.seed + 10_000, (0.02,), args.steps, label="held-out", log=_log
    )
    transitions = sum(len(ep.actions) for ep in train_eps)
    print(f"collected {transitions} transitions in {time.perf_counter() - started:.0f} s")
    config = task_config(args.ensemble, args.hidden, args.depth)
    net = fit(
        config,
        train_eps,
        args.iterations,
        args.batch,
        args.seed,
        unroll=args.unroll,
        unroll_iterations=args.unroll_iterations,
        log=_log,
    )
    training = {
        "episodes": args.episodes,
        "transitions": transitions,
        "unroll": args.unroll,
        "unroll_iterations": args.unroll_iterations,
        "noise_levels": list(args.noise),
        "iterations": args.iterations,
        "batch": args.batch,
        "seed": args.seed,
        "threads": args.threads,
    }
    net.config = replace(config, training={**training, "seconds": round(time.perf_counter() - started, 1)})
    out = save_world_model(net, out_dir)  # before the report: a failing report loses no training
    report = horizon_errors(LearnedWorld(net), eval_eps)
    training.update(seconds=round(time.perf_counter() - started, 1), evaluation=report)
    net.config = replace(config, training=training)
    save_world_model(net, out)
    print(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0
