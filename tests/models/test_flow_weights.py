"""The RTC soft mask and guidance weight match the formulas of DESIGN.md / the paper."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollserve.models.flow_sampling import guidance_weight
from rollserve.rtc.weights import prefix_weights


def expected_weights(delay: int, horizon: int, size: int, schedule: str) -> list[float]:
    out = []
    for i in range(size):
        if i < delay:
            out.append(1.0)
        elif i >= horizon or schedule == "zeros":
            out.append(0.0)
        elif schedule == "ones":
            out.append(1.0)
        else:
            c = (horizon - i) / (horizon - delay + 1)
            out.append(c if schedule == "linear" else c * (math.exp(c) - 1) / (math.e - 1))
    return out


@pytest.mark.parametrize("schedule", ["zeros", "ones", "linear", "exp"])
@pytest.mark.parametrize(("delay", "horizon"), [(0, 10), (3, 10), (10, 10), (0, 1), (5, 16), (2, 2)])
def test_weights_match_formula(schedule: str, delay: int, horizon: int) -> None:
    got = prefix_weights(delay, horizon, 16, schedule)
    assert got.dtype == np.float32 and got.shape == (16,)
    np.testing.assert_allclose(got, expected_weights(delay, horizon, 16, schedule), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("schedule", ["linear", "exp"])
def test_ramp_is_strictly_between_zero_and_one(schedule: str) -> None:
    ramp = prefix_weights(3, 10, 16, schedule)[3:10]
    assert np.all(ramp > 0) and np.all(ramp < 1) and np.all(np.diff(ramp) < 0)


def test_delay_at_horizon_freezes_whole_prefix() -> None:
    np.testing.assert_array_equal(prefix_weights(10, 10, 16, "linear"), [1.0] * 10 + [0.0] * 6)


def test_out_of_range_arguments_are_clamped() -> None:
    np.testing.assert_array_equal(prefix_weights(30, 12, 8, "zeros"), np.ones(8))
    np.testing.assert_array_equal(prefix_weights(-2, 4, 8, "zeros"), np.zeros(8))


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError):
        prefix_weights(1, 4, 8, "cosine")


@pytest.mark.parametrize("tau", [0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95])
@pytest.mark.parametrize("beta", [1.0, 5.0, 10.0])
def test_guidance_weight_formula(tau: float, beta: float) -> None:
    inv_r2 = (tau**2 + (1 - tau) ** 2) / (1 - tau) ** 2
    assert guidance_weight(tau, beta) == pytest.approx(min(beta, (1 - tau) / tau * inv_r2))


def test_guidance_weight_is_clamped_at_the_ends() -> None:
    assert guidance_weight(0.0, 5.0) == 5.0
    assert guidance_weight(1.0, 5.0) == 5.0
    assert guidance_weight(0.5, 100.0) == pytest.approx(2.0)
