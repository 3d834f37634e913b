"""The header cap's refusal (431) and the header deadline on a keep-alive connection carrying
pipelined requests (a reviewer's findings):

- the 431 is rollserve's deliberate refusal, not a malformed request: uvicorn's "Invalid HTTP
  request received." warning must not be logged for it (a real parser error still is);
- requests pipelined before the refused one are answered first, in order, then the 431 goes out
  and the connection closes; uvicorn closes on any parser error at once, which dropped them;
- the deadline for a pipelined request's headers likewise closes only after the answers before it;
- the bytes of a pipelined request's body never count as the next request's header bytes;
- a malformed request (uvicorn's 400) pipelined after valid ones likewise waits for their answers
  (the client got the 400 alone); a malformed *body* is still answered at once, as uvicorn does,
  when its request's app runs: it may be waiting for the rest of the body, which will never come;
  the malformed body of a request still queued behind another is answered in its turn, after the
  answer before it (which uvicorn dropped), and its app never runs.
"""

from __future__ import annotations

import asyncio
import logging
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

CAP = 4096
REFUSED = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
INVALID = "Invalid HTTP request received."  # uvicorn's warning (and 400 body) for a parser error
DEADLINE_S = 0.5  # the short-deadline server's header deadline
WAIT_S = 10.0  # bounds a failure only: every wait below ends on an event or a close

SEEN: list[str] = []  # queries of the requests that reached /seen, in order
STARTED, RELEASE = threading.Event(), threading.Event()  # /slow began; /slow may answer
EATING = threading.Event()  # /eat began (the bytes before it were parsed)


def _app(settings: ServerSettings):  # type: ignore[no-untyped-def]
    app = create_app(settings)

    @app.get("/seen", response_class=PlainTextResponse)
    async def seen(request: Request) -> str:
        SEEN.append(request.url.query)
        return f"seen {request.url.query}\n"

    @app.get("/slow", response_class=PlainTextResponse)
    async def slow() -> str:
        STARTED.set()
        await asyncio.to_thread(RELEASE.wait, WAIT_S)
        return "slow\n"

    @app.post("/eat", response_class=PlainTextResponse)
    async def eat(request: Request) -> str:
        EATING.set()
        return f"ate {len(await request.body())}\n"

    return app


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    """Cap 4 KiB; deadline and keep-alive far above any wait here, so neither closes a test's
    connection unless the test waits for it."""
    settings = ServerSettings(header_timeout_s=60.0, max_header_bytes=CAP, keep_alive_timeout_s=60.0)
    with serving(_app(settings)) as server:
        yield server


@pytest.fixture(scope="module")
def short_deadline() -> Iterator[RunningServer]:
    settings = ServerSettings(header_timeout_s=DEADLINE_S, keep_alive_timeout_s=60.0)
    with serving(_app(settings)) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_events() -> None:
    SEEN.clear()
    for event in (STARTED, RELEASE, EATING):
        event.clear()


