"""The robot loop's rules that its first mutation run (`robot_loop` in tools/mutation.py) found
unchecked: ``latency_stats()`` key by key (30 survivors), what a request carries, the sequence,
delay and episode rules, the counters, the fallback's shape, the backoff and the log lines."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, LocalInferenceEngine
from rollserve.client.inference_loop import ChunkRequest, InferenceEngine, SourceInfo
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.rtc.latency import LatencyTracker
from rollserve.wire import ActionChunkMsg, MsgHeader
from rollserve.wire.errors import FRAME_TOO_LARGE

OBS = {"state": np.linspace(0, 1, 6, dtype=np.float32)}


def test_latency_stats_reports_every_documented_figure_in_milliseconds() -> None:
    engine = LocalInferenceEngine(ChunkPolicy(latency_s=0.02), EngineConfig(fps=100.0))
    engine.connect()
    for _ in range(3):
        assert engine.run_cycle(OBS, delay=0)
    stats = engine.stats  # distinct values, so a key reading the wrong counter shows
    stats.chunks_merged, stats.dropped_replies, stats.starved_steps, stats.reconnects, stats.errors = (
        3,
        4,
        5,
        6,
        7,
    )
    stats.last_queue_wait_ms, stats.last_inference_ms, stats.last_batch_size = 8.5, 9.5, 10
    p50, p90, p99 = engine.latency.percentiles(50, 90, 99)
    assert p50 >= 0.02  # each call took at least the policy's 20 ms: seconds here, milliseconds below
    assert engine.latency_stats() == {
        "count": 3,
        "p50_ms": p50 * 1000.0,
        "p90_ms": p90 * 1000.0,
        "p99_ms": p99 * 1000.0,
        "recent_max_ms": engine.latency.recent_max() * 1000.0,
        "delay_steps": engine.estimated_delay(),
        "chunks_merged": 3,
        "dropped_replies": 4,
        "starved_steps": 5,
        "reconnects": 6,
        "errors": 7,
        "last_queue_wait_ms": 8.5,
        "last_inference_ms": 9.5,
        "last_batch_size": 10,
    }


# -- the rest of the loop's rules, each found unchecked by the same run ------------------------------
class _ScriptedSource:
    """A 4 x 2 chunk source that records what it is asked; ``failures`` are raised by ``infer`` in
    turn (then it answers), ``refusals`` by ``reconnect``. A unit test of the loop alone."""

    epoch = 0

    def __init__(self, failures: tuple[Exception, ...] = (), refusals: tuple[Exception, ...] = ()) -> None:
        self.requests: list[ChunkRequest] = []
        self.resets: list[int] = []
        self.connects = self.closes = 0
        self.rtc_supported = True
        self.reconnects = 0
        self.failures = list(failures)
        self.refusals = list(refusals)
        self.chunk = np.arange(8, dtype=np.float64).reshape(4, 2)  # float64: what the loop must cast
        self.reply_epoch: int | None = None  # set: replies stamped with this epoch, not the session's
        self.reply_figures = {"queue_wait_ms": 1.5, "inference_ms": 2.5, "batch_size": 3}

    def connect(self) -> SourceInfo:
        self.connects += 1
        return SourceInfo(chunk_size=4, action_dim=2, execution_horizon=3, rtc_supported=self.rtc_supported)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        self.requests.append(request)
        if self.failures:
            raise self.failures.pop(0)
        epoch = self.epoch if self.reply_epoch is None else self.reply_epoch
        header = MsgHeader(seq_id=request.seq_id, episode_id=request.episode_id, session_epoch=epoch)
        return ActionChunkMsg(
            chunk_model=self.chunk, chunk_robot=self.chunk + 100, header=header, **self.reply_figures
        )

    def reset(self, episode_id: int) -> None:
        self.resets.append(episode_id)

    def reconnect(self) -> SourceInfo:
        self.reconnects += 1
        if self.refusals:
            raise self.refusals.pop(0)
        return self.connect()

    def close(self) -> None:
        self.closes += 1


class _HeldSource(_ScriptedSource):
    """``infer`` waits inside the request until released."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.release = threading.Event(), threading.Event()

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        self.inside.set()
        assert self.release.wait(20)
        return super().infer(request)


