"""Review tests for the demo's measurements, pacing and network delay: the numbers README reports.

Expected values are worked out by hand from docs/demo.md's definitions ("Reading the table"), not
read back from the code: a slip in a metric would otherwise change the README's results unnoticed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import itertools
import json
import logging
import math
import socket
import threading
from typing import Any

import numpy as np
import pytest

from rollserve.client.inference_loop import EngineConfig, SourceInfo
from rollserve.client.local_engine import LocalChunkSource
from rollserve.demo.metrics import (
    JOINTS,
    EpisodeTrace,
    Jumps,
    json_ready,
    percentile,
    pooled_jumps,
    step_jumps,
    summarize,
)
from rollserve.demo.netdelay import DelayProxy
from rollserve.demo.simtime import SimulatedRobot
from rollserve.demo.strategies import STRATEGIES, Strategy, StrategyEngine, TaggedQueue, engine_config
from rollserve.models.simple_policies import ChunkPolicy, EchoPolicy, chunk_policy
from rollserve.rtc.config import RTCConfig
from rollserve.sim.env import TabletopPickPlaceEnv


def arm(*joints: float, gripper: float = 0.0) -> np.ndarray:
    """An 8-dim action: the 7 joints given (zeros after them) and the gripper."""
    values = list(joints) + [0.0] * (7 - len(joints))
    return np.array([*values, gripper], dtype=np.float32)


# -- EpisodeTrace -------------------------------------------------------------------------------------


def test_record_keeps_a_float32_copy_and_no_chunk_on_a_stall() -> None:
    trace = EpisodeTrace(seed=3)
    source = np.array([0.25] * 8, dtype=np.float64)
    trace.record(source, 5)
    source[:] = 9.0  # the caller reuses its buffer: the trace must keep what was executed
    trace.record(None, 6)  # a stall has no chunk, whatever id the caller still holds
    trace.record([1.0] * 8, 7)
    assert trace.actions[0] is not None and trace.actions[0].dtype == np.float32
    np.testing.assert_array_equal(trace.actions[0], np.full(8, 0.25, dtype=np.float32))
    assert trace.actions[1] is None
    assert trace.chunk_ids == [5, None, 7]
    assert (trace.ticks, trace.stalls, trace.executed) == (3, 1, 2)


def test_a_new_trace_is_empty_and_not_a_success() -> None:
    trace = EpisodeTrace(seed=11)
    assert (trace.seed, trace.ticks, trace.stalls, trace.executed) == (11, 0, 0, 0)
    assert trace.success is False and trace.seconds == 0.0 and trace.first_chunk_s == 0.0
    assert trace.actions == [] and trace.chunk_ids == [] and trace.chunks == {} and trace.snapshots == []
    other = EpisodeTrace(seed=12)
    other.record(arm(1.0), 1)
    assert trace.actions == []  # each trace has its own lists


# -- jumps ---------------------------------------------------------------------------------------------


def test_a_jump_is_the_l2_norm_over_the_seven_arm_joints_only() -> None:
    # 3-4-5 triangle on joints 0 and 6; the gripper (index 7) moves by 100 and must not count
    actions = [arm(0.0, gripper=0.0), arm(3.0, 0, 0, 0, 0, 0, 4.0, gripper=100.0)]
    jumps = step_jumps(actions, [1, 1])
    np.testing.assert_array_equal(jumps.within, [5.0])
    assert jumps.boundary.size == 0
    assert slice(0, 7) == JOINTS


def test_step_jumps_follows_the_joints_it_is_given() -> None:
    actions = [arm(0.0, gripper=0.0), arm(3.0, gripper=4.0)]
    jumps = step_jumps(actions, [1, 2], joints=slice(0, 8))
    np.testing.assert_array_equal(jumps.boundary, [5.0])


def test_a_stall_is_skipped_and_the_next_action_compared_with_the_last_executed_one() -> None:
    # chunk 1: 0 -> 1 (within 1); stall; stall; chunk 1 again: 1 -> 3 (within 2); chunk 2: 3 -> 7 (boundary 4)
    actions = [arm(0.0), arm(1.0), None, None, arm(3.0), arm(7.0)]
    jumps = step_jumps(actions, [1, 1, None, None, 1, 2])
    np.testing.assert_array_equal(jumps.within, [1.0, 2.0])
    np.testing.assert_array_equal(jumps.boundary, [4.0])
    assert jumps.within.dtype == np.float64 and jumps.boundary.dtype == np.float64


def test_a_leading_stall_and_an_empty_trace_have_no_steps() -> None:
    jumps = step_jumps([None, arm(2.0)], [None, 1])
    assert jumps.within.size == 0 and jumps.boundary.size == 0
    empty = step_jumps([], [])
    assert empty.within.size == 0 and empty.boundary.size == 0


def test_step_jumps_refuses_ids_that_do_not_match_the_actions() -> None:
    with pytest.raises(ValueError):
        step_jumps([arm(0.0), arm(1.0)], [1])


def test_means_and_ratio_by_hand() -> None:
    jumps = Jumps(boundary=np.array([3.0, 5.0]), within=np.array([1.0, 2.0, 3.0]))
    assert jumps.boundary_mean == 4.0 and jumps.within_mean == 2.0 and jumps.ratio == 2.0


@pytest.mark.parametrize(
    ("boundary", "within"),
    [([], [1.0]), ([1.0], []), ([], []), ([1.0], [0.0, 0.0])],
    ids=["no-boundary", "no-within", "none", "within-all-zero"],
)
def test_ratio_is_nan_without_both_kinds_of_step_or_with_a_still_chunk(
    boundary: list[float], within: list[float]
) -> None:
    jumps = Jumps(np.asarray(boundary, dtype=np.float64), np.asarray(within, dtype=np.float64))
    assert math.isnan(jumps.ratio)
    assert math.isnan(jumps.boundary_mean) == (not boundary)
    assert math.isnan(jumps.within_mean) == (not within)


def test_pooled_jumps_concatenate_each_episode_in_order() -> None:
    first = EpisodeTrace(seed=0)
    for value, chunk in [(0.0, 1), (1.0, 1), (3.0, 2)]:
        first.record(arm(value), chunk)
    second = EpisodeTrace(seed=1)
    for value, chunk in [(10.0, 1), (14.0, 2), (19.0, 2)]:
        second.record(arm(value), chunk)
    jumps = pooled_jumps([first, second])
    np.testing.assert_array_equal(jumps.boundary, [2.0, 4.0])
    np.testing.assert_array_equal(jumps.within, [1.0, 5.0])


def test_pooled_jumps_of_no_episode_are_empty() -> None:
    jumps = pooled_jumps([])
    assert jumps.boundary.shape == (0,) and jumps.within.shape == (0,)
    assert math.isnan(jumps.ratio)


# -- percentiles and the summary ----------------------------------------------------------------------


def test_percentile_interpolates_linearly_between_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted 10 20 30 40: p50 halfway 20..30, p99 at rank 2.97
    assert percentile(values, 50) == 25.0
    assert percentile(values, 99) == pytest.approx(30.0 + 0.97 * 10.0)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_percentile_of_float32_values_is_computed_in_float64() -> None:
    low, high = np.float32(0.1), np.float32(0.7)  # float32 timings: halfway between them in float64
    expected = float(low) + 0.5 * (float(high) - float(low))
    assert percentile(np.array([low, high]), 50) == pytest.approx(expected, rel=1e-15, abs=0)
    assert percentile(np.array([low, high]), 50) != float(np.float32(low + np.float32(0.5) * (high - low)))


def three_episodes() -> list[EpisodeTrace]:
    """Hand-made episodes: 12 ticks, 3 stalls, 2 successes, 2.0 s in all."""
    # A: chunk 1, 1, stall, chunk 2, 2: steps 0->1 within, 1->3 boundary, 3->4 within
    a = EpisodeTrace(seed=0, success=True, seconds=0.5)
    for value, chunk in [(0.0, 1), (1.0, 1), (None, None), (3.0, 2), (4.0, 2)]:
        a.record(None if value is None else arm(value), chunk)
    # B: chunk 5 only: steps 0->2, 2->4 within
    b = EpisodeTrace(seed=1, success=True, seconds=0.3)
    for value in (0.0, 2.0, 4.0):
        b.record(arm(value), 5)
    # C: stall, chunk 1, 2, stall: step 0->6 boundary
    c = EpisodeTrace(seed=2, success=False, seconds=1.2)
    for value, chunk in [(None, None), (0.0, 1), (6.0, 2), (None, None)]:
        c.record(None if value is None else arm(value), chunk)
    return [a, b, c]


def test_summarize_by_hand() -> None:
    row = summarize(
        three_episodes(), round_trips_ms=[300.0, 100.0, 200.0, 400.0], inference_ms=[1.0, 2.0, 3.0]
    )
    assert row == {
        "episodes": 3,
        "successes": 2,
        "success_rate": pytest.approx(2 / 3),
        "ticks": 12,
        "executed_steps": 9,
        "stall_ticks": 3,
        "steps_per_s": pytest.approx(9 / 2.0),  # executed actions per second of episode
        "chunks": 5,  # A: 1, 2; B: 5; C: 1, 2
        "boundary_jump_rad": pytest.approx((2.0 + 6.0) / 2),
        "within_jump_rad": pytest.approx((1.0 + 1.0 + 2.0 + 2.0) / 4),
        "jump_ratio": pytest.approx(4.0 / 1.5),
        "inference_ms_p50": 2.0,
        "inference_ms_p99": pytest.approx(2.0 + 0.98 * 1.0),
        "round_trip_ms_p50": 250.0,
        "round_trip_ms_p99": pytest.approx(300.0 + 0.97 * 100.0),
    }
    assert isinstance(row["successes"], int) and isinstance(row["ticks"], int)


def test_summarize_of_no_episode_is_nan_rates_not_a_division_error() -> None:
    row = summarize([])
    assert row["episodes"] == 0 and row["successes"] == 0 and row["ticks"] == 0 and row["chunks"] == 0
    for key in ("success_rate", "steps_per_s", "boundary_jump_rad", "within_jump_rad", "jump_ratio"):
        assert math.isnan(row[key]), key
    for key in ("inference_ms_p50", "inference_ms_p99", "round_trip_ms_p50", "round_trip_ms_p99"):
        assert math.isnan(row[key]), key


def test_an_episode_that_executed_nothing_counts_no_chunk() -> None:
    stalled = EpisodeTrace(seed=3, seconds=0.5)
    for _ in range(4):
        stalled.record(None, None)  # no chunk ever arrived: every tick a stall
    assert summarize([stalled])["chunks"] == 0
    once = EpisodeTrace(seed=4, seconds=0.5)
    once.record(None, None)
    once.record(arm(1.0), 7)  # one executed action: one chunk, and no boundary
    assert summarize([once])["chunks"] == 1
    assert summarize([*three_episodes(), stalled])["chunks"] == 5  # A: 1, 2; B: 5; C: 1, 2


def test_steps_per_s_is_nan_for_episodes_that_took_no_time() -> None:
    trace = EpisodeTrace(seed=0, seconds=0.0)
    trace.record(arm(1.0), 1)
    assert math.isnan(summarize([trace])["steps_per_s"])


def test_summarize_is_json_ready_after_json_ready() -> None:
    line = json.dumps(json_ready(summarize(three_episodes())), allow_nan=False)
    decoded = json.loads(line)
    assert decoded["inference_ms_p50"] is None and decoded["success_rate"] == 0.66667


# -- json_ready ---------------------------------------------------------------------------------------


def test_json_ready_rounds_floats_to_five_places_and_turns_nan_into_none() -> None:
    value = {
        "a": 1.234567,
        "nested": {"b": math.nan, "c": [0.000004, (2.5, math.nan)]},
        "n": 7,
        "flag": True,
        "text": "x",
        "none": None,
    }
    assert json_ready(value) == {
        "a": 1.23457,
        "nested": {"b": None, "c": [0.0, [2.5, None]]},
        "n": 7,
        "flag": True,
        "text": "x",
        "none": None,
    }
    assert type(json_ready(7)) is int and json_ready(True) is True


def test_json_ready_turns_numpy_scalars_into_json_numbers() -> None:
    value = {"f32": np.float32(0.1), "nan": np.float64("nan"), "n": np.int64(3), "ok": np.bool_(True)}
    ready = json_ready(value)
    # float32's 0.1 is 0.100000001490116..., which rounds to 0.1 at five places
    assert ready == {"f32": 0.1, "nan": None, "n": 3, "ok": True}
    assert type(ready["f32"]) is float and type(ready["n"]) is int and type(ready["ok"]) is bool
    assert json.dumps(ready, allow_nan=False) == '{"f32": 0.1, "nan": null, "n": 3, "ok": true}'


# -- strategies -----------------------------------------------------------------------------------------

CHUNK = 16


def local_source(policy: Any = None) -> LocalChunkSource:
    """The policy in-process through the server's own request path, as the sweep runs it."""
    if policy is None:
        policy = chunk_policy(state_dim=13, action_dim=8, chunk_size=CHUNK, execution_horizon=10)
    return LocalChunkSource(policy, execution_horizon=6)


