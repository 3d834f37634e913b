"""The policy request path: validate, pre-process, RTC prefix, policy call, post-process.

No transport and no session store: the server's engine worker runs ``PolicyRequestPath.run_batch``
and the robot-side ``LocalInferenceEngine`` runs ``run_inference_request`` in-process, so local and
remote runs execute the same code and differ only by the transport.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rollserve.engine.policy_errors import INFERENCE_ERROR, PolicyError
from rollserve.models.policy import Policy, PolicyMetadata, PolicyRequest, Processors
from rollserve.rtc.prefix import normalize_prefix_length
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE, WireError
from rollserve.wire.messages import ActionChunkMsg, MsgHeader, ObservationMsg

logger = logging.getLogger(__name__)


class SessionView(Protocol):
    """What a request needs from its session (the server's ``PolicySession`` is one)."""

    task: str
    rtc_enabled: bool
    processors: Processors


@dataclass
class LocalSession:
    """A session without a server: one robot's processors, task and RTC switch."""

    processors: Processors = field(default_factory=Processors)
    task: str = ""
    rtc_enabled: bool = True


DEFAULT_EXECUTION_HORIZON = 10


@dataclass
class InferenceItem:
    """One request as the engine worker sees it.

    ``processors`` are the session's pair *when the request was submitted*: a reset while the request
    is inside the model gives the session new processors, but this request is pre- and
    post-processed by the same (stateful) pair. ``session`` is the session itself, so a server can
    drop a queued request its session has moved on from (reset, closed) before it runs.
    """

    header: MsgHeader
    obs: ObservationMsg
    processors: Processors
    task: str = ""
    rtc_enabled: bool = True
    session: SessionView | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, session: SessionView, header: MsgHeader, obs: ObservationMsg) -> InferenceItem:
        return cls(header, obs, session.processors, session.task, session.rtc_enabled, session)


@dataclass
class _Prepared:
    item: InferenceItem
    request: PolicyRequest


def resolve_execution_horizon(policy: Policy, requested: int | None = None) -> int:
    """The requested horizon, else the policy's own RTC horizon, else 10; never beyond the chunk."""
    horizon = requested
    if horizon is None:
        horizon = getattr(getattr(policy, "rtc", None), "execution_horizon", DEFAULT_EXECUTION_HORIZON)
    if int(horizon) < 1:
        raise ValueError(f"execution horizon must be >= 1, got {horizon}")
    return min(int(horizon), policy.metadata.chunk_size)


def _failure(stage: str, exc: BaseException) -> PolicyError | WireError:
    """What the client learns about a failure inside the model code: the error, not its traceback."""
    if isinstance(exc, PolicyError | WireError):
        return exc
    logger.error("%s failed", stage, exc_info=exc)
    return PolicyError(INFERENCE_ERROR, f"{stage} failed: {type(exc).__name__}: {str(exc)[:300]}")


