"""The boundary-discontinuity metric and the per-strategy summary, on hand-made action traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollserve.demo.metrics import EpisodeTrace, pooled_jumps, step_jumps, summarize
from rollserve.demo.plots import chunk_plans, plot_boundaries


def joint_action(value: float, gripper: float = 0.0) -> np.ndarray:
    """All 7 joints at ``value``: a step of ``x`` on every joint has L2 size ``x * sqrt(7)``."""
    return np.array([value] * 7 + [gripper], dtype=np.float32)


def make_trace() -> EpisodeTrace:
    # ticks:      0    1    2    3    4     5     6    7
    # chunk:      1    1    1    2    2   stall   3    3
    # joints:   0.0  0.1  0.2  0.5  0.6   (0.6)  0.6  0.7
    trace = EpisodeTrace(seed=7, success=True, seconds=0.8)
    for value, chunk in [(0.0, 1), (0.1, 1), (0.2, 1), (0.5, 2), (0.6, 2)]:
        trace.record(joint_action(value, gripper=float(chunk)), chunk)
    trace.record(None, None)
    for value, chunk in [(0.6, 3), (0.7, 3)]:
        trace.record(joint_action(value), chunk)
    return trace


def test_step_jumps_split_boundary_and_within_steps() -> None:
    trace = make_trace()
    jumps = step_jumps(trace.actions, trace.chunk_ids)
    root7 = math.sqrt(7)
    # boundaries: 0.2 -> 0.5 (chunk 1 -> 2), and 0.6 -> 0.6 across the stall (chunk 2 -> 3)
    np.testing.assert_allclose(jumps.boundary, [0.3 * root7, 0.0], atol=1e-6)
    np.testing.assert_allclose(jumps.within, [0.1 * root7] * 4, atol=1e-6)
    assert jumps.boundary_mean == pytest.approx(0.15 * root7, abs=1e-6)
    assert jumps.ratio == pytest.approx(1.5, abs=1e-5)


def test_gripper_is_not_part_of_the_joint_step() -> None:
    trace = make_trace()  # the gripper changes from 1 to 2 at the first boundary, 2 to 0 at the second
    jumps = step_jumps(trace.actions, trace.chunk_ids)
    assert jumps.boundary[1] == 0.0


def test_one_chunk_has_no_boundary_and_nan_ratio() -> None:
    actions = [joint_action(v) for v in (0.0, 0.1, 0.3)]
    jumps = step_jumps(actions, [4, 4, 4])
    assert jumps.boundary.size == 0 and math.isnan(jumps.boundary_mean) and math.isnan(jumps.ratio)
    assert jumps.within_mean == pytest.approx(0.15 * math.sqrt(7), abs=1e-6)


def test_pooled_jumps_never_span_two_episodes() -> None:
    first = EpisodeTrace(seed=0)
    first.record(joint_action(0.0), 1)
    second = EpisodeTrace(seed=1)
    second.record(joint_action(5.0), 2)  # a huge "jump" if the episodes were glued together
    jumps = pooled_jumps([first, second])
    assert jumps.boundary.size == 0 and jumps.within.size == 0


def test_summarize_counts_stalls_rates_and_latency() -> None:
    trace = make_trace()
    failed = EpisodeTrace(seed=8, success=False, seconds=0.2)
    failed.record(None, None)
    failed.record(joint_action(1.0), 9)
    row = summarize([trace, failed], round_trips_ms=[100.0, 200.0, 300.0], inference_ms=[5.0])
    assert row["episodes"] == 2 and row["successes"] == 1 and row["success_rate"] == 0.5
    assert row["ticks"] == 10 and row["stall_ticks"] == 2 and row["executed_steps"] == 8
    assert row["steps_per_s"] == pytest.approx(8 / 1.0)
    assert row["chunks"] == 4  # chunks 1, 2, 3 and 9
    assert row["round_trip_ms_p50"] == 200.0 and row["inference_ms_p99"] == 5.0
    assert row["jump_ratio"] == pytest.approx(1.5, abs=1e-5)


def test_plot_is_written_with_each_chunk_plan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = make_trace()
    trace.chunks = {cid: np.stack([joint_action(0.1 * i) for i in range(4)]) for cid in (1, 2, 3, 99)}
    assert [start for start, _ in chunk_plans(trace)] == [0, 3, 6]  # chunk 99 never ran
    path = plot_boundaries({"rtc": trace, "sync": make_trace()}, {"rtc": "async + RTC"}, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