class _RecordedWaits(threading.Event):
    """The engine's stop event, with every backoff wait recorded and returned at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)  # type: ignore[arg-type]
        return False


def _stepped(source: _ScriptedSource, **config: Any) -> InferenceEngine:
    engine = InferenceEngine(source, EngineConfig(fps=100.0, **config))
    engine.connect()
    return engine


def test_an_observation_message_carries_the_request_the_loop_built() -> None:
    prefix_model, prefix_robot = np.ones((2, 2), np.float32), np.full((2, 2), 2.0, np.float32)
    request = ChunkRequest({"state": [0.5, 1.5]}, 3, prefix_model, prefix_robot, seq_id=7, episode_id=4)
    before = time.monotonic_ns()
    message = request.to_message(9, jpeg_quality=80)
    after = time.monotonic_ns()
    assert message.state is not None and message.state.dtype == np.float32  # a list (or float64) is cast
    np.testing.assert_array_equal(message.state, [0.5, 1.5])
    assert message.prefix_model is prefix_model and message.prefix_robot is prefix_robot
    assert message.inference_delay_steps == 3 and message.jpeg_quality == 80 and message.task == ""
    header = message.header
    assert (header.seq_id, header.episode_id, header.session_epoch) == (7, 4, 9)
    assert before <= header.client_mono_ns <= after  # when it was built: the server's clock offset uses it
    defaults = ChunkRequest({}, 0, None, None, seq_id=1, episode_id=0).to_message(0)
    assert defaults.state is None and defaults.images == {} and defaults.jpeg_quality == 0
    assert defaults.task == ""


@pytest.mark.parametrize(
    ("observation_task", "config_task", "sent"),
    [("open the drawer", "stack", "open the drawer"), (None, "stack", "stack"), ("", "stack", "stack")],
)
def test_the_observations_task_wins_over_the_configured_one(
    observation_task: str | None, config_task: str, sent: str
) -> None:
    observation: dict[str, Any] = {"state": [0.0]}
    if observation_task is not None:
        observation["task"] = observation_task
    message = ChunkRequest(observation, 0, None, None, seq_id=1, episode_id=0).to_message(0, task=config_task)
    assert message.task == sent


def test_each_cycle_sends_the_next_sequence_number_the_stored_observation_and_the_given_delay() -> None:
    source = _ScriptedSource()
    engine = _stepped(source)
    with pytest.raises(ValueError, match=r"^no observation yet$"):
        engine.run_cycle()
    engine.update_observation({"state": [1.0], "tag": "stored"})
    assert engine.run_cycle(delay=0)  # no observation given: the latest one the control loop stored
    assert source.requests[0].observation["tag"] == "stored"
    engine.get_action()  # one action executed: a prefix of three (the horizon) is left over
    assert engine.run_cycle(OBS, delay=2)
    assert engine.run_cycle(OBS, delay=1)
    assert [r.seq_id for r in source.requests] == [1, 2, 3]
    assert [r.inference_delay for r in source.requests] == [0, 2, 1]
    second = source.requests[1]
    assert second.prefix_model is not None and second.prefix_robot is not None
    np.testing.assert_array_equal(second.prefix_model, source.chunk[1:4])
    np.testing.assert_array_equal(second.prefix_robot, source.chunk[1:4] + 100)
    assert second.prefix_model.dtype == second.prefix_robot.dtype == np.float32  # float64 replies, cast


def test_a_given_delay_is_the_delay_merged_with() -> None:
    source = _ScriptedSource()
    engine = _stepped(source)
    assert engine.run_cycle(OBS, delay=2)  # nothing executed while it ran: only the delay given skips
    assert engine.queue.qsize() == 2
    np.testing.assert_array_equal(engine.get_action(), source.chunk[2] + 100)


def test_the_latency_recorded_is_the_round_trips_duration() -> None:
    engine = _stepped(_ScriptedSource())
    started = time.perf_counter()
    engine.run_cycle(OBS, delay=0)
    took = time.perf_counter() - started
    assert engine.latency.count == 1
    assert 0 <= engine.latency.recent_max() <= took


def test_the_last_replys_figures_and_every_dropped_reply_are_counted() -> None:
    source = _ScriptedSource()
    engine = _stepped(source)
    assert engine.run_cycle(OBS, delay=0)
    assert (engine.stats.last_queue_wait_ms, engine.stats.last_inference_ms) == (1.5, 2.5)
    assert engine.stats.last_batch_size == 3
    source.epoch, source.reply_epoch = 5, 4  # replies of an epoch the session has left are stale
    source.reply_figures = {"queue_wait_ms": 4.0, "inference_ms": 5.0, "batch_size": 6}
    for _ in range(3):
        assert engine.run_cycle(OBS, delay=0) is False
    assert engine.stats.dropped_replies == 3 and engine.stats.chunks_merged == 1
    assert (engine.stats.last_queue_wait_ms, engine.stats.last_inference_ms) == (4.0, 5.0)
    assert engine.stats.last_batch_size == 6  # a dropped reply's figures are still the last reply's


def test_every_starved_step_is_counted_and_the_zero_fallback_is_one_float32_action() -> None:
    engine = _stepped(_ScriptedSource(), fallback="zero")
    engine.run_cycle(OBS, delay=0)
    for _ in range(4):
        engine.get_action()
    starved = [engine.get_action() for _ in range(3)]
    assert engine.stats.starved_steps == 3
    for action in starved:
        assert action is not None and action.shape == (2,) and action.dtype == np.float32
        assert not action.any()


def test_each_reset_starts_the_next_episode_and_resets_the_source_once() -> None:
    source = _ScriptedSource()
    engine = _stepped(source, fallback="repeat")
    engine.run_cycle(OBS, delay=0)
    engine.get_action()
    engine.reset()
    assert engine.get_action() is None  # nothing to repeat: the old episode's last action is forgotten
    engine.reset()
    assert engine.episode_id == 2
    for _ in range(3):
        assert engine.run_cycle(OBS, delay=0)
    assert source.resets == [2]  # once, before the first request of the new episode
    assert [r.episode_id for r in source.requests] == [0, 2, 2, 2]


def test_a_stop_without_a_request_in_flight_closes_the_source_once_and_the_thread_is_a_daemon() -> None:
    source = _ScriptedSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0))
    engine.start()
    try:
        thread = engine._thread
        assert thread is not None and thread.name == "rollserve-inference"
        assert thread.daemon  # an engine left running never keeps the robot's program from exiting
        engine.update_observation(OBS)
        wait_until(lambda: engine.stats.chunks_merged >= 1)
    finally:
        engine.stop()
    assert source.closes == 1
    assert not thread.is_alive()


def test_backoff_first_failure_reconnects_at_once_then_waits_double_up_to_the_maximum() -> None:
    source = _ScriptedSource(failures=tuple(ConnectionError("down") for _ in range(5)))
    engine = _stepped(source, backoff_initial_s=0.1, backoff_max_s=0.5)
    engine._stop = waits = _RecordedWaits()  # the loop's own thread, its waits recorded, not slept
    engine.start()
    try:
        wait_until(lambda: engine.act(OBS) is not None or engine.stats.chunks_merged >= 1)
    finally:
        engine.stop()
    assert waits.waits == [0.1, 0.2, 0.4, 0.5]  # none before the first reconnect; 0.8 capped at 0.5
    assert source.reconnects == 5 and engine.stats.reconnects == 5 and engine.stats.errors == 5
    assert engine.healthy


class _Refusal(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"{code}: refused")
        self.code = code


@pytest.mark.parametrize(
    ("failure", "level", "message", "waits"),
    [
        (ConnectionError("gone"), "WARNING", "policy source unavailable (gone); reconnecting", []),
        (_Refusal("unknown_session"), "WARNING", "session lost (unknown_session: refused); reopening", []),
        (_Refusal("stale_epoch"), "WARNING", "session lost (stale_epoch: refused); reopening", []),
        (_Refusal(FRAME_TOO_LARGE), "ERROR", f"{FRAME_TOO_LARGE}: refused; reconnecting in 0.10s", [0.1]),
        (KeyError("images"), "ERROR", "inference request failed; retrying in 0.10s", [0.1]),
    ],
    ids=["connection", "unknown-session", "stale-epoch", "frame-too-large", "other"],
)
def test_each_kind_of_failure_is_logged_in_its_words_and_handled_its_way(
    failure: Exception, level: str, message: str, waits: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    source = _ScriptedSource()
    engine = _stepped(source, backoff_initial_s=0.1)
    engine._stop = recorded = _RecordedWaits()
    with caplog.at_level("INFO", logger="rollserve.client.inference_loop"):
        engine._on_failure(failure)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(level, message)]
    assert recorded.waits == waits  # a frame over the limit waits even on the first failure
    assert source.reconnects == (0 if isinstance(failure, KeyError) else 1)  # other failures: no reconnect
    assert engine.stats.errors == 1 and engine.last_error is failure and not engine.healthy


@pytest.mark.parametrize(
    ("refusal", "level", "message"),
    [
        (ConnectionRefusedError("refused"), "INFO", "reconnect failed (refused); retrying in 0.10s"),
        (_Refusal("session_rejected"), "ERROR", "reopening the session failed (session_rejected: refused); "
         "retrying in 0.10s"),
    ],
    ids=["unreachable", "refused"],
)  # fmt: skip
def test_a_failed_reconnect_is_logged_counted_and_retried_after_the_backoff(
    refusal: Exception, level: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = _ScriptedSource(refusals=(refusal,))
    engine = _stepped(source, backoff_initial_s=0.1)
    engine._stop = recorded = _RecordedWaits()
    with caplog.at_level("INFO", logger="rollserve.client.inference_loop"):
        engine._on_failure(ConnectionError("gone"))
    assert [(r.levelname, r.getMessage()) for r in caplog.records][1:] == [(level, message)]
    assert recorded.waits == [0.1] and source.reconnects == 2
    assert engine.stats.errors == 2 and engine.stats.reconnects == 1 and engine.last_error is refusal


def test_a_stop_that_times_out_says_so_and_a_second_start_names_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = _HeldSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0))
    engine.start()
    engine.update_observation(OBS)
    assert source.inside.wait(20)
    with caplog.at_level("WARNING", logger="rollserve.client.inference_loop"):
        engine.stop(timeout=0.05)
    assert [r.getMessage() for r in caplog.records] == [
        "inference thread still in a request after 0.1s; it closes the source"
    ]
    with pytest.raises(
        RuntimeError, match=r"^the stopped inference thread is still finishing a request; retry later$"
    ):
        engine.start()
    source.release.set()
    wait_until(lambda: source.closes == 1)


def test_before_the_source_says_its_action_size_the_zero_fallback_sends_nothing() -> None:
    engine = InferenceEngine(_ScriptedSource(), EngineConfig(fallback="zero"))
    assert engine.get_action() is None  # not connected: no action size to make zeros of
    assert engine.stats.starved_steps == 1


def test_a_source_that_gains_rtc_on_a_reconnect_gets_prefixes_and_replaced_chunks() -> None:
    source = _ScriptedSource()
    source.rtc_supported = False
    engine = _stepped(source)
    for _ in range(2):
        engine.run_cycle(OBS, delay=0)
    assert engine.queue.qsize() == 8  # no RTC on the server: chunks append, no prefix is sent
    assert [r.prefix_model for r in source.requests] == [None, None]
    source.rtc_supported = True
    engine.connect()  # e.g. a reconnect to a server that does RTC
    engine.run_cycle(OBS, delay=0)
    engine.run_cycle(OBS, delay=0)
    assert engine.queue.qsize() == 4  # the last chunk replaced the rest
    assert source.requests[-1].prefix_model is not None


def test_the_loop_asks_once_the_queue_holds_the_delay_plus_the_margin() -> None:
    engine = _stepped(_ScriptedSource(), refill_margin=2)
    engine.run_cycle(OBS, delay=0)
    engine.update_observation(OBS)  # a fresh observation: only the queue's size decides now
    engine.get_action()
    engine.latency = LatencyTracker(engine.config.latency_window)  # round trips of a known length
    engine.latency.record(0.005)
    assert engine.estimated_delay() == 1  # half a step at 100 Hz: one action runs meanwhile
    assert engine.queue.qsize() == 3 and engine._wants_chunk()  # 3 <= 1 + 2
    engine.latency = LatencyTracker(engine.config.latency_window)
    assert engine.estimated_delay() == 0
    assert not engine._wants_chunk()  # 3 > 0 + 2
    engine.get_action()
    assert engine.queue.qsize() == 2 and engine._wants_chunk()  # 2 <= 0 + 2: at the bound, asks


def test_start_after_connect_does_not_connect_again() -> None:
    source = _ScriptedSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0))
    engine.connect()
    engine.start()
    try:
        assert source.connects == 1
    finally:
        engine.stop()


def test_stop_gives_a_request_in_flight_five_seconds_by_default() -> None:
    """docs/client.md: ``stop(timeout=5.0)``. The thread's join is recorded, not waited for."""

    class JoinRecorded:
        def __init__(self) -> None:
            self.joins: list[float] = []

        def join(self, timeout: float) -> None:
            self.joins.append(timeout)

    source = _ScriptedSource()
    engine = _stepped(source)
    engine._thread = thread = JoinRecorded()  # type: ignore[assignment]
    engine.stop()
    assert thread.joins == [5.0] and source.closes == 1
