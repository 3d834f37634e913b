"""The rollout routes as OpenAPI operations, for ``/openapi.json`` and ``/docs`` only.

The served routes stay plain Starlette routes that parse their own bodies (the fast path, see
``routes``). These FastAPI declarations are never mounted: they describe the same paths, bodies,
headers and answers from the same pydantic models, and ``create_app`` hands them to FastAPI's
schema generator next to the app's own routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header
from fastapi.routing import APIRoute
from pydantic import BaseModel

from rollserve.server.rollout.protocol import (
    BatchStepColumnsRequest,
    BatchStepColumnsResponse,
    BatchStepRequest,
    BatchStepResponse,
    CloseSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    ErrorResponse,
    ForkSessionRequest,
    ResetSessionRequest,
    ResetSessionResponse,
    RolloutStepRequest,
    RolloutStepResponse,
    SessionStatusResponse,
    VllmErrorResponse,
)

ModeHeader = Annotated[
    Literal["vllm-omni", "strict"] | None,
    Header(
        alias="X-Rollserve-Status-Codes",
        description="Status codes for this request: vLLM-Omni's (the server default unless started "
        "with --status-codes strict) or rollserve's semantic ones. Bodies are the same in both.",
    ),
]
_MSGPACK = "application/msgpack"
_STEP_ERRORS = {
    status: {"model": RolloutStepResponse, "description": why}
    for status, why in {
        400: "step-id conflict (also a replayed duplicate, `replayed: true`) or invalid_request "
        "(vLLM-Omni mode); 200 carries an in-band inference_error in that mode",
        404: "session_not_found",
        408: "request_timeout: the body did not arrive in time; the connection is closed",
        409: "step-id conflict (strict mode)",
        410: "session_closed / session_expired",
        413: "payload_too_large",
        415: "unsupported_media_type (strict mode)",
        422: "invalid_request (strict mode)",
        500: "inference_error (strict mode) / internal_error",
        503: "engine_unavailable",
    }.items()
}
_STEP_ERRORS[200] = {"description": "The step's result; in vLLM-Omni mode also an in-band inference_error."}
_ERROR_DOC = (
    "vLLM-Omni mode: vLLM's error body (`VllmErrorResponse`); strict mode: `ErrorResponse`. "
    "See docs/rollout.md for the status of each code."
)
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": VllmErrorResponse | ErrorResponse, "description": _ERROR_DOC}
    for status in (400, 404, 408, 409, 410, 413, 415, 422, 500, 503)
}


def _msgpack(model: type[BaseModel]) -> dict[str, Any]:
    """Declares that the body may be msgpack too (same schema)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"content": {_MSGPACK: {"schema": ref}}}}


def rollout_openapi_routes(prefix: str) -> list[APIRoute]:
    """Schema-only declarations of every rollout route under ``prefix``."""
    router = APIRouter(prefix=prefix, tags=["rollout"])

    @router.post(
        "/sessions",
        response_model=CreateSessionResponse,
        responses=_ERRORS,
        openapi_extra=_msgpack(CreateSessionRequest),
        summary="Create a rollout session",
    )
    def create_session(body: CreateSessionRequest, mode: ModeHeader = None) -> Any:
        """A new session of the served world and its initial observation; a client-chosen
        ``session_id`` makes the create idempotent."""

    @router.post(
        "/sessions/{session_id}/step",
        response_model=RolloutStepResponse,
        responses=_STEP_ERRORS,
        openapi_extra=_msgpack(RolloutStepRequest),
        summary="Step a session",
    )
    def step(session_id: str, body: RolloutStepRequest, mode: ModeHeader = None) -> Any:
        """Apply one step exactly once. Every answer, errors included, is a full step body with
        ``model_metadata.committed_step_id``; a duplicate of the last committed step returns its
        stored result (``replayed: true``). On a world with a policy an empty action lets the
        world act; the chosen action comes back in ``next_observation.actions``."""

    @router.post(
        "/sessions/{session_id}/reset",
        response_model=ResetSessionResponse,
        responses=_ERRORS,
        openapi_extra=_msgpack(ResetSessionRequest),
        summary="Start a new episode in a session",
    )
    def reset(
        session_id: str, body: Annotated[ResetSessionRequest | None, Body()] = None, mode: ModeHeader = None
    ) -> Any:
        """Clears the context (``committed_step_id`` back to -1); optional seed or start state."""

    @router.post(
        "/sessions/{session_id}/close",
        response_model=CloseSessionResponse,
        responses=_ERRORS,
        summary="Close a session (idempotent)",
    )
    def close(session_id: str, mode: ModeHeader = None) -> Any:
        """Releases the session; closing again answers the same."""

    @router.get(
        "/sessions/{session_id}/status",
        response_model=SessionStatusResponse,
        responses=_ERRORS,
        summary="A session's counters (also after close)",
    )
    def status(session_id: str, mode: ModeHeader = None) -> Any:
        """``committed_step_id``, ``context_length``, whether and why it closed."""

    @router.post(
        "/sessions/{session_id}/fork",
        response_model=CreateSessionResponse,
        responses=_ERRORS,
        openapi_extra=_msgpack(ForkSessionRequest),
        summary="Fork a session (rollserve)",
    )
    def fork(
        session_id: str, body: Annotated[ForkSessionRequest | None, Body()] = None, mode: ModeHeader = None
    ) -> Any:
        """A new session holding the committed state, counters and stored last result."""

    @router.post(
        "/batch_step",
        response_model=BatchStepResponse,
        responses=_ERRORS,
        openapi_extra=_msgpack(BatchStepRequest),
        summary="Step many sessions in one batched model call (rollserve)",
    )
    def batch_step(body: BatchStepRequest, mode: ModeHeader = None) -> Any:
        """200 once the body parsed; each item succeeds or fails alone (``status: ok|error``)."""

    @router.post(
        "/batch_step/columns",
        response_model=BatchStepColumnsResponse,
        responses=_ERRORS,
        openapi_extra=_msgpack(BatchStepColumnsRequest),
        summary="Step many sessions, sent and answered as columns (rollserve)",
    )
    def batch_step_columns(body: BatchStepColumnsRequest, mode: ModeHeader = None) -> Any:
        """``batch_step`` for plain contextual steps (an action row per session, no observation) of
        sessions without frames: one array of actions in, one array of observations out. 200 once
        the body parsed; each row succeeds or fails alone (``status``)."""

    return [route for route in router.routes if isinstance(route, APIRoute)]
