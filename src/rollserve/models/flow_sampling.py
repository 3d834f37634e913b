"""Euler sampling of a flow-matching policy, with real-time chunking (RTC) guidance.

Flow time ``tau`` runs from 0 (noise) to 1 (data), as in Black, Galliker, Levine (2025),
Algorithm 1. Guidance pulls the predicted clean chunk toward the prefix ``Y`` (the part of the
previous chunk that will still execute) through a vector-Jacobian product of the weighted error
through the denoiser, so the whole chunk bends smoothly, not only the frozen actions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

VelocityFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``v(A_tau (B, H, A), state (B, S), tau (B,)) -> (B, H, A)``."""


def guidance_weight(tau: float, max_weight: float) -> float:
    """``min(beta, (1 - tau) / tau * r^-2)`` with ``r^-2 = (tau^2 + (1 - tau)^2) / (1 - tau)^2``.

    The unclamped weight is infinite at both ends of the flow (tau = 0 and tau = 1), so it is
    ``beta`` there.
    """
    if tau <= 0.0 or tau >= 1.0:
        return max_weight
    inv_r2 = (tau**2 + (1.0 - tau) ** 2) / (1.0 - tau) ** 2
    return min(max_weight, (1.0 - tau) / tau * inv_r2)


def guided_velocity(
    velocity: VelocityFn,
    chunk: torch.Tensor,
    state: torch.Tensor,
    tau: float,
    prefix: torch.Tensor,
    weights: torch.Tensor,
    max_weight: float,
) -> torch.Tensor:
    """One RTC-guided velocity (paper, Algorithm 1, ``GetVelocity`` with Pi-GDM guidance).

    ``prefix`` is ``(B, H, A)`` (zeros past the execution horizon), ``weights`` ``(B, H)`` the soft
    mask. Rows whose weights are all zero get exactly the plain velocity.
    """
    x = chunk.detach().requires_grad_(True)
    tau_vec = torch.full((x.shape[0],), tau, dtype=x.dtype, device=x.device)
    with torch.enable_grad():
        v = velocity(x, state, tau_vec)
        clean = x + (1.0 - tau) * v
        error = (prefix - clean) * weights[..., None]
        (correction,) = torch.autograd.grad(clean, x, grad_outputs=error.detach())
    return (v + guidance_weight(tau, max_weight) * correction).detach()


@torch.no_grad()
def sample_chunks(
    velocity: VelocityFn,
    state: torch.Tensor,
    noise: torch.Tensor,
    *,
    num_steps: int = 10,
    prefix: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    max_weight: float = 5.0,
) -> torch.Tensor:
    """Integrate ``dA/dtau = v`` from ``noise`` (tau = 0) to a chunk (tau = 1) in ``num_steps`` Euler steps.

    With ``prefix`` and ``weights`` given (and some weight non-zero) every step is RTC-guided; the
    batch shares the flow time, items differ only by their prefix and mask.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    guided = prefix is not None and weights is not None and bool(torch.any(weights > 0))
    x = noise
    dt = 1.0 / num_steps
    for step in range(num_steps):
        tau = step * dt
        if guided:
            v = guided_velocity(velocity, x, state, tau, prefix, weights, max_weight)
        else:
            tau_vec = torch.full((x.shape[0],), tau, dtype=x.dtype, device=x.device)
            v = velocity(x, state, tau_vec)
        x = x + dt * v
    return x
