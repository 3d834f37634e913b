"""The batching worker: off-loop execution, batching, per-item errors, superseding, shutdown.

No test uses ``sleep`` as a barrier: each waits on an event the worker sets. Every test runs twice,
with a prompt worker and with one that wakes 150 ms late before each batch (a loaded machine), and
must pass both ways.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import rollserve.engine.batcher as batcher_module
from rollserve.engine import BatchingWorker, EngineClosed, Superseded

WAIT = 10.0  # seconds any single step may take before the test fails instead of hanging


@pytest.fixture(autouse=True, params=[0.0, 0.15], ids=["prompt-worker", "late-worker"])
def worker_wake_delay(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """Delay the worker thread by ``param`` seconds each time it goes to take a batch."""
    delay = request.param
    take_batch = BatchingWorker._take_batch

    def late_take_batch(self: BatchingWorker) -> object:
        if delay and threading.current_thread() is self._thread:
            time.sleep(delay)
        return take_batch(self)

    monkeypatch.setattr(BatchingWorker, "_take_batch", late_take_batch)
    yield delay


def _doubling(items: list[int]) -> list[int]:
    return [2 * item for item in items]


class Gate:
    """A model that blocks until released, and says when it started a batch (the test's barrier)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.sizes: list[int] = []
        self.ran: list[int] = []

    def run(self, items: list[int]) -> list[int]:
        self.started.set()
        assert self.release.wait(WAIT)
        self.sizes.append(len(items))
        self.ran.extend(items)
        return _doubling(items)

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, WAIT)


async def test_runs_in_worker_thread_and_returns_timings() -> None:
    seen_threads: list[str] = []

    def run(items: list[int]) -> list[int]:
        seen_threads.append(threading.current_thread().name)
        return _doubling(items)

    worker = BatchingWorker(run, name="test-engine")
    try:
        before = time.perf_counter()
        done = await worker.submit(21)
        elapsed = time.perf_counter() - before
        assert done.value == 42
        assert done.batch_size == 1
        # Both timings are parts of the call, measured independently around it.
        assert 0 <= done.queue_wait_s <= elapsed and 0 <= done.run_s <= elapsed
        assert seen_threads == ["test-engine"]
    finally:
        worker.close()


async def test_concurrent_requests_share_one_batch() -> None:
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=8, max_wait_s=0.02)
    try:
        first = worker.submit_future(0)  # occupies the worker until the gate opens
        await gate.wait_started()
        later = [worker.submit_future(i) for i in range(1, 5)]  # all queued while the model runs
        gate.release.set()
        results = [f.result(WAIT) for f in later]
        assert first.result(WAIT).value == 0
        assert [r.value for r in results] == [2, 4, 6, 8]
        assert gate.sizes == [1, 4] and all(r.batch_size == 4 for r in results)
        assert worker.stats.max_batch_seen == 4
    finally:
        worker.close()


async def test_batch_size_one_never_batches() -> None:
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        time.sleep(0.01)
        return _doubling(items)

    worker = BatchingWorker(run, max_batch_size=1)
    try:
        results = await asyncio.gather(*(worker.submit(i) for i in range(5)))
        assert [r.value for r in results] == [0, 2, 4, 6, 8]
        assert sizes == [1] * 5
    finally:
        worker.close()


async def test_per_item_errors_do_not_fail_the_batch() -> None:
    def run(items: list[int]) -> list[int | BaseException]:
        return [ValueError(f"bad {i}") if i < 0 else i for i in items]

    worker = BatchingWorker(run, max_batch_size=4, max_wait_s=0.05)
    try:
        results = await worker.submit_many([1, -1, 3])
        assert results[0].value == 1 and results[2].value == 3
        assert isinstance(results[1], ValueError)
    finally:
        worker.close()


async def test_submit_many_spanning_several_batches_returns_every_result_in_order() -> None:
    worker = BatchingWorker(_doubling, max_batch_size=3)
    try:
        results = await worker.submit_many(list(range(10)))
        assert [r.value for r in results] == [2 * i for i in range(10)]
        assert await worker.submit_many([]) == []
    finally:
        worker.close()


async def test_cancelled_submit_many_does_not_run_what_is_still_queued() -> None:
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=1)
    try:
        task = asyncio.ensure_future(worker.submit_many([1, 2, 3]))
        await gate.wait_started()  # item 1 is running (waiting on the gate), 2 and 3 are queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release.set()
        assert (await asyncio.wait_for(worker.submit(4), WAIT)).value == 8
        assert gate.ran == [1, 4]
    finally:
        worker.close()


