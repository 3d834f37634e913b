"""What ``/openapi.json`` promises about the rollout routes, checked against docs/rollout.md and the
protocol's own pydantic models rather than against the schema's output: the tag that groups them,
the routes and bodies of the route table, every status the status-code table gives a route, the
error models of each answer, the mode header's values and the models' fields.

The mutation run of ``server/rollout/openapi.py`` left the tag unchecked; mutmut does not mutate
decorator arguments or module constants, so the rest of the declarations are pinned here too."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout import protocol
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "rollout.md").read_text()
PREFIX = "/v1/realtime"
SESSIONS = f"{PREFIX}/sessions"
SCHEMAS = "#/components/schemas/"
# the status table's route names, as the route table spells their paths
ROUTE_NAMES = {
    "create": ("post", SESSIONS),
    "step": ("post", f"{SESSIONS}/{{session_id}}/step"),
    "reset": ("post", f"{SESSIONS}/{{session_id}}/reset"),
    "close": ("post", f"{SESSIONS}/{{session_id}}/close"),
    "status": ("get", f"{SESSIONS}/{{session_id}}/status"),
    "fork": ("post", f"{SESSIONS}/{{session_id}}/fork"),
    "batch_step": ("post", f"{PREFIX}/batch_step"),
    "batch_step/columns": ("post", f"{PREFIX}/batch_step/columns"),
}


def _spec() -> dict[str, Any]:
    """The schema a client reads, from a real server of the toy world."""
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        answer = httpx.get(f"{server.http_url}/openapi.json", timeout=30)
    assert answer.status_code == 200
    return answer.json()


@pytest.fixture
def spec() -> Iterator[dict[str, Any]]:
    """A server per test: mutmut credits a shared fixture's setup (``create_app``) to its first test."""
    yield _spec()


def _rollout_operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, item in spec["paths"].items()
        if path.startswith(PREFIX + "/")
        for method, operation in item.items()
    }


