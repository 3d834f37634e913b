"""An engine started again after stop() (or entered by a second ``with``) connects again, as its first
start did: against a real server, and raising when the server has gone in between."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, PolicyConnectionError, RemoteInferenceEngine
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, start_in_thread
from rollserve.server.settings import ServerSettings

OBS = {"state": np.zeros(6, np.float32)}


@pytest.fixture
def server() -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = PolicyService(ChunkPolicy(), settings)
    running = start_in_thread(create_app(settings, policy=service))
    yield running
    running.stop()
    service.close()


def _engine(running: RunningServer) -> RemoteInferenceEngine:
    return RemoteInferenceEngine(running.ws_url + "/v1/policy/ws", EngineConfig(fps=100.0), state_dim=6)


def _run_until_merged(engine: RemoteInferenceEngine, chunks: int) -> None:
    def fed() -> bool:
        engine.act(OBS)  # a control step: the queue runs low and the loop asks again
        return engine.stats.chunks_merged >= chunks

    wait_until(fed)


def test_start_after_stop_connects_again(server: RunningServer) -> None:
    """Regression: start() connected only while ``info`` was None, which stop() never cleared: the
    restarted loop ran on the closed client, its first request failed ('not connected'), counted
    an error and marked the engine unhealthy until a reconnect."""
    engine = _engine(server).start()
    try:
        _run_until_merged(engine, 1)
        engine.stop()
        assert not engine.client.connected
        engine.start()
        assert engine.client.connected and engine.client.ack is not None  # a session is open
        _run_until_merged(engine, 2)
        assert engine.stats.errors == 0 and engine.stats.reconnects == 0 and engine.last_error is None
        assert engine.healthy
    finally:
        engine.stop()


def test_a_second_with_block_connects_again(server: RunningServer) -> None:
    engine = _engine(server)
    for _ in range(2):
        with engine:
            assert engine.run_cycle(OBS, delay=0)  # before: PolicyConnectionError('not connected')
        assert not engine.client.connected
    assert engine.stats.chunks_merged == 2


def test_start_after_stop_raises_when_the_server_is_gone(server: RunningServer) -> None:
    """As a first start does: before, it returned and the thread failed in the background."""
    engine = _engine(server).start()
    engine.stop()
    server.stop()
    with pytest.raises(PolicyConnectionError, match="cannot connect"):
        engine.start()
    assert not engine.client.connected
    engine.stop()
