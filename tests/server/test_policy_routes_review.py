"""Pins what the policy websockets (``rollserve.server.policy.routes``) promise, where the mutation
run of the ``policy_routes`` module found it unchecked (real server on 127.0.0.1, real websockets):

* every refusal of the session protocol as the client reads it: code, words, ``seq_id`` and
  ``retryable`` (docs/protocol.md, "Error codes"), and the acks' echoed headers;
* what counts towards a connection's refusal streak and what halves it, read from the streak of
  each connection (the delay it leads to is ``penalty.py``'s, checked in ``test_refusal_penalty``);
* the shared lane on the websockets (``--refused-lanes``), so far checked over REST only;
* the openpi endpoint's metadata, ``server_timing`` (``prev_total_ms`` on a recorded clock), its
  session refusals and its "internal server error";
* the metrics the routes keep: requests and errors per route, open sessions, queue wait in seconds;
* where a frame is decoded: on the event loop or on a worker thread (docs/protocol.md, "Off the
  event loop"), at the edges of each bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from gated_policy import GatedPolicy
from openpi_client import msgpack_numpy
from starlette.websockets import WebSocket
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server import penalty
from rollserve.server.app import create_app
from rollserve.server.metrics import METRICS
from rollserve.server.policy import routes
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    CloseAck,
    CloseMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    WireLimits,
    decode_message,
    encode_message,
    unpackb,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)
GARBAGE = b"\xc1\xc1 not msgpack"
NOT_MSGPACK = ErrorMsg(code="malformed_frame", message="not a valid msgpack frame (FormatError)")
# a delay that counts every refusal but costs nothing to wait out (both bounds above 0: it is on)
COUNTING_ONLY = {"refusal_delay_ms": 0.001, "refusal_delay_max_ms": 0.001}
RECV_S = 10


@contextlib.contextmanager
def _server(policy: Any = None, **settings: Any) -> Iterator[tuple[PolicyService, RunningServer]]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    service = PolicyService(policy if policy is not None else ChunkPolicy(), config)
    with serving(create_app(config, policy=service)) as server:
        yield service, server


@contextlib.contextmanager
def _connect(server: RunningServer, path: str = PATH) -> Iterator[ClientConnection]:
    with connect(server.ws_url + path, max_size=None, compression=None) as ws:
        yield ws


def _ask(ws: ClientConnection, frame: bytes | str) -> Any:
    ws.send(frame)
    return decode_message(ws.recv(timeout=RECV_S))


def _obs(seq_id: int, epoch: int = 0) -> bytes:
    return encode_message(ObservationMsg(header=MsgHeader(seq_id=seq_id, session_epoch=epoch), state=STATE))


def _metadata(ws: ClientConnection) -> dict[str, Any]:
    frame = ws.recv(timeout=RECV_S)
    assert isinstance(frame, bytes), frame
    return msgpack_numpy.unpackb(frame)


def _errors(route: str, code: str) -> float:
    labels = {"route": route, "code": code}
    return METRICS.registry.get_sample_value("rollserve_errors_total", labels) or 0.0


def _requests(route: str) -> float:
    return METRICS.registry.get_sample_value("rollserve_requests_total", {"route": route}) or 0.0


def _active_sessions() -> float | None:
    return METRICS.registry.get_sample_value("rollserve_active_sessions", {"kind": "policy"})


@pytest.fixture
def streaks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each connection's refusal record, in the order the connections were accepted."""
    made: list[Any] = []

    class Recorded(routes._Refusals):
        def __init__(self, penalty: Any) -> None:
            super().__init__(penalty)
            made.append(self)

    monkeypatch.setattr(routes, "_Refusals", Recorded)
    return made


# -- the session protocol: every refusal and ack as the client reads it ----------------------------


