"""A message over the server's frame limit (close 1009) against a real server: PolicyClient raises
FrameTooLarge (a non-retryable ServerError naming the limit), and the engine backs off across its
reconnects instead of reconnecting once per control tick, then resumes once observations fit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from waiting import wait_until

from rollserve.client import EngineConfig, PolicyClient, RemoteInferenceEngine, ServerError
from rollserve.client.policy_client import FrameTooLarge
from rollserve.client.remote_engine import RemoteChunkSource
from rollserve.server.running import RunningServer
from rollserve.wire import WireLimits

LIMIT = 64 * 1024  # the server's frame limit in these tests
STATE = np.zeros(6, np.float32)
BIG = {"top": np.zeros((200, 200, 3), np.uint8)}  # 120,000 bytes of pixels: over LIMIT
SMALL = {"top": np.zeros((8, 8, 3), np.uint8)}


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serving_chunk_policy(WireLimits(max_frame_bytes=LIMIT)) as running:
        yield running


def _url(running: RunningServer) -> str:
    return running.ws_url + "/v1/policy/ws"


def test_a_frame_over_the_limit_is_a_non_retryable_refusal_naming_the_limit(server: RunningServer) -> None:
    """Regression: it was PolicyConnectionError ("reconnecting may help") like any lost connection."""
    client = PolicyClient(_url(server))
    client.connect()
    client.open_session(state_dim=6)
    with pytest.raises(FrameTooLarge) as info:
        client.predict(STATE, BIG)
    error = info.value
    assert isinstance(error, ServerError) and not isinstance(error, ConnectionError)
    assert error.code == "frame_too_large" and error.retryable is False
    assert f"limit of {LIMIT} bytes" in str(error) and "--max-frame-mb" in str(error)
    client.connect()  # the server closed that connection; a new one serves a message that fits
    client.open_session(state_dim=6)
    assert client.predict(STATE, SMALL).chunk_robot.shape == (20, 6)
    client.close()


def test_the_engine_backs_off_across_reconnects_and_resumes_once_frames_fit(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: each reconnect succeeded and its first request was closed with 1009, and the
    backoff restarted with every recovery: 75-89 reconnects in 3 s, one per control tick."""
    attempts: list[float] = []
    reconnect = RemoteChunkSource.reconnect

    def recorded(self: RemoteChunkSource) -> object:
        attempts.append(time.monotonic())
        return reconnect(self)

    monkeypatch.setattr(RemoteChunkSource, "reconnect", recorded)
    initial, most = 0.05, 0.2
    config = EngineConfig(fps=100.0, backoff_initial_s=initial, backoff_max_s=most)
    engine = RemoteInferenceEngine(_url(server), config, state_dim=6)
    images = {"now": BIG}
    stop_robot = threading.Event()

    def robot() -> None:  # the control loop at 100 Hz, on the fallback while nothing arrives
        while not stop_robot.is_set():
            engine.act({"state": STATE, "images": images["now"]})
            time.sleep(0.01)

    driver = threading.Thread(target=robot)
    with caplog.at_level(logging.ERROR, logger="rollserve.client.inference_loop"):
        engine.start()
        driver.start()
        try:
            wait_until(lambda: len(attempts) >= 5)
            assert isinstance(engine.last_error, FrameTooLarge) and not engine.healthy
            assert engine.stats.chunks_merged == 0 and engine.stats.errors >= 5
            gaps = np.diff(attempts[:5])
            # one backoff doubling across the cycles: 0.1, 0.2, 0.2, 0.2 s at least between reconnects
            floors = [min(initial * 2 ** (i + 1), most) for i in range(len(gaps))]
            assert all(gap >= floor - 1e-3 for gap, floor in zip(gaps, floors, strict=True)), (gaps, floors)
            refusals = [r for r in caplog.records if "frame_too_large" in r.getMessage()]
            assert refusals and all(r.levelname == "ERROR" and r.exc_info is None for r in refusals)

            images["now"] = SMALL  # the operator shrinks the images: the robot resumes on its own
            wait_until(lambda: engine.stats.chunks_merged >= 1)
            wait_until(lambda: engine.healthy)
        finally:
            stop_robot.set()
            driver.join(5)
            engine.stop()
