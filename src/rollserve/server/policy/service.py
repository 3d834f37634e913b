"""The policy side of the server, without any transport.

``PolicyServer`` is the pure request path (validate, pre-process, RTC prefix, policy call,
post-process), usable in-process and in tests. ``PolicyService`` puts it behind one
``BatchingWorker`` that owns the model and adds the session store, so transports only decode,
submit and reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollserve.engine.batcher import BatchingWorker, EngineClosed, Superseded
from rollserve.models.policy import Policy, PolicyMetadata, PolicyRequest, make_processors
from rollserve.rtc.prefix import normalize_prefix_length
from rollserve.server.policy.errors import (
    INFERENCE_ERROR,
    STALE_EPOCH,
    UNAVAILABLE,
    UNKNOWN_SESSION,
    PolicyError,
)
from rollserve.server.policy.sessions import PolicySession, PolicySessionStore, SessionLimitReached
from rollserve.server.settings import ServerSettings
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE, WireError
from rollserve.wire.messages import (
    SCHEMA_VERSION,
    ActionChunkMsg,
    MsgHeader,
    ObservationMsg,
    SessionAck,
    SessionOpen,
)

logger = logging.getLogger(__name__)

DEFAULT_EXECUTION_HORIZON = 10


@dataclass
class InferenceItem:
    """One request as the engine worker sees it."""

    session: PolicySession
    header: MsgHeader
    obs: ObservationMsg


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


class PolicyServer:
    """The transport-free request path; ``run_batch`` is what the engine worker runs."""

    def __init__(self, policy: Policy, *, execution_horizon: int | None = None) -> None:
        self.policy = policy
        self.metadata: PolicyMetadata = policy.metadata
        self.execution_horizon = resolve_execution_horizon(policy, execution_horizon)
        self.batched = bool(self.metadata.supports_batching) and callable(
            getattr(policy, "predict_action_chunks", None)
        )

    # -- checks that need no model (also run on the event loop before queueing) ------------------
    def validate(self, session: PolicySession, obs: ObservationMsg) -> None:
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
        if obs.inference_delay_steps < 0:
            raise WireError(BAD_FIELD, f"inference_delay_steps must be >= 0, got {obs.inference_delay_steps}")
        for name in ("prefix_model", "prefix_robot"):
            prefix = getattr(obs, name)
            if prefix is None:
                continue
            _check_float32(name, prefix)
            if prefix.ndim != 2 or prefix.shape[1] != meta.action_dim:
                raise WireError(
                    BAD_SHAPE, f"{name} must be 2-D (steps, {meta.action_dim}), got {prefix.shape}"
                )
        missing = [cam for cam in meta.camera_names if cam not in obs.images]
        if missing:
            raise WireError(
                BAD_FIELD, f"missing camera image(s) {missing}; policy expects {list(meta.camera_names)}"
            )

    # -- the request path -------------------------------------------------------------------------
    def run_inference_request(
        self, session: PolicySession, header: MsgHeader, obs: ObservationMsg
    ) -> ActionChunkMsg:
        """One request, synchronously: validated, then the same code the engine worker runs."""
        self.validate(session, obs)
        result = self.run_batch([InferenceItem(session, header, obs)])[0]
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
        session, obs = item.session, item.obs
        observation = {"state": obs.state, "images": dict(obs.images), "task": obs.task or session.task}
        batch = session.processors.pre(observation)
        prefix = self._prefix(session, obs)
        real_steps = None if prefix is None else min(len(prefix), self.execution_horizon)
        padded = None if prefix is None else normalize_prefix_length(prefix, self.execution_horizon)
        request = PolicyRequest(batch, int(obs.inference_delay_steps), padded, prefix_steps=real_steps)
        return _Prepared(item, request)

    def _prefix(self, session: PolicySession, obs: ObservationMsg) -> np.ndarray | None:
        """The model-space prefix as sent (not yet padded or cut); None without RTC."""
        if not (session.rtc_enabled and self.metadata.supports_rtc):
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
        chunk_robot = self._as_chunk(prep.item.session.processors.post(chunk_model.copy()), "post-processor")
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
        chunk = np.asarray(value, dtype=np.float32)
        if chunk.ndim == 3 and chunk.shape[0] == 1:
            chunk = chunk[0]
        if chunk.ndim != 2 or chunk.shape[1] != self.metadata.action_dim:
            raise PolicyError(
                INFERENCE_ERROR,
                f"{source} returned shape {chunk.shape}, expected (steps, {self.metadata.action_dim})",
            )
        return np.ascontiguousarray(chunk)


def _check_float32(name: str, array: np.ndarray) -> None:
    if array.dtype != np.float32:
        raise WireError(UNSUPPORTED_DTYPE, f"{name} must be float32, got {array.dtype}")


class PolicyService:
    """A served policy: its engine worker, its sessions, and what ``/v1/models`` says about it."""

    def __init__(
        self,
        policy: Policy,
        settings: ServerSettings | None = None,
        *,
        execution_horizon: int | None = None,
        openpi_layout: str = "auto",
        spec: str | None = None,
    ) -> None:
        self.settings = settings or ServerSettings()
        self.server = PolicyServer(policy, execution_horizon=execution_horizon)
        self.sessions = PolicySessionStore(self.settings.max_policy_sessions, lambda: make_processors(policy))
        self.openpi_layout = openpi_layout
        self.spec = spec
        self.worker: BatchingWorker[InferenceItem, ActionChunkMsg] = BatchingWorker(
            self.server.run_batch,
            max_batch_size=self.settings.max_batch_size if self.server.batched else 1,
            max_wait_s=self.settings.max_batch_wait_ms / 1000.0,
            name="rollserve-policy-engine",
        )

    @classmethod
    def from_spec(
        cls,
        spec: str,
        settings: ServerSettings | None = None,
        *,
        policy_kwargs: dict[str, Any] | None = None,
        **kw: Any,
    ) -> PolicyService:
        """Load ``module.path:factory`` and serve it."""
        from rollserve.models.loading import load_policy

        return cls(load_policy(spec, **(policy_kwargs or {})), settings, spec=spec, **kw)

    @property
    def policy(self) -> Policy:
        return self.server.policy

    @property
    def metadata(self) -> PolicyMetadata:
        return self.server.metadata

    # -- sessions --------------------------------------------------------------------------------
    def open_session(self, request: SessionOpen) -> tuple[SessionAck, PolicySession | None]:
        """Accept (with what the policy expects) or refuse with a reason; never raises."""
        reason = self._refusal(request)
        session = None
        if not reason:
            try:
                session = self.sessions.open(
                    request.client_uuid,
                    task=request.task,
                    robot_type=request.robot_type,
                    rtc_enabled=request.rtc_enabled and self.metadata.supports_rtc,
                    camera_names=tuple(request.camera_names),
                )
            except SessionLimitReached as exc:
                reason = str(exc)
        meta = self.metadata
        ack = SessionAck(
            accepted=session is not None,
            reason=reason,
            session_id=session.session_id if session else "",
            session_epoch=session.epoch if session else 0,
            chunk_size=meta.chunk_size,
            action_names=list(meta.action_names),
            camera_names=list(meta.camera_names),
            state_dim=meta.state_dim,
            rtc_supported=meta.supports_rtc,
            execution_horizon=self.server.execution_horizon,
            fps=meta.fps,
            server_load=self.server_load(),
            policy=meta.to_dict(),
        )
        return ack, session

    def _refusal(self, request: SessionOpen) -> str:
        meta = self.metadata
        if request.schema_version != SCHEMA_VERSION:
            return (
                f"schema_version {request.schema_version} is not supported (server speaks {SCHEMA_VERSION})"
            )
        if request.state_dim is not None and request.state_dim != meta.state_dim:
            return f"state_dim {request.state_dim} does not match the policy's {meta.state_dim}"
        if request.action_names and tuple(request.action_names) != meta.action_names:
            return f"action_names {request.action_names} do not match the policy's {list(meta.action_names)}"
        missing = [
            cam for cam in meta.camera_names if request.camera_names and cam not in request.camera_names
        ]
        if missing:
            return f"policy needs camera(s) {missing}; the robot offers {request.camera_names}"
        return ""

    def reset_session(self, session: PolicySession) -> int:
        return self.sessions.reset(session)

    def close_session(self, session: PolicySession) -> None:
        self.sessions.close(session.session_id)

    # -- inference -------------------------------------------------------------------------------
    async def infer(self, session: PolicySession, header: MsgHeader, obs: ObservationMsg) -> ActionChunkMsg:
        """Queue one observation on the engine; raises ``Superseded`` when a newer one of the session came."""
        if not self.sessions.is_open(session):
            raise PolicyError(UNKNOWN_SESSION, "no such session (never opened, closed, or replaced)")
        if header.session_epoch != session.epoch:
            raise PolicyError(
                STALE_EPOCH, f"session_epoch {header.session_epoch} is not the current {session.epoch}"
            )
        self.server.validate(session, obs)
        session.touch()
        item = InferenceItem(session, header, obs)
        try:
            done = await self.worker.submit(item, key=session.session_id, tag=header.seq_id)
        except Superseded:
            # Delivered on this loop before the newer request can finish: its reply reports it.
            session.note_superseded(header.seq_id)
            raise
        except EngineClosed as exc:
            raise PolicyError(UNAVAILABLE, "the policy engine is shutting down", retryable=True) from exc
        reply = done.value
        reply.queue_wait_ms = done.queue_wait_s * 1000.0
        reply.batch_size = done.batch_size
        reply.superseded_seq_ids = session.take_superseded()
        return reply

    def server_load(self) -> dict[str, Any]:
        return {
            "sessions": len(self.sessions),
            "max_sessions": self.sessions.max_sessions,
            "queue_depth": self.worker.queue_depth,
            "max_batch_size": self.worker.max_batch_size,
        }

    # -- app hooks -------------------------------------------------------------------------------
    def describe_models(self) -> list[dict[str, Any]]:
        meta = self.metadata
        return [
            {
                "id": meta.name,
                "object": "model",
                "owned_by": "rollserve",
                "kind": "policy",
                "spec": self.spec,
                "execution_horizon": self.server.execution_horizon,
                "max_batch_size": self.worker.max_batch_size,
                "routes": {"session": "/v1/policy/ws", "openpi": "/"},
                "metadata": meta.to_dict(),
            }
        ]

    def close(self) -> None:
        """Stop the engine, then let the policy release what it holds."""
        self.worker.close()
        closer = getattr(self.policy, "close", None)
        if callable(closer):
            closer()
