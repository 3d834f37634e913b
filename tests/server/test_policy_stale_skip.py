"""Observations whose session went stale while they waited in the engine never reach the model.

docs/protocol.md (Epochs): an observation followed by a ``reset`` gets ``stale_epoch`` with its
``seq_id``, and one whose session is replaced first gets ``unknown_session``. Such a request is
dropped when the engine forms its batch: the model never sees it, and the engine's counters and the
per-call metrics count only what ran.
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
WAIT = 10.0


def _serve(policy: Any) -> tuple[PolicyService, Any]:
    config = ServerSettings(max_batch_wait_ms=0.0, inline_below_ms=0.0)  # every call on the thread
    service = PolicyService(policy, config)
    return service, serving(create_app(config, policy=service))


def _raw(running: RunningServer) -> ClientConnection:
    return connect(running.ws_url + PATH, max_size=None, compression=None)


def _ask(ws: ClientConnection, frame: bytes) -> Any:
    ws.send(frame)
    return decode_message(ws.recv(timeout=WAIT))


def _open(ws: ClientConnection, client_uuid: str) -> int:
    ack = _ask(ws, encode_message(SessionOpen(client_uuid=client_uuid)))
    assert isinstance(ack, SessionAck) and ack.accepted
    return ack.session_epoch


def _obs(seq_id: int, epoch: int) -> bytes:
    return encode_message(ObservationMsg(state=STATE, header=MsgHeader(seq_id=seq_id, session_epoch=epoch)))


def _reset(ws: ClientConnection, seq_id: int, epoch: int) -> int:
    ack = _ask(ws, encode_message(ResetMsg(header=MsgHeader(seq_id=seq_id, session_epoch=epoch))))
    assert isinstance(ack, ResetAck)
    return ack.session_epoch


def _wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition the server reaches by itself (the engine's queue has no event to wait on)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _error(ws: ClientConnection) -> tuple[str, int | None]:
    msg = decode_message(ws.recv(timeout=WAIT))
    assert isinstance(msg, ErrorMsg), f"expected an error, got {type(msg).__name__}"
    return msg.code, msg.seq_id


def _batch_metric(part: str) -> float:
    return METRICS.registry.get_sample_value("rollserve_batch_size" + part, {"kind": "policy"}) or 0.0


def _rows(policy: GatedPolicy) -> list[int]:
    """The size of each model call, in order: the rows the model received."""
    return [size for _, _, size in policy.call_spans]


def test_queued_observations_of_a_reset_epoch_never_reach_the_model() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy)
    calls_before, rows_before = _batch_metric("_count"), _batch_metric("_sum")
    with server as running, _raw(running) as blocker, _raw(running) as a, _raw(running) as b:
        _open(blocker, "blocker")
        blocker.send(_obs(1, 0))
        assert policy.entered.wait(WAIT)  # the model is busy: what follows queues behind it
        epoch_a, epoch_b = _open(a, "robot-a"), _open(b, "robot-b")
        a.send(_obs(5, epoch_a))
        b.send(_obs(9, epoch_b))
        _wait_until(lambda: service.worker.queue_depth == 2)
        assert _reset(a, 6, epoch_a) == epoch_a + 1
        assert _reset(b, 10, epoch_b) == epoch_b + 1
        policy.release.set()
        assert isinstance(decode_message(blocker.recv(timeout=WAIT)), ActionChunkMsg)
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
    service, server = _serve(policy)
    with server as running, _raw(running) as blocker, _raw(running) as old, _raw(running) as new:
        _open(blocker, "blocker")
        blocker.send(_obs(1, 0))
        assert policy.entered.wait(WAIT)
        epoch = _open(old, "robot-1")
        old.send(_obs(3, epoch))
        _wait_until(lambda: service.worker.queue_depth == 1)
        assert _open(new, "robot-1") == epoch + 1
        policy.release.set()
        assert isinstance(decode_message(blocker.recv(timeout=WAIT)), ActionChunkMsg)
        assert _error(old) == ("unknown_session", 3)
        assert _rows(policy) == [1]
        stats = service.worker.stats
        assert (stats.batches, stats.items, stats.skipped) == (1, 1, 1)


def test_a_current_observation_queued_with_stale_ones_runs_alone() -> None:
    """The stale ones leave the batch; the current one is answered with the size that ran."""
    policy = GatedPolicy()
    service, server = _serve(policy)
    with server as running, _raw(running) as blocker, _raw(running) as a, _raw(running) as b:
        _open(blocker, "blocker")
        blocker.send(_obs(1, 0))
        assert policy.entered.wait(WAIT)
        epoch_a, epoch_b = _open(a, "robot-a"), _open(b, "robot-b")
        a.send(_obs(5, epoch_a))
        b.send(_obs(8, epoch_b))
        _wait_until(lambda: service.worker.queue_depth == 2)
        _reset(a, 6, epoch_a)
        policy.release.set()
        assert isinstance(decode_message(blocker.recv(timeout=WAIT)), ActionChunkMsg)
        assert _error(a) == ("stale_epoch", 5)
        reply = decode_message(b.recv(timeout=WAIT))
        assert isinstance(reply, ActionChunkMsg)
        assert (reply.header.seq_id, reply.batch_size) == (8, 1)
        assert _rows(policy) == [1, 1]
        stats = service.worker.stats
        assert (stats.batches, stats.items, stats.skipped, stats.max_batch_seen) == (2, 2, 1, 1)