def _doc_routes() -> dict[tuple[str, str], str]:
    """``{(method, path): body cell}`` of the rollout rows of the doc's route table."""
    header = "| route | body | answer |"
    rows: dict[tuple[str, str], str] = {}
    for line in DOC[DOC.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        for method, path in re.findall(r"`(GET|POST) ([^`]+)`", cells[0]):
            path = path.replace("…", SESSIONS).replace("{id}", "{session_id}")
            if path.startswith(PREFIX + "/"):
                rows[(method.lower(), path)] = cells[1]
    return rows


def _doc_statuses() -> dict[str, set[int]]:
    """``{route: statuses}`` the doc's status table gives each route, in either mode."""
    header = "| code | routes | vLLM-Omni mode (default) | strict mode | when |"
    statuses: dict[str, set[int]] = {}
    for line in DOC[DOC.index(header) :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "`rollout_not_served`" in cells[0]:
            continue  # only a server without a world answers it, and its schema has no rollout route
        for route in (r.strip() for r in cells[1].split(",")):
            statuses.setdefault(route, set()).update({int(cells[2]), int(cells[3])})
    return statuses


def _refs(schema: dict[str, Any]) -> set[str]:
    """The model names a (possibly ``anyOf``) schema refers to."""
    if "$ref" in schema:
        return {schema["$ref"].removeprefix(SCHEMAS)}
    return {name for part in schema.get("anyOf", []) for name in _refs(part)}


def test_the_rollout_operations_are_grouped_under_the_tag_the_doc_names(spec: dict[str, Any]) -> None:
    (tag,) = re.findall(r"grouped under the tag `([^`]+)`", DOC)
    operations = _rollout_operations(spec)
    assert operations
    for key, operation in operations.items():
        assert operation.get("tags") == [tag], key
    others = [
        operation
        for path, item in spec["paths"].items()
        if not path.startswith(PREFIX + "/")
        for operation in item.values()
    ]
    assert others and all(tag not in operation.get("tags", []) for operation in others)


def test_the_schema_has_the_routes_and_bodies_of_the_doc_table(spec: dict[str, Any]) -> None:
    """A body marked optional may be left out, ``none`` is not declared, any other is required."""
    routes = _doc_routes()
    operations = _rollout_operations(spec)
    assert set(operations) == set(routes)
    for key, body in routes.items():
        operation = operations[key]
        if body.startswith("none"):
            assert "requestBody" not in operation, key
        else:
            assert operation["requestBody"].get("required", False) is not body.startswith("optional"), key
        path_parameters = [p for p in operation.get("parameters", []) if p["in"] == "path"]
        if "{session_id}" in key[1]:
            (parameter,) = path_parameters
            assert (parameter["name"], parameter["required"], parameter["schema"]["type"]) == (
                "session_id",
                True,
                "string",
            )
        else:
            assert path_parameters == []


def test_every_status_the_doc_gives_a_route_is_declared_for_it(spec: dict[str, Any]) -> None:
    """Including ``request_timeout`` (408), which a route answers when a body does not arrive in time."""
    statuses = _doc_statuses()
    operations = _rollout_operations(spec)
    for route, (method, path) in ROUTE_NAMES.items():
        declared = {int(status) for status in operations[(method, path)]["responses"]}
        documented = statuses.get(route, set())
        assert documented <= declared, (route, documented - declared)
    assert all(408 in statuses[route] for route in ROUTE_NAMES)  # every route reads what is sent


def test_each_error_answer_names_the_body_the_doc_gives_it(spec: dict[str, Any]) -> None:
    """A step's errors are full step bodies; every other route's are vLLM's or, strict, rollserve's."""
    for (method, path), operation in _rollout_operations(spec).items():
        errors = {status: answer for status, answer in operation["responses"].items() if status != "200"}
        assert errors and all(400 <= int(status) <= 599 for status in errors), (method, path)
        expected = (
            {"RolloutStepResponse"} if path.endswith("/step") else {"VllmErrorResponse", "ErrorResponse"}
        )
        for status, answer in errors.items():
            assert _refs(answer["content"]["application/json"]["schema"]) == expected, (path, status)


def test_the_mode_header_takes_the_modes_the_doc_names(spec: dict[str, Any]) -> None:
    """Optional (the server's default applies), one of the two values docs/rollout.md names."""
    found = re.search(r"header `([\w-]+): ([\w-]+)` \(or `([\w-]+)`\)", DOC)
    assert found, "docs/rollout.md no longer names the header and its values"
    name, first, second = found.groups()
    for key, operation in _rollout_operations(spec).items():
        (header,) = [p for p in operation["parameters"] if p["in"] == "header"]
        assert header["name"] == name and not header.get("required", False), key
        values = {v for part in header["schema"]["anyOf"] for v in part.get("enum", [])}
        types = {part.get("type") for part in header["schema"]["anyOf"]}
        assert values == {first, second} and "null" in types, key


def _model(name: str) -> type[BaseModel]:
    model = getattr(protocol, name)
    assert issubclass(model, BaseModel)
    return model


def test_the_models_in_the_schema_are_the_protocol_models(spec: dict[str, Any]) -> None:
    """Each model an operation names has the fields and required fields of the pydantic model."""
    names: set[str] = set()
    for operation in _rollout_operations(spec).values():
        for answer in operation["responses"].values():
            names |= _refs(answer.get("content", {}).get("application/json", {}).get("schema", {}))
        for media in operation.get("requestBody", {}).get("content", {}).values():
            names |= _refs(media["schema"])
    assert {"CreateSessionRequest", "BatchStepColumnsResponse", "VllmErrorResponse"} <= names
    schemas = spec["components"]["schemas"]
    for name in names:
        model = _model(name)
        own = model.model_json_schema(
            mode="validation" if name.endswith("Request") else "serialization",
            ref_template=SCHEMAS + "{model}",
        )
        assert set(schemas[name]["properties"]) == set(own["properties"]), name
        assert set(schemas[name].get("required", [])) == set(own.get("required", [])), name


def test_a_msgpack_body_has_the_json_bodys_schema(spec: dict[str, Any]) -> None:
    for key, operation in _rollout_operations(spec).items():
        if "requestBody" not in operation:
            continue
        content = operation["requestBody"]["content"]
        assert set(content) == {"application/json", "application/msgpack"}, key
        (model,) = _refs(content["application/msgpack"]["schema"])
        assert content["application/msgpack"]["schema"] == {"$ref": SCHEMAS + model}
        assert model in _refs(content["application/json"]["schema"]), key
