"""uvicorn's websocket protocol (``websockets-sansio``), minus a socket pause and resume per message.

uvicorn stops reading a connection after every message it hands to the app and starts again when
the app takes it: two ``epoll_ctl`` calls and the selector's bookkeeping on every request, which
a lock-step robot (send, wait for the chunk, send) never needs. Here reading stops only once
``QUEUED_BEFORE_PAUSE`` messages wait unread, so a client that floods the server is still held
back after a bounded number of frames, and uvicorn's own resume (when the app has read everything)
is unchanged.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

QUEUED_BEFORE_PAUSE = 2  # unread messages (the connect event counts) before reading stops


class SteadyReadWebSocketProtocol(WebSocketsSansIOProtocol):
    """``WebSocketsSansIOProtocol`` that pauses reading only when the app falls behind."""

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
