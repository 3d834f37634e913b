"""Delay estimate from measured latency: how many actions will execute before a chunk arrives."""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np


class LatencyTracker:
    """Keeps the last ``window`` round trips; the delay estimate uses their maximum (robust to jitter)."""

    def __init__(self, window: int = 16) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self._all: list[float] = []
        self._lock = threading.Lock()

    def record(self, seconds: float) -> None:
        with self._lock:
            self._recent.append(seconds)
            self._all.append(seconds)

    def recent_max(self) -> float:
        with self._lock:
            return max(self._recent, default=0.0)

    def delay_steps(self, dt: float, max_steps: int | None = None) -> int:
        """``ceil(latency / dt)`` over the recent maximum, capped at ``max_steps``."""
        steps = math.ceil(self.recent_max() / dt - 1e-9) if dt > 0 else 0
        return steps if max_steps is None else min(steps, max_steps)

    def percentiles(self, *qs: float) -> list[float]:
        """Percentiles (0..100) over every recorded round trip, in seconds."""
        with self._lock:
            if not self._all:
                return [float("nan")] * len(qs)
            return [float(v) for v in np.percentile(self._all, qs)]

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._all)
