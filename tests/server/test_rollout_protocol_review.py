"""The rollout API's request models (``server/rollout/protocol.py``): the rules its first mutation
run (`rollout_protocol` in tools/mutation.py) found unchecked. Each cap at its edge (a vector of
1024 values, an ``extra`` tree of 4096, the float32 range), the words of each refusal (they reach
the client as the ``invalid_request`` message), ``extra`` maps keyed by anything but strings,
wire images told from a client's own image maps, ``render`` on a reset or fork, and the columnar
actions' dtypes. The models are the layer under test: they are validated as the routes do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from rollserve.server.rollout.protocol import (
    FLOAT32_MAX,
    MAX_EXTRA_ITEMS,
    MAX_VECTOR,
    Action,
    BatchStepColumnsRequest,
    ErrorObject,
    ForkSessionRequest,
    Observation,
    ResetSessionRequest,
    SessionMetadata,
    built,
)
from rollserve.wire.images import encode_image

ROWS_WANTED = "actions must be rows of 8 numbers (7 joint positions, then the gripper)"


def _refusal(make: Any) -> str:
    """The one message a model's validation refuses with, as the route's ``invalid_request`` says it."""
    with pytest.raises(ValidationError) as refused:
        make()
    (error,) = refused.value.errors()
    return str(error["msg"])


def test_a_vector_holds_at_most_1024_values_as_an_array_too() -> None:
    assert MAX_VECTOR == 1024
    assert Action(joint_positions=np.zeros(1024, np.float32)).joint_positions == [0.0] * 1024
    message = _refusal(lambda: Action(joint_positions=np.zeros(1025, np.float32)))
    assert message == "Value error, at most 1024 values"


def test_a_value_may_be_the_largest_float32_but_not_one_step_past_it() -> None:
    top = float(np.finfo(np.float32).max)
    assert top == FLOAT32_MAX
    assert Action(joint_positions=[top, -top]).joint_positions == [top, -top]
    past = float(np.nextafter(top, np.inf))  # finite as a float64, inf as a float32
    for value in (past, -past):
        assert _refusal(lambda v=value: Action(joint_positions=[v])) == (
            "Value error, must be finite and within float32 range"
        )


def test_extra_holds_at_most_4096_values_counted_through_nested_maps_and_lists() -> None:
    assert MAX_EXTRA_ITEMS == 4096
    # the list and the map are values too: 2 + (4096 - 4) list items + the inner value + the flag
    extra = {"list": [0] * (MAX_EXTRA_ITEMS - 4), "map": {"inner": 1}, "flag": True}
    assert Observation(extra=extra).extra == extra
    extra["list"].append(0)
    assert _refusal(lambda: Observation(extra=extra)) == (
        "Value error, extra holds more than 4096 values; send large data as tensors"
    )


def test_extra_maps_inside_extra_are_read_and_must_be_keyed_by_strings() -> None:
    nested = {"a": {"b": {"c": [1, 2.5, "x"]}}}
    assert Observation(extra=nested).extra == nested
    assert Action(extra=nested).extra == nested
    for bad in ({"a": {1: "x"}}, {"a": [{"ok": 1}, {b"raw": 2}]}):
        assert (
            _refusal(lambda b=bad: Observation(extra=b)) == "Value error, extra maps must be keyed by strings"
        )
    deep = {"a": {"b": {"c": {"d": {"e": [0] * MAX_EXTRA_ITEMS}}}}}  # the values nested in maps count
    assert _refusal(lambda: Observation(extra=deep)).startswith("Value error, extra holds more than 4096")


def test_a_wire_image_is_decoded_and_a_clients_own_image_map_passes_through() -> None:
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    own = {"format": "png", "data": b"\x89PNG..."}  # a client's own encoding: the world reads it
    flagged_off = {b"__image__": False, b"format": "raw", b"pixels": pixels}  # not a wire image
    observation = Observation(images={"wire": encode_image(pixels), "own": own, "off": flagged_off})
    assert isinstance(observation.images, dict)
    np.testing.assert_array_equal(observation.images["wire"], pixels)
    assert observation.images["own"] == own and observation.images["off"] is not None
    assert observation.images["off"][b"__image__"] is False


@pytest.mark.parametrize("model", [ResetSessionRequest, ForkSessionRequest])
def test_a_reset_or_fork_body_with_render_is_refused_in_words(model: Any) -> None:
    message = _refusal(lambda: model.model_validate({"render": {"cameras": ["exterior"]}}))
    assert message == (
        "Value error, render is chosen when a session is created; a reset or fork keeps the session's"
    )
    assert model.model_validate({"renderer": 1}) == model()  # other unknown keys are ignored


def _columns(actions: Any) -> BatchStepColumnsRequest:
    return BatchStepColumnsRequest(session_ids=["a", "b"], step_ids=[1, 2], actions=actions)


def test_columnar_float_actions_are_kept_as_sent_and_whole_numbers_become_float64() -> None:
    sent = np.arange(16, dtype=np.float32).reshape(2, 8)
    assert _columns(sent).actions is sent  # a float tensor as it came, no copy
    for ints in (np.arange(16, dtype=np.int32).reshape(2, 8), np.arange(16, dtype=np.uint8).reshape(2, 8)):
        rows = _columns(ints).actions
        assert rows.dtype == np.float64
        np.testing.assert_array_equal(rows, np.arange(16).reshape(2, 8))
    rows = _columns([[0, 1, 2, 3, 4, 5, 6, 7], [0.5] * 8]).actions  # JSON rows: ints stand for floats
    assert rows.dtype == np.float64 and rows.tolist() == [list(range(8)), [0.5] * 8]


def test_columnar_actions_refusals_name_what_is_wrong() -> None:
    assert _refusal(lambda: _columns(np.array([["a"] * 8] * 2))) == "Value error, actions must hold numbers"
    assert _refusal(lambda: _columns(np.ones((2, 8), bool))) == "Value error, actions must hold numbers"
    for shape in [(2, 7), (2, 9), (16,), (2, 8, 1)]:
        assert _refusal(lambda s=shape: _columns(np.zeros(s))) == "Value error, " + ROWS_WANTED
    assert _refusal(lambda: _columns([[True] * 8] * 2)) == "Value error, " + ROWS_WANTED
    huge = [[10**400] + [0] * 7, [0] * 8]  # an integer beyond any float
    assert _refusal(lambda: _columns(huge)) == "Value error, actions must be within float32 range"


def test_a_built_model_equals_the_validated_one() -> None:
    fields = {"code": "step_conflict", "message": "at 3", "step_id": 4, "committed_step_id": 3}
    made = built(ErrorObject, dict(fields))
    assert made == ErrorObject(**fields) and made.__pydantic_extra__ is None
    assert made.model_dump() == fields and made.model_fields_set == set(fields)
    meta = {
        "latency_ms": 1.5,
        "steps_generated": 1,
        "context_length": 2,
        "committed_step_id": 1,
        "session_memory_bytes": None,
        "uncertainty": None,
        "queue_wait_ms": None,
        "batch_size": None,
    }
    assert built(SessionMetadata, dict(meta)) == SessionMetadata(**meta)
