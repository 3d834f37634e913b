"""PolicyClient against a real server: sessions, typed errors, stale replies, timeouts, no server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollserve.client import PolicyClient, PolicyConnectionError, ServerError, SessionRejected, policy_client
from rollserve.client.policy_client import REOPEN_CODES
from rollserve.engine import policy_errors
from rollserve.models.policy import PolicyRequest
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import ObservationMsg

STATE = np.zeros(6, np.float32)


class HoldablePolicy(ChunkPolicy):
    """Model calls wait while ``hold`` is set."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.free = threading.Event()
        self.free.set()

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        self.free.wait(10)
        return super().predict_action_chunks(requests)


@pytest.fixture
def server() -> Iterator[tuple[HoldablePolicy, RunningServer]]:
    policy = HoldablePolicy()
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(policy, settings))) as running:
        yield policy, running


def _url(running: RunningServer) -> str:
    return running.ws_url + "/v1/policy/ws"


def test_open_predict_and_header_echo(server: tuple[HoldablePolicy, RunningServer]) -> None:
    _, running = server
    with PolicyClient(_url(running), client_uuid="robot-1") as client:
        ack = client.open_session(state_dim=6, robot_type="arm", task="wave")
        assert ack.accepted and ack.chunk_size == 20
        chunk = client.predict(STATE, inference_delay_steps=2, episode_id=4)
        assert chunk.header.seq_id == 1 and chunk.header.episode_id == 4
        assert chunk.inference_delay_steps == 2 and chunk.chunk_model.dtype == np.float32
        assert client.predict(STATE).header.seq_id == 2


def test_refusal_and_typed_errors_keep_the_client_usable(
    server: tuple[HoldablePolicy, RunningServer],
) -> None:
    _, running = server
    with PolicyClient(_url(running)) as client:
        with pytest.raises(SessionRejected, match="state_dim 3"):
            client.open_session(state_dim=3)
        with pytest.raises(ServerError) as info:
            client.predict(STATE)  # no session was opened
        assert info.value.code == "unknown_session" and info.value.seq_id == 1
        client.open_session()
        with pytest.raises(ServerError) as info:
            client.predict(np.zeros(4, np.float32))
        assert info.value.code == "bad_shape"
        assert client.predict(STATE).chunk_robot.shape == (20, 6)


def test_late_replies_to_older_requests_are_skipped(server: tuple[HoldablePolicy, RunningServer]) -> None:
    policy, running = server
    with PolicyClient(_url(running)) as client:
        client.open_session()
        client.send_observation(ObservationMsg(state=STATE, header=client.next_header()))
        deadline = time.monotonic() + 10
        while not policy.batch_sizes and time.monotonic() < deadline:
            time.sleep(0.01)  # the first request has run; its reply is on its way
        reply = client.predict(STATE)
        assert reply.header.seq_id == 2
        assert client.dropped_replies == 1


def test_jpeg_images_reach_the_policy() -> None:
    policy = ChunkPolicy(camera_names=("wrist",), record_calls=True)
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, policy=PolicyService(policy, settings))
    with serving(app) as running, PolicyClient(_url(running)) as client:
        client.open_session(camera_names=["wrist"])
        image = np.full((48, 64, 3), 120, np.uint8)
        client.predict(STATE, {"wrist": image}, jpeg_quality=90)
        with pytest.raises(ServerError, match="missing camera"):
            client.predict(STATE)
    assert len(policy.calls) == 1 and set(policy.calls[0]["images"]) == {"wrist"}


def test_reply_timeout(server: tuple[HoldablePolicy, RunningServer]) -> None:
    policy, running = server
    with PolicyClient(_url(running)) as client:
        client.open_session()
        policy.free.clear()
        try:
            with pytest.raises(TimeoutError):
                client.infer(ObservationMsg(state=STATE, header=client.next_header()), timeout=0.2)
        finally:
            policy.free.set()


def test_no_server_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(PolicyConnectionError, match="cannot connect"):
            PolicyClient(f"ws://127.0.0.1:{port}/v1/policy/ws", open_timeout=2).connect()
    with pytest.raises(PolicyConnectionError, match="not connected"):
        PolicyClient().predict(STATE)


def test_reopen_codes_match_the_server() -> None:
    assert {policy_errors.UNKNOWN_SESSION, policy_errors.STALE_EPOCH} == REOPEN_CODES


def test_a_connection_over_the_address_limit_reads_as_unavailable() -> None:
    """The server refuses a websocket beyond ``max_connections_per_client`` with an ``unavailable``
    error message before close 1013 (binary, as every error; older servers sent a text frame
    ``"unavailable: ..."``, read the same way: ``test_policy_client_review.py``): the client reads
    that code (retryable), so a robot can tell "try later" from a broken server."""
    settings = ServerSettings(max_batch_wait_ms=0.0, max_connections_per_client=1)
    app = create_app(settings, policy=PolicyService(ChunkPolicy(), settings))
    with serving(app) as running, PolicyClient(_url(running)) as first, PolicyClient(_url(running)) as second:
        first.open_session()
        refusal = second.receive(timeout=10)
    assert (refusal.code, refusal.retryable) == (policy_errors.UNAVAILABLE, True)
    assert refusal.message == "1 connections from one address is the limit"
    assert policy_errors.UNAVAILABLE == policy_client.UNAVAILABLE_CODE  # the light client's copy


def test_other_text_frames_are_malformed() -> None:
    assert policy_client._text_error("hello").code == "malformed_frame"
    assert policy_client._text_error("bad_field: x").code == "malformed_frame"  # only refusals come as text


def test_an_open_without_an_ack_closes_the_connection() -> None:
    """A server that never acks: the open times out and the connection is closed, so a late ack
    can never be read as the answer to a later open."""
    from websockets.sync.server import serve

    received: list[bytes] = []
    with serve(lambda ws: received.extend(ws), "127.0.0.1", 0) as silent:
        threading.Thread(target=silent.serve_forever, daemon=True).start()
        port = silent.socket.getsockname()[1]
        client = PolicyClient(f"ws://127.0.0.1:{port}/v1/policy/ws", timeout=0.3).connect()
        with pytest.raises(TimeoutError):
            client.open_session()
        with pytest.raises(PolicyConnectionError, match="not connected"):
            client.open_session()
        silent.shutdown()
    assert len(received) == 1  # the first open reached the server; the second was never sent
