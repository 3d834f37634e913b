"""The engine's ``skip`` hook: a queued request it refuses is answered with the refusal and never
reaches the model, never takes a place in a batch, and is neither timed nor counted as a model call.

No sleeps: each step waits on an event the model sets. Items are ints; the tests' ``skip`` refuses
the even ones, so every expected number below follows from the items queued.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from rollserve.engine import BatchingWorker, Completed

WAIT = 10.0


class Refused(Exception):
    """What the tests' ``skip`` answers an even item with."""


class Model:
    """Doubles its items; the first call blocks until released, so a test can queue behind it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls: list[list[int]] = []  # the items of each call, as the model received them
        self.threads: list[str] = []  # the thread each call ran on

    def run(self, items: list[int]) -> list[int]:
        if not self.started.is_set():
            self.started.set()
            assert self.release.wait(WAIT)
        self.calls.append(list(items))
        self.threads.append(threading.current_thread().name)
        return [2 * item for item in items]


class EvenSkipper:
    """Refuses even items with a fresh ``Refused`` (kept, so a test can check identity)."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.refusals: dict[int, Refused] = {}

    def __call__(self, item: int) -> Refused | None:
        self.asked.append(item)
        if item % 2:
            return None
        self.refusals[item] = Refused(f"item {item}")
        return self.refusals[item]


def _outcome(future: Future) -> object:
    try:
        return future.result(WAIT)
    except Refused as exc:
        return exc


def _queue_behind_a_running_call(worker: BatchingWorker, model: Model, items: list[int]) -> list[Future]:
    """Item 1 occupies the model; ``items`` queue behind it; then the model is released."""
    first = worker.submit_future(1)
    assert model.started.wait(WAIT)
    futures = [worker.submit_future(item) for item in items]
    assert worker.queue_depth == len(items)
    model.release.set()
    assert first.result(WAIT).value == 2
    return futures


def test_refused_items_never_reach_the_model_and_get_their_refusal() -> None:
    model, skip = Model(), EvenSkipper()
    sizes: list[int] = []
    worker = BatchingWorker(
        model.run, max_batch_size=8, on_batch=lambda run_s, size: sizes.append(size), skip=skip
    )
    try:
        futures = _queue_behind_a_running_call(worker, model, [2, 3, 4, 5])
        outcomes = [_outcome(f) for f in futures]
        assert outcomes[0] is skip.refusals[2] and outcomes[2] is skip.refusals[4]
        done = [outcomes[1], outcomes[3]]
        assert all(isinstance(d, Completed) for d in done)
        assert [(d.value, d.batch_size) for d in done] == [(6, 2), (10, 2)]  # type: ignore[union-attr]
        assert model.calls == [[1], [3, 5]]
        assert sizes == [1, 2]  # on_batch: what ran
        assert skip.asked == [1, 2, 3, 4, 5]  # each asked once, when its batch was formed
        stats = worker.stats
        assert (stats.batches, stats.items, stats.skipped, stats.max_batch_seen) == (2, 3, 2, 2)
    finally:
        worker.close()


def test_refused_items_take_no_place_in_a_batch() -> None:
    """With room for two, the batch after the first call is 3 and 5: the refused 2 and 4 between
    them do not use up its places (else: 3 alone, then 5 alone)."""
    model, skip = Model(), EvenSkipper()
    worker = BatchingWorker(model.run, max_batch_size=2, skip=skip)
    try:
        futures = _queue_behind_a_running_call(worker, model, [2, 3, 4, 5, 7])
        outcomes = [_outcome(f) for f in futures]
        assert [getattr(o, "batch_size", None) for o in outcomes] == [None, 2, None, 2, 1]
        assert model.calls == [[1], [3, 5], [7]]
        assert (worker.stats.batches, worker.stats.items, worker.stats.skipped) == (3, 4, 2)
    finally:
        worker.close()


