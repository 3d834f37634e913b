"""The policy side of the server, without any transport.

``PolicyService`` puts the request path (``rollserve.engine.request_path``) behind one
``BatchingWorker`` that owns the model and adds the session store, so transports only decode,
submit and reply.
"""

from __future__ import annotations

from typing import Any

from rollserve.engine.batcher import BatchingWorker, EngineClosed, Superseded
from rollserve.engine.policy_errors import STALE_EPOCH, UNAVAILABLE, UNKNOWN_SESSION, PolicyError
from rollserve.engine.request_path import InferenceItem, PolicyRequestPath
from rollserve.models.policy import Policy, PolicyMetadata, make_processors
from rollserve.server.metrics import METRICS
from rollserve.server.policy.sessions import PolicySession, PolicySessionStore, SessionLimitReached
from rollserve.server.settings import ServerSettings
from rollserve.wire.messages import (
    SCHEMA_VERSION,
    ActionChunkMsg,
    MsgHeader,
    ObservationMsg,
    SessionAck,
    SessionOpen,
)


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
        self.request_path = PolicyRequestPath(policy, execution_horizon=execution_horizon)
        self.sessions = PolicySessionStore(self.settings.max_policy_sessions, lambda: make_processors(policy))
        self.openpi_layout = openpi_layout
        self.spec = spec
        self.worker: BatchingWorker[InferenceItem, ActionChunkMsg] = BatchingWorker(
            self.request_path.run_batch,
            max_batch_size=self.settings.max_batch_size if self.request_path.batched else 1,
            max_wait_s=self.settings.max_batch_wait_ms / 1000.0,
            name="rollserve-policy-engine",
            inline_below_s=self.settings.inline_below_ms / 1000.0,
            on_batch=METRICS.batch_observer("policy"),  # per model call, not per request
            skip=self._refusal_before_running,
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
        return self.request_path.policy

    @property
    def metadata(self) -> PolicyMetadata:
        return self.request_path.metadata

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
                    rtc_enabled=request.rtc_enabled and self.metadata.supports_rtc,
                )
            except SessionLimitReached as exc:
                reason = str(exc)
            except PolicyError as exc:  # make_processors() failed: a refusal, not a dropped connection
                reason = exc.message
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
            execution_horizon=self.request_path.execution_horizon,
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
        """Queue one observation on the engine; raises ``Superseded`` when a newer one of the session came.

        The session is checked again once the engine answers: a chunk whose session was closed,
        replaced (from any connection) or reset meanwhile is refused, never sent (docs/protocol.md).
        """
        self._require_current(session, header)
        self.request_path.validate(session, obs)
        item = InferenceItem.of(session, header, obs)  # the session's processors as of now
        try:
            done = await self.worker.submit(item, key=session.session_id)
        except Superseded:
            # An old-epoch request superseded by a newer one is refused, not listed in a reply of
            # the new epoch (the client drops the old epoch's outcomes anyway).
            self._require_current(session, header, "while this waited")
            # Delivered on this loop before the newer request can finish: its reply reports it.
            session.note_superseded(header.seq_id)
            raise
        except EngineClosed as exc:
            raise PolicyError(UNAVAILABLE, "the policy engine is shutting down", retryable=True) from exc
        self._require_current(session, header, "while this ran")
        reply = done.value
        reply.queue_wait_ms = done.queue_wait_s * 1000.0
        reply.batch_size = done.batch_size
        reply.superseded_seq_ids = session.take_superseded()  # only ever on a current-epoch reply
        return reply

    def _refusal_before_running(self, item: InferenceItem) -> PolicyError | None:
        """The engine's ``skip``: a queued request whose session was reset, closed or replaced
        meanwhile gets its refusal now, without running (``infer`` would refuse its chunk anyway)."""
        try:
            self._require_current(item.session, item.header, "while this waited")  # type: ignore[arg-type]
        except PolicyError as exc:
            return exc
        return None

    def _require_current(self, session: PolicySession, header: MsgHeader, when: str = "") -> None:
        """Raise ``unknown_session`` unless the session is still its uuid's open one, else
        ``stale_epoch`` unless the request carries the session's current epoch."""
        if not self.sessions.is_open(session):
            detail = f" {when}" if when else ""
            raise PolicyError(UNKNOWN_SESSION, f"no such session (never opened, closed, or replaced{detail})")
        if header.session_epoch != session.epoch:
            detail = f" (reset {when})" if when else ""
            raise PolicyError(
                STALE_EPOCH,
                f"session_epoch {header.session_epoch} is not the current {session.epoch}{detail}",
            )

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
                "execution_horizon": self.request_path.execution_horizon,
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
