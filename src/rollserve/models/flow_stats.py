"""Normalisation statistics: robot space <-> model space for states and actions.

The policy sees zero-mean, unit-scale states and predicts normalised actions; these statistics
travel in the checkpoint so the processors of every session agree with training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_STD = 1e-2
"""Floor on a dimension's scale, so a (nearly) constant dimension does not blow up at serve time."""


@dataclass(frozen=True)
class NormStats:
    """Per-dimension mean and std of states and actions (float32 arrays)."""

    state_mean: np.ndarray
    state_std: np.ndarray
    action_mean: np.ndarray
    action_std: np.ndarray

    @classmethod
    def fit(cls, states: np.ndarray, actions: np.ndarray) -> NormStats:
        def moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            x = np.asarray(x, dtype=np.float64)
            return x.mean(axis=0).astype(np.float32), np.maximum(x.std(axis=0), MIN_STD).astype(np.float32)

        state_mean, state_std = moments(states)
        action_mean, action_std = moments(actions)
        return cls(state_mean, state_std, action_mean, action_std)

    @classmethod
    def identity(cls, state_dim: int, action_dim: int) -> NormStats:
        zeros, ones = np.zeros, np.ones
        return cls(
            zeros(state_dim, np.float32),
            ones(state_dim, np.float32),
            zeros(action_dim, np.float32),
            ones(action_dim, np.float32),
        )

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        return ((np.asarray(state, np.float32) - self.state_mean) / self.state_std).astype(np.float32)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return ((np.asarray(actions, np.float32) - self.action_mean) / self.action_std).astype(np.float32)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        return (np.asarray(actions, np.float32) * self.action_std + self.action_mean).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name).tolist() for name in self.__dataclass_fields__}

    def check(self, state_dim: int, action_dim: int) -> None:
        """Raise ``ValueError`` unless every statistic has one finite value per dimension: numpy
        would broadcast a short list over every dimension and serve wrong actions without a word."""
        dims = {
            "state_mean": state_dim,
            "state_std": state_dim,
            "action_mean": action_dim,
            "action_std": action_dim,
        }
        for name, dim in dims.items():
            values = getattr(self, name)
            if values.shape != (dim,) or not np.isfinite(values).all():
                raise ValueError(
                    f"normalization {name} must be {dim} finite values, got shape {values.shape}"
                )
            if name.endswith("_std") and not (values > 0).all():
                raise ValueError(f"normalization {name} must be positive")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NormStats:
        return cls(**{name: np.asarray(data[name], dtype=np.float32) for name in cls.__dataclass_fields__})
