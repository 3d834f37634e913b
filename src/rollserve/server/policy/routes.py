"""Policy transports: the session-protocol websocket (``/v1/policy/ws``) and the openpi one (``/``).

Transport only: decode a frame, hand it to :class:`PolicyService`, encode the reply. Inference runs
in the service's engine thread, or inline when the engine is idle and the policy measured cheap;
an observation that waits for the engine is awaited in its own task, so a connection keeps reading
(a newer observation can supersede a waiting one) and every other connection keeps being served.
Every rejection is a typed reply; tracebacks stay in the server log.

Decoding stays on the event loop only while it is cheap (see ``_decode``): a frame with a JPEG to
decompress, a big msgpack part, or many small objects is decoded on a worker thread (about 0.2 ms
of server CPU for the hand-off, paid only by such frames). Each client address may hold
``max_connections_per_client`` connections, and a connection that sends nothing for
``policy_idle_timeout_s`` is closed. A connection whose frames keep being refused has its next
frame read later each time, and handled in a lane it shares with every such connection
(``server/penalty.py``); a good request halves that count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, WebSocket

from rollserve.engine.batcher import Superseded
from rollserve.engine.policy_errors import (
    INFERENCE_ERROR,
    STALE_EPOCH,
    UNAVAILABLE,
    UNEXPECTED_MESSAGE,
    UNKNOWN_SESSION,
    PolicyError,
)
from rollserve.server.metrics import METRICS
from rollserve.server.offload import JPEG_TAG, OFFLOAD_BYTES
from rollserve.server.penalty import RefusalPenalty, RefusalStreak
from rollserve.server.policy.connections import AddressLimiter, IdleWatch, client_address
from rollserve.server.policy.openpi_layouts import LayoutError, describe_layout, to_observation
from rollserve.server.policy.service import PolicyService
from rollserve.server.policy.sessions import PolicySession
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    CloseAck,
    CloseMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionOpen,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
    packb,
    unpackb,
)
from rollserve.wire.errors import MALFORMED_FRAME, TOO_MANY_OBJECTS
from rollserve.wire.msgpack_codec import FRAME_MAGIC

logger = logging.getLogger(__name__)

SESSION_PATH = "/v1/policy/ws"
OPENPI_PATH = "/"
# msgpack parts above OFFLOAD_BYTES but below this are first tried on the loop (see _decode)
_INLINE_BYTES = 4 * 1024 * 1024
_INLINE_CONTAINERS = 2048  # a real observation has tens; a flood bails out after ~1 ms
_DISCONNECT = "websocket.disconnect"
# errors that are not the client's input at fault (or that a correct client meets in a race):
# they never slow a connection down
_GONE = object()  # an openpi request whose client went away before its answer

_NOT_PENALISED = frozenset({INFERENCE_ERROR, UNAVAILABLE, STALE_EPOCH, UNKNOWN_SESSION})


class _Refusals:
    """A websocket connection's refusal streak, judged by this protocol's error codes."""

    __slots__ = ("penalty", "streak")

    def __init__(self, penalty: RefusalPenalty) -> None:
        self.penalty, self.streak = penalty, RefusalStreak()

    def judge(self, code: str | None, retryable: bool = False) -> None:
        """Record a reply: an accepted request (``code`` None) halves the count (``penalty.py``)."""
        if code is None:
            self.penalty.served(self.streak)
        elif code not in _NOT_PENALISED and not retryable:
            self.penalty.defer(self.streak)

    def lane(self) -> Any:
        """Where to handle the next frame: the shared lane while this connection has a streak."""
        return self.penalty.lane(self.streak)

    async def wait(self) -> None:
        """Before reading the next frame: wait out the delay of the last refusal, if any."""
        await self.penalty.before_next_read(self.streak)


def add_policy_routes(app: FastAPI, service: PolicyService, settings: ServerSettings) -> None:
    """Mount both policy websockets on ``app``."""

    limiter = AddressLimiter(settings.max_connections_per_client, settings.max_connections)
    app.state.policy_connections = limiter  # who holds a slot: read by tests and debugging only
    penalty = RefusalPenalty(
        settings.refusal_delay_ms, settings.refusal_delay_max_ms, settings.refused_connection_lanes
    )

    @app.websocket(SESSION_PATH)
    async def policy_session_ws(websocket: WebSocket) -> None:
        handler = _SessionSocket(websocket, service, settings, penalty)
        await _admitted(websocket, limiter, handler.route, handler.run, _binary_refusal)

    @app.websocket(OPENPI_PATH)
    async def openpi_ws(websocket: WebSocket) -> None:
        handler = _OpenpiSocket(websocket, service, settings, penalty)
        await _admitted(websocket, limiter, handler.route, handler.run, _text_refusal)


Refuse = Callable[[WebSocket, str], Awaitable[None]]


async def _binary_refusal(websocket: WebSocket, message: str) -> None:
    """The session protocol's refusal: a binary ``error`` message (retryable), like its every frame."""
    error = ErrorMsg(code=UNAVAILABLE, message=message, retryable=True)
    await websocket.send_bytes(encode_message(error))