def test_each_refusal_of_the_session_route_has_its_code_words_and_request() -> None:
    with _server() as (service, server), _connect(server) as ws:
        before = {code: _errors("policy_ws", code) for code in ("malformed_frame", "unknown_session")}
        requests = _requests("policy_ws")
        assert _ask(ws, "hello") == ErrorMsg(
            code="malformed_frame",
            message="send binary msgpack frames; text frames are not part of the protocol",
        )
        assert _ask(ws, GARBAGE) == NOT_MSGPACK  # the decoder's own code and words, as they are
        assert _ask(ws, encode_message(SessionAck(accepted=True))) == ErrorMsg(
            code="unexpected_message", message="clients do not send 'session_ack' messages"
        )
        reset = encode_message(ResetMsg(header=MsgHeader(seq_id=4, episode_id=2)))
        assert _ask(ws, reset) == ErrorMsg(
            code="unknown_session", message="open a session before resetting it", seq_id=4
        )
        assert _ask(ws, _obs(5)) == ErrorMsg(
            code="unknown_session", message="open a session before sending observations", seq_id=5
        )
        assert _errors("policy_ws", "malformed_frame") == before["malformed_frame"] + 2
        assert _errors("policy_ws", "unknown_session") == before["unknown_session"] + 2
        assert _requests("policy_ws") == requests + 1  # the observation; the other frames are no requests

        assert _ask(ws, encode_message(SessionOpen(client_uuid="robot-r", state_dim=6))).accepted
        header = MsgHeader(seq_id=6, episode_id=3, session_epoch=0, client_mono_ns=77)
        assert _ask(ws, encode_message(ResetMsg(header=header))) == ResetAck(header=header, session_epoch=1)
        assert _ask(ws, _obs(7, epoch=0)) == ErrorMsg(
            code="stale_epoch", message="session_epoch 0 is not the current 1", seq_id=7
        )
        short = ObservationMsg(header=MsgHeader(seq_id=11, session_epoch=1), state=np.zeros(5, np.float32))
        ws.send(encode_message(short))
        refusal = unpackb(ws.recv(timeout=RECV_S))  # as any client reads it: retryable is a bool
        assert refusal == {  # the service's own check: not retryable
            "type": "error",
            "code": "bad_shape",
            "message": "state must have shape (6,), got (5,)",
            "seq_id": 11,
            "retryable": False,
        }
        assert refusal["retryable"] is False
        chunk = _ask(ws, _obs(8, epoch=1))
        assert isinstance(chunk, ActionChunkMsg) and chunk.header.seq_id == 8
        closing = MsgHeader(seq_id=9, episode_id=3, session_epoch=1, client_mono_ns=78)
        assert _ask(ws, encode_message(CloseMsg(header=closing))) == CloseAck(header=closing)
        assert len(service.sessions) == 0  # closed before the ack went out
        assert _ask(ws, _obs(10, epoch=1)) == ErrorMsg(
            code="unknown_session", message="open a session before sending observations", seq_id=10
        )


def test_a_closed_engine_is_a_retryable_unavailable_for_the_request_it_refused() -> None:
    with _server() as (service, server), _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        service.worker.close()  # a server shutting down
        assert _ask(ws, _obs(3)) == ErrorMsg(
            code="unavailable", message="the policy engine is shutting down", seq_id=3, retryable=True
        )


def test_an_unexpected_failure_is_an_internal_error_of_that_request_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with _server() as (service, server), _connect(server) as ws:

        async def broken(*args: Any) -> Any:
            raise RuntimeError("a bug in the server")

        service.infer = broken  # type: ignore[method-assign]
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        with caplog.at_level(logging.ERROR, logger=routes.__name__):
            assert _ask(ws, _obs(12)) == ErrorMsg(
                code="inference_error", message="internal server error", seq_id=12
            )
    [record] = [r for r in caplog.records if r.name == routes.__name__]
    assert record.getMessage() == "policy request 12 failed" and record.levelno == logging.ERROR
    assert record.exc_info is not None and str(record.exc_info[1]) == "a bug in the server"


def test_open_sessions_are_published_as_they_open_and_close() -> None:
    with _server() as (service, server):
        with _connect(server) as first, _connect(server) as second:
            assert _ask(first, encode_message(SessionOpen(state_dim=6))).accepted
            assert _active_sessions() == 1
            assert _ask(second, encode_message(SessionOpen(state_dim=6))).accepted
            assert _active_sessions() == 2
            assert isinstance(_ask(first, encode_message(CloseMsg())), CloseAck)
            assert _active_sessions() == 1
            assert _ask(first, encode_message(SessionOpen(state_dim=6))).accepted
            assert _active_sessions() == 2
        _wait_until(lambda: len(service.sessions) == 0)
        assert _active_sessions() == 0  # both released when their connections closed