async def test_submit_many_closed_midway_gets_what_ran_and_engine_closed_for_the_rest() -> None:
    """The queued items of a group are abandoned one by one; the caller wakes once all are settled."""
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=1)
    task = asyncio.ensure_future(worker.submit_many([1, 2, 3]))
    await gate.wait_started()  # item 1 runs; 2 and 3 are queued
    closing = asyncio.ensure_future(asyncio.to_thread(worker.close))

    async def abandoned() -> None:  # close() abandons the queued items before it joins the thread
        while worker.queue_depth:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(abandoned(), WAIT)
    gate.release.set()
    await closing
    results = await asyncio.wait_for(task, WAIT)
    assert results[0].value == 2 and gate.ran == [1]
    assert all(isinstance(r, EngineClosed) for r in results[1:])


async def test_model_crash_fails_every_item_but_worker_survives() -> None:
    calls = {"n": 0}

    def run(items: list[int]) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("model exploded")
        return _doubling(items)

    worker = BatchingWorker(run)
    try:
        with pytest.raises(RuntimeError, match="exploded"):
            await worker.submit(1)
        assert (await worker.submit(2)).value == 4
    finally:
        worker.close()


async def test_newer_request_of_same_key_supersedes_waiting_one() -> None:
    gate = Gate()
    worker = BatchingWorker(gate.run)
    try:
        busy = worker.submit_future(-1, key="other")
        await gate.wait_started()
        old = worker.submit_future(1, key="robot-a")
        new = worker.submit_future(2, key="robot-a")
        gate.release.set()
        with pytest.raises(Superseded):
            old.result(WAIT)
        assert new.result(WAIT).value == 4
        assert busy.result(WAIT).value == -2
        assert worker.stats.superseded == 1
        assert gate.ran == [-1, 2]  # the superseded request never reached the model
    finally:
        worker.close()


async def test_superseding_is_per_session_in_a_batch() -> None:
    """Only a session's own older request is dropped; other sessions' requests all run, batched."""
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=8, max_wait_s=0.0)
    try:
        busy = worker.submit_future(0, key="busy")
        await gate.wait_started()
        a1 = worker.submit_future(1, key="a")
        b1 = worker.submit_future(2, key="b")
        a2 = worker.submit_future(3, key="a")
        c1 = worker.submit_future(4, key="c")
        b2 = worker.submit_future(5, key="b")
        unkeyed = [worker.submit_future(6), worker.submit_future(7)]  # no key: never superseded
        gate.release.set()
        for superseded in (a1, b1):
            with pytest.raises(Superseded):
                superseded.result(WAIT)
        assert [f.result(WAIT).value for f in (a2, c1, b2, *unkeyed)] == [6, 8, 10, 12, 14]
        assert busy.result(WAIT).value == 0
        assert gate.ran == [0, 3, 4, 5, 6, 7] and gate.sizes == [1, 5]
        assert worker.stats.superseded == 2
    finally:
        worker.close()


def test_close_rejects_new_work() -> None:
    worker = BatchingWorker(_doubling)
    assert worker.run_now(3).value == 6
    worker.close()
    with pytest.raises(EngineClosed):
        worker.submit_future(1)


async def test_a_lone_client_is_not_held_back_by_the_batch_wait() -> None:
    worker = BatchingWorker(_doubling, max_batch_size=8, max_wait_s=30.0)  # a wait that would hang the test
    try:
        for i in range(3):
            assert (await asyncio.wait_for(worker.submit(i), timeout=WAIT)).value == 2 * i
    finally:
        worker.close()


async def test_batch_wait_expects_the_clients_seen_last_time() -> None:
    """The next batch waits for as many requests as the last batch plus what queued meanwhile.

    ``max_wait_s`` is 30 s: the test passes only if the expected requests end the wait, never by
    waiting it out.
    """
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=8, max_wait_s=30.0)
    try:
        first = worker.submit_future(0)
        await gate.wait_started()
        queued = [worker.submit_future(i) for i in range(1, 4)]  # 3 arrive while the model runs
        gate.release.set()
        assert first.result(WAIT).value == 0
        # 1 ran + 3 queued: the worker now waits for a 4th, which completes the batch.
        queued.append(worker.submit_future(4))
        assert [f.result(WAIT).batch_size for f in queued] == [4, 4, 4, 4]
        # 4 ran, none queued: the next batch again waits for 4.
        later = [worker.submit_future(i) for i in range(10, 14)]
        assert [f.result(WAIT).batch_size for f in later] == [4, 4, 4, 4]
        assert gate.sizes == [1, 4, 4]
    finally:
        worker.close()