async def _text_refusal(websocket: WebSocket, message: str) -> None:
    """openpi's refusal: a text frame ``"<code>: <message>"``, as openpi clients read errors."""
    await websocket.send_text(f"{UNAVAILABLE}: {message}")


async def _admitted(
    websocket: WebSocket, limiter: AddressLimiter, route: str, run: Any, refuse: Refuse
) -> None:
    """Serve the connection unless the server, or its address, already holds as many as it may
    (then: ``unavailable`` sent by ``refuse`` in the route's own framing, close 1013, try later).
    Its slot is released however it ends."""
    address = client_address(websocket)
    refusal = limiter.refusal(address)
    if refusal is not None:
        METRICS.count_error(route, UNAVAILABLE)
        await websocket.accept()
        await refuse(websocket, refusal)
        await websocket.close(code=1013, reason="too many connections")
        return
    try:
        await run()
    finally:
        limiter.release(address)


def _msgpack_bytes(data: bytes) -> int:
    """The size of the part msgpack parses: a framed frame's header (its out-of-band payload is
    only viewed, never parsed), else the whole frame."""
    if data[:4] == FRAME_MAGIC and len(data) >= 8:
        return min(len(data), 8 + int.from_bytes(data[4:8], "little"))
    return len(data)


async def _decode(decoder: Any, data: bytes, limits: WireLimits, *, images: bool = True) -> Any:
    """Decode on the event loop while that is cheap, else on a worker thread.

    A frame with a JPEG, or a msgpack part above 4 MiB, always goes to the thread. One between
    64 KiB and 4 MiB (an openpi observation with raw cameras: plain msgpack, mostly bytes) is first
    decoded on the loop with a budget of 2048 maps and lists, which a real observation never nears;
    a flood of small objects hits it within about a millisecond and is decoded again on the thread
    with the full limits, so only such frames pay the hand-off.
    """
    size = _msgpack_bytes(data)
    # (openpi observations never decode image maps, so only the session protocol looks for JPEGs)
    if size <= _INLINE_BYTES and not (images and data.find(JPEG_TAG, 0, size) >= 0):
        if size <= OFFLOAD_BYTES:
            return decoder(data, limits)
        try:
            return decoder(data, _inline_limits(limits))
        except WireError as exc:
            if exc.code != TOO_MANY_OBJECTS:
                raise
    return await asyncio.to_thread(decoder, data, limits)


@functools.lru_cache(maxsize=8)
def _inline_limits(limits: WireLimits) -> WireLimits:
    return dataclasses.replace(
        limits, container_floor=_INLINE_CONTAINERS, bytes_per_container=1 << 62, max_objects=1 << 16
    )


