"""RTC guidance: a real vector-Jacobian product, and it makes the frozen actions follow the prefix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_sampling import guidance_weight, guided_velocity, sample_chunks
from rollserve.rtc.weights import prefix_weights

H, A, S = 12, 3, 4


@pytest.fixture(scope="module")
def net() -> VelocityNet:
    torch.manual_seed(0)
    return VelocityNet(FlowNetConfig(chunk_size=H, action_dim=A, state_dim=S, hidden_dim=32, depth=2)).eval()


def test_correction_is_the_vjp_through_the_denoiser(net: VelocityNet) -> None:
    torch.manual_seed(1)
    x, state, prefix = torch.randn(1, H, A), torch.randn(1, S), torch.randn(1, H, A)
    weights = torch.from_numpy(prefix_weights(3, 8, H, "exp"))[None]
    tau = 0.4

    def clean(chunk: torch.Tensor) -> torch.Tensor:
        return chunk + (1 - tau) * net(chunk, state, torch.full((1,), tau))

    with torch.no_grad():
        v = net(x, state, torch.full((1,), tau))
        error = ((prefix - clean(x)) * weights[..., None]).flatten()
    jacobian = torch.autograd.functional.jacobian(clean, x).reshape(H * A, H * A)
    expected = v + guidance_weight(tau, 5.0) * (error @ jacobian).reshape(1, H, A)
    got = guided_velocity(net, x, state, tau, prefix, weights, 5.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the Jacobian is not the identity, so this is more than adding the raw error
    assert not torch.allclose(jacobian, torch.eye(H * A), atol=1e-3)


def test_guided_chunk_follows_the_frozen_prefix(net: VelocityNet) -> None:
    delay, horizon, n = 4, 8, 16
    generator = torch.Generator().manual_seed(2)
    state = torch.randn(n, S, generator=generator)
    noise = torch.randn(n, H, A, generator=generator)
    prefix = torch.zeros(n, H, A)
    prefix[:, :horizon] = torch.randn(n, horizon, A, generator=generator)
    weights = torch.from_numpy(prefix_weights(delay, horizon, H, "linear")).expand(n, H)
    plain = sample_chunks(net, state, noise)
    guided = sample_chunks(net, state, noise, prefix=prefix, weights=weights, max_weight=5.0)
    plain_error = (plain - prefix)[:, :delay].abs().mean()
    guided_error = (guided - prefix)[:, :delay].abs().mean()
    assert guided_error * 5 < plain_error, (guided_error, plain_error)


def test_rows_without_weights_sample_plainly(net: VelocityNet) -> None:
    generator = torch.Generator().manual_seed(3)
    state, noise = torch.randn(2, S, generator=generator), torch.randn(2, H, A, generator=generator)
    prefix = torch.randn(2, H, A, generator=generator)
    weights = torch.zeros(2, H)
    weights[0] = torch.from_numpy(prefix_weights(2, 6, H, "linear"))
    plain = sample_chunks(net, state, noise)
    guided = sample_chunks(net, state, noise, prefix=prefix, weights=weights)
    torch.testing.assert_close(guided[1], plain[1])
    assert not torch.allclose(guided[0], plain[0])


def test_no_prefix_means_no_autograd(net: VelocityNet) -> None:
    noise = torch.randn(1, H, A)
    out = sample_chunks(net, torch.zeros(1, S), noise, prefix=None, weights=None)
    assert out.shape == noise.shape and not out.requires_grad
    with pytest.raises(ValueError):
        sample_chunks(net, torch.zeros(1, S), noise, num_steps=0)


def test_guided_velocity_uses_beta_at_tau_zero(net: VelocityNet) -> None:
    x, state, prefix = torch.zeros(1, H, A), torch.zeros(1, S), torch.ones(1, H, A)
    weights = torch.ones(1, H)
    out = guided_velocity(net, x, state, 0.0, prefix, weights, 7.0)
    assert torch.isfinite(out).all()
    np.testing.assert_equal(guidance_weight(0.0, 7.0), 7.0)


def test_zero_padding_of_a_short_prefix_is_not_guided_toward() -> None:
    """A 4-row prefix padded to the horizon guides like the 4 rows alone when prefix_steps says so."""
    from rollserve.models.checkpoint import load_default
    from rollserve.models.policy import PolicyRequest
    from rollserve.rtc.prefix import normalize_prefix_length

    policy = load_default()
    state = np.zeros(policy.metadata.state_dim, np.float32)
    real = np.full((4, policy.metadata.action_dim), 0.5, np.float32)
    padded = normalize_prefix_length(real, policy.rtc.execution_horizon)
    short, marked, unmarked = policy.predict_action_chunks(
        [
            PolicyRequest({"state": state, "seed": 3}, 2, real),
            PolicyRequest({"state": state, "seed": 3}, 2, padded, prefix_steps=4),
            PolicyRequest({"state": state, "seed": 3}, 2, padded),
        ]
    )
    np.testing.assert_allclose(marked, short, atol=1e-5)
    assert np.abs(unmarked[4:10]).mean() < np.abs(marked[4:10]).mean()  # pulled toward the zero rows


def test_a_server_horizon_beyond_the_checkpoints_guides_every_real_row() -> None:
    """Regression: ``rollserve serve --rtc-horizon 16`` advertised 16 and got 16-row prefixes, but
    guidance stopped at the checkpoint's 10, so rows 10..15 changed nothing. A request that says
    how many rows are real (``prefix_steps``, set by the server) is guided over all of them; a
    direct call without it keeps the checkpoint's horizon."""
    from rollserve.models.checkpoint import load_default
    from rollserve.models.policy import PolicyRequest

    policy = load_default()
    assert policy.rtc.execution_horizon == 10 and policy.metadata.chunk_size >= 16
    state = np.zeros(policy.metadata.state_dim, np.float32)
    prefix = np.full((16, policy.metadata.action_dim), 0.5, np.float32)
    changed = prefix.copy()
    changed[10:] = -0.5  # only the rows past the checkpoint's horizon differ

    def chunks(steps: int | None) -> tuple[np.ndarray, np.ndarray]:
        first, second = policy.predict_action_chunks(
            [
                PolicyRequest({"state": state, "seed": 3}, 2, prefix, prefix_steps=steps),
                PolicyRequest({"state": state, "seed": 3}, 2, changed, prefix_steps=steps),
            ]
        )
        return first, second

    served, served_changed = chunks(16)
    assert np.abs(served_changed[10:16] - served[10:16]).mean() > 0.05  # rows 10..15 guide
    direct, direct_changed = chunks(None)
    np.testing.assert_allclose(direct_changed, direct, atol=1e-5)  # the checkpoint's 10 rows only