# -- running cheap requests inline (no thread hand-off) ----------------------------------------------
class ModelClock:
    """The batcher's ``perf_counter``, moved only by what the fake model says a call cost.

    The inline decision depends on measured call times; with this clock it depends on the cost a
    test sets, exactly, not on the machine's load (or a mutation tool's tracing).
    """

    def __init__(self) -> None:
        self.now = 100.0
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        with self._lock:
            return self.now

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ModelClock:
    fake = ModelClock()
    monkeypatch.setattr(batcher_module, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def _recording(names: list[str], clock: ModelClock, cost_s: list[float] | float = 0.0):  # type: ignore[no-untyped-def]
    """A doubling model that records the thread it ran on and costs ``cost_s`` (or ``cost_s[0]``)."""

    def run(items: list[int]) -> list[int]:
        names.append(threading.current_thread().name)
        clock.spend(cost_s[0] if isinstance(cost_s, list) else cost_s)
        return _doubling(items)

    return run


async def test_a_cheap_model_runs_inline_once_measured_on_the_thread(clock: ModelClock) -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock, 0.004), name="test-engine", inline_below_s=0.05)
    try:
        results = [await worker.submit(i) for i in range(6)]
        assert [r.value for r in results] == [0, 2, 4, 6, 8, 10]
        here = threading.current_thread().name
        assert names == ["test-engine"] * 3 + [here] * 3  # three measured runs, then the caller's thread
        assert all(r.batch_size == 1 and r.queue_wait_s == 0.0 for r in results[3:])
        assert [r.run_s for r in results] == pytest.approx([0.004] * 6)  # the model's cost, on both paths
        assert (worker.stats.batches, worker.stats.items, worker.stats.max_batch_seen) == (6, 6, 1)
    finally:
        worker.close()


async def test_a_model_slower_than_the_bound_never_runs_inline(clock: ModelClock) -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock, 0.01), name="test-engine", inline_below_s=0.002)
    try:
        for i in range(5):
            assert (await worker.submit(i)).value == 2 * i
        assert names == ["test-engine"] * 5
    finally:
        worker.close()


async def test_a_model_exactly_at_the_bound_never_runs_inline(clock: ModelClock) -> None:
    """The rule is "cheaper than ``inline_below_s``": a call that costs exactly the bound is not."""
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock, 0.25), name="test-engine", inline_below_s=0.25)
    try:
        for i in range(5):
            assert not worker.runs_inline_now()
            await worker.submit(i)
        assert names == ["test-engine"] * 5
    finally:
        worker.close()


async def test_inline_is_off_by_default(clock: ModelClock) -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock), name="test-engine")
    try:
        for i in range(5):
            await worker.submit(i)
        assert names == ["test-engine"] * 5
        assert not worker.runs_inline_now()
    finally:
        worker.close()


async def test_a_negative_inline_bound_means_off(clock: ModelClock) -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock), name="test-engine", inline_below_s=-1.0)
    try:
        assert worker.inline_below_s == 0.0
        for i in range(5):
            await worker.submit(i)
        assert names == ["test-engine"] * 5
    finally:
        worker.close()


async def test_a_model_that_turns_slow_goes_back_to_the_thread(clock: ModelClock) -> None:
    names: list[str] = []
    cost_s = [0.0]
    worker = BatchingWorker(_recording(names, clock, cost_s), name="test-engine", inline_below_s=0.005)
    try:
        for i in range(4):
            await worker.submit(i)
        here = threading.current_thread().name
        assert names[-1] == here
        cost_s[0] = 0.03  # far over the bound (more than 4x): the first slow call sends it back
        await worker.submit(4)
        await worker.submit(5)
        assert names[-2:] == [here, "test-engine"]
        cost_s[0] = 0.0  # cheap again: three calls measured on the thread, then inline
        for i in range(4):
            await worker.submit(i)
        assert names[-4:] == ["test-engine", "test-engine", here, here]
    finally:
        worker.close()


