"""The simulated robot's real-time control loop: one env step per control tick, on the wall clock.

Every tick the robot hands the engine its newest observation and takes the next action. With no
action ready (a *stall*) it holds its last joint targets, and the world keeps moving: the env is
stepped either way, so stalls cost episode time exactly as on a real robot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rollserve.demo.metrics import EpisodeTrace
from rollserve.demo.strategies import StrategyEngine
from rollserve.sim.env import TabletopPickPlaceEnv

TickCallback = Callable[[EpisodeTrace], None]


def hold_action(observation: dict[str, Any]) -> np.ndarray:
    """Targets that keep the arm where it is, gripper open: the command before any chunk arrived."""
    action = np.zeros(8, dtype=np.float32)
    action[:7] = observation["state"][:7]
    return action


def start_episode(engine: StrategyEngine, observation: dict[str, Any], timeout_s: float) -> float:
    """Reset the engine for a new episode and block until its first chunk is queued (seconds taken).

    The observation is posted before the reset too, so a request the loop thread starts in
    between carries the new observation, never the last one of the previous episode. A request
    still in flight from the old episode is dropped as stale; posting again lets the loop retry.
    """
    engine.update_observation(observation)
    engine.reset()
    engine.queue.forget_merged()
    started = time.perf_counter()
    posted = started
    engine.update_observation(observation)
    while engine.ready_actions() == 0:
        now = time.perf_counter()
        if now - started > timeout_s:
            raise TimeoutError(f"no first chunk within {timeout_s:.0f} s (is the server reachable?)")
        if now - posted > 0.25:
            engine.update_observation(observation)
            posted = now
        time.sleep(0.002)
    return time.perf_counter() - started


def run_realtime_episode(
    engine: StrategyEngine,
    env: TabletopPickPlaceEnv,
    seed: int,
    *,
    fps: float,
    record_snapshots: bool = False,
    on_tick: TickCallback | None = None,
    first_chunk_timeout_s: float = 60.0,
) -> EpisodeTrace:
    """One episode with ``engine`` running its background thread (``engine.start()`` first).

    The robot starts at rest and begins ticking once its first chunk is there, for every
    strategy alike, so stalls count only what a strategy costs while the task runs.
    """
    trace = EpisodeTrace(seed=seed)
    observation, _ = env.reset(seed=seed)
    trace.first_chunk_s = start_episode(engine, observation, first_chunk_timeout_s)
    command = hold_action(observation)
    dt = 1.0 / fps
    started = time.perf_counter()
    tick = 0
    while True:
        if record_snapshots:
            trace.snapshots.append(env.get_snapshot().to_bytes())
        action = engine.act(observation)
        trace.record(action, engine.last_chunk_id)
        if action is not None:
            command = action
        observation, _, terminated, truncated, info = env.step(command)
        if on_tick is not None:
            on_tick(trace)
        if terminated or truncated:
            trace.success = bool(info["success"])
            break
        tick += 1
        delay = started + tick * dt - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    # The last tick lasts its whole period too: an on-time episode of n ticks takes n * dt.
    trace.seconds = max(time.perf_counter(), started + trace.ticks * dt) - started
    trace.chunks = engine.queue.forget_merged()
    return trace
