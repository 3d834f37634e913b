"""Pins what ``rollserve.server.policy.connections`` promises, where the mutation run of the
``policy`` module found it unchecked:

* ``client_address`` tells clients apart by host: every other test connects from 127.0.0.1, so a
  version that counted all clients as one address ("unknown", "None") passed them all. Here a
  second loopback address (Linux routes all of 127/8 to loopback) connects while 127.0.0.1 is at
  its cap, over a real server.
* ``AddressLimiter.release`` gives back exactly one slot, per address and in all, and forgets an
  address once nothing of it is open (memory does not grow per address ever seen).
* ``IdleWatch`` closes an idle connection with code 1001 *and* the reason "idle for <t> s", on
  both policy routes, so a client can tell why it was dropped.
"""

from __future__ import annotations

import contextlib
import socket
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.connections import AddressLimiter, client_address
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionOpen,
    decode_message,
    encode_message,
)

SESSION_PATH = "/v1/policy/ws"
OPENPI_PATH = ""
STATE = np.linspace(-1, 1, 6, dtype=np.float32)
OTHER_LOOPBACK_ADDRESS = "127.0.0.2"
RECV_TIMEOUT_S = 10


@contextlib.contextmanager
def _server(**settings: Any) -> Iterator[RunningServer]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    with serving(create_app(config, policy=PolicyService(ChunkPolicy(), config))) as server:
        yield server


def _socket_from(source_address: str, server: RunningServer) -> socket.socket:
    """A TCP connection to ``server`` whose client end is bound to ``source_address``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((source_address, 0))
        sock.connect((server.host, server.port))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def _connect(
    server: RunningServer, path: str, source_address: str | None = None
) -> Iterator[ClientConnection]:
    sock = None if source_address is None else _socket_from(source_address, server)
    with connect(server.ws_url + path, sock=sock, max_size=None, compression=None) as ws:
        yield ws


def _open_session(ws: ClientConnection) -> None:
    ws.send(encode_message(SessionOpen(state_dim=6)))
    reply = decode_message(ws.recv(timeout=RECV_TIMEOUT_S))
    assert not isinstance(reply, ErrorMsg), reply
    assert reply.accepted


def _observe(ws: ClientConnection, seq_id: int) -> Any:
    ws.send(encode_message(ObservationMsg(header=MsgHeader(seq_id=seq_id), state=STATE)))
    return decode_message(ws.recv(timeout=RECV_TIMEOUT_S))


def _assert_served(ws: ClientConnection, path: str) -> None:
    """The connection was admitted: it gets actions on its route."""
    if path == SESSION_PATH:
        _open_session(ws)
        assert isinstance(_observe(ws, 1), ActionChunkMsg)
    else:
        first = ws.recv(timeout=RECV_TIMEOUT_S)
        assert isinstance(first, bytes), first  # metadata, not a text refusal
        msgpack_numpy.unpackb(first)
        ws.send(msgpack_numpy.packb({"state": STATE}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_TIMEOUT_S))["actions"].shape == (20, 6)


def _assert_refused(ws: ClientConnection, path: str, message: str) -> None:
    """The connection was refused: ``unavailable`` in the route's framing, then close 1013."""
    frame = ws.recv(timeout=RECV_TIMEOUT_S)
    if path == SESSION_PATH:
        assert decode_message(frame) == ErrorMsg(code="unavailable", message=message, retryable=True)
    else:
        assert frame == f"unavailable: {message}"
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=RECV_TIMEOUT_S)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1013


def _other_loopback_address_usable() -> bool:
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind((OTHER_LOOPBACK_ADDRESS, 0))
    except OSError:
        return False
    finally:
        probe.close()
    return True


# client_address


def test_client_address_is_the_host_of_the_scopes_client() -> None:
    websocket: Any = types.SimpleNamespace(scope={"client": ("10.1.2.3", 5555)})
    assert client_address(websocket) == "10.1.2.3"


def test_client_address_without_a_client_in_the_scope_is_unknown() -> None:
    no_client: Any = types.SimpleNamespace(scope={})
    client_none: Any = types.SimpleNamespace(scope={"client": None})
    assert client_address(no_client) == "unknown"
    assert client_address(client_none) == "unknown"


