"""``infer(obs, timeout=...)`` bounds the whole call, the send included, not only the wait for the
reply: against a server that stopped reading, the send blocked for the client-wide ``timeout``
(30 s by default) whatever the call was given. A TCP proxy in front of a real server stands for the
frozen server; one observation larger than the socket buffers fills them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from tcp_proxies import StallingProxy

from rollserve.client import PolicyClient, PolicyConnectionError
from rollserve.wire import ObservationMsg

CLIENT_TIMEOUT_S = 30.0  # the client-wide timeout: the default, far above the call's
CALL_TIMEOUT_S = 0.5
HANG_GUARD_S = 10.0  # not a speed check: a call bounded by the client-wide timeout is still blocked then
STATE = np.zeros(6, np.float32)


@pytest.fixture
def proxy() -> Iterator[StallingProxy]:
    with serving_chunk_policy() as server:
        proxy = StallingProxy((server.host, server.port))
        yield proxy
        proxy.close()


def _wmem_max() -> int:
    """The most a socket's send buffer grows to (Linux); 4 MiB, Linux's default, elsewhere."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return 4 * 1024 * 1024


def _outgrowing_buffers() -> dict[str, np.ndarray]:
    rows = (2 * _wmem_max() + (1 << 20)) // (1024 * 3) + 1
    return {"top": np.zeros((rows, 1024, 3), np.uint8)}


def _connected(proxy: StallingProxy) -> PolicyClient:
    client = PolicyClient(f"ws://127.0.0.1:{proxy.port}/v1/policy/ws", timeout=CLIENT_TIMEOUT_S)
    client.connect()
    client.open_session(state_dim=6)
    assert client.predict(STATE).chunk_robot.shape == (20, 6)
    return client


def test_infer_with_a_timeout_bounds_its_send_to_a_server_that_stopped_reading(proxy: StallingProxy) -> None:
    """Regression: the send waited for the client's 30 s timeout, not the call's 0.5 s."""
    client = _connected(proxy)
    proxy.stall()
    obs = ObservationMsg(state=STATE, images=_outgrowing_buffers(), header=client.next_header())
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.infer(obs, timeout=CALL_TIMEOUT_S)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "infer(timeout=0.5) still blocked in its send"
    (error,) = errors
    assert isinstance(error, TimeoutError), repr(error)
    # The send was cut off mid-message: the connection is gone, and it says so (the engines reconnect).
    assert isinstance(error, PolicyConnectionError) and "0.5 s" in str(error), str(error)
    with pytest.raises(PolicyConnectionError):
        client.infer(ObservationMsg(state=STATE, header=client.next_header()), timeout=CALL_TIMEOUT_S)
    client.close()
    assert not client.connected


def test_infer_with_a_timeout_still_waits_for_a_reply_within_it(proxy: StallingProxy) -> None:
    """The reply's wait keeps its bound: a small observation goes, no reply comes, TimeoutError; the
    connection stays usable for a later call once the server answers again (not here: it is frozen)."""
    client = _connected(proxy)
    proxy.stall()
    with pytest.raises(TimeoutError) as info:
        client.infer(ObservationMsg(state=STATE, header=client.next_header()), timeout=CALL_TIMEOUT_S)
    assert not isinstance(info.value, PolicyConnectionError)  # nothing broke: only no reply yet
    assert client.connected
    client.close()


def test_open_session_and_reset_bound_send_and_reply_by_one_deadline() -> None:
    """Regression: the send had its own ``timeout`` and the wait for the ack a fresh one after it, so
    a slow send could stretch the call to twice the timeout. Both now share the deadline set at the
    call's start (spied on the real calls against a real server)."""
    with serving_chunk_policy() as server:
        client = PolicyClient(f"ws://{server.host}:{server.port}/v1/policy/ws", timeout=CLIENT_TIMEOUT_S)
        client.connect()
        sent, waited = [], []
        send, wait_for = client._send, client._wait_for

        def spy_send(msg: object, deadline: float | None = None, limit: float | None = None) -> None:
            sent.append(deadline)
            send(msg, deadline, limit)  # type: ignore[arg-type]

        def spy_wait(wanted: object, seq_id: int | None, deadline: float) -> object:
            waited.append(deadline)
            return wait_for(wanted, seq_id, deadline)

        client._send, client._wait_for = spy_send, spy_wait  # type: ignore[method-assign]
        before = time.monotonic()
        client.open_session(state_dim=6)
        client.reset(episode_id=1)
        after = time.monotonic()
        client.close()
    assert len(sent) == len(waited) == 2
    assert sent == waited, "each call's send and wait must share one deadline"
    assert all(before + CLIENT_TIMEOUT_S <= d <= after + CLIENT_TIMEOUT_S for d in sent)
