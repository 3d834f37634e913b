"""uvicorn's websocket protocol (``websockets-sansio``), minus a socket pause and resume per message.

uvicorn stops reading a connection after every message it hands to the app and starts again when
the app takes it: two ``epoll_ctl`` calls and the selector's bookkeeping on every request, which
a lock-step robot (send, wait for the chunk, send) never needs. Here reading stops only once
``QUEUED_BEFORE_PAUSE`` messages wait unread, so a client that floods the server is still held
back after a bounded number of frames, and uvicorn's own resume (when the app has read everything)
is unchanged.

When a message passes the size limit (or the client breaks the protocol), the server sends its
close frame (1009 for a message too big) and then drains: it reads and drops what the client still
sends, without parsing or keeping any of it, until the client closes its side, or for at most
``DRAIN_S`` and ``DRAIN_MAX_BYTES``. uvicorn closed the socket at once, with the rest of the
client's message unread in the kernel's buffer, so the kernel answered with a reset and a client
still sending (any plain ``websockets`` or openpi client) saw a bare connection reset instead of
the close frame, about one time in six on loopback.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

QUEUED_BEFORE_PAUSE = 2  # unread messages (the connect event counts) before reading stops
# After a failing close frame, reading goes on (and drops what it reads) for at most this long and
# this many bytes. A client notices the close frame only once its current send is done, so the
# drain must outlast the rest of an oversized message: 64 MiB covers a message of twice the
# default frame limit, and at most costs reads into the transport's fixed buffer (no memory kept;
# tens of ms of CPU on loopback). 2 s covers that much over a ~300 Mbit/s link; after either bound
# the socket closes as before (a reset for a client still sending).
DRAIN_S = 2.0
DRAIN_MAX_BYTES = 64 * 1024 * 1024


class SteadyReadWebSocketProtocol(WebSocketsSansIOProtocol):
    """``WebSocketsSansIOProtocol`` that pauses reading only when the app falls behind."""

    _drain_left: int | None = None  # bytes still to drop after a failing close; None: not draining

    def data_received(self, data: bytes) -> None:
        if self._drain_left is None:
            super().data_received(data)
            return
        self._drain_left -= len(data)  # dropped unread: the websocket parser is done
        if self._drain_left < 0:
            self.transport.close()

    def handle_parser_exception(self) -> None:
        """Send the close frame and EOF, then drain instead of closing with data unread."""
        if self.conn.close_sent is None or self.transport.is_closing():
            super().handle_parser_exception()  # nothing to drain for (no websocket close was due)
            return
        close = self.conn.close_sent
        self.queue.put_nowait({"type": "websocket.disconnect", "code": close.code, "reason": close.reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.stop_keepalive()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # a client waiting for the server's close sees it at once
        self._drain_left = DRAIN_MAX_BYTES
        # as ``close_timer``: uvicorn then leaves the close to it when the app returns (run_asgi)
        # and cancels it when the connection ends (on the client's EOF: eof_received closes)
        self.close_timer = self.loop.call_later(DRAIN_S, self.transport.close)
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def send_receive_event_to_app(self) -> None:
        paused = self.read_paused
        self.read_paused = True  # uvicorn's method pauses unless it believes reading is paused already
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if not paused and self.queue.qsize() >= QUEUED_BEFORE_PAUSE:
            self.read_paused = True
            self.transport.pause_reading()
