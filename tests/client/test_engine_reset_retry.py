"""A reset the server refuses (its policy's make_processors() failed) is retried, never dropped:
until it lands the engine sends nothing for the new episode and is unhealthy; once it lands the new
episode runs on fresh processors. Against a real server, stepping and with the background thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, RemoteInferenceEngine, ServerError
from rollserve.models.policy import Processors
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

OBS = {"state": np.zeros(6, np.float32)}


class CountingPolicy(ChunkPolicy):
    """Per-session processors that count their calls (like a history buffer): action 0 of every
    chunk is the number of chunks this session's processors have made. make_processors() fails
    while ``broken`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = threading.Event()

    def make_processors(self) -> Processors:
        if self.broken.is_set():
            raise OSError("normalisation stats temporarily unreadable")
        calls = [0]

        def post(chunk: np.ndarray) -> np.ndarray:
            calls[0] += 1
            out = np.array(chunk, np.float32)
            out[:, 0] = calls[0]
            return out

        return Processors(pre=self.preprocess, post=post)


@pytest.fixture
def served() -> Iterator[tuple[CountingPolicy, RunningServer]]:
    policy = CountingPolicy()
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(policy, settings))) as running:
        yield policy, running


def _engine(running: RunningServer) -> RemoteInferenceEngine:
    config = EngineConfig(fps=100.0, backoff_initial_s=0.01, backoff_max_s=0.02)
    return RemoteInferenceEngine(running.ws_url + "/v1/policy/ws", config, state_dim=6)


def _calls_seen(engine: RemoteInferenceEngine) -> float:
    """Action 0 of the next queued action: the chunks the session's processors had made."""
    action = engine.get_action()
    assert action is not None
    return float(action[0])


def test_a_refused_reset_is_retried_by_the_next_cycle(served: tuple[CountingPolicy, RunningServer]) -> None:
    """Regression: the pending reset was cleared before the server accepted it; the next cycle sent
    the new episode's observation on the old processors (action 0 was 3, the old count going on)."""
    policy, running = served
    engine = _engine(running)
    engine.connect()
    try:
        engine.run_cycle(OBS, delay=0)
        engine.run_cycle(OBS, delay=0)
        engine.queue.clear()
        engine.run_cycle(OBS, delay=0)
        assert _calls_seen(engine) == 3.0  # the first episode's processors made 3 chunks
        epoch = engine.client.session_epoch

        engine.reset()
        policy.broken.set()
        with pytest.raises(ServerError, match="make_processors"):
            engine.run_cycle(OBS, delay=0)
        assert engine.client.session_epoch == epoch  # the server did not reset

        policy.broken.clear()
        assert engine.run_cycle(OBS, delay=0)  # the reset is sent again, then the observation
        assert engine.client.session_epoch == epoch + 1
        assert _calls_seen(engine) == 1.0  # fresh processors: the new episode's first chunk
    finally:
        engine.stop()


def test_the_background_loop_keeps_retrying_a_refused_reset(
    served: tuple[CountingPolicy, RunningServer],
) -> None:
    """With the thread: while the reset fails nothing is merged for the new episode and the engine
    is unhealthy; once make_processors() works again the reset lands and the robot resumes."""
    policy, running = served
    engine = _engine(running).start()
    try:
        engine.update_observation(OBS)
        wait_until(lambda: engine.stats.chunks_merged >= 1)
        merged = engine.stats.chunks_merged
        policy.broken.set()
        engine.reset()
        engine.update_observation(OBS)
        wait_until(lambda: isinstance(engine.last_error, ServerError))
        errors = engine.stats.errors
        wait_until(lambda: engine.stats.errors >= errors + 2 or _fed(engine))  # retried, still refused
        assert not engine.healthy
        assert engine.stats.chunks_merged == merged  # nothing ran on the old episode's processors
        assert engine.episode_id == 1

        policy.broken.clear()
        wait_until(lambda: engine.stats.chunks_merged > merged or _fed(engine))
        assert engine.healthy
        assert _calls_seen(engine) == 1.0
    finally:
        policy.broken.clear()
        engine.stop()


def _fed(engine: RemoteInferenceEngine) -> bool:
    """A new observation, without taking an action (the loop asks only with a fresh one)."""
    engine.update_observation(OBS)
    return False
