"""What ``create_app`` composes, pinned where the mutation run of ``server/app.py`` found it unchecked:
the app carries its settings to uvicorn, its shutdown closes the services, its own error bodies
(health, no world served) name no committed step, the catch-all of a server without a world stays
out of the API schema, and a rollout request whose ASGI scope has no ``root_path`` is still answered
by its route directly."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.status_codes import MODES, status_for
from rollserve.server.running import serving, uvicorn_config
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits

HEADER = "x-rollserve-status-codes"
NO_WORLD = "RL rollout serving is not available: this server serves no world"
STEP = {"observation": {}, "action": {"joint_positions": [0.0] * 7, "gripper_position": 0.0}}


def _settings(**overrides: Any) -> ServerSettings:
    return ServerSettings(max_batch_wait_ms=0.0, **overrides)


def test_the_server_runs_with_the_limits_the_app_was_built_with() -> None:
    settings = _settings(
        max_connections=7, keep_alive_timeout_s=1.25, limits=WireLimits(max_frame_bytes=123_456)
    )
    config = uvicorn_config(create_app(settings), "127.0.0.1", 0)
    assert (config.limit_concurrency, config.timeout_keep_alive, config.ws_max_size) == (7, 1.25, 123_456)


def test_stopping_the_server_closes_every_service_it_serves() -> None:
    settings = _settings()
    policy = PolicyService(ChunkPolicy(), settings)
    rollout = RolloutService(ToyWorld(), settings)
    with serving(create_app(settings, policy=policy, rollout=rollout)) as server:
        assert httpx.get(f"{server.http_url}/health").json() == {"status": "healthy"}
        assert not policy.worker.closed and not rollout.engine.closed
    assert policy.worker.closed and rollout.engine.closed


@pytest.fixture
def no_world() -> Iterator[httpx.Client]:
    """A server per test: mutmut credits a shared fixture's setup (``create_app``) to its first test."""
    settings = _settings()
    with (
        serving(create_app(settings, policy=PolicyService(ChunkPolicy(), settings))) as server,
        httpx.Client(base_url=server.http_url, timeout=30) as client,
    ):
        yield client


@pytest.mark.parametrize("mode", MODES)
def test_a_server_without_a_world_says_so_and_names_no_step(no_world: httpx.Client, mode: str) -> None:
    answer = no_world.post(
        "/v1/realtime/sessions/s1/step", json={"step_id": 3, **STEP}, headers={HEADER: mode}
    )
    assert answer.status_code == {"strict": 404}.get(mode, 501)
    error = answer.json()["error"]
    assert error["message"] == NO_WORLD
    assert error["committed_step_id"] == -1


def test_the_no_world_catch_all_is_not_in_the_api_schema(no_world: httpx.Client) -> None:
    paths = no_world.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith("/v1/realtime")]


def test_the_api_schema_names_rollserve_and_its_version(no_world: httpx.Client) -> None:
    info = no_world.get("/openapi.json").json()["info"]
    assert (info["title"], info["version"]) == ("rollserve", version("rollserve"))


@pytest.mark.parametrize("mode", MODES)
def test_a_closed_engine_fails_the_health_probe_naming_no_step(mode: str) -> None:
    settings = _settings(rollout_status_codes=mode)
    service = RolloutService(ToyWorld(), settings)
    with serving(create_app(settings, rollout=service)) as server:
        service.engine.close()
        answer = httpx.get(f"{server.http_url}/health")
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["committed_step_id"] == -1
    assert (error["code"], error.get("reason")) == (
        ("engine_unavailable", None) if mode == "strict" else (503, "engine_unavailable")
    )


@pytest.mark.parametrize("mode", MODES)
def test_an_error_outside_a_step_names_the_sessions_committed_step(mode: str) -> None:
    """A fork of a closed session that committed steps 0 and 1: the error says step 1 in both modes."""
    settings = _settings(rollout_status_codes=mode)
    with (
        serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server,
        httpx.Client(base_url=server.http_url, timeout=30) as http,
    ):
        sid = http.post("/v1/realtime/sessions", json={"model": "toy"}).json()["session_id"]
        for step_id in (0, 1):
            assert http.post(
                f"/v1/realtime/sessions/{sid}/step", json={"step_id": step_id, **STEP}
            ).is_success
        http.post(f"/v1/realtime/sessions/{sid}/close")
        refused = http.post(f"/v1/realtime/sessions/{sid}/fork", json={})
    assert refused.status_code == 410
    assert refused.json()["error"]["committed_step_id"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_code_no_table_knows_is_a_server_error(mode: str) -> None:
    assert status_for("no_such_code", mode, step=False) == 500  # type: ignore[arg-type]
    assert status_for("no_such_code", mode, step=True) == 500  # type: ignore[arg-type]


async def test_a_scope_without_a_root_path_is_answered_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``root_path`` is optional in an ASGI scope (its default is empty); a server that leaves it out
    still gets the rollout routes answered directly, not through FastAPI's stack."""
    through_fastapi: list[str] = []
    fastapi_call = FastAPI.__call__

    async def counted(self: FastAPI, scope: Any, receive: Any, send: Any) -> None:
        through_fastapi.append(scope["path"])
        await fastapi_call(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", counted)
    settings = _settings()
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/realtime/sessions/nobody/status",
        "raw_path": b"/v1/realtime/sessions/nobody/status",
        "query_string": b"",
        "headers": [(b"host", b"test"), (b"x-rollserve-status-codes", b"strict")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 404
    assert b"session_not_found" in b"".join(m.get("body", b"") for m in sent)
    assert through_fastapi == []
