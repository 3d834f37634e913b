"""Where rollout sessions live: ids, per-session locks, capacity, idle expiry and the commit itself.

:class:`SessionStore` is the one interface ``rollout.service`` talks to; the service holds the step
rules, a store holds state. Two implementations share it: :class:`RolloutStore` (this process,
below) and ``rollserve.scale.store.SharedRolloutStore`` (committed state in a Ray actor, so any
replica can serve any session). A store's ``commit`` is a compare-and-set on the session's
``committed_step_id`` (and its reset ``epoch``): it lands only if nobody committed since the session
was read, which is what keeps steps exactly-once when two processes race the same step.

:class:`RolloutStore`'s methods are synchronous and called from the event loop, so each is atomic;
the per-session ``asyncio.Lock`` serialises the awaits of one session (a step waiting for the model,
a reset). Closed and expired sessions leave a small tombstone, so ``status`` still answers for them.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class RolloutError(Exception):
    """A rollout request that cannot be served; ``code`` is the API error code clients see."""

    def __init__(
        self, code: str, message: str, *, committed_step_id: int = -1, context_length: int = 0
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.committed_step_id = committed_step_id
        self.context_length = context_length  # of a retired session: what a refused step reports


@dataclass(frozen=True)
class Frames:
    """What a session sees next to its tensor when that is not the state: the state vector, and the
    camera images of a rendering session."""

    vector: np.ndarray | None
    images: dict[str, np.ndarray] | None


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
    actions: np.ndarray | None = None  # the action a world-action model chose, [1, action_dim]
    frames: Frames | None = None  # a rendering session's images and state vector


@dataclass
class RolloutSession:
    """One rollout: the committed world state and the counters that describe it.

    ``root`` is the episode's start state (what a stateless step starts from), ``observation`` what
    the client saw of the committed state, ``seeds`` draws the seed of each unseeded reset. A closed
    or expired session (a tombstone) holds None in all of them, and in ``frames``, ``last``, ``render``.
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
    epoch: int = 0  # raised by every reset, so a commit planned before a reset can never land after it
    committed_step_id: int = -1
    context_length: int = 0
    last: StepRecord | None = None
    forked_from: str | None = None
    closed_reason: str | None = None
    render: Any = None  # the session's RenderSpec (None: no frames), for its resets and fresh contexts
    jpeg_quality: int = 0  # how its images go on the wire (0: raw)
    frames: Frames | None = None  # the images and state vector of ``observation``
    # the print of the create that made it (None for a fork): a create with the same id is a retry
    # of that one only if it asks for the same thing
    created_by: str | None = None
    # which session of this id it is: a client may choose an id again once the first is gone, so a
    # cached copy (a Ray replica's view) must match this too, not only the counters, to be current
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None


@dataclass(frozen=True)
class Commit:
    """What a successful step (or a reset, with ``epoch + 1`` and ``root``) writes into a session.

    ``base`` is ``(epoch, committed_step_id)`` as the writer read them: the compare of the
    compare-and-set (the epoch makes a step planned before a reset lose to it, even when the new
    episode has reached the same step id meanwhile).
    """

    base: tuple[int, int]
    state: Any
    observation: np.ndarray
    committed_step_id: int
    context_length: int
    last: StepRecord | None
    epoch: int
    root: Any = None  # a new episode start (a reset's, a first step's own); None keeps the current one
    seeds: np.random.Generator | None = None  # a reset's seed sequence; None keeps the current one
    frames: Frames | None = None  # the images and state vector of ``observation``


class SessionStore(Protocol):
    """The interface ``RolloutService`` uses, whichever process holds the committed state.

    ``claim`` checks an id is free (and capacity left) before a world start is paid for; ``insert``
    adds the session atomically (the same refusals if another request won meanwhile). ``open``
    returns the caller's view of a session (its lock serialises this process's requests
    for it); ``commit`` lands only if the session is still at ``(epoch, committed_step_id)`` as that
    view shows it, else it refreshes the view and returns False: the caller re-checks its request
    against what the other writer committed (a duplicate then gets the stored result back).
    """

    capacity: int

    async def claim(self, session_id: str | None) -> str: ...
    async def insert(self, session: RolloutSession) -> RolloutSession: ...
    async def open(
        self, session_id: str, *, include_closed: bool = False, touch: bool = True
    ) -> RolloutSession: ...
    async def find(self, session_id: str) -> RolloutSession | None: ...
    async def commit(self, session: RolloutSession, change: Commit) -> bool: ...
    async def retire(self, session_id: str) -> RolloutSession: ...
    async def count(self) -> int: ...


def new_session_id() -> str:
    """A server-made session id (a client may choose its own)."""
    return uuid.uuid4().hex


