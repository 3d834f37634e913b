"""The server's websocket protocol (``server/ws_protocol.py``), the rules its first mutation run
found unchecked: when a burst of messages pauses reading (at the second unread message, once per
backlog) and that reading always resumes; what the app is told when a message is cut off (the
close frame's code and reason); a server stopping while a connection drains; the drain's byte
bound at its edge.

The server is the real uvicorn with rollserve's settings (``serving``), around a small echo app
that records what it receives, and the clients write raw frames (websockets' sans-I/O client), so
a burst of messages reaches the server in one read. Only the byte-bound test drives the protocol
object alone, with a recording transport: its edge is one byte.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.sync.client import connect
from websockets.uri import parse_uri

from rollserve.server import ws_protocol
from rollserve.server.running import RunningServer, serving, start_in_thread
from rollserve.server.settings import ServerSettings
from rollserve.server.ws_protocol import SteadyReadWebSocketProtocol
from rollserve.wire.limits import WireLimits

LIMIT = 64 * 1024  # the server's frame limit
MESSAGE_TOO_BIG = 1009
WAIT_S = 10.0  # bounds a failure only: every wait ends on a reply, a close or a condition


class _EchoApp:
    """Echoes each websocket message and records every event it receives after the connect."""

    def __init__(self) -> None:
        # asyncio's loop: the ``pauses`` fixture counts on its socket transports
        self.state = SimpleNamespace(
            settings=ServerSettings(event_loop="asyncio", limits=WireLimits(max_frame_bytes=LIMIT))
        )
        self.events: list[Any] = []
        self.disconnected = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            event = await receive()
            self.events.append(event)
            if event is None or event.get("type") != "websocket.receive":
                self.disconnected.set()
                return
            await send({"type": "websocket.send", "bytes": event["bytes"]})


@pytest.fixture
def app() -> _EchoApp:
    return _EchoApp()


@pytest.fixture
def server(app: _EchoApp) -> Iterator[RunningServer]:
    with serving(app) as running:
        yield running


class _RawClient:
    """A websocket client that writes any number of messages in one ``sendall``."""

    def __init__(self, server: RunningServer) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=WAIT_S)
        self.protocol = ClientProtocol(parse_uri(f"ws://{server.host}:{server.port}/"), max_size=None)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        self.pending: list[Any] = []
        assert isinstance(self._next_event(), Response)

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def _next_event(self) -> Any:
        while not self.pending:
            data = self.sock.recv(65536)  # a stalled server times out here (WAIT_S): the test fails
            assert data, "the server closed the connection"
            self.protocol.receive_data(data)
            self.pending.extend(self.protocol.events_received())
        return self.pending.pop(0)

    def send_burst(self, messages: list[bytes]) -> None:
        for message in messages:
            self.protocol.send_binary(message)
        self._flush()  # one write: on loopback the server reads it whole

    def replies(self, count: int) -> list[bytes]:
        out = []
        while len(out) < count:
            event = self._next_event()
            assert isinstance(event, Frame) and event.opcode is Opcode.BINARY, event
            out.append(bytes(event.data))
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("burst", [2, 8])
def test_a_burst_pauses_reading_once_and_reading_resumes_for_the_next_message(
    server: RunningServer, pauses: list[int], burst: int
) -> None:
    client = _RawClient(server)
    try:
        messages = [bytes([i]) * 16 for i in range(burst)]
        client.send_burst(messages)
        assert client.replies(burst) == messages  # every one, in order
        assert pauses == [1]  # at the second unread message, and not again while paused
        for i in range(3):  # reading resumed: lock-step messages are answered, without a pause
            client.send_burst([b"next %d" % i])
            assert client.replies(1) == [b"next %d" % i]
        assert pauses == [1]
    finally:
        client.close()


def test_a_single_message_never_pauses_reading(server: RunningServer, pauses: list[int]) -> None:
    client = _RawClient(server)
    try:
        for i in range(5):
            client.send_burst([b"one %d" % i])
            assert client.replies(1) == [b"one %d" % i]
        assert pauses == []
    finally:
        client.close()


def test_the_app_is_told_the_close_frames_code_and_reason_when_a_message_is_cut_off(
    app: _EchoApp, server: RunningServer
) -> None:
    with connect(server.ws_url + "/", max_size=None, compression=None) as ws:
        ws.send(b"kept")
        assert ws.recv(timeout=WAIT_S) == b"kept"
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(b"\0" * (4 * LIMIT))
            ws.recv(timeout=WAIT_S)
    frame = closed.value.rcvd
    assert frame is not None and frame.code == MESSAGE_TOO_BIG and frame.reason
    assert app.disconnected.wait(WAIT_S)
    assert app.events == [
        {"type": "websocket.receive", "bytes": b"kept"},
        {"type": "websocket.disconnect", "code": MESSAGE_TOO_BIG, "reason": frame.reason},
    ]


def test_a_server_stopping_while_a_connection_drains_closes_it_cleanly(
    app: _EchoApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_protocol, "DRAIN_S", 3600.0)  # only the stop can end this drain
    crashed: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    running = start_in_thread(app)
    client = _RawClient(running)
    try:
        header = b"\x82\xff" + (8 * LIMIT).to_bytes(8, "big") + b"\0\0\0\0"  # 512 KiB announced
        client.sock.sendall(header + b"\0" * (2 * LIMIT))  # then the client neither sends nor closes
        assert app.disconnected.wait(WAIT_S)  # cut off: the server drains now
        running.stop(timeout=WAIT_S)
        assert not running.thread.is_alive() and crashed == []
        data = b""
        while chunk := client.sock.recv(65536):  # the server's close frame, then its end
            data += chunk
        assert data[:1] == b"\x88"  # one close frame (1009), then EOF: no second close
        assert int.from_bytes(data[2:4], "big") == MESSAGE_TOO_BIG and len(data) == 2 + data[1]
    finally:
        client.close()
        running.stop()


class _Transport:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_the_drain_drops_up_to_its_byte_bound_and_closes_one_byte_past_it() -> None:
    protocol = SteadyReadWebSocketProtocol.__new__(SteadyReadWebSocketProtocol)  # the drain alone
    transport = _Transport()
    protocol.transport = transport  # type: ignore[assignment]
    protocol._drain_left = 100
    protocol.data_received(b"\0" * 60)
    protocol.data_received(b"\0" * 40)  # exactly the bound: still draining
    assert (transport.closed, protocol._drain_left) == (0, 0)
    protocol.data_received(b"\0")
    assert transport.closed == 1
