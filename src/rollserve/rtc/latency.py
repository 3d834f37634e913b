"""Delay estimate from measured latency: how many actions will execute before a chunk arrives."""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

HISTORY = 1024  # round trips kept for the percentiles: a long run's memory and cost stay bounded


class LatencyTracker:
    """Keeps the last ``window`` round trips for the delay estimate (their maximum: robust to jitter)
    and the last ``history`` for the reported percentiles."""

    def __init__(self, window: int = 16, history: int = HISTORY) -> None:
        if window < 1 or history < 1:
            raise ValueError(f"window and history must be >= 1, got {window} and {history}")
        self._recent: deque[float] = deque(maxlen=window)
        self._history: deque[float] = deque(maxlen=history)
        self._count = 0
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._recent.append(seconds)
            self._history.append(seconds)
            self._count += 1

    def recent_max(self) -> float:
        with self._lock:
            return max(self._recent, default=0.0)

    def delay_steps(self, dt: float, max_steps: int | None = None) -> int:
        """``ceil(latency / dt)`` over the recent maximum, capped at ``max_steps``."""
        steps = math.ceil(self.recent_max() / dt - 1e-9) if dt > 0 else 0
        return steps if max_steps is None else min(steps, max_steps)

    def percentiles(self, *qs: float) -> list[float]:
        """Percentiles (0..100) over the last ``history`` round trips, in seconds."""
        with self._lock:
            if not self._history:
                return [float("nan")] * len(qs)
            recent = np.fromiter(self._history, dtype=np.float64, count=len(self._history))
        return [float(v) for v in np.percentile(recent, qs)]

    @property
    def count(self) -> int:
        """Round trips recorded since the start (also those no longer kept)."""
        with self._lock:
            return self._count
