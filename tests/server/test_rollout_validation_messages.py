"""What a refused rollout body says: the field, and what is wrong with its value.

``gripper_position`` takes a number or a list. A NaN in it failed once per type, and the message
carried pydantic's names for the types (``function-after[_float32(), float]``) and a "should be a
valid list" for a value that was a number, next to the one error that mattered.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
JOINTS = "[0,0,0,0,0,0,0]"
NOT_FINITE = "Value error, must be finite and within float32 range"


@pytest.fixture(scope="module")
def session() -> Iterator[tuple[httpx.Client, str]]:
    settings = ServerSettings()
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with serving(app) as server, httpx.Client(base_url=server.http_url) as client:
        created = client.post(SESSIONS, json={"model": "toy"})
        yield client, created.json()["session_id"]


def _refusal(session: tuple[httpx.Client, str], action: str, observation: str = "{}") -> str:
    client, session_id = session
    body = f'{{"step_id":0,"observation":{observation},"action":{action}}}'
    reply = client.post(
        f"{SESSIONS}/{session_id}/step", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400  # vLLM-Omni's code for invalid_request (the default mode)
    error = reply.json()["error"]
    assert error["code"] == "invalid_request"
    return str(error["message"])


@pytest.mark.parametrize(
    ("gripper", "expected"),
    [
        ("NaN", f"action.gripper_position: {NOT_FINITE}"),
        ("Infinity", f"action.gripper_position: {NOT_FINITE}"),
        ("[0.5, NaN]", f"action.gripper_position.1: {NOT_FINITE}"),
        ("1e39", f"action.gripper_position: {NOT_FINITE}"),
    ],
)
def test_a_bad_gripper_value_is_named_once(
    session: tuple[httpx.Client, str], gripper: str, expected: str
) -> None:
    message = _refusal(session, f'{{"joint_positions":{JOINTS},"gripper_position":{gripper}}}')
    assert message == expected


def test_a_gripper_of_no_accepted_type_names_both_types(session: tuple[httpx.Client, str]) -> None:
    message = _refusal(session, f'{{"joint_positions":{JOINTS},"gripper_position":"open"}}')
    assert message == (
        "action.gripper_position: Input should be a valid number; "
        "action.gripper_position: Input should be a valid list"
    )


def test_errors_in_several_fields_are_all_reported(session: tuple[httpx.Client, str]) -> None:
    message = _refusal(session, '{"joint_positions":[NaN,0,0,0,0,0,0]}', observation='{"state":"x"}')
    assert message == (
        f"observation.state: Input should be a valid list; action.joint_positions.0: {NOT_FINITE}"
    )