def fork_draw(source_seeds: np.random.Generator) -> tuple[np.random.Generator, np.random.Generator]:
    """A fork's seed sequence, drawn from its source's, and the source's sequence after the draw: a
    copy, which the source keeps only once the fork exists (a refused fork draws nothing). The one
    rule for one process and for the shared (Ray) table alike."""
    draws = copy.deepcopy(source_seeds)
    return np.random.default_rng(draws.integers(2**63)), draws


def apply_commit(session: RolloutSession, change: Commit) -> None:
    """Move a session to a committed change in one synchronous assignment."""
    session.state, session.observation, session.last = change.state, change.observation, change.last
    session.committed_step_id, session.context_length = change.committed_step_id, change.context_length
    session.epoch = change.epoch
    session.frames = change.frames
    if change.root is not None:
        session.root = change.root
    if change.seeds is not None:
        session.seeds = change.seeds


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
        return new_session_id()

    def reserve(self, session_id: str | None) -> str:
        """An id that is free right now, or ``session_exists`` (with the committed step of the session,
        open or closed, that holds the id) / ``at_capacity``."""
        self.sweep(force=True)
        sid = session_id or self.new_id()
        holder = self.peek(sid)
        if holder is not None:
            message = f"session {sid!r} already exists"
            raise RolloutError("session_exists", message, committed_step_id=holder.committed_step_id)
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

    def get(self, session_id: str, *, include_closed: bool = False, touch: bool = True) -> RolloutSession:
        """An open session (touched, unless ``touch`` is False: a read that is not use), or a
        tombstone when ``include_closed``; raises otherwise."""
        self.sweep()
        session = self._open.get(session_id)
        if session is not None and self._expired(session):
            self._retire(session, "expired")
            session = None
        if session is not None:
            if touch:
                session.last_used = self._clock()
            return session
        tomb = self._tombstones.get(session_id)
        if tomb is None:
            raise RolloutError("session_not_found", f"session {session_id!r} does not exist")
        if include_closed:
            return tomb
        raise closed_error(tomb)

    def touch(self, session: RolloutSession) -> None:
        """Mark the session used now (after a long step, so it does not expire right after it)."""
        if not session.closed:
            session.last_used = self._clock()

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

    # -- SessionStore: this process holds the committed state, so every call is local and atomic ---------
    async def claim(self, session_id: str | None) -> str:
        return self.reserve(session_id)

    async def insert(self, session: RolloutSession) -> RolloutSession:
        """Add ``session``; a fork's seed sequence is drawn from its open source's as it lands."""
        source = None if session.forked_from is None else self.get(session.forked_from)
        self.add(session)
        if source is not None:
            session.seeds, source.seeds = fork_draw(source.seeds)
        return session

    async def open(
        self, session_id: str, *, include_closed: bool = False, touch: bool = True
    ) -> RolloutSession:
        return self.get(session_id, include_closed=include_closed, touch=touch)

    async def find(self, session_id: str) -> RolloutSession | None:
        return self.peek(session_id)

    async def commit(self, session: RolloutSession, change: Commit) -> bool:
        if session.closed or (session.epoch, session.committed_step_id) != change.base:
            return False
        apply_commit(session, change)
        return True

    async def retire(self, session_id: str) -> RolloutSession:
        return self.close(session_id)

    async def count(self) -> int:
        return len(self._open)

    def live(self) -> int:
        """Open sessions that have not expired, counted without changing anything: a metrics
        scrape calls it (from any thread), and an idle server's expired sessions must not count."""
        return sum(not self._expired(session) for session in list(self._open.values()))

    def _expired(self, session: RolloutSession) -> bool:
        busy = session.lock.locked()
        return not busy and self._clock() - session.last_used > self.idle_ttl_s

    def _retire(self, session: RolloutSession, reason: str) -> None:
        self._open.pop(session.session_id, None)
        session.closed_reason = reason
        _free(session)
        self._tombstones[session.session_id] = session
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)


def _free(session: RolloutSession) -> None:
    """Drop what only an open session uses, in place (requests queued on it see it closed): up to
    4096 tombstones must not keep states, observations and camera frames (~1 MiB each at 256x256).
    Kept: ids, ``model``, the counters and ``closed_reason``, which ``status`` and refusals report."""
    session.state = session.root = session.observation = None
    session.frames = session.last = session.seeds = session.render = None


def closed_error(session: RolloutSession) -> RolloutError:
    """``session_closed`` or ``session_expired`` for a retired session, with its last committed step."""
    code = "session_expired" if session.closed_reason == "expired" else "session_closed"
    message = f"session {session.session_id!r} is {session.closed_reason}"
    return RolloutError(
        code, message, committed_step_id=session.committed_step_id, context_length=session.context_length
    )
