"""The shared RTC loop (local and remote engines): refills, prefixes, delays, stale replies, fallbacks,
reconnects. Timing only ever shows up as lower bounds (a sleep lasts at least its time)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from waiting import wait_until

from rollserve.client import EngineConfig, LocalInferenceEngine, RemoteInferenceEngine
from rollserve.client.inference_loop import ChunkRequest, InferenceEngine, SourceInfo
from rollserve.models.policy import PolicyRequest
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.rtc import RTCConfig
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import start_in_thread
from rollserve.server.settings import ServerSettings
from rollserve.wire import ActionChunkMsg, MsgHeader

OBS = {"state": np.linspace(0, 1, 6, dtype=np.float32)}
CHUNK = 20


class HookedPolicy(ChunkPolicy):
    """Runs ``hook()`` inside each model call (to act on the engine while it waits for a chunk)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(record_calls=True, **kwargs)
        self.hook: Callable[[], None] = lambda: None

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        self.hook()
        return super().predict_action_chunks(requests)


def _local(fallback: str = "hold", **policy_kwargs: Any) -> tuple[HookedPolicy, LocalInferenceEngine]:
    policy = HookedPolicy(**policy_kwargs)
    engine = LocalInferenceEngine(policy, EngineConfig(fps=100.0, fallback=fallback))  # type: ignore[arg-type]
    engine.connect()
    return policy, engine


def test_prefixes_are_the_left_over_cut_to_the_horizon() -> None:
    policy, engine = _local()
    assert engine.prefixes() == (None, None)
    assert engine.run_cycle(OBS, delay=0)
    for _ in range(5):
        engine.get_action()
    model, robot = engine.prefixes()
    assert model is not None and robot is not None
    assert model.shape == robot.shape == (10, 6)
    np.testing.assert_array_equal(robot, policy.actions_to_robot(model))
    for _ in range(CHUNK - 5 - 3):
        engine.get_action()
    assert engine.prefixes()[0].shape == (3, 6)  # type: ignore[union-attr]
    for _ in range(3):
        engine.get_action()
    assert engine.prefixes() == (None, None)  # nothing left over: no prefix at all


def test_without_rtc_no_prefix_is_sent_and_chunks_append() -> None:
    policy = HookedPolicy()
    config = EngineConfig(rtc=RTCConfig(enabled=False))
    engine = LocalInferenceEngine(policy, config)
    engine.connect()
    engine.run_cycle(OBS, delay=0)
    engine.run_cycle(OBS, delay=0)
    assert engine.queue.qsize() == 2 * CHUNK
    assert [call["prev_chunk_left_over"] for call in policy.calls] == [None, None]


def test_merge_uses_actions_really_executed_during_inference() -> None:
    policy, engine = _local()
    engine.run_cycle(OBS, delay=0)
    policy.hook = lambda: [engine.get_action() for _ in range(3)]  # the robot keeps moving meanwhile
    hint = engine.estimated_delay()
    engine.run_cycle(OBS)  # no delay given: hint from latency, merge by executed actions
    assert engine.queue.qsize() == CHUNK - 3
    assert policy.calls[1]["inference_delay"] == hint


def test_delay_estimate_follows_measured_latency() -> None:
    _, engine = _local(latency_s=0.03)  # each model call takes at least 30 ms; dt is 10 ms
    engine.run_cycle(OBS, delay=0)
    assert engine.latency.recent_max() >= 0.03
    assert engine.estimated_delay() >= 3
    stats = engine.latency_stats()
    assert stats["count"] == 1 and stats["p50_ms"] >= 30 and stats["delay_steps"] >= 3


def test_reset_during_inference_drops_the_stale_chunk() -> None:
    policy, engine = _local()
    engine.run_cycle(OBS, delay=0)
    processors_before = engine.source.session.processors  # type: ignore[attr-defined]
    policy.hook = engine.reset  # a new episode starts while the chunk is being inferred
    assert engine.run_cycle(OBS, delay=0) is False
    assert engine.stats.dropped_replies == 1 and engine.queue.qsize() == 0
    policy.hook = lambda: None
    assert engine.run_cycle(OBS, delay=0) is True
    assert engine.source.session.processors is not processors_before  # type: ignore[attr-defined]
    assert engine.episode_id == 1


