"""Small deterministic policies for tests, demos of the protocol, and benchmarks; each loadable by spec.

- ``rollserve.models.simple_policies:chunk_policy``: numpy; the chunk depends on state, delay and
  RTC prefix, with pre/post processors; batching; optional fixed latency per model call.
- ``rollserve.models.simple_policies:droid_policy``: the same with DROID's state (7 joints +
  gripper) and cameras, for openpi clients.
- ``rollserve.models.simple_policies:echo_policy``: no compute at all (the state, repeated), with
  LIBERO's (default) or DROID's keys: what a trivial-policy benchmark measures is the serving.
- ``rollserve.models.simple_policies:wide_mlp``: a wide torch MLP whose cost barely grows with the
  batch size (weight-bound), for the many-robots benchmark.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollserve.models.policy import PolicyBatch, PolicyMetadata, PolicyRequest, Processors, SingleAsBatchOfOne
from rollserve.rtc.config import RTCConfig

DROID_CAMERAS = ("exterior_image_1_left", "wrist_image_left")
DROID_ACTIONS = (*(f"joint_{i}" for i in range(7)), "gripper")
LIBERO_CAMERAS = ("image", "wrist_image")
LIBERO_ACTIONS = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")


class ChunkPolicy(SingleAsBatchOfOne):
    """A deterministic numpy chunk policy (a fixed random linear map of the state, then a ramp).

    ``chunk[t, a] = tanh(W @ state)[a] + 0.05 (t + 1)(a + 1) / A + 0.01 delay``; with a prefix, the
    first ``horizon`` rows are averaged with it (a stand-in for RTC guidance). Processors normalise
    the state on the way in and scale the chunk to robot space on the way out. With
    ``record_calls`` every call's inputs are kept (tests compare them across paths).
    """

    def __init__(
        self,
        *,
        state_dim: int = 6,
        action_dim: int | None = None,
        chunk_size: int = 20,
        execution_horizon: int = 10,
        camera_names: Sequence[str] = (),
        action_names: Sequence[str] | None = None,
        name: str = "chunk-policy",
        fps: float = 15.0,
        supports_batching: bool = True,
        latency_s: float = 0.0,
        record_calls: bool = False,
        seed: int = 0,
    ) -> None:
        names = _action_names(action_names, action_dim)
        self.metadata = PolicyMetadata(
            name=name,
            action_names=names,
            chunk_size=chunk_size,
            state_dim=state_dim,
            camera_names=tuple(camera_names),
            fps=fps,
            supports_rtc=True,
            supports_batching=supports_batching,
        )
        self.rtc = RTCConfig(enabled=True, execution_horizon=min(execution_horizon, chunk_size))
        self.latency_s = latency_s
        self.record_calls = record_calls
        self.calls: list[dict[str, Any]] = []
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()
        rng = np.random.default_rng(seed)
        self._weights = (rng.standard_normal((len(names), state_dim)) / max(state_dim, 1) ** 0.5).astype(
            np.float32
        )
        self._state_mean = np.linspace(-0.5, 0.5, state_dim, dtype=np.float32)
        self._state_std = np.linspace(1.0, 2.0, state_dim, dtype=np.float32)
        self._action_scale = np.linspace(0.5, 1.5, len(names), dtype=np.float32)
        self._action_offset = np.linspace(-0.2, 0.2, len(names), dtype=np.float32)
        steps = np.arange(1, chunk_size + 1, dtype=np.float32)[:, None]
        dims = np.arange(1, len(names) + 1, dtype=np.float32)[None, :]
        self._ramp = (np.float32(0.05) * steps * dims / np.float32(len(names))).astype(np.float32)

    # -- Policy / BatchedPolicy -----------------------------------------------------------------

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """One model call for the whole batch (the latency is paid once per call, as on a GPU)."""
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        chunks = [self._chunk(request) for request in requests]
        with self._lock:
            self.batch_sizes.append(len(requests))
            if self.record_calls:
                self.calls.extend(_record(request) for request in requests)
        return chunks

    def _chunk(self, request: PolicyRequest) -> np.ndarray:
        state = np.asarray(request.batch["state"], dtype=np.float32)
        if state.shape != (self.metadata.state_dim,):
            raise ValueError(f"state must have shape ({self.metadata.state_dim},), got {state.shape}")
        if not np.all(np.isfinite(state)):
            raise ValueError("state has non-finite values")
        chunk = np.tanh(self._weights @ state)[None, :] + self._ramp
        chunk = chunk + np.float32(0.01) * np.float32(request.inference_delay)
        prefix = request.prev_chunk_left_over
        if prefix is not None:
            rows = min(len(prefix), len(chunk))
            chunk[:rows] = np.float32(0.5) * (chunk[:rows] + np.asarray(prefix[:rows], dtype=np.float32))
        return chunk.astype(np.float32)

    # -- processors -------------------------------------------------------------------------------
    def make_processors(self) -> Processors:
        return Processors(pre=self.preprocess, post=self.actions_to_robot)

    def preprocess(self, observation: dict[str, Any]) -> PolicyBatch:
        state = np.asarray(observation["state"], dtype=np.float32)
        return {
            "state": (state - self._state_mean) / self._state_std,
            "images": dict(observation.get("images") or {}),
            "task": observation.get("task", ""),
        }

    def actions_to_robot(self, chunk: np.ndarray) -> np.ndarray:
        return (np.asarray(chunk, dtype=np.float32) * self._action_scale + self._action_offset).astype(
            np.float32
        )

    def actions_to_model(self, actions: np.ndarray) -> np.ndarray:
        return ((np.asarray(actions, dtype=np.float32) - self._action_offset) / self._action_scale).astype(
            np.float32
        )


def _record(request: PolicyRequest) -> dict[str, Any]:
    batch = request.batch
    prefix = request.prev_chunk_left_over
    return {
        "state": np.array(batch["state"], copy=True),
        "inference_delay": request.inference_delay,
        "prev_chunk_left_over": None if prefix is None else np.array(prefix, copy=True),
        "prefix_steps": request.prefix_steps,
        "images": {name: hashlib.sha256(np.ascontiguousarray(img).tobytes()).hexdigest() for name, img in
                   batch.get("images", {}).items()},
        "task": batch.get("task", ""),
    }  # fmt: skip


class WideMLPPolicy(SingleAsBatchOfOne):
    """A wide torch MLP over (state, prefix, delay): batch 1 and batch 32 cost about the same, because
    every call streams the same large weight matrices. Weights come from ``seed``; no checkpoint."""

    def __init__(
        self,
        *,
        state_dim: int = 14,
        action_dim: int = 14,
        chunk_size: int = 50,
        execution_horizon: int = 10,
        width: int = 2048,
        depth: int = 3,
        device: str = "cpu",
        seed: int = 0,
        name: str = "wide-mlp",
        fps: float = 50.0,
    ) -> None:
        import torch

        self._torch = torch
        self.metadata = PolicyMetadata(
            name=name,
            action_names=tuple(f"a{i}" for i in range(action_dim)),
            chunk_size=chunk_size,
            state_dim=state_dim,
            fps=fps,
            supports_rtc=True,
            supports_batching=True,
        )
        self.rtc = RTCConfig(enabled=True, execution_horizon=min(execution_horizon, chunk_size))
        self.device = torch.device(device)
        generator = torch.Generator().manual_seed(seed)
        sizes = [state_dim + self.rtc.execution_horizon * action_dim + 1] + [width] * depth
        layers: list[Any] = []
        for fan_in, fan_out in itertools.pairwise(sizes):
            layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.GELU()]
        layers.append(torch.nn.Linear(width, chunk_size * action_dim))
        self.net = torch.nn.Sequential(*layers)
        with torch.no_grad():
            for param in self.net.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) / max(param.shape[-1], 1) ** 0.5)
        self.net = self.net.to(self.device).eval()

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        torch = self._torch
        meta, horizon = self.metadata, self.rtc.execution_horizon
        inputs = np.zeros((len(requests), self.net[0].in_features), dtype=np.float32)
        for row, request in enumerate(requests):
            inputs[row, : meta.state_dim] = np.asarray(request.batch["state"], dtype=np.float32)
            if request.prev_chunk_left_over is not None:
                prefix = np.asarray(request.prev_chunk_left_over, dtype=np.float32)[:horizon]
                inputs[row, meta.state_dim : meta.state_dim + prefix.size] = prefix.ravel()
            inputs[row, -1] = float(request.inference_delay)
        with torch.inference_mode():
            out = self.net(torch.from_numpy(inputs).to(self.device)).float().cpu().numpy()
        out = out.reshape(len(requests), meta.chunk_size, meta.action_dim)
        return [np.ascontiguousarray(chunk) for chunk in out]


def _action_names(names: Sequence[str] | None, action_dim: int | None) -> tuple[str, ...]:
    """The chunk policy's action names: those given, else ``a0..`` for ``action_dim`` (6 by
    default). Both given must agree: a silently ignored ``--policy-arg action_dim`` would serve
    chunks of another width than the one asked for."""
    if not names:
        return tuple(f"a{i}" for i in range(6 if action_dim is None else action_dim))
    if action_dim is not None and action_dim != len(names):
        raise ValueError(f"action_dim={action_dim} disagrees with the {len(names)} action_names given")
    return tuple(names)


def chunk_policy(**kwargs: Any) -> ChunkPolicy:
    """Spec ``rollserve.models.simple_policies:chunk_policy``."""
    return ChunkPolicy(**kwargs)


def droid_policy(**kwargs: Any) -> ChunkPolicy:
    """A chunk policy shaped like DROID: 8-D state and actions, two cameras, chunk of 10."""
    defaults: dict[str, Any] = {
        "state_dim": 8, "action_dim": 8, "action_names": DROID_ACTIONS, "chunk_size": 10,
        "camera_names": DROID_CAMERAS, "name": "droid-chunk-policy",
    }  # fmt: skip
    return ChunkPolicy(**{**defaults, **kwargs})


class EchoPolicy:
    """No model at all: every chunk row is the state's first ``action_dim`` values (zero-padded).

    Serving overhead is all a round trip with it measures. No processors, no batching needed.
    """

    def __init__(
        self,
        *,
        state_dim: int,
        action_names: Sequence[str],
        camera_names: Sequence[str],
        chunk_size: int = 10,
        name: str = "echo-policy",
    ) -> None:
        self.metadata = PolicyMetadata(
            name=name,
            action_names=tuple(action_names),
            chunk_size=chunk_size,
            state_dim=state_dim,
            camera_names=tuple(camera_names),
            supports_batching=True,
        )

    def predict_action_chunk(
        self, batch: PolicyBatch, *, inference_delay: int = 0, prev_chunk_left_over: np.ndarray | None = None
    ) -> np.ndarray:
        meta = self.metadata
        chunk = np.zeros((meta.chunk_size, meta.action_dim), np.float32)
        state = np.asarray(batch["state"], dtype=np.float32)[: meta.action_dim]
        chunk[:, : state.size] = state
        return chunk

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        return [self.predict_action_chunk(request.batch) for request in requests]


def echo_policy(layout: str = "libero", **kwargs: Any) -> EchoPolicy:
    """Spec ``rollserve.models.simple_policies:echo_policy``: LIBERO keys (8-D state, 7 actions, cameras
    ``image`` and ``wrist_image``) or, with ``layout="droid"``, DROID's (8-D state and actions)."""
    layouts: dict[str, dict[str, Any]] = {
        "libero": {"state_dim": 8, "action_names": LIBERO_ACTIONS, "camera_names": LIBERO_CAMERAS},
        "droid": {"state_dim": 8, "action_names": DROID_ACTIONS, "camera_names": DROID_CAMERAS},
    }
    if layout not in layouts:
        raise ValueError(f"layout must be one of {sorted(layouts)}, got {layout!r}")
    return EchoPolicy(**{**layouts[layout], **kwargs})


def wide_mlp(**kwargs: Any) -> WideMLPPolicy:
    """Spec ``rollserve.models.simple_policies:wide_mlp``."""
    return WideMLPPolicy(**kwargs)
