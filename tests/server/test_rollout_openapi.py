"""/openapi.json and /docs describe every rollout route with its models, while the served routes
stay plain Starlette handlers (the fast path)."""

from __future__ import annotations

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

PREFIX = "/v1/realtime"
# (method, path, request model or None, 200 model)
ROUTES = [
    ("post", "/sessions", "CreateSessionRequest", "CreateSessionResponse"),
    ("post", "/sessions/{session_id}/step", "RolloutStepRequest", "RolloutStepResponse"),
    ("post", "/sessions/{session_id}/reset", "ResetSessionRequest", "ResetSessionResponse"),
    ("post", "/sessions/{session_id}/close", None, "CloseSessionResponse"),
    ("get", "/sessions/{session_id}/status", None, "SessionStatusResponse"),
    ("post", "/sessions/{session_id}/fork", "ForkSessionRequest", "CreateSessionResponse"),
    ("post", "/batch_step", "BatchStepRequest", "BatchStepResponse"),
    ("post", "/batch_step/columns", "BatchStepColumnsRequest", "BatchStepColumnsResponse"),
]


def ref(name: str) -> str:
    return f"#/components/schemas/{name}"


def refs(schema: dict) -> set[str]:
    """Every $ref in a (possibly anyOf) schema."""
    if "$ref" in schema:
        return {schema["$ref"]}
    return {r for part in schema.get("anyOf", []) for r in refs(part)}


@pytest.fixture(scope="module")
def app():
    settings = ServerSettings(max_batch_wait_ms=0.0)
    return create_app(settings, rollout=RolloutService(ToyWorld(), settings))


@pytest.fixture(scope="module")
def spec(app) -> dict:
    with serving(app) as server:
        docs = httpx.get(server.http_url + "/docs")
        assert docs.status_code == 200 and "swagger-ui" in docs.text.lower() and "/openapi.json" in docs.text
        resp = httpx.get(server.http_url + "/openapi.json")
        assert resp.status_code == 200
        return resp.json()


@pytest.mark.parametrize(("method", "path", "request_model", "response_model"), ROUTES)
def test_every_rollout_route_is_documented_with_its_models(spec, method, path, request_model, response_model):
    operation = spec["paths"][PREFIX + path][method]
    assert refs(operation["responses"]["200"]["content"]["application/json"]["schema"]) == {
        ref(response_model)
    }
    if request_model is None:
        assert "requestBody" not in operation
    else:
        content = operation["requestBody"]["content"]
        assert set(content) == {"application/json", "application/msgpack"}
        for media in content.values():
            assert ref(request_model) in refs(media["schema"])
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {"X-Rollserve-Status-Codes"}
    for status in ("400", "404", "503"):
        error_models = refs(operation["responses"][status]["content"]["application/json"]["schema"])
        if path.endswith("/step"):
            assert error_models == {ref("RolloutStepResponse")}  # a step's error is a full step body
        else:
            assert error_models == {ref("VllmErrorResponse"), ref("ErrorResponse")}
    for name in (request_model, response_model):
        if name:
            assert name in spec["components"]["schemas"]


def test_the_schemas_carry_the_fields_clients_rely_on(spec):
    schemas = spec["components"]["schemas"]
    assert {"step_id", "next_observation", "model_metadata", "error", "replayed"} <= set(
        schemas["RolloutStepResponse"]["properties"]
    )
    assert "committed_step_id" in schemas["SessionMetadata"]["required"]
    assert set(schemas["VllmErrorResponse"]["properties"]) == {"detail", "error"}
    assert {"message", "type", "param", "code", "reason"} <= set(schemas["VllmErrorInfo"]["properties"])
    assert set(spec["paths"]["/health"]["get"]["responses"]) == {"200", "503"}  # 503: engine shut down


def test_the_served_rollout_routes_stay_plain_starlette(app):
    (mount,) = [r for r in app.routes if isinstance(r, Mount) and r.path == PREFIX]
    served = mount.routes
    assert len(served) == len(ROUTES)
    assert all(isinstance(r, Route) and not isinstance(r, APIRoute) for r in served)
    assert {r.path for r in served} == {path for _, path, _, _ in ROUTES}