class _FakeSource:
    """Replies with whatever header ``tamper`` makes of the request's."""

    epoch = 0

    def __init__(self, tamper: Callable[[MsgHeader], MsgHeader]) -> None:
        self.tamper = tamper

    def connect(self) -> SourceInfo:
        return SourceInfo(chunk_size=4, action_dim=2, execution_horizon=3, rtc_supported=True)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        header = MsgHeader(seq_id=request.seq_id, episode_id=request.episode_id, session_epoch=self.epoch)
        chunk = np.ones((4, 2), np.float32)
        return ActionChunkMsg(chunk_model=chunk, chunk_robot=chunk, header=self.tamper(header))

    def reset(self, episode_id: int) -> None: ...
    def reconnect(self) -> SourceInfo:
        return self.connect()

    def close(self) -> None: ...


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h: MsgHeader(seq_id=h.seq_id + 1, episode_id=h.episode_id, session_epoch=h.session_epoch),
        lambda h: MsgHeader(seq_id=h.seq_id, episode_id=h.episode_id - 1, session_epoch=h.session_epoch),
        lambda h: MsgHeader(seq_id=h.seq_id, episode_id=h.episode_id, session_epoch=h.session_epoch + 1),
    ],
    ids=["old-seq", "old-episode", "other-epoch"],
)
def test_replies_of_another_seq_episode_or_epoch_are_dropped(
    tamper: Callable[[MsgHeader], MsgHeader],
) -> None:
    engine = InferenceEngine(_FakeSource(tamper))
    engine.connect()
    assert engine.run_cycle(OBS, delay=0) is False
    assert engine.queue.qsize() == 0 and engine.stats.dropped_replies == 1
    ok = InferenceEngine(_FakeSource(lambda h: h))
    ok.connect()
    assert ok.run_cycle(OBS, delay=0) and ok.queue.qsize() == 4


@pytest.mark.parametrize(("fallback", "expected"), [("hold", None), ("repeat", "last"), ("zero", "zeros")])
def test_fallback_when_starved(fallback: str, expected: str | None) -> None:
    _, engine = _local(fallback=fallback)
    engine.run_cycle(OBS, delay=0)
    actions = [engine.get_action() for _ in range(CHUNK)]
    starved = engine.get_action()
    assert engine.stats.starved_steps == 1
    if expected is None:
        assert starved is None
    elif expected == "last":
        np.testing.assert_array_equal(starved, actions[-1])  # type: ignore[arg-type]
    else:
        np.testing.assert_array_equal(starved, np.zeros(6, np.float32))  # type: ignore[arg-type]


def test_background_loop_refills_before_the_queue_runs_dry() -> None:
    policy, engine = _local(fallback="hold")
    engine.start()
    try:
        actions = []
        for step in range(120):
            actions.append(engine.act({"state": np.full(6, step / 100, np.float32)}))
            time.sleep(0.01)
        wait_until(lambda: engine.stats.chunks_merged >= 2)
    finally:
        engine.stop()
    assert sum(a is not None for a in actions) > CHUNK  # more than one chunk was executed
    assert policy.calls[0]["prev_chunk_left_over"] is None
    assert any(call["prev_chunk_left_over"] is not None for call in policy.calls[1:])
    assert policy.calls[0]["state"].shape == (6,)


def _serve(policy: ChunkPolicy, port: int = 0) -> Any:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = PolicyService(policy, settings)
    return service, start_in_thread(create_app(settings, policy=service), port=port)


def test_remote_engine_reconnects_after_a_server_restart_and_a_lost_session() -> None:
    service, running = _serve(ChunkPolicy())
    config = EngineConfig(fps=100.0, fallback="repeat", backoff_initial_s=0.02, backoff_max_s=0.1)
    engine = RemoteInferenceEngine(running.ws_url + "/v1/policy/ws", config, state_dim=6)
    stop_robot = threading.Event()

    def robot() -> None:
        while not stop_robot.is_set():
            engine.act(OBS)
            time.sleep(0.005)

    engine.start()
    driver = threading.Thread(target=robot)
    driver.start()
    try:
        wait_until(lambda: engine.stats.chunks_merged >= 1)
        running.stop()  # the server goes away...
        service.close()
        service, running = _serve(ChunkPolicy(), port=running.port)  # ...and comes back on the same port
        wait_until(lambda: engine.stats.reconnects >= 1)
        merged = engine.stats.chunks_merged
        wait_until(lambda: engine.stats.chunks_merged > merged)
        assert len(service.sessions) == 1

        (session_id,) = list(service.sessions._sessions)  # the server forgets the session
        service.sessions.close(session_id)
        wait_until(lambda: engine.stats.reconnects >= 2)
        merged = engine.stats.chunks_merged
        wait_until(lambda: engine.stats.chunks_merged > merged)
        assert engine.client.session_epoch == 1  # reopened under the same client uuid
    finally:
        stop_robot.set()
        driver.join(5)
        engine.stop()
        running.stop()
        service.close()
    assert engine.latency_stats()["count"] >= 2


# -- the background thread's lifecycle and error reporting ------------------------------------------
class _BlockingSource(_FakeSource):
    """``infer`` blocks until released; records whether ``close`` ran while a request was inside."""

    def __init__(self) -> None:
        super().__init__(lambda h: h)
        self.inside = threading.Event()
        self.release = threading.Event()
        self.busy = False
        self.closed_while_busy = False
        self.closes = 0

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        self.busy = True
        self.inside.set()
        assert self.release.wait(20)
        self.busy = False
        return super().infer(request)

    def close(self) -> None:
        self.closes += 1
        self.closed_while_busy |= self.busy


