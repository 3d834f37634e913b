"""The batching worker: off-loop execution, batching, per-item errors, superseding, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rollserve.engine import BatchingWorker, EngineClosed, Superseded


def _doubling(items: list[int]) -> list[int]:
    return [2 * item for item in items]


async def test_runs_in_worker_thread_and_returns_timings() -> None:
    seen_threads: list[str] = []

    def run(items: list[int]) -> list[int]:
        seen_threads.append(threading.current_thread().name)
        return _doubling(items)

    worker = BatchingWorker(run, name="test-engine")
    try:
        done = await worker.submit(21)
        assert done.value == 42
        assert done.batch_size == 1
        assert done.queue_wait_s >= 0 and done.run_s >= 0
        assert seen_threads == ["test-engine"]
    finally:
        worker.close()


async def test_concurrent_requests_share_one_batch() -> None:
    gate = threading.Event()
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        sizes.append(len(items))
        return _doubling(items)

    worker = BatchingWorker(run, max_batch_size=8, max_wait_s=0.02)
    try:
        first = worker.submit_future(0)  # occupies the worker until the gate opens
        await asyncio.sleep(0.2)
        later = [asyncio.ensure_future(worker.submit(i)) for i in range(1, 5)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(*later)
        assert first.result(5).value == 0
        assert [r.value for r in results] == [2, 4, 6, 8]
        assert sizes[-1] == 4 and all(r.batch_size == 4 for r in results)
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
    gate = threading.Event()
    ran: list[int] = []

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        ran.extend(items)
        return _doubling(items)

    worker = BatchingWorker(run, max_batch_size=1)
    try:
        task = asyncio.ensure_future(worker.submit_many([1, 2, 3]))
        await asyncio.sleep(0.1)  # item 1 is running (waiting on the gate), 2 and 3 are queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        assert (await worker.submit(4)).value == 8
        assert ran == [1, 4]
    finally:
        worker.close()


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
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    worker = BatchingWorker(run)
    try:
        busy = worker.submit_future(-1, key="other")
        await asyncio.sleep(0.05)
        old = worker.submit_future(1, key="robot-a", tag=1)
        new = worker.submit_future(2, key="robot-a", tag=2)
        gate.set()
        with pytest.raises(Superseded) as info:
            old.result(5)
        assert info.value.newer_tag == 2
        assert new.result(5).value == 2
        assert busy.result(5).value == -1
        assert worker.stats.superseded == 1
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
            assert (await asyncio.wait_for(worker.submit(i), timeout=10)).value == 2 * i
    finally:
        worker.close()


async def test_batch_wait_expects_the_clients_seen_last_time() -> None:
    gate = threading.Event()
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        sizes.append(len(items))
        return items

    worker = BatchingWorker(run, max_batch_size=8, max_wait_s=2.0)
    try:
        first = worker.submit_future(0)
        await asyncio.sleep(0.1)
        queued = [worker.submit_future(i) for i in range(1, 4)]  # 3 arrive while the model runs
        gate.set()
        first.result(5)
        [f.result(5) for f in queued]
        assert sizes == [1, 3]
        # The worker now expects 3 per batch: 2 requests wait for a third, which joins their batch.
        later = [worker.submit_future(i) for i in (10, 11)]
        await asyncio.sleep(0.05)
        later.append(worker.submit_future(12))
        assert [f.result(5).batch_size for f in later] == [3, 3, 3]
    finally:
        worker.close()


# -- running cheap requests inline (no thread hand-off) ----------------------------------------------
def _recording(names: list[str], cost_s: float = 0.0):  # type: ignore[no-untyped-def]
    def run(items: list[int]) -> list[int]:
        names.append(threading.current_thread().name)
        if cost_s:
            time.sleep(cost_s)
        return _doubling(items)

    return run


async def test_a_cheap_model_runs_inline_once_measured_on_the_thread() -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names), name="test-engine", inline_below_s=0.05)
    try:
        results = [await worker.submit(i) for i in range(6)]
        assert [r.value for r in results] == [0, 2, 4, 6, 8, 10]
        here = threading.current_thread().name
        assert names == ["test-engine"] * 3 + [here] * 3  # three measured runs, then the caller's thread
        assert all(r.batch_size == 1 and r.queue_wait_s == 0.0 for r in results[3:])
        assert worker.stats.items == 6
    finally:
        worker.close()


async def test_a_model_slower_than_the_bound_never_runs_inline() -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names, cost_s=0.01), name="test-engine", inline_below_s=0.002)
    try:
        for i in range(5):
            assert (await worker.submit(i)).value == 2 * i
        assert names == ["test-engine"] * 5
    finally:
        worker.close()


async def test_inline_is_off_by_default() -> None:
    names: list[str] = []
    worker = BatchingWorker(_recording(names), name="test-engine")
    try:
        for i in range(5):
            await worker.submit(i)
        assert names == ["test-engine"] * 5
    finally:
        worker.close()


async def test_a_model_that_turns_slow_goes_back_to_the_thread_at_once() -> None:
    names: list[str] = []
    slow = threading.Event()

    def run(items: list[int]) -> list[int]:
        names.append(threading.current_thread().name)
        if slow.is_set():
            time.sleep(0.02)
        return _doubling(items)

    worker = BatchingWorker(run, name="test-engine", inline_below_s=0.005)
    try:
        for i in range(4):
            await worker.submit(i)
        here = threading.current_thread().name
        assert names[-1] == here
        slow.set()
        await worker.submit(4)  # runs inline (nothing measured it slow yet), and is measured slow
        await worker.submit(5)
        assert names[-2:] == [here, "test-engine"]
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
