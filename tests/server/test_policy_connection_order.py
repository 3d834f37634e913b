"""A policy connection's frames take effect in the order they came, and a slow answer is no idle
client (real server, real websockets).

- An observation that waits on the engine thread belongs to the session it was sent in: a
  ``session_open`` right behind it must not have the new session answer it (its processors, its
  epoch 0) — the client would take that chunk for the new session's.
- The idle timeout closes a connection that sent nothing *and has nothing in flight*; an openpi
  request that runs longer than the timeout is answered, and the idle clock starts at the answer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionAck,
    SessionOpen,
    decode_message,
    encode_message,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)


@contextlib.contextmanager
def _server(policy: ChunkPolicy, **settings: Any) -> Iterator[RunningServer]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    with serving(create_app(config, policy=PolicyService(policy, config))) as server:
        yield server


@contextlib.contextmanager
def _connected(server: RunningServer, path: str = "") -> Iterator[ClientConnection]:
    with connect(server.ws_url + path, max_size=None, compression=None) as ws:
        yield ws


@pytest.mark.parametrize(("latency_s", "pause_s"), [(0.0, 0.0), (0.4, 0.1)], ids=["queued", "running"])
def test_an_observation_is_never_answered_by_the_session_opened_after_it(
    latency_s: float, pause_s: float
) -> None:
    # inline_below_ms=0: every observation goes to the engine thread, in a task of its own
    server_ctx = _server(ChunkPolicy(latency_s=latency_s), inline_below_ms=0.0)
    with server_ctx as server, _connected(server, PATH) as ws:
        ws.send(encode_message(SessionOpen(client_uuid="robot-a", state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        ws.send(encode_message(ObservationMsg(state=STATE, header=MsgHeader(seq_id=1, session_epoch=0))))
        time.sleep(pause_s)  # 0: still queued behind the frames that follow; 0.1 s: on the engine
        ws.send(encode_message(SessionOpen(client_uuid="robot-b", state_dim=6)))
        replies = [decode_message(ws.recv(timeout=10)) for _ in range(2)]
    kinds = [type(reply) for reply in replies]
    if kinds == [ActionChunkMsg, SessionAck]:
        return  # answered by the old session before the new one existed: in order
    assert kinds == [SessionAck, ErrorMsg], replies  # never SessionAck, then a chunk for seq 1
    assert replies[1].code == "unknown_session" and replies[1].seq_id == 1


def test_an_openpi_request_slower_than_the_idle_timeout_is_answered() -> None:
    with _server(ChunkPolicy(latency_s=1.0), policy_idle_timeout_s=0.4) as server, _connected(server) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))
        for pause in (0.0, 0.2):  # idle from the first answer on: 0.2 s later it is still open
            time.sleep(pause)
            ws.send(msgpack_numpy.packb({"state": STATE}))
            assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (20, 6)
        with pytest.raises(ConnectionClosed) as info:  # and quiet afterwards, it is closed
            ws.recv(timeout=10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001


def test_a_session_request_slower_than_the_idle_timeout_is_answered() -> None:
    server_ctx = _server(ChunkPolicy(latency_s=1.0), policy_idle_timeout_s=0.4, inline_below_ms=0.0)
    with server_ctx as server, _connected(server, PATH) as ws:
        ws.send(encode_message(SessionOpen(state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        for seq_id, pause in ((1, 0.0), (2, 0.2)):  # idle from the first answer on
            time.sleep(pause)
            ws.send(encode_message(ObservationMsg(state=STATE, header=MsgHeader(seq_id=seq_id))))
            reply = decode_message(ws.recv(timeout=10))
            assert isinstance(reply, ActionChunkMsg) and reply.header.seq_id == seq_id
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1001


class _HeldPolicy(ChunkPolicy):
    """Model calls wait until ``free`` is set (a model slower than anything the test waits for)."""

    def __init__(self) -> None:
        super().__init__()
        self.free = threading.Event()
        self.calls = threading.Event()

    def predict_action_chunks(self, requests: Any) -> list[np.ndarray]:
        self.calls.set()
        self.free.wait(30)
        return super().predict_action_chunks(requests)


def test_an_openpi_client_that_leaves_mid_request_is_let_go_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """The server stops waiting for the answer of a client that went away (a client's timeout, or
    a server shutting down, which closes every socket): its session is released while the model
    still runs, and the answer is not sent to a closed socket (no ASGI traceback in the log)."""
    policy = _HeldPolicy()
    config = ServerSettings(max_batch_wait_ms=0.0, inline_below_ms=0.0)
    service = PolicyService(policy, config)
    try:
        with serving(create_app(config, policy=service)) as server:
            with _connected(server) as ws:
                msgpack_numpy.unpackb(ws.recv(timeout=10))
                ws.send(msgpack_numpy.packb({"state": STATE}))
                assert policy.calls.wait(10)
            deadline = time.monotonic() + 10
            while len(service.sessions) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(service.sessions) == 0 and not policy.free.is_set()  # released, model still busy
            policy.free.set()
            with _connected(server) as ws:  # and the server keeps serving
                msgpack_numpy.unpackb(ws.recv(timeout=10))
                ws.send(msgpack_numpy.packb({"state": STATE}))
                assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (20, 6)
    finally:
        policy.free.set()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