def ramp(start: float, rows: int = CHUNK) -> np.ndarray:
    """A chunk whose row ``i`` is ``start + i`` everywhere: which row was served is readable."""
    return np.repeat(np.arange(start, start + rows, dtype=np.float32)[:, None], 8, axis=1)


def test_the_three_strategies_are_those_the_docs_describe() -> None:
    assert {
        "sync": Strategy("sync", "synchronous", asynchronous=False, send_prefix=False),
        "async": Strategy("async", "async, no RTC", asynchronous=True, send_prefix=False),
        "rtc": Strategy("rtc", "async + RTC", asynchronous=True, send_prefix=True),
    } == STRATEGIES


@pytest.mark.parametrize("name", ["sync", "async", "rtc"])
def test_engine_config_per_strategy(name: str) -> None:
    # docs: async strategies replace the queue from index d (the RTC queue) and ask once
    # qsize <= delay + margin; sync appends to an empty queue and asks only when it has nothing left;
    # a stall holds (no command)
    asynchronous = name != "sync"
    expected = EngineConfig(
        rtc=RTCConfig(enabled=asynchronous, execution_horizon=7),
        fps=12.5,
        refill_margin=3 if asynchronous else 0,
        fallback="hold",
    )
    assert engine_config(STRATEGIES[name], fps=12.5, refill_margin=3, execution_horizon=7) == expected


