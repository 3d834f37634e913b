"""The committed state of every rollout session of a deployment, in one place every replica reaches.

:class:`SessionTable` is the logic of the Ray actor that holds it (``scale.actor``), kept free of Ray
so it is tested directly. It reuses :class:`RolloutStore` for ids, capacity (so capacity is per
deployment), idle expiry and tombstones, and adds the compare-and-set commit. Every method runs
to completion before the next starts (an actor runs one call at a time), so each is atomic.

Answers are plain tuples and dicts (``("ok", value)`` or ``("error", code, message, committed)``):
they cross process boundaries, and exceptions with keyword state do not pickle reliably.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from rollserve.server.rollout.store import (
    Commit,
    RolloutError,
    RolloutSession,
    RolloutStore,
    apply_commit,
    fork_draw,
)

# Everything a replica needs to serve a session; the lock is each process's own.
RECORD_FIELDS = tuple(f.name for f in fields(RolloutSession) if f.name != "lock")
# What a replica's cached view needs refreshed when its state is already current (affinity): the
# seed sequence too, which a fork on any replica advances without moving the counters.
COUNTER_FIELDS = ("epoch", "committed_step_id", "context_length", "closed_reason", "last_used", "seeds")
# What a fork takes from its source's committed state, as the table holds it when the fork lands
# (what a commit can move; the rest is the source's for its whole life or the fork's own).
FORK_COPIES = ("state", "root", "observation", "committed_step_id", "context_length", "last", "frames")

Answer = tuple[Any, ...]
View = tuple[str, int, int]  # (incarnation, epoch, committed_step_id)


def to_record(session: RolloutSession) -> dict[str, Any]:
    return {name: getattr(session, name) for name in RECORD_FIELDS}


def from_record(record: dict[str, Any]) -> RolloutSession:
    return RolloutSession(**{name: record[name] for name in RECORD_FIELDS})


def change_of(change: Commit) -> dict[str, Any]:
    """A :class:`Commit` as plain values (its ``base`` is sent beside it)."""
    return {f.name: getattr(change, f.name) for f in fields(Commit)}


def view_of(session: RolloutSession) -> View:
    """What makes a copy of a session current: which session of its id, and its committed counters."""
    return (session.incarnation, session.epoch, session.committed_step_id)


def _refusal(exc: RolloutError) -> Answer:
    return ("error", exc.code, exc.message, exc.committed_step_id, exc.context_length)


class SessionTable:
    """Sessions' committed state, capacity and expiry for the whole deployment."""

    def __init__(
        self, capacity: int, idle_ttl_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sessions = RolloutStore(capacity, idle_ttl_s, clock=clock)
        self.commits = self.conflicts = 0

    def configure(self, capacity: int, idle_ttl_s: float) -> None:
        """Take a new deploy's limits: the table outlives a deployment, so a redeploy finds it running
        with its sessions. Open sessions above a lowered capacity stay; new ones are refused."""
        self.sessions.capacity, self.sessions.idle_ttl_s = capacity, idle_ttl_s

    def claim(self, session_id: str | None) -> Answer:
        try:
            return ("ok", self.sessions.reserve(session_id))
        except RolloutError as exc:
            return _refusal(exc)

    def insert(self, record: dict[str, Any], source_incarnation: str | None = None) -> Answer:
        """Add the session; answers ``(last_used, forked)``, ``forked`` None unless it is a fork.

        A fork (``forked_from``) lands only while its source is still the session
        ``source_incarnation`` the replica opened, and takes from the source as the table holds it
        when it lands, in this one atomic call (as one process forks under the source's lock): the
        committed state (``FORK_COPIES``, so a step another replica committed after the replica's
        open is in the fork) and its seed sequence, drawn from the source's, which keeps the
        advanced sequence. ``forked`` holds those fields for the replica's copy. The id is reserved
        once (by ``add``), after the source check, in one process's order; a refused fork draws
        nothing."""
        session = from_record(record)
        try:
            source = None
            if session.forked_from is not None:
                source = self._source(session.forked_from, source_incarnation, session.committed_step_id)
            self.sessions.add(session)
        except RolloutError as exc:
            return _refusal(exc)
        if source is None:
            return ("ok", (session.last_used, None))
        for name in FORK_COPIES:
            setattr(session, name, getattr(source, name))
        session.seeds, source.seeds = fork_draw(source.seeds)
        return ("ok", (session.last_used, {name: getattr(session, name) for name in (*FORK_COPIES, "seeds")}))

    def _source(self, source_id: str, incarnation: str | None, committed: int) -> RolloutSession:
        """A fork's open source; refused when it closed, expired, or is a later session with its id
        (``incarnation`` names the one the fork copied, at step ``committed``)."""
        source = self.sessions.get(source_id)
        if incarnation is not None and source.incarnation != incarnation:
            raise RolloutError(
                "session_closed", f"session {source_id!r} is closed", committed_step_id=committed
            )
        return source

    def open(self, session_id: str, include_closed: bool, have: View | None, touch: bool = True) -> Answer:
        """The session (touched unless ``touch`` is False: a status read is not use), whole, or only
        its counters and seed sequence when ``have`` shows the caller's copy of the state is
        current: then the state does not cross the wire. ``have`` names the incarnation too:
        counters alone cannot tell a new session with a reused id from the old."""
        try:
            session = self.sessions.get(session_id, include_closed=include_closed, touch=touch)
        except RolloutError as exc:
            return _refusal(exc)
        current = have is not None and not session.closed and tuple(have) == view_of(session)
        if current:
            return ("ok", {name: getattr(session, name) for name in COUNTER_FIELDS})
        return ("ok", to_record(session))

    def find(self, session_id: str) -> dict[str, Any] | None:
        session = self.sessions.peek(session_id)
        return None if session is None else to_record(session)

    def commit(
        self, session_id: str, change: dict[str, Any], incarnation: str, seeds_base: Any = None
    ) -> Answer:
        """Compare-and-set: lands only if the session is still ``incarnation`` at ``change["base"]``
        and, for a change that sets the seed sequence (a reset), still has the sequence the writer
        read (``seeds_base``, its generator's state): a fork on another replica draws from the
        sequence without moving the counters, and a reset drawn before that fork must not put back
        the state the fork drew from. Otherwise (a racing replica committed first, a reset, a fork's
        draw, a close or expiry, the id reused by a new session) nothing changes and the caller gets
        the session as it is, to check its request again."""
        try:
            session = self.sessions.get(session_id)
        except RolloutError as exc:
            session = self.sessions.peek(session_id)
            if session is None:
                return _refusal(exc)
            self.conflicts += 1
            return ("conflict", to_record(session))
        moved = change["seeds"] is not None and session.seeds.bit_generator.state != seeds_base
        if moved or view_of(session) != (incarnation, *change["base"]):
            self.conflicts += 1
            return ("conflict", to_record(session))
        apply_commit(session, Commit(**change))
        self.commits += 1
        return ("ok", session.last_used)

    def retire(self, session_id: str) -> Answer:
        try:
            session = self.sessions.close(session_id)
        except RolloutError as exc:
            return _refusal(exc)
        return ("ok", to_record(session))

    def count(self) -> int:
        self.sessions.sweep()
        return len(self.sessions)

    def stats(self) -> dict[str, int]:
        """For ``/metrics`` and ``/v1/models``: what the whole deployment holds."""
        return {
            "sessions": self.count(),
            "capacity": self.sessions.capacity,
            "commits": self.commits,
            "conflicts": self.conflicts,
        }
