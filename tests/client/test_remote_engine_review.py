"""What the remote engine's chunk source puts on the wire and reads back, which its first mutation run
(`remote_engine` in tools/mutation.py) found unchecked: every session field it opens with (given and
default), the API key and timeout it hands its client, what it makes of the server's ack, the epoch,
task and JPEG quality of each request, a reset's episode, a reconnect's new connection, and that a
refused session leaves no connection behind, the JPEG refusal's words from quality 1 up; and that
``RemoteInferenceEngine`` passes its config on.

A unit test of the source alone: the server is the scripted one (websockets' own, on 127.0.0.1),
which records what it is sent (the engine against a real rollserve server is in
``test_inference_engine.py`` and the other ``test_engine_*`` files).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from scripted_policy_server import ScriptedServer, scripted
from waiting import wait_until
from websockets.sync.server import ServerConnection

from rollserve.client import EngineConfig, RemoteInferenceEngine, SessionRejected
from rollserve.client.inference_loop import ChunkRequest, SourceInfo
from rollserve.client.policy_client import DEFAULT_URL
from rollserve.client.remote_engine import RemoteChunkSource
from rollserve.rtc.config import RTCConfig
from rollserve.wire import (
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    encode_message,
)
from rollserve.wire.messages import Message

NAMES = ("j1", "j2", "j3", "j4", "j5", "gripper")
WAIT_S = 10.0  # a bound on waits for the server's side, never a speed check


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


def _request(observation: dict[str, object], seq_id: int = 3, episode_id: int = 2) -> ChunkRequest:
    return ChunkRequest(observation, 1, None, None, seq_id, episode_id)


def _acked(**ack: object):
    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_id="s-9", **ack))]  # type: ignore[arg-type]
        if isinstance(msg, ResetMsg):
            return [encode_message(ResetAck(header=msg.header, session_epoch=41))]
        return []

    return answer


def test_a_source_opens_its_session_with_every_field_it_was_given(server: ScriptedServer) -> None:
    source = RemoteChunkSource(
        server.url, robot_type="franka", action_names=NAMES, camera_names=("wrist", "base"),
        state_dim=6, fps=20.0, rtc_enabled=False, task="stack the cube",
    )  # fmt: skip
    try:
        source.connect()
        (opened,) = server.of_type(SessionOpen)
        assert (opened.robot_type, opened.action_names, opened.camera_names) == (
            "franka",
            list(NAMES),
            ["wrist", "base"],
        )
        assert (opened.state_dim, opened.fps, opened.rtc_enabled, opened.task) == (
            6,
            20.0,
            False,
            "stack the cube",
        )
    finally:
        source.close()


def test_a_source_opens_with_the_documented_defaults(server: ScriptedServer) -> None:
    source = RemoteChunkSource(server.url)
    try:
        source.connect()
        (opened,) = server.of_type(SessionOpen)
        assert (opened.robot_type, opened.action_names, opened.camera_names, opened.state_dim) == (
            "",
            [],
            [],
            None,
        )
        assert (opened.fps, opened.rtc_enabled, opened.task) == (15.0, True, "")
        assert (source.task, source.jpeg_quality) == ("", 0)
        assert (source.client.timeout, source.client.api_key) == (30.0, None)
        assert "Authorization" not in server.headers[0]
    finally:
        source.close()


def test_a_source_without_a_url_targets_the_local_default_server() -> None:
    assert RemoteChunkSource().client.url == DEFAULT_URL  # construction does not connect


def test_a_source_hands_its_client_the_api_key_and_timeout(server: ScriptedServer) -> None:
    source = RemoteChunkSource(server.url, api_key="k-123", timeout=2.5)
    try:
        source.connect()
        assert server.headers[0]["Authorization"] == "Api-Key k-123"
        assert source.client.timeout == 2.5
    finally:
        source.close()


def test_what_the_source_serves_is_read_from_the_ack() -> None:
    answer = _acked(
        session_epoch=7, chunk_size=5, action_names=list(NAMES), execution_horizon=3, rtc_supported=True
    )
    with scripted(answer) as server:
        source = RemoteChunkSource(server.url)
        try:
            assert source.connect() == SourceInfo(
                chunk_size=5, action_dim=6, execution_horizon=3, rtc_supported=True
            )
            assert source.epoch == 7
        finally:
            source.close()


def test_an_ack_without_rtc_says_so() -> None:
    answer = _acked(
        session_epoch=1, chunk_size=8, action_names=["a", "b"], execution_horizon=6, rtc_supported=False
    )
    with scripted(answer) as server:
        source = RemoteChunkSource(server.url)
        try:
            assert source.connect() == SourceInfo(
                chunk_size=8, action_dim=2, execution_horizon=6, rtc_supported=False
            )
        finally:
            source.close()


def test_each_request_carries_the_sessions_epoch_the_task_and_the_jpeg_quality(
    server: ScriptedServer,
) -> None:
    source = RemoteChunkSource(server.url, task="pick", jpeg_quality=75)
    try:
        source.connect()
        image = np.zeros((16, 16, 3), np.uint8)
        source.infer(_request({"state": np.ones(6), "images": {"wrist": image}}))
        source.infer(_request({"state": np.ones(6), "task": "place"}, seq_id=4))
        first, second = server.of_type(ObservationMsg)
        assert (first.header.session_epoch, first.task, first.jpeg_quality) == (1, "pick", 75)
        assert (first.header.seq_id, first.header.episode_id) == (3, 2)
        assert (second.task, second.header.seq_id) == ("place", 4)  # the observation's own task first
    finally:
        source.close()


def test_a_reset_sends_the_episode_and_the_source_takes_the_new_epoch() -> None:
    with scripted(_acked(session_epoch=40, chunk_size=4)) as server:
        source = RemoteChunkSource(server.url)
        try:
            source.connect()
            source.reset(12)
            (reset,) = server.of_type(ResetMsg)
            assert reset.header.episode_id == 12
            assert source.epoch == 41
        finally:
            source.close()


def test_a_refused_session_closes_the_connection_it_opened() -> None:
    refuse = lambda msg, ws: [encode_message(SessionAck(accepted=False, reason="busy"))]  # noqa: E731
    with scripted(refuse) as server:
        source = RemoteChunkSource(server.url)
        with pytest.raises(SessionRejected, match="busy"):
            source.connect()
        assert not source.client.connected
        wait_until(lambda: server.ended == 1, WAIT_S)  # the refused connection is closed


def test_a_reconnect_closes_the_connection_and_opens_a_new_session(server: ScriptedServer) -> None:
    source = RemoteChunkSource(server.url, robot_type="franka")
    try:
        source.connect()
        info = source.reconnect()
        assert info.chunk_size == 4  # the scripted server's ack, read again
        wait_until(lambda: server.ended == 1, WAIT_S)  # the first connection is closed
        assert len(server.headers) == 2
        assert [m.robot_type for m in server.of_type(SessionOpen)] == ["franka", "franka"]
        assert source.client.connected
    finally:
        source.close()
    assert not source.client.connected


def test_the_engine_opens_its_session_from_its_config_and_arguments(server: ScriptedServer) -> None:
    config = EngineConfig(fps=25.0, rtc=RTCConfig(enabled=False), task="stack", jpeg_quality=60)
    engine = RemoteInferenceEngine(
        server.url, config, api_key="k-7", robot_type="franka", action_names=NAMES,
        camera_names=("wrist",), state_dim=6, timeout=4.0,
    )  # fmt: skip
    try:
        engine.connect()
        (opened,) = server.of_type(SessionOpen)
        assert (opened.robot_type, opened.action_names, opened.camera_names, opened.state_dim) == (
            "franka",
            list(NAMES),
            ["wrist"],
            6,
        )
        assert (opened.fps, opened.rtc_enabled, opened.task) == (25.0, False, "stack")
        assert server.headers[0]["Authorization"] == "Api-Key k-7"
        assert engine.client is engine.source.client
        assert engine.config is config  # the loop runs on it too (its fps, horizon, fallback)
        assert (engine.client.timeout, engine.source.jpeg_quality) == (4.0, 60)
    finally:
        engine.stop()  # closes the source


def test_an_engine_without_a_config_or_timeout_takes_the_defaults() -> None:
    engine = RemoteInferenceEngine()  # construction does not connect
    assert engine.client.url == DEFAULT_URL
    assert engine.client.timeout == 30.0
    assert engine.config == EngineConfig()


def test_jpeg_at_the_lowest_quality_without_simplejpeg_is_refused_in_full_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # ``import simplejpeg`` raises ImportError
    words = (
        "jpeg_quality=1 needs simplejpeg, which is not installed: pip install 'rollserve[jpeg]'"
        " (or use jpeg_quality=0 to send raw images)"
    )
    with pytest.raises(ImportError, match=f"^{re.escape(words)}$"):
        RemoteChunkSource(jpeg_quality=1)


def test_an_engine_opens_with_the_documented_defaults(server: ScriptedServer) -> None:
    engine = RemoteInferenceEngine(server.url)
    try:
        engine.connect()
        (opened,) = server.of_type(SessionOpen)
        assert (opened.robot_type, opened.action_names, opened.camera_names) == ("", [], [])
        assert (opened.state_dim, opened.fps, opened.rtc_enabled, opened.task) == (None, 15.0, True, "")
        assert "Authorization" not in server.headers[0]
    finally:
        engine.stop()
