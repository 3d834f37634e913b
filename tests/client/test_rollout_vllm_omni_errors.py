"""A genuine vLLM-Omni server's error answers reach the caller as typed errors after one request.

vLLM-Omni's rollout routes (``vllm_omni/entrypoints/openai/api_server.py``) raise
``HTTPException(status, detail=message)``: 501 on every route of a model without rollout serving,
400 for a create naming another model, 503 at capacity, 404 / 410 for an unknown or closed session
on ``reset`` and ``status``; a step answers with its full step body (404, 410, 400). Its app is
vLLM's ``build_app``: with vLLM's ``HTTPException`` handler the body is vLLM's error object
(``{"error": {"message", "type", "param", "code": <status>}}``), without it FastAPI's own
``{"detail": ...}`` (a list of ``{loc, msg}`` for a body that fails validation, 422). Both are
the server's answer: ``RolloutClient`` must raise :class:`RolloutRequestError` carrying the
status and the message, never retry it as a proxy failure. The apps below answer exactly that way,
over real HTTP on 127.0.0.1, and count what they received. A proxy's page (a gateway status, or
a body that is not such JSON) is still retried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.server.running import serving

MODEL = "dreamzero"
SESSIONS = "/v1/realtime/sessions"
ACTION = [0.1] * 7 + [0.5]
NOT_SERVED = "RL rollout serving not available for this model."
FULL = "Maximum number of rollout sessions (0) reached."


class CreateSessionBody(BaseModel):
    model: str
    mode: str = "world_model_env"


class StepBody(BaseModel):
    step_id: int = Field(ge=0)
    observation: dict[str, Any] = {}
    action: dict[str, Any] = {}
    use_session_context: bool = True


def vllm_omni_app(*, serves_rollouts: bool, vllm_handlers: bool) -> tuple[FastAPI, list[str]]:
    """A FastAPI app with vLLM-Omni's rollout routes and their refusals, holding no session (and
    room for none); ``vllm_handlers`` installs vLLM's handlers for ``HTTPException`` and invalid
    bodies. Also returns the list of requests it received."""
    app = FastAPI()
    received: list[str] = []

    @app.middleware("http")
    async def count(request: Request, call_next: Callable[[Request], Any]) -> Any:
        received.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    def rollouts() -> None:
        if not serves_rollouts:
            raise HTTPException(status_code=501, detail=NOT_SERVED)

    @app.post(SESSIONS)
    async def create(body: CreateSessionBody) -> dict[str, Any]:
        rollouts()
        if body.model != MODEL:  # the serving layer's ValueError
            raise HTTPException(status_code=400, detail=f"Unknown model {body.model!r}.")
        raise HTTPException(status_code=503, detail=FULL)  # RolloutSessionCapacityError

    @app.post(SESSIONS + "/{session_id}/step")
    async def step(session_id: str, body: StepBody) -> JSONResponse:
        rollouts()
        error = {
            "code": "session_not_found",
            "message": f"Session {session_id!r} does not exist.",
            "step_id": body.step_id,
            "committed_step_id": -1,
        }
        metadata = {"latency_ms": 0.0, "steps_generated": 0, "context_length": 0, "committed_step_id": -1}
        content = {"step_id": body.step_id, "next_observation": None, "model_metadata": metadata}
        return JSONResponse({**content, "error": error}, status_code=404)

    @app.post(SESSIONS + "/{session_id}/reset")
    async def reset(session_id: str) -> None:
        rollouts()
        raise HTTPException(status_code=404, detail=f"Session {session_id!r} not found.")

    @app.get(SESSIONS + "/{session_id}/status")
    async def status(session_id: str) -> None:
        rollouts()
        raise HTTPException(status_code=404, detail=f"Session {session_id!r} not found.")

    if vllm_handlers:

        @app.exception_handler(HTTPException)
        async def vllm_http_error(_: Request, exc: HTTPException) -> JSONResponse:
            error = {"message": exc.detail, "type": HTTPStatus(exc.status_code).phrase, "param": None}
            return JSONResponse({"error": {**error, "code": exc.status_code}}, status_code=exc.status_code)

        @app.exception_handler(RequestValidationError)
        async def vllm_invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
            message = "; ".join(e["msg"] for e in exc.errors())
            error = {"message": message, "type": "Bad Request", "param": None, "code": 400}
            return JSONResponse({"error": error}, status_code=400)

    return app, received


@pytest.fixture(scope="module", params=["fastapi", "vllm"])
def style(request: pytest.FixtureRequest) -> str:
    """``fastapi``: FastAPI's own error bodies; ``vllm``: vLLM's handlers installed."""
    return request.param


@pytest.fixture(scope="module")
def vllm_omni(style: str) -> Iterator[tuple[str, list[str]]]:
    app, received = vllm_omni_app(serves_rollouts=True, vllm_handlers=style == "vllm")
    with serving(app) as server:
        yield server.http_url, received


def refused(url: str, received: list[str], call: Callable[[RolloutClient], object]) -> RolloutRequestError:
    """The error ``call`` raises, checked to have cost exactly one request and no retry."""
    received.clear()
    with RolloutClient(url, use_msgpack=False, backoff_s=0.001) as client:  # vLLM-Omni reads JSON only
        with pytest.raises(RolloutRequestError) as err:
            call(client)
        assert (len(received), client.retries) == (1, 0), f"retried: {received}"
    return err.value


STEP_BELOW_ZERO = "Input should be greater than or equal to 0"
# call, and (code, status, message) for FastAPI's bodies and with vLLM's handlers
REFUSALS: dict[str, tuple[Callable[[RolloutClient], object], dict[str, tuple[str, int, str]]]] = {
    "create at capacity": (
        lambda c: c.create_session(MODEL, seed=0),
        {"fastapi": ("http_503", 503, FULL), "vllm": ("http_503", 503, FULL)},
    ),
    "create of another model": (
        lambda c: c.create_session("other", seed=0),
        dict.fromkeys(("fastapi", "vllm"), ("http_400", 400, "Unknown model 'other'.")),
    ),
    "status of an unknown session": (
        lambda c: c.status("nobody"),
        dict.fromkeys(("fastapi", "vllm"), ("http_404", 404, "Session 'nobody' not found.")),
    ),
    "reset of an unknown session": (
        lambda c: c.reset("nobody", seed=0),
        dict.fromkeys(("fastapi", "vllm"), ("http_404", 404, "Session 'nobody' not found.")),
    ),
    "step of an unknown session": (  # vLLM-Omni's full step body: its typed code
        lambda c: c.step("nobody", 0, ACTION),
        dict.fromkeys(("fastapi", "vllm"), ("session_not_found", 404, "Session 'nobody' does not exist.")),
    ),
    "step with a negative step_id": (  # the body fails validation before the route runs
        lambda c: c.step("nobody", -1, ACTION),
        {
            "fastapi": ("http_422", 422, f"body.step_id: {STEP_BELOW_ZERO}"),
            "vllm": ("http_400", 400, STEP_BELOW_ZERO),
        },
    ),
    "fork (no such route)": (  # Starlette's own 404, which vLLM's handler does not catch
        lambda c: c.fork("nobody"),
        dict.fromkeys(("fastapi", "vllm"), ("http_404", 404, "Not Found")),
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_of_a_vllm_omni_server_raise_at_once(
    vllm_omni: tuple[str, list[str]], style: str, case: str
) -> None:
    url, received = vllm_omni
    call, expected = REFUSALS[case]
    err = refused(url, received, call)
    assert (err.code, err.status, err.message) == expected[style]


def test_a_vllm_omni_server_without_rollouts_answers_501_once_on_every_route(style: str) -> None:
    app, received = vllm_omni_app(serves_rollouts=False, vllm_handlers=style == "vllm")
    calls: dict[str, Callable[[RolloutClient], object]] = {
        "create": lambda c: c.create_session(MODEL, seed=0),
        "step": lambda c: c.step("s1", 0, ACTION),
        "status": lambda c: c.status("s1"),
        "reset": lambda c: c.reset("s1", seed=0),
    }
    with serving(app) as server:
        for route, call in calls.items():
            err = refused(server.http_url, received, call)
            assert (err.code, err.status, err.message) == ("http_501", 501, NOT_SERVED), route


# -- what stays a proxy's failure: retried, then the transport error ---------------------------------------
PROXY_PAGES = {
    "bare 500": (500, "text/plain", b"Internal Server Error"),
    "HTML 503": (503, "text/html", b"<html><body><h1>503 Service Unavailable</h1></body></html>"),
    "502 with a detail": (502, "application/json", b'{"detail": "Bad Gateway"}'),
    "504 with a detail": (504, "application/json", b'{"detail": "upstream timed out"}'),
    "500 JSON without detail": (500, "application/json", b'{"message": "upstream died"}'),
}


@pytest.mark.parametrize("page", PROXY_PAGES)
def test_a_proxys_page_is_still_retried(page: str) -> None:
    status, media, body = PROXY_PAGES[page]
    received: list[str] = []

    async def proxy(request: Any) -> Response:
        received.append(f"{request.method} {request.url.path}")
        return Response(body, status_code=status, media_type=media)

    app = Starlette(routes=[Route("/{path:path}", proxy, methods=["GET", "POST"])])
    with serving(app) as server, RolloutClient(server.http_url, max_retries=2, backoff_s=0.001) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.status("s1")
        assert (len(received), client.retries) == (3, 2)  # the first try and max_retries more
