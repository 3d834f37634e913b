"""Closed-loop score of a chunking policy in the simulated pick-and-place task.

Default: synchronous execution, no delay (observe, predict a chunk, execute its first
``execute_steps`` actions, repeat). With ``inference_delay = d > 0`` it simulates asynchronous
execution: inference starts every ``execute_steps`` steps, the robot keeps executing the old chunk
for ``d`` steps, then the new chunk takes over from its index ``d`` (``rtc.queue.ActionQueue``).
With ``rtc=True`` the new chunk is guided by the old chunk's left-over; without, it is the naive
asynchronous baseline whose chunk boundaries jump. Scoring reuses ``rollserve.sim.evaluate``;
chunk noise is seeded from the episode seed, so every result is exactly reproducible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.policy import make_processors
from rollserve.rtc.config import RTCConfig
from rollserve.rtc.queue import ActionQueue

EVAL_FIRST_SEED = 100_000
"""Evaluation layouts: reset seeds unlike the dataset's (which derive from a SeedSequence)."""


class ChunkActor:
    """Plays a policy's chunks one action per env step; records the action jump at chunk switches."""

    def __init__(
        self,
        policy: FlowMatchingPolicy,
        seed: int,
        *,
        execute_steps: int = 8,
        inference_delay: int = 0,
        rtc: bool = False,
    ) -> None:
        chunk_size = policy.metadata.chunk_size
        if not 0 <= inference_delay <= min(execute_steps, chunk_size - execute_steps):
            raise ValueError("need 0 <= delay <= min(execute_steps, chunk_size - execute_steps)")
        self.policy, self.seed = policy, seed
        self.processors = make_processors(policy)
        self.execute_steps, self.delay, self.rtc = execute_steps, inference_delay, rtc
        self.queue = ActionQueue(RTCConfig(enabled=True))
        self.pending: tuple[np.ndarray, np.ndarray] | None = None
        self.countdown = 0
        self.since_trigger = 0
        self.chunks = 0
        self.last_action: np.ndarray | None = None
        self.switch_jumps: list[float] = []
        self.step_sizes: list[float] = []

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        switched = False
        if self.pending is not None and self.countdown == 0:
            self.queue.merge(*self.pending, real_delay=self.delay, action_index_before_inference=None)
            self.pending, switched = None, True
        if self.pending is None and (self.queue.empty() or self.since_trigger >= self.execute_steps):
            switched |= self._start_inference(obs)
        action = self.queue.get()
        if action is None:  # starved: hold the last target
            action = self.last_action
        if self.pending is not None:
            self.countdown -= 1
        self.since_trigger += 1
        if self.last_action is not None:
            jump = float(np.linalg.norm(action[:7] - self.last_action[:7]))
            (self.switch_jumps if switched else self.step_sizes).append(jump)
        self.last_action = action
        return action

    def _start_inference(self, obs: dict[str, Any]) -> bool:
        """Infer from ``obs``; returns True when the chunk takes over at once (no delay)."""
        batch = self.processors.pre(obs)
        batch["seed"] = self.seed * 1000 + self.chunks
        first = self.queue.empty()
        prefix = self.queue.get_left_over() if self.rtc and not first else None
        delay = 0 if first else self.delay
        model = self.policy.predict_action_chunk(batch, inference_delay=delay, prev_chunk_left_over=prefix)
        chunk = (model, self.processors.post(model))
        self.chunks += 1
        self.since_trigger = 0
        if delay == 0:
            self.queue.merge(*chunk, real_delay=0, action_index_before_inference=None)
            return not first
        self.pending, self.countdown = chunk, delay
        return False


def evaluate_policy(
    policy: FlowMatchingPolicy,
    *,
    episodes: int = 50,
    first_seed: int = EVAL_FIRST_SEED,
    execute_steps: int = 8,
    inference_delay: int = 0,
    rtc: bool = False,
) -> dict[str, Any]:
    """Success rate over ``episodes`` seeded episodes, and how much actions jump at chunk switches."""
    from rollserve.sim.evaluate import evaluate

    actors: list[ChunkActor] = []

    def start_episode(obs: dict[str, Any]) -> ChunkActor:
        seed = first_seed + len(actors)
        actors.append(
            ChunkActor(policy, seed, execute_steps=execute_steps, inference_delay=inference_delay, rtc=rtc)
        )
        return actors[-1]

    result = evaluate(start_episode, range(first_seed, first_seed + episodes))
    jumps = [j for actor in actors for j in actor.switch_jumps]
    steps = [s for actor in actors for s in actor.step_sizes]
    return {
        "episodes": episodes,
        "successes": int(sum(result.successes)),
        "success_rate": result.success_rate,
        "first_seed": first_seed,
        "execute_steps": execute_steps,
        "inference_delay": inference_delay,
        "rtc": rtc,
        "mean_steps": float(np.mean(result.episode_steps)) if episodes else 0.0,
        "mean_switch_jump_rad": float(np.mean(jumps)) if jumps else 0.0,
        "mean_step_rad": float(np.mean(steps)) if steps else 0.0,
        "failed_seeds": [s for s, ok in zip(result.seeds, result.successes, strict=True) if not ok],
        "seconds": round(result.seconds, 1),
    }