@pytest.fixture
def uvicorn_warnings() -> Iterator[list[str]]:
    """Messages uvicorn's error logger emits during the test (attached after uvicorn configured
    its logging, which replaces the handlers)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def _get(target: bytes, *headers: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


BIG = b"X-Big: " + b"a" * 8000  # 5 + 8000 counted: far above CAP on its own


def _answer(body: bytes) -> bytes:
    """The tail of a 200 answer with ``body`` (no connection header: the connection stays open)."""
    return b"content-length: %d\r\ncontent-type: text/plain; charset=utf-8\r\n\r\n" % len(body) + body


def _read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(WAIT_S)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # the server closed with our unread bytes: what came is the answer
        pass
    return data


def _responses(data: bytes) -> list[bytes]:
    """``data`` cut before each status line (the bodies here never hold one)."""
    return [b"HTTP/1.1" + part for part in data.split(b"HTTP/1.1")[1:]]


def test_the_431_is_not_logged_as_an_invalid_request(
    running: RunningServer, uvicorn_warnings: list[str]
) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(_get(b"/healthz", b"Connection: close", BIG))  # whole, in one write
        assert _read_until_closed(sock) == REFUSED
    # a malformed request still gets uvicorn's 400 and its warning: the handler sees uvicorn's lines
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert uvicorn_warnings == [INVALID]


def test_a_pipelined_request_over_the_cap_is_refused_after_the_answer_before_it(
    running: RunningServer,
) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(_get(b"/seen?a") + _get(b"/seen?b", BIG))
        answers = _responses(_read_until_closed(sock))
    assert len(answers) == 2
    assert answers[0].startswith(b"HTTP/1.1 200 OK\r\n") and answers[0].endswith(_answer(b"seen a\n"))
    assert answers[1] == REFUSED
    assert SEEN == ["a"]


def test_every_pipelined_answer_goes_out_in_order_before_the_431(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(_get(b"/seen?1") + _get(b"/seen?2") + _get(b"/seen?3") + _get(b"/seen?4", BIG))
        answers = _responses(_read_until_closed(sock))
    assert [answer.split(b"\r\n", 1)[0] for answer in answers[:3]] == [b"HTTP/1.1 200 OK"] * 3
    bodies = [answer.rpartition(b"\r\n\r\n")[2] for answer in answers[:3]]
    assert bodies == [b"seen 1\n", b"seen 2\n", b"seen 3\n"]
    assert answers[3:] == [REFUSED]
    assert SEEN == ["1", "2", "3"]


def test_a_slow_answer_before_a_refused_request_is_still_sent(running: RunningServer) -> None:
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(_get(b"/slow") + _get(b"/seen?refused", BIG))
        assert STARTED.wait(WAIT_S)  # both parsed: the refusal is due while /slow is answering
        RELEASE.set()
        answers = _responses(_read_until_closed(sock))
    assert len(answers) == 2 and answers[0].endswith(_answer(b"slow\n"))
    assert answers[1] == REFUSED
    assert SEEN == []


def test_a_partial_header_over_the_cap_waits_for_the_answer_before_it(running: RunningServer) -> None:
    """The cap counted on bytes still arriving (no end of headers yet): the same order."""
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(_get(b"/slow") + b"GET /seen?refused HTTP/1.1\r\nHost: x\r\nX-Big: ")
        assert STARTED.wait(WAIT_S)  # the next request has begun; its header keeps coming
        sock.sendall(b"a" * (2 * CAP))
        RELEASE.set()
        answers = _responses(_read_until_closed(sock))
    assert len(answers) == 2 and answers[0].endswith(_answer(b"slow\n"))
    assert answers[1] == REFUSED


def test_the_header_deadline_of_a_pipelined_request_waits_for_the_answer_before_it(
    short_deadline: RunningServer,
) -> None:
    with socket.create_connection((short_deadline.host, short_deadline.port)) as sock:
        sock.sendall(_get(b"/slow") + b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        assert STARTED.wait(WAIT_S)
        sock.settimeout(3 * DEADLINE_S)  # the second request's deadline passes: no close, no answer
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        RELEASE.set()
        answers = _responses(_read_until_closed(sock))  # then the connection closes
    assert len(answers) == 1 and answers[0].endswith(_answer(b"slow\n"))


def test_a_pipelined_body_does_not_count_as_the_next_requests_headers(running: RunningServer) -> None:
    """A body of 10,000 bytes (over the 4 KiB cap) read together with the start of the next
    request: only that request's own header bytes count, and both are answered."""
    body = b"b" * 10_000
    post = b"POST /eat HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    following = _get(b"/seen?next", b"Connection: close")
    with socket.create_connection((running.host, running.port)) as sock:
        sock.sendall(post + following[:20])  # the next request begins in the same write
        assert EATING.wait(WAIT_S)  # that write was parsed; the rest of the headers come now
        sock.sendall(following[20:])
        answers = _responses(_read_until_closed(sock))
    assert len(answers) == 2 and answers[0].endswith(_answer(b"ate 10000\n"))
    assert answers[1].startswith(b"HTTP/1.1 200 OK\r\n") and answers[1].endswith(b"\r\n\r\nseen next\n")


GARBAGE = b"\x00 this is not HTTP\r\n\r\n"
BROKEN_EAT = (  # a POST /eat whose chunked body breaks after its first chunk
    b"POST /eat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\nnot a chunk size\r\n"
)


def _answers(data: bytes) -> list[tuple[int, bytes]]:
    """Each response's status and body (the bodies here hold no status line)."""
    parts = re.split(rb"(?=HTTP/1\.1 \d{3} )", data)[1:]
    assert b"".join(parts) == data, data  # nothing before the first status line
    return [(int(part[9:12]), part.partition(b"\r\n\r\n")[2]) for part in parts]


def _exchange(server: RunningServer, data: bytes) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=WAIT_S)
    sock.sendall(data)  # all of it in one write
    return sock


def test_both_valid_answers_come_before_the_400(running: RunningServer) -> None:
    with _exchange(running, _get(b"/healthz") + _get(b"/healthz") + GARBAGE) as sock:
        data = _read_until_closed(sock)
    assert _answers(data) == [(200, b"OK\n"), (200, b"OK\n"), (400, INVALID.encode())]
    assert b"\r\nconnection: close\r\n" in data.rpartition(b"HTTP/1.1 400")[2]


def test_the_400_waits_for_a_slow_answer_before_it(running: RunningServer) -> None:
    with _exchange(running, _get(b"/slow") + _get(b"/healthz") + GARBAGE) as sock:
        assert STARTED.wait(WAIT_S)  # all parsed: the 400 is due while /slow is answering
        RELEASE.set()
        expected = [(200, b"slow\n"), (200, b"OK\n"), (400, INVALID.encode())]
        assert _answers(_read_until_closed(sock)) == expected


