"""The delay proxy really delays, each way, and passes bytes intact and in order.

Only lower bounds on time are asserted (a busy machine can only make things slower).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from rollserve.demo.netdelay import DelayProxy

ROUND_TRIP_MS = 80.0


class EchoServer:
    """A thread that echoes every byte back and notes when each piece arrived."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.arrivals: list[tuple[float, bytes]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            while data := conn.recv(65536):
                self.arrivals.append((time.monotonic(), data))
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def link() -> Iterator[tuple[EchoServer, DelayProxy, socket.socket]]:
    echo = EchoServer()
    proxy = DelayProxy("127.0.0.1", echo.port, ROUND_TRIP_MS).start()
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        yield echo, proxy, client
    finally:
        client.close()
        proxy.stop()
        echo.close()


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = sock.recv(size - len(data))
        assert piece, "connection closed early"
        data += piece
    return data


def test_each_round_trip_takes_at_least_the_injected_delay(link) -> None:  # type: ignore[no-untyped-def]
    echo, _, client = link
    for index in range(3):
        message = f"ping {index}".encode()
        sent = time.monotonic()
        client.sendall(message)
        assert receive_exactly(client, len(message)) == message
        returned = time.monotonic()
        arrived = echo.arrivals[-1][0]
        assert arrived - sent >= ROUND_TRIP_MS / 2000.0  # one way in
        assert returned - arrived >= ROUND_TRIP_MS / 2000.0  # one way back
        assert returned - sent >= ROUND_TRIP_MS / 1000.0


def test_bytes_arrive_intact_and_in_order(link) -> None:  # type: ignore[no-untyped-def]
    _, proxy, client = link
    pieces = [bytes([i % 251]) * (1 + 997 * i) for i in range(40)]  # up to ~39 kB each, sent back to back
    payload = b"".join(pieces)
    sender = threading.Thread(target=lambda: [client.sendall(p) for p in pieces])
    sender.start()
    assert receive_exactly(client, len(payload)) == payload
    sender.join()
    assert proxy.bytes_forwarded == 2 * len(payload)


def test_end_of_stream_passes_through_after_the_data(link) -> None:  # type: ignore[no-untyped-def]
    _, _, client = link
    client.sendall(b"last words")
    client.shutdown(socket.SHUT_WR)
    assert receive_exactly(client, 10) == b"last words"
    assert client.recv(10) == b""  # the echo server saw our EOF, closed, and that reached us


def test_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError):
        DelayProxy("127.0.0.1", 1, -1.0)
