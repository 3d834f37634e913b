"""A LeRobot checkpoint served as a rollserve ``BatchedPolicy``.

What LeRobot's own local loop does (``prepare_observation_for_inference``, the checkpoint's
pre-processor, ``predict_action_chunk``, the post-processor) is done here, split the way rollserve
splits it: per-session work (image conversion, pre-processing, observation history, seeded noise)
happens in the session's ``Processors.pre``; the model call batches many sessions; the
post-processor turns a model-space chunk into robot units. Nothing here runs under
``torch.inference_mode``: LeRobot's RTC guidance takes gradients.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollserve.adapters.lerobot.support import TypeSupport
from rollserve.models.policy import PolicyBatch, PolicyMetadata, PolicyRequest, Processors, SingleAsBatchOfOne
from rollserve.rtc.config import RTCConfig
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE, WireError

OBS_STATE = "observation.state"
OBS_IMAGES = "observation.images"
ACTION = "action"


@dataclass
class SessionState:
    """One robot's LeRobot state: its own pipelines, observation history and noise generator."""

    preprocessor: Any
    postprocessor: Any
    queues: dict[str, deque] | None
    generator: torch.Generator | None
    lock: threading.Lock = field(default_factory=threading.Lock)


class LeRobotPolicy(SingleAsBatchOfOne):
    """rollserve's ``Policy`` / ``BatchedPolicy`` protocol over a loaded LeRobot policy.

    Built by :func:`rollserve.adapters.lerobot.loading.load_lerobot_policy`; the server never
    imports this module.
    """

    def __init__(
        self,
        policy: Any,
        preprocessor: Any,
        postprocessor: Any,
        *,
        support: TypeSupport,
        metadata: PolicyMetadata,
        camera_keys: dict[str, str],
        image_shape: tuple[int, int, int] | None,
        device: str,
        seed: int | None,
    ) -> None:
        self.lerobot_policy = policy
        self.support = support
        self.metadata = metadata
        self.camera_keys = camera_keys  # camera name -> LeRobot feature key
        self.image_shape = image_shape
        self.device = torch.device(device)
        self.seed = seed
        self._pre_template = preprocessor  # never run: every session gets a deep copy
        self._post_template = postprocessor
        config = policy.config
        rtc = getattr(config, "rtc_config", None)
        if support.rtc and rtc is not None:
            self.rtc = RTCConfig(enabled=bool(rtc.enabled), execution_horizon=int(rtc.execution_horizon))
        self._empty_queues: dict[str, deque] | None = None
        if support.history:
            policy.reset()  # LeRobot's own empty queues, copied for every session
            self._empty_queues = copy.deepcopy(policy._queues)
        self._noise_shape = None
        if support.noise:
            width = (
                config.action_feature.shape[0]
                if support.noise_width == "action_dim"
                else getattr(config, support.noise_width)
            )
            self._noise_shape = (getattr(config, support.noise_length_field), int(width))

    # -- per session -----------------------------------------------------------------------------
    def make_processors(self) -> Processors:
        """Fresh LeRobot pipelines, history and noise generator for one session (and on reset)."""
        queues = copy.deepcopy(self._empty_queues)
        generator = None
        if self.seed is not None and self._noise_shape is not None:
            generator = torch.Generator().manual_seed(int(self.seed))
        state = SessionState(
            preprocessor=copy.deepcopy(self._pre_template),
            postprocessor=copy.deepcopy(self._post_template),
            queues=queues,
            generator=generator,
        )
        return Processors(pre=lambda obs: self._pre(state, obs), post=lambda chunk: self._post(state, chunk))

    def _frame(self, observation: dict[str, Any]) -> dict[str, np.ndarray]:
        """The robot observation as LeRobot's dataset-frame keys (numpy, before its conversion)."""
        frame: dict[str, np.ndarray] = {}
        if self.metadata.state_dim:
            frame[OBS_STATE] = np.array(observation["state"], dtype=np.float32, copy=True)
        images = observation.get("images") or {}
        for camera, key in self.camera_keys.items():
            image = np.asarray(images[camera])
            if image.dtype != np.uint8:
                raise WireError(UNSUPPORTED_DTYPE, f"image {camera!r} must be uint8, got {image.dtype}")
            channels = self.image_shape[2] if self.image_shape else 3
            if image.ndim != 3 or image.shape[2] != channels:
                raise WireError(BAD_SHAPE, f"image {camera!r} must be HxWx{channels}, got {image.shape}")
            frame[key] = np.array(image, copy=True)
        return frame

    def _pre(self, state: SessionState, observation: dict[str, Any]) -> PolicyBatch:
        from lerobot.policies.utils import populate_queues, prepare_observation_for_inference

        task = observation.get("task") or ""
        if not isinstance(task, str):
            raise WireError(BAD_FIELD, f"task must be a string, got {type(task).__name__}")
        with state.lock:
            batch = prepare_observation_for_inference(self._frame(observation), self.device, task, None)
            batch = state.preprocessor(batch)
            history = None
            if state.queues is not None:
                # What LeRobot's select_action does before predict_action_chunk, on this session's queues.
                batch = dict(batch)
                batch.pop(ACTION, None)
                image_keys = list(self.camera_keys.values())
                if image_keys:
                    batch[OBS_IMAGES] = torch.stack([batch[key] for key in image_keys], dim=-4)
                populate_queues(state.queues, batch)
                history = {
                    key: torch.stack(list(state.queues[key]), dim=1)
                    for key in batch
                    if key in state.queues and key != ACTION
                }
            noise = None
            if state.generator is not None and self._noise_shape is not None:
                noise = torch.normal(
                    0.0, 1.0, size=(1, *self._noise_shape), generator=state.generator, dtype=torch.float32
                )
        return {"lerobot": batch, "history": history, "noise": noise}

    def _post(self, state: SessionState, chunk: np.ndarray) -> np.ndarray:
        action = torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.float32))[None]
        with state.lock:
            out = state.postprocessor(action)
        return out[0].detach().cpu().numpy().astype(np.float32, copy=False)

    # -- the model call --------------------------------------------------------------------------

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        """One LeRobot call per group of requests that can share it.

        LeRobot's RTC takes one scalar delay and one execution horizon per call, so requests are
        grouped by (delay, real prefix rows); requests without a prefix form their own group.
        """
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(self._group_key(request), []).append(index)
        out: list[np.ndarray] = [np.empty(0, np.float32)] * len(requests)
        for key, indices in groups.items():
            chunks = self._run_group([requests[i] for i in indices], key)
            for index, chunk in zip(indices, chunks, strict=True):
                out[index] = chunk
        return out

    def _prefix_rows(self, request: PolicyRequest) -> int:
        """How many rows of the prefix are real actions (the server pads a short one with zeros)."""
        prefix = request.prev_chunk_left_over
        if prefix is None or not self.metadata.supports_rtc:
            return 0
        rows = len(prefix) if request.prefix_steps is None else int(request.prefix_steps)
        return max(0, min(rows, len(prefix)))

    def _group_key(self, request: PolicyRequest) -> tuple[Any, ...]:
        rows = self._prefix_rows(request)
        return (int(request.inference_delay), rows) if rows else ("plain",)

    def _run_group(self, requests: list[PolicyRequest], key: tuple[Any, ...]) -> list[np.ndarray]:
        policy = self.lerobot_policy
        batch = _concat([r.batch["lerobot"] for r in requests])
        kwargs: dict[str, Any] = {}
        noises = [r.batch.get("noise") for r in requests]
        if all(n is not None for n in noises):
            kwargs["noise"] = torch.cat(noises).to(self.device)
        if key[0] != "plain":
            delay, rows = key
            prefix = np.stack([r.prev_chunk_left_over[:rows] for r in requests])  # the padding is cut
            kwargs.update(
                inference_delay=delay,
                prev_chunk_left_over=torch.from_numpy(prefix).to(self.device),
                execution_horizon=rows,
            )
        saved_queues = getattr(policy, "_queues", None)
        if self.support.history:
            histories = [r.batch["history"] for r in requests]
            policy._queues = {
                name: deque(torch.cat([h[name] for h in histories]).unbind(dim=1)) for name in histories[0]
            }
        try:
            actions = policy.predict_action_chunk(batch, **kwargs)
        finally:
            if self.support.history:
                policy._queues = saved_queues
        actions = actions.detach().to("cpu", torch.float32)
        return [actions[i].numpy() for i in range(len(requests))]


def _concat(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Many sessions' pre-processed LeRobot batches as one (tensors along dim 0, lists joined)."""
    if len(batches) == 1:
        return dict(batches[0])
    merged: dict[str, Any] = {}
    for key, first in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(first, torch.Tensor):
            merged[key] = torch.cat(values)
        elif isinstance(first, list):
            merged[key] = [item for value in values for item in value]
        elif isinstance(first, str):
            merged[key] = list(values)
        else:
            merged[key] = first
    return merged
