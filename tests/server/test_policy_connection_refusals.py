"""A websocket over the connection limit is refused in its route's own framing: the session
protocol's binary ``error`` message on ``/v1/policy/ws`` (docs/protocol.md: every frame is one
binary message), openpi's text frame on ``/``; either way close 1013 (try again later)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from rollserve.client import PolicyClient
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import ErrorMsg, decode_message

SESSION_PATH = "/v1/policy/ws"
MESSAGE = "1 connections from one address is the limit"  # the limiter's words for a cap of 1


@pytest.fixture
def one_per_address() -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0, max_connections_per_client=1)
    with serving(create_app(settings, policy=PolicyService(ChunkPolicy(), settings))) as server:
        yield server


def _assert_closed_1013(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1013


def test_the_session_route_refuses_with_a_binary_error_message(one_per_address: RunningServer) -> None:
    url = one_per_address.ws_url + SESSION_PATH
    with connect(url) as _held, connect(url) as refused:
        frame = refused.recv(timeout=10)
        assert isinstance(frame, bytes), frame
        assert decode_message(frame) == ErrorMsg(code="unavailable", message=MESSAGE, retryable=True)
        _assert_closed_1013(refused)


def test_the_openpi_route_still_refuses_with_a_text_frame(one_per_address: RunningServer) -> None:
    with connect(one_per_address.ws_url) as _held, connect(one_per_address.ws_url) as refused:
        assert refused.recv(timeout=10) == f"unavailable: {MESSAGE}"
        _assert_closed_1013(refused)


def test_policy_client_reads_the_binary_refusal_as_unavailable(one_per_address: RunningServer) -> None:
    url = one_per_address.ws_url + SESSION_PATH
    with PolicyClient(url) as first, PolicyClient(url) as second:
        first.open_session()
        refusal = second.receive(timeout=10)
    assert (refusal.code, refusal.message, refusal.retryable) == ("unavailable", MESSAGE, True)