@pytest.mark.skipif(not _other_loopback_address_usable(), reason=f"cannot bind {OTHER_LOOPBACK_ADDRESS}")
@pytest.mark.parametrize("path", [SESSION_PATH, OPENPI_PATH], ids=["session", "openpi"])
def test_the_per_address_cap_counts_each_client_address_apart(path: str) -> None:
    """With 127.0.0.1 at its cap of one, 127.0.0.2 is still served; 127.0.0.1 again is refused."""
    with _server(max_connections_per_client=1) as server, _connect(server, path) as first:
        _assert_served(first, path)
        with _connect(server, path, source_address=OTHER_LOOPBACK_ADDRESS) as other_address:
            _assert_served(other_address, path)
            with _connect(server, path) as second_from_first_address:
                _assert_refused(
                    second_from_first_address, path, "1 connections from one address is the limit"
                )


# AddressLimiter.release


def _admit(limiter: AddressLimiter, address: str, times: int) -> None:
    for _ in range(times):
        assert limiter.refusal(address) is None


PER_ADDRESS_REFUSAL = "3 connections from one address is the limit"
TOTAL_REFUSAL = "server is at its limit of 5 policy connections"


def test_release_gives_back_exactly_one_slot_of_its_address_and_of_the_total() -> None:
    limiter = AddressLimiter(per_address=3, total=5)
    _admit(limiter, "a", 3)
    assert limiter.refusal("a") == PER_ADDRESS_REFUSAL
    assert limiter.open_connections == 3

    limiter.release("a")
    assert limiter.open_connections == 2
    _admit(limiter, "a", 1)  # exactly one more from "a"
    assert limiter.refusal("a") == PER_ADDRESS_REFUSAL
    assert limiter.open_connections == 3

    _admit(limiter, "b", 2)  # the total of 5 is reached before "b" reaches its own cap
    assert limiter.open_connections == 5
    assert limiter.refusal("b") == TOTAL_REFUSAL
    assert limiter.refusal("c") == TOTAL_REFUSAL

    limiter.release("b")
    assert limiter.open_connections == 4
    _admit(limiter, "c", 1)
    assert limiter.refusal("c") == TOTAL_REFUSAL


def test_an_address_with_nothing_open_is_forgotten() -> None:
    limiter = AddressLimiter(per_address=3, total=5)
    _admit(limiter, "a", 3)
    _admit(limiter, "b", 2)
    for _ in range(3):
        limiter.release("a")
    assert "a" not in limiter._open  # memory does not grow per address ever seen
    assert dict(limiter._open) == {"b": 2}
    for _ in range(2):
        limiter.release("b")
    assert not limiter._open
    assert limiter.open_connections == 0
    _admit(limiter, "a", 3)  # and "a" starts afresh with its whole share
    assert limiter.refusal("a") == PER_ADDRESS_REFUSAL


def test_releasing_two_of_three_leaves_room_for_exactly_two() -> None:
    limiter = AddressLimiter(per_address=3, total=None)
    _admit(limiter, "a", 3)
    limiter.release("a")
    limiter.release("a")
    assert dict(limiter._open) == {"a": 1}
    assert limiter.open_connections == 1
    _admit(limiter, "a", 2)
    assert limiter.refusal("a") == PER_ADDRESS_REFUSAL
    assert limiter.open_connections == 3


# IdleWatch


@pytest.mark.parametrize("path", [SESSION_PATH, OPENPI_PATH], ids=["session", "openpi"])
def test_an_idle_connection_is_closed_with_a_reason_that_says_so(path: str) -> None:
    with _server(policy_idle_timeout_s=0.5) as server, _connect(server, path) as ws:
        if path == SESSION_PATH:
            _open_session(ws)
        else:
            msgpack_numpy.unpackb(ws.recv(timeout=RECV_TIMEOUT_S))  # metadata
        with pytest.raises(ConnectionClosed) as info:  # not a TimeoutError: closed in time
            # the client sends nothing more; the close comes at ~0.5 s (checks every 1/8 of the
            # timeout), so 3 s leave a loaded machine room and still tell it from 8 timeouts
            ws.recv(timeout=3.0)
        assert info.value.rcvd is not None
        assert (info.value.rcvd.code, info.value.rcvd.reason) == (1001, "idle for 0.5 s")