def test_a_malformed_request_with_nothing_due_is_answered_at_once(running: RunningServer) -> None:
    with _exchange(running, GARBAGE) as sock:
        assert _answers(_read_until_closed(sock)) == [(400, INVALID.encode())]


def test_a_malformed_body_is_answered_at_once_while_its_app_waits_for_it(running: RunningServer) -> None:
    """The app of the request whose chunked body breaks is still reading it: waiting for its
    answer first would wait forever. uvicorn's immediate 400 and close end it."""
    head = b"POST /eat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"
    with _exchange(running, head) as sock:
        assert EATING.wait(WAIT_S)  # the app has its headers and part of the body
        sock.sendall(b"not a chunk size\r\n")
        assert _answers(_read_until_closed(sock)) == [(400, INVALID.encode())]


def test_a_malformed_body_of_a_queued_request_is_answered_after_the_answer_before_it(
    running: RunningServer,
) -> None:
    """/eat is queued behind /slow when its chunked body breaks: /slow's answer goes out first, then
    the 400 and the close; /eat's app never runs (it would wait for a body that never comes)."""
    with _exchange(running, _get(b"/slow") + BROKEN_EAT) as sock:
        assert STARTED.wait(WAIT_S)
        RELEASE.set()
        data = _read_until_closed(sock)
    assert _answers(data) == [(200, b"slow\n"), (400, INVALID.encode())]
    assert b"\r\nconnection: close\r\n" in data.rpartition(b"HTTP/1.1 400")[2]
    assert not EATING.is_set()


# -- review of the first mutation run of `http_guard` ------------------------------------------------
def _dateless(response: bytes) -> bytes:
    """A response with its ``date`` header's value blanked (two answers a second apart differ there)."""
    return re.sub(rb"\r\ndate: [^\r]*\r\n", b"\r\ndate: -\r\n", response)


def _uvicorns_own_400(server: RunningServer) -> bytes:
    """The 400 uvicorn itself writes for a malformed request with nothing due before it."""
    with _exchange(server, GARBAGE) as sock:
        return _read_until_closed(sock)


def test_a_400_held_for_the_answers_before_it_is_uvicorns_400_byte_for_byte(running: RunningServer) -> None:
    with _exchange(running, _get(b"/healthz") + GARBAGE) as sock:
        held = _responses(_read_until_closed(sock))[-1]
    own = _uvicorns_own_400(running)
    assert b"\r\nserver: uvicorn\r\n" in own and b"\r\ndate: " in own  # the default headers are in it
    assert _dateless(held) == _dateless(own)


def test_a_queued_requests_400_is_uvicorns_400_byte_for_byte(running: RunningServer) -> None:
    with _exchange(running, _get(b"/slow") + BROKEN_EAT) as sock:
        assert STARTED.wait(WAIT_S)
        RELEASE.set()
        refused = _responses(_read_until_closed(sock))[-1]
    assert _dateless(refused) == _dateless(_uvicorns_own_400(running))


def test_a_valid_request_queued_before_a_broken_one_is_still_answered(running: RunningServer) -> None:
    """Only the request whose body broke is refused: one queued between it and the running one
    keeps its app and its answer."""
    with _exchange(running, _get(b"/slow") + _get(b"/seen?between") + BROKEN_EAT) as sock:
        assert STARTED.wait(WAIT_S)
        RELEASE.set()
        data = _read_until_closed(sock)
    assert _answers(data) == [(200, b"slow\n"), (200, b"seen between\n"), (400, INVALID.encode())]
    assert SEEN == ["between"] and not EATING.is_set()


def _partial_header(size: int) -> bytes:
    """The start of a request whose headers so far are exactly ``size`` bytes (not yet ended)."""
    start = b"GET /seen?partial HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
    return start + b"a" * (size - len(start))


def _let_the_server_read_it(sock: socket.socket) -> None:
    """A pause with nothing answered, so the bytes sent so far are most likely read on their own
    (the outcome is the same either way; only a slip in counting across reads needs two reads)."""
    sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(WAIT_S)


def test_a_partial_header_of_exactly_the_cap_is_served_and_one_byte_more_is_refused(
    running: RunningServer,
) -> None:
    with _exchange(running, _partial_header(CAP)) as sock:
        _let_the_server_read_it(sock)
        sock.sendall(b"\r\n\r\n")  # the headers end: the cap counted CAP bytes, which it allows
        answers = _answers(_read_until_closed(sock))
    assert answers == [(200, b"seen partial\n")]
    with _exchange(running, _partial_header(CAP + 1)) as sock:
        assert _read_until_closed(sock) == REFUSED  # refused before the headers end


def test_partial_headers_are_counted_across_reads(running: RunningServer) -> None:
    """Two reads of 60 % of the cap each: the second brings the request over it."""
    part = _partial_header(CAP * 6 // 10)
    with _exchange(running, part) as sock:
        _let_the_server_read_it(sock)
        sock.sendall(b"a" * (CAP * 6 // 10))
        assert _read_until_closed(sock) == REFUSED
