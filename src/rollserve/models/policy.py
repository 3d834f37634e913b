"""The Policy protocol: what the server and the local engine call, and nothing about transports.

A policy works in *model space* (e.g. normalised actions). Per-session processors turn a robot
observation into the policy's input (``pre``) and a model-space chunk into robot-space actions
(``post``); the server returns both chunks so an RTC client can send either back as a prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

PolicyBatch = dict[str, Any]
"""Pre-processed policy input: ``{"state": float32 (S,), "images": {cam: uint8 HWC}, "task": str}``."""


@dataclass(frozen=True)
class PolicyMetadata:
    """What a served policy expects and returns; sent to clients on connect."""

    name: str
    action_names: tuple[str, ...]
    chunk_size: int
    state_dim: int
    camera_names: tuple[str, ...] = ()
    image_shape: tuple[int, int, int] | None = None
    fps: float = 15.0
    supports_rtc: bool = False
    supports_batching: bool = False

    @property
    def action_dim(self) -> int:
        return len(self.action_names)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["action_names"] = list(self.action_names)
        out["camera_names"] = list(self.camera_names)
        out["image_shape"] = list(self.image_shape) if self.image_shape else None
        return out


@dataclass
class PolicyRequest:
    """One pre-processed request, as handed to a batched policy.

    The server pads a short RTC prefix with zero rows to the execution horizon; ``prefix_steps``
    says how many rows are real actions, so a policy can keep guidance off the padding.
    """

    batch: PolicyBatch
    inference_delay: int = 0
    prev_chunk_left_over: np.ndarray | None = None
    prefix_steps: int | None = None


def _identity(value: Any) -> Any:
    return value


@dataclass
class Processors:
    """Per-session pre/post-processing (a fresh pair per session, so they may keep state)."""

    pre: Callable[[dict[str, Any]], PolicyBatch] = field(default=_identity)
    post: Callable[[np.ndarray], np.ndarray] = field(default=_identity)


# Not mutated: mutmut would add its own members to the stubs, which isinstance() then requires.
@runtime_checkable
class Policy(Protocol):  # pragma: no mutate block
    """A chunking policy. ``predict_action_chunk`` returns a float32 ``(chunk_size, action_dim)``
    model-space chunk. With RTC, ``prev_chunk_left_over`` is the ``(execution_horizon, action_dim)``
    model-space prefix and ``inference_delay`` the number of its actions that will already have
    executed when the new chunk arrives."""

    metadata: PolicyMetadata

    def predict_action_chunk(
        self,
        batch: PolicyBatch,
        *,
        inference_delay: int = 0,
        prev_chunk_left_over: np.ndarray | None = None,
    ) -> np.ndarray: ...


@runtime_checkable
class BatchedPolicy(Policy, Protocol):  # pragma: no mutate block
    """A policy that serves many sessions' requests in one call (``metadata.supports_batching``)."""

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]: ...


class SingleAsBatchOfOne:
    """For batched policies: ``predict_action_chunk`` is a batch of one, so both paths agree."""

    def predict_action_chunk(
        self, batch: PolicyBatch, *, inference_delay: int = 0, prev_chunk_left_over: np.ndarray | None = None
    ) -> np.ndarray:
        request = PolicyRequest(batch, inference_delay, prev_chunk_left_over)
        return self.predict_action_chunks([request])[0]  # type: ignore[attr-defined]


def make_processors(policy: Policy) -> Processors:
    """A fresh processor pair for a new session: the policy's own if it has a factory, else identity."""
    factory = getattr(policy, "make_processors", None)
    return factory() if callable(factory) else Processors()