async def test_an_inline_call_of_exactly_four_times_the_bound_does_not_restart_the_measuring(
    clock: ModelClock,
) -> None:
    """Only a call *over* 4x the bound forgets the recent cheap calls; at 4x the fastest of the
    last three still decides, so the next call stays inline."""
    names: list[str] = []
    cheap = 2.0**-10  # binary fractions: the fake clock's sums are exact
    cost_s = [cheap]
    worker = BatchingWorker(_recording(names, clock, cost_s), name="test-engine", inline_below_s=0.25)
    try:
        for i in range(4):
            await worker.submit(i)
        here = threading.current_thread().name
        cost_s[0] = 1.0  # exactly 4 x 0.25
        await worker.submit(4)
        cost_s[0] = cheap
        await worker.submit(5)
        assert names == ["test-engine"] * 3 + [here] * 3
        cost_s[0] = 1.5  # over 4x: measuring starts afresh on the thread
        await worker.submit(6)
        cost_s[0] = cheap
        await worker.submit(7)
        assert names[-2:] == [here, "test-engine"]
    finally:
        worker.close()


async def test_a_model_somewhat_over_the_bound_leaves_after_three_calls(clock: ModelClock) -> None:
    names: list[str] = []
    cost_s = [0.0]
    worker = BatchingWorker(_recording(names, clock, cost_s), name="test-engine", inline_below_s=0.01)
    try:
        for i in range(3):
            await worker.submit(i)
        cost_s[0] = 0.015  # over the bound, under 4x: the fastest of three recent calls decides
        for i in range(5):
            await worker.submit(i)
        here = threading.current_thread().name
        assert names[3:] == [here, here, here, "test-engine", "test-engine"]
    finally:
        worker.close()


async def test_no_request_runs_inline_while_a_batch_runs_on_the_thread() -> None:
    gate = threading.Event()
    running, overlap = [0], [0]
    lock = threading.Lock()

    def run(items: list[int]) -> list[int]:
        with lock:
            running[0] += 1
            overlap[0] = max(overlap[0], running[0])
        if items == [100]:
            gate.wait(5)
        with lock:
            running[0] -= 1
        return _doubling(items)

    worker = BatchingWorker(run, inline_below_s=1.0)
    try:
        for i in range(3):
            await worker.submit(i)
        blocked = worker.submit_future(100)  # occupies the thread until the gate opens
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(worker.submit(7))
        await asyncio.sleep(0.05)
        assert not queued.done()  # it waits for the thread; it did not run beside the blocked batch
        gate.set()
        assert (await queued).value == 14 and blocked.result(5).value == 200
        assert overlap[0] == 1
    finally:
        worker.close()


async def test_inline_errors_reach_the_caller_and_close_still_refuses() -> None:
    def run(items: list[int]) -> list[int | BaseException]:
        return [ValueError("bad item") if item < 0 else 2 * item for item in items]

    worker = BatchingWorker(run, inline_below_s=1.0)
    for i in range(3):
        await worker.submit(i)
    with pytest.raises(ValueError, match="bad item"):
        await worker.submit(-1)
    assert (await worker.submit(4)).value == 8
    worker.close()
    with pytest.raises(EngineClosed):
        await worker.submit(1)


async def test_runs_inline_now_says_what_the_next_submit_does(clock: ModelClock) -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, clock, 0.001), name="test-engine", inline_below_s=0.05)
    try:
        predictions = []
        for i in range(5):
            predictions.append(worker.runs_inline_now())
            await worker.submit(i)
        here = threading.current_thread().name
        assert predictions == [name == here for name in names] == [False] * 3 + [True] * 2
    finally:
        worker.close()
    assert not worker.runs_inline_now()


async def test_an_async_submit_with_a_key_supersedes_the_sessions_waiting_request() -> None:
    gate = Gate()
    worker = BatchingWorker(gate.run)
    try:
        busy = worker.submit_future(-1, key="other")
        await gate.wait_started()
        old = asyncio.ensure_future(worker.submit(1, key="robot-a"))
        await asyncio.sleep(0)  # let it queue (submit enqueues before its first await)
        new = asyncio.ensure_future(worker.submit(2, key="robot-a"))
        await asyncio.sleep(0)
        with pytest.raises(Superseded) as info:
            await asyncio.wait_for(old, WAIT)
        assert str(info.value) == "superseded by a newer request of the same session"
        gate.release.set()
        assert (await asyncio.wait_for(new, WAIT)).value == 4 and busy.result(WAIT).value == -2
        assert gate.ran == [-1, 2] and worker.stats.superseded == 1
    finally:
        gate.release.set()
        worker.close()


