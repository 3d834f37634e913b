"""A growing delay for connections that keep sending refused input (``--refusal-delay-ms``).

Every refusal is cheap, but a client that sends nothing but bad input, as fast as the server
answers, still takes a share of the CPU from everyone else: a closed-loop client's rate is set by
how fast the server answers it. So each connection keeps a count of its refusals; when a refusal
brings it to k the server waits ``min(max_s, base_s * 2**(k-1))`` before it reads that connection's next
message (websockets) or sends the refusal (HTTP, where the next request cannot come sooner). An
accepted request halves the count (rounding down), so a client that never sends bad input never
waits, and one that sends a single bad frame waits ``base_s`` once and is forgiven by its next good
request (``max_s`` caps every delay, the first too). Halving, not resetting: a client that slips a
valid request in among every dozen refused ones keeps its delay (the hostile soak's session attacker
did, one valid frame in 16, and got twice the refusals a second of the others while the count was
reset). Only what the client got wrong counts (malformed, too large, invalid); the server's own
failures and "try later" answers do not.

Per connection, not per address: clients behind one address (NAT, one lab machine) must not slow
each other down. A client that reconnects after every refusal starts at zero again, but pays a
handshake each time, and the per-address connection cap bounds how many it holds at once.

Many such connections at once would still queue their inputs on the event loop ahead of a
healthy client's request, so a connection with a refusal streak also handles its next input in a
shared lane: at most ``lanes`` such inputs (per transport: websockets, REST) are being handled at
any time, the others wait their turn (first come, first served) and cost nothing while they wait.
A healthy request then waits behind at most that many hostile ones, however many connections send
them. No connection waits for the lane longer than ``LANE_WAIT_S`` (then it goes ahead), so one
that holds the lane for long (its client stopped reading its replies) cannot stall the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

SCOPE_KEY = "rollserve.refusals"  # an HTTP request's scope: its connection's RefusalStreak
_STRAIGHT = contextlib.nullcontext()
LANE_WAIT_S = 1.0  # the longest a connection waits for the lane


class RefusalStreak:
    """One connection's count of refused inputs (halved by each accepted one), whether its last
    input was refused, and (websockets) the loop time before which its next message is not read."""

    __slots__ = ("count", "refused_last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.refused_last = False
        self.until = 0.0


class RefusalPenalty:
    """The delay rule, shared by every connection. ``max_ms`` caps every delay, the first one too
    (also below ``base_ms``: it is the most one refusal is delayed); either at 0 turns it off."""

    def __init__(self, base_ms: float, max_ms: float, lanes: int = 1) -> None:
        self.base_s = max(0.0, base_ms) / 1000.0
        self.max_s = max(0.0, max_ms) / 1000.0
        self.on = self.base_s > 0.0 and self.max_s > 0.0
        self.lanes = lanes
        self._lane: asyncio.Semaphore | None = None  # made on first use, on the serving loop

    def lane(self, streak: RefusalStreak | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """Where a connection handles its next input: the shared lane when its last input was
        refused (and the delay is on), else straight away."""
        if streak is None or not streak.refused_last or not self.on or self.lanes <= 0:
            return _STRAIGHT
        if self._lane is None:
            self._lane = asyncio.Semaphore(self.lanes)
        return _Lane(self._lane)

    def refused(self, streak: RefusalStreak) -> float:
        """Count one more refusal; returns how long to hold the connection (seconds)."""
        if not self.on:
            return 0.0
        streak.count += 1
        streak.refused_last = True
        return min(self.max_s, self.base_s * 2.0 ** min(streak.count - 1, 62))

    @staticmethod
    def served(streak: RefusalStreak) -> None:
        """An accepted input: the count halves, and the next input is handled straight away."""
        streak.count //= 2
        streak.refused_last = False

    async def hold(self, streak: RefusalStreak) -> None:
        """Count a refusal and wait out its delay now (HTTP: before the refusal is sent)."""
        delay = self.refused(streak)
        if delay > 0.0:
            await asyncio.sleep(delay)

    def defer(self, streak: RefusalStreak) -> None:
        """Count a refusal whose delay is served before the connection's next message is read
        (websockets: the refusal itself goes out at once)."""
        delay = self.refused(streak)
        if delay > 0.0:
            streak.until = asyncio.get_running_loop().time() + delay

    @staticmethod
    async def before_next_read(streak: RefusalStreak) -> None:
        """Wait out what :meth:`defer` left, if anything."""
        if streak.until:
            left = streak.until - asyncio.get_running_loop().time()
            streak.until = 0.0
            if left > 0.0:
                await asyncio.sleep(left)


class _Lane:
    """Holding the shared lane for one input. A free lane is taken at once (no task, no timer: a
    flood of refused input passes here for every frame); a busy one is waited for up to
    ``LANE_WAIT_S``, then the input goes ahead outside it."""

    __slots__ = ("_held", "_semaphore")

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore, self._held = semaphore, False

    async def __aenter__(self) -> None:
        if self._semaphore.locked():
            try:
                async with asyncio.timeout(LANE_WAIT_S):
                    await self._semaphore.acquire()
            except TimeoutError:
                return  # waited long enough: go ahead outside the lane
        else:
            await self._semaphore.acquire()  # free: returns without suspending
        self._held = True

    async def __aexit__(self, *exc_info: object) -> None:
        if self._held:
            self._held = False
            self._semaphore.release()


def http_streak(scope: dict[str, Any]) -> RefusalStreak | None:
    """The streak of the HTTP connection that carried this request (None without rollserve's
    HTTP protocol, e.g. the h11 fallback or an in-process test client: then nothing is delayed)."""
    return scope.get(SCOPE_KEY)
