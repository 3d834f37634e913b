"""The one way to run the ASGI app: uvicorn, in the foreground (CLI) or on a thread (tests, demo, bench)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import os
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from rollserve.server.log_guard import guard_log_volume
from rollserve.server.settings import ServerSettings
from rollserve.server.ws_protocol import SteadyReadWebSocketProtocol


@dataclass
class RunningServer:
    """A uvicorn server on a background thread; ``port`` is the real port (also when 0 was asked)."""

    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def uvicorn_config(app, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:  # type: ignore[no-untyped-def]
    """Uvicorn settings shared by every way of starting the server.

    The connection limits come from the app's :class:`ServerSettings`: websocket messages above the
    frame limit are cut off while they stream (close 1009, nothing buffered beyond the limit),
    request headers must arrive within ``header_timeout_s``, idle keep-alive connections close after
    ``keep_alive_timeout_s``, and above ``max_connections`` new requests get a 503.
    """
    settings = getattr(getattr(app, "state", None), "settings", None) or ServerSettings()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop=event_loop_name(settings.event_loop),
        http=_http_protocol(settings),
        ws=SteadyReadWebSocketProtocol,  # uvicorn's websockets-sansio, one pause per backlog, not per message
        ws_max_size=settings.limits.max_frame_bytes,
        ws_per_message_deflate=False,
        # typed int, but uvicorn only hands it to loop.call_later: a fraction is kept as given
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]
        limit_concurrency=settings.max_connections,
        lifespan="on",
        access_log=False,
    )


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_name(requested: str) -> str:
    """The event loop uvicorn runs: ``"auto"`` is uvloop where it is installed (uvicorn's own rule;
    not a dependency: measured here it saved no server CPU that held from run to run), else asyncio's.
    Raises ``ValueError`` for an unknown name, or for uvloop where it is missing."""
    if requested not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {requested!r}; choose one of {', '.join(EVENT_LOOPS)}")
    if requested == "asyncio":
        return requested
    installed = importlib.util.find_spec("uvloop") is not None
    if requested == "uvloop" and not installed:
        raise ValueError("the uvloop event loop is not installed (pip install uvloop), or use --loop asyncio")
    return "uvloop" if installed else "asyncio"


def _http_protocol(settings: ServerSettings) -> Any:
    """httptools with the header deadline (a server dependency); plain h11 where it is missing."""
    try:
        from rollserve.server.http_guard import guarded_http_protocol
    except ImportError:  # no httptools: uvicorn's h11 still caps incomplete headers at 16 KiB
        return "h11"
    return guarded_http_protocol(settings.header_timeout_s, settings.max_header_bytes)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP listening socket (port 0 picks a free one), made so replies are never Nagle-delayed.

    The socket is created with ``IPPROTO_TCP`` explicitly: asyncio sets ``TCP_NODELAY`` only on
    connections accepted from such a socket (``socket.create_server`` leaves the protocol 0), and
    without it a reply written in two parts waits for the client's delayed ACK, about 40 ms.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_FREED_BYTES = 128 * 1024 * 1024  # freed memory the heap may keep for reuse
_MMAP_ABOVE_BYTES = 32 * 1024 * 1024  # only blocks this large bypass the heap (glibc's maximum)


def keep_freed_memory() -> bool:
    """Let glibc reuse freed large buffers instead of handing them back to the kernel at once.

    A 300 kB observation passes through several fresh buffers (websocket frame, unmasked payload,
    msgpack bins). With glibc's defaults each is mmap'ed or trimmed away when freed, so the next
    request page-faults all of its memory in again: ~0.2 ms of server CPU per request measured on
    a VM. Fixed thresholds keep up to ``KEEP_FREED_BYTES`` in the heap instead. Process-wide, so
    only ``rollserve serve`` calls it; a no-op off glibc or when ``MALLOC_*`` settings are given.
    Returns whether the thresholds were set.
    """
    if platform.libc_ver()[0] != "glibc" or any(
        name in os.environ for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
    ):
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES)
    )


def freeze_startup_objects() -> int:
    """Take everything alive once the server is built out of the cyclic garbage collector's sight.

    Torch, the model, pydantic's schemas and the app are ~230k tracked objects that live as long as
    the process. Every full collection walks all of them again: ~0.2 s on a loaded 2-core VM, about
    once per few hundred requests (measured over 32-session ``batch_step`` calls, ~1 ms of each
    batch on average, every client stalled meanwhile). ``gc.collect`` first, so no garbage is
    frozen. Process-wide, so only ``rollserve serve`` calls it. Returns the number frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> RunningServer:  # type: ignore[no-untyped-def]
    """Start uvicorn on a thread and wait until it accepts connections."""
    sock = listening_socket(host, port)
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, host, bound_port))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="rollserve-uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"uvicorn failed to start on {host}:{bound_port}")
        time.sleep(0.01)
    return RunningServer(server=server, thread=thread, host=host, port=bound_port)


@contextlib.contextmanager
def serving(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[RunningServer]:  # type: ignore[no-untyped-def]
    """Context manager form of :func:`start_in_thread`."""
    running = start_in_thread(app, host, port)
    try:
        yield running
    finally:
        running.stop()


def run_foreground(  # type: ignore[no-untyped-def]
    app, sock: socket.socket, log_level: str = "info", on_started: Callable[[], None] | None = None
) -> None:
    """Serve on an already bound socket until Ctrl-C (the CLI path); ``on_started`` runs once it accepts."""
    keep_freed_memory()
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn_config(app, host, port, log_level))
    guard_log_volume()  # after uvicorn configured its handlers
    freeze_startup_objects()  # last: the app, the services and uvicorn's config are built
    if on_started is not None:

        def announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.02)
            if server.started:
                on_started()

        threading.Thread(target=announce, name="rollserve-announce", daemon=True).start()
    # uvicorn shuts down on the first Ctrl-C, then raises it again for its caller, which
    # ``uvicorn.run`` swallows: a finished shutdown is no error to report (exit 0, no traceback).
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
