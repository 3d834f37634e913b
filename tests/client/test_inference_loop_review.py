"""``InferenceEngine.latency_stats()``, a documented API (docs/client.md), pinned key by key: the first
mutation run of the robot loop (`robot_loop` in tools/mutation.py) found every key and every
seconds-to-milliseconds conversion in it unchecked (30 survivors)."""

from __future__ import annotations

import numpy as np

from rollserve.client import EngineConfig, LocalInferenceEngine
from rollserve.models.simple_policies import ChunkPolicy

OBS = {"state": np.linspace(0, 1, 6, dtype=np.float32)}


def test_latency_stats_reports_every_documented_figure_in_milliseconds() -> None:
    engine = LocalInferenceEngine(ChunkPolicy(latency_s=0.02), EngineConfig(fps=100.0))
    engine.connect()
    for _ in range(3):
        assert engine.run_cycle(OBS, delay=0)
    stats = engine.stats  # distinct values, so a key reading the wrong counter shows
    stats.chunks_merged, stats.dropped_replies, stats.starved_steps, stats.reconnects, stats.errors = (
        3,
        4,
        5,
        6,
        7,
    )
    stats.last_queue_wait_ms, stats.last_inference_ms, stats.last_batch_size = 8.5, 9.5, 10
    p50, p90, p99 = engine.latency.percentiles(50, 90, 99)
    assert p50 >= 0.02  # each call took at least the policy's 20 ms: seconds here, milliseconds below
    assert engine.latency_stats() == {
        "count": 3,
        "p50_ms": p50 * 1000.0,
        "p90_ms": p90 * 1000.0,
        "p99_ms": p99 * 1000.0,
        "recent_max_ms": engine.latency.recent_max() * 1000.0,
        "delay_steps": engine.estimated_delay(),
        "chunks_merged": 3,
        "dropped_replies": 4,
        "starved_steps": 5,
        "reconnects": 6,
        "errors": 7,
        "last_queue_wait_ms": 8.5,
        "last_inference_ms": 9.5,
        "last_batch_size": 10,
    }
