"""The ASGI app: one FastAPI app for every transport (policy websockets, rollout REST, health, metrics).

Routes live in their own modules; this file composes them, so a deployment can serve a policy,
a world, or both from one process, and hands the rollout routes' requests straight to them
(``RollserveApp``): they need nothing of FastAPI's middleware stack.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from rollserve.server.auth import ApiKeyMiddleware
from rollserve.server.metrics import METRICS
from rollserve.server.settings import ServerSettings

if TYPE_CHECKING:
    from rollserve.server.policy.service import PolicyService
    from rollserve.server.rollout.service import RolloutService


class DeploymentView(Protocol):
    """What a scaled-out deployment (``rollserve.scale``) adds: metrics and facts of every replica."""

    async def metrics(self) -> tuple[bytes, str]: ...
    async def describe(self) -> dict[str, Any]: ...


def create_app(
    settings: ServerSettings | None = None,
    *,
    policy: PolicyService | None = None,
    rollout: RolloutService | None = None,
    deployment: DeploymentView | None = None,
) -> FastAPI:
    """Build the app for the given services; each one is optional. With ``deployment`` (one replica
    of many), ``/metrics`` and ``/v1/models`` describe the whole deployment, not this process."""
    settings = settings or ServerSettings()

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        yield
        if policy is not None:
            policy.close()
        if rollout is not None:
            rollout.close()

    app = RollserveApp(title="rollserve", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "OK\n"

    @app.get(
        "/health",
        responses={
            503: {
                "description": "engine_unavailable: a served engine is shut down (vLLM-Omni's error "
                "body; in strict mode rollserve's)"
            }
        },
    )
    async def health(request: Request) -> Response:
        """vLLM-Omni's health probe: 200 ``{"status": "healthy"}`` while every engine runs; 503
        ``engine_unavailable`` once one is closed (vLLM answers 503 when its engine is dead)."""
        engines = [service.engine for service in (rollout,) if service is not None]
        engines += [service.worker for service in (policy,) if service is not None]
        if any(engine.closed for engine in engines):
            return _rollout_error(request, settings, "engine_unavailable", "the engine is shut down")
        return JSONResponse({"status": "healthy"})

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = await deployment.metrics() if deployment else METRICS.render()
        return Response(content=body, media_type=content_type)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data: list[dict[str, Any]] = []
        if policy is not None:
            data.extend(policy.describe_models())
        if rollout is not None:
            data.extend(rollout.describe_models())
        listing: dict[str, Any] = {"object": "list", "data": data}
        if deployment is not None:
            listing["deployment"] = await deployment.describe()
        return listing

    if policy is not None:
        from rollserve.server.policy.routes import add_policy_routes

        add_policy_routes(app, policy, settings)
    if rollout is not None:
        from rollserve.server.rollout.openapi import rollout_openapi_routes
        from rollserve.server.rollout.routes import ROUTE_PREFIX, build_rollout_router

        router = build_rollout_router(rollout, settings)
        app.mount(ROUTE_PREFIX, router)
        app.answer_directly(ROUTE_PREFIX, router.routes, settings.api_key)
        _document(app, rollout_openapi_routes(ROUTE_PREFIX))
    else:  # vLLM-Omni answers every rollout route with 501 when the model serves no rollouts
        from rollserve.server.rollout.routes import ROUTE_PREFIX

        async def not_served(request: Request) -> Response:
            message = "RL rollout serving is not available: this server serves no world"
            return _rollout_error(request, settings, "rollout_not_served", message)

        app.add_route(ROUTE_PREFIX + "/{path:path}", not_served, ["GET", "POST"], include_in_schema=False)

    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    return app


class RollserveApp(FastAPI):
    """FastAPI, except that a request for one of the rollout routes skips FastAPI's middleware stack.

    Those routes are plain Starlette handlers that read, check and answer everything themselves, so
    the stack only added work to each request: FastAPI's OpenTelemetry probe, five middlewares and
    a match against every route of the app, 70-105 µs of a refused step's 250-285 µs in process
    (docs/performance.md, "REST requests without FastAPI's middleware stack"). Such a
    request is answered by its route behind the same API-key check; anything else (a path or
    method under the prefix that no route takes included) goes through FastAPI as before. An app
    given middleware of its own (``add_middleware`` after ``create_app``) serves every request
    through it, so nothing a user adds is skipped.
    """

    _direct_prefix = ""
    _direct_routes: Sequence[tuple[BaseRoute, ASGIApp]] = ()
    _direct_allowed: bool | None = None  # decided at the first request, once middleware is final

    def answer_directly(self, prefix: str, routes: Sequence[BaseRoute], api_key: str | None) -> None:
        """Answer requests that ``routes`` (mounted at ``prefix``) take without FastAPI's stack."""
        self._direct_prefix = prefix
        self._direct_routes = [(route, ApiKeyMiddleware(route.handle, api_key=api_key)) for route in routes]

    # Not mutated (tools/mutation.py): uvicorn calls ``app()`` to tell a factory from an app, and
    # a mutation tool's wrapper would answer it. The decision it makes is ``_direct_route``'s.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no mutate block
        direct = self._direct_route(scope)
        if direct is None:
            await super().__call__(scope, receive, send)
        else:
            app, mounted = direct
            await app(mounted, receive, send)

    def _direct_route(self, scope: Scope) -> tuple[ASGIApp, Scope] | None:
        """The rollout route that answers ``scope`` itself and the scope it gets, or None: FastAPI's."""
        if scope["type"] != "http" or not self._direct_routes or not self._answers_directly():
            return None
        mounted = self._mounted_scope(scope)
        if mounted is None:
            return None
        for route, app in self._direct_routes:
            match, child = route.matches(mounted)
            if match is Match.FULL:
                mounted.update(child)
                return app, mounted
        return None

    def _answers_directly(self) -> bool:
        if self._direct_allowed is None:
            self._direct_allowed = all(m.cls is ApiKeyMiddleware for m in self.user_middleware)
        return self._direct_allowed

    def _mounted_scope(self, scope: Scope) -> Scope | None:
        """The scope the mount at the prefix would hand its routes, or None outside the prefix."""
        root = scope.get("root_path", "")
        path = scope["path"]
        if root and path.startswith(root + "/"):
            path = path[len(root) :]  # the path within the app, as Starlette's routing reads it
        if not path.startswith(self._direct_prefix + "/"):
            return None
        return {**scope, "root_path": root + self._direct_prefix}


def _rollout_error(request: Request, settings: ServerSettings, code: str, message: str) -> Response:
    """A non-step rollout error in the request's status-code mode (vLLM-Omni's or strict)."""
    from rollserve.server.rollout.status_codes import MODE_HEADER, error_body, resolve_mode, status_for

    mode = resolve_mode(request.headers.get(MODE_HEADER), settings.rollout_status_codes)
    status = status_for(code, mode, step=False)
    return JSONResponse(error_body(code, message, -1, status, mode), status_code=status)


def _document(app: FastAPI, extra: list[APIRoute]) -> None:
    """``/openapi.json`` (and so ``/docs``) also describes ``extra``: schema-only declarations of
    routes served by plain Starlette handlers, which FastAPI cannot see."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(
                title=app.title, version=app.version, routes=[*app.routes, *extra]
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
