"""The policy request path's rules, each pinned with the value or message a client sees, worked out
by hand: the execution horizon, every validation, prefixes, the task, how outputs are read."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.engine.policy_errors import INFERENCE_ERROR, PolicyError
from rollserve.engine.request_path import (
    DEFAULT_EXECUTION_HORIZON,
    InferenceItem,
    LocalSession,
    PolicyRequestPath,
    resolve_execution_horizon,
)
from rollserve.models.policy import PolicyRequest, Processors
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.wire import MsgHeader, ObservationMsg, WireError
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE

STATE = np.linspace(-1, 1, 6, dtype=np.float32)


def _session(policy: ChunkPolicy, **kwargs: Any) -> LocalSession:
    return LocalSession(processors=policy.make_processors(), **kwargs)


def test_execution_horizon_rules() -> None:
    policy = ChunkPolicy(chunk_size=20, execution_horizon=7)
    assert DEFAULT_EXECUTION_HORIZON == 10
    assert resolve_execution_horizon(policy) == 7  # the policy's own RTC horizon
    assert resolve_execution_horizon(policy, 12) == 12  # the requested one wins
    assert resolve_execution_horizon(policy, 25) == 20  # never beyond the chunk
    assert resolve_execution_horizon(policy, 1) == 1

    class NoRtc:
        metadata = policy.metadata

    assert resolve_execution_horizon(NoRtc()) == 10  # type: ignore[arg-type]
    assert resolve_execution_horizon(ChunkPolicy(chunk_size=4, execution_horizon=4), None) == 4
    with pytest.raises(ValueError, match=r"^execution horizon must be >= 1, got 0$"):
        resolve_execution_horizon(policy, 0)
    path = PolicyRequestPath(policy, execution_horizon=5)
    assert (path.policy, path.metadata, path.execution_horizon, path.batched) == (
        policy,
        policy.metadata,
        5,
        True,
    )


@pytest.mark.parametrize(
    ("obs", "code", "message"),
    [
        (ObservationMsg(), BAD_FIELD, "observation carries no state (policy expects 6)"),
        (ObservationMsg(state=STATE.astype(np.float64)), UNSUPPORTED_DTYPE,
         "state must be float32, got float64"),
        (ObservationMsg(state=STATE[:5]), BAD_SHAPE, "state must have shape (6,), got (5,)"),
        (ObservationMsg(state=STATE, inference_delay_steps=-1), BAD_FIELD,
         "inference_delay_steps must be in 0..20 (the chunk size), got -1"),
        (ObservationMsg(state=STATE, inference_delay_steps=21), BAD_FIELD,
         "inference_delay_steps must be in 0..20 (the chunk size), got 21"),
        (ObservationMsg(state=STATE, prefix_model=np.zeros((3, 5), np.float32)), BAD_SHAPE,
         "prefix_model must be 2-D (steps <= 20, 6), got (3, 5)"),
        (ObservationMsg(state=STATE, prefix_model=np.zeros((21, 6), np.float32)), BAD_SHAPE,
         "prefix_model must be 2-D (steps <= 20, 6), got (21, 6)"),
        (ObservationMsg(state=STATE, prefix_robot=np.zeros(6, np.float32)), BAD_SHAPE,
         "prefix_robot must be 2-D (steps <= 20, 6), got (6,)"),
        (ObservationMsg(state=STATE, prefix_robot=np.zeros((3, 6), np.float16)), UNSUPPORTED_DTYPE,
         "prefix_robot must be float32, got float16"),
    ],
)  # fmt: skip
def test_every_validation_names_the_problem(obs: ObservationMsg, code: str, message: str) -> None:
    policy = ChunkPolicy()
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).validate(_session(policy), obs)
    assert (info.value.code, info.value.message) == (code, message)


def test_missing_cameras_and_a_stateless_policy() -> None:
    policy = ChunkPolicy(camera_names=("top", "wrist"))
    obs = ObservationMsg(state=STATE, images={"wrist": np.zeros((2, 2, 3), np.uint8)})
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).validate(_session(policy), obs)
    assert info.value.message == "missing camera image(s) ['top']; policy expects ['top', 'wrist']"
    stateless = ChunkPolicy(state_dim=0)
    PolicyRequestPath(stateless).validate(_session(stateless), ObservationMsg())  # no state needed
    complete = ObservationMsg(state=STATE, images=dict.fromkeys(("top", "wrist")))  # type: ignore[arg-type]
    PolicyRequestPath(policy).validate(_session(policy), complete)


def test_the_sessions_task_is_used_unless_the_observation_names_one() -> None:
    policy = ChunkPolicy(record_calls=True)
    path = PolicyRequestPath(policy)
    session = _session(policy, task="stack the cups")
    path.run_inference_request(session, MsgHeader(), ObservationMsg(state=STATE))
    path.run_inference_request(session, MsgHeader(), ObservationMsg(state=STATE, task="wipe"))
    item = InferenceItem.of(session, MsgHeader(seq_id=4), ObservationMsg(state=STATE))
    assert (item.task, item.rtc_enabled, item.processors, item.header.seq_id) == (
        "stack the cups", True, session.processors, 4
    )  # fmt: skip
    assert [call["task"] for call in policy.calls] == ["stack the cups", "wipe"]


def test_prefixes_reach_the_policy_padded_to_the_horizon_with_their_real_length() -> None:
    policy = ChunkPolicy(record_calls=True, execution_horizon=10)
    path = PolicyRequestPath(policy, execution_horizon=4)
    prefix = np.arange(18, dtype=np.float32).reshape(3, 6)
    reply = path.run_inference_request(
        _session(policy),
        MsgHeader(seq_id=9),
        ObservationMsg(state=STATE, prefix_model=prefix, inference_delay_steps=2),
    )
    call = policy.calls[0]
    assert call["prev_chunk_left_over"].shape == (4, 6) and call["prefix_steps"] == 3
    np.testing.assert_array_equal(call["prev_chunk_left_over"][:3], prefix)
    assert not call["prev_chunk_left_over"][3].any() and call["inference_delay"] == 2
    assert reply.inference_delay_steps == 2 and reply.header.seq_id == 9 and reply.inference_ms >= 0
    long = np.ones((9, 6), np.float32)
    path.run_inference_request(_session(policy), MsgHeader(), ObservationMsg(state=STATE, prefix_model=long))
    assert policy.calls[1]["prev_chunk_left_over"].shape == (4, 6) and policy.calls[1]["prefix_steps"] == 4
    path.run_inference_request(
        _session(policy), MsgHeader(), ObservationMsg(state=STATE, prefix_model=np.zeros((0, 6), np.float32))
    )
    assert policy.calls[2]["prev_chunk_left_over"] is None  # an empty prefix is no prefix


def test_a_robot_prefix_needs_a_policy_that_maps_it() -> None:
    class NoMapping(ChunkPolicy):
        actions_to_model = None  # type: ignore[assignment]

    policy = NoMapping()
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).run_inference_request(
            _session(policy),
            MsgHeader(),
            ObservationMsg(state=STATE, prefix_robot=np.ones((2, 6), np.float32)),
        )
    assert (info.value.code, info.value.message) == (
        BAD_FIELD, "this policy cannot map prefix_robot to model space; send prefix_model"
    )  # fmt: skip


def test_failures_are_logged_with_their_stage_and_cut_to_300_characters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = ChunkPolicy()

    def pre(observation: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("x" * 400)

    with (
        caplog.at_level(logging.ERROR, logger="rollserve.engine.request_path"),
        pytest.raises(PolicyError) as info,
    ):
        PolicyRequestPath(policy).run_inference_request(
            LocalSession(Processors(pre=pre)), MsgHeader(), ObservationMsg(state=STATE)
        )
    assert info.value.code == INFERENCE_ERROR
    assert info.value.message == "pre-processing failed: RuntimeError: " + "x" * 300
    (record,) = caplog.records
    assert record.getMessage() == "pre-processing failed" and record.exc_info[1].args == ("x" * 400,)  # type: ignore[index]


class _Returns(ChunkPolicy):
    """A policy that returns whatever the test says (to check how outputs are read)."""

    def __init__(self, value: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = value

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[Any]:
        return [self.value for _ in requests]


def test_outputs_in_torch_or_with_a_batch_axis_are_read_as_float32_chunks() -> None:
    chunk = np.arange(120, dtype=np.float64).reshape(20, 6) / 10
    for value in (torch.from_numpy(chunk), chunk[None], chunk.tolist()):
        policy = _Returns(value)
        reply = PolicyRequestPath(policy).run_inference_request(
            _session(policy), MsgHeader(), ObservationMsg(state=STATE)
        )
        assert reply.chunk_model.dtype == np.float32 and reply.chunk_model.flags.c_contiguous
        np.testing.assert_array_equal(reply.chunk_model, chunk.astype(np.float32))
        np.testing.assert_array_equal(reply.chunk_robot, policy.actions_to_robot(chunk.astype(np.float32)))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.zeros((20, 5)), "policy returned shape (20, 5), expected (steps, 6)"),
        (np.zeros((2, 20, 6)), "policy returned shape (2, 20, 6), expected (steps, 6)"),
        (np.zeros(6), "policy returned shape (6,), expected (steps, 6)"),
    ],
)  # fmt: skip
def test_outputs_of_the_wrong_shape_are_refused(value: Any, message: str) -> None:
    policy = _Returns(value)
    with pytest.raises(PolicyError) as info:
        PolicyRequestPath(policy).run_inference_request(
            _session(policy), MsgHeader(), ObservationMsg(state=STATE)
        )
    assert info.value.code == INFERENCE_ERROR


def test_a_post_processor_must_keep_the_chunk_length() -> None:
    policy = ChunkPolicy()
    session = LocalSession(Processors(pre=policy.preprocess, post=lambda chunk: chunk[:-1]))
    with pytest.raises(PolicyError) as info:
        PolicyRequestPath(policy).run_inference_request(session, MsgHeader(), ObservationMsg(state=STATE))
    assert (info.value.code, info.value.message) == (
        INFERENCE_ERROR,
        "post-processor changed the chunk length to 19",
    )


def test_a_batched_policy_returning_the_wrong_number_of_chunks_is_retried_one_by_one() -> None:
    class Short(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            return super().predict_action_chunks(requests)[:1]

    policy = Short()
    path = PolicyRequestPath(policy)
    items = [
        InferenceItem.of(_session(policy), MsgHeader(seq_id=i), ObservationMsg(state=STATE)) for i in range(2)
    ]
    results = path.run_batch(items)
    assert [r.header.seq_id for r in results] == [0, 1]  # type: ignore[union-attr]
    assert policy.batch_sizes == [2, 1, 1]


def test_each_stage_names_itself_in_the_error() -> None:
    class Raises(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            raise RuntimeError("boom")

    def run(policy: Any, session: LocalSession | None = None) -> PolicyError:
        with pytest.raises(PolicyError) as info:
            PolicyRequestPath(policy).run_inference_request(
                session or _session(policy), MsgHeader(), ObservationMsg(state=STATE)
            )
        assert info.value.code == INFERENCE_ERROR
        return info.value

    assert run(Raises()).message == "policy failed: RuntimeError: boom"
    policy = ChunkPolicy()

    def bad_post(chunk: np.ndarray) -> np.ndarray:
        raise ValueError("bad scale")

    assert run(policy, LocalSession(Processors(policy.preprocess, bad_post))).message == (
        "post-processing failed: ValueError: bad scale"
    )
    narrow = LocalSession(Processors(policy.preprocess, lambda chunk: chunk[:, :5]))
    assert run(policy, narrow).message == "post-processor returned shape (20, 5), expected (steps, 6)"
    assert (
        run(_Returns(np.full((20, 6), np.nan))).message == "policy returned non-finite actions (NaN or inf)"
    )


def test_grad_tracking_tensors_are_detached_and_float64_overflow_is_refused_quietly() -> None:
    import warnings

    chunk = torch.ones(20, 6, requires_grad=True)
    policy = _Returns(chunk * 2)
    reply = PolicyRequestPath(policy).run_inference_request(
        _session(policy), MsgHeader(), ObservationMsg(state=STATE)
    )
    np.testing.assert_array_equal(reply.chunk_model, np.full((20, 6), 2.0, np.float32))
    huge = _Returns(np.full((20, 6), 1e39))  # beyond float32: becomes inf, refused without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PolicyError, match="non-finite"):
            PolicyRequestPath(huge).run_inference_request(
                _session(huge), MsgHeader(), ObservationMsg(state=STATE)
            )


def test_inference_time_is_reported_in_milliseconds() -> None:
    policy = ChunkPolicy(latency_s=0.02)
    reply = PolicyRequestPath(policy).run_inference_request(
        _session(policy), MsgHeader(), ObservationMsg(state=STATE)
    )
    assert reply.inference_ms >= 20.0  # a lower bound only: a busy machine is only slower


@pytest.mark.parametrize(
    ("obs", "message"),
    [
        (ObservationMsg(state=np.array([0, 0, np.nan, 0, 0, 0], np.float32)),
         "state holds NaN or inf values"),
        (ObservationMsg(state=STATE, prefix_model=np.full((2, 6), np.inf, np.float32)),
         "prefix_model holds NaN or inf values"),
        (ObservationMsg(state=STATE, prefix_robot=np.full((2, 6), -np.inf, np.float32)),
         "prefix_robot holds NaN or inf values"),
    ],
)  # fmt: skip
def test_non_finite_inputs_are_refused_naming_the_field(obs: ObservationMsg, message: str) -> None:
    policy = ChunkPolicy()
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).validate(_session(policy), obs)
    assert (info.value.code, info.value.message) == (BAD_FIELD, message)


def test_the_limits_themselves_are_accepted() -> None:
    """A delay of a whole chunk and a prefix of a whole chunk are in range (``0..chunk_size``)."""
    policy = ChunkPolicy(chunk_size=20, record_calls=True)
    path = PolicyRequestPath(policy, execution_horizon=20)
    whole = np.ones((20, 6), np.float32)
    obs = ObservationMsg(state=STATE, inference_delay_steps=20, prefix_model=whole)
    reply = path.run_inference_request(_session(policy), MsgHeader(), obs)
    assert reply.inference_delay_steps == 20 and policy.calls[0]["prefix_steps"] == 20


class _Unbatched:
    """A policy with only ``predict_action_chunk`` (no batch method): the request path calls it once
    per request with the padded prefix."""

    def __init__(self, fail: bool = False) -> None:
        self.inner = ChunkPolicy()
        self.metadata = self.inner.metadata
        self.fail = fail
        self.prefixes: list[np.ndarray | None] = []

    def predict_action_chunk(
        self,
        batch: dict[str, Any],
        *,
        inference_delay: int = 0,
        prev_chunk_left_over: np.ndarray | None = None,
    ) -> np.ndarray:
        if self.fail:
            raise RuntimeError("unbatched boom")
        self.prefixes.append(prev_chunk_left_over)
        return np.zeros((20, 6), np.float32)


def test_a_policy_without_a_batch_method_gets_each_request_with_its_prefix() -> None:
    policy = _Unbatched()
    path = PolicyRequestPath(policy)  # type: ignore[arg-type]
    assert path.batched is False  # metadata says batching, but there is no batch method
    prefix = np.arange(12, dtype=np.float32).reshape(2, 6)
    path.run_inference_request(LocalSession(), MsgHeader(), ObservationMsg(state=STATE, prefix_model=prefix))
    (seen,) = policy.prefixes
    assert seen is not None and seen.shape == (10, 6)
    np.testing.assert_array_equal(seen[:2], prefix)
    failing = _Unbatched(fail=True)
    with pytest.raises(PolicyError) as info:
        PolicyRequestPath(failing).run_inference_request(  # type: ignore[arg-type]
            LocalSession(), MsgHeader(), ObservationMsg(state=STATE)
        )
    assert (info.value.code, info.value.message) == (
        INFERENCE_ERROR,
        "policy failed: RuntimeError: unbatched boom",
    )


def test_a_policy_that_says_it_cannot_batch_is_called_one_request_at_a_time() -> None:
    policy = ChunkPolicy(supports_batching=False)
    path = PolicyRequestPath(policy)
    assert path.batched is False
    items = [
        InferenceItem.of(_session(policy), MsgHeader(seq_id=i), ObservationMsg(state=STATE)) for i in range(3)
    ]
    path.run_batch(items)
    assert policy.batch_sizes == [1, 1, 1]


def test_a_robot_prefix_needs_a_mapping_even_on_a_policy_without_the_attribute() -> None:
    policy = _Unbatched()  # no actions_to_model at all
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).run_inference_request(  # type: ignore[arg-type]
            LocalSession(), MsgHeader(), ObservationMsg(state=STATE, prefix_robot=np.ones((2, 6), np.float32))
        )
    assert info.value.code == BAD_FIELD


def test_a_robot_prefix_reaches_the_policy_in_model_space_as_float32() -> None:
    class Float64Mapping(ChunkPolicy):
        def actions_to_model(self, actions: np.ndarray) -> np.ndarray:
            return np.asarray(actions, np.float64) / 2.0

    policy = Float64Mapping(record_calls=True)
    robot = np.full((2, 6), 3.0, np.float32)
    PolicyRequestPath(policy, execution_horizon=2).run_inference_request(
        _session(policy), MsgHeader(), ObservationMsg(state=STATE, prefix_robot=robot)
    )
    seen = policy.calls[0]["prev_chunk_left_over"]
    assert seen.dtype == np.float32
    np.testing.assert_array_equal(seen, np.full((2, 6), 1.5, np.float32))


def test_the_pre_processor_sees_the_images_state_and_task() -> None:
    seen: list[dict[str, Any]] = []

    def pre(observation: dict[str, Any]) -> dict[str, Any]:
        seen.append(observation)
        return {"state": observation["state"]}

    image = np.zeros((2, 2, 3), np.uint8)
    policy = ChunkPolicy(camera_names=("top",))
    PolicyRequestPath(policy).run_inference_request(
        LocalSession(Processors(pre=pre), task="fold"),
        MsgHeader(),
        ObservationMsg(state=STATE, images={"top": image}),
    )
    (observation,) = seen
    assert sorted(observation) == ["images", "state", "task"]
    assert observation["images"].keys() == {"top"} and observation["images"]["top"] is image
    assert observation["task"] == "fold"


def test_a_batch_failure_is_logged_even_when_every_retry_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    class BatchOnlyBug(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            if len(requests) > 1:
                raise RuntimeError("batch-only bug")
            return super().predict_action_chunks(requests)

    policy = BatchOnlyBug()
    items = [
        InferenceItem.of(_session(policy), MsgHeader(seq_id=i), ObservationMsg(state=STATE)) for i in range(3)
    ]
    with caplog.at_level(logging.ERROR, logger="rollserve.engine.request_path"):
        results = PolicyRequestPath(policy).run_batch(items)
    assert [r.header.seq_id for r in results] == [0, 1, 2]  # type: ignore[union-attr]
    (record,) = caplog.records
    assert record.getMessage() == "batched policy call of 3 requests failed; retrying one by one"
    assert record.exc_info[1].args == ("batch-only bug",)  # type: ignore[index]


def test_a_lone_request_gets_the_policys_wrong_count_as_its_error() -> None:
    class Empty(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            return []

    policy = Empty()
    with pytest.raises(PolicyError) as info:
        PolicyRequestPath(policy).run_inference_request(
            _session(policy), MsgHeader(), ObservationMsg(state=STATE)
        )
    assert info.value.message == "policy failed: RuntimeError: policy returned 0 chunks for 1 requests"


def test_inference_ms_is_the_policy_calls_time_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the request path's clock moved only by the policy (0.25 s a call), the reported time is
    exactly 250 ms: it measures the model call, in milliseconds."""
    import types

    import rollserve.engine.request_path as request_path_module

    now = [1000.0]

    class Slow(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            now[0] += 0.25
            return super().predict_action_chunks(requests)

    monkeypatch.setattr(request_path_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    policy = Slow()
    reply = PolicyRequestPath(policy).run_inference_request(
        _session(policy), MsgHeader(), ObservationMsg(state=STATE)
    )
    assert reply.inference_ms == 250.0
