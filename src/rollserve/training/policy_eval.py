"""Closed-loop score of a chunking policy in the simulated pick-and-place task.

Synchronous execution, no delay: observe, predict a chunk, execute its first ``execute_steps``
actions, observe again. Scoring reuses ``rollserve.sim.evaluate`` (the loop the expert is scored
with). Chunk noise is seeded from the episode seed, so a result is exactly reproducible.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.policy import make_processors

EVAL_FIRST_SEED = 100_000
"""Far from the dataset's episode seeds' pattern; evaluation layouts are unseen in training."""


class ChunkActor:
    """Plays a policy's chunks one action per env step, re-planning every ``execute_steps``."""

    def __init__(self, policy: FlowMatchingPolicy, execute_steps: int, seed: int) -> None:
        self.policy = policy
        self.processors = make_processors(policy)
        self.execute_steps = execute_steps
        self.seed = seed
        self.chunks = 0
        self.queue: deque[np.ndarray] = deque()

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        if not self.queue:
            batch = self.processors.pre(obs)
            batch["seed"] = self.seed * 1000 + self.chunks
            chunk = self.processors.post(self.policy.predict_action_chunk(batch))
            self.queue.extend(chunk[: self.execute_steps])
            self.chunks += 1
        return self.queue.popleft()


def evaluate_policy(
    policy: FlowMatchingPolicy,
    *,
    episodes: int = 50,
    first_seed: int = EVAL_FIRST_SEED,
    execute_steps: int = 8,
) -> dict[str, Any]:
    """Success rate over ``episodes`` seeded episodes (synchronous execution, no inference delay)."""
    from rollserve.sim.evaluate import evaluate

    seeds = range(first_seed, first_seed + episodes)
    seed_iter = iter(seeds)
    result = evaluate(lambda obs: ChunkActor(policy, execute_steps, next(seed_iter)), seeds)
    return {
        "episodes": episodes,
        "successes": int(sum(result.successes)),
        "success_rate": result.success_rate,
        "first_seed": first_seed,
        "execute_steps": execute_steps,
        "mean_steps": float(np.mean(result.episode_steps)) if episodes else 0.0,
        "failed_seeds": [s for s, ok in zip(result.seeds, result.successes, strict=True) if not ok],
        "seconds": round(result.seconds, 1),
    }
