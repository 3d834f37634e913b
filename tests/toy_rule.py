"""The toy world's step rule, written out independently of ``ToyWorld``, for tests that pin what the
envs return: joints and gripper move halfway to the action, clipped to the action bounds."""

from __future__ import annotations

import numpy as np

_LOW = np.array([-1.0] * 7 + [0.0], dtype=np.float32)


def moved(obs: np.ndarray, *actions: np.ndarray) -> np.ndarray:
    """The toy world's observation after ``actions`` from ``obs`` (float32, as the world computes)."""
    out = obs.astype(np.float32).copy()
    for a in actions:
        out[:8] = out[:8] + np.float32(0.5) * (np.clip(a, _LOW, 1.0) - out[:8])
    return out
