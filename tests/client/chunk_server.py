"""A real server of the reference chunk policy, for the robot-client tests (one definition)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits


@contextmanager
def serving_chunk_policy(limits: WireLimits | None = None) -> Iterator[RunningServer]:
    """uvicorn on 127.0.0.1 serving ``ChunkPolicy`` without a batching wait; ``limits`` if given
    (a small frame limit, for the 1009 tests)."""
    settings = ServerSettings(max_batch_wait_ms=0.0, **({"limits": limits} if limits else {}))
    with serving(create_app(settings, policy=PolicyService(ChunkPolicy(), settings))) as running:
        yield running
