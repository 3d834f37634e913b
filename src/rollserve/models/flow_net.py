"""The velocity network of the reference flow-matching policy: ``v(A_tau, state, tau)``.

A residual MLP over the flattened action chunk, conditioned on the normalised robot state and a
sinusoidal embedding of the flow time. Small on purpose: it trains in minutes on a laptop CPU and
keeps the shipped checkpoint to a few megabytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class FlowNetConfig:
    """Shape of the velocity network; stored verbatim in a checkpoint's ``config.json``."""

    chunk_size: int = 16
    action_dim: int = 8
    state_dim: int = 16
    hidden_dim: int = 256
    depth: int = 3
    time_embed_dim: int = 64

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowNetConfig:
        return cls(**{key: int(value) for key, value in data.items() if key in cls.__dataclass_fields__})


def time_embedding(tau: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of ``tau`` in [0, 1], shape ``(B, dim)``; frequencies from 1 to 1000."""
    half = dim // 2
    freqs = torch.exp(torch.linspace(0.0, math.log(1000.0), half, device=tau.device, dtype=tau.dtype))
    angles = tau[:, None] * freqs[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class _Block(nn.Module):
    """Pre-norm residual block; the condition shifts the hidden activation (FiLM without scale)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, hidden)
        self.cond = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(nn.functional.silu(self.fc1(self.norm(h)) + self.cond(cond)))


class VelocityNet(nn.Module):
    """``v(A_tau, state, tau)``: flow velocity for a batch of chunks ``(B, H, A)``.

    Works item by item (no batch statistics), so a batched forward equals per-item forwards and the
    RTC vector-Jacobian product of a batch is the stack of per-item products.
    """

    def __init__(self, config: FlowNetConfig) -> None:
        super().__init__()
        self.config = config
        chunk_flat = config.chunk_size * config.action_dim
        hidden = config.hidden_dim
        self.cond_mlp = nn.Sequential(
            nn.Linear(config.state_dim + config.time_embed_dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
        )
        self.inp = nn.Linear(chunk_flat + hidden, hidden)
        self.blocks = nn.ModuleList(_Block(hidden) for _ in range(config.depth))
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, chunk_flat)

    def forward(self, chunk: torch.Tensor, state: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        batch = chunk.shape[0]
        if tau.ndim == 0:
            tau = tau.expand(batch)
        cond_in = torch.cat([state, time_embedding(tau.to(chunk.dtype), self.config.time_embed_dim)], dim=-1)
        cond = self.cond_mlp(cond_in)
        h = self.inp(torch.cat([chunk.reshape(batch, -1), cond], dim=-1))
        for block in self.blocks:
            h = block(h, cond)
        return self.out(self.out_norm(h)).reshape(chunk.shape)
