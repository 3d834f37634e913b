"""HTTP routes of the rollout API: bodies in (JSON or msgpack), status codes out. No rules here.

Every error answers with a typed body; its status follows the request's mode (vLLM-Omni's codes by
default, rollserve's semantic ones in strict mode, see ``status_codes``). A step's error body is
still the full step response, so the client learns ``committed_step_id`` from it. Bodies are read
with a size cap before anything is parsed, and nothing internal (tracebacks) is sent.

Bodies above 64 KiB (or carrying a JPEG) are parsed, validated and fingerprinted on a worker
thread, so a big body never stalls other clients; small ones stay on the event loop (no hand-off).
A JSON body may hold at most ``max_json_values`` values (counted before parsing: ``json.loads``
holds the GIL for its whole run), a msgpack body is budgeted while it unpacks. A connection whose
requests keep being refused for what they hold gets its refusals later each time (``penalty``).
A body must arrive within the service's ``body_timeout_s`` plus one second per
:data:`BODY_MIN_RATE` bytes received (``request_timeout``, and the connection is closed): a client
that sends part of a body and then nothing must not hold a task, a lane or a shutdown forever. A
client that leaves mid-body is not an error of anyone's: nobody is left to answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from rollserve.server.metrics import METRICS
from rollserve.server.offload import JPEG_TAG, OFFLOAD_BYTES
from rollserve.server.penalty import RefusalPenalty, http_streak
from rollserve.server.rollout.batch_peek import declared_items
from rollserve.server.rollout.protocol import (
    Action,
    BatchStepColumnsRequest,
    BatchStepColumnsResponse,
    BatchStepItem,
    BatchStepRequest,
    BatchStepResponse,
    BatchStepResult,
    CreateSessionRequest,
    ErrorObject,
    ForkSessionRequest,
    Observation,
    ResetSessionRequest,
    RolloutStepRequest,
    RolloutStepResponse,
    SessionMetadata,
    built,
)
from rollserve.server.rollout.status_codes import MODE_HEADER, error_body, resolve_mode, status_for
from rollserve.server.rollout.store import RolloutError
from rollserve.wire.codec import packb, unpackb
from rollserve.wire.errors import FRAME_TOO_LARGE, TOO_MANY_OBJECTS, WireError
from rollserve.wire.limits import WireLimits

if TYPE_CHECKING:
    from rollserve.server.rollout.service import RolloutService
    from rollserve.server.settings import ServerSettings

logger = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack")
_TOO_LARGE = frozenset({FRAME_TOO_LARGE, TOO_MANY_OBJECTS})
# what the client got wrong (a connection sending only these is slowed down); conflicts, expiry,
# capacity and the server's own failures never count
_CLIENT_FAULTS = frozenset(
    {"invalid_request", "payload_too_large", "unsupported_media_type", "session_not_found", "model_not_found"}
)

Body = TypeVar("Body", bound=BaseModel)


class _NoBody(BaseModel):
    """Routes that take no body (close, status) ignore whatever body comes, as vLLM-Omni's do:
    read within the body limits, never parsed."""


ROUTE_PREFIX = "/v1/realtime"
BODY_MIN_RATE = 256 * 1024  # bytes per second a body may take beyond its deadline: big uploads may be slow


def build_rollout_router(service: RolloutService, settings: ServerSettings) -> Router:
    """The routes over ``service``, to mount at :data:`ROUTE_PREFIX`.

    Plain Starlette routes: each parses its own body, so FastAPI's dependency layer would only add
    work (~30 µs per request).
    """
    limits = dataclasses.replace(
        settings.limits, max_frame_bytes=min(settings.limits.max_frame_bytes, settings.max_body_bytes)
    )
    json_values = settings.max_json_values
    penalty = RefusalPenalty(
        settings.refusal_delay_ms, settings.refusal_delay_max_ms, settings.refused_connection_lanes
    )

    def parse(data: bytes, media: str, body_model: type[Body], route: str) -> tuple[Any, Body]:
        """Bytes to a validated request (raw map kept for error replies). Runs on a worker thread
        for big bodies; raises ``_Refused`` carrying the raw map when it got that far."""
        if body_model is _NoBody:
            return {}, _NoBody()  # type: ignore[return-value]
        parsed = _decode(data, media, limits, json_values)
        try:
            for key in _BATCH_LISTS.get(route, ()):
                items = parsed.get(key)
                if isinstance(items, list):
                    _refuse_long_batch(items, service.max_batch_items)
            request = _validated(body_model, parsed, limits)
            for step in _steps(request):
                service.fingerprint(step)
        except (ValidationError, RolloutError) as exc:
            raise _Refused(parsed, exc) from None
        return parsed, request

    async def serve(
        request: Request,
        route: str,
        body_model: type[Body],
        call: Callable[[Body, bool], Awaitable[BaseModel]],
        *,
        body_optional: bool = False,
    ) -> Response:
        """Answer the request; a connection with a refusal streak is answered in the shared lane,
        and a refusal that is the client's fault is sent after the connection's delay. A route on
        a session (its id in the path) reports that session's ``committed_step_id`` in errors."""
        streak = http_streak(request.scope)
        session_id = request.path_params.get("session_id")
        async with penalty.lane(streak):
            code, response = await answer(request, route, body_model, call, session_id, body_optional)
        if streak is not None:
            if code in _CLIENT_FAULTS:
                await penalty.hold(streak)
            else:
                penalty.served(streak)
        return response

    async def answer(
        request: Request,
        route: str,
        body_model: type[Body],
        call: Callable[[Body, bool], Awaitable[BaseModel]],
        session_id: str | None,
        body_optional: bool,
    ) -> tuple[str | None, Response]:
        """The response and its error code (None for a success)."""
        METRICS.count_request(route)
        raw = _wants_msgpack(request)
        mode = resolve_mode(request.headers.get(MODE_HEADER), settings.rollout_status_codes)
        parsed: Any = None
        try:
            data, media = await _read(request, limits, service.body_timeout_s, optional=body_optional)
            if route == "batch_step" and media in _MSGPACK_TYPES:
                _refuse_long_batch(data, service.max_batch_items)
            if len(data) > OFFLOAD_BYTES or (media in _MSGPACK_TYPES and JPEG_TAG in data):
                parsed, body = await asyncio.to_thread(parse, data, media, body_model, route)
            else:
                parsed, body = parse(data, media, body_model, route)
            result = await call(body, raw)
        except _Refused as exc:  # the request's own validation, the only client fault pydantic finds
            parsed, error = exc.parsed, _as_rollout_error(exc.error)
        except RolloutError as exc:
            error = exc
        except ClientDisconnect:  # the client left mid-body: no answer can reach it, nothing failed
            logger.debug("client left during the body of a %s request", route)
            return None, Response(status_code=400)
        except Exception:
            logger.exception("rollout route %s failed", route)
            error = RolloutError("internal_error", "internal server error")
        else:
            code = result.error.code if isinstance(result, RolloutStepResponse) and result.error else None
            if code:
                METRICS.count_error(route, code)
            status = status_for(code, mode, step=route == "step") if code else 200
            return code, _render(result, status, raw)
        METRICS.count_error(route, error.code)
        status = status_for(error.code, mode, step=route == "step")
        if route == "step" and session_id is not None:
            step_id = _echoed_step_id(parsed.get("step_id") if isinstance(parsed, dict) else None)
            refused = await service.refused_step(session_id, step_id, error.code, error.message)
            response = _render(refused, status, raw)
        else:
            committed = error.committed_step_id
            if session_id is not None:
                committed = await _committed_step_id(service, session_id, committed)
            body = error_body(error.code, error.message, committed, status, mode)
            response = _render_plain(body, status, raw)
        if error.code == "request_timeout":  # the rest of its body may still come: not a next request
            response.headers["connection"] = "close"
        return error.code, response

    async def create_session(request: Request) -> Response:
        return await serve(
            request, "create", CreateSessionRequest, lambda b, raw: service.create_session(b, raw_tensors=raw)
        )

    async def step(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return await serve(
            request,
            "step",
            RolloutStepRequest,
            lambda b, raw: service.step(session_id, b, raw_tensors=raw),
        )

    async def reset(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return await serve(
            request,
            "reset",
            ResetSessionRequest,
            lambda b, raw: service.reset_session(session_id, b, raw_tensors=raw),
            body_optional=True,
        )

    async def close(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return await serve(
            request,
            "close",
            _NoBody,
            lambda b, raw: service.close_session(session_id),
            body_optional=True,
        )

    async def status(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return await serve(
            request,
            "status",
            _NoBody,
            lambda b, raw: service.get_status(session_id),
            body_optional=True,
        )

    async def fork(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        return await serve(
            request,
            "fork",
            ForkSessionRequest,
            lambda b, raw: service.fork_session(session_id, b, raw_tensors=raw),
            body_optional=True,
        )

    async def batch_step(request: Request) -> Response:
        return await serve(
            request, "batch_step", BatchStepRequest, lambda b, raw: service.batch_step(b, raw_tensors=raw)
        )

    async def batch_step_columns(request: Request) -> Response:
        return await serve(
            request,
            "batch_step_columns",
            BatchStepColumnsRequest,
            lambda b, raw: service.batch_step_columns(b, raw_tensors=raw),
        )

    return Router(
        [
            Route("/sessions", create_session, methods=["POST"]),
            Route("/sessions/{session_id}/step", step, methods=["POST"]),
            Route("/sessions/{session_id}/reset", reset, methods=["POST"]),
            Route("/sessions/{session_id}/close", close, methods=["POST"]),
            Route("/sessions/{session_id}/status", status, methods=["GET"]),
            Route("/sessions/{session_id}/fork", fork, methods=["POST"]),
            Route("/batch_step", batch_step, methods=["POST"]),
            Route("/batch_step/columns", batch_step_columns, methods=["POST"]),
        ]
    )


async def _committed_step_id(service: RolloutService, session_id: str, known: int) -> int:
    """The session's real ``committed_step_id`` for a non-step error body (``known`` when the
    session does not exist, or when the store cannot even be asked: the error stays typed)."""
    try:
        committed = await service.committed_step_id(session_id)
    except Exception:
        logger.exception("looking up session %s for an error body failed", session_id)
        return known
    return known if committed is None else committed


# a batch route's lists with a row each, counted before anything in them is validated
_BATCH_LISTS = {"batch_step": ("items",), "batch_step_columns": ("session_ids", "step_ids", "actions")}


def _refuse_long_batch(items: list[Any] | bytes, most: int) -> None:
    """Refuse a batch of more than ``most`` items: a decoded list, or a msgpack body whose
    declared count is read before anything is unpacked (``batch_peek``)."""
    count = len(items) if isinstance(items, list) else declared_items(items)
    if count is not None and count > most:
        raise RolloutError("invalid_request", f"batch_step takes at most {most} items")


def _validated(body_model: type[Body], parsed: dict[str, Any], limits: WireLimits) -> Body:
    """The validated body. A batch that fails validation is validated again item by item, so that
    a bad item fails alone; only then, since one pass over the whole body is cheaper."""
    context = {"limits": limits}
    try:
        return body_model.model_validate(parsed, context=context)
    except ValidationError:
        if body_model is not BatchStepRequest or (batch := _item_by_item(parsed, context)) is None:
            raise
        return batch  # type: ignore[return-value]


def _item_by_item(parsed: dict[str, Any], context: dict[str, Any]) -> BatchStepRequest | None:
    """The batch with each invalid item refused on its own (``_refused``), or None when the body
    itself is wrong: no list of items, or an item without a string ``session_id`` to answer for."""
    items = parsed.get("items")
    if not isinstance(items, list) or not items:
        return None
    checked: list[BatchStepItem] = []
    refused: dict[int, str] = {}
    for i, raw in enumerate(items):
        try:
            checked.append(BatchStepItem.model_validate(raw, context=context))
        except ValidationError as exc:
            session_id = raw.get("session_id") if isinstance(raw, dict) else None
            if not isinstance(session_id, str):
                return None
            checked.append(_stand_in(session_id, raw.get("step_id")))
            refused[i] = _validation_message(exc)
    return built(BatchStepRequest, {"items": checked}, {"_refused": refused})


def _echoed_step_id(step_id: Any) -> int:
    """The step_id a refusal reports: the request's when it is a valid one, else -1 (an id out of
    range, e.g. 2**64, could not even be encoded in a msgpack answer)."""
    return step_id if type(step_id) is int and 0 <= step_id < 2**63 else -1


def _stand_in(session_id: str, step_id: Any) -> BatchStepItem:
    """A refused item's place in the batch: its session, and its step_id (-1 when that is invalid)."""
    fields = {
        "step_id": _echoed_step_id(step_id),
        "observation": Observation(),
        "action": Action(),
        "use_session_context": True,
        "session_id": session_id,
    }
    return built(BatchStepItem, fields, {"_fingerprint": None})


class _Refused(Exception):
    """A body that parsed but was refused; keeps the parsed map so a step error can echo its step_id."""

    def __init__(self, parsed: Any, error: Exception) -> None:
        super().__init__(type(error).__name__)  # not str(error): pydantic would format every error
        self.parsed, self.error = parsed, error


def _as_rollout_error(exc: Exception) -> RolloutError:
    if isinstance(exc, ValidationError):
        return RolloutError("invalid_request", _validation_message(exc))
    assert isinstance(exc, RolloutError)
    return exc


def _steps(request: BaseModel) -> list[RolloutStepRequest]:
    if isinstance(request, RolloutStepRequest):
        return [request]
    if isinstance(request, BatchStepRequest):
        return list(request.items)
    return []


async def _read(
    request: Request, limits: WireLimits, timeout_s: float, *, optional: bool
) -> tuple[bytes, str]:
    """The raw body and its media type, read with the size cap and the deadline (nothing parsed yet)."""
    limit = limits.max_frame_bytes
    declared = request.headers.get("content-length")
    # Refused as soon as it is known to be too large: uvicorn's parser then drops the rest of the
    # body as it arrives (no copy, no wake-up of this task), and the client still reads its 413.
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RolloutError("payload_too_large", f"the body exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    start = asyncio.get_running_loop().time()
    # A declared length fixes the deadline once (a timer reschedule costs ~5 us, on every request);
    # a chunked body's deadline moves on with each chunk received.
    declared_size = None if declared is None else int(declared)
    allowance = 0 if declared_size is None else declared_size / BODY_MIN_RATE
    try:
        async with asyncio.timeout_at(start + timeout_s + allowance) as deadline:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    break
                chunks.append(chunk)
                if declared_size is None and chunk:
                    deadline.reschedule(start + timeout_s + size / BODY_MIN_RATE)
    except TimeoutError:
        allowed = f"{timeout_s:g} s (+1 s per {BODY_MIN_RATE // 1024} KiB)"
        message = f"the body did not arrive within {allowed}: {size} bytes came"
        raise RolloutError("request_timeout", message) from None
    if size > limit:
        raise RolloutError("payload_too_large", f"the body of {size}+ bytes exceeds the limit of {limit}")
    data = b"".join(chunks)
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if not data.strip():
        if optional:
            return b"", "empty"
        raise RolloutError("invalid_request", "the request needs a body")
    return data, media


def _decode(data: bytes, media: str, limits: WireLimits, json_values: int) -> dict[str, Any]:
    """The decoded body (a map). Pure CPU work, safe to run on a worker thread."""
    if media == "empty":
        return {}
    if media in _MSGPACK_TYPES:
        try:
            value = unpackb(data, limits)
        except WireError as exc:
            code = "payload_too_large" if exc.code in _TOO_LARGE else "invalid_request"
            raise RolloutError(code, f"msgpack body rejected ({exc.code}): {exc.message}") from None
    elif media in ("application/json", "", "text/plain") or media.endswith("+json"):
        values = data.count(b",") + data.count(b":") + data.count(b"[") + data.count(b"{") + 1
        if values > json_values:
            message = f"a JSON body may hold at most {json_values} values; send tensors as {MSGPACK}"
            raise RolloutError("payload_too_large", message)
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            raise RolloutError("invalid_request", "the body is not valid JSON") from None
    else:
        raise RolloutError("unsupported_media_type", f"send application/json or {MSGPACK}, not {media!r}")
    if not isinstance(value, dict):
        raise RolloutError("invalid_request", "the body must be a JSON object or msgpack map")
    return value


def _wants_msgpack(request: Request) -> bool:
    accept = request.headers.get("accept", "").lower()
    if any(media in accept for media in _MSGPACK_TYPES):
        return True
    if accept and "*/*" not in accept:
        return False
    content_type = request.headers.get("content-type", "").lower()
    return any(content_type.startswith(media) for media in _MSGPACK_TYPES)


def _render(body: BaseModel, status: int, raw: bool) -> Response:
    if type(body) is BatchStepResponse:
        return _render_plain(_batch_body(body), status, raw)
    if type(body) is RolloutStepResponse:
        return _render_plain(_plain_result(body, _STEP_FIELDS), status, raw)
    if type(body) is BatchStepColumnsResponse:  # the service filled it with wire values only
        return _render_plain(dict(body.__dict__), status, raw)
    if raw:
        return Response(packb(body.model_dump(mode="python")), status_code=status, media_type=MSGPACK)
    return JSONResponse(body.model_dump(mode="json"), status_code=status)


_STEP_FIELDS = tuple(RolloutStepResponse.model_fields)
_RESULT_FIELDS = tuple(BatchStepResult.model_fields)
_METADATA_FIELDS = tuple(SessionMetadata.model_fields)
_ERROR_FIELDS = tuple(ErrorObject.model_fields)


def _batch_body(body: BatchStepResponse) -> dict[str, Any]:
    """What ``model_dump`` gives for a batch, in either mode, at ~1/5 of its cost."""
    return {"object": body.object, "results": [_plain_result(r, _RESULT_FIELDS) for r in body.results]}


def _plain_result(result: BaseModel, names: tuple[str, ...]) -> dict[str, Any]:
    """What ``model_dump`` gives for a step's answer (alone or in a batch), in either mode: the
    service fills ``next_observation`` with wire values only (the tensor as an array for msgpack,
    base64 for JSON; lists, strings, finite numbers), so dumping is copying. Pinned against
    ``model_dump`` by tests/server/test_rollout_fast_paths.py."""
    fields = result.__dict__
    plain = {name: fields[name] for name in names}
    meta = plain["model_metadata"].__dict__
    plain["model_metadata"] = {name: meta[name] for name in _METADATA_FIELDS}
    if plain["error"] is not None:
        error = plain["error"].__dict__
        plain["error"] = {name: error[name] for name in _ERROR_FIELDS}
    return plain


def _render_plain(body: dict[str, Any], status: int, raw: bool) -> Response:
    if raw:
        return Response(packb(body), status_code=status, media_type=MSGPACK)
    return JSONResponse(body, status_code=status)


def _validation_message(exc: ValidationError) -> str:
    """A short, input-free summary (pydantic's own text would echo the client's data back).

    A field that takes one of several types (``gripper_position``: a number or a list) fails once
    per type; where one of them took the value and found it wrong (not finite), the others' "not a
    list" / "not a number" are noise and are left out, and pydantic's names for the types
    (``function-after[_float32(), float]``) never appear in the path."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    paths = [_field_path(err["loc"]) for err in errors]
    judged = {union for (union, _), err in zip(paths, errors, strict=True) if union and not _wrong_type(err)}
    parts = [
        f"{where or 'body'}: {err['msg']}"
        for (union, where), err in zip(paths, errors, strict=True)
        if not (union in judged and _wrong_type(err))
    ]
    shown = parts[:5]
    more = len(parts) - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def _field_path(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """(the path of the union the error came from, or ""; the error's path without type names).
    pydantic puts a union member's name (``float``, ``list[...]``, ``function-after[...]``) in
    ``loc`` right after the field; no field of these bodies is named like one."""
    kept: list[str] = []
    union = ""
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _TYPE_NAMES):
            union = union or ".".join(kept)
            continue
        kept.append(str(part))
    return union, ".".join(kept)


_TYPE_NAMES = frozenset({"int", "float", "str", "bool", "bytes", "list", "dict", "none", "None"})


def _wrong_type(err: Any) -> bool:
    """An error saying the value is not of a member's type (as opposed to a value found wrong)."""
    kind = err["type"]
    return kind.endswith(("_type", "_parsing")) or kind in ("none_required", "is_instance_of")
