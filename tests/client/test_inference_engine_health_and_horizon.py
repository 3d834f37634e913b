"""Review s10: the engine's health after a recovery, and whose execution horizon the local engine uses."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, LocalInferenceEngine
from rollserve.client.inference_loop import ChunkRequest, InferenceEngine, SourceInfo
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.rtc import RTCConfig
from rollserve.wire import ActionChunkMsg, MsgHeader

OBS = {"state": np.linspace(0, 1, 6, dtype=np.float32)}


class _FlakySource:
    """Refuses with ``ConnectionError`` while ``down`` is set, else answers a 4 x 2 chunk."""

    epoch = 0

    def __init__(self) -> None:
        self.down = threading.Event()

    def connect(self) -> SourceInfo:
        return SourceInfo(chunk_size=4, action_dim=2, execution_horizon=3, rtc_supported=True)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        if self.down.is_set():
            raise ConnectionError("server restarting")
        header = MsgHeader(seq_id=request.seq_id, episode_id=request.episode_id, session_epoch=self.epoch)
        chunk = np.ones((4, 2), np.float32)
        return ActionChunkMsg(chunk_model=chunk, chunk_robot=chunk, header=header)

    def reset(self, episode_id: int) -> None: ...
    def reconnect(self) -> SourceInfo:
        return self.connect()

    def close(self) -> None: ...


def _fed(engine: InferenceEngine, condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition``, with a control step each time it is polled: the loop asks for a chunk only with a
    new observation and a queue that runs low."""

    def check() -> bool:
        engine.act(OBS)
        return condition()

    return check


# -- item 1: last_error stayed set after a recovery and nothing said the engine worked again ----------
def test_the_engine_is_healthy_again_once_a_request_succeeds_and_last_error_keeps_the_failure() -> None:
    source = _FlakySource()
    source.down.set()
    engine = InferenceEngine(source, EngineConfig(fps=100.0, backoff_initial_s=0.01, backoff_max_s=0.02))
    engine.connect()
    assert engine.healthy and engine.last_error is None  # nothing failed yet
    engine.start()
    try:
        wait_until(_fed(engine, lambda: engine.stats.errors >= 1))
        assert not engine.healthy
        failure = engine.last_error
        assert isinstance(failure, ConnectionError)
        source.down.clear()  # the server is back
        wait_until(_fed(engine, lambda: engine.healthy))
        assert engine.stats.chunks_merged >= 1
        assert engine.last_error is failure  # kept for diagnosis (docs/client.md), not cleared
        source.down.set()  # and down again: unhealthy again
        wait_until(_fed(engine, lambda: not engine.healthy))
    finally:
        engine.stop()


def test_a_failed_reconnect_keeps_the_engine_unhealthy() -> None:
    class RefusingSource(_FlakySource):
        def reconnect(self) -> SourceInfo:
            if self.down.is_set():
                raise ConnectionRefusedError("still down")
            return self.connect()

    source = RefusingSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0, backoff_initial_s=0.01, backoff_max_s=0.02))
    engine.connect()
    source.down.set()
    engine.start()
    try:
        wait_until(_fed(engine, lambda: isinstance(engine.last_error, ConnectionRefusedError)))
        assert not engine.healthy
        source.down.clear()
        wait_until(_fed(engine, lambda: engine.healthy))
        assert engine.stats.reconnects >= 1
    finally:
        engine.stop()


# -- item 2: LocalInferenceEngine replaced the config's execution horizon with the policy's -----------
def _prefix_rows(engine: LocalInferenceEngine, policy: ChunkPolicy) -> tuple[int, int | None, int]:
    """(rows of the prefix the engine sends, prefix_steps the policy got, the request path's horizon)
    after one full chunk of 20 and two executed actions."""
    engine.connect()
    engine.run_cycle(OBS, delay=0)
    engine.get_action(), engine.get_action()
    model, _ = engine.prefixes()
    engine.run_cycle(OBS, delay=0)
    assert model is not None
    horizon = engine.source.request_path.execution_horizon  # type: ignore[attr-defined]
    return len(model), policy.calls[-1]["prefix_steps"], horizon


def test_the_local_engine_uses_the_horizon_its_config_sets() -> None:
    policy = ChunkPolicy(record_calls=True)  # its own horizon: 10, chunk 20
    engine = LocalInferenceEngine(policy, EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=4)))
    assert _prefix_rows(engine, policy) == (4, 4, 4)


def test_without_an_rtc_setting_the_local_engine_uses_the_policys_horizon() -> None:
    policy = ChunkPolicy(record_calls=True, execution_horizon=7)
    engine = LocalInferenceEngine(policy, EngineConfig(fps=30.0))  # sets no rtc
    assert _prefix_rows(engine, policy) == (7, 7, 7)
    policy = ChunkPolicy(record_calls=True, execution_horizon=7)
    assert _prefix_rows(LocalInferenceEngine(policy), policy) == (7, 7, 7)


def test_the_execution_horizon_argument_wins_over_the_config_as_a_servers_does() -> None:
    policy = ChunkPolicy(record_calls=True)
    config = EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=4))
    engine = LocalInferenceEngine(policy, config, execution_horizon=6)
    assert _prefix_rows(engine, policy) == (6, 6, 6)


def test_a_horizon_beyond_the_chunk_is_cut_to_it_and_a_horizon_below_one_refused() -> None:
    policy = ChunkPolicy(record_calls=True, chunk_size=20)
    engine = LocalInferenceEngine(policy, EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=50)))
    assert _prefix_rows(engine, policy) == (18, 18, 20)  # 18 actions left, the horizon is the chunk
    with pytest.raises(ValueError, match="execution_horizon must be >= 1"):
        RTCConfig(enabled=True, execution_horizon=0)
    with pytest.raises(ValueError, match="execution horizon must be >= 1"):
        LocalInferenceEngine(ChunkPolicy(), execution_horizon=0)
