"""Evaluate the reference policy inside the learned world model, the video world model and the
simulator, through the same gymnasium API, and print the returns. Trains nothing.

    python examples/evaluate_in_worlds.py --episodes 5

Each world is served by rollserve on a local port, exactly as ``rollserve serve --world learned``
(or ``--world video`` / ``--world sim``) would serve it; ``RolloutEnv(url)`` works the same against a
remote server. The video world's session renders: its observation is ``{"state", "images"}`` (the
imagined camera frame and the state head's prediction), and the policy reads the state.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rollserve.client.rollout_env import RolloutEnv
from rollserve.models.checkpoint import load_default
from rollserve.models.worlds import WorldLoadError, load_world, world_builder
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

EXECUTE = 8  # actions played from each predicted chunk before predicting again
NOISE_STEPS = 1000  # the policy's noise seed is ``seed * NOISE_STEPS + step`` (episodes are shorter)
# Seeds run from 0 (gymnasium refuses negative ones) to below this: the rollout API takes seeds
# below 2**63, and the noise seed must fit torch's 64-bit generator.
SEED_END = min(2**63, (2**64 - NOISE_STEPS) // NOISE_STEPS)


def episode_return(env: RolloutEnv, policy, seed: int) -> tuple[float, bool]:  # type: ignore[no-untyped-def]
    processors = policy.make_processors()
    obs, _ = env.reset(seed=seed)
    total, steps, done, terminated = 0.0, 0, False, False
    while not done:
        batch = processors.pre({"state": obs["state"] if isinstance(obs, dict) else obs})
        batch["seed"] = seed * NOISE_STEPS + steps  # the same policy noise in both worlds
        for action in processors.post(policy.predict_action_chunk(batch))[:EXECUTE]:
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + reward, steps + 1, terminated or truncated
            if done:
                break
    return total, terminated


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5, help="episodes per world (at least 1)")
    parser.add_argument("--first-seed", type=int, default=100_000, help="episode i: seed first + i")
    parser.add_argument("--worlds", nargs="+", default=["learned", "video", "sim"])
    args = parser.parse_args(argv)
    _check_args(parser, args)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible returns; put back after, for whoever called main()
    try:
        return _evaluate(args)
    finally:
        torch.set_num_threads(threads)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before any world loads, what would print ``nan`` or fail at the first reset."""
    if args.episodes < 1:
        parser.error(f"argument --episodes: must be at least 1, got {args.episodes}")
    if args.first_seed < 0 or args.first_seed + args.episodes > SEED_END:
        parser.error(
            f"argument --first-seed: seeds first .. first + episodes - 1 must lie in [0, {SEED_END}), "
            f"got {args.first_seed} .. {args.first_seed + args.episodes - 1}"
        )
    for world in args.worlds:  # resolved, not loaded: a typo fails now, not after the other worlds ran
        try:
            world_builder(world)
        except WorldLoadError as exc:
            parser.error(f"argument --worlds: {exc}")


def _evaluate(args: argparse.Namespace) -> dict[str, list[float]]:
    policy = load_default()
    seeds = range(args.first_seed, args.first_seed + args.episodes)
    returns: dict[str, list[float]] = {}
    for world in args.worlds:
        service = RolloutService(load_world(world))
        try:
            with serving(create_app(ServerSettings(), rollout=service)) as server:
                env = RolloutEnv(server.http_url, render={} if world == "video" else None)
                try:
                    results = [episode_return(env, policy, seed) for seed in seeds]
                finally:
                    env.close()
        finally:
            service.close()
        returns[world] = [r for r, _ in results]
        success = np.mean([ok for _, ok in results])
        print(f"{world:>8} world: mean return {np.mean(returns[world]):7.2f}  success {success:.0%}")
    return returns


if __name__ == "__main__":
    main()
