"""Shared fixtures of the server tests."""

from __future__ import annotations

from collections.abc import Iterator

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