def _inference_threads() -> int:
    return sum(t.name == "rollserve-inference" and t.is_alive() for t in threading.enumerate())


def test_stop_that_times_out_keeps_the_source_open_until_the_request_returns() -> None:
    """Regression: stop() forgot the thread and closed the client it was still using."""
    source = _BlockingSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0))
    engine.start()
    engine.update_observation(OBS)
    assert source.inside.wait(20)
    engine.stop(timeout=0.05)  # the request is still inside the source
    assert source.closes == 0
    source.release.set()
    wait_until(lambda: source.closes == 1)
    assert not source.closed_while_busy
    wait_until(lambda: _inference_threads() == 0)


def test_start_after_a_timed_out_stop_never_runs_a_second_loop() -> None:
    """Regression: a later start() ran a second loop next to the one still inside its request."""
    source = _BlockingSource()
    engine = InferenceEngine(source, EngineConfig(fps=100.0))
    engine.start()
    engine.update_observation(OBS)
    assert source.inside.wait(20)
    engine.stop(timeout=0.05)
    with pytest.raises(RuntimeError, match="still finishing"):
        engine.start()
    assert _inference_threads() == 1
    source.release.set()
    wait_until(lambda: _inference_threads() == 0)
    engine.start()  # the old thread is gone: a new loop may start
    try:
        assert _inference_threads() == 1
    finally:
        engine.stop()
    assert _inference_threads() == 0


def test_a_failing_request_is_logged_with_its_traceback_and_exposed(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a bug in the caller's observation became a one-line warning, retried forever."""

    class BuggySource(_FakeSource):
        def infer(self, request: ChunkRequest) -> ActionChunkMsg:
            return {"state": request.observation["state"]}["images"]  # a KeyError in user code

    engine = InferenceEngine(BuggySource(lambda h: h), EngineConfig(fps=100.0, backoff_initial_s=0.01))
    assert engine.last_error is None
    with caplog.at_level("ERROR", logger="rollserve.client.inference_loop"):
        engine.start()
        try:
            engine.update_observation(OBS)
            wait_until(lambda: engine.stats.errors >= 1)
        finally:
            engine.stop()
    assert isinstance(engine.last_error, KeyError) and engine.last_error.args == ("images",)
    record = next(r for r in caplog.records if r.exc_info)
    assert record.levelname == "ERROR" and record.exc_info[0] is KeyError  # type: ignore[index]
    assert "in infer" in caplog.text  # the traceback itself, down to the failing frame


def test_reset_state_and_the_queue_object_change_only_under_the_state_lock() -> None:
    """The loop reads ``_reset_pending`` and swaps the queue under the lock reset() and merges use."""
    engine = InferenceEngine(_FakeSource(lambda h: h), EngineConfig(fps=100.0))
    engine.connect()
    engine.update_observation(OBS)
    done: list[str] = []
    with engine._state_lock:
        readers = [
            threading.Thread(target=lambda: done.append(f"wants={engine._wants_chunk()}")),
            threading.Thread(
                target=lambda: (
                    engine._adopt(SourceInfo(4, 2, 3, rtc_supported=False)),
                    done.append("adopted"),
                )
            ),
        ]
        for thread in readers:
            thread.start()
        time.sleep(0.2)  # lower bound only: neither may finish while the lock is held
        assert done == []
    for thread in readers:
        thread.join(10)
    assert sorted(done) == ["adopted", "wants=True"]
    assert engine.queue.config.enabled is False  # the swapped queue follows the source: no RTC


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fps", 0.0, "fps must be > 0, got 0.0"),
        ("fallback", "stop", "fallback must be hold, repeat or zero, got 'stop'"),
        ("jpeg_quality", 101, "jpeg_quality must be an int in 0..100 (0: raw images), got 101"),
        ("jpeg_quality", -1, "got -1"),
        ("jpeg_quality", 80.0, "got 80.0"),
        ("jpeg_quality", True, "got True"),
        ("refill_margin", -1, "refill_margin must be an int >= 0, got -1"),
        ("refill_margin", 1.5, "got 1.5"),
        ("refill_margin", True, "got True"),
    ],
)
def test_engine_config_refuses_what_would_fail_every_request(field: str, value: object, message: str) -> None:
    """Regression for ``jpeg_quality``: 150 was accepted, then every background request failed and
    the robot got no action at all, with the error only in the logs."""
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("fps", 0.5), ("fps", 1.0), ("refill_margin", 0)])
def test_engine_config_takes_slow_rates_and_a_zero_margin(field: str, value: float) -> None:
    assert getattr(EngineConfig(**{field: value}), field) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("quality", [0, 1, 100])
def test_engine_config_takes_every_jpeg_quality_in_range(quality: int) -> None:
    assert EngineConfig(jpeg_quality=quality).jpeg_quality == quality
