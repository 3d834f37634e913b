"""A replica's side of the shared committed-state table: the :class:`SessionStore` it serves from.

Each replica keeps a view (a ``RolloutSession`` with its own lock) of the sessions it served. The
view is only a cache (affinity): every request first asks the table (``open``), which answers
with the counters and seed sequence alone when the view's ``(incarnation, epoch,
committed_step_id)`` is current and with the whole record otherwise (the incarnation because a
client may reuse an id once its session is gone, and the new session can reach the same
counters). A commit is the table's compare-and-set (on the incarnation too); when it loses, the
view is refreshed from the table and ``RolloutService`` checks the request again, so the loser of
a race gets the stored result just as a duplicate does. Two round trips per step, the state crossing once."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from rollserve.scale.table import RECORD_FIELDS, change_of, from_record, to_record, view_of
from rollserve.server.rollout.store import Commit, RolloutError, RolloutSession, apply_commit

COUNT_EVERY_S = 1.0
TableCall = Callable[..., Awaitable[Any]]  # (method name, *args) -> the table's answer


class SharedRolloutStore:
    """Sessions whose committed state lives in a :class:`~rollserve.scale.table.SessionTable`."""

    def __init__(self, call: TableCall, capacity: int, *, max_views: int = 4096) -> None:
        self._call = call
        self.capacity = capacity  # the deployment's; the table enforces it
        self._views: OrderedDict[str, RolloutSession] = OrderedDict()
        self._max_views = max_views
        self._counted_at, self._count = -COUNT_EVERY_S, 0

    async def claim(self, session_id: str | None) -> str:
        return _unwrap(await self._call("claim", session_id))

    async def insert(self, session: RolloutSession) -> RolloutSession:
        """Add ``session``; a fork takes what the table gave it as it landed: its source's latest
        committed state and the seed sequence the table drew for it from the source's."""
        source = None if session.forked_from is None else self._views.get(session.forked_from)
        incarnation = None if source is None else source.incarnation
        session.last_used, forked = _unwrap(await self._call("insert", to_record(session), incarnation))
        for name, value in (forked or {}).items():
            setattr(session, name, value)
        self._keep(session)
        return session

    async def open(
        self, session_id: str, *, include_closed: bool = False, touch: bool = True
    ) -> RolloutSession:
        view = self._views.get(session_id)
        have = None if view is None or view.closed else view_of(view)
        answer = await self._call("open", session_id, include_closed, have, touch)
        if answer[0] == "error" and view is not None:
            self._views.pop(session_id, None)
            view.closed_reason = "expired" if answer[1] == "session_expired" else "closed"
        record = _unwrap(answer)
        if view is not None and not _whole(record):  # our copy is current: only counters came
            self._keep(view)
        return self._refresh(session_id, record)

    async def find(self, session_id: str) -> RolloutSession | None:
        record = await self._call("find", session_id)
        return None if record is None else self._refresh(session_id, record)

    async def commit(self, session: RolloutSession, change: Commit) -> bool:
        # a reset's seed sequence lands only over the sequence it was drawn from (as this view has it)
        seeds_base = None if change.seeds is None else session.seeds.bit_generator.state
        answer = await self._call(
            "commit", session.session_id, change_of(change), session.incarnation, seeds_base
        )
        if answer[0] == "ok":
            apply_commit(session, change)
            session.last_used = answer[1]
            return True
        self._refresh(session.session_id, _unwrap(("ok", answer[1]) if answer[0] == "conflict" else answer))
        return False

    async def retire(self, session_id: str) -> RolloutSession:
        session = self._refresh(session_id, _unwrap(await self._call("retire", session_id)))
        self._views.pop(session_id, None)
        return session

    async def count(self) -> int:
        """The deployment's open sessions, asked at most once a second (it only feeds a gauge)."""
        now = time.monotonic()
        if now - self._counted_at >= COUNT_EVERY_S:
            self._counted_at, self._count = now, int(await self._call("count"))
        return self._count

    def _refresh(self, session_id: str, record: dict[str, Any]) -> RolloutSession:
        """Bring the view up to ``record`` in place (its lock stays the one waiters hold)."""
        view = self._views.get(session_id)
        if view is None:
            view = from_record({name: record.get(name) for name in RECORD_FIELDS})
            if not view.closed:
                self._keep(view)
            return view
        for name, value in record.items():
            setattr(view, name, value)
        self._views.move_to_end(session_id)
        if view.closed:
            self._views.pop(session_id, None)
        return view

    def _keep(self, session: RolloutSession) -> None:
        self._views[session.session_id] = session
        self._views.move_to_end(session.session_id)
        while len(self._views) > self._max_views:
            oldest, view = next(iter(self._views.items()))
            if view.lock.locked():
                break  # never drop a view a request is using; the cache may run over a little
            self._views.pop(oldest)


def _whole(record: dict[str, Any]) -> bool:
    return "session_id" in record


def _unwrap(answer: Any) -> Any:
    if answer[0] == "ok":
        return answer[1]
    _, code, message, committed, context = answer
    raise RolloutError(code, message, committed_step_id=committed, context_length=context)
