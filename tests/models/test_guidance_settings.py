"""The RTC settings a user configures (beta, mask schedule, execution horizon) reach the sampler, and
the sampler's rules (guidance weight, Euler steps) hold. Expected numbers are worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.models import flow_policy
from rollserve.models.checkpoint import load_default
from rollserve.models.flow_sampling import guidance_weight, sample_chunks
from rollserve.rtc import RTCConfig


@pytest.mark.parametrize(
    ("tau", "beta", "expected"),
    [
        (0.5, 5.0, 2.0),  # r^-2 = (0.25 + 0.25) / 0.25 = 2; (0.5 / 0.5) * 2 = 2
        (0.25, 5.0, 3.0 * (0.0625 + 0.5625) / 0.5625),  # 3 * 1.111 = 3.333
        (0.9, 5.0, 5.0),  # (0.1 / 0.9) * 82 = 9.11, clamped at beta
        (0.9, 10.0, (0.1 / 0.9) * 82.0),
        (0.5, 1.5, 1.5),
        (0.0, 7.0, 7.0),  # infinite at both ends: beta
        (1.0, 7.0, 7.0),
    ],
)
def test_guidance_weight_formula(tau: float, beta: float, expected: float) -> None:
    assert guidance_weight(tau, beta) == pytest.approx(expected, rel=1e-12)


def test_euler_steps_run_from_tau_zero_with_equal_steps() -> None:
    taus: list[float] = []

    def velocity(x: torch.Tensor, state: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        taus.append(float(tau[0]))
        return torch.full_like(x, 2.0) + tau[:, None, None]

    noise = torch.zeros(1, 3, 2)
    out = sample_chunks(velocity, torch.zeros(1, 1), noise, num_steps=4)
    assert taus == [0.0, 0.25, 0.5, 0.75]
    # x = sum over steps of dt * (2 + tau) = 0.25 * (8 + 0 + 0.25 + 0.5 + 0.75) = 2.375
    torch.testing.assert_close(out, torch.full((1, 3, 2), 2.375))


class _Spy:
    """Records what ``FlowMatchingPolicy`` hands the sampler, then samples for real."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, velocity: Any, state: torch.Tensor, noise: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        self.calls.append(kwargs)
        return sample_chunks(velocity, state, noise, **kwargs)


def _exp_ramp(r: float) -> float:
    return r * (math.exp(r) - 1.0) / (math.e - 1.0)


@pytest.mark.parametrize(
    ("schedule", "ramp"),
    [("linear", lambda r: r), ("exp", _exp_ramp), ("ones", lambda r: 1.0), ("zeros", lambda r: 0.0)],
)
def test_configured_beta_schedule_and_horizon_reach_the_sampler(
    monkeypatch: pytest.MonkeyPatch, schedule: str, ramp: Any
) -> None:
    spy = _Spy()
    monkeypatch.setattr(flow_policy, "sample_chunks", spy)
    rtc = RTCConfig(
        enabled=True, execution_horizon=6, max_guidance_weight=3.5, prefix_attention_schedule=schedule
    )
    policy = load_default(rtc=rtc, num_steps=3)
    chunk, actions = policy.metadata.chunk_size, policy.metadata.action_dim
    prefix = np.arange(10 * actions, dtype=np.float32).reshape(10, actions) / 100.0
    state = np.zeros(policy.metadata.state_dim, np.float32)
    policy.predict_action_chunk({"state": state, "seed": 1}, inference_delay=2, prev_chunk_left_over=prefix)
    (call,) = spy.calls
    assert call["max_weight"] == 3.5 and call["num_steps"] == 3
    # delay 2, horizon 6: 1, 1, then the ramp r = (6 - i) / (6 - 2 + 1) for i = 2..5, then 0
    expected = [1.0, 1.0] + [ramp((6 - i) / 5) for i in range(2, 6)] + [0.0] * (chunk - 6)
    np.testing.assert_allclose(call["weights"].numpy()[0], expected, rtol=1e-6, atol=1e-7)
    sent = call["prefix"].numpy()[0]
    np.testing.assert_array_equal(sent[:6], prefix[:6])  # cut at the configured horizon...
    assert not sent[6:].any()  # ...and zero beyond it


def _chunk(rtc: RTCConfig, *, delay: int = 2) -> np.ndarray:
    policy = load_default(rtc=rtc)
    state = np.linspace(-0.5, 0.5, policy.metadata.state_dim, dtype=np.float32)
    prefix = np.full((10, policy.metadata.action_dim), 0.8, np.float32)
    return policy.predict_action_chunk(
        {"state": state, "seed": 7}, inference_delay=delay, prev_chunk_left_over=prefix
    )


def test_each_setting_changes_the_chunk_and_beta_zero_means_no_guidance() -> None:
    base = RTCConfig(
        enabled=True, execution_horizon=10, max_guidance_weight=5.0, prefix_attention_schedule="exp"
    )
    reference = _chunk(base)
    for changed in (
        RTCConfig(
            enabled=True, execution_horizon=10, max_guidance_weight=1.0, prefix_attention_schedule="exp"
        ),
        RTCConfig(
            enabled=True, execution_horizon=10, max_guidance_weight=5.0, prefix_attention_schedule="ones"
        ),
        RTCConfig(
            enabled=True, execution_horizon=4, max_guidance_weight=5.0, prefix_attention_schedule="exp"
        ),
    ):
        assert np.abs(_chunk(changed) - reference).max() > 1e-3, changed
    assert np.abs(_chunk(base, delay=5) - reference).max() > 1e-3  # the delay reaches the mask too
    unguided = _chunk(RTCConfig(enabled=False))
    no_weight = _chunk(RTCConfig(enabled=True, execution_horizon=10, max_guidance_weight=0.0))
    np.testing.assert_allclose(no_weight, unguided, atol=1e-6)
    assert np.abs(reference - unguided).max() > 1e-2


def test_the_flow_time_has_the_chunks_dtype_in_guided_and_plain_steps() -> None:
    seen: list[torch.dtype] = []

    def velocity(x: torch.Tensor, state: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        seen.append(tau.dtype)
        return x * tau[:, None, None]

    noise = torch.ones(1, 4, 2, dtype=torch.float64)
    weights = torch.ones(1, 4, dtype=torch.float64)
    sample_chunks(velocity, torch.zeros(1, 1), noise, num_steps=2)
    sample_chunks(
        velocity, torch.zeros(1, 1), noise, num_steps=2, prefix=torch.zeros_like(noise), weights=weights
    )
    assert seen == [torch.float64] * 4
