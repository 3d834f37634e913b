"""A call that races the server's 1009 close still raises FrameTooLarge.

uvicorn refuses a message over its frame limit with a close frame (1009) and closes the socket with
the rest of the message unread, so the kernel answers with a reset. When the client's next send
meets that reset before websockets has parsed the close frame, websockets closes the socket and the
frame is gone: the user saw a plain ``PolicyConnectionError`` (about 3% of resets right after an
oversized observation). Here a small websocket server closes at a moment the test chooses, while the
client's reader is held back by websockets' own flow control (more unread replies than its queue
takes), so the close frame is still unparsed when the next call sends: the race, every time."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import socket
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import PolicyClient
from rollserve.client.policy_client import FrameTooLarge
from rollserve.wire import MsgHeader, ObservationMsg, ResetAck, encode_message

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, section 1.3
REASON = b"frame with 120000 bytes exceeds limit of 65536 bytes"
UNREAD_REPLIES = 40  # more than websockets' receive queue (16 messages by default): its reader pauses
TCP_CLOSE = 7  # tcp_info.tcpi_state once the reset is in (Linux)
STATE = np.zeros(6, np.float32)
CAMERAS = {"top": np.zeros((64, 64, 3), np.uint8)}


class AbruptServer:
    """A websocket server of one connection (handshake by hand) that never reads what the client sends."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.accepted = threading.Event()
        self._conn: socket.socket | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        conn, _ = self._listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        match = re.search(rb"(?i)sec-websocket-key:\s*(\S+)", request)
        assert match is not None
        accept = base64.b64encode(hashlib.sha1(match.group(1) + WS_GUID).digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        self._conn = conn
        self.accepted.set()

    def send_binary(self, payload: bytes) -> None:
        assert self._conn is not None and len(payload) < 65536
        size = len(payload)
        length = bytes([size]) if size < 126 else bytes([126]) + struct.pack("!H", size)
        self._conn.sendall(b"\x82" + length + payload)

    def close_1009_with_reset(self) -> None:
        """The close frame, then a reset: what uvicorn's close with an oversized message unread becomes."""
        assert self._conn is not None
        payload = struct.pack("!H", 1009) + REASON
        self._conn.sendall(b"\x88" + bytes([len(payload)]) + payload)
        self._conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._conn.close()

    def close(self) -> None:
        for sock in (self._conn, self._listener):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


@pytest.fixture
def server() -> Iterator[AbruptServer]:
    server = AbruptServer()
    yield server
    server.close()


def _tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="waits on the TCP state (Linux)")
def test_every_call_after_a_1009_close_the_reader_had_not_parsed_raises_frame_too_large(
    server: AbruptServer,
) -> None:
    """Regression: the reset's send met the reset first; websockets dropped the close frame with the
    socket and the call raised PolicyConnectionError ("no close frame received or sent")."""
    client = PolicyClient(f"ws://127.0.0.1:{server.port}/v1/policy/ws", timeout=5.0)
    client.connect()
    assert server.accepted.wait(10)
    ws = client._ws
    assert ws is not None
    if not hasattr(ws, "recv_flow_control"):
        pytest.skip("this websockets has no receive flow control to hold its reader back")
    refused = ObservationMsg(state=STATE, images=CAMERAS, header=client.next_header())
    client.send_observation(refused)  # the server never reads it: unread data, so its close is a reset
    stale = encode_message(ResetAck(header=MsgHeader(seq_id=10**6)))
    for _ in range(UNREAD_REPLIES):
        server.send_binary(stale)
    wait_until(ws.recv_flow_control.locked)  # the reader is paused: it reads nothing more
    server.close_1009_with_reset()
    wait_until(lambda: _tcp_state(ws.socket) == TCP_CLOSE)  # the reset is in; the close frame unparsed

    with pytest.raises(FrameTooLarge) as info:
        client.reset(1)
    message = str(info.value)
    assert REASON.decode() in message and "1009" in message, message
    assert f"{len(encode_message(refused))} bytes" in message, message  # the refused message's size
    assert info.value.code == "frame_too_large" and not info.value.retryable
    with pytest.raises(FrameTooLarge):  # and every call after it, until connect()
        client.infer(ObservationMsg(state=STATE, header=client.next_header()), timeout=5.0)
    with pytest.raises(FrameTooLarge):
        client.open_session(state_dim=6)
    with pytest.raises(FrameTooLarge):
        for _ in range(UNREAD_REPLIES + 1):  # the replies received before the close come first
            assert isinstance(client.receive(timeout=5.0), ResetAck)
    client.close()
