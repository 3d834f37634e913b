"""A header-read deadline for uvicorn's HTTP protocol (slowloris).

uvicorn closes idle keep-alive connections, but a connection that sends half a request header and
then trickles (or nothing) stays open forever, holding a file descriptor. This subclass of
uvicorn's httptools protocol starts a timer when a connection opens and when each request begins,
stops it when the request's headers are complete, and closes the connection when it fires or when
the headers grow beyond a size cap. Bodies and websockets are unaffected (their own limits apply).

It also gives each connection its :class:`RefusalStreak` (in every request's scope), so the
routes can slow down a connection that keeps sending refused input (``server/penalty.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rollserve.server.penalty import SCOPE_KEY, RefusalStreak

_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
)


def guarded_http_protocol(header_timeout_s: float, max_header_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class with the deadline and cap baked in."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _header_bytes = 0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._refusals = RefusalStreak()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            waiting = self._header_timer is not None
            super().data_received(data)
            if waiting and self._header_timer is not None:  # still inside the headers
                self._header_bytes += len(data)
                if self._header_bytes > max_header_bytes and not self.transport.is_closing():
                    self.transport.write(_HEADERS_TOO_LARGE)
                    self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[SCOPE_KEY] = self._refusals  # type: ignore[literal-required]
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_deadline)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_deadline(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol
