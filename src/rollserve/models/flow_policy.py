"""The reference policy: state-conditioned action-chunking flow matching with RTC guidance.

Implements :class:`~rollserve.models.policy.Policy` and ``BatchedPolicy``. Batch keys (after
``make_processors().pre``):

- ``state``: float32 ``(state_dim,)``, normalised with the checkpoint's statistics;
- ``images``: ``{camera: uint8 HWC}``, accepted and ignored (the model is state-only);
- ``task``: str, accepted and ignored (one task);
- ``seed`` (optional int): makes this call's noise reproducible;
- ``noise`` (optional float32 ``(chunk_size, action_dim)``): the exact starting noise.

Chunks are float32 ``(chunk_size, action_dim)`` in model space (normalised actions); ``post`` maps
them to robot space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_sampling import sample_chunks
from rollserve.models.flow_stats import NormStats
from rollserve.models.policy import PolicyBatch, PolicyMetadata, PolicyRequest, Processors, SingleAsBatchOfOne
from rollserve.rtc.config import RTCConfig
from rollserve.rtc.weights import prefix_weights

DEFAULT_RTC = RTCConfig(enabled=True, execution_horizon=10, max_guidance_weight=5.0)


class FlowMatchingPolicy(SingleAsBatchOfOne):
    """A trained :class:`VelocityNet` plus what serving it needs: statistics, names, noise, RTC settings.

    Noise comes from, in order: ``batch["noise"]``, a generator seeded with ``batch["seed"]``, or
    the policy's own generator (seeded at construction with ``seed``), so runs are reproducible.
    """

    def __init__(
        self,
        net: VelocityNet,
        stats: NormStats,
        action_names: Sequence[str],
        *,
        state_names: Sequence[str] | None = None,
        control_hz: float = 15.0,
        num_steps: int = 10,
        rtc: RTCConfig = DEFAULT_RTC,
        seed: int = 0,
        device: str | torch.device = "cpu",
        name: str = "rollserve-flow-policy",
        info: dict[str, Any] | None = None,
    ) -> None:
        config = net.config
        if len(action_names) != config.action_dim:
            raise ValueError(f"{len(action_names)} action names for action_dim {config.action_dim}")
        stats.check(config.state_dim, config.action_dim)
        self.device = torch.device(device)
        self.net = net.to(self.device).eval()
        self.stats = stats
        self.state_names = tuple(state_names or (f"state_{i}" for i in range(config.state_dim)))
        self.num_steps = num_steps
        self.rtc = rtc
        self.info = dict(info or {})
        self.metadata = PolicyMetadata(
            name=name,
            action_names=tuple(action_names),
            chunk_size=config.chunk_size,
            state_dim=config.state_dim,
            fps=float(control_hz),
            supports_rtc=rtc.enabled,  # with RTC off, clients are told so and send no prefixes
            supports_batching=True,
        )
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def config(self) -> FlowNetConfig:
        return self.net.config

    def reseed(self, seed: int) -> None:
        """Restart the policy's own noise stream (used when a request carries no seed or noise)."""
        self._generator.manual_seed(seed)

    # -- Policy / BatchedPolicy ---------------------------------------------------------------

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """One batched Euler integration for all requests; per-item delay, prefix and noise."""
        if not requests:
            return []
        states = np.stack([self._state_of(request.batch) for request in requests])
        noise = torch.stack([self._noise_for(request.batch) for request in requests])
        prefixes = [self._prefix_and_weights(request) for request in requests]
        prefix = weights = None
        if any(item is not None for item in prefixes):
            zero = (np.zeros(self._chunk_shape, np.float32), np.zeros(self.config.chunk_size, np.float32))
            filled = [item if item is not None else zero for item in prefixes]
            prefix = torch.from_numpy(np.stack([y for y, _ in filled])).to(self.device)
            weights = torch.from_numpy(np.stack([w for _, w in filled])).to(self.device)
        chunks = sample_chunks(
            self.net,
            torch.from_numpy(states).to(self.device),
            noise.to(self.device),
            num_steps=self.num_steps,
            prefix=prefix,
            weights=weights,
            max_weight=self.rtc.max_guidance_weight,
        )
        out = chunks.to("cpu", torch.float32).numpy()
        return [np.ascontiguousarray(chunk) for chunk in out]

    # -- processors -----------------------------------------------------------------------------

    def make_processors(self) -> Processors:
        """``pre`` normalises the robot state; ``post`` maps a model-space chunk to robot actions."""
        return Processors(pre=self.preprocess, post=self.actions_to_robot)

    def preprocess(self, observation: dict[str, Any]) -> PolicyBatch:
        state = np.asarray(observation["state"], dtype=np.float32)
        if state.shape != (self.config.state_dim,):
            raise ValueError(f"state must have shape ({self.config.state_dim},), got {state.shape}")
        batch = dict(observation)
        batch["state"] = self.stats.normalize_state(state)
        batch.setdefault("images", {})
        batch.setdefault("task", "")
        return batch

    def actions_to_robot(self, chunk: np.ndarray) -> np.ndarray:
        """Model space (normalised) -> robot space actions."""
        return self.stats.unnormalize_actions(chunk)

    def actions_to_model(self, actions: np.ndarray) -> np.ndarray:
        """Robot space -> model space; the inverse of ``actions_to_robot`` (e.g. for a robot-space prefix)."""
        return self.stats.normalize_actions(actions)

    # -- helpers --------------------------------------------------------------------------------

    @property
    def _chunk_shape(self) -> tuple[int, int]:
        return (self.config.chunk_size, self.config.action_dim)

    def _state_of(self, batch: PolicyBatch) -> np.ndarray:
        state = np.asarray(batch["state"], dtype=np.float32)
        if state.shape != (self.config.state_dim,):
            raise ValueError(f"batch['state'] must have shape ({self.config.state_dim},), got {state.shape}")
        return state

    def _noise_for(self, batch: PolicyBatch) -> torch.Tensor:
        if batch.get("noise") is not None:
            noise = np.asarray(batch["noise"], dtype=np.float32)
            if noise.shape != self._chunk_shape:
                raise ValueError(f"batch['noise'] must have shape {self._chunk_shape}, got {noise.shape}")
            return torch.from_numpy(noise.copy())
        seed = batch.get("seed")
        generator = self._generator if seed is None else torch.Generator().manual_seed(int(seed))
        return torch.randn(self._chunk_shape, generator=generator, dtype=torch.float32)

    def _prefix_and_weights(self, request: PolicyRequest) -> tuple[np.ndarray, np.ndarray] | None:
        """``(Y, W)`` padded to the chunk, or None for plain sampling (no prefix, or RTC disabled)."""
        left_over = request.prev_chunk_left_over
        if left_over is None or not self.rtc.enabled:
            return None
        left_over = np.asarray(left_over, dtype=np.float32)
        chunk_size, action_dim = self._chunk_shape
        if left_over.ndim != 2 or left_over.shape[1] != action_dim:
            raise ValueError(f"prefix must have shape (steps, {action_dim}), got {left_over.shape}")
        # A server cut the prefix to its own horizon (``--rtc-horizon``, which may exceed the
        # checkpoint's) and says how many rows are real; a direct call is cut to the policy's.
        if request.prefix_steps is None:
            horizon = min(self.rtc.execution_horizon, left_over.shape[0], chunk_size)
        else:
            horizon = min(request.prefix_steps, left_over.shape[0], chunk_size)
        prefix = np.zeros((chunk_size, action_dim), np.float32)
        prefix[:horizon] = left_over[:horizon]
        weights = prefix_weights(
            request.inference_delay, horizon, chunk_size, self.rtc.prefix_attention_schedule
        )
        return prefix, weights
