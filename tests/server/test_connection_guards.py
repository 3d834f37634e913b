"""Slowloris and log floods (issue 8, M3): a header-read deadline and size cap on every HTTP
connection, idle keep-alive connections closed, and repeated log lines rate-limited."""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from rollserve.server.app import create_app
from rollserve.server.log_guard import RateLimitFilter
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    settings = ServerSettings(header_timeout_s=0.5, max_header_bytes=4096, keep_alive_timeout_s=1.0)
    with serving(create_app(settings)) as server:
        yield server


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False


def test_a_connection_holding_half_a_header_is_closed(running: RunningServer) -> None:
    socks = [socket.create_connection((running.host, running.port)) for _ in range(20)]
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    assert all(_closed_by_server(sock, 10.0) for sock in socks)
    assert time.monotonic() - started < 9.0
    for sock in socks:
        sock.close()
    assert httpx.get(running.http_url + "/healthz").status_code == 200


def test_header_deadlines_are_spread_and_never_early(running: RunningServer) -> None:
    # connections opened together must not all close (and, from a slowloris, come back) together:
    # each deadline falls between 1x and 1.5x the configured 0.5 s, never before it
    opened: dict[socket.socket, float] = {}
    for _ in range(20):
        sock = socket.create_connection((running.host, running.port))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        opened[sock] = time.monotonic()
    held: dict[socket.socket, float] = {}
    give_up = time.monotonic() + 10.0
    while len(held) < len(opened) and time.monotonic() < give_up:
        readable, _, _ = select.select([s for s in opened if s not in held], [], [], 0.5)
        for sock in readable:
            if sock.recv(4096) == b"":
                held[sock] = time.monotonic() - opened[sock]
    for sock in opened:
        sock.close()
    assert len(held) == len(opened)
    assert min(held.values()) >= 0.5
    assert max(held.values()) - min(held.values()) >= 0.1  # 20 draws over a 0.25 s window


def test_a_connection_that_never_sends_is_closed(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        assert _closed_by_server(sock, 10.0)


def test_trickled_headers_do_not_reset_the_deadline(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # one header byte every 0.1 s: 4 s of trickle, the deadline is 0.5 s
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        assert closed or _closed_by_server(sock, 1.0)


def test_oversized_headers_get_431(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 8000)
        sock.settimeout(5.0)
        assert sock.recv(4096).startswith(b"HTTP/1.1 431")


def test_requests_and_keep_alive_still_work(running: RunningServer) -> None:
    with httpx.Client(base_url=running.http_url) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(0.6)  # longer than the header deadline, shorter than keep-alive: reused


def test_repeated_log_lines_are_rate_limited() -> None:
    limiter = RateLimitFilter(burst=5, window_s=60.0)
    logger = logging.getLogger("rollserve.test.flood")
    args = (logger.name, logging.ERROR, __file__, 1, "accept failed: %s", ("EMFILE",), None)
    records = [logger.makeRecord(*args) for _ in range(10_000)]
    passed = [record for record in records if limiter.filter(record)]
    assert len(passed) == 5 and limiter.dropped == 9_995
    other = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "something else", (), None)
    assert limiter.filter(other)


def test_the_next_window_says_how_many_were_suppressed() -> None:
    now = [0.0]
    limiter = RateLimitFilter(burst=1, window_s=1.0)
    limiter_clock = pytest.MonkeyPatch()
    limiter_clock.setattr("rollserve.server.log_guard.time.monotonic", lambda: now[0])
    try:
        logger = logging.getLogger("rollserve.test.flood")

        def record() -> logging.LogRecord:
            return logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "boom", (), None)

        assert limiter.filter(record())
        assert not any(limiter.filter(record()) for _ in range(99))
        now[0] = 2.0
        summary = record()
        assert limiter.filter(summary)
        assert "[99 similar messages suppressed]" in summary.getMessage()
    finally:
        limiter_clock.undo()
