"""Hostile policy clients over a real server (issue 8): non-finite numbers, huge delays and
prefixes, NaN model output, oversized messages cut off while they stream."""

from __future__ import annotations

import asyncio
import contextlib
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
from rollserve.server.metrics import METRICS
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionOpen,
    WireLimits,
    decode_message,
    encode_message,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)


class NaNPolicy(ChunkPolicy):
    """Returns NaN actions whenever asked with a delay of 7 steps (a model gone wrong)."""

    def predict_action_chunks(self, requests: Any) -> list[np.ndarray]:
        out = super().predict_action_chunks(requests)
        return [
            np.full_like(c, np.nan) if r.inference_delay == 7 else c
            for c, r in zip(out, requests, strict=True)
        ]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0, limits=WireLimits(max_frame_bytes=256 * 1024))
    service = PolicyService(NaNPolicy(), settings)
    with serving(create_app(settings, policy=service)) as server:
        yield server


@contextlib.contextmanager
def _session(server: RunningServer) -> Iterator[ClientConnection]:
    with connect(server.ws_url + PATH, max_size=None, compression=None) as ws:
        ws.send(encode_message(SessionOpen(state_dim=6)))  # a fresh client uuid: epoch 0
        assert decode_message(ws.recv(timeout=10)).accepted
        yield ws


def _observe(ws: ClientConnection, seq_id: int, **fields: Any) -> Any:
    fields.setdefault("state", STATE)
    ws.send(encode_message(ObservationMsg(header=MsgHeader(seq_id=seq_id), **fields)))
    return decode_message(ws.recv(timeout=10))


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"state": np.array([np.nan, 0, 0, 0, 0, 0], np.float32)}, "bad_field"),
        ({"state": np.array([np.inf, 0, 0, 0, 0, 0], np.float32)}, "bad_field"),
        ({"prefix_model": np.full((4, 6), np.inf, np.float32)}, "bad_field"),
        ({"prefix_robot": np.full((4, 6), np.nan, np.float32)}, "bad_field"),
        ({"inference_delay_steps": 2**62}, "bad_field"),
        ({"inference_delay_steps": 21}, "bad_field"),
        ({"prefix_model": np.zeros((10_000, 6), np.float32)}, "bad_shape"),
        ({"inference_delay_steps": 7}, "inference_error"),
    ],
    ids=["nan-state", "inf-state", "inf-prefix", "nan-prefix-robot", "delay-2^62", "delay>chunk",
         "huge-prefix", "nan-output"],
)  # fmt: skip
def test_session_protocol_refuses_non_finite_and_oversized_requests(
    running: RunningServer, fields: dict[str, Any], code: str
) -> None:
    with _session(running) as ws:
        reply = _observe(ws, 1, **fields)
        assert isinstance(reply, ErrorMsg) and reply.code == code, reply
        assert reply.seq_id == 1
        ok = _observe(ws, 2, inference_delay_steps=20, prefix_model=np.zeros((20, 6), np.float32))
        assert isinstance(ok, ActionChunkMsg) and np.isfinite(ok.chunk_robot).all()


@pytest.mark.parametrize("state", [[np.nan] * 6, [np.inf] * 6, [1e308] * 6])
def test_openpi_endpoint_refuses_non_finite_states(running: RunningServer, state: list[float]) -> None:
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))
        ws.send(msgpack_numpy.packb({"state": np.array(state, np.float64)}))
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and reply.startswith("bad_field"), reply
        ws.send(msgpack_numpy.packb({"state": STATE}))
        assert np.isfinite(msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"]).all()


def test_a_message_above_the_frame_limit_is_cut_off_while_it_streams(running: RunningServer) -> None:
    closed_mid_message = []

    def fragments(ws: ClientConnection) -> Iterator[bytes]:
        # 256 KiB + 1 byte (the limit is 256 KiB), then wait: the server must close before the
        # message ends. Every byte sent is read by the server, so its close frame is never lost to
        # a reset (before the server drained after its close, a larger overshoot raced the close
        # against unread data).
        yield from [b"\0" * (64 * 1024)] * 4 + [b"\0"]
        deadline = time.monotonic() + 10
        while ws.protocol.close_rcvd is None and time.monotonic() < deadline:
            time.sleep(0.01)
        closed_mid_message.append(ws.protocol.close_rcvd is not None)
        yield b"\0"

    with _session(running) as ws:
        with pytest.raises(ConnectionClosed) as info:
            ws.send(fragments(ws))
            ws.recv(timeout=10)
        assert closed_mid_message == [True]
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    with _session(running) as ws:  # and the server keeps serving
        assert isinstance(_observe(ws, 1), ActionChunkMsg)


@contextlib.contextmanager
def _small_server(**settings: Any) -> Iterator[tuple[PolicyService, RunningServer]]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    service = PolicyService(ChunkPolicy(), config)
    with serving(create_app(config, policy=service)) as server:
        yield service, server


def test_openpi_clients_that_never_ask_hold_no_session() -> None:
    with _small_server(max_policy_sessions=2) as (service, server), contextlib.ExitStack() as stack:
        quiet = [stack.enter_context(connect(server.ws_url, compression=None)) for _ in range(3)]
        for ws in quiet:
            msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata: connected, nothing asked
        assert len(service.sessions) == 0
        with _session(server) as ws:  # a robot still gets a session
            assert isinstance(_observe(ws, 1), ActionChunkMsg)
        quiet[0].send(msgpack_numpy.packb({"state": STATE}))  # asking opens one
        assert msgpack_numpy.unpackb(quiet[0].recv(timeout=10))["actions"].shape == (20, 6)
        assert len(service.sessions) == 1


def test_idle_connections_are_closed_and_release_their_session() -> None:
    with _small_server(policy_idle_timeout_s=0.5) as (service, server):
        with _session(server) as ws:
            assert isinstance(_observe(ws, 1), ActionChunkMsg)
            assert len(service.sessions) == 1
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=10)  # the client answers pings but sends nothing
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        with connect(server.ws_url, max_size=None, compression=None) as ws:
            msgpack_numpy.unpackb(ws.recv(timeout=10))
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
        assert len(service.sessions) == 0


