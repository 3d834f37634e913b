"""The session-protocol websocket over a real uvicorn server: typed errors, concurrency, superseding."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from gated_policy import GatedPolicy
from websockets.sync.client import ClientConnection, connect

from rollserve.client import PolicyClient
from rollserve.client.policy_client import SessionRejected
from rollserve.models.simple_policies import ChunkPolicy
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
    SessionAck,
    SessionOpen,
    WireLimits,
    decode_message,
    encode_message,
    packb,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)


def _serve(policy: Any, **settings: Any) -> Any:
    settings.setdefault("max_batch_wait_ms", 0.0)
    config = ServerSettings(**settings)
    service = PolicyService(policy, config)
    return service, serving(create_app(config, policy=service))


@pytest.fixture
def small_frames() -> Iterator[tuple[PolicyService, RunningServer]]:
    service, server = _serve(ChunkPolicy(), limits=WireLimits(max_frame_bytes=64 * 1024))
    with server as running:
        yield service, running


def _raw(running: RunningServer) -> ClientConnection:
    return connect(running.ws_url + PATH, max_size=None, compression=None)


def _ask(ws: ClientConnection, frame: bytes | str) -> Any:
    ws.send(frame)
    return decode_message(ws.recv(timeout=10))


def _obs_frame(seq_id: int = 1, epoch: int = 0, **fields: Any) -> bytes:
    fields.setdefault("state", STATE)
    return encode_message(ObservationMsg(header=MsgHeader(seq_id=seq_id, session_epoch=epoch), **fields))


def _bad_tensor(dtype: str, shape: list[int], nbytes: int) -> dict[bytes, Any]:
    return {b"__ndarray__": True, b"data": b"\0" * nbytes, b"dtype": dtype, b"shape": shape}


def _header(seq_id: int) -> dict[str, int]:
    return {"schema_version": 1, "seq_id": seq_id, "episode_id": 0, "session_epoch": 0, "client_mono_ns": 0}


BAD_REQUESTS: list[tuple[str, Any, str, int | None]] = [
    ("garbage bytes", b"\xc1\xc1 not msgpack", "malformed_frame", None),
    ("text frame", "hello", "malformed_frame", None),
    ("not a map", packb([1, 2, 3]), "malformed_frame", None),
    ("unknown type", packb({"type": "teleport"}), "unknown_message", None),
    ("server-only message", encode_message(SessionAck(accepted=True)), "unexpected_message", None),
    ("wrong field type", packb({"type": "observation", "task": 5}), "bad_field", None),
    ("int state", _obs_frame(2, state=np.arange(6, dtype=np.int32)), "unsupported_dtype", 2),
    ("float64 state", _obs_frame(3, state=STATE.astype(np.float64)), "unsupported_dtype", 3),
    ("state dim mismatch", _obs_frame(4, state=np.zeros(5, np.float32)), "bad_shape", 4),
    ("3-D prefix", _obs_frame(5, prefix_model=np.zeros((1, 4, 6), np.float32)), "bad_shape", 5),
    ("1-D prefix", _obs_frame(6, prefix_model=np.zeros(6, np.float32)), "bad_shape", 6),
    (
        "complex tensor",
        packb({"type": "observation", "state": _bad_tensor("<c8", [6], 48)}),
        "unsupported_dtype",
        None,
    ),
    (
        "object tensor",
        packb({"type": "observation", "state": _bad_tensor("|O", [6], 48)}),
        "unsupported_dtype",
        None,
    ),
    (
        "lying shape",
        packb({"type": "observation", "state": _bad_tensor("<f4", [600], 24)}),
        "bad_shape",
        None,
    ),
    (
        "huge shape",
        packb({"type": "observation", "state": _bad_tensor("<f4", [10**9], 0)}),
        "too_many_elements",
        None,
    ),
    ("stale epoch", _obs_frame(7, epoch=5), "stale_epoch", 7),
    ("non-finite state", _obs_frame(8, state=np.full(6, np.nan, np.float32)), "bad_field", 8),
    (
        "bad header",
        packb({"type": "observation", "header": {**_header(9), "seq_id": "x"}}),
        "bad_field",
        None,
    ),
]


def test_bad_input_gets_typed_errors_while_another_client_is_served(
    small_frames: tuple[PolicyService, RunningServer],
) -> None:
    _, running = small_frames
    with _raw(running) as bad, PolicyClient(running.ws_url + PATH) as good:
        good.open_session(state_dim=6)
        first = _ask(bad, _obs_frame(1))  # no session yet on this connection
        assert isinstance(first, ErrorMsg) and first.code == "unknown_session" and first.seq_id == 1
        ack = _ask(bad, encode_message(SessionOpen(client_uuid="bad-robot")))
        assert isinstance(ack, SessionAck) and ack.accepted
        for name, frame, code, seq_id in BAD_REQUESTS:
            reply = _ask(bad, frame)
            assert isinstance(reply, ErrorMsg), name
            assert (reply.code, reply.seq_id) == (code, seq_id), name
            assert "Traceback" not in reply.message and 'File "' not in reply.message, name
            chunk = good.predict(STATE)
            assert chunk.chunk_robot.shape == (20, 6), f"good client not served after {name}"
        # The bad connection itself still works after all of that.
        reply = _ask(bad, _obs_frame(10))
        assert isinstance(reply, ActionChunkMsg) and reply.header.seq_id == 10
    metrics = httpx.get(running.http_url + "/metrics").text
    assert 'rollserve_errors_total{code="bad_shape",route="policy_ws"}' in metrics


def test_reset_close_and_reopen_over_the_wire(small_frames: tuple[PolicyService, RunningServer]) -> None:
    service, running = small_frames
    with PolicyClient(running.ws_url + PATH) as client:
        ack = client.open_session()
        assert client.predict(STATE).header.session_epoch == ack.session_epoch == 0
        reset = client.reset(episode_id=1)
        assert reset.session_epoch == 1 and client.session_epoch == 1
        assert client.predict(STATE, episode_id=1).header.session_epoch == 1
        assert len(service.sessions) == 1
    deadline = time.monotonic() + 5
    while len(service.sessions) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(service.sessions) == 0  # closing the connection released the session


def test_reopening_elsewhere_makes_the_old_connection_unknown(
    small_frames: tuple[PolicyService, RunningServer],
) -> None:
    _, running = small_frames
    with _raw(running) as old, _raw(running) as new:
        assert _ask(old, encode_message(SessionOpen(client_uuid="robot-7"))).accepted
        ack = _ask(new, encode_message(SessionOpen(client_uuid="robot-7")))
        assert ack.accepted and ack.session_epoch == 1
        reply = _ask(old, _obs_frame(1))
        assert isinstance(reply, ErrorMsg) and reply.code == "unknown_session"
        assert isinstance(_ask(new, _obs_frame(1, epoch=1)), ActionChunkMsg)


def _one_busy_then_three(policy: GatedPolicy, service: Any, robot: Any, http_url: str) -> None:
    """Robot r0's request holds the model; r1..r3 are accepted meanwhile; then the model is let go."""
    first = threading.Thread(target=robot, args=("r0",))
    first.start()
    assert policy.entered.wait(10)  # r0 occupies the model
    others = [threading.Thread(target=robot, args=(f"r{i}",)) for i in (1, 2, 3)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 10
    while service.worker.queue_depth < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.worker.queue_depth == 3  # accepted while the model is busy: not serialized
    assert httpx.get(http_url + "/healthz").status_code == 200  # event loop not blocked
    policy.release.set()
    for thread in [first, *others]:
        thread.join(10)


@pytest.mark.parametrize("batching", [True, False])
def test_concurrent_clients_overlap_and_batch(batching: bool) -> None:
    policy = GatedPolicy(supports_batching=batching)
    service, server = _serve(policy, max_batch_size=8)
    replies: dict[str, ActionChunkMsg] = {}
    spans: dict[str, tuple[float, float]] = {}

    def robot(name: str) -> None:
        with PolicyClient(server_url + PATH) as client:
            client.open_session()
            sent = time.monotonic()
            replies[name] = client.predict(STATE)
            spans[name] = (sent, time.monotonic())

    with server as running:
        server_url = running.ws_url
        _one_busy_then_three(policy, service, robot, running.http_url)
    assert sorted(replies) == ["r0", "r1", "r2", "r3"]
    # Every request was in flight while r0's was: their time spans overlap.
    assert all(spans[name][0] < spans["r0"][1] for name in ("r1", "r2", "r3"))
    later = [replies[name].batch_size for name in ("r1", "r2", "r3")]
    assert later == ([3, 3, 3] if batching else [1, 1, 1])
    assert policy.batch_sizes == ([1, 3] if batching else [1, 1, 1, 1])


def _engine_samples() -> dict[str, float]:
    values = {}
    for name in ("rollserve_batch_size", "rollserve_inference_seconds"):
        for part in ("_count", "_sum"):
            value = METRICS.registry.get_sample_value(name + part, {"kind": "policy"})
            values[name + part] = value or 0.0
    return values


def test_batch_size_and_inference_time_are_recorded_once_per_model_call() -> None:
    """``rollserve_batch_size`` ("Requests per model call") and ``rollserve_inference_seconds``
    ("Model time per batch") count model calls: r0 alone, then r1..r3 together, is 2 calls of
    4 requests in all (recorded per request, it was 4 observations summing to 1 + 3 * 3 = 10)."""
    policy = GatedPolicy(supports_batching=True)
    service, server = _serve(policy, max_batch_size=8)
    replies: dict[str, ActionChunkMsg] = {}

    def robot(name: str) -> None:
        with PolicyClient(server_url + PATH) as client:
            client.open_session()
            replies[name] = client.predict(STATE)

    before = _engine_samples()
    with server as running:
        server_url = running.ws_url
        _one_busy_then_three(policy, service, robot, running.http_url)
        after = _engine_samples()  # every reply is out: each batch was recorded before its replies
    assert sorted(replies) == ["r0", "r1", "r2", "r3"] and policy.batch_sizes == [1, 3]
    assert after["rollserve_batch_size_count"] - before["rollserve_batch_size_count"] == 2
    assert after["rollserve_batch_size_sum"] - before["rollserve_batch_size_sum"] == 4
    assert after["rollserve_inference_seconds_count"] - before["rollserve_inference_seconds_count"] == 2
    # the held first call alone took as long as r0 waited for the release: a lower bound only
    model_s = sum(end - start for start, end, _ in policy.call_spans)
    inference_s = after["rollserve_inference_seconds_sum"] - before["rollserve_inference_seconds_sum"]
    assert inference_s >= model_s


def test_stale_observations_are_superseded_and_reported() -> None:
    policy = GatedPolicy()
    service, server = _serve(policy)
    with (
        server as running,
        PolicyClient(running.ws_url + PATH) as blocker,
        PolicyClient(running.ws_url + PATH) as robot,
    ):
        blocker.open_session()
        robot.open_session()
        blocker.send_observation(ObservationMsg(state=STATE, header=blocker.next_header()))
        assert policy.entered.wait(10)
        for _ in range(3):  # pipelined: the robot does not wait for replies
            robot.send_observation(ObservationMsg(state=STATE, header=robot.next_header()))
        deadline = time.monotonic() + 10
        while service.worker.stats.superseded < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        policy.release.set()
        reply = robot.receive(timeout=10)
        assert isinstance(reply, ActionChunkMsg)
        assert reply.header.seq_id == 3 and reply.superseded_seq_ids == [1, 2]
        assert isinstance(blocker.receive(timeout=10), ActionChunkMsg)


def test_a_failing_make_processors_reaches_the_robot_as_a_refused_session() -> None:
    """Regression: the exception escaped the route and the robot saw only a dropped connection."""
    policy = ChunkPolicy()

    def broken() -> Any:
        raise ValueError("bad stats file")

    policy.make_processors = broken  # type: ignore[method-assign]
    _, server = _serve(policy)
    with server as running, PolicyClient(running.ws_url + PATH) as client:
        with pytest.raises(SessionRejected) as info:
            client.open_session(state_dim=6)
        assert info.value.ack.reason == "the policy's make_processors() failed: ValueError: bad stats file"
        # The connection is still usable: the robot can retry on it.
        with pytest.raises(SessionRejected):
            client.open_session(state_dim=6)