# Metric children looked up once, not per request (each ``labels()`` call hashes and locks).
_QUEUE_WAIT = METRICS.queue_wait.labels(kind="policy")
_ACTIVE_SESSIONS = METRICS.active_sessions.labels(kind="policy")


def _observe_timings(reply: ActionChunkMsg) -> None:
    """Per request; model time and batch size are the engine's, per model call (``PolicyService``)."""
    _QUEUE_WAIT.observe(reply.queue_wait_ms / 1000.0)


class _SessionSocket:
    """One session-protocol connection; holds at most one session at a time."""

    route = "policy_ws"

    def __init__(
        self, websocket: WebSocket, service: PolicyService, settings: ServerSettings, penalty: RefusalPenalty
    ) -> None:
        self.ws = websocket
        self.service = service
        self.settings = settings
        self.limits = settings.limits
        self.refusals = _Refusals(penalty)
        self.session: PolicySession | None = None
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        await self.ws.accept()
        self.idle = idle = IdleWatch(
            self.ws, self.settings.policy_idle_timeout_s, busy=lambda: bool(self._tasks)
        )
        try:
            while (message := await self.ws.receive())["type"] != _DISCONNECT:
                idle.touch()
                async with self.refusals.lane():
                    await self._on_frame(message)
                await self.refusals.wait()
        finally:
            idle.stop()
            for task in self._tasks:
                task.cancel()
            self._drop_session()

    async def _on_frame(self, message: dict[str, Any]) -> None:
        data = message.get("bytes")
        if data is None:
            await self._error(
                MALFORMED_FRAME, "send binary msgpack frames; text frames are not part of the protocol"
            )
            return
        try:
            msg = await _decode(decode_message, data, self.limits)
        except WireError as exc:
            await self._error(exc.code, exc.message)
            return
        if isinstance(msg, ObservationMsg):
            # The session it was sent in, taken now: a task runs after the frames that followed
            # this one, and a session opened by them must not answer it (the replaced one refuses).
            session = self.session
            if self.service.worker.runs_inline_now():
                await self._observe(msg, session)  # done on this loop at once: no task to schedule
            else:
                self._spawn(self._observe(msg, session))
        elif isinstance(msg, SessionOpen):
            await self._open(msg)
        elif isinstance(msg, ResetMsg):
            await self._reset(msg)
        elif isinstance(msg, CloseMsg):
            self._drop_session()
            await self._send(encode_message(CloseAck(header=msg.header)))
        else:
            await self._error(UNEXPECTED_MESSAGE, f"clients do not send {msg.TYPE!r} messages")

    async def _open(self, msg: SessionOpen) -> None:
        self._drop_session()
        ack, self.session = self.service.open_session(msg)
        _ACTIVE_SESSIONS.set(len(self.service.sessions))
        if self.session is not None:  # a refused open (the server is full) is no fault of the client
            self.refusals.judge(None)
        await self._send(encode_message(ack))

    async def _reset(self, msg: ResetMsg) -> None:
        if self.session is None:
            await self._error(UNKNOWN_SESSION, "open a session before resetting it", msg.header.seq_id)
            return
        try:
            epoch = self.service.reset_session(self.session)
        except PolicyError as exc:
            await self._error(exc.code, exc.message, msg.header.seq_id)
            return
        self.refusals.judge(None)
        await self._send(encode_message(ResetAck(header=msg.header, session_epoch=epoch)))

    async def _observe(self, msg: ObservationMsg, session: PolicySession | None) -> None:
        seq_id = msg.header.seq_id
        METRICS.count_request(self.route)
        if session is None:
            await self._error(UNKNOWN_SESSION, "open a session before sending observations", seq_id)
            return
        try:
            reply = await self.service.infer(session, msg.header, msg)
        except Superseded:
            return  # reported in the session's next chunk (superseded_seq_ids)
        except (PolicyError, WireError) as exc:
            await self._error(exc.code, exc.message, seq_id, getattr(exc, "retryable", False))
            return
        except Exception:
            logger.exception("policy request %s failed", seq_id)
            await self._error(INFERENCE_ERROR, "internal server error", seq_id)
            return
        if session is not self.session:  # closed or replaced while it ran: its chunk is no answer now
            await self._error(UNKNOWN_SESSION, "the session was closed or replaced while this ran", seq_id)
            return
        _observe_timings(reply)
        self.refusals.judge(None)
        await self._send(encode_message(reply))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.idle.touch()  # idle from the answer on, not from the request: a slow model is no idle client

    def _drop_session(self) -> None:
        if self.session is not None:
            self.service.close_session(self.session)
            self.session = None
            _ACTIVE_SESSIONS.set(len(self.service.sessions))

    async def _error(
        self, code: str, message: str, seq_id: int | None = None, retryable: bool = False
    ) -> None:
        METRICS.count_error(self.route, code)
        self.refusals.judge(code, retryable)
        await self._send(
            encode_message(ErrorMsg(code=code, message=message, seq_id=seq_id, retryable=retryable))
        )

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            try:
                await self.ws.send_bytes(data)
            except Exception:  # the client went away; the receive loop will see the disconnect
                logger.debug("could not send to a closed policy websocket", exc_info=True)


