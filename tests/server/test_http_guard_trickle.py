"""Bytes trickled between keep-alive requests (a reviewer's slowloris): after one complete request,
a client sending ``\\r\\n`` now and then cancels uvicorn's keep-alive timer with every byte, and
httptools skips blank lines before a request line without beginning a request. The header deadline
must still close such a connection, or a few of them fill ``--max-connections``."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.responses import PlainTextResponse

from rollserve.server.app import create_app
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

HEADER_DEADLINE_S = 0.5
# keep-alive far above the header deadline and the wait below: only the header deadline can close
KEEP_ALIVE_S = 600.0
GIVE_UP_S = 30.0  # generous: the close is due after HEADER_DEADLINE_S; this only bounds a failure
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
HEALTHZ_OK = b"HTTP/1.1 200 OK\r\n"


BIG_BODY = 300_000  # above the 64 KiB header cap: bytes of a body must never count as header bytes
STARTED, RELEASE = threading.Event(), threading.Event()  # /slow began; /slow may answer


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    settings = ServerSettings(header_timeout_s=HEADER_DEADLINE_S, keep_alive_timeout_s=KEEP_ALIVE_S)
    app = create_app(settings)

    @app.post("/early", response_class=PlainTextResponse)
    async def early() -> str:  # answers without reading the body, as a refusal may
        return "OK\n"

    @app.get("/slow", response_class=PlainTextResponse)
    async def slow() -> str:
        STARTED.set()
        await asyncio.to_thread(RELEASE.wait, 30.0)
        return "OK\n"

    with serving(app) as server:
        yield server


def _read_one_response(sock: socket.socket) -> bytes:
    """Bytes up to the end of one ``/healthz`` answer (its body is ``OK\\n``)."""
    sock.settimeout(10.0)
    data = b""
    while not data.endswith(b"OK\n"):
        chunk = sock.recv(4096)
        assert chunk, f"closed before a whole answer: {data!r}"
        data += chunk
    return data


def _closed_while_trickling(sock: socket.socket, trickle: bytes, every_s: float) -> bool:
    """Send ``trickle`` every ``every_s`` until the server closes the connection (True) or
    ``GIVE_UP_S`` passes (False). Waiting for the close between sends is the pacing."""
    give_up = time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up:
        try:
            sock.sendall(trickle)
            sock.settimeout(every_s)
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset or broken pipe: closed by the server
            return True
    return False


def test_blank_lines_after_a_request_do_not_hold_the_connection(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)
        assert _closed_while_trickling(sock, b"\r\n", every_s=0.2)


def test_blank_lines_on_a_fresh_connection_do_not_hold_it(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        assert _closed_while_trickling(sock, b"\r\n", every_s=0.2)


def test_a_request_after_blank_lines_is_still_served(running: RunningServer) -> None:
    """Some clients send a stray CRLF after a request; the next request is still answered."""
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)
        sock.sendall(b"\r\n\r\n" + HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)


def test_an_idle_keep_alive_connection_outlives_the_header_deadline(running: RunningServer) -> None:
    """The deadline starts with the next request's first byte, not when an answer goes out: a
    client that pauses longer than the deadline between requests keeps its connection."""
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)
        sock.settimeout(3 * HEADER_DEADLINE_S)  # silence past the deadline is no close
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)


def test_a_body_arriving_after_its_answer_is_no_header(running: RunningServer) -> None:
    """A request answered before its body was read: the rest of the body that follows is part of
    that request, not the next request's headers (no deadline or size cap for it)."""
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG_BODY)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)  # answered; the body is still due
        sock.sendall(b"b" * BIG_BODY)
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)


def test_blank_lines_during_a_slow_answer_do_not_cut_it_off(running: RunningServer) -> None:
    """Bytes after a complete request while its answer is pending (a client's stray CRLF) do not
    start the next request's deadline: the answer, however slow, still arrives."""
    STARTED.clear()
    RELEASE.clear()
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert STARTED.wait(10.0)  # the request is parsed and being answered
        sock.sendall(b"\r\n")
        sock.settimeout(3 * HEADER_DEADLINE_S)  # pending past the deadline is no close
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        RELEASE.set()
        assert _read_one_response(sock).startswith(HEALTHZ_OK)


def test_a_stray_crlf_during_a_slow_answer_leaves_the_connection_open_for_the_next_request(
    running: RunningServer,
) -> None:
    """The bytes did not start a header deadline either: after the answer, the connection is
    still the client's, and its next request is served."""
    STARTED.clear()
    RELEASE.clear()
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert STARTED.wait(10.0)
        sock.sendall(b"\r\n")
        time.sleep(3 * HEADER_DEADLINE_S)  # past any deadline those bytes could have started
        RELEASE.set()
        assert _read_one_response(sock).startswith(HEALTHZ_OK)
        sock.sendall(HEALTHZ)
        assert _read_one_response(sock).startswith(HEALTHZ_OK)