def _wait_until(condition: Any) -> None:
    """Until the server did what a closed connection asks of it (it does in milliseconds)."""
    deadline = time.monotonic() + RECV_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def test_a_chunks_queue_wait_is_recorded_in_seconds() -> None:
    def total() -> float:
        labels = {"kind": "policy"}
        return METRICS.registry.get_sample_value("rollserve_queue_wait_seconds_sum", labels) or 0.0

    with _server(ChunkPolicy(latency_s=0.05), inline_below_ms=0.0) as (_, server), _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        before = total()
        chunk = _ask(ws, _obs(1))
        assert isinstance(chunk, ActionChunkMsg) and chunk.queue_wait_ms > 0
        assert total() - before == pytest.approx(chunk.queue_wait_ms / 1000.0, rel=1e-9)


# -- refusal streaks: what counts, what halves -------------------------------------------------------


def test_the_session_route_counts_the_clients_own_mistakes_and_each_accepted_request_halves(
    streaks: list[Any],
) -> None:
    with (
        _server(max_policy_sessions=1, **COUNTING_ONLY) as (_, server),
        _connect(server) as holder,
        _connect(server) as ws,
    ):
        assert _ask(holder, encode_message(SessionOpen(client_uuid="holder", state_dim=6))).accepted
        streak = streaks[1].streak
        for _ in range(3):
            assert _ask(ws, GARBAGE) == NOT_MSGPACK
        assert streak.count == 3
        refused = _ask(ws, encode_message(SessionOpen(client_uuid="late", state_dim=6)))
        assert not refused.accepted and refused.reason == "server is at its limit of 1 policy sessions"
        assert streak.count == 3  # a full server is no fault of the client: nothing counted or halved
        assert _ask(ws, "text").code == "malformed_frame"
        assert _ask(ws, encode_message(SessionAck(accepted=True))).code == "unexpected_message"
        assert streak.count == 5
        assert _ask(ws, _obs(1)).code == "unknown_session"  # the socket's own unknown_session
        assert _ask(ws, encode_message(ResetMsg())).code == "unknown_session"
        assert streak.count == 5
        assert isinstance(_ask(holder, encode_message(CloseMsg())), CloseAck)
        assert _ask(ws, encode_message(SessionOpen(client_uuid="late", state_dim=6))).accepted
        assert streak.count == 2  # an accepted open halves (5 // 2)
        assert _ask(ws, _obs(2, epoch=7)).code == "stale_epoch"
        assert streak.count == 2
        assert _ask(ws, GARBAGE) == NOT_MSGPACK
        assert streak.count == 3
        assert isinstance(_ask(ws, encode_message(ResetMsg())), ResetAck)
        assert streak.count == 1  # an accepted reset halves
        assert _ask(ws, GARBAGE) == NOT_MSGPACK
        assert isinstance(_ask(ws, _obs(3, epoch=1)), ActionChunkMsg)
        assert streak.count == 1  # an answered observation halves (2 // 2)
        assert streaks[0].streak.count == 0  # the other connection's streak is its own


def test_a_retryable_refusal_is_not_counted(streaks: list[Any]) -> None:
    with _server(**COUNTING_ONLY) as (service, server), _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        assert _ask(ws, GARBAGE) == NOT_MSGPACK
        service.worker.close()
        assert _ask(ws, _obs(1)).retryable
        assert streaks[0].streak.count == 1


