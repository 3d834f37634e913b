"""A header-read deadline for uvicorn's HTTP protocol (slowloris).

uvicorn closes idle keep-alive connections, but a connection that sends half a request header and
then trickles (or nothing) stays open forever, holding a file descriptor. This subclass of
uvicorn's httptools protocol starts a timer when a connection opens, when each request begins and
when bytes arrive between requests (any byte cancels uvicorn's keep-alive timer, and httptools
skips blank lines before a request line without beginning a request, so a client sending ``\r\n``
now and then would otherwise hold the connection forever). It stops the timer when the request's
headers are complete, and closes the connection when it fires or when the headers grow beyond a
size cap: counted as they arrive while they are incomplete, and as parsed (URL, header names and
values), so a whole oversized header block in one read is refused too, before any route runs.

Each deadline falls at a random point between ``header_timeout_s`` and
``HEADER_DEADLINE_SPREAD`` times it, never earlier. With one fixed deadline, connections opened
together (a slowloris attacker's, which reopens each one as soon as it is closed) all close and
come back together, in bursts: 200 such connections every 2 s took a healthy client's p99 from
~11 to ~18 ms, each burst ~40 ms of event loop (about 70 us to accept a connection, 120 us to
close it). Spread, they arrive and close about evenly.
Bodies and websockets are unaffected: their own limits apply (a rollout body has its own read
deadline, ``server/rollout/routes.py``).

Requests pipelined before a refused one are answered first: the 431 or the 400 for a malformed
request (or the deadline's close) waits until their answers are out, and nothing after the refused
request is read. uvicorn's own path for parser errors would close at once, dropping those answers
(kept only for a malformed body whose app is running: it may be waiting for the rest; a malformed
body of a request still queued behind others gets its 400 in its turn, from its own cycle, in place
of its app, which never runs), and log a deliberate
refusal as "Invalid HTTP request received.", so the cap's stop never reaches it
(:class:`_CapAwareParser`).

It also gives each connection its :class:`RefusalStreak` (in every request's scope), so the
routes can slow down a connection that keeps sending refused input (``server/penalty.py``).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from rollserve.server.penalty import SCOPE_KEY, RefusalStreak

_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
)


HEADER_DEADLINE_SPREAD = 1.5  # a header deadline falls between 1x and this times the timeout


def _bad_request(message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """uvicorn's answer to a malformed request (its ``send_400_response``), to be written later."""
    body = message.encode("ascii")
    headers = b"".join(name + b": " + value + b"\r\n" for name, value in default_headers)
    fixed = b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return STATUS_LINE[400] + headers + fixed % len(body) + body


def _refusal(msg: str) -> Callable[..., Any]:
    """An ASGI app answering uvicorn's 400 for a malformed request, in a queued request's place."""
    body = msg.encode("ascii")
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"connection", b"close"),
    ]

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return refuse


class _HeadersTooLarge(Exception):
    """A request's parsed headers passed the cap (raised inside a parser callback)."""


