"""Prefix normalisation and the soft-mask schedules, checked against their formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollserve.rtc import LatencyTracker, RTCConfig, normalize_prefix_length, prefix_weights


def test_short_prefix_is_zero_padded_and_long_prefix_truncated() -> None:
    prefix = np.arange(12, dtype=np.float32).reshape(6, 2)
    padded = normalize_prefix_length(prefix, 10)
    assert padded.shape == (10, 2) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:6], prefix)
    assert not padded[6:].any()
    np.testing.assert_array_equal(normalize_prefix_length(prefix, 4), prefix[:4])
    assert normalize_prefix_length(prefix, 6) is prefix


def test_prefix_must_be_two_dimensional() -> None:
    with pytest.raises(ValueError, match="2-D"):
        normalize_prefix_length(np.zeros(5, np.float32), 4)


def test_linear_schedule_matches_formula() -> None:
    delay, horizon, size = 3, 8, 12
    weights = prefix_weights(delay, horizon, size, "linear")
    expected = [1.0] * delay + [(horizon - i) / (horizon - delay + 1) for i in range(delay, horizon)]
    expected += [0.0] * (size - horizon)
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    assert weights.dtype == np.float32


def test_exp_schedule_bends_the_linear_ramp() -> None:
    delay, horizon, size = 2, 9, 10
    linear = prefix_weights(delay, horizon, size, "linear").astype(np.float64)
    weights = prefix_weights(delay, horizon, size, "exp")
    ramp = linear[delay:horizon]
    np.testing.assert_allclose(weights[delay:horizon], ramp * np.expm1(ramp) / (math.e - 1), rtol=1e-6)
    np.testing.assert_array_equal(weights[:delay], 1.0)
    np.testing.assert_array_equal(weights[horizon:], 0.0)


def test_zeros_and_ones_schedules() -> None:
    np.testing.assert_array_equal(prefix_weights(3, 6, 8, "zeros"), [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(prefix_weights(3, 6, 8, "ones"), [1, 1, 1, 1, 1, 1, 0, 0])


@pytest.mark.parametrize("schedule", ["zeros", "ones", "linear", "exp"])
def test_edge_cases_delay_zero_and_delay_past_horizon(schedule: str) -> None:
    at_zero = prefix_weights(0, 5, 8, schedule)
    assert at_zero.shape == (8,) and (at_zero[5:] == 0).all() and (at_zero <= 1).all()
    np.testing.assert_array_equal(prefix_weights(7, 5, 8, schedule), [1, 1, 1, 1, 1, 0, 0, 0])
    assert prefix_weights(2, 20, 8, schedule).shape == (8,)


def test_unknown_schedule_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown prefix schedule"):
        prefix_weights(1, 2, 3, "cosine")
    with pytest.raises(ValueError, match="prefix_attention_schedule"):
        RTCConfig(prefix_attention_schedule="cosine")  # type: ignore[arg-type]


def test_delay_estimate_uses_recent_maximum() -> None:
    tracker = LatencyTracker(window=3)
    for seconds in (0.30, 0.05, 0.04, 0.06):  # 0.30 has left the window
        tracker.record(seconds)
    assert tracker.recent_max() == pytest.approx(0.06)
    assert tracker.delay_steps(dt=0.02) == 3
    assert tracker.delay_steps(dt=0.02, max_steps=2) == 2
    assert tracker.delay_steps(dt=0.03) == 2
    p50, p99 = tracker.percentiles(50, 99)
    assert 0.05 <= p50 <= 0.06 and p99 <= 0.30
