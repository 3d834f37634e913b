"""The soft mask W over a chunk: which actions of the new chunk must match the prefix, and how much."""

from __future__ import annotations

import math

import numpy as np

from rollserve.rtc.config import SCHEDULES


def prefix_weights(delay: int, horizon: int, chunk_size: int, schedule: str = "linear") -> np.ndarray:
    """Weights for each of ``chunk_size`` actions (float32).

    1 for the first ``delay`` actions (they execute before the new chunk arrives), a ramp from 1 to
    0 (both exclusive) over ``[delay, horizon)``, 0 from ``horizon`` on. ``zeros`` keeps only the
    frozen part, ``ones`` holds 1 up to the horizon, ``exp`` bends the linear ramp by
    ``(e^w - 1) / (e - 1)``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown prefix schedule {schedule!r}; expected one of {SCHEDULES}")
    horizon = min(max(horizon, 0), chunk_size)
    delay = min(max(delay, 0), horizon)
    weights = np.zeros(chunk_size, dtype=np.float64)
    weights[:delay] = 1.0
    if schedule == "ones":
        weights[:horizon] = 1.0
    elif schedule in ("linear", "exp"):
        index = np.arange(delay, horizon, dtype=np.float64)
        ramp = (horizon - index) / (horizon - delay + 1)
        if schedule == "exp":
            ramp = ramp * np.expm1(ramp) / (math.e - 1.0)
        weights[delay:horizon] = ramp
    return weights.astype(np.float32)
