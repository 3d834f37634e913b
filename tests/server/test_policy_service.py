"""PolicyRequestPath (the transport-free request path) and PolicyService (engine worker + sessions)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from gated_policy import GatedPolicy

from rollserve.engine import Superseded
from rollserve.engine.policy_errors import INFERENCE_ERROR, STALE_EPOCH, UNKNOWN_SESSION, PolicyError
from rollserve.engine.request_path import PolicyRequestPath
from rollserve.models.policy import PolicyRequest, Processors
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.policy.service import PolicyService
from rollserve.server.policy.sessions import PolicySession
from rollserve.server.settings import ServerSettings
from rollserve.wire import ActionChunkMsg, MsgHeader, ObservationMsg, SessionOpen, WireError
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE

A = 6


def _policy(**kwargs: Any) -> ChunkPolicy:
    return ChunkPolicy(record_calls=True, **kwargs)


def _session(policy: ChunkPolicy, rtc: bool = True) -> PolicySession:
    return PolicySession(session_id="s", rtc_enabled=rtc, processors=policy.make_processors())


def _obs(**kwargs: Any) -> ObservationMsg:
    kwargs.setdefault("state", np.linspace(-1, 1, 6, dtype=np.float32))
    return ObservationMsg(**kwargs)


# -- PolicyRequestPath ----------------------------------------------------------------------------------
def test_request_path_pre_policy_post_and_float32_chunks() -> None:
    policy = _policy()
    server = PolicyRequestPath(policy)
    reply = server.run_inference_request(_session(policy), MsgHeader(seq_id=7, episode_id=2), _obs())
    assert reply.header.seq_id == 7 and reply.header.episode_id == 2
    assert reply.chunk_model.dtype == reply.chunk_robot.dtype == np.float32
    assert reply.chunk_model.shape == reply.chunk_robot.shape == (20, A)
    np.testing.assert_array_equal(reply.chunk_robot, policy.actions_to_robot(reply.chunk_model))
    expected_state = policy.preprocess({"state": _obs().state})["state"]
    assert policy.calls[0]["state"].tobytes() == expected_state.tobytes()


@pytest.mark.parametrize("steps", [3, 10, 15])
def test_prefix_is_padded_or_cut_to_the_execution_horizon(steps: int) -> None:
    policy = _policy()
    prefix = np.arange(steps * A, dtype=np.float32).reshape(steps, A)
    PolicyRequestPath(policy, execution_horizon=10).run_inference_request(
        _session(policy), MsgHeader(), _obs(prefix_model=prefix, inference_delay_steps=3)
    )
    seen = policy.calls[0]["prev_chunk_left_over"]
    assert seen.shape == (10, A) and seen.dtype == np.float32
    kept = min(steps, 10)
    np.testing.assert_array_equal(seen[:kept], prefix[:kept])
    assert not seen[kept:].any()
    assert policy.calls[0]["inference_delay"] == 3
    assert policy.calls[0]["prefix_steps"] == kept  # the policy can tell real rows from padding


def test_no_prefix_without_rtc_or_when_nothing_is_left() -> None:
    policy = _policy()
    server = PolicyRequestPath(policy)
    prefix = np.ones((4, A), np.float32)
    server.run_inference_request(_session(policy, rtc=False), MsgHeader(), _obs(prefix_model=prefix))
    server.run_inference_request(
        _session(policy), MsgHeader(), _obs(prefix_model=np.zeros((0, A), np.float32))
    )
    server.run_inference_request(_session(policy), MsgHeader(), _obs())
    assert [call["prev_chunk_left_over"] for call in policy.calls] == [None, None, None]


def test_robot_space_prefix_is_mapped_to_model_space() -> None:
    policy = _policy()
    model_prefix = np.full((10, A), 0.25, np.float32)
    robot_prefix = policy.actions_to_robot(model_prefix)
    PolicyRequestPath(policy).run_inference_request(
        _session(policy), MsgHeader(), _obs(prefix_robot=robot_prefix)
    )
    np.testing.assert_allclose(policy.calls[0]["prev_chunk_left_over"], model_prefix, atol=1e-6)


@pytest.mark.parametrize(
    ("obs", "code"),
    [
        (_obs(state=np.zeros(5, np.float32)), BAD_SHAPE),
        (_obs(state=np.zeros(6, np.float64)), UNSUPPORTED_DTYPE),
        (_obs(state=np.zeros(6, np.int32)), UNSUPPORTED_DTYPE),
        (ObservationMsg(state=None), BAD_FIELD),
        (_obs(prefix_model=np.zeros((2, 5, A), np.float32)), BAD_SHAPE),
        (_obs(prefix_model=np.zeros(A, np.float32)), BAD_SHAPE),
        (_obs(prefix_model=np.zeros((4, A + 1), np.float32)), BAD_SHAPE),
        (_obs(prefix_robot=np.zeros((4, A), np.float16)), UNSUPPORTED_DTYPE),
        (_obs(inference_delay_steps=-1), BAD_FIELD),
    ],
)
def test_malformed_requests_get_typed_errors(obs: ObservationMsg, code: str) -> None:
    policy = _policy()
    with pytest.raises(WireError) as info:
        PolicyRequestPath(policy).run_inference_request(_session(policy), MsgHeader(), obs)
    assert info.value.code == code
    assert not policy.calls


def test_missing_camera_is_refused() -> None:
    policy = _policy(camera_names=("top",))
    with pytest.raises(WireError, match="missing camera") as info:
        PolicyRequestPath(policy).run_inference_request(_session(policy), MsgHeader(), _obs())
    assert info.value.code == BAD_FIELD


def test_policy_failures_are_per_item_and_carry_no_traceback() -> None:
    policy = _policy()
    server = PolicyRequestPath(policy)
    session = _session(policy)
    bad_state = np.full(6, np.nan, np.float32)
    items = [_obs(), _obs(state=bad_state), _obs()]
    from rollserve.engine.request_path import InferenceItem

    results = server.run_batch(
        [InferenceItem.of(session, MsgHeader(seq_id=i), obs) for i, obs in enumerate(items)]
    )
    assert results[0].header.seq_id == 0 and results[2].header.seq_id == 2  # type: ignore[union-attr]
    error = results[1]
    assert isinstance(error, PolicyError) and error.code == INFERENCE_ERROR
    assert "non-finite" in error.message and "Traceback" not in error.message


def test_failing_processors_are_reported_by_stage() -> None:
    policy = _policy()

    def broken_pre(observation: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("calibration")

    session = PolicySession(session_id="s", processors=Processors(pre=broken_pre))
    with pytest.raises(PolicyError, match="pre-processing failed: KeyError") as info:
        PolicyRequestPath(policy).run_inference_request(session, MsgHeader(), _obs())
    assert info.value.code == INFERENCE_ERROR


def test_unbatched_policy_is_called_once_per_request() -> None:
    class Unbatched:
        def __init__(self) -> None:
            self.inner = ChunkPolicy(supports_batching=False)
            self.metadata = self.inner.metadata
            self.delays: list[int] = []

        def predict_action_chunk(
            self, batch: Any, *, inference_delay: int = 0, prev_chunk_left_over: Any = None
        ) -> Any:
            self.delays.append(inference_delay)
            return self.inner.predict_action_chunk(batch, inference_delay=inference_delay)

    policy = Unbatched()
    server = PolicyRequestPath(policy)  # type: ignore[arg-type]
    assert not server.batched
    reply = server.run_inference_request(
        PolicySession("s", processors=policy.inner.make_processors()),
        MsgHeader(),
        _obs(inference_delay_steps=2),
    )
    assert policy.delays == [2] and reply.chunk_model.shape == (20, A)


def test_a_failing_batch_is_retried_item_by_item() -> None:
    class Picky(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            if len(requests) > 1:
                raise RuntimeError("batched kernel failed")
            return super().predict_action_chunks(requests)

    policy = Picky()
    server = PolicyRequestPath(policy)
    from rollserve.engine.request_path import InferenceItem

    items = [InferenceItem.of(_session(policy), MsgHeader(seq_id=i), _obs()) for i in range(3)]
    results = server.run_batch(items)
    assert [r.header.seq_id for r in results] == [0, 1, 2]  # type: ignore[union-attr]


# -- PolicyService ---------------------------------------------------------------------------------
@pytest.fixture
def service() -> Any:
    svc = PolicyService(
        _policy(), ServerSettings(max_policy_sessions=2, max_batch_size=8, max_batch_wait_ms=0)
    )
    yield svc
    svc.close()


def test_open_session_acks_with_what_the_policy_expects(service: PolicyService) -> None:
    ack, session = service.open_session(SessionOpen(client_uuid="robot-1", state_dim=6, rtc_enabled=True))
    assert ack.accepted and session is not None and ack.session_id == session.session_id
    assert (ack.chunk_size, ack.state_dim, ack.execution_horizon, ack.rtc_supported) == (20, 6, 10, True)
    assert ack.action_names == [f"a{i}" for i in range(A)]
    assert ack.server_load["sessions"] == 1 and ack.policy["name"] == "chunk-policy"


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (SessionOpen(state_dim=7), "state_dim 7"),
        (SessionOpen(action_names=["x"]), "action_names"),
        (SessionOpen(schema_version=99), "schema_version"),
    ],
)
def test_open_session_refuses_with_a_reason(
    service: PolicyService, request_: SessionOpen, reason: str
) -> None:
    ack, session = service.open_session(request_)
    assert not ack.accepted and session is None and reason in ack.reason


def test_session_limit_and_reopen_bumps_epoch(service: PolicyService) -> None:
    _, first = service.open_session(SessionOpen(client_uuid="a"))
    service.open_session(SessionOpen(client_uuid="b"))
    ack, _ = service.open_session(SessionOpen(client_uuid="c"))
    assert not ack.accepted and "limit" in ack.reason
    ack, again = service.open_session(SessionOpen(client_uuid="a"))  # reopen replaces, no extra slot
    assert ack.accepted and again is not None and first is not None
    assert again.epoch == first.epoch + 1 and not service.sessions.is_open(first)


async def test_infer_checks_session_and_epoch(service: PolicyService) -> None:
    _, session = service.open_session(SessionOpen(client_uuid="a"))
    assert session is not None
    reply = await service.infer(session, MsgHeader(seq_id=1), _obs())
    assert reply.batch_size == 1 and reply.queue_wait_ms >= 0
    epoch = service.reset_session(session)
    assert epoch == 1
    with pytest.raises(PolicyError) as info:
        await service.infer(session, MsgHeader(seq_id=2, session_epoch=0), _obs())
    assert info.value.code == STALE_EPOCH
    await service.infer(session, MsgHeader(seq_id=3, session_epoch=1), _obs())
    service.close_session(session)
    with pytest.raises(PolicyError) as info:
        await service.infer(session, MsgHeader(seq_id=4, session_epoch=1), _obs())
    assert info.value.code == UNKNOWN_SESSION


async def test_sessions_are_batched_and_stale_requests_superseded() -> None:
    policy = GatedPolicy()
    service = PolicyService(policy, ServerSettings(max_batch_size=8, max_batch_wait_ms=0))
    try:
        sessions = [service.open_session(SessionOpen(client_uuid=f"r{i}"))[1] for i in range(4)]
        blocker = asyncio.ensure_future(service.infer(sessions[0], MsgHeader(seq_id=1), _obs()))
        await asyncio.to_thread(policy.entered.wait, 5)
        old = asyncio.ensure_future(service.infer(sessions[1], MsgHeader(seq_id=1), _obs()))
        await asyncio.sleep(0)
        newer = [asyncio.ensure_future(service.infer(s, MsgHeader(seq_id=2), _obs())) for s in sessions[1:]]
        await asyncio.sleep(0.05)
        policy.release.set()
        with pytest.raises(Superseded):
            await old
        replies = await asyncio.gather(*newer)
        await blocker
        assert [r.batch_size for r in replies] == [3, 3, 3]
        assert replies[0].superseded_seq_ids == [1] and replies[1].superseded_seq_ids == []
        assert policy.batch_sizes == [1, 3]
    finally:
        service.close()


def test_describe_models_and_close() -> None:
    policy = _policy()
    closed: list[bool] = []
    policy.close = lambda: closed.append(True)  # type: ignore[attr-defined]
    service = PolicyService(policy, spec="rollserve.models.simple_policies:chunk_policy")
    (model,) = service.describe_models()
    assert model["id"] == "chunk-policy" and model["kind"] == "policy"
    assert model["routes"] == {"session": "/v1/policy/ws", "openpi": "/"}
    service.close()
    assert closed == [True]


# -- processors: one stateful pair per request, failures refused cleanly ------------------------------
class _NumberedProcessors:
    """Each session pair gets a number; pre tags the batch with it, post records (pre's, post's)."""

    def __init__(self) -> None:
        self.made = 0
        self.pairs: list[tuple[int, int]] = []

    def make(self) -> Processors:
        self.made += 1
        number = self.made

        def pre(observation: dict[str, Any]) -> dict[str, Any]:
            self.pre_number = number
            return dict(observation)

        def post(chunk: np.ndarray) -> np.ndarray:
            self.pairs.append((self.pre_number, number))
            return chunk

        return Processors(pre=pre, post=post)


async def test_a_reset_while_a_request_is_in_the_model_keeps_that_requests_processors() -> None:
    """Regression: the old episode's pre and the new episode's post processed the same request."""
    policy = GatedPolicy()
    numbered = _NumberedProcessors()
    policy.make_processors = numbered.make  # type: ignore[method-assign]
    service = PolicyService(policy, ServerSettings(max_batch_size=1, max_batch_wait_ms=0))
    try:
        _, session = service.open_session(SessionOpen(client_uuid="robot"))
        assert session is not None and numbered.made == 1
        in_flight = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=1), _obs()))
        assert await asyncio.to_thread(policy.entered.wait, 10)
        assert service.reset_session(session) == 1 and numbered.made == 2  # new episode, new pair
        policy.release.set()
        with pytest.raises(PolicyError) as info:  # reset while it ran: stale, still processed by one pair
            await in_flight
        assert info.value.code == STALE_EPOCH
        reply = await service.infer(session, MsgHeader(seq_id=2, session_epoch=1), _obs())
        assert reply.header.seq_id == 2
        assert numbered.pairs == [(1, 1), (2, 2)]
    finally:
        service.close()


def test_a_failing_make_processors_refuses_the_session_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = _policy()

    def broken() -> Processors:
        raise FileNotFoundError("normalisation stats missing")

    policy.make_processors = broken  # type: ignore[method-assign]
    service = PolicyService(policy, ServerSettings(max_policy_sessions=1))
    try:
        with caplog.at_level("ERROR"):
            ack, session = service.open_session(SessionOpen(client_uuid="robot"))
        assert not ack.accepted and session is None
        assert ack.reason == (
            "the policy's make_processors() failed: FileNotFoundError: normalisation stats missing"
        )
        assert len(service.sessions) == 0  # nothing half-opened: the one slot is still free
        assert any(r.exc_info and "make_processors" in r.getMessage() for r in caplog.records)
    finally:
        service.close()


def test_a_failing_make_processors_on_reset_is_a_typed_error_and_changes_nothing() -> None:
    policy = _policy()
    numbered = _NumberedProcessors()
    policy.make_processors = numbered.make  # type: ignore[method-assign]
    service = PolicyService(policy)
    try:
        _, session = service.open_session(SessionOpen(client_uuid="robot"))
        assert session is not None
        before = session.processors

        def broken() -> Processors:
            raise RuntimeError("no calibration")

        service.sessions._make_processors = broken
        with pytest.raises(PolicyError) as info:
            service.reset_session(session)
        assert info.value.code == INFERENCE_ERROR and "RuntimeError: no calibration" in info.value.message
        assert session.epoch == 0 and session.processors is before and service.sessions.is_open(session)
    finally:
        service.close()


def test_a_whole_batch_failure_is_logged_even_when_every_retry_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Picky(ChunkPolicy):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            if len(requests) > 1:
                raise RuntimeError("batched kernel failed")
            return super().predict_action_chunks(requests)

    policy = Picky()
    from rollserve.engine.request_path import InferenceItem

    items = [InferenceItem.of(_session(policy), MsgHeader(seq_id=i), _obs()) for i in range(3)]
    with caplog.at_level("ERROR", logger="rollserve.engine.request_path"):
        results = PolicyRequestPath(policy).run_batch(items)
    assert all(isinstance(r, ActionChunkMsg) for r in results)
    (record,) = [r for r in caplog.records if r.name == "rollserve.engine.request_path"]
    assert "3 requests failed" in record.getMessage()
    assert record.exc_info is not None and "batched kernel failed" in str(record.exc_info[1])
