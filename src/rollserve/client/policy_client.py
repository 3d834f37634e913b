"""PolicyClient: a robot's synchronous connection to a rollserve policy server (session protocol).

Light on purpose: numpy, msgpack and websockets only, so it runs on a robot's small computer.
Typed server errors raise :class:`ServerError`; a message over the server's frame limit raises
:class:`FrameTooLarge` (a ``ServerError``: resending it cannot help); a lost connection raises
:class:`PolicyConnectionError` (the engines reconnect on it), a send cut off at its deadline
:class:`SendTimeout` (both a ``PolicyConnectionError`` and a ``TimeoutError``).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import websockets.exceptions
from websockets.sync.client import ClientConnection, connect

try:  # the bytes a socket holds unread; Unix only (elsewhere a fixed-size peek stands in)
    from fcntl import ioctl
    from termios import FIONREAD
except ImportError:  # pragma: no cover - Windows
    ioctl = None  # type: ignore[assignment]
    FIONREAD = 0

from rollserve.wire import (
    ActionChunkMsg,
    CloseMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
)
from rollserve.wire.errors import FRAME_TOO_LARGE
from rollserve.wire.messages import Message

UNAVAILABLE_CODE = (
    "unavailable"  # the protocol's code (rollserve.engine.policy_errors), not imported: light client
)

DEFAULT_URL = "ws://127.0.0.1:8000/v1/policy/ws"
MESSAGE_TOO_BIG = 1009  # the websocket close code of a server whose frame limit a message broke
# The longest a close handshake may wait for the server (capped by the client's timeout): websockets'
# default of 10 s made ``close()`` (and so an engine's ``stop()``) hang on a frozen server.
MAX_CLOSE_WAIT_S = 1.0
# A close frame's largest size from a server (no mask): 2 header bytes, a 125-byte payload at most.
_CLOSE_FRAME_MAX = 127
_PEEK_FALLBACK = 1 << 20  # the unread bytes peeked at where the socket cannot say how many it holds
# What an HTTP refusal of the websocket handshake most likely means. Starlette answers 403 both to a
# wrong key and to a path with no websocket route (a typo, or a server that serves only a world).
_REFUSAL_HINTS = {
    401: " (missing or wrong API key?)",
    403: (
        " (wrong or missing API key, or no policy websocket at this URL: check the path,"
        " /v1/policy/ws, and that the server serves a policy)"
    ),
}
# Server error codes after which the session must be reopened (see docs/protocol.md).
REOPEN_CODES = frozenset({"unknown_session", "stale_epoch"})
# Connect directly (websockets >= 17 asks for legacy=True) and ignore proxy variables (>= 15 honours them).
_CONNECT_EXTRAS = {
    name: value
    for name, value in (("legacy", True), ("proxy", None))
    if name in inspect.signature(connect).parameters
}


class ServerError(RuntimeError):
    """A typed error reply from the server."""

    def __init__(self, code: str, message: str, seq_id: int | None = None, retryable: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.seq_id = seq_id
        self.retryable = retryable


class SessionRejected(RuntimeError):
    """The server refused to open a session; ``ack.reason`` says why."""

    def __init__(self, ack: SessionAck) -> None:
        super().__init__(f"session refused: {ack.reason}")
        self.ack = ack


class PolicyConnectionError(ConnectionError):
    """No connection, or it broke; reconnecting may help."""


class SendTimeout(PolicyConnectionError, TimeoutError):
    """A send outlived its deadline (the server stopped reading): the connection was shut down, as a
    message cut off midway leaves it unusable. A ``TimeoutError`` too, for a call given a timeout."""


class FrameTooLarge(ServerError):
    """The server closed the connection (1009) on a message over its frame limit (``--max-frame-mb``).

    A :class:`ServerError` (code ``frame_too_large``, not retryable), not a connection error: the
    same message is refused on any connection, only a smaller one (or a larger limit) helps. The
    connection is closed; call ``connect()`` again."""

    def __init__(self, message: str) -> None:
        super().__init__(FRAME_TOO_LARGE, message, None, retryable=False)


class PolicyClient:
    """One websocket, at most one open session. Not thread-safe: use it from one thread."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        open_timeout: float = 10.0,
        limits: WireLimits | None = None,
        client_uuid: str | None = None,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self.open_timeout = open_timeout
        self.limits = limits or WireLimits()
        self.client_uuid = client_uuid or uuid.uuid4().hex
        self.ack: SessionAck | None = None
        self.dropped_replies = 0
        self._ws: ClientConnection | None = None
        self._watchdog: _SendWatchdog | None = None  # bounds each send on ``_ws`` by ``timeout``
        self._next_seq = 0
        self._sent_bytes = 0  # size of the last message sent, for a send timeout's message
        self._send_limit = timeout  # the timeout that bounded the last send, for that message
        # The largest message sent on this connection, for a frame-limit refusal's message: the refused
        # one need not be the last (a reset right after an observation is refused for the observation).
        self._largest_sent = 0
        self._unresponsive = False  # the connection broke, or a wait timed out with nothing received since

    # -- connection -------------------------------------------------------------------------------
    def connect(self) -> PolicyClient:
        """Open the websocket; an open one is closed first (it would leak, with its server slot)."""
        self.close()
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        try:
            self._ws = connect(
                self.url, additional_headers=headers, open_timeout=self.open_timeout,
                close_timeout=min(self.timeout, MAX_CLOSE_WAIT_S), max_size=None, compression=None,
                create_connection=_Connection, **_CONNECT_EXTRAS,
            )  # fmt: skip
        except websockets.exceptions.InvalidStatus as exc:
            status = exc.response.status_code
            hint = _REFUSAL_HINTS.get(status, "")
            raise PolicyConnectionError(f"{self.url} refused the connection: HTTP {status}{hint}") from None
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            raise PolicyConnectionError(f"cannot connect to {self.url}: {exc}") from exc
        self._watchdog = _SendWatchdog(self._ws)
        self._largest_sent = 0
        return self

    @property
    def connected(self) -> bool:
        return self._ws is not None

    @property
    def session_epoch(self) -> int:
        return self.ack.session_epoch if self.ack else 0

    def close(self) -> None:
        """Close the session (best effort) and the connection.

        The goodbye and the close handshake wait at most ``min(timeout, 1 s)`` together. After a broken
        connection or a reply timeout with nothing heard since, the socket is dropped without a
        handshake: a server that did not answer would not answer the close either."""
        if self._ws is None:
            return
        ws, self._ws = self._ws, None
        watchdog, self._watchdog = self._watchdog, None
        if self._unresponsive or watchdog is None:
            _drop(ws)
        else:
            self._close_gracefully(ws, watchdog)
        if watchdog is not None:
            watchdog.stop()
        self._unresponsive = False
        self.ack = None

    def _close_gracefully(self, ws: ClientConnection, watchdog: _SendWatchdog) -> None:
        """Tell the server the session ends, then the close handshake: both within one close wait
        (``min(timeout, 1 s)``), as a server that stopped reading would block the goodbye's send too."""
        wait = min(self.timeout, MAX_CLOSE_WAIT_S)
        deadline = time.monotonic() + wait
        if self.ack is not None:
            goodbye = encode_message(CloseMsg(header=MsgHeader(session_epoch=self.session_epoch)))
            with contextlib.suppress(OSError, websockets.exceptions.WebSocketException):
                watchdog.send(goodbye, wait)
            ws.close_timeout = max(0.0, deadline - time.monotonic())  # what is left for the handshake
        with contextlib.suppress(OSError, websockets.exceptions.WebSocketException):
            ws.close()  # may already be broken: nothing left to close then

    def __enter__(self) -> PolicyClient:
        return self if self.connected else self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- session ----------------------------------------------------------------------------------
    def open_session(
        self,
        *,
        robot_type: str = "",
        action_names: Sequence[str] = (),
        camera_names: Sequence[str] = (),
        state_dim: int | None = None,
        fps: float = 15.0,
        rtc_enabled: bool = True,
        task: str = "",
    ) -> SessionAck:
        """Open (or reopen, bumping the epoch) this client's session; raises :class:`SessionRejected`.

        With no ack in ``timeout`` it closes the connection and raises ``TimeoutError``: acks carry no
        sequence number, so a late one would be taken for the answer to the next open."""
        request = SessionOpen(
            client_uuid=self.client_uuid, robot_type=robot_type, action_names=list(action_names),
            camera_names=list(camera_names), state_dim=state_dim, fps=fps, rtc_enabled=rtc_enabled, task=task,
        )  # fmt: skip
        deadline = self._deadline()  # one bound for the send and the wait together
        self._send(request, deadline)
        try:
            ack = self._wait_for(lambda msg: isinstance(msg, SessionAck), None, deadline)
        except TimeoutError:
            self.close()
            raise
        assert isinstance(ack, SessionAck)
        if not ack.accepted:
            raise SessionRejected(ack)
        self.ack = ack
        return ack

    def reset(self, episode_id: int = 0) -> ResetAck:
        """New episode on the server (fresh processor state); the session epoch moves on."""
        seq_id, deadline = self._take_seq(), self._deadline()  # one bound for the send and the wait
        header = MsgHeader(seq_id=seq_id, episode_id=episode_id, session_epoch=self.session_epoch)
        self._send(ResetMsg(header=header), deadline)
        wanted = lambda msg: isinstance(msg, ResetAck) and msg.header.seq_id == seq_id  # noqa: E731
        ack = self._wait_for(wanted, seq_id, deadline)
        assert isinstance(ack, ResetAck) and self.ack is not None
        self.ack.session_epoch = ack.session_epoch
        return ack

    # -- inference --------------------------------------------------------------------------------
    def infer(self, obs: ObservationMsg, timeout: float | None = None) -> ActionChunkMsg:
        """Send one observation as given and wait for its chunk (stale replies are skipped).

        ``timeout`` (else the client's) bounds the whole call from its start, the send included: a
        send cut off at it raises :class:`SendTimeout`, no reply in time ``TimeoutError``."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        seq_id = obs.header.seq_id
        self._send(obs, deadline, limit)
        reply = self._wait_for(
            lambda msg: isinstance(msg, ActionChunkMsg) and msg.header.seq_id == seq_id, seq_id, deadline
        )
        assert isinstance(reply, ActionChunkMsg)
        return reply

    def predict(
        self,
        state: np.ndarray,
        images: Mapping[str, np.ndarray] | None = None,
        *,
        task: str = "",
        inference_delay_steps: int = 0,
        prefix_model: np.ndarray | None = None,
        prefix_robot: np.ndarray | None = None,
        episode_id: int = 0,
        jpeg_quality: int = 0,
    ) -> ActionChunkMsg:
        """The simple call: stamps a fresh header, sends, returns the chunk."""
        obs = ObservationMsg(
            state=np.asarray(state, dtype=np.float32), images=dict(images or {}), task=task,
            inference_delay_steps=inference_delay_steps, prefix_model=prefix_model, prefix_robot=prefix_robot,
            jpeg_quality=jpeg_quality, header=self.next_header(episode_id),
        )  # fmt: skip
        return self.infer(obs)

    def next_header(self, episode_id: int = 0) -> MsgHeader:
        return MsgHeader(
            seq_id=self._take_seq(), episode_id=episode_id, session_epoch=self.session_epoch,
            client_mono_ns=time.monotonic_ns(),
        )  # fmt: skip

    def send_observation(self, obs: ObservationMsg) -> None:
        """Send without waiting (pipelining); pair with :meth:`receive`."""
        self._send(obs)

    def receive(self, timeout: float | None = None) -> Message:
        """The next message from the server (an ``ErrorMsg`` is returned, not raised)."""
        if self._ws is None:
            raise PolicyConnectionError("not connected")
        try:
            data = self._ws.recv(timeout=self.timeout if timeout is None else timeout)
        except TimeoutError:
            raise
        except (OSError, websockets.exceptions.WebSocketException) as exc:
            raise self._lost(exc) from exc
        self._unresponsive = False
        if isinstance(data, str):
            return _text_error(data)
        try:
            return decode_message(data, self.limits)
        except WireError as exc:
            return ErrorMsg(code=exc.code, message=f"undecodable reply: {exc.message}")

    # -- internals --------------------------------------------------------------------------------
    def _take_seq(self) -> int:
        self._next_seq += 1
        return self._next_seq

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def _send(self, msg: Message, deadline: float | None = None, limit: float | None = None) -> None:
        """Send by ``deadline`` (a call's, from its ``limit``), else within ``timeout``: a server that
        stops reading would otherwise block the send until TCP gives up (minutes), once the socket
        buffers are full."""
        if self._ws is None or self._watchdog is None:
            raise PolicyConnectionError("not connected")
        data = encode_message(msg)
        left = self.timeout if deadline is None else deadline - time.monotonic()
        if left <= 0:  # nothing sent, nothing broken: a call given no time at all
            raise TimeoutError(f"no time left to send to {self.url} within the timeout")
        self._sent_bytes = len(data)
        self._send_limit = self.timeout if limit is None else limit
        self._largest_sent = max(self._largest_sent, len(data))
        try:
            self._watchdog.send(data, left)
        except (OSError, websockets.exceptions.WebSocketException) as exc:
            raise self._lost(exc) from exc
        if self._watchdog.fired:  # the send ended as the socket was shut down: the connection is gone
            raise self._lost(ConnectionError("the connection was shut down"))

    def _lost(self, exc: BaseException) -> Exception:
        """The error for a connection that broke: :class:`FrameTooLarge` if the server closed it on a
        message over its frame limit (1009), else :class:`PolicyConnectionError`."""
        self._unresponsive = True
        if self._watchdog is not None and self._watchdog.fired:
            return SendTimeout(
                f"connection to {self.url} lost: sending {self._sent_bytes} bytes took longer than the"
                f" timeout ({self._send_limit:g} s), so the server stopped reading; the connection was"
                " shut down"
            )
        code, reason = self._close_received(exc)
        if code == MESSAGE_TOO_BIG:
            return FrameTooLarge(
                f"{self.url} refused a message as over its frame limit (--max-frame-mb; the largest sent on"
                f" this connection: {self._largest_sent} bytes) and closed the connection"
                f" (1009: {reason or 'no reason given'}); send smaller observations (fewer or smaller"
                " images, jpeg_quality) or raise the limit"
            )
        return PolicyConnectionError(f"connection to {self.url} lost: {exc}")

    def _close_received(self, exc: BaseException) -> tuple[int | None, str]:
        """The server's close code and reason: as websockets parsed it, else as the socket saw it
        (websockets drops a close frame it had not parsed when a send fails first)."""
        close = getattr(exc, "rcvd", None)
        if close is not None:
            return close.code, close.reason
        sock = self._ws.socket if self._ws is not None else None
        if isinstance(sock, _RecordingSocket):
            return sock.close_frame() or (None, "")
        return None, ""

    def _wait_for(self, wanted: Any, seq_id: int | None, deadline: float) -> Message:
        """Read until ``wanted(msg)`` or ``deadline``; an error for ``seq_id`` (or for no request)
        raises ServerError."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._unresponsive = True  # until the server is heard from again
                raise TimeoutError(f"no reply from {self.url} within the timeout")
            try:
                msg = self.receive(remaining)
            except TimeoutError:
                self._unresponsive = True
                raise
            if wanted(msg):
                return msg
            if isinstance(msg, ErrorMsg) and (msg.seq_id is None or msg.seq_id == seq_id):
                raise ServerError(msg.code, msg.message, msg.seq_id, msg.retryable)
            self.dropped_replies += 1  # a late reply to an older request


class _SendWatchdog:
    """Shuts a connection's socket down when a send outlives its deadline, so that the blocked
    ``sendall`` raises: against a server that stopped reading it would wait until TCP gives up.

    Not a socket timeout: websockets' reader thread shares the socket, and takes a timeout for an
    internal error. One thread per connection, woken only when a send's deadline comes before the
    one it sleeps towards (mostly once per idle spell), so a send costs a few attribute accesses."""

    def __init__(self, ws: ClientConnection) -> None:
        self.fired = False  # the socket was shut down: a send outlived its deadline
        self._ws = ws
        self._deadline: float | None = None  # of the send in progress
        self._sleeping_until = math.inf  # the deadline the thread waits for
        self._stopped = False
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="rollserve-send-watchdog", daemon=True).start()

    def send(self, data: bytes, limit: float) -> None:
        """``ws.send(data)``, the socket shut down if it takes more than ``limit`` seconds."""
        deadline = time.monotonic() + limit
        self._deadline = deadline  # written before _sleeping_until is read: see _run
        if deadline < self._sleeping_until and not self._wake.is_set():
            self._wake.set()
        try:
            self._ws.send(data)
        finally:
            self._deadline = None

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            deadline = self._deadline
            self._sleeping_until = math.inf if deadline is None else deadline
            if self._deadline is not deadline:  # a send started meanwhile and saw the old value
                continue
            if deadline is not None and deadline <= time.monotonic():
                self._fire()
                return
            self._wake.wait(None if deadline is None else deadline - time.monotonic())
            self._wake.clear()

    def _fire(self) -> None:
        self.fired = True
        with contextlib.suppress(OSError):
            self._ws.socket.shutdown(socket.SHUT_RDWR)