async def test_submit_many_wakes_its_caller_only_when_the_last_item_is_done() -> None:
    """The event loop keeps running while ``submit_many`` waits: here a coroutine on the loop is what
    lets the last item finish, so a caller woken early (blocking on an unfinished item) would stall
    the loop and the last item would fail."""
    third_started = threading.Event()
    release = threading.Event()

    def run(items: list[int]) -> list[int]:
        if items == [3]:
            third_started.set()
            if not release.wait(2.0):
                raise RuntimeError("the event loop never released item 3")
        return _doubling(items)

    async def releaser() -> None:
        assert await asyncio.to_thread(third_started.wait, WAIT)  # items 1 and 2 are done by now
        for _ in range(5):  # a wake-up item 2 had queued runs now, before item 3 can finish
            await asyncio.sleep(0)
        release.set()

    worker = BatchingWorker(run, max_batch_size=1)
    try:
        helper = asyncio.ensure_future(releaser())
        results = await worker.submit_many([1, 2, 3])
        seen = list(results)  # as the caller found them when woken (the list fills in place)
        await helper
        assert [r.value if r is not None else None for r in seen] == [2, 4, 6]  # type: ignore[union-attr]
    finally:
        release.set()
        worker.close()


async def test_nothing_else_runs_inline_or_on_the_thread_during_an_inline_call(clock: ModelClock) -> None:
    """While a request runs inline the worker counts as busy: ``runs_inline_now`` says no, and a
    request queued meanwhile by another thread waits for the inline call to end."""
    seen: list[tuple[int, bool]] = []
    inline_running = threading.Event()
    worker: BatchingWorker[int, int]

    def run(items: list[int]) -> list[int]:
        if items == [3]:  # the first inline call
            inline_running.set()
            seen.append((3, worker.runs_inline_now()))
            queued.append(worker.submit_future(100))
            seen.append((100, queued[0].done()))
        return _doubling(items)

    queued: list[Any] = []
    worker = BatchingWorker(run, name="test-engine", inline_below_s=0.05)
    try:
        for i in range(4):
            await worker.submit(i)
        assert inline_running.is_set()
        assert seen == [(3, False), (100, False)]
        assert queued[0].result(WAIT).value == 200
    finally:
        worker.close()


async def test_runs_inline_now_is_false_while_a_batch_runs_on_the_thread(clock: ModelClock) -> None:
    names: list[str] = []
    gate = threading.Event()
    started = threading.Event()
    record = _recording(names, clock, 0.001)

    def run(items: list[int]) -> list[int]:
        if items == [100]:
            started.set()
            assert gate.wait(WAIT)
        return record(items)

    worker = BatchingWorker(run, name="test-engine", inline_below_s=0.05)
    try:
        for i in range(3):
            await worker.submit(i)
        assert worker.runs_inline_now()
        blocked = worker.submit_future(100)
        assert await asyncio.to_thread(started.wait, WAIT)
        assert not worker.runs_inline_now()  # busy, nothing queued: still not inline
        gate.set()
        assert blocked.result(WAIT).value == 200
    finally:
        gate.set()
        worker.close()


async def test_inline_failures_of_the_whole_call_reach_the_caller(clock: ModelClock) -> None:
    calls = [0]

    def run(items: list[int]) -> list[int]:
        calls[0] += 1
        if items == [-1]:
            raise RuntimeError("model exploded inline")
        if items == [-2]:
            return [1, 2]  # two results for one request
        if items == [-3]:
            return []
        return _doubling(items)

    worker = BatchingWorker(run, inline_below_s=0.05)
    try:
        for i in range(3):
            await worker.submit(i)
        assert worker.runs_inline_now()
        with pytest.raises(RuntimeError, match=r"^model exploded inline$"):
            await worker.submit(-1)
        for bad in (-2, -3):
            with pytest.raises(RuntimeError, match=r"^run_batch returned no single result$"):
                await worker.submit(bad)
        assert (await worker.submit(5)).value == 10 and calls[0] == 7
    finally:
        worker.close()
    with pytest.raises(EngineClosed, match=r"^inference engine is shut down$"):
        await worker.submit(1)  # refused on the inline path too (the model measured cheap)
    with pytest.raises(EngineClosed, match=r"^inference engine is shut down$"):
        worker.submit_future(1)