def test_a_new_tagged_queue_has_served_nothing() -> None:
    queue = TaggedQueue(RTCConfig(enabled=True))
    assert (queue.generation, queue.served_generation, queue.served_in_generation) == (0, 0, 0)
    assert queue.merged == {} and queue.forget_merged() == {}


def test_tagged_queue_numbers_chunks_from_one_and_keeps_each_merged_queue() -> None:
    queue = TaggedQueue(RTCConfig(enabled=True))
    queue.merge(ramp(0.0), ramp(0.0), 0)
    assert queue.generation == 1
    served = [queue.get() for _ in range(3)]
    assert [float(a[0]) for a in served if a is not None] == [0.0, 1.0, 2.0]
    assert (queue.served_generation, queue.served_in_generation) == (1, 3)
    queue.merge(ramp(100.0), ramp(100.0), 2)  # replaces the rest from index 2
    assert queue.generation == 2
    assert (queue.served_generation, queue.served_in_generation) == (1, 3)  # nothing served from 2 yet
    action = queue.get()
    assert action is not None and float(action[0]) == 102.0
    assert (queue.served_generation, queue.served_in_generation) == (2, 1)
    merged = queue.forget_merged()
    assert sorted(merged) == [1, 2]
    np.testing.assert_array_equal(merged[1], ramp(0.0))
    np.testing.assert_array_equal(merged[2], ramp(102.0, CHUNK - 2))
    assert queue.merged == {} and queue.forget_merged() == {}


