"""The one store of rollout sessions: ids, per-session locks, capacity and idle expiry.

It holds state and answers lookups; it knows no step rules (those live in ``rollout.service``).
All methods are synchronous and called from the event loop, so each is atomic; the per-session
``asyncio.Lock`` serialises the awaits of one session (a step waiting for the model, a reset).
Closed and expired sessions leave a small tombstone, so ``status`` still answers for them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class RolloutError(Exception):
    """A rollout request that cannot be served; ``code`` is the API error code clients see."""

    def __init__(self, code: str, message: str, *, committed_step_id: int = -1) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.committed_step_id = committed_step_id


@dataclass(frozen=True)
class StepRecord:
    """The committed result of a step, kept so a duplicate of it can be answered without the model."""

    step_id: int
    fingerprint: str
    observation: np.ndarray
    reward: float
    terminated: bool
    uncertainty: float | None
    info: dict[str, Any]


@dataclass
class RolloutSession:
    """One rollout: the committed world state and the counters that describe it.

    ``root`` is the episode's start state (what a stateless step starts from), ``observation`` what
    the client saw of the committed state, ``seeds`` draws the seed of each unseeded reset.
    """

    session_id: str
    model: str
    mode: str
    created_at: float
    state: Any
    root: Any
    observation: np.ndarray
    seeds: np.random.Generator
    last_used: float = 0.0
    committed_step_id: int = -1
    context_length: int = 0
    last: StepRecord | None = None
    forked_from: str | None = None
    closed_reason: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None


class RolloutStore:
    """Open sessions up to ``capacity``; a session idle longer than ``idle_ttl_s`` expires.

    At capacity, expired sessions are evicted first; live ones never are (that would break a
    trainer's rollout), so a full store refuses new sessions with ``at_capacity``.
    """

    def __init__(
        self,
        capacity: int,
        idle_ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tombstones: int = 4096,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.idle_ttl_s = idle_ttl_s
        self._clock = clock
        self._open: dict[str, RolloutSession] = {}
        self._tombstones: OrderedDict[str, RolloutSession] = OrderedDict()
        self._max_tombstones = max_tombstones
        self._last_sweep = clock()

    def __len__(self) -> int:
        return len(self._open)

    def new_id(self) -> str:
        return uuid.uuid4().hex

    def reserve(self, session_id: str | None) -> str:
        """An id that is free right now, or ``session_exists`` / ``at_capacity``."""
        self.sweep(force=True)
        sid = session_id or self.new_id()
        if sid in self._open or sid in self._tombstones:
            raise RolloutError("session_exists", f"session {sid!r} already exists")
        if len(self._open) >= self.capacity:
            raise RolloutError(
                "at_capacity", f"the server holds its maximum of {self.capacity} rollout sessions; close some"
            )
        return sid

    def add(self, session: RolloutSession) -> RolloutSession:
        self.reserve(session.session_id)
        session.last_used = self._clock()
        self._open[session.session_id] = session
        return session

    def peek(self, session_id: str) -> RolloutSession | None:
        """The session, open or closed, without touching it or raising."""
        return self._open.get(session_id) or self._tombstones.get(session_id)

    def get(self, session_id: str, *, include_closed: bool = False) -> RolloutSession:
        """An open session (touched), or a tombstone when ``include_closed``; raises otherwise."""
        self.sweep()
        session = self._open.get(session_id)
        if session is not None and self._expired(session):
            self._retire(session, "expired")
            session = None
        if session is not None:
            session.last_used = self._clock()
            return session
        tomb = self._tombstones.get(session_id)
        if tomb is None:
            raise RolloutError("session_not_found", f"session {session_id!r} does not exist")
        if include_closed:
            return tomb
        raise closed_error(tomb)

    def close(self, session_id: str) -> RolloutSession:
        """Release the session's state; closing twice is fine. Unknown ids raise."""
        session = self._open.get(session_id)
        if session is not None:
            self._retire(session, "closed")
            return session
        tomb = self._tombstones.get(session_id)
        if tomb is None:
            raise RolloutError("session_not_found", f"session {session_id!r} does not exist")
        return tomb

    def sweep(self, *, force: bool = False) -> list[str]:
        """Expire idle sessions (at most every quarter TTL unless forced); returns the expired ids."""
        now = self._clock()
        if not force and now - self._last_sweep < self.idle_ttl_s / 4:
            return []
        self._last_sweep = now
        expired = [s for s in self._open.values() if self._expired(s)]
        for session in expired:
            self._retire(session, "expired")
        return [s.session_id for s in expired]

    def _expired(self, session: RolloutSession) -> bool:
        busy = session.lock.locked()
        return not busy and self._clock() - session.last_used > self.idle_ttl_s

    def _retire(self, session: RolloutSession, reason: str) -> None:
        self._open.pop(session.session_id, None)
        session.closed_reason = reason
        session.state = session.root = None
        session.last = None
        self._tombstones[session.session_id] = session
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)


def closed_error(session: RolloutSession) -> RolloutError:
    """``session_closed`` or ``session_expired`` for a retired session, with its last committed step."""
    code = "session_expired" if session.closed_reason == "expired" else "session_closed"
    message = f"session {session.session_id!r} is {session.closed_reason}"
    return RolloutError(code, message, committed_step_id=session.committed_step_id)