async def test_defaults_serve_one_request_at_a_time_on_a_daemon_thread_named_rollserve_engine() -> None:
    """The defaults: ``max_batch_size=1``, ``max_wait_s=0``, a thread named ``rollserve-engine`` that
    does not keep the interpreter alive."""
    gate = Gate()
    names: list[str] = []

    def run(items: list[int]) -> list[int]:
        names.append(threading.current_thread().name)
        return gate.run(items)

    worker = BatchingWorker(run)
    try:
        assert (worker.max_batch_size, worker.max_wait_s, worker.inline_below_s) == (1, 0.0, 0.0)
        (thread,) = [t for t in threading.enumerate() if t.name == "rollserve-engine" and t.is_alive()]
        assert thread.daemon
        first = worker.submit_future(0)
        await gate.wait_started()
        queued = [worker.submit_future(i) for i in (1, 2, 3)]
        gate.release.set()
        assert [f.result(WAIT).value for f in (first, *queued)] == [0, 2, 4, 6]
        assert gate.sizes == [1, 1, 1, 1] and set(names) == {"rollserve-engine"}
    finally:
        gate.release.set()
        worker.close()


def test_settings_are_checked_and_clamped() -> None:
    with pytest.raises(ValueError, match=r"^max_batch_size must be >= 1, got 0$"):
        BatchingWorker(_doubling, max_batch_size=0)
    worker = BatchingWorker(_doubling, max_batch_size=4, max_wait_s=0.02, inline_below_s=0.003)
    try:
        assert (worker.max_wait_s, worker.inline_below_s) == (0.02, 0.003)  # kept as given
    finally:
        worker.close()
    worker = BatchingWorker(_doubling, max_batch_size=4, max_wait_s=-5.0)
    try:
        assert worker.max_wait_s == 0.0  # a negative wait means none
    finally:
        worker.close()


def test_a_result_for_a_closed_event_loop_does_not_kill_the_worker() -> None:
    """A caller's event loop may be closed while its request runs; the worker drops that result and
    keeps serving."""
    gate = Gate()
    worker = BatchingWorker(gate.run)
    loop = asyncio.new_event_loop()

    async def submit_and_leave() -> asyncio.Task[Any]:
        task = asyncio.ensure_future(worker.submit(1))
        await asyncio.sleep(0)  # the request is queued
        return task

    try:
        task = loop.run_until_complete(submit_and_leave())
        assert gate.started.wait(WAIT)
        task.cancel()  # (unawaited: its loop is going away)
        loop.close()
        gate.release.set()  # the worker now settles a future of a closed loop
        assert worker.submit_future(2).result(WAIT).value == 4
        assert gate.ran == [1, 2]
    finally:
        gate.release.set()
        worker.close()


async def test_close_fails_what_is_still_queued_and_lets_the_running_batch_finish() -> None:
    gate = Gate()
    worker = BatchingWorker(gate.run)
    first = worker.submit_future(0)
    await gate.wait_started()
    queued = [worker.submit_future(i) for i in (1, 2)]
    closer = threading.Thread(target=worker.close, args=(WAIT,))
    closer.start()
    try:
        for future in queued:
            with pytest.raises(EngineClosed, match=r"^inference engine shut down before this request ran$"):
                future.result(WAIT)
    finally:
        gate.release.set()
        closer.join(WAIT)
    assert first.result(WAIT).value == 0 and gate.ran == [0]


