"""What one episode leaves behind (a per-tick trace) and the figures the demo and the sweep report.

A *tick* is one control period. On each tick the robot either executes an action taken from some
chunk, or stalls (no action ready: it holds its last target). The boundary discontinuity compares
consecutive executed actions: a pair whose actions come from different chunks is a chunk boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

JOINTS = slice(0, 7)
"""The arm's joint targets in the 8-dim action; the gripper is left out of the discontinuity."""


@dataclass
class EpisodeTrace:
    """Per tick: the executed action (None on a stall) and the id of the chunk it came from."""

    seed: int
    actions: list[np.ndarray | None] = field(default_factory=list)
    chunk_ids: list[int | None] = field(default_factory=list)
    success: bool = False
    seconds: float = 0.0  # wall time from the first tick to the end (simulated: ticks * dt)
    first_chunk_s: float = 0.0  # the wait for the first chunk, at rest, before the first tick
    chunks: dict[int, np.ndarray] = field(default_factory=dict)  # chunk id -> the queue it became
    snapshots: list[bytes] = field(default_factory=list)  # env snapshot per tick (for the video)

    def record(self, action: np.ndarray | None, chunk_id: int | None) -> None:
        self.actions.append(None if action is None else np.asarray(action, dtype=np.float32).copy())
        self.chunk_ids.append(chunk_id if action is not None else None)

    @property
    def ticks(self) -> int:
        return len(self.actions)

    @property
    def stalls(self) -> int:
        return sum(action is None for action in self.actions)

    @property
    def executed(self) -> int:
        return self.ticks - self.stalls


@dataclass(frozen=True)
class Jumps:
    """Joint-space step sizes ``||a_t - a_prev||_2`` (rad) of consecutive executed actions."""

    boundary: np.ndarray  # pairs whose actions come from different chunks
    within: np.ndarray  # pairs from the same chunk

    @property
    def boundary_mean(self) -> float:
        return float(self.boundary.mean()) if self.boundary.size else math.nan

    @property
    def within_mean(self) -> float:
        return float(self.within.mean()) if self.within.size else math.nan

    @property
    def ratio(self) -> float:
        """How much larger a step is at a boundary than inside a chunk (1 = seamless)."""
        if not self.boundary.size or not self.within.size or self.within_mean == 0:
            return math.nan
        return self.boundary_mean / self.within_mean


def step_jumps(
    actions: Sequence[np.ndarray | None], chunk_ids: Sequence[int | None], joints: slice = JOINTS
) -> Jumps:
    """Split the steps between consecutive executed actions into boundary and within-chunk steps.

    Stalls are skipped: the robot holds its last target through them, so the next executed action
    is compared with the last executed one.
    """
    boundary: list[float] = []
    within: list[float] = []
    previous: np.ndarray | None = None
    previous_id: int | None = None
    for action, chunk_id in zip(actions, chunk_ids, strict=True):
        if action is None:
            continue
        if previous is not None:
            jump = float(np.linalg.norm(np.asarray(action)[joints] - previous[joints]))
            (within if chunk_id == previous_id else boundary).append(jump)
        previous, previous_id = np.asarray(action), chunk_id
    return Jumps(np.asarray(boundary, dtype=np.float64), np.asarray(within, dtype=np.float64))


def pooled_jumps(traces: Sequence[EpisodeTrace]) -> Jumps:
    """Every episode's steps together (boundaries never span two episodes)."""
    parts = [step_jumps(trace.actions, trace.chunk_ids) for trace in traces]
    if not parts:
        return Jumps(np.zeros(0), np.zeros(0))
    return Jumps(
        np.concatenate([part.boundary for part in parts]), np.concatenate([part.within for part in parts])
    )


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def summarize(
    traces: Sequence[EpisodeTrace],
    *,
    round_trips_ms: Sequence[float] = (),
    inference_ms: Sequence[float] = (),
) -> dict[str, Any]:
    """One strategy's figures over its episodes (every key is a plain number, JSON-ready)."""
    jumps = pooled_jumps(traces)
    ticks = sum(trace.ticks for trace in traces)
    executed = sum(trace.executed for trace in traces)
    seconds = sum(trace.seconds for trace in traces)
    successes = sum(trace.success for trace in traces)
    return {
        "episodes": len(traces),
        "successes": successes,
        "success_rate": successes / len(traces) if traces else math.nan,
        "ticks": ticks,
        "executed_steps": executed,
        "stall_ticks": ticks - executed,
        "steps_per_s": executed / seconds if seconds > 0 else math.nan,
        # each boundary starts a chunk, and so does an episode's first executed action
        "chunks": len(jumps.boundary) + sum(trace.executed > 0 for trace in traces),
        "boundary_jump_rad": jumps.boundary_mean,
        "within_jump_rad": jumps.within_mean,
        "jump_ratio": jumps.ratio,
        "inference_ms_p50": percentile(inference_ms, 50),
        "inference_ms_p99": percentile(inference_ms, 99),
        "round_trip_ms_p50": percentile(round_trips_ms, 50),
        "round_trip_ms_p99": percentile(round_trips_ms, 99),
    }


def json_ready(value: Any) -> Any:
    """NaN becomes None (JSON has no NaN); floats are rounded for a readable line. numpy scalars
    become Python numbers first (``json`` refuses ``np.float32`` and ``np.int64``)."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 5)
    return value