class PolicyRequestPath:
    """The transport-free request path; ``run_batch`` is what the engine worker runs."""

    def __init__(self, policy: Policy, *, execution_horizon: int | None = None) -> None:
        self.policy = policy
        self.metadata: PolicyMetadata = policy.metadata
        self.execution_horizon = resolve_execution_horizon(policy, execution_horizon)
        self.batched = bool(self.metadata.supports_batching) and callable(
            getattr(policy, "predict_action_chunks", None)
        )

    # -- checks that need no model (also run on the event loop before queueing) ------------------
    def validate(self, session: SessionView, obs: ObservationMsg) -> None:
        """Reject malformed requests with a typed error before they reach the model."""
        meta = self.metadata
        if obs.state is None:
            if meta.state_dim:
                raise WireError(BAD_FIELD, f"observation carries no state (policy expects {meta.state_dim})")
        else:
            _check_float32("state", obs.state)
            if obs.state.shape != (meta.state_dim,):
                raise WireError(
                    BAD_SHAPE, f"state must have shape ({meta.state_dim},), got {obs.state.shape}"
                )
            _check_finite("state", obs.state)
        if not 0 <= obs.inference_delay_steps <= meta.chunk_size:
            raise WireError(
                BAD_FIELD,
                f"inference_delay_steps must be in 0..{meta.chunk_size} (the chunk size), "
                f"got {obs.inference_delay_steps}",
            )
        for name in ("prefix_model", "prefix_robot"):
            prefix = getattr(obs, name)
            if prefix is None:
                continue
            _check_float32(name, prefix)
            if prefix.ndim != 2 or prefix.shape[1] != meta.action_dim or prefix.shape[0] > meta.chunk_size:
                raise WireError(
                    BAD_SHAPE,
                    f"{name} must be 2-D (steps <= {meta.chunk_size}, {meta.action_dim}), got {prefix.shape}",
                )
            _check_finite(name, prefix)
        missing = [cam for cam in meta.camera_names if cam not in obs.images]
        if missing:
            raise WireError(
                BAD_FIELD, f"missing camera image(s) {missing}; policy expects {list(meta.camera_names)}"
            )

    # -- the request path -------------------------------------------------------------------------
    def run_inference_request(
        self, session: SessionView, header: MsgHeader, obs: ObservationMsg
    ) -> ActionChunkMsg:
        """One request, synchronously: validated, then the same code the engine worker runs."""
        self.validate(session, obs)
        result = self.run_batch([InferenceItem.of(session, header, obs)])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def run_batch(self, items: Sequence[InferenceItem]) -> list[ActionChunkMsg | BaseException]:
        """Per-item results: one failing request never fails the others. Items are already validated
        (``infer`` and ``run_inference_request`` do it before anything is queued)."""
        results: list[ActionChunkMsg | BaseException] = [PolicyError(INFERENCE_ERROR, "not run")] * len(items)
        prepared: list[tuple[int, _Prepared]] = []
        for index, item in enumerate(items):
            try:
                prepared.append((index, self._prepare(item)))
            except Exception as exc:
                results[index] = _failure("pre-processing", exc)
        if not prepared:
            return results
        started = time.perf_counter()
        chunks = self._predict([p.request for _, p in prepared])
        inference_ms = (time.perf_counter() - started) * 1000.0
        for (index, prep), chunk in zip(prepared, chunks, strict=True):
            if isinstance(chunk, BaseException):
                results[index] = _failure("policy", chunk)
                continue
            try:
                results[index] = self._finish(prep, chunk, inference_ms)
            except Exception as exc:
                results[index] = _failure("post-processing", exc)
        return results

    def _prepare(self, item: InferenceItem) -> _Prepared:
        obs = item.obs
        observation = {"state": obs.state, "images": dict(obs.images), "task": obs.task or item.task}
        batch = item.processors.pre(observation)
        prefix = self._prefix(item.rtc_enabled, obs)
        real_steps = None if prefix is None else min(len(prefix), self.execution_horizon)
        padded = None if prefix is None else normalize_prefix_length(prefix, self.execution_horizon)
        request = PolicyRequest(batch, int(obs.inference_delay_steps), padded, prefix_steps=real_steps)
        return _Prepared(item, request)

    def _prefix(self, rtc_enabled: bool, obs: ObservationMsg) -> np.ndarray | None:
        """The model-space prefix as sent (not yet padded or cut); None without RTC."""
        if not (rtc_enabled and self.metadata.supports_rtc):
            return None
        prefix = obs.prefix_model
        if prefix is None and obs.prefix_robot is not None:
            to_model = getattr(self.policy, "actions_to_model", None)
            if not callable(to_model):
                raise WireError(
                    BAD_FIELD, "this policy cannot map prefix_robot to model space; send prefix_model"
                )
            prefix = np.asarray(to_model(obs.prefix_robot), dtype=np.float32)
        if prefix is None or prefix.shape[0] == 0:
            return None
        return prefix

    def _predict(self, requests: list[PolicyRequest]) -> list[Any]:
        if self.batched:
            try:
                chunks = list(self.policy.predict_action_chunks(requests))  # type: ignore[attr-defined]
                if len(chunks) != len(requests):
                    raise RuntimeError(f"policy returned {len(chunks)} chunks for {len(requests)} requests")
                return chunks
            except Exception as exc:
                if len(requests) == 1:
                    return [exc]
                # Find the culprit: rerun one by one so the other sessions still get their chunks.
                # Logged even when every retry succeeds: a batch-only failure is a bug to look at.
                logger.error("batched policy call of %d requests failed; retrying one by one", len(requests),
                             exc_info=exc)  # fmt: skip
                return [self._predict([request])[0] for request in requests]
        out: list[Any] = []
        for request in requests:
            try:
                out.append(
                    self.policy.predict_action_chunk(
                        request.batch,
                        inference_delay=request.inference_delay,
                        prev_chunk_left_over=request.prev_chunk_left_over,
                    )
                )
            except Exception as exc:
                out.append(exc)
        return out

    def _finish(self, prep: _Prepared, chunk: Any, inference_ms: float) -> ActionChunkMsg:
        chunk_model = self._as_chunk(chunk, "policy")
        chunk_robot = self._as_chunk(prep.item.processors.post(chunk_model.copy()), "post-processor")
        if chunk_robot.shape[0] != chunk_model.shape[0]:
            raise PolicyError(
                INFERENCE_ERROR, f"post-processor changed the chunk length to {chunk_robot.shape[0]}"
            )
        return ActionChunkMsg(
            chunk_model=chunk_model,
            chunk_robot=chunk_robot,
            inference_delay_steps=prep.request.inference_delay,
            inference_ms=inference_ms,
            header=prep.item.header,
        )

    def _as_chunk(self, value: Any, source: str) -> np.ndarray:
        """A float32 ``(steps, action_dim)`` array from whatever the policy returned (numpy or torch)."""
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: refused below
            chunk = np.asarray(value, dtype=np.float32)
        if chunk.ndim == 3 and chunk.shape[0] == 1:
            chunk = chunk[0]
        if chunk.ndim != 2 or chunk.shape[1] != self.metadata.action_dim:
            raise PolicyError(
                INFERENCE_ERROR,
                f"{source} returned shape {chunk.shape}, expected (steps, {self.metadata.action_dim})",
            )
        if not np.isfinite(chunk).all():
            raise PolicyError(INFERENCE_ERROR, f"{source} returned non-finite actions (NaN or inf)")
        return np.ascontiguousarray(chunk)


def _check_float32(name: str, array: np.ndarray) -> None:
    if array.dtype != np.float32:
        raise WireError(UNSUPPORTED_DTYPE, f"{name} must be float32, got {array.dtype}")


def _check_finite(name: str, array: np.ndarray) -> None:
    """NaN and inf inputs would come back as an all-NaN chunk that looks like a success."""
    if not np.isfinite(array).all():
        raise WireError(BAD_FIELD, f"{name} holds NaN or inf values")
