"""The header cap holds however the headers arrive (a reviewer's finding): a whole oversized
header block in one read used to be served, because bytes were only counted while the headers were
still incomplete. Counted now: the URL plus every header name and value, as parsed; above the cap
the answer is 431 and the connection closes, and no route runs."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fastapi import Request
from fastapi.responses import PlainTextResponse

from rollserve.server.app import create_app
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

CAP = 4096
REFUSED = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
# what every request below adds to the count: "/healthz" (8), "Host" (4) "x" (1),
# "Connection" (10) "close" (5)
BASE = 8 + 4 + 1 + 10 + 5


SEEN: list[str] = []  # requests that reached the app's /seen route


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    settings = ServerSettings(header_timeout_s=30.0, max_header_bytes=CAP, keep_alive_timeout_s=30.0)
    app = create_app(settings)

    @app.get("/seen", response_class=PlainTextResponse)
    async def seen(request: Request) -> str:
        SEEN.append(request.url.query)
        return "OK\n"

    with serving(app) as server:
        yield server


def _send_all_at_once(server: RunningServer, request: bytes) -> bytes:
    """``request`` in one ``sendall``; everything the server answers until it closes."""
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(request)
        sock.settimeout(10.0)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def _healthz(*headers: bytes, target: bytes = b"/healthz") -> bytes:
    head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    return head + b"".join(header + b"\r\n" for header in headers) + b"\r\n"


def test_a_complete_oversized_header_in_one_read_gets_431_and_nothing_else(running: RunningServer) -> None:
    assert _send_all_at_once(running, _healthz(b"X-Big: " + b"a" * 8000)) == REFUSED


def test_many_small_headers_add_up(running: RunningServer) -> None:
    # 100 headers "X-Pad-NN: " + 40 bytes: 8 + 40 = 48 counted each, 4800 in all, each far under the cap
    headers = [b"X-Pad-%02d: " % i + b"b" * 40 for i in range(100)]
    assert _send_all_at_once(running, _healthz(*headers)) == REFUSED


def test_a_long_url_counts(running: RunningServer) -> None:
    assert _send_all_at_once(running, _healthz(target=b"/healthz?" + b"q" * 5000)) == REFUSED


def test_headers_up_to_the_cap_are_served(running: RunningServer) -> None:
    # BASE + "X-Pad" (5) + value == CAP exactly: at the cap, not above it
    answer = _send_all_at_once(running, _healthz(b"X-Pad: " + b"c" * (CAP - BASE - 5)))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"OK\n")
    answer = _send_all_at_once(running, _healthz(b"X-Pad: " + b"c" * (CAP - BASE - 5 + 1)))
    assert answer == REFUSED


def test_a_refused_request_does_not_reach_the_app(running: RunningServer) -> None:
    refused = _healthz(b"X-Big: " + b"a" * 8000, target=b"/seen?refused")
    assert _send_all_at_once(running, refused) == REFUSED
    # a later request on another connection: had the refused one made a request, its route would
    # have run first (its task was scheduled before this connection was accepted)
    answer = _send_all_at_once(running, _healthz(target=b"/seen?served"))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert SEEN == ["served"]
