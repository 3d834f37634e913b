"""A malformed request pipelined after valid ones on a keep-alive connection.

uvicorn answers a parser error with a 400 and closes the connection at once, so the answers still
due to the valid requests before it were dropped: the client got the 400 alone. Now they go out
first, in order, then the 400, then the connection closes. A malformed *body* is still answered at
once (its request's app may be waiting for the rest of the body, which will never come).
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import Iterator

import pytest
from fastapi import Request
from fastapi.responses import PlainTextResponse

from rollserve.server.app import create_app
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

WAIT_S = 10.0  # bounds a failure only: every wait below ends on an event or a close
GARBAGE = b"\x00 this is not HTTP\r\n\r\n"
INVALID = b"Invalid HTTP request received."  # uvicorn's 400 body for a parser error
STARTED, RELEASE = threading.Event(), threading.Event()  # /slow began; /slow may answer
EATING = threading.Event()  # /eat's app is reading its body


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    app = create_app(ServerSettings(header_timeout_s=60.0, keep_alive_timeout_s=60.0))

    @app.get("/slow", response_class=PlainTextResponse)
    async def slow() -> str:
        STARTED.set()
        await asyncio.to_thread(RELEASE.wait, WAIT_S)
        return "slow\n"

    @app.post("/eat", response_class=PlainTextResponse)
    async def eat(request: Request) -> str:
        EATING.set()
        return f"ate {len(await request.body())}\n"

    with serving(app) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_events() -> None:
    for event in (STARTED, RELEASE, EATING):
        event.clear()


def _get(target: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"


def _exchange(server: RunningServer, data: bytes) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=WAIT_S)
    sock.sendall(data)  # all of it in one write
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our bytes unread: what came is the answer
        pass
    return data


def _answers(data: bytes) -> list[tuple[int, bytes]]:
    """Each response's status and body (the bodies here hold no status line)."""
    parts = re.split(rb"(?=HTTP/1\.1 \d{3} )", data)[1:]
    assert b"".join(parts) == data, data  # nothing before the first status line
    return [(int(part[9:12]), part.partition(b"\r\n\r\n")[2]) for part in parts]


def test_both_valid_answers_come_before_the_400(running: RunningServer) -> None:
    with _exchange(running, _get(b"/healthz") + _get(b"/healthz") + GARBAGE) as sock:
        data = _read_until_closed(sock)
    assert _answers(data) == [(200, b"OK\n"), (200, b"OK\n"), (400, INVALID)]
    assert b"\r\nconnection: close\r\n" in data.rpartition(b"HTTP/1.1 400")[2]


def test_the_400_waits_for_a_slow_answer_before_it(running: RunningServer) -> None:
    with _exchange(running, _get(b"/slow") + _get(b"/healthz") + GARBAGE) as sock:
        assert STARTED.wait(WAIT_S)  # all parsed: the 400 is due while /slow is answering
        RELEASE.set()
        assert _answers(_read_until_closed(sock)) == [(200, b"slow\n"), (200, b"OK\n"), (400, INVALID)]


def test_a_malformed_request_with_nothing_due_is_answered_at_once(running: RunningServer) -> None:
    with _exchange(running, GARBAGE) as sock:
        assert _answers(_read_until_closed(sock)) == [(400, INVALID)]


def test_a_malformed_body_is_answered_at_once_while_its_app_waits_for_it(running: RunningServer) -> None:
    """The app of the request whose chunked body breaks is still reading it: waiting for its
    answer first would wait forever. uvicorn's immediate 400 and close end it."""
    head = b"POST /eat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"
    with _exchange(running, head) as sock:
        assert EATING.wait(WAIT_S)  # the app has its headers and part of the body
        sock.sendall(b"not a chunk size\r\n")
        assert _answers(_read_until_closed(sock)) == [(400, INVALID)]
