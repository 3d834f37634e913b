"""Run a policy on seeded episodes and count successes: the one scoring loop for experts and policies."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollserve.sim.env import TabletopPickPlaceEnv

Actor = Callable[[dict[str, Any]], np.ndarray]
"""Observation -> action (8,)."""


@dataclass(frozen=True)
class EvalResult:
    seeds: tuple[int, ...]
    successes: tuple[bool, ...]
    episode_steps: tuple[int, ...]
    seconds: float

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.successes)) if self.successes else 0.0

    @property
    def steps_per_second(self) -> float:
        return sum(self.episode_steps) / self.seconds if self.seconds > 0 else 0.0


def evaluate(
    start_episode: Callable[[dict[str, Any]], Actor],
    seeds: Iterable[int],
    env: TabletopPickPlaceEnv | None = None,
) -> EvalResult:
    """``start_episode(first_obs)`` returns the actor for that episode; each seed is one episode."""
    env = env or TabletopPickPlaceEnv()
    seeds = tuple(int(s) for s in seeds)
    successes, lengths = [], []
    started = time.perf_counter()
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        act = start_episode(obs)
        steps = 0
        while True:
            obs, _, terminated, truncated, info = env.step(act(obs))
            steps += 1
            if terminated or truncated:
                break
        successes.append(bool(info["success"]))
        lengths.append(steps)
    return EvalResult(seeds, tuple(successes), tuple(lengths), time.perf_counter() - started)


def evaluate_expert(seeds: Iterable[int]) -> EvalResult:
    """The scripted expert's score (the dataset's quality bar)."""
    from rollserve.sim.expert import ScriptedExpert

    expert = ScriptedExpert()

    def start(obs: dict[str, Any]) -> Actor:
        expert.reset(obs)
        return expert.act

    return evaluate(start, seeds)


def main(argv: list[str] | None = None) -> int:
    """Re-measure README's figures: the expert over seeds 0.., or the shipped policy over 100000.."""
    import argparse

    from rollserve.cli import positive_int

    parser = argparse.ArgumentParser(prog="python -m rollserve.sim.evaluate", description=main.__doc__)
    parser.add_argument("--episodes", type=positive_int, default=100, help="seeded episodes (default 100)")
    parser.add_argument(
        "--policy", action="store_true",
        help="score the shipped flow policy (synchronous, 8 actions per chunk, unseen seeds from 100000) "
        "instead of the scripted expert (seeds from 0)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.policy:
        from rollserve.models.checkpoint import load_default
        from rollserve.training.policy_eval import evaluate_policy

        scored = evaluate_policy(load_default(), episodes=args.episodes)
        first, last = scored["first_seed"], scored["first_seed"] + args.episodes - 1
        print(
            f"policy: {scored['successes']}/{args.episodes} successes over seeds {first}..{last}, "
            f"mean episode {scored['mean_steps']:.1f} steps"
        )
        return 0
    result = evaluate_expert(range(args.episodes))
    print(
        f"expert: {sum(result.successes)}/{len(result.seeds)} successes over seeds 0..{result.seeds[-1]}, "
        f"mean episode {np.mean(result.episode_steps):.1f} steps, {result.steps_per_second:.0f} steps/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
