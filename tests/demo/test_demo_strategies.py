"""The three strategies in simulated time: what each one sends, when it stalls, what it executes."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.demo.simtime import SimulatedRobot
from rollserve.demo.strategies import STRATEGIES
from rollserve.models.simple_policies import chunk_policy
from rollserve.sim.env import TabletopPickPlaceEnv

CHUNK = 16
TICKS = 40


def run(name: str, delay: int, *, margin: int = 4, horizon: int = 6):  # type: ignore[no-untyped-def]
    policy = chunk_policy(
        state_dim=13, action_dim=8, chunk_size=CHUNK, execution_horizon=10, record_calls=True
    )
    robot = SimulatedRobot(
        policy, STRATEGIES[name], delay=delay, refill_margin=margin, execution_horizon=horizon, fps=10.0,
        sync_steps=8, env=TabletopPickPlaceEnv(max_episode_steps=TICKS),
    )  # fmt: skip
    return robot.run_episode(seed=3), policy.calls


def runs_of(chunk_ids: list[int | None]) -> list[tuple[int | None, int]]:
    """Run-length encoding: [(id, length), ...]."""
    out: list[tuple[int | None, int]] = []
    for value in chunk_ids:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


@pytest.mark.parametrize("delay", [0, 2, 3])
def test_synchronous_plays_eight_actions_then_stalls_for_the_delay(delay: int) -> None:
    trace, calls = run("sync", delay)
    assert trace.ticks == TICKS and not trace.success
    for chunk_id, length in runs_of(trace.chunk_ids)[:-1]:
        assert length == (delay if chunk_id is None else 8)
    assert all(call["prev_chunk_left_over"] is None and call["inference_delay"] == 0 for call in calls)


@pytest.mark.parametrize("delay", [1, 3])
def test_async_switches_at_index_d_without_a_prefix(delay: int) -> None:
    trace, calls = run("async", delay)
    assert trace.stalls == 0
    assert all(call["prev_chunk_left_over"] is None for call in calls)
    assert [call["inference_delay"] for call in calls[1:]] == [delay] * (len(calls) - 1)
    # a new chunk takes over once delay + margin actions were left: 16 - d - (d + 4) + d played from each
    lengths = [length for _, length in runs_of(trace.chunk_ids)[1:-1]]
    assert lengths and set(lengths) == {CHUNK - delay - 4}


def test_rtc_sends_the_left_over_as_prefix_with_the_delay() -> None:
    delay = 2
    trace, calls = run("rtc", delay)
    assert trace.stalls == 0
    assert calls[0]["prev_chunk_left_over"] is None  # the first chunk of the episode has nothing to continue
    for call in calls[1:]:
        assert call["inference_delay"] == delay
        prefix = call["prev_chunk_left_over"]
        assert prefix is not None and prefix.shape == (6, 8)
        assert np.all(np.any(prefix != 0, axis=1))  # the left-over covers the horizon: no zero padding


def test_rtc_executes_the_chunk_from_index_d_on() -> None:
    delay = 3
    trace, _ = run("rtc", delay)
    for chunk_id, queue in trace.chunks.items():
        played = [a for a, c in zip(trace.actions, trace.chunk_ids, strict=True) if c == chunk_id]
        if played and chunk_id != min(trace.chunks):
            assert len(queue) == CHUNK - delay  # merged as chunk[d:]
            np.testing.assert_array_equal(played[0], queue[0])


def test_async_with_no_margin_is_just_in_time_while_sync_waits() -> None:
    trace, _ = run("async", delay=6, margin=0)  # asks with exactly 6 left; they run while it is in flight
    assert trace.stalls == 0
    trace, _ = run("sync", delay=6)
    assert trace.stalls >= 6
