"""Closed-loop evaluation of a chunking policy in the simulated pick-and-place task.

Synchronous execution, no delay: observe, predict a chunk, execute its first ``execute_steps``
actions, repeat until the episode ends. Episode ``i`` resets the env with seed ``first_seed + i``,
and chunk noise is seeded per call, so a result is exactly reproducible.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.policy import make_processors

EVAL_FIRST_SEED = 100_000
"""Far from the seeds the dataset generator uses, so evaluation layouts are unseen."""


def run_episode(policy: FlowMatchingPolicy, env: Any, seed: int, execute_steps: int) -> dict[str, Any]:
    """One episode; returns ``success``, ``steps`` and the number of chunks inferred."""
    processors = make_processors(policy)
    obs, info = env.reset(seed=seed)
    steps = chunks = 0
    done = False
    while not done:
        batch = processors.pre(obs)
        batch["seed"] = seed * 1000 + chunks
        actions = processors.post(policy.predict_action_chunk(batch))
        chunks += 1
        for action in actions[:execute_steps]:
            obs, _, terminated, truncated, info = env.step(action)
            steps += 1
            done = terminated or truncated
            if done:
                break
    return {"success": bool(info["success"]), "steps": steps, "chunks": chunks}


def evaluate_policy(
    policy: FlowMatchingPolicy,
    *,
    episodes: int = 50,
    first_seed: int = EVAL_FIRST_SEED,
    execute_steps: int = 8,
) -> dict[str, Any]:
    """Success rate over ``episodes`` seeded episodes (synchronous execution, no inference delay)."""
    from rollserve.sim.env import TabletopPickPlaceEnv

    env = TabletopPickPlaceEnv()
    started = time.perf_counter()
    try:
        results = [run_episode(policy, env, first_seed + i, execute_steps) for i in range(episodes)]
    finally:
        env.close()
    successes = sum(r["success"] for r in results)
    return {
        "episodes": episodes,
        "successes": successes,
        "success_rate": successes / max(episodes, 1),
        "first_seed": first_seed,
        "execute_steps": execute_steps,
        "mean_steps": float(np.mean([r["steps"] for r in results])) if results else 0.0,
        "failed_seeds": [first_seed + i for i, r in enumerate(results) if not r["success"]],
        "seconds": round(time.perf_counter() - started, 1),
    }