async def test_a_batch_refused_whole_is_not_run_timed_or_counted() -> None:
    """Only model calls count towards the three measured ones that let a request run inline."""
    model, skip = Model(), EvenSkipper()
    model.started.set()  # no blocking call in this test
    sizes: list[int] = []
    on_batch = lambda run_s, size: sizes.append(size)  # noqa: E731
    worker = BatchingWorker(model.run, name="test-engine", inline_below_s=1.0, on_batch=on_batch, skip=skip)
    try:
        assert [(await worker.submit(i)).value for i in (1, 3)] == [2, 6]  # two calls on the thread
        for item in (2, 4, 6):  # each alone in its batch, refused: a batch of nothing
            with pytest.raises(Refused):
                await worker.submit(item)
        assert model.calls == [[1], [3]]
        assert sizes == [1, 1]
        assert (worker.stats.batches, worker.stats.items, worker.stats.skipped) == (2, 2, 3)
        assert not worker.runs_inline_now()  # two measured calls, not five
        assert (await worker.submit(5)).value == 10  # the third, on the thread
        assert worker.runs_inline_now()
        assert (await worker.submit(8)).value == 16  # inline: never waited, so never asked
        assert model.threads == ["test-engine"] * 3 + [threading.current_thread().name]
        assert skip.asked == [1, 3, 2, 4, 6, 5]
        assert model.calls == [[1], [3], [5], [8]]
        assert sizes == [1, 1, 1, 1]
    finally:
        worker.close()


async def test_submit_many_gets_each_refusal_in_its_place() -> None:
    model, skip = Model(), EvenSkipper()
    model.started.set()
    worker = BatchingWorker(model.run, max_batch_size=8, skip=skip)
    try:
        outcomes = await worker.submit_many([1, 2, 3, 4])
        assert outcomes[1] is skip.refusals[2] and outcomes[3] is skip.refusals[4]
        assert [(o.value, o.batch_size) for o in outcomes[::2]] == [(2, 2), (6, 2)]  # type: ignore[union-attr]
        assert model.calls == [[1, 3]]
        assert (worker.stats.batches, worker.stats.items, worker.stats.skipped) == (1, 2, 2)
    finally:
        worker.close()


def test_a_failing_skip_is_logged_and_the_item_runs(caplog: pytest.LogCaptureFixture) -> None:
    model = Model()
    model.started.set()

    def skip(item: int) -> None:
        raise RuntimeError("session store gone")

    worker = BatchingWorker(model.run, skip=skip)
    try:
        assert worker.submit_future(3).result(WAIT).value == 6
        assert model.calls == [[3]] and worker.stats.skipped == 0
    finally:
        worker.close()
    message = "the engine's skip callback failed; the request runs"
    failures = [r for r in caplog.records if r.getMessage() == message]
    assert len(failures) == 1 and failures[0].exc_info and failures[0].exc_info[0] is RuntimeError


def test_without_skip_every_item_runs() -> None:
    model = Model()
    worker = BatchingWorker(model.run, max_batch_size=8)
    try:
        futures = _queue_behind_a_running_call(worker, model, [2, 3, 4])
        assert [f.result(WAIT).value for f in futures] == [4, 6, 8]
        assert model.calls == [[1], [2, 3, 4]]
        assert worker.stats.skipped == 0
    finally:
        worker.close()


async def test_asyncio_submit_raises_the_refusal_itself() -> None:
    model, skip = Model(), EvenSkipper()
    model.started.set()
    worker = BatchingWorker(model.run, skip=skip)
    try:
        with pytest.raises(Refused) as raised:
            await worker.submit(2)
        assert raised.value is skip.refusals[2]
        assert model.calls == [] and worker.stats.batches == 0
    finally:
        worker.close()


def test_a_cancelled_request_that_would_be_refused_stops_nothing() -> None:
    """Its caller gave up: nobody is answered, and the worker goes on with the rest."""
    model, skip = Model(), EvenSkipper()
    worker = BatchingWorker(model.run, max_batch_size=8, skip=skip)
    try:
        first = worker.submit_future(1)
        assert model.started.wait(WAIT)
        cancelled, later = worker.submit_future(2), worker.submit_future(3)
        assert cancelled.cancel()
        model.release.set()
        assert first.result(WAIT).value == 2 and later.result(WAIT).value == 6
        assert model.calls == [[1], [3]]
    finally:
        worker.close()
