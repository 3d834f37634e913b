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
from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

EXECUTE = 8  # actions played from each predicted chunk before predicting again


def episode_return(env: RolloutEnv, policy, seed: int) -> tuple[float, bool]:  # type: ignore[no-untyped-def]
    processors = policy.make_processors()
    obs, _ = env.reset(seed=seed)
    total, steps, done, terminated = 0.0, 0, False, False
    while not done:
        batch = processors.pre({"state": obs["state"] if isinstance(obs, dict) else obs})
        batch["seed"] = seed * 1000 + steps  # the same policy noise in both worlds
        for action in processors.post(policy.predict_action_chunk(batch))[:EXECUTE]:
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + reward, steps + 1, terminated or truncated
            if done:
                break
    return total, terminated


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=100_000)
    parser.add_argument("--worlds", nargs="+", default=["learned", "video", "sim"])
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible returns; put back after, for whoever called main()
    try:
        return _evaluate(args)
    finally:
        torch.set_num_threads(threads)


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
