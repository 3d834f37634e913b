"""The one way to run the ASGI app: uvicorn, in the foreground (CLI) or on a thread (tests, demo, bench)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn


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
    """Uvicorn settings shared by every way of starting the server."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ws="websockets-sansio",
        ws_max_size=2**31 - 1,  # frame limits are enforced by our own codec, with typed errors
        ws_per_message_deflate=False,
        lifespan="on",
        access_log=False,
    )


def start_in_thread(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> RunningServer:  # type: ignore[no-untyped-def]
    """Start uvicorn on a thread and wait until it accepts connections."""
    server = uvicorn.Server(uvicorn_config(app, host, port))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, name="rollserve-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"uvicorn failed to start on {host}:{port}")
        time.sleep(0.01)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(server=server, thread=thread, host=host, port=bound_port)


@contextlib.contextmanager
def serving(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[RunningServer]:  # type: ignore[no-untyped-def]
    """Context manager form of :func:`start_in_thread`."""
    running = start_in_thread(app, host, port)
    try:
        yield running
    finally:
        running.stop()


def run_foreground(app, host: str, port: int, log_level: str = "info") -> None:  # type: ignore[no-untyped-def]
    """Block serving until Ctrl-C (the CLI path)."""
    uvicorn.Server(uvicorn_config(app, host, port, log_level)).run()