class _CapAwareParser:
    """httptools' request parser, except that its stop at the header cap is no parser error.

    uvicorn handles every parser error itself: it logs "Invalid HTTP request received." and closes
    the connection at once. The cap's stop is a refusal the protocol answers (431, after the
    answers still due), so ``feed_data`` returns instead; every other error still goes to uvicorn.
    """

    def __init__(self, parser: Any, at_cap: Callable[[], bool]) -> None:
        self._parser, self._at_cap = parser, at_cap

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            if not self._at_cap():
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and cap (a subclass per server sets
    them: :func:`guarded_http_protocol`)."""

    header_timeout_s: float  # set by guarded_http_protocol, from the server's settings
    max_header_bytes: int
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0  # bytes received while this request's headers were incomplete
    _parsed_header_bytes = 0  # this request's URL, header names and values as parsed
    _headers_too_large = False
    _in_message = False  # the parser is inside a request (its body may outlive its answer)
    _in_body = False  # ... and past its headers: it has a cycle, whose app may await the body
    _message_ended = False  # a request ended within the bytes being parsed
    _last_words: bytes | None = None  # ending: written, then closed, once the answers are out

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.parser = _CapAwareParser(self.parser, lambda: self._headers_too_large)  # type: ignore[assignment]
        self._refusals = RefusalStreak()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._last_words is not None:
            return  # nothing after a refused request is read
        if self._header_timer is None and self._between_requests():
            self._arm()  # bytes between requests: the next request's headers are due
        waiting = self._header_timer is not None
        self._message_ended = False
        super().data_received(data)
        if self._headers_too_large:
            self._end(_HEADERS_TOO_LARGE)
        elif waiting and self._header_timer is not None and not self._message_ended:
            # still inside the headers; a read that also ended a request holds that request's
            # bytes too (a pipelined body), and the next request's share of it is not known:
            # not counted, so a partial header passes the cap by at most that one read
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._end(_HEADERS_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[SCOPE_KEY] = self._refusals  # type: ignore[literal-required]
        self._parsed_header_bytes = 0
        self._in_message, self._in_body = True, False
        if self._header_timer is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._count_parsed(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_parsed(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = self._in_body = False
        self._message_ended = True
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a malformed request, after the answers due before it. A malformed
        body is answered at once, as uvicorn does, when its request's app runs (it may await
        the rest); one of a request still queued is answered in its turn, by its own cycle."""
        if self._in_body and any(cycle is self.cycle for cycle, _ in self.pipeline):
            self._refuse_queued(msg)
        elif self._in_body or not self._answers_due():
            super().send_400_response(msg)
        else:
            self._end(_bad_request(msg, self.server_state.default_headers))

    def _refuse_queued(self, msg: str) -> None:
        """The queued request's app never runs: its cycle answers the 400 when its turn comes,
        then the connection closes (``on_response_complete``); nothing more is read."""
        self._disarm()
        self._last_words = b""
        refused = self.cycle
        self.pipeline = deque((c, _refusal(msg) if c is refused else app) for c, app in self.pipeline)
        self.flow.pause_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next pipelined request, if any
        if self._last_words is not None and not self._answers_due():
            self._say_last_words()

    def _between_requests(self) -> bool:
        """Neither a request being received (a body answered early may still be arriving)
        nor one being answered (a stray CRLF after a body must not cut a slow answer off)."""
        return not self._in_message and (self.cycle is None or self.cycle.response_complete)

    def _answers_due(self) -> bool:
        """Requests before this one (pipelined) not yet answered, or being answered."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _count_parsed(self, size: int) -> None:
        """Raising stops httptools mid-request: no request is made of these headers, and
        ``data_received`` refuses them (431) once ``feed_data`` returns."""
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > self.max_header_bytes:
            self._headers_too_large = True
            raise _HeadersTooLarge

    def _end(self, last_words: bytes) -> None:
        """Write ``last_words`` and close, once the requests before this one are answered
        (closing now would drop their answers); until then nothing more is read."""
        self._disarm()
        self._last_words = last_words
        if self._answers_due():
            self.flow.pause_reading()
        else:
            self._say_last_words()

    def _say_last_words(self) -> None:
        if not self.transport.is_closing():
            if self._last_words:
                self.transport.write(self._last_words)
            self.transport.close()

    def _arm(self) -> None:
        self._header_bytes = 0
        earliest = self.header_timeout_s
        deadline = random.uniform(
            earliest, earliest * HEADER_DEADLINE_SPREAD
        )  # spreads the closes; no secret
        self._header_timer = self.loop.call_later(deadline, self._header_deadline)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        self._end(b"")


def guarded_http_protocol(header_timeout_s: float, max_header_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class with the deadline and cap baked in."""
    limits = {"header_timeout_s": header_timeout_s, "max_header_bytes": max_header_bytes}
    return type(GuardedHttpToolsProtocol.__name__, (GuardedHttpToolsProtocol,), limits)
