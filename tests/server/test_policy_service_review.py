"""The policy service and its session store, pinned where the mutation run of the ``policy`` module
found them unchecked: what ``/v1/models`` says, the engine's settings, loading from a spec, the
camera check at session open, the exact refusals of a request whose session was closed, reset or
replaced (before, while and after it waited), a shut-down engine, the queue wait a reply reports,
and the store's own rules (defaults, close, reset of a closed session, the make_processors text)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import numpy as np
import pytest
from gated_policy import GatedPolicy

from rollserve.engine import Superseded
from rollserve.engine.policy_errors import (
    INFERENCE_ERROR,
    STALE_EPOCH,
    UNAVAILABLE,
    UNKNOWN_SESSION,
    PolicyError,
)
from rollserve.models.policy import Processors
from rollserve.models.simple_policies import DROID_CAMERAS, ChunkPolicy, droid_policy
from rollserve.server.policy.service import PolicyService
from rollserve.server.policy.sessions import PolicySession, PolicySessionStore
from rollserve.server.settings import ServerSettings
from rollserve.wire import MsgHeader, ObservationMsg, SessionOpen

SPEC = "rollserve.models.simple_policies:chunk_policy"
GONE = "no such session (never opened, closed, or replaced"


def _obs() -> ObservationMsg:
    return ObservationMsg(state=np.linspace(-1, 1, 6, dtype=np.float32))


async def _refused(call: Awaitable[Any]) -> tuple[str, str]:
    """The code and message of the ``PolicyError`` that ``call`` raises."""
    with pytest.raises(PolicyError) as info:
        await call
    return info.value.code, info.value.message


def _gated_service() -> tuple[GatedPolicy, PolicyService]:
    """One request at a time, so a second one waits in the queue while the first is in the model."""
    policy = GatedPolicy()
    return policy, PolicyService(
        policy, ServerSettings(max_batch_size=1, max_batch_wait_ms=0, inline_below_ms=0)
    )


@contextlib.asynccontextmanager
async def _model_held_by_another_robot() -> AsyncIterator[tuple[GatedPolicy, PolicyService, PolicySession]]:
    """A service whose model is busy with another robot's request until ``policy.release`` (set at
    the latest on exit), and a session whose requests queue behind it."""
    policy, service = _gated_service()
    try:
        _, blocker = service.open_session(SessionOpen(client_uuid="first"))
        _, session = service.open_session(SessionOpen(client_uuid="second"))
        assert session is not None
        running = asyncio.ensure_future(service.infer(blocker, MsgHeader(seq_id=1), _obs()))
        assert await asyncio.to_thread(policy.entered.wait, 10)
        yield policy, service, session
        policy.release.set()
        await running
    finally:
        service.close()


def test_the_model_listing_says_everything_about_the_served_policy() -> None:
    service = PolicyService(ChunkPolicy(), ServerSettings(max_batch_size=8), execution_horizon=7, spec=SPEC)
    try:
        assert service.describe_models() == [
            {
                "id": "chunk-policy",
                "object": "model",
                "owned_by": "rollserve",
                "kind": "policy",
                "spec": SPEC,
                "execution_horizon": 7,
                "max_batch_size": 8,
                "routes": {"session": "/v1/policy/ws", "openpi": "/"},
                "metadata": ChunkPolicy().metadata.to_dict(),
            }
        ]
    finally:
        service.close()


def test_the_engine_runs_with_the_settings_in_seconds_on_its_named_thread() -> None:
    service = PolicyService(ChunkPolicy(), ServerSettings(max_batch_wait_ms=40.0, inline_below_ms=0.5))
    try:
        assert service.worker.max_wait_s == pytest.approx(0.040)
        assert service.worker.inline_below_s == pytest.approx(0.0005)
        assert service.worker._thread.name == "rollserve-policy-engine"
    finally:
        service.close()


def test_a_service_loads_its_policy_from_a_spec_with_the_given_arguments() -> None:
    settings = ServerSettings(max_policy_sessions=3)
    service = PolicyService.from_spec(SPEC, settings, policy_kwargs={"chunk_size": 12}, execution_horizon=5)
    try:
        assert (service.spec, service.metadata.chunk_size) == (SPEC, 12)
        assert (service.settings, service.sessions.max_sessions) == (settings, 3)
        assert service.request_path.execution_horizon == 5
    finally:
        service.close()


@pytest.mark.parametrize(
    ("offered", "refusal"),
    [
        ([], ""),  # a robot that lists no cameras is not checked at open
        (list(DROID_CAMERAS), ""),
        (
            [DROID_CAMERAS[0], "extra"],
            f"policy needs camera(s) {[DROID_CAMERAS[1]]}; the robot offers {[DROID_CAMERAS[0], 'extra']}",
        ),
    ],
)
def test_a_session_opens_only_when_the_robot_offers_the_policys_cameras(
    offered: list[str], refusal: str
) -> None:
    service = PolicyService(droid_policy())
    try:
        ack, session = service.open_session(SessionOpen(camera_names=offered))
        assert (ack.accepted, ack.reason) == (not refusal, refusal)
        assert (session is not None) == (not refusal)
    finally:
        service.close()


def test_the_ack_tells_the_robot_the_policys_cameras_and_rate() -> None:
    policy = droid_policy(fps=12.5)
    service = PolicyService(policy)
    try:
        ack, _ = service.open_session(SessionOpen())
        assert (ack.camera_names, ack.fps) == (list(DROID_CAMERAS), 12.5)
    finally:
        service.close()


@pytest.mark.parametrize(
    ("policy_rtc", "asked", "granted"), [(True, True, True), (True, False, False), (False, True, False)]
)
def test_a_session_keeps_its_task_and_gets_rtc_only_when_both_sides_do_it(
    policy_rtc: bool, asked: bool, granted: bool
) -> None:
    policy = ChunkPolicy()
    policy.metadata = dataclasses.replace(policy.metadata, supports_rtc=policy_rtc)
    service = PolicyService(policy)
    try:
        ack, session = service.open_session(SessionOpen(task="stack the cubes", rtc_enabled=asked))
        assert session is not None and ack.rtc_supported is policy_rtc
        assert (session.task, session.rtc_enabled) == ("stack the cubes", granted)
    finally:
        service.close()


async def test_a_stale_epoch_is_refused_with_the_plain_message() -> None:
    service = PolicyService(ChunkPolicy())
    try:
        _, session = service.open_session(SessionOpen(client_uuid="robot"))
        service.reset_session(session)
        assert await _refused(service.infer(session, MsgHeader(seq_id=1, session_epoch=0), _obs())) == (
            STALE_EPOCH,
            "session_epoch 0 is not the current 1",
        )
    finally:
        service.close()


def test_a_refused_ack_names_no_session_and_the_load_is_reported_in_full() -> None:
    service = PolicyService(ChunkPolicy(), ServerSettings(max_policy_sessions=1, max_batch_size=8))
    try:
        accepted, _ = service.open_session(SessionOpen(client_uuid="first"))
        refused, session = service.open_session(SessionOpen(client_uuid="second"))
        assert accepted.accepted and session is None and not refused.accepted
        assert (refused.session_id, refused.session_epoch) == ("", 0)
        load = {"sessions": 1, "max_sessions": 1, "queue_depth": 0, "max_batch_size": 8}
        assert refused.server_load == load == service.server_load()
    finally:
        service.close()


async def test_a_closed_session_is_refused_with_the_plain_message() -> None:
    service = PolicyService(ChunkPolicy())
    try:
        _, session = service.open_session(SessionOpen(client_uuid="robot"))
        service.close_session(session)
        assert await _refused(service.infer(session, MsgHeader(seq_id=1), _obs())) == (
            UNKNOWN_SESSION,
            GONE + ")",
        )
    finally:
        service.close()


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ("close_session", (UNKNOWN_SESSION, GONE + " while this ran)")),
        ("reset_session", (STALE_EPOCH, "session_epoch 0 is not the current 1 (reset while this ran)")),
    ],
)
async def test_a_session_closed_or_reset_while_its_request_ran_refuses_the_chunk(
    change: str, refusal: tuple[str, str]
) -> None:
    policy, service = _gated_service()
    try:
        _, session = service.open_session(SessionOpen(client_uuid="robot"))
        running = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=1), _obs()))
        assert await asyncio.to_thread(policy.entered.wait, 10)
        getattr(service, change)(session)
        policy.release.set()
        assert await _refused(running) == refusal
    finally:
        service.close()


async def test_a_request_whose_session_closed_while_it_waited_never_runs() -> None:
    async with _model_held_by_another_robot() as (policy, service, session):
        waiting = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=1), _obs()))
        await asyncio.sleep(0.05)  # queued behind the one in the model
        service.close_session(session)
        policy.release.set()
        assert await _refused(waiting) == (UNKNOWN_SESSION, GONE + " while this waited)")
    assert [size for _, _, size in policy.call_spans] == [1]  # the refused one never ran


async def test_an_old_episodes_request_superseded_by_the_new_episode_is_refused_as_stale() -> None:
    async with _model_held_by_another_robot() as (policy, service, session):
        old = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=1), _obs()))
        await asyncio.sleep(0.05)
        service.reset_session(session)
        new = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=2, session_epoch=1), _obs()))
        assert await _refused(old) == (
            STALE_EPOCH,
            "session_epoch 0 is not the current 1 (reset while this waited)",
        )
        policy.release.set()
        assert (await new).superseded_seq_ids == []  # an old epoch's request is not reported as superseded


async def test_a_request_superseded_in_its_own_episode_is_reported_in_the_next_reply() -> None:
    async with _model_held_by_another_robot() as (policy, service, session):
        old = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=4), _obs()))
        await asyncio.sleep(0.05)
        new = asyncio.ensure_future(service.infer(session, MsgHeader(seq_id=5), _obs()))
        with pytest.raises(Superseded):
            await old
        await asyncio.sleep(0.1)  # the newer one waits behind the gated call
        policy.release.set()
        reply = await new
        assert reply.superseded_seq_ids == [4]
        assert reply.queue_wait_ms >= 50.0  # reported in milliseconds


async def test_a_shut_down_engine_refuses_with_a_retryable_unavailable() -> None:
    service = PolicyService(ChunkPolicy())
    _, session = service.open_session(SessionOpen(client_uuid="robot"))
    service.close()
    with pytest.raises(PolicyError) as info:
        await service.infer(session, MsgHeader(seq_id=1), _obs())
    error = info.value
    assert (error.code, error.message, error.retryable) == (
        UNAVAILABLE,
        "the policy engine is shutting down",
        True,
    )


# -- the store --------------------------------------------------------------------------------------------
def test_a_session_opens_with_rtc_on_and_no_task_unless_told() -> None:
    store = PolicySessionStore(4)
    plain = store.open("a")
    told = store.open("b", task="pick the cube", rtc_enabled=False)
    assert (plain.task, plain.rtc_enabled) == ("", True)
    assert (told.task, told.rtc_enabled) == ("pick the cube", False)


def test_closing_says_whether_the_session_was_open_and_twice_is_harmless() -> None:
    store = PolicySessionStore(4)
    session = store.open("a")
    assert store.close(session.session_id) is True
    assert store.close(session.session_id) is False
    assert len(store) == 0 and store.open("a").epoch == 1


def test_resetting_a_closed_session_is_an_unknown_session() -> None:
    store = PolicySessionStore(4)
    session = store.open("a")
    store.close(session.session_id)
    with pytest.raises(PolicyError) as info:
        store.reset(session)
    assert (info.value.code, info.value.message) == (UNKNOWN_SESSION, GONE + ")")


def test_a_failing_make_processors_is_logged_and_its_text_kept_to_300_characters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> Processors:
        raise ValueError("x" * 400)

    store = PolicySessionStore(4, broken)
    with caplog.at_level(logging.ERROR), pytest.raises(PolicyError) as info:
        store.open("a")
    assert info.value.code == INFERENCE_ERROR
    assert info.value.message == "the policy's make_processors() failed: ValueError: " + "x" * 300
    assert [r.getMessage() for r in caplog.records] == ["the policy's make_processors() failed"]
