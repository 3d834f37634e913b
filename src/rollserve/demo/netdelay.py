"""A loopback TCP proxy that adds a fixed network delay: the demo's honest "remote" link.

Every chunk of bytes read on one side is written to the other side ``one_way_s`` later, in order,
in each direction, so a request/reply round trip takes at least ``round_trip_ms`` more than it
would directly. Bandwidth is not limited and nothing is dropped. It runs its own asyncio loop on a
background thread, so any client (websockets, HTTP) connects to it as to the server.
"""

from __future__ import annotations

import asyncio
import threading

READ_SIZE = 1 << 16


class DelayProxy:
    """``127.0.0.1:port`` forwards to ``target_host:target_port`` with ``round_trip_ms / 2`` each way."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        round_trip_ms: float,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if round_trip_ms < 0:
            raise ValueError(f"round_trip_ms must be >= 0, got {round_trip_ms}")
        self.target = (target_host, target_port)
        self.one_way_s = round_trip_ms / 2000.0
        self.host = host
        self.port = port
        self.bytes_forwarded = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle (called from any thread) --------------------------------------------------------
    def start(self) -> DelayProxy:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, self.host, self.port)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # reported to start()'s caller
                errors.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="rollserve-netdelay", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- inside the loop ---------------------------------------------------------------------------
    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro) -> asyncio.Task[None]:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        pipes = [
            self._spawn(self._pipe(client_reader, server_writer)),
            self._spawn(self._pipe(server_reader, client_writer)),
        ]
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            server_writer.close()
            client_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each piece written ``one_way_s`` after it was read.

        A clean end of input is passed on (half-close) after the data before it; an error closes
        ``writer``, which ends the other direction too.
        """
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await pending.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                self.bytes_forwarded += len(data)  # counted first: the peer may read it at once
                writer.write(data)
                await writer.drain()

        deliverer = self._spawn(deliver())
        try:
            while True:
                data = await reader.read(READ_SIZE)
                pending.put_nowait((loop.time() + self.one_way_s, data))
                if not data:
                    break
            await deliverer
        except (OSError, asyncio.IncompleteReadError):
            deliverer.cancel()
            writer.close()
        except asyncio.CancelledError:
            deliverer.cancel()
            raise