def test_the_openpi_route_counts_refusals_and_each_answer_halves(streaks: list[Any]) -> None:
    with _server(**COUNTING_ONLY) as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        streak = streaks[0].streak
        for _ in range(3):
            ws.send(GARBAGE)
            assert ws.recv(timeout=RECV_S) == "malformed_frame: not a valid msgpack frame (FormatError)"
        ws.send("text")
        assert ws.recv(timeout=RECV_S) == "malformed_frame: send binary msgpack frames"
        ws.send(msgpack_numpy.packb({"nothing": 1}))
        assert ws.recv(timeout=RECV_S).startswith("bad_observation: ")
        assert streak.count == 5
        ws.send(msgpack_numpy.packb({"state": STATE}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
        assert streak.count == 2


# -- the shared lane on the websockets ----------------------------------------------------------------


def _streak_then_hold_the_lane(policy: GatedPolicy, holder: ClientConnection) -> None:
    """``holder`` gets a refusal, then asks for actions: its request holds the lane in the model."""
    _metadata(holder)
    holder.send(GARBAGE)
    assert holder.recv(timeout=RECV_S).startswith("malformed_frame")
    holder.send(msgpack_numpy.packb({"state": STATE}))
    assert policy.entered.wait(RECV_S)


def _refused_once(ws: ClientConnection) -> None:
    _metadata(ws)
    ws.send(GARBAGE)
    assert ws.recv(timeout=RECV_S).startswith("malformed_frame")  # straight through: no streak yet


def test_one_lane_lets_one_websocket_input_of_a_streak_through_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(penalty, "LANE_WAIT_S", 30.0)  # nobody gives up waiting for it here
    policy = GatedPolicy()
    settings = {"inline_below_ms": 0.0, "refused_connection_lanes": 1, **COUNTING_ONLY}
    with (
        _server(policy, **settings) as (_, server),
        _connect(server, "") as holder,
        _connect(server, "") as other,
        _connect(server, "") as healthy,
    ):
        _refused_once(other)
        _streak_then_hold_the_lane(policy, holder)
        other.send(GARBAGE)  # its second refusal waits for the lane
        _metadata(healthy)
        healthy.send(GARBAGE)  # a connection without a streak goes straight through
        assert healthy.recv(timeout=RECV_S).startswith("malformed_frame")
        with pytest.raises(TimeoutError):
            other.recv(timeout=0.5)  # (an absence: it cannot come before the lane is free)
        policy.release.set()
        assert msgpack_numpy.unpackb(holder.recv(timeout=RECV_S))["actions"].shape == (20, 6)
        assert other.recv(timeout=RECV_S).startswith("malformed_frame")


def test_more_lanes_let_as_many_inputs_of_streaks_through_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(penalty, "LANE_WAIT_S", 30.0)
    policy = GatedPolicy()
    settings = {"inline_below_ms": 0.0, "refused_connection_lanes": 2, **COUNTING_ONLY}
    try:
        with (
            _server(policy, **settings) as (_, server),
            _connect(server, "") as holder,
            _connect(server, "") as other,
        ):
            _refused_once(other)
            _streak_then_hold_the_lane(policy, holder)
            other.send(GARBAGE)  # the second lane is free: answered while the first is held
            assert other.recv(timeout=RECV_S).startswith("malformed_frame")
            policy.release.set()
            assert msgpack_numpy.unpackb(holder.recv(timeout=RECV_S))["actions"].shape == (20, 6)
    finally:
        policy.release.set()


# -- the openpi endpoint ----------------------------------------------------------------------------


def test_openpi_metadata_is_the_policys_plus_what_the_server_adds() -> None:
    with _server(ChunkPolicy(execution_horizon=7)) as (_, server), _connect(server, "") as ws:
        assert _metadata(ws) == {
            "name": "chunk-policy",
            "action_names": ["a0", "a1", "a2", "a3", "a4", "a5"],
            "chunk_size": 20,
            "state_dim": 6,
            "camera_names": [],
            "image_shape": None,
            "fps": 15.0,
            "supports_rtc": True,
            "supports_batching": True,
            "server": "rollserve",
            "execution_horizon": 7,
            "openpi_input": {"layout": "auto", "detects": ["droid", "aloha", "libero"]},
        }


class _Clock:
    """``time.perf_counter`` for the routes: the answer took 0.25 s, 0.5 s, ... after its read."""

    def __init__(self) -> None:
        self.calls = 0

    def perf_counter(self) -> float:
        self.calls += 1
        start, done = divmod(self.calls - 1, 2)
        return 100.0 * (start + 1) + (0.25 * (start + 1) if done else 0.0)


def test_openpi_server_timing_names_each_figure_and_times_the_request_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(routes, "time", _Clock())
    with _server() as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        timings = []
        for _ in range(3):
            ws.send(msgpack_numpy.packb({"state": STATE}))
            reply = msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))
            assert set(reply) == {"actions", "server_timing"}
            timings.append(reply["server_timing"])
    assert [set(t) for t in timings] == [{"infer_ms", "queue_wait_ms", "batch_size", "prev_total_ms"}] * 3
    assert [t["prev_total_ms"] for t in timings] == [0.0, 250.0, 500.0]  # the one before, in ms
    assert [t["batch_size"] for t in timings] == [1, 1, 1]


