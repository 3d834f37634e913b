"""The client's delay estimate: ``ceil(max of the last `window` round trips / dt)``, capped at the
horizon. Expected values are worked out by hand in each test, not by calling the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollserve.client import EngineConfig
from rollserve.client.inference_loop import ChunkRequest, InferenceEngine, SourceInfo
from rollserve.rtc import LatencyTracker, RTCConfig
from rollserve.wire import ActionChunkMsg, MsgHeader


@pytest.mark.parametrize(
    ("latency_ms", "fps", "steps"),
    [
        (149, 10, 2),  # 1.49 ticks -> 2 (rounded up, never down)
        (100, 10, 1),  # exactly one tick -> 1
        (140, 50, 7),  # 0.14 / 0.02 is 7.000000000000001 in floats: still 7, no extra step from noise
        (101, 10, 2),
        (0.5, 10, 1),  # any latency costs at least one step
        (0, 10, 0),
        (250, 20, 5),  # 5 ticks of 50 ms exactly
        (66.7, 15, 2),  # 1.0005 ticks -> 2
    ],
)
def test_delay_is_the_latency_in_ticks_rounded_up(latency_ms: float, fps: float, steps: int) -> None:
    tracker = LatencyTracker()
    tracker.record(latency_ms / 1000.0)
    assert tracker.delay_steps(1.0 / fps) == steps


def test_the_estimate_uses_the_maximum_of_the_last_window_round_trips() -> None:
    tracker = LatencyTracker(window=4)
    for ms in (390, 120, 80, 95, 110):  # 390 ms is the 5th-newest: out of a 4-wide window
        tracker.record(ms / 1000.0)
    assert tracker.recent_max() == pytest.approx(0.120)
    assert tracker.delay_steps(0.1) == 2  # ceil(1.2), not ceil(3.9) = 4 and not the mean
    tracker.record(0.05)  # pushes 120 out: the max of (80, 95, 110, 50) is 110
    assert tracker.delay_steps(0.1) == 2
    for _ in range(3):
        tracker.record(0.05)  # 110 leaves too: the max is 50 ms
    assert tracker.delay_steps(0.1) == 1


def test_the_estimate_is_capped_and_zero_without_a_clock() -> None:
    tracker = LatencyTracker()
    assert tracker.delay_steps(0.1) == 0 and tracker.recent_max() == 0.0  # nothing measured yet
    tracker.record(0.95)
    assert tracker.delay_steps(0.1) == 10
    assert tracker.delay_steps(0.1, max_steps=6) == 6
    assert tracker.delay_steps(0.1, max_steps=12) == 10
    assert tracker.delay_steps(0.0) == 0 and tracker.delay_steps(-1.0) == 0


def test_history_is_bounded_and_percentiles_use_the_kept_round_trips() -> None:
    tracker = LatencyTracker(window=2, history=100)
    for i in range(1000):
        tracker.record(i / 1000.0)  # 0 ms .. 999 ms
    assert tracker.count == 1000  # every round trip counted
    assert len(tracker._history) == 100  # only the last 100 kept
    kept = np.arange(900, 1000) / 1000.0
    p0, p50, p100 = tracker.percentiles(0, 50, 100)
    assert (p0, p100) == (0.9, 0.999)
    assert p50 == pytest.approx((0.949 + 0.950) / 2)
    assert p50 == pytest.approx(float(np.median(kept)))
    assert all(math.isnan(v) for v in LatencyTracker().percentiles(50, 99))


def test_window_and_history_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LatencyTracker(window=0)
    with pytest.raises(ValueError):
        LatencyTracker(history=0)


class _Clocked:
    """A chunk source that 'takes' a given latency: the engine measures it with perf_counter."""

    epoch = 0

    def __init__(self) -> None:
        self.sent_delays: list[int] = []

    def connect(self) -> SourceInfo:
        return SourceInfo(chunk_size=16, action_dim=2, execution_horizon=8, rtc_supported=True)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        self.sent_delays.append(request.inference_delay)
        header = MsgHeader(seq_id=request.seq_id, episode_id=request.episode_id)
        chunk = np.zeros((16, 2), np.float32)
        return ActionChunkMsg(chunk_model=chunk, chunk_robot=chunk, header=header)

    def reset(self, episode_id: int) -> None: ...
    def reconnect(self) -> SourceInfo:
        return self.connect()

    def close(self) -> None: ...


def test_the_engine_sends_the_estimate_for_its_fps_capped_at_the_servers_horizon() -> None:
    source = _Clocked()
    engine = InferenceEngine(source, EngineConfig(fps=10, rtc=RTCConfig(enabled=True, execution_horizon=10)))
    engine.connect()  # the server's horizon (8) wins over the config's (10)
    engine.latency.record(0.149)
    engine.run_cycle({"state": np.zeros(2, np.float32)})
    assert source.sent_delays == [2]  # 149 ms at 10 Hz
    for _ in range(16):
        engine.latency.record(0.95)  # 9.5 ticks, capped at the horizon 8
    engine.run_cycle({"state": np.zeros(2, np.float32)})
    assert source.sent_delays[-1] == 8
    assert engine.latency_stats()["delay_steps"] == 8
