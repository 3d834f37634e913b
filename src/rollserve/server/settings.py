"""One explicit settings object for the server: every knob a deployment may turn, with safe defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollserve.wire.limits import WireLimits


@dataclass(frozen=True)
class ServerSettings:
    """Server-wide settings. Binds to loopback unless told otherwise."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    # policy engine
    max_batch_size: int = 8
    max_batch_wait_ms: float = 2.0
    # a request may run on the event loop (no thread hand-off) when the engine is idle and the
    # policy's recent calls all took less than this; 0 always hands off to the engine thread
    inline_below_ms: float = 0.25
    max_policy_sessions: int = 64
    # rollout service
    max_rollout_sessions: int = 256
    rollout_idle_ttl_s: float = 600.0
    rollout_status_codes: str = "vllm-omni"  # or "strict"; see server/rollout/status_codes.py
    # wire limits, shared by every transport
    limits: WireLimits = field(default_factory=WireLimits)