def test_tagged_queue_merges_with_the_delay_and_index_it_is_given() -> None:
    given = TaggedQueue(RTCConfig(enabled=True))
    given.merge(ramp(0.0), ramp(0.0), 5)  # a stated delay: the first 5 rows ran while it was inferred
    assert given.queue is not None and float(given.queue[0, 0]) == 5.0

    counted = TaggedQueue(RTCConfig(enabled=True))
    counted.merge(ramp(0.0), ramp(0.0), 0)
    for _ in range(3):
        counted.get()
    counted.merge(ramp(100.0), ramp(100.0), None)  # counted since index 0 (the default): 3 ran
    assert counted.queue is not None and float(counted.queue[0, 0]) == 103.0

    since = TaggedQueue(RTCConfig(enabled=True))
    since.merge(ramp(0.0), ramp(0.0), 0)
    for _ in range(3):
        since.get()
    since.merge(ramp(100.0), ramp(100.0), None, 2)  # counted since index 2: 1 ran
    assert since.queue is not None and float(since.queue[0, 0]) == 101.0


def test_expire_after_drops_only_the_chunk_being_played_once_enough_ran() -> None:
    queue = TaggedQueue(RTCConfig(enabled=False))
    queue.merge(ramp(0.0), ramp(0.0), 0)
    queue.get()
    queue.expire_after(2)
    assert queue.qsize() == CHUNK - 1  # one of two played: kept
    queue.get()
    queue.expire_after(2)
    assert queue.qsize() == 0 and queue.get() is None