def test_an_openpi_client_is_refused_when_every_session_is_taken() -> None:
    with _server(max_policy_sessions=1) as (service, server), _connect(server, "") as early:
        _metadata(early)  # connected while a session was free; it opens one with its first request
        with _connect(server) as robot:
            assert _ask(robot, encode_message(SessionOpen(state_dim=6))).accepted
            with _connect(server, "") as late:
                assert late.recv(timeout=RECV_S) == "unavailable: server is at its limit of 1 policy sessions"
                _assert_closed(late, 1013)
            early.send(msgpack_numpy.packb({"state": STATE}))
            assert early.recv(timeout=RECV_S) == "unavailable: server is at its limit of 1 policy sessions"
            _assert_closed(early, 1013)
        assert len(service.sessions) == 0


def _assert_closed(ws: ClientConnection, code: int, reason: str = "") -> None:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=RECV_S)
    assert info.value.rcvd is not None
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (code, reason)


def test_an_unexpected_openpi_failure_is_an_internal_error_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with _server() as (service, server), _connect(server, "") as ws:
        errors = _errors("openpi", "inference_error")

        async def broken(*args: Any) -> Any:
            raise RuntimeError("a bug in the server")

        service.infer = broken  # type: ignore[method-assign]
        _metadata(ws)
        with caplog.at_level(logging.ERROR, logger=routes.__name__):
            ws.send(msgpack_numpy.packb({"state": STATE}))
            assert ws.recv(timeout=RECV_S) == "inference_error: internal server error"
        assert _errors("openpi", "inference_error") == errors + 1
    [record] = [r for r in caplog.records if r.name == routes.__name__]
    assert record.getMessage() == "openpi request failed" and record.levelno == logging.ERROR
    assert record.exc_info is not None and str(record.exc_info[1]) == "a bug in the server"


def test_an_openpi_client_that_leaves_ends_its_connection_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that asks, reads its answer and leaves is the common case: the connection's end
    (no read left pending) raises nothing, so uvicorn logs no "Exception in ASGI application"."""
    uvicorn_errors = logging.getLogger("uvicorn.error")  # uvicorn's own: it does not reach the root
    with caplog.at_level(logging.ERROR), _server() as (service, server):
        uvicorn_errors.addHandler(caplog.handler)  # after the start: uvicorn's log setup resets it
        try:
            with _connect(server, "") as ws:
                _metadata(ws)
                ws.send(msgpack_numpy.packb({"state": STATE}))
                assert "actions" in msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))
            _wait_until(lambda: len(service.sessions) == 0)
        finally:
            server.stop()  # every connection's handler has ended, and logged whatever it did
            uvicorn_errors.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- admission ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [PATH, ""], ids=["session", "openpi"])
def test_a_connection_over_the_limit_is_closed_with_a_reason_that_says_so(path: str) -> None:
    with (
        _server(max_connections_per_client=1) as (_, server),
        _connect(server, path),
        _connect(server, path) as ws,
    ):
        ws.recv(timeout=RECV_S)  # the refusal in the route's framing (test_policy_connection_refusals)
        _assert_closed(ws, 1013, "too many connections")


# -- decoding on the loop or on a thread ---------------------------------------------------------------


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The functions the routes hand to a worker thread."""
    handed: list[Any] = []
    real = asyncio.to_thread

    async def recording(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        handed.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", recording)
    return handed


def _plain_frame(size: int, **fields: Any) -> bytes:
    """A plain msgpack map of exactly ``size`` bytes: ``fields`` and a key ``p`` holding bytes."""

    def frame(pad: bytes) -> bytes:
        return msgpack_numpy.packb({**fields, "p": pad})

    base = len(frame(b""))
    for header in (2, 3, 5):  # bin 8, bin 16, bin 32: a header of 2, 3 or 5 bytes
        packed = frame(b"\0" * (size - base + 2 - header))
        if len(packed) == size:
            return packed
    raise AssertionError(size)


def _rsv1_frame(header: bytes, payload: bytes) -> bytes:
    """A frame of the out-of-band framing around ``header`` (its msgpack part) and ``payload``."""
    padding = b"\0" * (-(8 + len(header)) % 8)
    return b"RSV1" + len(header).to_bytes(4, "little") + header + padding + payload


MIB = 1024 * 1024


def test_openpi_frames_up_to_4_mib_are_decoded_on_the_loop_and_larger_ones_on_a_thread(
    hand_offs: list[Any],
) -> None:
    with _server(limits=WireLimits(max_frame_bytes=16 * MIB)) as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        for size in (64 * 1024, 64 * 1024 + 1, 4 * MIB):
            ws.send(_plain_frame(size, state=STATE))
            assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6), size
        assert hand_offs == []
        # a plain frame whose bytes 4..8 (its pad's length, 0x00500000, big-endian) would read as a
        # small header size: only a framed frame has one
        over = msgpack_numpy.packb({"p": b"\0" * (5 * MIB), "state": STATE})
        assert int.from_bytes(over[4:8], "little") == 0x5000
        ws.send(over)
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
        assert hand_offs == [unpackb]


