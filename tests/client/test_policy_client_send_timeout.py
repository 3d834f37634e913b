"""A send to a server that stopped reading (a frozen process, a host gone without a RST) is bounded by
the client's timeout: once the socket buffers are full, ``sendall`` would block until TCP gives up
(minutes), hanging the robot's inference thread with ``healthy`` still True. A TCP proxy in front of
a real server stands for the frozen server: once stalled it reads nothing more from its connections."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from tcp_proxies import StallingProxy
from waiting import wait_until

from rollserve.client import EngineConfig, PolicyClient, PolicyConnectionError, RemoteInferenceEngine
from rollserve.server.running import RunningServer
from rollserve.wire import ObservationMsg

TIMEOUT_S = 1.0  # the client's timeout in these tests
RETURN_BOUND_S = 10.0  # a bounded send returns well within this; an unbounded one blocks for minutes
STATE = np.zeros(6, np.float32)
# Two raw 224x224 cameras: about 300 kB a message, as on a real robot.
CAMERAS = {"top": np.zeros((224, 224, 3), np.uint8), "wrist": np.zeros((224, 224, 3), np.uint8)}
SENT_MESSAGE_TIMEOUT = "took longer than the timeout"


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serving_chunk_policy() as running:
        yield running


@pytest.fixture
def proxy(server: RunningServer) -> Iterator[StallingProxy]:
    proxy = StallingProxy((server.host, server.port))
    yield proxy
    proxy.close()


def _url(proxy: StallingProxy) -> str:
    return f"ws://127.0.0.1:{proxy.port}/v1/policy/ws"


def _send_until_it_fails(client: PolicyClient, most: int) -> BaseException | None:
    """Pipelined observations (no reply awaited) until a send raises; None if all ``most`` went."""
    try:
        for _ in range(most):
            header = client.next_header()
            client.send_observation(ObservationMsg(state=STATE, images=CAMERAS, header=header))
    except Exception as exc:
        return exc
    return None


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``call`` in a daemon thread: a send that blocks must not hang the test itself."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    return thread, result


def test_a_send_the_server_stops_reading_fails_within_the_timeout_and_the_client_reconnects(
    proxy: StallingProxy,
) -> None:
    """Regression: the send blocked in ``sendall`` far past the timeout (until TCP gave up)."""
    client = PolicyClient(_url(proxy), timeout=TIMEOUT_S)
    client.connect()
    client.open_session(state_dim=6)
    assert client.predict(STATE, CAMERAS).chunk_robot.shape == (20, 6)
    proxy.stall()
    most = 400  # 120 MB: far more than any socket buffers hold
    thread, result = _in_thread(lambda: _send_until_it_fails(client, most))
    thread.join(RETURN_BOUND_S)
    assert not thread.is_alive(), "the send blocked past the client's timeout"
    (error,) = result
    assert isinstance(error, PolicyConnectionError), error
    assert SENT_MESSAGE_TIMEOUT in str(error) and "1 s" in str(error)

    proxy.resume()
    client.connect()  # the frozen connection is dropped; a new one is served normally
    client.open_session(state_dim=6)
    assert client.predict(STATE, CAMERAS).chunk_robot.shape == (20, 6)
    closer, _ = _in_thread(client.close)
    closer.join(RETURN_BOUND_S)
    assert not closer.is_alive()


def test_close_returns_when_the_socket_buffers_are_full(proxy: StallingProxy) -> None:
    """Regression: the session's goodbye in ``close()`` is a send too; with the buffers full (the
    observations before it all went into them) it blocked, and so did an engine's ``stop()``."""
    client = PolicyClient(_url(proxy), timeout=TIMEOUT_S)
    client.connect()
    client.open_session(state_dim=6)
    proxy.stall()
    assert client._ws is not None
    _fill_send_buffer(client._ws.socket)  # stands for pipelined observations that filled it
    closer, _ = _in_thread(client.close)
    closer.join(RETURN_BOUND_S)
    assert not closer.is_alive(), "close() blocked on a server that stopped reading"
    assert not client.connected


def _fill_send_buffer(sock: socket.socket) -> None:
    """Queue bytes without blocking until the kernel takes no more (nobody reads them: stalled)."""
    chunk = bytes(65536)
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.send(chunk, socket.MSG_DONTWAIT)


def _wmem_max() -> int:
    """The most a socket's send buffer grows to (Linux); 4 MiB, Linux's default, elsewhere."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return 4 * 1024 * 1024


def test_the_engine_turns_unhealthy_on_a_stalled_send_and_reconnects(proxy: StallingProxy) -> None:
    """Regression: the engine's thread hung in the send; ``healthy`` stayed True, no reconnect."""
    rows = (2 * _wmem_max() + (1 << 20)) // (1024 * 3) + 1  # one observation outgrows the buffers
    big = {"top": np.zeros((rows, 1024, 3), np.uint8)}
    engine = RemoteInferenceEngine(_url(proxy), EngineConfig(fps=50.0), state_dim=6, timeout=TIMEOUT_S)
    stop_robot = threading.Event()

    def robot() -> None:  # the control loop, on the fallback while nothing arrives
        while not stop_robot.wait(0.02):
            engine.act({"state": STATE, "images": big})

    driver = threading.Thread(target=robot)
    engine.start()
    driver.start()
    try:
        wait_until(lambda: engine.stats.chunks_merged >= 1)
        proxy.stall()
        wait_until(lambda: SENT_MESSAGE_TIMEOUT in str(engine.last_error), timeout=RETURN_BOUND_S)
        assert isinstance(engine.last_error, PolicyConnectionError) and not engine.healthy
        merged = engine.stats.chunks_merged
        proxy.resume()  # the reconnect waiting in the proxy's backlog goes through
        wait_until(lambda: engine.healthy and engine.stats.chunks_merged > merged)
        assert engine.stats.reconnects >= 1
    finally:
        stop_robot.set()
        driver.join(5)
        engine.stop()
