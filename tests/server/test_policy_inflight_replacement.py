"""Requests whose session is replaced or reset while they wait or run get an error, never a chunk.

docs/protocol.md (Epochs): an observation followed by a ``reset`` gets ``stale_epoch`` unless it was
already answered, and one whose session is replaced (``session_open`` with its ``client_uuid``, on
any connection) before its chunk is ready gets ``unknown_session`` with its ``seq_id``. One still
queued in the engine then is dropped when the engine forms its batch: the model never sees it, and
the engine's counters and the per-call metrics count only what ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gated_policy import GatedPolicy
from websockets.sync.client import ClientConnection, connect

from rollserve.server.app import create_app
from rollserve.server.metrics import METRICS
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    decode_message,
    encode_message,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)


def _serve(policy: Any, **settings: Any) -> tuple[PolicyService, Any]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    service = PolicyService(policy, config)
    return service, serving(create_app(config, policy=service))


def _raw(running: RunningServer) -> ClientConnection:
    return connect(running.ws_url + PATH, max_size=None, compression=None)


def _ask(ws: ClientConnection, frame: bytes) -> Any:
    ws.send(frame)
    return decode_message(ws.recv(timeout=10))


def _open(ws: ClientConnection, client_uuid: str) -> SessionAck:
    ack = _ask(ws, encode_message(SessionOpen(client_uuid=client_uuid)))
    assert isinstance(ack, SessionAck) and ack.accepted
    return ack


def _obs(seq_id: int, epoch: int) -> bytes:
    return encode_message(ObservationMsg(state=STATE, header=MsgHeader(seq_id=seq_id, session_epoch=epoch)))


def _reset(ws: ClientConnection, seq_id: int, epoch: int) -> int:
    ack = _ask(ws, encode_message(ResetMsg(header=MsgHeader(seq_id=seq_id, session_epoch=epoch))))
    assert isinstance(ack, ResetAck)
    return ack.session_epoch


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _replies(ws: ClientConnection, count: int) -> dict[int, Any]:
    """The next ``count`` replies by the seq_id they answer."""
    out: dict[int, Any] = {}
    for _ in range(count):
        msg = decode_message(ws.recv(timeout=10))
        out[msg.seq_id if isinstance(msg, ErrorMsg) else msg.header.seq_id] = msg
    return out


def _assert_error(msg: Any, code: str, seq_id: int) -> None:
    assert isinstance(msg, ErrorMsg), f"expected {code}, got {type(msg).__name__}"
    assert (msg.code, msg.seq_id) == (code, seq_id)


def test_reopening_elsewhere_refuses_the_old_connections_running_request() -> None:
    policy = GatedPolicy()
    _, server = _serve(policy)
    with server as running, _raw(running) as old, _raw(running) as new:
        epoch = _open(old, "robot-1").session_epoch
        old.send(_obs(1, epoch))
        assert policy.entered.wait(10)
        assert _open(new, "robot-1").session_epoch == epoch + 1
        policy.release.set()
        _assert_error(decode_message(old.recv(timeout=10)), "unknown_session", 1)
        assert isinstance(_ask(new, _obs(1, epoch + 1)), ActionChunkMsg)  # the new session is served


def test_reopening_elsewhere_refuses_the_old_connections_queued_request() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy)
    with server as running, _raw(running) as blocker, _raw(running) as old, _raw(running) as new:
        _occupy(blocker, policy)  # the model is busy: what follows queues behind it
        epoch = _open(old, "robot-1").session_epoch
        old.send(_obs(7, epoch))
        _wait_until(lambda: service.worker.queue_depth >= 1)
        _open(new, "robot-1")
        _free(blocker, policy)
        _assert_error(decode_message(old.recv(timeout=10)), "unknown_session", 7)


def test_a_reset_makes_the_running_request_stale() -> None:
    policy = GatedPolicy()
    _, server = _serve(policy)
    with server as running, _raw(running) as ws:
        epoch = _open(ws, "robot-1").session_epoch
        ws.send(_obs(1, epoch))
        assert policy.entered.wait(10)
        new_epoch = _reset(ws, 2, epoch)
        policy.release.set()
        _assert_error(decode_message(ws.recv(timeout=10)), "stale_epoch", 1)
        reply = _ask(ws, _obs(3, new_epoch))
        assert isinstance(reply, ActionChunkMsg) and reply.header.session_epoch == new_epoch


def test_superseded_ids_of_the_new_epoch_go_in_a_reply_of_the_new_epoch() -> None:
    """The running old-epoch request must not take them: the client drops its reply unread."""
    policy = GatedPolicy()
    service, server = _serve(policy)
    with server as running, _raw(running) as ws:
        epoch = _open(ws, "robot-1").session_epoch
        ws.send(_obs(1, epoch))
        assert policy.entered.wait(10)
        new_epoch = _reset(ws, 2, epoch)
        ws.send(_obs(3, new_epoch))
        ws.send(_obs(4, new_epoch))  # supersedes 3, still queued behind the running 1
        _wait_until(lambda: service.worker.stats.superseded >= 1)
        policy.release.set()
        replies = _replies(ws, 2)
        _assert_error(replies[1], "stale_epoch", 1)
        assert isinstance(replies[4], ActionChunkMsg)
        assert replies[4].header.session_epoch == new_epoch and replies[4].superseded_seq_ids == [3]


def test_an_old_epoch_request_superseded_after_a_reset_is_refused_not_listed() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy)
    with server as running, _raw(running) as blocker, _raw(running) as ws:
        _occupy(blocker, policy)  # the model is busy: what follows queues behind it
        epoch = _open(ws, "robot-1").session_epoch
        ws.send(_obs(1, epoch))
        _wait_until(lambda: service.worker.queue_depth >= 1)  # queued under the old epoch
        new_epoch = _reset(ws, 2, epoch)
        ws.send(_obs(3, new_epoch))  # supersedes 1
        _wait_until(lambda: service.worker.stats.superseded >= 1)
        policy.release.set()
        replies = _replies(ws, 2)
        _assert_error(replies[1], "stale_epoch", 1)
        assert isinstance(replies[3], ActionChunkMsg) and replies[3].superseded_seq_ids == []


def _occupy(blocker: ClientConnection, policy: GatedPolicy) -> None:
    """Hold the model in a call of another session's, so what is sent next waits in the queue."""
    _open(blocker, "blocker")
    blocker.send(_obs(1, 0))
    assert policy.entered.wait(10)