def test_a_flood_of_maps_at_exactly_64_kib_is_decoded_with_the_full_budget(hand_offs: list[Any]) -> None:
    """At 64 KiB a frame is decoded with the full limits on the loop; a byte more, with the inline
    budget of 2048 maps and lists first, then again on a thread."""
    maps = [{}] * 3000
    with _server() as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        ws.send(_plain_frame(64 * 1024, state=STATE, maps=maps))
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
        assert hand_offs == []
        ws.send(_plain_frame(64 * 1024 + 1, state=STATE, maps=maps))
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
        assert hand_offs == [unpackb]


CAMERAS = ("cam0", "cam1")


@contextlib.contextmanager
def _camera_session(server: RunningServer) -> Iterator[ClientConnection]:
    with _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6, camera_names=list(CAMERAS)))).accepted
        yield ws


def test_raw_cameras_in_a_session_frame_are_only_viewed_so_it_is_decoded_on_the_loop(
    hand_offs: list[Any],
) -> None:
    """6 MiB of raw pixels, whose bytes happen to hold the msgpack string "jpeg": the frame's
    msgpack part is a few hundred bytes, and only that part is searched for a JPEG."""
    image = np.zeros((1024, 1024, 3), np.uint8)
    image.reshape(-1)[1000:1005] = np.frombuffer(b"\xa4jpeg", np.uint8)
    with _server(ChunkPolicy(camera_names=CAMERAS)) as (_, server), _camera_session(server) as ws:
        frame = encode_message(
            ObservationMsg(header=MsgHeader(seq_id=1), state=STATE, images=dict.fromkeys(CAMERAS, image))
        )
        assert len(frame) > 6 * MIB and int.from_bytes(frame[4:8], "little") < 1024
        assert isinstance(_ask(ws, frame), ActionChunkMsg)
        assert hand_offs == []


@pytest.mark.parametrize("task", ["pick", "jpeg"], ids=["on the loop", "on a thread"])
def test_a_frame_is_decoded_within_the_servers_own_limits_wherever_it_is_decoded(
    task: str, hand_offs: list[Any]
) -> None:
    """Limits set for the server bound the decoder itself, not only what is checked after it: a
    small frame, decoded on the loop, and one whose task is the string "jpeg", sent to a thread."""
    with _server(limits=WireLimits(max_objects=4)) as (_, server), _connect(server) as ws:
        reply = _ask(ws, encode_message(SessionOpen(state_dim=6, task=task)))
    assert isinstance(reply, ErrorMsg) and reply.code == "too_many_objects", reply
    assert reply.message.startswith("more than 4 values or ")
    assert hand_offs == ([] if task == "pick" else [decode_message])


def test_a_session_frame_with_a_jpeg_is_decoded_on_a_thread_however_small(hand_offs: list[Any]) -> None:
    image = np.zeros((32, 32, 3), np.uint8)
    with _server(ChunkPolicy(camera_names=CAMERAS)) as (_, server), _camera_session(server) as ws:
        observation = ObservationMsg(
            header=MsgHeader(seq_id=1), state=STATE, images=dict.fromkeys(CAMERAS, image), jpeg_quality=90
        )
        assert isinstance(_ask(ws, encode_message(observation)), ActionChunkMsg)
        assert hand_offs == [decode_message]
        # the tag at the very first byte counts too (a frame that is only the string "jpeg")
        assert _ask(ws, b"\xa4jpeg") == ErrorMsg(
            code="malformed_frame", message="a message must be a msgpack map"
        )
        assert hand_offs == [decode_message, decode_message]


