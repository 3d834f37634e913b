"""Prefix length normalisation: the server always hands the policy exactly ``horizon`` prefix rows."""

from __future__ import annotations

import numpy as np


def normalize_prefix_length(prefix: np.ndarray, horizon: int) -> np.ndarray:
    """Pad with zero rows or truncate a 2-D ``(T, A)`` prefix to ``(horizon, A)``, keeping its dtype."""
    if prefix.ndim != 2:
        raise ValueError(f"RTC prefix must be 2-D (steps, action_dim), got shape {prefix.shape}")
    steps = prefix.shape[0]
    if steps == horizon:
        return prefix
    if steps > horizon:
        return prefix[:horizon]
    padded = np.zeros((horizon, prefix.shape[1]), dtype=prefix.dtype)
    padded[:steps] = prefix
    return padded