def _free(blocker: ClientConnection, policy: GatedPolicy) -> None:
    """Let the held call finish; its chunk is answered."""
    policy.release.set()
    assert isinstance(decode_message(blocker.recv(timeout=10)), ActionChunkMsg)


def _error(ws: ClientConnection) -> tuple[str, int | None]:
    msg = decode_message(ws.recv(timeout=10))
    assert isinstance(msg, ErrorMsg), f"expected an error, got {type(msg).__name__}"
    return msg.code, msg.seq_id


def _batch_metric(part: str) -> float:
    return METRICS.registry.get_sample_value("rollserve_batch_size" + part, {"kind": "policy"}) or 0.0


def _rows(policy: GatedPolicy) -> list[int]:
    """The size of each model call, in order: the rows the model received."""
    return [size for _, _, size in policy.call_spans]


def test_queued_observations_of_a_reset_epoch_never_reach_the_model() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy, inline_below_ms=0.0)  # every call on the thread
    calls_before, rows_before = _batch_metric("_count"), _batch_metric("_sum")
    with server as running, _raw(running) as blocker, _raw(running) as a, _raw(running) as b:
        _occupy(blocker, policy)  # the model is busy: what follows queues behind it
        epoch_a, epoch_b = _open(a, "robot-a").session_epoch, _open(b, "robot-b").session_epoch
        a.send(_obs(5, epoch_a))
        b.send(_obs(9, epoch_b))
        _wait_until(lambda: service.worker.queue_depth == 2)
        assert _reset(a, 6, epoch_a) == epoch_a + 1
        assert _reset(b, 10, epoch_b) == epoch_b + 1
        _free(blocker, policy)
        assert _error(a) == ("stale_epoch", 5)
        assert _error(b) == ("stale_epoch", 9)
        assert _rows(policy) == [1]  # the blocker's call only: neither old observation ran
        reply = _ask(a, _obs(7, epoch_a + 1))  # the new epoch is served as usual
        assert isinstance(reply, ActionChunkMsg)
        assert (reply.header.seq_id, reply.header.session_epoch, reply.batch_size) == (7, epoch_a + 1, 1)
        assert reply.superseded_seq_ids == []
        assert _rows(policy) == [1, 1]
        stats = service.worker.stats
        assert (stats.batches, stats.items, stats.skipped, stats.max_batch_seen) == (2, 2, 2, 1)
    assert _batch_metric("_count") - calls_before == 2  # one observation per model call
    assert _batch_metric("_sum") - rows_before == 2


def test_a_queued_observation_of_a_replaced_session_never_reaches_the_model() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy, inline_below_ms=0.0)  # every call on the thread
    with server as running, _raw(running) as blocker, _raw(running) as old, _raw(running) as new:
        _occupy(blocker, policy)  # the model is busy: what follows queues behind it
        epoch = _open(old, "robot-1").session_epoch
        old.send(_obs(3, epoch))
        _wait_until(lambda: service.worker.queue_depth == 1)
        assert _open(new, "robot-1").session_epoch == epoch + 1
        _free(blocker, policy)
        assert _error(old) == ("unknown_session", 3)
        assert _rows(policy) == [1]
        stats = service.worker.stats
        assert (stats.batches, stats.items, stats.skipped) == (1, 1, 1)


def test_a_current_observation_queued_with_stale_ones_runs_alone() -> None:
    """The stale ones leave the batch; the current one is answered with the size that ran."""
    policy = GatedPolicy()
    service, server = _serve(policy, inline_below_ms=0.0)  # every call on the thread
    with server as running, _raw(running) as blocker, _raw(running) as a, _raw(running) as b:
        _occupy(blocker, policy)  # the model is busy: what follows queues behind it
        epoch_a, epoch_b = _open(a, "robot-a").session_epoch, _open(b, "robot-b").session_epoch
        a.send(_obs(5, epoch_a))
        b.send(_obs(8, epoch_b))
        _wait_until(lambda: service.worker.queue_depth == 2)
        _reset(a, 6, epoch_a)
        _free(blocker, policy)
        assert _error(a) == ("stale_epoch", 5)
        reply = decode_message(b.recv(timeout=10))
        assert isinstance(reply, ActionChunkMsg)
        assert (reply.header.seq_id, reply.batch_size) == (8, 1)
        assert _rows(policy) == [1, 1]
        stats = service.worker.stats
        assert (stats.batches, stats.items, stats.skipped, stats.max_batch_seen) == (2, 2, 1, 1)