@pytest.mark.parametrize(("header_bytes", "hand_offs_expected"), [(65528, 0), (65529, 1)])
def test_a_framed_frame_is_judged_by_its_msgpack_part_up_to_64_kib(
    hand_offs: list[Any], header_bytes: int, hand_offs_expected: int
) -> None:
    """8 bytes of prefix and a msgpack part of 65528 bytes make 64 KiB: decoded with the full budget
    on the loop; one byte more, and 3000 maps are over the inline budget: decoded again on a thread.
    The 1 MiB payload after it counts for neither."""
    empty = msgpack.packb({"type": "observation", "maps": [{}] * 3000, "pad": b""})
    header = msgpack.packb(
        {"type": "observation", "maps": [{}] * 3000, "pad": b"\0" * (header_bytes - len(empty) - 1)}
    )
    assert len(header) == header_bytes
    with _server() as (_, server), _connect(server) as ws:
        reply = _ask(ws, _rsv1_frame(header, b"\0" * MIB))
        assert reply == ErrorMsg(  # decoded: an observation, without a session
            code="unknown_session", message="open a session before sending observations", seq_id=0
        )
        assert hand_offs == [decode_message] * hand_offs_expected


# -- a reply that cannot be sent -----------------------------------------------------------------------


class _LostSends:
    """Makes the server's next ``send_bytes`` or ``send_text`` fail, as when its client is gone."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: str | None = None
        for name in ("send_bytes", "send_text"):
            monkeypatch.setattr(WebSocket, name, self._failing(name, getattr(WebSocket, name)))

    def _failing(self, name: str, real: Any) -> Any:
        async def send(websocket: WebSocket, data: Any) -> None:
            if self.armed == name:
                self.armed = None
                raise RuntimeError("the client went away")
            await real(websocket, data)

        return send


def _sends_lost(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.getMessage(), str(r.exc_info[1]) if r.exc_info else "")
        for r in caplog.records
        if r.name == routes.__name__ and r.levelno == logging.DEBUG
    ]


def test_a_session_reply_that_cannot_be_sent_is_logged_and_the_connection_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lost = _LostSends(monkeypatch)
    with _server() as (_, server), _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        with caplog.at_level(logging.DEBUG, logger=routes.__name__):
            lost.armed = "send_bytes"
            ws.send(encode_message(ResetMsg(header=MsgHeader(seq_id=1))))  # its ack is lost on the way out
            reply = _ask(ws, _obs(2, epoch=1))  # the reset took effect all the same
        assert isinstance(reply, ActionChunkMsg) and reply.header.seq_id == 2
    assert _sends_lost(caplog) == [("could not send to a closed policy websocket", "the client went away")]


def test_an_openpi_reply_or_refusal_that_cannot_be_sent_is_logged_and_the_connection_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lost = _LostSends(monkeypatch)
    with _server() as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        with caplog.at_level(logging.DEBUG, logger=routes.__name__):
            lost.armed = "send_bytes"
            ws.send(msgpack_numpy.packb({"state": STATE}))  # its actions are lost
            ws.send(msgpack_numpy.packb({"state": STATE}))
            assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
            lost.armed = "send_text"
            ws.send(GARBAGE)  # its refusal is lost
            ws.send("text")
            assert ws.recv(timeout=RECV_S) == "malformed_frame: send binary msgpack frames"
    went = ("could not send to a closed openpi websocket", "the client went away")
    assert _sends_lost(caplog) == [went, went]


class _Reads:
    """Counts the frames the server has read (``WebSocket.receive``), so a test can wait for one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.changed = threading.Condition()
        real = WebSocket.receive

        async def receive(websocket: WebSocket) -> Any:
            message = await real(websocket)
            if message["type"] == "websocket.receive":
                with self.changed:
                    self.count += 1
                    self.changed.notify_all()
            return message

        monkeypatch.setattr(WebSocket, "receive", receive)

    def wait_for(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.count >= count, timeout=RECV_S)


