"""Rollout protocol models (vLLM-Omni P0 names and defaults); folding an action into DROID keys."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from rollserve.server.rollout.protocol import (
    Action,
    CreateSessionRequest,
    ErrorObject,
    Observation,
    RolloutStepRequest,
    SessionMetadata,
)
from rollserve.server.rollout.service import fold_action_into_observation


def test_action_goes_into_droid_keys_over_the_state() -> None:
    obs = Observation(state=[9.0] * 8, prompt="stack the cube")
    folded = fold_action_into_observation(
        obs, Action(joint_positions=[1, 2, 3, 4, 5, 6, 7], gripper_position=0.5)
    )
    assert folded["prompt"] == "stack the cube"
    np.testing.assert_array_equal(folded["observation/joint_position"], [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(folded["observation/gripper_position"], [0.5])


def test_without_an_action_the_state_supplies_joints_and_gripper() -> None:
    folded = fold_action_into_observation(Observation(state=[1, 2, 3, 4, 5, 6, 7, 0.25]), None)
    np.testing.assert_array_equal(folded["observation/joint_position"], [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(folded["observation/gripper_position"], [0.25])


def test_no_state_and_no_action_means_no_state_keys() -> None:
    folded = fold_action_into_observation(Observation(), None)
    assert "observation/joint_position" not in folded
    assert "observation/gripper_position" not in folded


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Action(joint_positions=[1.0, 2.0]), "joint_positions must have 7 values"),
        (
            Action(joint_positions=[0.0] * 7, gripper_position=[0.1, 0.2]),
            "gripper_position must have 1 value",
        ),
    ],
)
def test_wrong_droid_counts_are_clear_errors(action: Action, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fold_action_into_observation(Observation(), action)


def test_images_and_pass_through_extras_reach_the_world() -> None:
    obs = Observation(
        images={"observation/exterior_image_1_left": [[[0, 0, 0]]]},
        extra={"observation/state": [1.0], "seed": 3, "private": "dropped"},
    )
    folded = fold_action_into_observation(obs, None)
    assert folded["observation/exterior_image_1_left"] == [[[0, 0, 0]]]
    assert folded["seed"] == 3 and folded["observation/state"] == [1.0]
    assert "private" not in folded


def test_defaults_match_the_vllm_omni_p0_api() -> None:
    assert CreateSessionRequest(model="m").mode == "world_model_env"
    req = RolloutStepRequest.model_validate({"step_id": 0, "observation": {}, "action": {}})
    assert req.use_session_context is True
    assert req.observation.prompt == "" and req.observation.extra == {} and req.observation.images is None
    assert ErrorObject(code="c", message="m").committed_step_id == -1
    meta = SessionMetadata(latency_ms=0, steps_generated=0, context_length=0, committed_step_id=-1)
    assert meta.session_memory_bytes is None and meta.uncertainty is None


def test_step_id_must_be_non_negative_and_action_is_required() -> None:
    with pytest.raises(ValidationError):
        RolloutStepRequest.model_validate({"step_id": -1, "observation": {}, "action": {}})
    with pytest.raises(ValidationError):
        RolloutStepRequest.model_validate({"step_id": 0, "observation": {}})


def test_msgpack_arrays_are_accepted_where_json_has_lists() -> None:
    action = Action.model_validate(
        {"joint_positions": np.arange(7, dtype=np.float32), "gripper_position": np.float32(0.5)}
    )
    assert action.joint_positions == list(range(7)) and action.gripper_position == 0.5


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_numbers_are_refused(bad: float) -> None:
    with pytest.raises(ValidationError):
        Action(joint_positions=[0.0] * 6 + [bad])


def test_client_chosen_session_ids_are_restricted() -> None:
    assert CreateSessionRequest(model="m", session_id="trainer-3:env.7").session_id
    with pytest.raises(ValidationError):
        CreateSessionRequest(model="m", session_id="../../etc")
