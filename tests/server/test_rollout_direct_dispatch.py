"""The rollout routes answered without FastAPI's middleware stack (``RollserveApp``): what a route
takes goes straight to it behind the API-key check, everything else still meets FastAPI, and
middleware a user adds is never skipped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

KEY = "k3y"
AUTH = {"authorization": f"Bearer {KEY}"}
CREATE = {"model": "toy"}
STEP = {"step_id": 0, "observation": {}, "action": {"joint_positions": [0.0] * 7, "gripper_position": 0.0}}


def _app(**settings: Any) -> FastAPI:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    return create_app(config, rollout=RolloutService(ToyWorld(), config))


@pytest.fixture
def fastapi_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests that went through FastAPI's own ``__call__`` (its stack)."""
    calls: list[str] = []
    through_fastapi = FastAPI.__call__

    async def counted(self: FastAPI, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
        await through_fastapi(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", counted)
    return calls


@pytest.fixture(scope="module")
def keyed() -> Iterator[httpx.Client]:
    with serving(_app(api_key=KEY)) as server, httpx.Client(base_url=server.http_url, timeout=30) as client:
        yield client


def test_every_rollout_route_is_answered_without_fastapis_stack(fastapi_calls: list[str]) -> None:
    with serving(_app()) as server, httpx.Client(base_url=server.http_url, timeout=30) as client:
        sid = client.post("/v1/realtime/sessions", json=CREATE).json()["session_id"]
        assert client.post(f"/v1/realtime/sessions/{sid}/step", json=STEP).status_code == 200
        assert client.get(f"/v1/realtime/sessions/{sid}/status").status_code == 200
        assert client.post(f"/v1/realtime/sessions/{sid}/fork", json={}).status_code == 200
        assert client.post(f"/v1/realtime/sessions/{sid}/reset", json={}).status_code == 200
        items = {"items": [{"session_id": sid, **STEP}]}
        assert client.post("/v1/realtime/batch_step", json=items).status_code == 200
        columns = {"session_ids": [sid], "step_ids": [1], "actions": [[0.0] * 8]}
        assert client.post("/v1/realtime/batch_step/columns", json=columns).status_code == 200
        assert client.post(f"/v1/realtime/sessions/{sid}/close").status_code == 200
        assert client.get("/healthz").status_code == 200
    assert fastapi_calls == ["/healthz"]  # the app's own routes still go through FastAPI


def test_a_path_or_method_no_rollout_route_takes_gets_fastapis_answer(fastapi_calls: list[str]) -> None:
    with serving(_app()) as server, httpx.Client(base_url=server.http_url, timeout=30) as client:
        unknown = client.post("/v1/realtime/nothing/here", json={})
        wrong_method = client.get("/v1/realtime/batch_step")
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "Not Found"})
    assert (wrong_method.status_code, wrong_method.json()) == (405, {"detail": "Method Not Allowed"})
    assert wrong_method.headers["allow"] == "POST"
    assert fastapi_calls == ["/v1/realtime/nothing/here", "/v1/realtime/batch_step"]


def test_a_path_that_only_starts_like_the_prefix_is_not_a_rollout_route(fastapi_calls: list[str]) -> None:
    with serving(_app()) as server, httpx.Client(base_url=server.http_url, timeout=30) as client:
        response = client.post("/v1/realtimesessions", json=CREATE)
    assert response.status_code == 404
    assert fastapi_calls == ["/v1/realtimesessions"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/realtime/sessions"),
        ("POST", "/v1/realtime/sessions/s/step"),
        ("POST", "/v1/realtime/sessions/s/reset"),
        ("POST", "/v1/realtime/sessions/s/close"),
        ("POST", "/v1/realtime/sessions/s/fork"),
        ("GET", "/v1/realtime/sessions/s/status"),
        ("POST", "/v1/realtime/batch_step"),
        ("POST", "/v1/realtime/batch_step/columns"),
    ],
)
def test_every_rollout_route_still_needs_the_key(keyed: httpx.Client, method: str, path: str) -> None:
    refused = keyed.request(method, path, json=CREATE)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    assert keyed.request(method, path, json=CREATE, headers=AUTH).status_code != 401


def test_the_key_opens_a_whole_episode(keyed: httpx.Client) -> None:
    sid = keyed.post("/v1/realtime/sessions", json=CREATE, headers=AUTH).json()["session_id"]
    stepped = keyed.post(f"/v1/realtime/sessions/{sid}/step", json=STEP, headers=AUTH)
    assert stepped.status_code == 200
    assert stepped.json()["model_metadata"]["committed_step_id"] == 0


def test_middleware_a_user_adds_sees_the_rollout_routes_too(fastapi_calls: list[str]) -> None:
    seen: list[str] = []

    class Recorder:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.app(scope, receive, send)

    app = _app()
    app.add_middleware(Recorder)
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=30) as client:
        created = client.post("/v1/realtime/sessions", json=CREATE)
    assert created.status_code == 200
    assert seen == fastapi_calls == ["/v1/realtime/sessions"]


async def test_behind_a_root_path_the_routes_are_still_answered_directly(fastapi_calls: list[str]) -> None:
    """A deployment behind a proxy prefix (ASGI ``root_path``): the route still finds its session."""
    app = _app()
    transport = httpx.ASGITransport(app=app, root_path="/api")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        sid = (await client.post("/api/v1/realtime/sessions", json=CREATE)).json()["session_id"]
        stepped = await client.post(f"/api/v1/realtime/sessions/{sid}/step", json=STEP)
        status = await client.get(f"/api/v1/realtime/sessions/{sid}/status")
    assert stepped.status_code == 200
    assert status.json()["session_id"] == sid
    assert status.json()["committed_step_id"] == 0
    assert fastapi_calls == []
