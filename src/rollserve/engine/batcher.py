"""One worker thread that owns a model and groups concurrent requests into batches.

Transports submit from the event loop and await; the model runs only in this thread, so the event
loop keeps serving every other client while inference runs. Requests tagged with the same key (a
session) supersede each other while they wait: only the newest observation of a session is worth
inferring.
"""

from __future__ import annotations

import asyncio
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


class Superseded(Exception):
    """A newer request of the same key arrived before this one was run."""

    def __init__(self, newer_tag: Any = None) -> None:
        super().__init__("superseded by a newer request of the same session")
        self.newer_tag = newer_tag


class EngineClosed(RuntimeError):
    """The worker was shut down; no more requests are accepted."""


@dataclass
class Completed(Generic[Res]):
    """A result with the timings a server reports back to its client."""

    value: Res
    queue_wait_s: float
    run_s: float
    batch_size: int


@dataclass
class _Pending:
    item: Any
    key: Hashable | None
    tag: Any
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass
class EngineStats:
    """Counters for /metrics and benchmarks."""

    batches: int = 0
    items: int = 0
    superseded: int = 0
    max_batch_seen: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class BatchingWorker(Generic[Req, Res]):
    """Runs ``run_batch(items) -> results`` (one result or exception per item) in one thread.

    ``max_batch_size=1`` serves requests one at a time (still off the event loop). With a larger
    size, the worker waits up to ``max_wait_s`` for more requests to join a batch, but only for as
    many as it has reason to expect: the size of the previous batch plus what queued up while it
    ran. A lone client is never delayed; a group of clients in lock-step is gathered into one call.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch_size: int = 1,
        max_wait_s: float = 0.0,
        name: str = "rollserve-engine",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max(0.0, max_wait_s)
        self.stats = EngineStats()
        self._pending: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._expected_batch = 1  # requests the next batch can expect (adapts to the live load)
        self._free_since = 0.0  # when the model last finished; waiting for a batch starts then
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- submitting ------------------------------------------------------------------------------
    def submit_future(self, item: Req, *, key: Hashable | None = None, tag: Any = None) -> Future:
        """Queue one request; the future resolves to a :class:`Completed` or raises its error."""
        pending = _Pending(item=item, key=key, tag=tag)
        with self._cond:
            if self._closed:
                raise EngineClosed("inference engine is shut down")
            if key is not None:
                self._supersede_locked(key, tag)
            self._pending.append(pending)
            self._cond.notify()
        return pending.future

    async def submit(self, item: Req, *, key: Hashable | None = None, tag: Any = None) -> Completed[Res]:
        """Await one request from the event loop without blocking it."""
        return await asyncio.wrap_future(self.submit_future(item, key=key, tag=tag))

    async def submit_many(self, items: Sequence[Req]) -> list[Completed[Res] | BaseException]:
        """Queue several requests together (they land in the same batch when the size allows)."""
        with self._cond:
            if self._closed:
                raise EngineClosed("inference engine is shut down")
            batch = [_Pending(item=item, key=None, tag=None) for item in items]
            self._pending.extend(batch)
            self._cond.notify()
        futures = [asyncio.wrap_future(p.future) for p in batch]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    def run_now(self, item: Req) -> Completed[Res]:
        """Blocking submit, for callers without an event loop (local engines, scripts)."""
        return self.submit_future(item).result()

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._pending)

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting work, fail what is still queued, and join the thread."""
        with self._cond:
            self._closed = True
            leftover = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for pending in leftover:
            _resolve(pending.future, EngineClosed("inference engine shut down before this request ran"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the worker thread ----------------------------------------------------------------------
    def _supersede_locked(self, key: Hashable, newer_tag: Any) -> None:
        keep: deque[_Pending] = deque()
        for pending in self._pending:
            if pending.key == key:
                self.stats.superseded += 1
                _resolve(pending.future, Superseded(newer_tag))
            else:
                keep.append(pending)
        self._pending = keep

    def _take_batch(self) -> list[_Pending] | None:
        with self._cond:
            while not self._pending and not self._closed:
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
            count = min(self.max_batch_size, len(self._pending))
            return [self._pending.popleft() for _ in range(count)]

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            live = [p for p in batch if p.future.set_running_or_notify_cancel()]
            if not live:
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
                self._expected_batch = len(live) + len(self._pending)
                self._free_since = time.perf_counter()
            self.stats.batches += 1
            self.stats.items += len(live)
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(live))
            for pending, result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(
                        Completed(result, started - pending.enqueued, run_s, batch_size=len(live))
                    )
            del batch, live, results  # keep no request (or model state) alive between batches


def _resolve(future: Future, error: BaseException) -> None:
    if future.set_running_or_notify_cancel():
        future.set_exception(error)
