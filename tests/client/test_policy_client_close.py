"""PolicyClient.close() against a server that stopped answering (a frozen host, a dead link): the
close handshake is bounded by the client's own timeout, and after a reply timeout the socket is
dropped without one. A TCP proxy in front of a real server stands for the dead link."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from tcp_proxies import FreezableProxy

from rollserve.client import PolicyClient
from rollserve.server.running import RunningServer

STATE = np.zeros(6, np.float32)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serving_chunk_policy() as running:
        yield running


@pytest.fixture
def proxy(server: RunningServer) -> Iterator[FreezableProxy]:
    proxy = FreezableProxy((server.host, server.port))
    yield proxy
    proxy.close()


def _client(proxy: FreezableProxy, timeout: float) -> PolicyClient:
    client = PolicyClient(f"ws://127.0.0.1:{proxy.port}/v1/policy/ws", timeout=timeout)
    client.connect()
    client.open_session(state_dim=6)
    assert client.predict(STATE).chunk_robot.shape == (20, 6)
    return client


@pytest.mark.parametrize(("timeout", "close_wait"), [(30.0, 1.0), (0.25, 0.25)])
def test_the_close_handshake_waits_at_most_the_timeout_and_never_over_a_second(
    server: RunningServer, timeout: float, close_wait: float
) -> None:
    """Regression: websockets' default close_timeout (10 s) applied, so close() and an engine's
    stop(timeout=1.0) took 10 s against a frozen server, whatever the client's timeout."""
    client = PolicyClient(server.ws_url + "/v1/policy/ws", timeout=timeout)
    client.connect()
    try:
        assert client._ws is not None and client._ws.close_timeout == close_wait
    finally:
        client.close()


def test_a_healthy_connection_is_closed_with_the_handshake(proxy: FreezableProxy) -> None:
    """The control for the test below: a close the proxy swallows is seen, bytes and all."""
    client = _client(proxy, timeout=5.0)
    proxy.frozen.set()
    client.close()  # the server cannot answer: waits out the (bounded) close handshake
    assert proxy.client_closed.wait(10)
    assert proxy.sent_while_frozen > 0  # the session's close message and the close frame


def test_after_a_reply_timeout_close_drops_the_socket_without_a_handshake(proxy: FreezableProxy) -> None:
    """Regression: close() after a reply timeout sent the session close and the close frame into
    the dead link and waited for an answer that could not come (10 s in an engine's recovery)."""
    client = _client(proxy, timeout=0.3)
    proxy.frozen.set()
    with pytest.raises(TimeoutError):
        client.predict(STATE)
    sent = proxy.sent_while_frozen  # the observation that got no reply
    assert sent > 0
    client.close()
    assert not client.connected
    assert proxy.client_closed.wait(10)
    assert proxy.sent_while_frozen == sent  # nothing more: no close message, no close frame