def test_close_waits_for_the_thread_five_seconds_by_default_or_as_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    joins: list[tuple[str, float | None]] = []
    real_join = threading.Thread.join

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        joins.append((self.name, timeout))
        real_join(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    BatchingWorker(_doubling, name="engine-a").close()
    BatchingWorker(_doubling, name="engine-b").close(0.25)
    assert [j for j in joins if j[0].startswith("engine-")] == [("engine-a", 5.0), ("engine-b", 0.25)]


async def test_a_request_waits_up_to_max_wait_s_for_the_partner_it_expects() -> None:
    """After a batch of 1 with 1 queued meanwhile, the next batch expects 2: the lone request waits
    ``max_wait_s`` (0.3 s; a busy machine only waits longer) for a partner, then runs alone."""
    gate = Gate()
    worker = BatchingWorker(gate.run, max_batch_size=8, max_wait_s=0.3)
    try:
        first = worker.submit_future(0)
        await gate.wait_started()
        lone = worker.submit_future(1)
        gate.release.set()
        assert first.result(WAIT).value == 0
        done = lone.result(WAIT)
        assert done.value == 2 and done.batch_size == 1 and gate.sizes == [1, 1]
        assert done.queue_wait_s >= 0.3
    finally:
        gate.release.set()
        worker.close()


async def test_a_wrong_number_of_results_fails_every_item_of_the_batch_with_the_counts() -> None:
    worker = BatchingWorker(lambda items: [0] * (len(items) + 1))
    try:
        with pytest.raises(RuntimeError, match=r"^run_batch returned 2 results for 1 requests$"):
            await worker.submit(1)
    finally:
        worker.close()


async def test_closed_says_whether_the_worker_still_accepts_work() -> None:
    worker = BatchingWorker(_doubling, max_batch_size=4)
    assert not worker.closed
    assert (await asyncio.wait_for(worker.submit(2), WAIT)).value == 4
    worker.close()
    assert worker.closed
    with pytest.raises(EngineClosed):
        await worker.submit(3)


def test_a_group_settled_after_its_loop_closed_does_not_raise() -> None:
    """The caller of ``submit_many`` may be gone (its loop closed) when the last outcome lands: the
    engine thread must not fail on the wake-up nobody waits for."""
    loop = asyncio.new_event_loop()
    group = batcher_module._Group(2, loop)
    loop.close()
    group.settle(1, "second")
    group.settle(0, "first")  # the last one: waking the closed loop raises inside, and is dropped
    assert group.outcomes == ["first", "second"]


async def test_on_batch_hears_of_each_model_call_once_before_its_requests_are_answered(
    clock: ModelClock,
) -> None:
    """Per model call, with its time and size, on the thread and inline: a batch of 4 is one
    call of 4 (not 4 calls), and a request's answer comes after its batch was reported."""
    here = threading.current_thread().name
    started, gate = threading.Event(), threading.Event()
    calls: list[tuple[float, int, str]] = []

    def run(items: list[int]) -> list[int]:
        if not started.is_set():
            started.set()
            assert gate.wait(WAIT)  # holds the thread while four more queue up
        clock.spend(0.004)
        return _doubling(items)

    def on_batch(run_s: float, size: int) -> None:
        calls.append((run_s, size, threading.current_thread().name))

    worker = BatchingWorker(run, max_batch_size=8, name="test-engine", inline_below_s=0.05, on_batch=on_batch)
    try:
        first = worker.submit_future(0)
        assert await asyncio.to_thread(started.wait, WAIT)
        later = [worker.submit_future(i) for i in range(1, 5)]
        gate.set()
        assert first.result(WAIT).value == 0 and len(calls) >= 1
        assert [f.result(WAIT).value for f in later] == [2, 4, 6, 8] and len(calls) == 2
        assert (await worker.submit(5)).value == 10  # the third measured call, on the thread
        assert (await worker.submit(6)).value == 12  # now cheap and measured: inline
        assert calls == [
            (pytest.approx(0.004), 1, "test-engine"),
            (pytest.approx(0.004), 4, "test-engine"),
            (pytest.approx(0.004), 1, "test-engine"),
            (pytest.approx(0.004), 1, here),
        ]
        assert worker.stats.batches == len(calls) and worker.stats.items == 7
    finally:
        worker.close()


async def test_a_failing_on_batch_is_logged_and_fails_no_request(caplog: pytest.LogCaptureFixture) -> None:
    def on_batch(run_s: float, size: int) -> None:
        raise RuntimeError("metrics backend down")

    worker = BatchingWorker(_doubling, on_batch=on_batch, inline_below_s=1.0)
    try:
        results = [(await worker.submit(i)).value for i in range(5)]  # 3 on the thread, 2 inline
        assert results == [0, 2, 4, 6, 8]
    finally:
        worker.close()
    failures = [r for r in caplog.records if r.getMessage() == "the engine's on_batch callback failed"]
    assert len(failures) == 5 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)
