"""One explicit settings object for the server: every knob a deployment may turn, with safe defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from rollserve.wire.limits import WireLimits


@dataclass(frozen=True)
class ServerSettings:
    """Server-wide settings. Binds to loopback unless told otherwise.

    Every limit here is a ``rollserve serve`` flag (docs/protocol.md and docs/rollout.md list them);
    the defaults keep one hostile or sloppy client from stalling or starving the others.
    """

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
    # policy websockets: a connection that sends nothing for this long is closed (pings do not count)
    policy_idle_timeout_s: float = 120.0
    max_connections_per_client: int = 32  # policy websockets per client address
    # rollout service
    max_rollout_sessions: int = 256
    rollout_idle_ttl_s: float = 600.0
    rollout_status_codes: str = "vllm-omni"  # or "strict"; see server/rollout/status_codes.py
    max_body_bytes: int = 16 * 1024 * 1024  # one REST body (JSON or msgpack)
    max_json_values: int = 65_536  # values in one JSON body: bounds the time json.loads holds the GIL
    # HTTP connections
    header_timeout_s: float = 10.0  # headers must arrive within this (closed at 1x-1.5x it)
    max_header_bytes: int = 64 * 1024
    keep_alive_timeout_s: float = 5.0  # idle keep-alive connections are closed after this
    max_connections: int = 2048  # open connections and tasks; above it, new requests get 503
    # "auto": uvloop where it is installed (not a dependency), else asyncio's; or either by name
    event_loop: str = "auto"
    # a refused input that brings its connection's refusal count to k is answered (REST) or its next
    # message read (websockets) after min(refusal_delay_max_ms, refusal_delay_ms * 2**(k-1)); an
    # accepted input halves the count; 0 turns it off
    refusal_delay_ms: float = 1.0
    refusal_delay_max_ms: float = 100.0
    # inputs of connections with a refusal streak handled at once (per transport); 0: no limit
    refused_connection_lanes: int = 1
    # wire limits, shared by every transport
    limits: WireLimits = field(default_factory=WireLimits)