def test_an_openpi_request_sent_before_the_answer_to_the_last_is_answered_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read that listens for a disconnect while the model runs gets the client's next request
    instead: that request is answered next, not dropped, and the connection stays open."""
    reads = _Reads(monkeypatch)
    policy = GatedPolicy()
    requests = _requests("openpi")
    try:
        with _server(policy, inline_below_ms=0.0) as (_, server), _connect(server, "") as ws:
            _metadata(ws)
            ws.send(msgpack_numpy.packb({"state": STATE}))
            assert policy.entered.wait(RECV_S)
            ws.send(msgpack_numpy.packb({"state": -STATE}))
            reads.wait_for(2)  # read while the first is in the model
            policy.release.set()
            first, second = (msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"] for _ in range(2))
            assert not np.array_equal(first, second)  # two answers, each of its own state
            ws.send(msgpack_numpy.packb({"state": STATE}))
            np.testing.assert_array_equal(msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"], first)
    finally:
        policy.release.set()
    assert _requests("openpi") == requests + 3


def test_an_openpi_prompt_that_says_jpeg_is_decoded_on_the_loop(hand_offs: list[Any]) -> None:
    """openpi observations never carry image maps to decompress: the string "jpeg" is only a string."""
    with _server() as (_, server), _connect(server, "") as ws:
        _metadata(ws)
        ws.send(msgpack_numpy.packb({"state": STATE, "prompt": "jpeg"}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=RECV_S))["actions"].shape == (20, 6)
    assert hand_offs == []


def test_a_reset_of_a_session_replaced_from_another_connection_is_refused_with_its_request() -> None:
    with _server() as (_, server), _connect(server) as old, _connect(server) as new:
        assert _ask(old, encode_message(SessionOpen(client_uuid="robot-7", state_dim=6))).accepted
        assert _ask(new, encode_message(SessionOpen(client_uuid="robot-7", state_dim=6))).accepted
        reset = encode_message(ResetMsg(header=MsgHeader(seq_id=21, episode_id=1)))
        assert _ask(old, reset) == ErrorMsg(
            code="unknown_session", message="no such session (never opened, closed, or replaced)", seq_id=21
        )


class _ThreadRecordingPolicy(ChunkPolicy):
    """Records the thread each model call runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def predict_action_chunks(self, requests: Any) -> list[np.ndarray]:
        self.threads.append(threading.current_thread())
        return super().predict_action_chunks(requests)


def test_openpi_requests_answered_inline_are_answered_and_refused_like_the_others() -> None:
    """A policy measured cheap (three calls on the engine thread under the bound) runs on the event
    loop itself: its answers and refusals on the openpi route are the same as on the thread."""
    policy = _ThreadRecordingPolicy()
    with _server(policy, inline_below_ms=60_000.0) as (service, server), _connect(server, "") as ws:
        _metadata(ws)
        answers = []
        for _ in range(5):
            ws.send(msgpack_numpy.packb({"state": STATE}))
            answers.append(msgpack_numpy.unpackb(ws.recv(timeout=RECV_S)))
        ws.send(msgpack_numpy.packb({"state": np.full(6, np.nan, np.float32)}))
        refusal = ws.recv(timeout=RECV_S)
        ws.send(msgpack_numpy.packb({"state": STATE}))
        answers.append(msgpack_numpy.unpackb(ws.recv(timeout=RECV_S)))
        assert len(service.sessions) == 1 and _active_sessions() == 1
    engine = {thread.name for thread in policy.threads[:3]}  # measured on the engine's one thread
    assert len(engine) == 1 and server.thread.name not in engine
    assert [thread.name for thread in policy.threads[3:]] == [server.thread.name] * 3  # then inline
    for answer in answers:
        np.testing.assert_array_equal(answer["actions"], answers[0]["actions"])
        assert answer["server_timing"]["batch_size"] == 1
    assert refusal.startswith("bad_field: ")
    _wait_until(lambda: len(service.sessions) == 0)
    assert _active_sessions() == 0  # released when the connection closed


def test_session_observations_answered_inline_are_answered_and_refused_like_the_others() -> None:
    policy = _ThreadRecordingPolicy()
    with _server(policy, inline_below_ms=60_000.0) as (_, server), _connect(server) as ws:
        assert _ask(ws, encode_message(SessionOpen(state_dim=6))).accepted
        chunks = [_ask(ws, _obs(seq_id)) for seq_id in range(1, 6)]
        assert _ask(ws, _obs(6, epoch=3)) == ErrorMsg(
            code="stale_epoch", message="session_epoch 3 is not the current 0", seq_id=6
        )
        chunks.append(_ask(ws, _obs(7)))
    assert [thread.name for thread in policy.threads[3:]] == [server.thread.name] * 3  # inline
    assert [chunk.header.seq_id for chunk in chunks] == [1, 2, 3, 4, 5, 7]
    for chunk in chunks:
        np.testing.assert_array_equal(chunk.chunk_robot, chunks[0].chunk_robot)
