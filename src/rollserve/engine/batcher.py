"""One worker thread that owns a model and groups concurrent requests into batches.

Transports submit from the event loop and await; the model runs only in this thread, so the event
loop keeps serving every other client while inference runs. Requests tagged with the same key (a
session) supersede each other while they wait: only the newest observation of a session is worth
inferring.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")

RunBatch = Callable[[list[Req]], Sequence["Res | BaseException"]]
# told of every model call, on the thread that made it: (seconds it ran, requests in it)
OnBatch = Callable[[float, int], None]
# asked of each queued request as a batch is formed: the error to answer it with instead of running it
Skip = Callable[[Any], "BaseException | None"]

logger = logging.getLogger(__name__)

_RUNS_BEFORE_INLINE = 3  # calls measured (on the thread at first) that decide whether to run inline
_SLOW_INLINE_FACTOR = 4.0  # an inline call this many times over the bound sends the model back at once


class Superseded(Exception):
    """A newer request of the same key arrived before this one was run."""

    def __init__(self) -> None:
        super().__init__("superseded by a newer request of the same session")


class EngineClosed(RuntimeError):
    """The worker was shut down; no more requests are accepted."""


@dataclass
class Completed(Generic[Res]):
    """A result with the timings a server reports back to its client."""

    value: Res
    queue_wait_s: float
    run_s: float
    batch_size: int


class _Group:
    """The requests of one ``submit_many``: each outcome lands in one list, and the last one wakes
    the waiting event loop once. No future per request: a concurrent future allocates a lock and a
    condition, and settling 32 of them cost ~0.3 ms of CPU per 32-item ``batch_step``."""

    __slots__ = ("cancelled", "countdown", "done", "loop", "outcomes")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.outcomes: list[Any] = [None] * size
        self.countdown = itertools.count(size - 1, -1)  # next() is atomic: outcomes may race
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.cancelled = False  # the caller gave up: requests not yet started are skipped

    def settle(self, index: int, outcome: Any) -> None:
        self.outcomes[index] = outcome
        if next(self.countdown) == 0:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self.loop.call_soon_threadsafe(_set_if_pending, self.done)


@dataclass
class _Pending:
    """One queued request, and the future its caller waits on.

    An async caller waits on a future of its own event loop, settled with one
    ``call_soon_threadsafe`` (about 40 µs less per request on a round trip than a concurrent future
    wrapped for asyncio); threads and callbacks get a concurrent future; the requests of one
    ``submit_many`` share a :class:`_Group` instead (``future`` is then None).
    """

    item: Any
    key: Hashable | None
    future: Future | asyncio.Future | None = field(default_factory=Future)
    loop: asyncio.AbstractEventLoop | None = None  # set when ``future`` belongs to this loop
    enqueued: float = field(default_factory=time.perf_counter)
    group: _Group | None = None
    index: int = 0  # the request's place in its group

    def start(self) -> bool:
        """Whether the caller still wants the outcome; a concurrent future is marked running."""
        if self.group is not None:
            return not self.group.cancelled  # a benign race: a late outcome is simply not read
        if self.loop is None:
            return self.future.set_running_or_notify_cancel()  # type: ignore[union-attr]
        return not self.future.cancelled()  # type: ignore[union-attr]  # a late cancel is ignored by _settle

    def finish(self, outcome: Any) -> None:
        """Hand over a :class:`Completed` or an exception; callable from any thread."""
        if self.group is not None:
            self.group.settle(self.index, outcome)
        elif self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self.loop.call_soon_threadsafe(_settle, self.future, outcome)
        elif isinstance(outcome, BaseException):
            self.future.set_exception(outcome)  # type: ignore[union-attr]
        else:
            self.future.set_result(outcome)  # type: ignore[union-attr]


@dataclass
class EngineStats:
    """Counters a test or a benchmark reads to see what the worker did."""

    batches: int = 0
    items: int = 0
    superseded: int = 0
    skipped: int = 0  # answered by ``skip`` without running
    max_batch_seen: int = 0


class BatchingWorker(Generic[Req, Res]):
    """Runs ``run_batch(items) -> results`` (one result or exception per item) in one thread.

    ``max_batch_size=1`` serves requests one at a time (still off the event loop). With a larger
    size, the worker waits up to ``max_wait_s`` for more requests to join a batch, but only for as
    many as it has reason to expect: the size of the previous batch plus what queued up while it
    ran. A client that has been alone since its previous request is not delayed (the worker expects
    one); a group of clients in lock-step is gathered into one call. After a batch of several, a
    lone request waits up to ``max_wait_s`` for the others it expects (the price of batching).

    ``inline_below_s`` > 0 lets :meth:`submit` run a request on the caller's event loop, skipping
    the two thread hand-offs (~0.1 ms on a VM, more than a cheap model costs), but only when the
    worker is idle (nothing queued or running) and the model's recent calls measured cheaper: the
    fastest of the last three wall-clock times (a busy machine only ever adds to a call's time),
    below ``inline_below_s``. Until three calls are measured on the thread, nothing runs inline; a
    model that turns slow is back on the thread after at most three calls, and after one call
    slower than ``4 * inline_below_s``, which also starts the measuring afresh.

    ``on_batch(run_s, size)`` is called once per model call (on the thread or inline), before its
    requests are answered: the place for per-batch metrics, which a caller that sees only its own
    request would record once per request. It must be cheap; what it raises is logged, not raised.

    ``skip(item)`` is asked of each queued request as the worker thread forms a batch, under the
    worker's lock (it must be cheap and must not wait on this worker): an exception it returns
    answers the request instead of a result, and the request never reaches the model nor takes a
    place in the batch (a request whose outcome is already decided, e.g. one the server would
    refuse anyway once it ran). Only what ran is timed and counted. A request run inline at
    :meth:`submit` is not asked: it never waited. What ``skip`` raises is logged; the request runs.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch_size: int = 1,
        max_wait_s: float = 0.0,
        name: str = "rollserve-engine",
        inline_below_s: float = 0.0,
        on_batch: OnBatch | None = None,
        skip: Skip | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._run_batch = run_batch
        self._on_batch = on_batch
        self._skip = skip
        self.max_batch_size = max_batch_size
        self.max_wait_s = max(0.0, max_wait_s)
        self.stats = EngineStats()
        self._pending: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._expected_batch = 1  # requests the next batch can expect (adapts to the live load)
        self._free_since = 0.0  # when the model last finished; waiting for a batch starts then
        self.inline_below_s = max(0.0, inline_below_s)
        self._busy = False  # a batch is running, on the thread or inline
        self._recent_runs: deque[float] = deque(maxlen=_RUNS_BEFORE_INLINE)  # seconds per batch
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- submitting ------------------------------------------------------------------------------
    def submit_future(self, item: Req, *, key: Hashable | None = None) -> Future:
        """Queue one request; the future resolves to a :class:`Completed` or raises its error."""
        pending = _Pending(item=item, key=key)
        self._enqueue(pending)
        return pending.future  # type: ignore[return-value]

    async def submit(self, item: Req, *, key: Hashable | None = None) -> Completed[Res]:
        """Await one request from the event loop without blocking it (cancelling it skips it if queued).

        A request it supersedes raises :class:`Superseded` on this loop before this one can finish.
        """
        if self.inline_below_s > 0 and (done := self._run_inline(item)) is not None:
            if isinstance(done, BaseException):
                raise done
            return done
        loop = asyncio.get_running_loop()
        pending = _Pending(item=item, key=key, future=loop.create_future(), loop=loop)
        self._enqueue(pending)
        return await pending.future  # type: ignore[no-any-return]

    def runs_inline_now(self) -> bool:
        """Whether a :meth:`submit` made now, before anything else is queued, runs on the caller's
        thread (so an event loop may await it in place instead of in a task of its own)."""
        if self.inline_below_s <= 0:
            return False
        with self._cond:
            return not (self._busy or self._pending or self._closed) and self._measured_cheap_locked()

    def _run_inline(self, item: Req) -> Completed[Res] | BaseException | None:
        """Run ``item`` on this thread if the worker is idle and the model measured cheap; else None."""
        with self._cond:
            if self._closed:
                raise EngineClosed("inference engine is shut down")
            if self._busy or self._pending or not self._measured_cheap_locked():
                return None
            self._busy = True
        started = time.perf_counter()
        try:
            results = list(self._run_batch([item]))
            outcome = results[0] if len(results) == 1 else RuntimeError("run_batch returned no single result")
        except BaseException as exc:
            outcome = exc
        run_s = time.perf_counter() - started
        with self._cond:
            self._busy = False
            self._note_run_locked(run_s, 1)
            if run_s > _SLOW_INLINE_FACTOR * self.inline_below_s:
                self._recent_runs.clear()  # clearly slow: measure on the thread again
            if self._pending:  # queued by another thread meanwhile (waking the worker for nothing costs)
                self._cond.notify()
        self._report(run_s, 1)
        if isinstance(outcome, BaseException):
            return outcome
        return Completed(outcome, 0.0, run_s, batch_size=1)

    def _measured_cheap_locked(self) -> bool:
        runs = self._recent_runs
        return len(runs) == _RUNS_BEFORE_INLINE and min(runs) < self.inline_below_s

    def _report(self, run_s: float, size: int) -> None:
        """Tell ``on_batch`` of one model call; a failing callback never fails the requests."""
        if self._on_batch is None:
            return
        try:
            self._on_batch(run_s, size)
        except Exception:
            logger.exception("the engine's on_batch callback failed")

    def _note_run_locked(self, run_s: float, size: int) -> None:
        """Book one finished batch: counters, the batch the next one can expect, the recent cost."""
        self._expected_batch = size + len(self._pending)
        self._free_since = time.perf_counter()
        self._recent_runs.append(run_s)
        self.stats.batches += 1
        self.stats.items += size
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, size)

    async def submit_many(self, items: Sequence[Req]) -> list[Completed[Res] | BaseException]:
        """Queue several requests together (they land in the same batch when the size allows).

        The event loop is woken once, when the last of them is done, not once per item: for a
        32-item ``batch_step`` that is ~20 µs less per item. The outcomes are collected in one
        :class:`_Group`, without a future per item.
        """
        if not items:
            return []
        group = _Group(len(items), asyncio.get_running_loop())
        self._enqueue(
            *(
                _Pending(item=item, key=None, future=None, group=group, index=i)
                for i, item in enumerate(items)
            )
        )
        try:
            await group.done
        except asyncio.CancelledError:
            group.cancelled = True  # those not started yet are skipped by the worker
            raise
        return group.outcomes

    def run_now(self, item: Req) -> Completed[Res]:
        """Blocking submit, for callers without an event loop (local engines, scripts)."""
        return self.submit_future(item).result()

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._pending)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: nothing is accepted any more (a health probe's 503)."""
        return self._closed

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting work, fail what is still queued, and join the thread."""
        with self._cond:
            self._closed = True
            leftover = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for pending in leftover:
            _abandon(pending, EngineClosed("inference engine shut down before this request ran"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _enqueue(self, *batch: _Pending) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosed("inference engine is shut down")
            for pending in batch:
                if pending.key is not None:
                    self._supersede_locked(pending.key)
                self._pending.append(pending)
            self._cond.notify()

    # -- the worker thread ----------------------------------------------------------------------
    def _supersede_locked(self, key: Hashable) -> None:
        keep: deque[_Pending] = deque()
        for pending in self._pending:
            if pending.key == key:
                self.stats.superseded += 1
                _abandon(pending, Superseded())
            else:
                keep.append(pending)
        self._pending = keep

    def _take_batch(self) -> list[_Pending] | None:
        with self._cond:
            while (not self._pending or self._busy) and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            wanted = min(self.max_batch_size, self._expected_batch)
            if wanted > 1 and self.max_wait_s > 0:
                deadline = max(self._pending[0].enqueued, self._free_since) + self.max_wait_s
                while len(self._pending) < wanted and not self._closed:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            self._busy = True
            return self._pop_batch_locked()

    def _pop_batch_locked(self) -> list[_Pending]:
        """Up to ``max_batch_size`` requests to run; those ``skip`` refuses are answered on the way."""
        batch: list[_Pending] = []
        while self._pending and len(batch) < self.max_batch_size:
            pending = self._pending.popleft()
            refusal = self._refusal(pending.item)
            if refusal is None:
                batch.append(pending)
            else:
                self.stats.skipped += 1
                _abandon(pending, refusal)
        return batch

    def _refusal(self, item: Req) -> BaseException | None:
        """What ``skip`` answers ``item`` with; None (run it) also when ``skip`` itself fails."""
        if self._skip is None:
            return None
        try:
            return self._skip(item)
        except Exception:
            logger.exception("the engine's skip callback failed; the request runs")
            return None

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            live = [p for p in batch if p.start()]
            if not live:
                with self._cond:
                    self._busy = False
                continue
            started = time.perf_counter()
            try:
                results = list(self._run_batch([p.item for p in live]))
                if len(results) != len(live):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(live)} requests")
            except BaseException as exc:  # the model failed as a whole: every item gets the error
                results = [exc] * len(live)
            run_s = time.perf_counter() - started
            with self._cond:
                self._busy = False
                self._note_run_locked(run_s, len(live))
            self._report(run_s, len(live))
            for pending, result in zip(live, results, strict=True):
                if not isinstance(result, BaseException):
                    result = Completed(result, started - pending.enqueued, run_s, batch_size=len(live))
                pending.finish(result)
            del batch, live, results  # keep no request (or model state) alive between batches


def _set_if_pending(future: asyncio.Future[None]) -> None:
    if not future.done():  # the awaiting task may have been cancelled meanwhile
        future.set_result(None)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():  # cancelled by its caller meanwhile
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _abandon(pending: _Pending, error: BaseException) -> None:
    if pending.start():
        pending.finish(error)
