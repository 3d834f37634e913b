"""The remote engine against a real server when opening a session fails: at start (nothing may leak)
and while recovering (the failure must be visible, and recovery goes on)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, PolicyClient, RemoteInferenceEngine, SessionRejected
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, start_in_thread
from rollserve.server.settings import ServerSettings

OBS = {"state": np.zeros(6, np.float32)}
CAP = 2  # policy websockets per client address in these tests


def _serve(policy: ChunkPolicy, port: int = 0) -> tuple[PolicyService, RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0, max_connections_per_client=CAP)
    service = PolicyService(policy, settings)
    return service, start_in_thread(create_app(settings, policy=service), port=port)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    service, running = _serve(ChunkPolicy())
    yield running
    running.stop()
    service.close()


def _url(running: RunningServer) -> str:
    return running.ws_url + "/v1/policy/ws"


def _client_threads() -> int:
    """The threads of open client websockets (the server side runs on asyncio, without threads)."""
    return sum(
        t.is_alive() and t.name.endswith(("(recv_events)", "(keepalive)")) for t in threading.enumerate()
    )


def _sockets() -> int:
    """Open sockets of this process, both ends of each loopback connection included."""
    fds = os.listdir("/proc/self/fd")
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in fds if _exists(fd))


def _exists(fd: str) -> bool:
    return os.path.exists(f"/proc/self/fd/{fd}")


def _no_ack_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    def timeout(*args: Any, **kwargs: Any) -> Any:
        raise TimeoutError("no reply within the timeout")

    monkeypatch.setattr(PolicyClient, "_wait_for", timeout)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts sockets through /proc")
@pytest.mark.parametrize("failure", ["refused", "no-ack"])
def test_failed_starts_leak_nothing_and_never_lock_the_robot_out(
    server: RunningServer, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a start() whose session failed to open kept its websocket, its two threads and
    one of the address's server slots; after ``max_connections_per_client`` of them nothing connected."""
    threads, sockets = _client_threads(), _sockets()
    expected: type[Exception] = SessionRejected
    with monkeypatch.context() as patch:
        if failure == "no-ack":
            _no_ack_in_time(patch)
            expected = TimeoutError
        for _ in range(CAP + 3):
            engine = RemoteInferenceEngine(_url(server), EngineConfig(), state_dim=7)
            with pytest.raises(expected):
                engine.start()
            assert not engine.client.connected
            wait_until(lambda: _sockets() <= sockets)  # both ends are closed: the server slot is free
        # a closed websocket's threads end just after its socket: waited for, not read at once
        wait_until(lambda: _client_threads() <= threads)
    engine = RemoteInferenceEngine(_url(server), EngineConfig(), state_dim=6).start()
    try:
        engine.update_observation(OBS)
        wait_until(lambda: engine.stats.chunks_merged >= 1)
    finally:
        engine.stop()
    wait_until(lambda: _client_threads() <= threads)


def test_connecting_a_connected_client_closes_the_first_connection(server: RunningServer) -> None:
    threads = _client_threads()
    client = PolicyClient(_url(server))
    client.connect()
    client.connect()
    try:
        wait_until(lambda: _client_threads() == threads + 2)  # one connection: recv_events + keepalive
        assert client.open_session(state_dim=6).accepted
    finally:
        client.close()
    wait_until(lambda: _client_threads() == threads)


def test_a_refused_recovery_is_visible_and_retried_until_the_server_accepts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: a server restarted with another policy refused the session forever while
    ``last_error`` kept the old connection error and ``errors`` stayed 0."""
    service, running = _serve(ChunkPolicy())
    config = EngineConfig(fps=100.0, backoff_initial_s=0.02, backoff_max_s=0.05)
    engine = RemoteInferenceEngine(_url(running), config, state_dim=6)
    stop_robot = threading.Event()

    def robot() -> None:
        while not stop_robot.is_set():
            engine.act(OBS)
            time.sleep(0.005)

    engine.start()
    driver = threading.Thread(target=robot)
    driver.start()
    try:
        wait_until(lambda: engine.stats.chunks_merged >= 1)
        running.stop()
        service.close()
        with caplog.at_level("ERROR", logger="rollserve.client.inference_loop"):
            service, running = _serve(ChunkPolicy(state_dim=7), port=running.port)  # refuses state_dim 6
            wait_until(lambda: isinstance(engine.last_error, SessionRejected))
            errors = engine.stats.errors
            wait_until(lambda: engine.stats.errors >= errors + 2)  # still trying; each refusal counts
        assert "state_dim 6 does not match" in str(engine.last_error)
        assert engine.latency_stats()["errors"] >= errors + 2 and engine.stats.reconnects == 0
        assert any("session refused" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)

        running.stop()  # the operator puts the right policy back: the robot resumes on its own
        service.close()
        service, running = _serve(ChunkPolicy(), port=running.port)
        wait_until(lambda: engine.stats.reconnects >= 1)
        merged = engine.stats.chunks_merged
        wait_until(lambda: engine.stats.chunks_merged > merged)
    finally:
        stop_robot.set()
        driver.join(5)
        engine.stop()
        running.stop()
        service.close()