def _refusals() -> dict[str, float]:
    """``unavailable`` answers counted so far, by route."""
    return {
        route: METRICS.registry.get_sample_value(
            "rollserve_errors_total", {"route": route, "code": "unavailable"}
        )
        or 0.0
        for route in ("policy_ws", "openpi")
    }


def _assert_refused(server: RunningServer, path: str, message: str) -> None:
    with connect(server.ws_url + path, max_size=None, compression=None) as ws:
        frame = ws.recv(timeout=10)
        if path:  # the session protocol: its binary error message
            assert decode_message(frame) == ErrorMsg(code="unavailable", message=message, retryable=True)
        else:  # openpi's route: a text frame, as openpi clients read errors
            assert frame == f"unavailable: {message}"
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1013


def test_one_address_may_hold_only_its_share_of_connections() -> None:
    with _small_server(max_connections_per_client=2) as (_, server):
        before = _refusals()
        with _session(server) as first, _session(server):
            for path in (PATH, ""):
                _assert_refused(server, path, "2 connections from one address is the limit")
            assert isinstance(_observe(first, 1), ActionChunkMsg)
        # each refusal is counted under the route it came on
        assert _refusals() == {"policy_ws": before["policy_ws"] + 1, "openpi": before["openpi"] + 1}
        with _session(server) as again:  # released when they closed
            assert isinstance(_observe(again, 1), ActionChunkMsg)


def _wait_for_open(slots: Any, count: int) -> None:
    """Until the server released the slots of the connections the client closed."""
    deadline = time.monotonic() + 10
    while slots.open_connections != count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slots.open_connections == count


def test_the_server_holds_at_most_max_connections_policy_websockets() -> None:
    """``--max-connections`` counts policy websockets too (uvicorn's own cap skips upgrades): the
    third of two gets ``unavailable`` and close 1013 on either route, whatever the address cap."""
    config = ServerSettings(max_batch_wait_ms=0.0, max_connections=2, max_connections_per_client=32)
    app = create_app(config, policy=PolicyService(ChunkPolicy(), config))
    slots = app.state.policy_connections
    with serving(app) as server, _session(server) as first:
        before = _refusals()
        with connect(server.ws_url, max_size=None, compression=None) as second:
            msgpack_numpy.unpackb(second.recv(timeout=10))  # metadata: the openpi socket is open
            for path in (PATH, ""):
                _assert_refused(server, path, "server is at its limit of 2 policy connections")
            assert slots.open_connections == 2  # refused ones hold no slot
        assert _refusals() == {"policy_ws": before["policy_ws"] + 1, "openpi": before["openpi"] + 1}
        for path in (PATH, ""):  # one closed: the next is admitted, on either route
            _wait_for_open(slots, 1)
            if path:
                with _session(server) as again:
                    assert isinstance(_observe(again, 1), ActionChunkMsg)
            else:
                with connect(server.ws_url, max_size=None, compression=None) as again:
                    msgpack_numpy.unpackb(again.recv(timeout=10))
                    again.send(msgpack_numpy.packb({"state": STATE}))
                    assert msgpack_numpy.unpackb(again.recv(timeout=10))["actions"].shape == (20, 6)
        assert isinstance(_observe(first, 1), ActionChunkMsg)
        _wait_for_open(slots, 1)


def test_observations_with_raw_cameras_are_decoded_on_the_loop_and_floods_on_a_thread(
    running: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[object] = []
    real = asyncio.to_thread

    async def counting(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    cameras = {"cam0": np.zeros((160, 160, 3), np.uint8), "cam1": np.zeros((160, 160, 3), np.uint8)}
    many_maps = msgpack_numpy.packb({"pad": "x" * 70_000, "maps": [{}] * 4000})  # 74 kB, 4001 maps
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))
        ws.send(msgpack_numpy.packb({"state": STATE, "images": cameras}))  # 154 kB of plain msgpack
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (20, 6)
        assert hops == []  # no hand-off for a real observation
        ws.send(many_maps)  # within the full budget, over the inline one
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str) and reply.startswith("bad_observation"), reply
        assert len(hops) == 1  # decoded again, with the full budget, off the loop
