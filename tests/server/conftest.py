"""Shared fixtures of the server tests."""

from __future__ import annotations

import asyncio.selector_events
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """A real server over the toy world (127.0.0.1, an ephemeral port), one per test module; a module
    that defines its own ``http`` uses that one instead."""
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=60.0) as client:
        yield client


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts ``pause_reading`` on every asyncio socket transport, for servers this process runs on
    asyncio's own loop (uvloop's transports are C types)."""
    calls: list[int] = []
    original = asyncio.selector_events._SelectorTransport.pause_reading

    def counting(self: Any) -> None:
        calls.append(1)
        original(self)

    monkeypatch.setattr(asyncio.selector_events._SelectorTransport, "pause_reading", counting)
    return calls