def test_strategy_engine_starts_with_no_chunk_id_and_eight_sync_steps() -> None:
    config = engine_config(STRATEGIES["sync"], fps=10.0, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(local_source(), config, STRATEGIES["sync"])
    assert engine.last_chunk_id is None and engine.config is config
    engine.connect()
    engine.run_cycle({"state": np.zeros(13, dtype=np.float32)}, delay=0)
    for played in range(1, 9):
        assert engine.get_action() is not None and engine.last_chunk_id == 1
        assert engine.ready_actions() == (0 if played == 8 else CHUNK - played)  # 8 by default
    assert engine.get_action() is None and engine.last_chunk_id is None  # a stall has no chunk


def test_the_synchronous_engine_appends_after_what_is_left() -> None:
    config = engine_config(STRATEGIES["sync"], fps=10.0, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(local_source(), config, STRATEGIES["sync"], sync_steps=CHUNK * 4)
    engine.connect()
    observation = {"state": np.zeros(13, dtype=np.float32)}
    engine.run_cycle(observation, delay=0)
    engine.run_cycle(observation, delay=0)
    assert engine.ready_actions() == 2 * CHUNK  # an RTC queue would have replaced the first chunk


def test_connect_returns_the_source_info_and_refuses_a_source_without_rtc() -> None:
    config = engine_config(STRATEGIES["rtc"], fps=10.0, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(local_source(), config, STRATEGIES["rtc"])
    assert engine.connect() == SourceInfo(CHUNK, 8, 6, True)

    echo = EchoPolicy(
        state_dim=13, action_names=[f"a{i}" for i in range(8)], camera_names=[], chunk_size=CHUNK
    )
    config = engine_config(STRATEGIES["async"], fps=10.0, refill_margin=4, execution_horizon=6)
    plain = StrategyEngine(local_source(echo), config, STRATEGIES["async"])
    with pytest.raises(RuntimeError) as refused:
        plain.connect()
    assert str(refused.value) == "strategy 'async': the server does not support RTC"


@pytest.mark.parametrize(("name", "expected"), [("sync", 0), ("async", 3), ("rtc", 3)])
def test_a_stopped_robot_hints_no_delay(name: str, expected: int) -> None:
    config = engine_config(STRATEGIES[name], fps=10.0, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(local_source(), config, STRATEGIES[name])
    engine.connect()
    engine.latency.record(0.25)  # 250 ms at 10 Hz: ceil(2.5) = 3 actions run while waiting
    assert engine.estimated_delay() == expected


# -- the simulated robot ----------------------------------------------------------------------------------


def sim_robot(name: str, delay: int, *, margin: int = 4, ticks: int = 40, **kwargs: Any) -> SimulatedRobot:
    policy = kwargs.pop("policy", None) or chunk_policy(
        state_dim=13, action_dim=8, chunk_size=CHUNK, execution_horizon=10, record_calls=True
    )
    env = kwargs.pop("env", None) or TabletopPickPlaceEnv(max_episode_steps=ticks)
    return SimulatedRobot(
        policy, STRATEGIES[name], delay=delay, refill_margin=margin, execution_horizon=6, fps=10.0,
        env=env, **kwargs,
    )  # fmt: skip


def runs_of(chunk_ids: list[int | None]) -> list[tuple[int | None, int]]:
    """Run-length encoding: [(id, length), ...]."""
    return [(value, len(list(run))) for value, run in itertools.groupby(chunk_ids)]


def test_a_negative_delay_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError) as refused:
        sim_robot("sync", -1)
    assert str(refused.value) == "delay must be >= 0, got -1"


def test_synchronous_by_default_plays_eight_then_stalls_the_delay_over_the_whole_episode() -> None:
    trace = sim_robot("sync", 2).run_episode(seed=3)  # no sync_steps given: 8
    # 40 ticks: 8 played, 2 stalled while the next chunk is inferred, four times over
    assert runs_of(trace.chunk_ids) == [
        (1, 8),
        (None, 2),
        (2, 8),
        (None, 2),
        (3, 8),
        (None, 2),
        (4, 8),
        (None, 2),
    ]
    for chunk_id in (1, 2, 3, 4):
        played = [a for a, c in zip(trace.actions, trace.chunk_ids, strict=True) if c == chunk_id]
        assert len(trace.chunks[chunk_id]) == CHUNK  # the robot was stopped: the whole chunk, from row 0
        np.testing.assert_array_equal(np.stack(played), trace.chunks[chunk_id][:8])


def test_synchronous_plays_the_sync_steps_it_is_given() -> None:
    trace = sim_robot("sync", 1, ticks=18, sync_steps=5).run_episode(seed=3)
    assert runs_of(trace.chunk_ids) == [(1, 5), (None, 1), (2, 5), (None, 1), (3, 5), (None, 1)]


def test_async_asks_after_one_tick_of_the_first_chunk_then_every_delay_ticks() -> None:
    # margin 10 + delay 6 = 16 = the whole chunk: the robot wants a chunk at once, but it sends at most
    # one request per tick, so the first chunk (fetched at rest) plays 1 tick, then 6 while in flight
    trace = sim_robot("async", 6, margin=10).run_episode(seed=3)
    runs = runs_of(trace.chunk_ids)
    assert runs[0] == (1, 7)
    assert all(length == 6 for _, length in runs[1:-1]) and trace.stalls == 0


def test_an_episode_takes_its_ticks_times_the_control_period_and_is_tagged_with_its_seed() -> None:
    trace = sim_robot("async", 2, ticks=30).run_episode(seed=5)
    assert trace.ticks == 30 and trace.seed == 5
    assert trace.seconds == pytest.approx(30 / 10.0)
    assert trace.success is False and sorted(trace.chunks) == list(range(1, len(trace.chunks) + 1))


def test_the_same_seed_gives_the_same_episode() -> None:
    first = sim_robot("rtc", 2).run_episode(seed=3)
    second = sim_robot("rtc", 2).run_episode(seed=3)
    np.testing.assert_array_equal(np.stack(first.actions), np.stack(second.actions))


def test_the_simulated_robot_runs_the_real_time_demo_loop_knobs() -> None:
    for name in ("sync", "rtc"):
        robot = sim_robot(name, 2, margin=3)
        assert robot.engine.config == engine_config(
            STRATEGIES[name], fps=10.0, refill_margin=3, execution_horizon=6
        )


class ReseededPolicy(ChunkPolicy):
    """A chunk policy that notes each ``reseed``, as the flow policy's sampling noise is reseeded."""

    def __init__(self) -> None:
        super().__init__(state_dim=13, action_dim=8, chunk_size=CHUNK, execution_horizon=10)
        self.seeds: list[int] = []

    def reseed(self, seed: int) -> None:
        self.seeds.append(seed)


def test_each_episode_reseeds_the_policy_with_its_seed() -> None:
    policy = ReseededPolicy()
    robot = sim_robot("async", 1, ticks=5, policy=policy)
    robot.run_episode(seed=21)
    robot.run_episode(seed=22)
    assert policy.seeds == [21, 22]


class ScriptedEnv:
    """Stands in for the simulator: notes every command and ends at ``ticks`` with ``success``."""

    def __init__(self, ticks: int, success: bool) -> None:
        self.ticks, self.success = ticks, success
        self.commands: list[np.ndarray] = []

    def reset(self, *, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        self.commands = []
        return {"state": np.full(13, 0.5, dtype=np.float32)}, {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.commands.append(np.array(action, copy=True))
        done = len(self.commands) == self.ticks
        return (
            {"state": np.full(13, 0.5, dtype=np.float32)},
            0.0,
            done and self.success,
            done,
            {"success": done and self.success},
        )


@pytest.mark.parametrize("success", [True, False])
def test_the_episode_outcome_is_the_envs_and_a_stall_holds_the_last_command(success: bool) -> None:
    env = ScriptedEnv(ticks=12, success=success)
    trace = sim_robot("sync", 2, env=env).run_episode(seed=0)
    assert trace.success is success and trace.ticks == 12
    assert trace.chunk_ids[8:10] == [None, None]
    np.testing.assert_array_equal(env.commands[8], env.commands[7])  # held through the stall
    np.testing.assert_array_equal(env.commands[9], env.commands[7])
    np.testing.assert_array_equal(env.commands[7], trace.actions[7])


# -- the delay proxy ------------------------------------------------------------------------------------


class Echo:
    """A loopback echo server on a thread, one connection at a time, until closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def started_thread(proxy: DelayProxy) -> threading.Thread:
    """Start ``proxy`` and return the thread it started."""
    before = set(threading.enumerate())
    proxy.start()
    (thread,) = set(threading.enumerate()) - before
    return thread


def test_the_one_way_delay_is_half_the_round_trip_and_zero_is_allowed() -> None:
    assert DelayProxy("127.0.0.1", 1, 80.0).one_way_s == 0.04
    assert DelayProxy("127.0.0.1", 1, 0.5).one_way_s == 0.00025
    assert DelayProxy("127.0.0.1", 1, 0.0).one_way_s == 0.0
    with pytest.raises(ValueError) as refused:
        DelayProxy("127.0.0.1", 1, -0.5)
    assert str(refused.value) == "round_trip_ms must be >= 0, got -0.5"


def test_the_proxy_listens_on_the_port_asked_for() -> None:
    port = free_port()
    with DelayProxy("127.0.0.1", 1, 0.0, port=port) as proxy:
        assert proxy.port == port and proxy.address == f"127.0.0.1:{port}"


def test_by_default_each_proxy_gets_its_own_ephemeral_port() -> None:
    with DelayProxy("127.0.0.1", 1, 0.0) as first, DelayProxy("127.0.0.1", 1, 0.0) as second:
        assert first.port > 0 and second.port > 0 and first.port != second.port
        assert first.address == f"127.0.0.1:{first.port}"


def test_a_port_in_use_is_raised_to_the_caller_of_start() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as refused:
            DelayProxy("127.0.0.1", 1, 0.0, port=port).start()
    assert refused.value.errno == errno.EADDRINUSE


def test_stop_closes_the_listener_and_ends_its_daemon_thread_cleanly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    echo = Echo()
    proxy = DelayProxy("127.0.0.1", echo.port, 20.0)
    try:
        thread = started_thread(proxy)
        # a daemon: a proxy left running never keeps the demo's process from exiting
        assert thread.name == "rollserve-netdelay" and thread.daemon is True
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            client.sendall(b"ping")
            assert client.recv(4) == b"ping"
            proxy.stop()
            assert not thread.is_alive()
            client.settimeout(5)
            with contextlib.suppress(ConnectionResetError):  # closed, not left hanging
                assert client.recv(4) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
        proxy.stop()  # a second stop is harmless
    finally:
        proxy.stop()
        echo.close()
    assert failures == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_stop_before_start_is_harmless() -> None:
    DelayProxy("127.0.0.1", 1, 0.0).stop()


@pytest.mark.parametrize(("given", "expected"), [((), 5.0), ((2.5,), 2.5)], ids=["default", "given"])
def test_stop_waits_for_the_thread_at_most_its_timeout(
    monkeypatch: pytest.MonkeyPatch, given: tuple[float, ...], expected: float
) -> None:
    proxy = DelayProxy("127.0.0.1", 1, 0.0)
    thread = started_thread(proxy)
    waits: list[float | None] = []
    join = thread.join

    def noted_join(timeout: float | None = None) -> None:
        waits.append(timeout)
        join(timeout)

    monkeypatch.setattr(thread, "join", noted_join)
    proxy.stop(*given)
    assert waits == [expected] and not thread.is_alive()


# -- --strategies ---------------------------------------------------------------------------------------


def demo_config(tmp_path: Any, *flags: str) -> Any:
    from rollserve.demo import runner

    parser = argparse.ArgumentParser(prog="rollserve demo")
    runner.add_arguments(parser)
    return runner.config_from_args(parser.parse_args(["--out", str(tmp_path), *flags]))


def test_strategies_run_in_the_order_given_each_once(tmp_path: Any) -> None:
    config = demo_config(tmp_path, "--strategies", " rtc, sync ,rtc,")
    assert [strategy.name for strategy in config.strategies] == ["rtc", "sync"]
    assert [s.name for s in demo_config(tmp_path).strategies] == ["sync", "async", "rtc"]  # the default


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (",", "argument --strategies: name at least one of sync, async, rtc"),
        ("rtc,foo,bar", "argument --strategies: unknown 'foo', 'bar'; choose from sync, async, rtc"),
    ],
)
def test_a_strategies_flag_naming_no_known_strategy_is_a_usage_error(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo_config(tmp_path, "--strategies", value)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"rollserve demo: error: {message}")
