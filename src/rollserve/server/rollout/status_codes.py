"""HTTP status and error body of every rollout error code, in the two modes a server speaks.

``vllm-omni`` (the default) answers exactly as vLLM-Omni's ``api_server.py`` does on
``/v1/realtime/...``: step-id conflicts (a replayed duplicate too) and ``invalid_request`` are 400,
``inference_error`` is a 200 with the error in the step body, an unknown model is a 400, and a
non-step error has vLLM's error body (``{"error": {"message", "type", "param", "code": <status>}}``)
plus FastAPI's ``{"detail": ...}``, so clients reading either find the message.
``strict`` answers with rollserve's semantic codes (409, 422, 404, 415, 500). A server that serves
no world answers every rollout route with vLLM-Omni's 501 (strict: 404).

A server picks its default (``rollserve serve --status-codes``); a request may pick for itself with
the ``X-Rollserve-Status-Codes`` header. Everything rollserve adds stays in the body in both modes.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Literal

from rollserve.server.rollout.protocol import ErrorObject, ErrorResponse, VllmErrorInfo, VllmErrorResponse

StatusMode = Literal["vllm-omni", "strict"]
MODES: tuple[StatusMode, ...] = ("vllm-omni", "strict")
DEFAULT_MODE: StatusMode = "vllm-omni"
MODE_HEADER = "x-rollserve-status-codes"

STRICT: dict[str, int] = {
    "invalid_request": 422,
    "session_not_found": 404,
    "model_not_found": 404,
    "step_already_committed": 409,
    "step_out_of_order": 409,
    "session_exists": 409,
    "session_closed": 410,
    "session_expired": 410,
    "request_timeout": 408,  # a body that did not arrive in time (no vLLM-Omni equivalent)
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "inference_error": 500,
    "internal_error": 500,
    "at_capacity": 503,
    "engine_unavailable": 503,
    "rollout_not_served": 404,  # this server serves no world: the rollout routes do not exist
}
VLLM_OMNI: dict[str, int] = {
    **STRICT,
    "invalid_request": 400,  # vLLM's RequestValidationError handler and the step route: 400
    "model_not_found": 400,  # create raises ValueError -> HTTPException(400)
    "step_already_committed": 400,
    "step_out_of_order": 400,
    "session_exists": 400,  # a conflict, like the step-id ones
    "unsupported_media_type": 400,  # FastAPI fails to validate a non-JSON body -> 400
    "rollout_not_served": 501,  # no rollout serving for this model -> HTTPException(501)
}
IN_BAND_ON_STEP = frozenset({"inference_error"})
"""Codes a step answers with 200 in vLLM-Omni mode (its route maps only the others to a status)."""


def resolve_mode(header: str | None, default: StatusMode) -> StatusMode:
    """The request's mode: its header when it names one, else the server's default."""
    if header:
        value = header.strip().lower()
        if value in MODES:
            return value  # type: ignore[return-value]
    return default


def status_for(code: str, mode: StatusMode, *, step: bool) -> int:
    """The HTTP status of error ``code`` on a step (``step=True``) or any other route."""
    if mode == "vllm-omni":
        if step and code in IN_BAND_ON_STEP:
            return 200
        return VLLM_OMNI.get(code, 500)
    return STRICT.get(code, 500)


def error_body(
    code: str, message: str, committed_step_id: int, status: int, mode: StatusMode
) -> dict[str, Any]:
    """The body of a non-step error: vLLM's error object (strict: rollserve's), typed code inside."""
    if mode == "strict":
        strict = ErrorObject(code=code, message=message, committed_step_id=committed_step_id)
        return ErrorResponse(error=strict).model_dump()
    info = VllmErrorInfo(
        message=message,
        type=HTTPStatus(status).phrase,
        code=status,
        reason=code,
        committed_step_id=committed_step_id,
    )
    return VllmErrorResponse(detail=message, error=info).model_dump()
