"""A scripted policy server for unit tests of the robot-side client (``PolicyClient`` and the
engines on top of it): websockets' own server on 127.0.0.1, which records each message and each
connection's request headers and answers as a test scripts it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from rollserve.wire import (
    ActionChunkMsg,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    decode_message,
    encode_message,
)
from rollserve.wire.messages import Message

CHUNK = np.zeros((4, 6), np.float32)

# What a scripted server does with one message: the frames to send back (it may also close ``ws``).
Answer = Callable[[Message, ServerConnection], Sequence[bytes | str]]


class ScriptedServer:
    """A websocket server on 127.0.0.1 (websockets' own) that records each message it receives, and
    each connection's request headers, and answers as ``answer`` says (by default like a policy
    server: a session accepted at epoch 1, a reset acked one epoch on, a chunk per observation)."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer = answer or self.like_a_policy_server
        self.received: list[Message] = []
        self.headers: list[Any] = []
        self.epoch = 0
        self.ended = 0  # connections whose handler returned (the client's side closed)
        self._server = serve(
            self._handle, "127.0.0.1", 0, max_size=None, compression=None, process_request=self._record
        )
        self.url = f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}/v1/policy/ws"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _record(self, connection: ServerConnection, request: Any) -> None:
        self.headers.append(request.headers)  # before the handshake's answer: no race with the client

    def _handle(self, ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            for frame in ws:
                assert isinstance(frame, bytes)
                msg = decode_message(frame)
                self.received.append(msg)
                for reply in self.answer(msg, ws):
                    ws.send(reply)
        self.ended += 1

    def like_a_policy_server(self, msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            self.epoch = 1
            return [
                encode_message(SessionAck(accepted=True, session_id="s-1", session_epoch=1, chunk_size=4))
            ]
        if isinstance(msg, ResetMsg):
            self.epoch += 1
            return [encode_message(ResetAck(header=msg.header, session_epoch=self.epoch))]
        if isinstance(msg, ObservationMsg):
            return [encode_message(ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, header=msg.header))]
        return []

    def of_type(self, kind: type) -> list[Any]:
        return [m for m in self.received if isinstance(m, kind)]

    def close(self) -> None:
        self._server.shutdown()


@contextlib.contextmanager
def scripted(answer: Answer) -> Iterator[ScriptedServer]:
    server = ScriptedServer(answer)
    try:
        yield server
    finally:
        server.close()