class _OpenpiSocket:
    """openpi's protocol: metadata on connect, then lockstep request/reply; errors as text frames."""

    route = "openpi"

    def __init__(
        self, websocket: WebSocket, service: PolicyService, settings: ServerSettings, penalty: RefusalPenalty
    ) -> None:
        self.ws = websocket
        self.service = service
        self.settings = settings
        self.limits = settings.limits
        self.refusals = _Refusals(penalty)
        self.session: PolicySession | None = None
        self.open_refusal = ""
        self.answering = False  # a request is in flight: the connection is not idle

    async def run(self) -> None:
        """Metadata on connect; the session is opened with the first request, so a client that
        connects and never asks (or a half-open upgrade) holds no session."""
        await self.ws.accept()
        if len(self.service.sessions) >= self.service.sessions.max_sessions:
            limit = self.service.sessions.max_sessions
            await self._refuse(f"server is at its limit of {limit} policy sessions")
            return
        idle = IdleWatch(self.ws, self.settings.policy_idle_timeout_s, busy=lambda: self.answering)
        try:
            await self.ws.send_bytes(packb(self.metadata()))
            await self._serve(idle)
        finally:
            idle.stop()
            if self.session is not None:
                self.service.close_session(self.session)
                _ACTIVE_SESSIONS.set(len(self.service.sessions))

    async def _refuse(self, reason: str) -> None:
        await self.ws.send_text(f"{UNAVAILABLE}: {reason}")
        await self.ws.close(code=1013)

    def _open(self) -> PolicySession | None:
        request = SessionOpen(
            client_uuid=f"openpi-{uuid.uuid4().hex}", robot_type="openpi", rtc_enabled=False
        )
        ack, session = self.service.open_session(request)
        if session is not None:
            _ACTIVE_SESSIONS.set(len(self.service.sessions))
        else:
            self.open_refusal = ack.reason
        return session

    def metadata(self) -> dict[str, Any]:
        """What the served policy expects, sent once on connect (openpi clients read it as a dict)."""
        meta = self.service.metadata.to_dict()
        meta["server"] = "rollserve"
        meta["execution_horizon"] = self.service.request_path.execution_horizon
        meta["openpi_input"] = describe_layout(self.service.openpi_layout)
        return meta

    async def _serve(self, idle: IdleWatch) -> None:
        seq_id, prev_total_ms = 0, 0.0
        pending: asyncio.Future[Any] | None = None  # a read started while a request ran on the engine
        try:
            while True:
                await self.refusals.wait()
                message = await pending if pending is not None else await self.ws.receive()
                pending = None
                if message["type"] == _DISCONNECT:
                    break
                idle.touch()
                started = time.perf_counter()
                if self.session is None:
                    self.session = self._open()
                    if self.session is None:
                        await self._refuse(self.open_refusal)
                        return
                seq_id += 1
                METRICS.count_request(self.route)
                self.answering = True
                try:
                    async with self.refusals.lane():
                        if self.service.worker.runs_inline_now():  # done at once: nothing to listen for
                            reply = await self._answer(self.session, message.get("bytes"), seq_id)
                        else:
                            reply, pending = await self._answer_listening(self.session, message, seq_id)
                finally:
                    self.answering = False
                    idle.touch()  # idle from the answer on: a slow model is no idle client
                if reply is _GONE:
                    break
                if reply is None:
                    continue
                _observe_timings(reply)
                self.refusals.judge(None)
                timing = {
                    "infer_ms": reply.inference_ms,
                    "queue_wait_ms": reply.queue_wait_ms,
                    "batch_size": reply.batch_size,
                    "prev_total_ms": prev_total_ms,
                }
                await self._send_bytes(packb({"actions": reply.chunk_robot, "server_timing": timing}))
                prev_total_ms = (time.perf_counter() - started) * 1000.0
        finally:
            if pending is not None:
                pending.cancel()

    async def _answer_listening(
        self, session: PolicySession, message: dict[str, Any], seq_id: int
    ) -> tuple[Any, asyncio.Future[Any]]:
        """A request answered on the engine thread while the socket is read: a client that goes
        away, or a server shutting down (which closes every socket), stops the wait instead of
        waiting out the model. Returns the reply (``_GONE`` once the client left) and the read,
        which holds the next request of a client that sent one before its answer."""
        answer = asyncio.ensure_future(self._answer(session, message.get("bytes"), seq_id))
        listen = asyncio.ensure_future(self.ws.receive())
        await asyncio.wait((answer, listen), return_when=asyncio.FIRST_COMPLETED)
        if not answer.done() and listen.result()["type"] == _DISCONNECT:
            answer.cancel()
            return _GONE, listen
        return await answer, listen

    async def _send_bytes(self, data: bytes) -> None:
        try:
            await self.ws.send_bytes(data)
        except Exception:  # the client went away; the next read sees the disconnect
            logger.debug("could not send to a closed openpi websocket", exc_info=True)

    async def _answer(self, session: PolicySession, data: bytes | None, seq_id: int) -> ActionChunkMsg | None:
        """The chunk, or None once the refusal was sent."""
        try:
            return await self._infer(session, data, seq_id)
        except (PolicyError, WireError) as exc:
            await self._error(exc.code, exc.message)
        except LayoutError as exc:
            await self._error("bad_observation", str(exc))
        except Exception:
            logger.exception("openpi request failed")
            await self._error(INFERENCE_ERROR, "internal server error")
        return None

    async def _infer(self, session: PolicySession, data: bytes | None, seq_id: int) -> ActionChunkMsg:
        if data is None:
            raise WireError(MALFORMED_FRAME, "send binary msgpack frames")
        raw = await _decode(unpackb, data, self.limits, images=False)
        observation, _ = to_observation(raw, self.service.openpi_layout, self.service.metadata.camera_names)
        header = MsgHeader(seq_id=seq_id, session_epoch=session.epoch)
        obs = ObservationMsg(
            state=observation["state"], images=observation["images"], task=observation["task"], header=header
        )
        return await self.service.infer(session, header, obs)

    async def _error(self, code: str, message: str) -> None:
        METRICS.count_error(self.route, code)
        self.refusals.judge(code)
        try:
            await self.ws.send_text(f"{code}: {message}")
        except Exception:  # the client went away; the next read sees the disconnect
            logger.debug("could not send to a closed openpi websocket", exc_info=True)
