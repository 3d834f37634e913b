"""Who holds the policy websockets: a cap per client address and in all, and an idle deadline per
connection.

Sessions are a shared, limited resource (``--max-sessions``). Without these, one address could open
them all, and clients that connect and then go quiet (answering pings, or half-open) would hold
them until the TCP stack gave up. Pings never count as activity: only frames the app receives do.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable

from starlette.websockets import WebSocket

IDLE_CLOSE_CODE = 1001  # "going away": the server closes an idle connection


class AddressLimiter:
    """At most ``per_address`` open policy connections per client address, and ``total`` in all.

    ``total`` is ``--max-connections``: uvicorn's own cap (``limit_concurrency``) is checked for
    plain HTTP requests only, never for a websocket upgrade, so without this count any number of
    policy websockets could be open. Thread-safe.
    """

    def __init__(self, per_address: int, total: int | None = None) -> None:
        self.per_address = per_address
        self.total = total
        self._open: Counter[str] = Counter()
        self._count = 0
        self._lock = threading.Lock()

    def refusal(self, address: str) -> str | None:
        """Admit one connection from ``address`` (None: it holds a slot until :meth:`release`),
        or say which limit refuses it."""
        with self._lock:
            if self.total is not None and self._count >= self.total:
                return f"server is at its limit of {self.total} policy connections"
            if self._open[address] >= self.per_address:
                return f"{self.per_address} connections from one address is the limit"
            self._open[address] += 1
            self._count += 1
            return None

    def release(self, address: str) -> None:
        with self._lock:
            self._count -= 1
            self._open[address] -= 1
            if self._open[address] <= 0:
                del self._open[address]

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._count


def client_address(websocket: WebSocket) -> str:
    client = websocket.scope.get("client")
    return str(client[0]) if client else "unknown"


class IdleWatch:
    """Closes the websocket once nothing arrived for ``timeout_s`` and no request is in flight.

    One sleeping task per connection; a received frame costs one clock read (``touch``).
    """

    def __init__(
        self, websocket: WebSocket, timeout_s: float, busy: Callable[[], bool] = lambda: False
    ) -> None:
        self.ws = websocket
        self.timeout_s = timeout_s
        self.busy = busy
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._task = asyncio.ensure_future(self._watch())

    def touch(self) -> None:
        self.last = self.loop.time()

    async def _watch(self) -> None:
        while True:
            left = self.last + self.timeout_s - self.loop.time()
            if left <= 0 and not self.busy():
                break
            await asyncio.sleep(max(left, self.timeout_s / 8))
        with contextlib.suppress(Exception):  # the client may already be gone
            await self.ws.close(code=IDLE_CLOSE_CODE, reason=f"idle for {self.timeout_s:g} s")

    def stop(self) -> None:
        self._task.cancel()
