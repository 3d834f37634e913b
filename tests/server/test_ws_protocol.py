"""The server's websocket protocol: a lock-step robot never makes the server pause reading, a
flooding client still does (bounded buffering), and every reply still comes, in order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from websockets.sync.client import connect

from rollserve.models.simple_policies import echo_policy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import packb, unpackb


def _libero_obs(value: float) -> dict[str, Any]:
    image = np.zeros((8, 8, 3), np.uint8)
    state = np.full(8, value, np.float32)
    return {"observation/image": image, "observation/wrist_image": image, "observation/state": state}


@pytest.fixture
def server() -> Iterator[RunningServer]:
    """On asyncio's own loop: ``pauses`` counts on its socket transports (uvloop's are C types; the
    protocol's logic is the same on both loops)."""
    service = PolicyService(echo_policy())
    with serving(create_app(ServerSettings(event_loop="asyncio"), policy=service)) as running:
        yield running


def test_a_lock_step_client_never_pauses_the_socket(server: RunningServer, pauses: list[int]) -> None:
    with connect(server.ws_url + "/", max_size=None) as ws:
        unpackb(ws.recv())  # metadata
        for step in range(20):
            ws.send(packb(_libero_obs(step / 100)))
            reply = unpackb(ws.recv())
            np.testing.assert_allclose(reply["actions"][0], np.full(7, step / 100, np.float32))
    assert pauses == []


def test_a_flooding_client_is_paused_and_still_answered_in_order(
    server: RunningServer, pauses: list[int]
) -> None:
    with connect(server.ws_url + "/", max_size=None) as ws:
        unpackb(ws.recv())
        for step in range(8):
            ws.send(packb(_libero_obs(step / 100)))
        firsts = [float(unpackb(ws.recv())["actions"][0, 0]) for _ in range(8)]
    assert firsts == pytest.approx([step / 100 for step in range(8)])
    assert pauses  # the backlog stopped reading at least once