class _RecordingSocket:
    """A connection's socket that keeps the last bytes it received, and peeks at those it still
    holds when it is closed. When the server closes on an oversized message (1009) with the rest
    unread, its kernel answers the next send with a reset; if that send comes before websockets has
    parsed the close frame, websockets closes the socket and the frame with it, and the client could
    not tell a frame-limit refusal from a lost connection. The close frame is the stream's last."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._tail = b""  # the last bytes received, enough for a close frame
        self._unread = b""  # what the socket still held when it was shut down or closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = self._sock.recv(bufsize, flags)
        self._tail = (self._tail + data[-_CLOSE_FRAME_MAX:])[-_CLOSE_FRAME_MAX:]
        return data

    def shutdown(self, how: int) -> None:
        self._peek_unread()
        self._sock.shutdown(how)

    def close(self) -> None:
        self._peek_unread()
        self._sock.close()

    def close_frame(self) -> tuple[int, str] | None:
        """The code and reason of a close frame that ended what this socket received, if one did."""
        for data in (self._tail + self._unread, self._tail):
            if frame := _close_frame_at_end(data):
                return frame
        return None

    def _peek_unread(self) -> None:
        """Copy (not take: websockets' reader may still read them) the bytes the socket holds."""
        dontwait = getattr(socket, "MSG_DONTWAIT", None)  # a peek must not block (no such flag on Windows)
        if dontwait is None or type(self._sock) is not socket.socket or self._sock.fileno() < 0:
            return  # TLS wraps the bytes (not peekable); a closed socket holds none
        with contextlib.suppress(OSError, ValueError):
            if count := _unread_count(self._sock):
                self._unread = self._sock.recv(count, socket.MSG_PEEK | dontwait) or self._unread


class _Connection(ClientConnection):
    """websockets' client connection on a :class:`_RecordingSocket`."""

    def __init__(self, sock: socket.socket, protocol: Any, **kwargs: Any) -> None:
        super().__init__(_RecordingSocket(sock), protocol, **kwargs)  # type: ignore[arg-type]


def _unread_count(sock: socket.socket) -> int:
    """How many received bytes ``sock`` holds unread (a generous guess where it cannot be asked)."""
    if ioctl is None:
        return _PEEK_FALLBACK
    count = bytearray(4)
    ioctl(sock.fileno(), FIONREAD, count)
    return int.from_bytes(count, sys.byteorder)


def _close_frame_at_end(data: bytes) -> tuple[int, str] | None:
    """The (code, reason) of the server's close frame (FIN and opcode 8, unmasked, with a status code)
    that ends ``data``, or None. A candidate whose code no server may send (outside 1000-4999) is
    passed over: a close reason whose last bytes look like a short close frame (``88 02 6f 6b``,
    the end of "\u02c8\x02ok") would otherwise be read as that frame."""
    for start in range(len(data) - 4, max(-1, len(data) - _CLOSE_FRAME_MAX - 1), -1):
        if data[start] == 0x88 and data[start + 1] == len(data) - start - 2:
            code = int.from_bytes(data[start + 2 : start + 4], "big")
            if 1000 <= code <= 4999:
                return code, data[start + 4 :].decode("utf-8", "replace")
    return None


def _drop(ws: ClientConnection) -> None:
    """Close a connection without the close handshake: shutting the socket down ends websockets'
    reader thread at once, so ``close()`` has nothing left to wait for."""
    with contextlib.suppress(OSError):
        ws.socket.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError, websockets.exceptions.WebSocketException):
        ws.close()


def _text_error(text: str) -> ErrorMsg:
    """A text frame: older servers refused a connection at their limit (``unavailable``, then close
    1013) as ``"<code>: <message>"`` (today's send the binary error message); anything else is
    malformed."""
    code, sep, message = text.partition(": ")
    if sep and code == UNAVAILABLE_CODE:
        return ErrorMsg(code=code, message=message[:500], retryable=True)
    return ErrorMsg(code="malformed_frame", message=text[:500])
