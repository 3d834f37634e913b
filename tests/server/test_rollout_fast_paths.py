"""The per-item fast paths of a step (fingerprint, output checks, info copy) give exactly what the
general paths give: equal requests equal prints, different requests different ones, the same values;
a batch's answer is rendered to the bytes ``model_dump`` would give, on both wires."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import msgpack
import numpy as np
import pytest
import torch
from starlette.responses import JSONResponse
from test_rollout_service_rules import FAST, PinWorld, move

from rollserve.server.rollout.protocol import (
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    RenderRequest,
    RolloutStepRequest,
    RolloutStepResponse,
)
from rollserve.server.rollout.routes import _render
from rollserve.server.rollout.service import (
    RolloutService,
    _fingerprint,
    _finite_array,
    _json_safe,
    as_float32,
)

JOINTS = [0.1, -0.2, 0.3, 0.0, 0.5, -0.6, 0.7]


def _step(**fields: object) -> RolloutStepRequest:
    body = {"step_id": 3, "observation": {}, "action": {"joint_positions": JOINTS, "gripper_position": 0.25}}
    return RolloutStepRequest.model_validate({**body, **fields})


def test_a_plain_step_prints_the_msgpack_of_its_fields() -> None:
    """Pinned independently: sha256 over a prefix and the msgpack of (step, context, state, prompt,
    joints, gripper); a batch item prints the same (its session is where it goes, not content)."""
    fields = (3, True, None, "", JOINTS, 0.25)
    expected = hashlib.sha256(b"plain:" + msgpack.packb(fields)).hexdigest()
    assert _fingerprint(_step()) == expected
    item = BatchStepItem.model_validate({**_step().model_dump(), "session_id": "s1"})
    assert _fingerprint(item) == expected


def test_a_step_with_extra_or_images_prints_its_sorted_json() -> None:
    req = _step(observation={"extra": {"seed": 4, "b": [1, 2]}})
    body = json.dumps(req.model_dump(), sort_keys=True)
    assert _fingerprint(req) == hashlib.sha256(body.encode()).hexdigest()
    reordered = _step(observation={"extra": {"b": [1, 2], "seed": 4}})
    assert _fingerprint(reordered) == _fingerprint(req)
    item = BatchStepItem.model_validate({**req.model_dump(), "session_id": "s1"})
    assert _fingerprint(item) == _fingerprint(req)  # the session is not part of the JSON either


@pytest.mark.parametrize(
    "other",
    [
        {"step_id": 4},
        {"use_session_context": False},
        {"action": {"joint_positions": [*JOINTS[:6], 0.7000001], "gripper_position": 0.25}},
        {"action": {"joint_positions": [-0.0 if v == 0.0 else v for v in JOINTS], "gripper_position": 0.25}},
        {"action": {"joint_positions": JOINTS, "gripper_position": [0.25]}},
        {"action": {"joint_positions": JOINTS}},
        {"observation": {"state": [0.0] * 8}},
        {"observation": {"prompt": "pick"}},
        {"observation": {"extra": {"seed": 1}}},
    ],
)
def test_any_change_of_content_changes_the_print(other: dict[str, object]) -> None:
    assert _fingerprint(_step(**other)) != _fingerprint(_step())
    assert _fingerprint(_step(**other)) == _fingerprint(_step(**other))


def test_the_service_caches_the_print_on_the_request() -> None:
    req = _step()
    first = RolloutService.fingerprint(req)
    assert first == _fingerprint(req) and req._fingerprint == first
    assert RolloutService.fingerprint(req) is first


@pytest.mark.parametrize(
    "info",
    [{"success": False}, {"n": 3, "x": -0.0, "name": "a", "none": None, "big": 2**70, "f": 1 / 3}],
)
def test_a_flat_plain_info_is_what_a_json_round_trip_gives(info: dict[str, object]) -> None:
    out = _json_safe(info)
    expected = json.loads(json.dumps(info, allow_nan=False))
    assert out == expected and out is not info
    assert [type(v) for v in out.values()] == [type(v) for v in expected.values()]
    assert math.copysign(1.0, out.get("x", 1.0)) == math.copysign(1.0, expected.get("x", 1.0))


def test_numpy_nested_and_non_finite_info_take_the_general_path() -> None:
    assert _json_safe({"a": np.float32(0.5), "b": {"c": np.arange(2)}}) == {"a": 0.5, "b": {"c": [0, 1]}}
    with pytest.raises(ValueError):
        _json_safe({"a": float("nan")})
    with pytest.raises(TypeError):
        _json_safe({"a": object()})


def test_a_float32_array_is_passed_through_and_others_are_converted() -> None:
    array = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    assert as_float32(array) is array
    doubled = as_float32(array.astype(np.float64)[:, :, ::-1])
    assert doubled.dtype == np.dtype("<f4") and doubled.flags.c_contiguous
    assert doubled.tolist() == [[[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]]
    assert as_float32(torch.ones(2, 2)).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    for bad in (np.array([1.0, np.inf], np.float32), np.array([np.nan]), torch.tensor([float("nan")])):
        with pytest.raises(ValueError, match="not finite"):
            as_float32(bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e39, 3.5e38])
@pytest.mark.parametrize("where", [0, 3, 6])
def test_a_non_finite_value_anywhere_in_a_vector_is_refused(bad: float, where: int) -> None:
    values = list(JOINTS)
    values[where] = bad
    with pytest.raises(ValueError, match="finite and within float32 range"):
        _finite_array(values, "joint_positions")
    with pytest.raises(ValueError, match="finite and within float32 range"):
        _finite_array(bad, "gripper_position")


def test_vectors_keep_their_values_whatever_their_type() -> None:
    assert _finite_array(JOINTS, "j").tolist() == JOINTS
    assert _finite_array(0.25, "g").tolist() == [0.25]
    assert _finite_array([1, 2], "ints").tolist() == [1.0, 2.0]
    assert _finite_array(np.array([[1.5], [2.5]], np.float32), "array").tolist() == [1.5, 2.5]
    assert _finite_array(JOINTS, "j").dtype == np.float64


@pytest.mark.parametrize("raw", [False, True], ids=["json", "msgpack"])
async def test_a_batch_and_a_step_render_to_the_bytes_of_their_model_dump(raw: bool) -> None:
    """Every kind of item a batch answers: a plain step, a rendering session's step (images, state),
    a world-chosen action with uncertainty and info, a replay, refusals (order, closed, unknown,
    repeated) and a world failure."""
    world = PinWorld()
    world.spec = dataclasses.replace(PinWorld.spec, acts=True)
    service = RolloutService(world, FAST)
    try:

        async def create(seed: int, **kw: object) -> str:
            req = CreateSessionRequest(model="pin", seed=seed, **kw)
            return (await service.create_session(req)).session_id

        plain, drawn, closed = await create(1), await create(2, render=RenderRequest()), await create(3)
        acting = await create(5)
        jpeg = await create(4, render=RenderRequest(cameras=["wrist"], jpeg_quality=90))
        await service.close_session(closed)

        def item(sid: str, step_id: int, dx: float = 1.0) -> BatchStepItem:
            return BatchStepItem(session_id=sid, **move(step_id, dx).model_dump())

        world.uncertainty, world.info = 0.5, {"success": False, "n": 3}
        first = [item(plain, 0), item(drawn, 0), item(jpeg, 0), item(closed, 0), item("nobody", 0)]
        second = [
            item(plain, 0),  # a replay
            item(drawn, 5),  # out of order
            item(jpeg, 1),
            item(jpeg, 2),  # repeated
            BatchStepItem(session_id=acting, step_id=0, observation={}, action={}),  # the world acts
        ]
        world.chosen = [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        answers = [await service.batch_step(BatchStepRequest(items=first), raw_tensors=raw)]
        answers.append(await service.batch_step(BatchStepRequest(items=second), raw_tensors=raw))
        world.replace_output = "not a world output"
        answers.append(await service.batch_step(BatchStepRequest(items=[item(drawn, 1)]), raw_tensors=raw))
    finally:
        service.close()
    statuses = [[(r.status, r.error.code if r.error else None) for r in a.results] for a in answers]
    assert statuses == [
        [("ok", None)] * 3 + [("error", "session_closed"), ("error", "session_not_found")],
        [
            ("error", "step_already_committed"),
            ("error", "step_out_of_order"),
            ("ok", None),
            ("error", "invalid_request"),
            ("ok", None),
        ],
        [("error", "inference_error")],
    ]
    assert answers[1].results[0].replayed and "actions" in answers[1].results[4].next_observation
    assert "images" in answers[0].results[1].next_observation
    # each result also as the answer of a single step (what ``service.step`` builds, unvalidated)
    steps = [
        RolloutStepResponse.model_construct(
            **{name: getattr(r, name) for name in RolloutStepResponse.model_fields}
        )
        for answer in answers
        for r in answer.results
    ]
    for answer in [*answers, *steps]:
        rendered = _render(answer, 207, raw)
        assert rendered.status_code == 207
        if raw:
            assert rendered.media_type == "application/msgpack"
            assert rendered.body == msgpack_codec_packb(answer.model_dump(mode="python"))
        else:
            assert rendered.body == JSONResponse(answer.model_dump(mode="json")).body


def msgpack_codec_packb(value: object) -> bytes:
    from rollserve.wire.codec import packb

    return packb(value)
