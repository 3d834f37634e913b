"""RTC's small rules at their boundaries, with values worked out by hand: config validation, the
queue's bookkeeping, the mask's clamping and the latency tracker's window."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rollserve.rtc import ActionQueue, LatencyTracker, RTCConfig, prefix_weights


def test_config_boundaries_and_messages() -> None:
    assert RTCConfig(execution_horizon=1, max_guidance_weight=0.0).execution_horizon == 1
    with pytest.raises(ValueError, match=r"^execution_horizon must be >= 1, got 0$"):
        RTCConfig(execution_horizon=0)
    for weight in ("-0.5", "nan", "inf"):  # a NaN or infinite clamp makes every guided chunk non-finite
        with pytest.raises(ValueError, match=rf"^max_guidance_weight must be finite and >= 0, got {weight}$"):
            RTCConfig(max_guidance_weight=float(weight))
    assert RTCConfig(max_guidance_weight=1e9).max_guidance_weight == 1e9
    expected = "prefix_attention_schedule must be one of ('zeros', 'ones', 'linear', 'exp'), got 'cosine'"
    with pytest.raises(ValueError) as info:
        RTCConfig(prefix_attention_schedule="cosine")  # type: ignore[arg-type]
    assert str(info.value) == expected


def test_tracker_defaults_to_a_16_wide_window_and_accepts_width_one() -> None:
    tracker = LatencyTracker()
    tracker.record(0.9)
    for _ in range(15):
        tracker.record(0.1)
    assert tracker.recent_max() == 0.9  # 16 samples: the first is still in
    tracker.record(0.1)
    assert tracker.recent_max() == 0.1  # the 17th pushes it out
    one = LatencyTracker(window=1, history=1)
    one.record(0.3)
    one.record(0.2)
    assert one.recent_max() == 0.2 and one.percentiles(50) == [0.2] and one.count == 2
    with pytest.raises(ValueError, match=r"^window and history must be >= 1, got 0 and 5$"):
        LatencyTracker(window=0, history=5)
    with pytest.raises(ValueError, match=r"^window and history must be >= 1, got 3 and 0$"):
        LatencyTracker(window=3, history=0)


def _chunk(start: float, n: int = 4) -> np.ndarray:
    return (start + np.arange(n * 2, dtype=np.float32).reshape(n, 2)).astype(np.float32)


def test_queue_counts_down_to_empty_and_then_returns_none() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    queue.merge(_chunk(0), _chunk(100), real_delay=0)
    sizes = []
    for _ in range(4):
        sizes.append(queue.qsize())
        assert queue.get() is not None
    assert sizes == [4, 3, 2, 1] and queue.qsize() == 0 and queue.empty()
    assert queue.get() is None and queue.get() is None  # exhausted, not an error
    assert queue.get_action_index() == 4


def test_clear_leaves_no_left_over_in_either_space() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    queue.merge(_chunk(0), _chunk(100), real_delay=1)
    queue.clear()
    assert queue.get_left_over() is None and queue.get_processed_left_over() is None
    assert queue.qsize() == 0 and queue.get() is None and queue.get_action_index() == 0


def test_a_delay_hint_that_differs_from_what_ran_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    with caplog.at_level(logging.DEBUG, logger="rollserve.rtc.queue"):
        queue.merge(_chunk(0), _chunk(100), real_delay=0)  # default index 0, nothing ran: quiet
        queue.get()
        queue.merge(_chunk(0), _chunk(100), real_delay=1, action_index_before_inference=0)  # 1 ran: quiet
        queue.merge(_chunk(0), _chunk(100), real_delay=2, action_index_before_inference=0)  # 0 ran
        queue.merge(_chunk(0), _chunk(100), real_delay=3, action_index_before_inference=None)  # unknown
        queue.merge(_chunk(0), _chunk(100), real_delay=0, action_index_before_inference=None)  # 4 queued
        queue.get()
        queue.get()
        queue.merge(_chunk(0), _chunk(100), real_delay=1, action_index_before_inference=1)  # 2 - 1 ran: quiet
    assert [r.getMessage() for r in caplog.records] == ["delay hint 2, but 0 actions ran during inference"]


def test_mask_defaults_to_linear_and_clamps_negative_delay_and_horizon() -> None:
    np.testing.assert_allclose(prefix_weights(1, 4, 6), [1.0, 0.75, 0.5, 0.25, 0.0, 0.0])  # (4 - i) / 4
    np.testing.assert_allclose(prefix_weights(-2, 4, 6), [0.8, 0.6, 0.4, 0.2, 0.0, 0.0])  # delay 0: / 5
    np.testing.assert_array_equal(prefix_weights(0, -3, 5), np.zeros(5, np.float32))  # horizon 0
    np.testing.assert_array_equal(prefix_weights(2, -3, 5), np.zeros(5, np.float32))  # delay <= horizon
    assert prefix_weights(1, 4, 6).dtype == np.float32
