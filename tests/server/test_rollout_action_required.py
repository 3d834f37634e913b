"""``action`` is required on a step, as in vLLM-Omni's request model (``action: Action = Field(...)``,
no default): left out or ``null`` it is ``invalid_request``; an empty ``{}`` with an
``observation.state`` takes its joints and gripper from the state. docs/rollout.md's routes table
marks what is required; here that marking is checked against the request models' own schemas."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from pydantic import BaseModel

from rollserve.server.rollout.protocol import (
    Action,
    BatchStepItem,
    CreateSessionRequest,
    Observation,
    RolloutStepRequest,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "rollout.md"
STATE = [0.1, -0.2, 0.3, -0.4, 0.2, 0.0, -0.1, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]  # toy: 15


def _create(http: httpx.Client) -> str:
    return http.post("/v1/realtime/sessions", json={"model": "toy", "seed": 3}).json()["session_id"]


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({}, "action: Field required"),
        ({"action": None}, "action: Input should be a valid dictionary or instance of Action"),
    ],
    ids=["left out", "null"],
)
def test_a_step_without_an_action_is_invalid_request(http: httpx.Client, action: dict, message: str) -> None:
    sid = _create(http)
    body = {"step_id": 0, "observation": {"state": STATE}, **action}
    resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == {
        "code": "invalid_request",
        "message": message,
        "step_id": 0,
        "committed_step_id": -1,
    }


def test_an_empty_action_takes_joints_and_gripper_from_the_state(http: httpx.Client) -> None:
    from_state, explicit = _create(http), _create(http)  # same seed: the same start
    empty = {"step_id": 0, "observation": {"state": STATE}, "action": {}}
    held = {"joint_positions": STATE[:7], "gripper_position": STATE[7]}
    given = {"step_id": 0, "observation": {}, "action": held}
    first = http.post(f"/v1/realtime/sessions/{from_state}/step", json=empty).json()
    second = http.post(f"/v1/realtime/sessions/{explicit}/step", json=given).json()
    assert first["error"] is None and second["error"] is None
    assert first["next_observation"]["video_latent"] == second["next_observation"]["video_latent"]


def _fields(body: str) -> dict[str, object]:
    """A routes-table body such as ``{a, b?, c=1, d{e?}}``: each field's required flag (True/False),
    or for a nested map ``(required, its fields)``."""
    inner, fields, depth, start = body.strip()[1:-1], {}, 0, 0
    parts = []
    for i, char in enumerate(inner + ","):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    for part in parts:
        name = re.match(r"[a-z_]+", part)
        assert name is not None, part
        rest = part[name.end() :]
        required = not rest.startswith("?") and re.search(r"(?<![<>])=", rest) is None  # not ">= 0"
        brace = rest.find("{")
        fields[name.group()] = (required, _fields(rest[brace:])) if brace >= 0 else required
    return fields


def _row(route: str) -> str:
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == route:
            return re.search(r"`(\{.*\})`", cells[1]).group(1)  # type: ignore[union-attr]
    raise AssertionError(f"no row for {route}")


def _required(model: type[BaseModel]) -> set[str]:
    return set(model.model_json_schema().get("required", []))


def _marked(fields: dict[str, object]) -> set[str]:
    """The fields a parsed body marks required (a nested map's flag is its pair's first item)."""
    return {name for name, flag in fields.items() if (flag if isinstance(flag, bool) else flag[0])}  # type: ignore[index]


def test_the_routes_table_marks_what_the_request_models_require() -> None:
    step = _fields(_row("`POST …/{id}/step`"))
    assert _marked(step) == _required(RolloutStepRequest) == {"step_id", "observation", "action"}
    for name, model in (("observation", Observation), ("action", Action)):
        required, inner = step[name]  # type: ignore[misc]
        assert required is True
        assert _marked(inner) == _required(model) == set()
        assert set(inner) == set(model.model_fields)
    create = _fields(_row("`POST /v1/realtime/sessions`"))
    assert _marked(create) == _required(CreateSessionRequest) == {"model"}
    assert _required(BatchStepItem) == {"session_id", "step_id", "observation", "action"}


def test_the_docs_say_action_is_required_and_when_the_state_fills_it() -> None:
    text = " ".join(DOC.read_text().split())
    assert "a missing action is taken from" not in text
    assert "`action` itself is required" in text
    assert (
        'an action without `joint_positions` (JSON `"action": {}`) takes them from `observation.state[:7]`'
        in text
    )
