"""Chunk switches when a control step lands at the worst moment of a cycle.

The source follows an ideal RTC timeline: row ``k`` of a chunk is ``prefix[0] + k``, so a correct
switch executes consecutive values, with no action skipped and none repeated. Each test forces one
interleaving deterministically (a control step injected at an exact point, in one thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rollserve.client.inference_loop import ChunkRequest, EngineConfig, InferenceEngine, SourceInfo
from rollserve.rtc import ActionQueue, RTCConfig
from rollserve.wire import ActionChunkMsg, MsgHeader

OBS = {"state": np.zeros(1, np.float32)}
CHUNK = 20


class _Robot:
    """The control loop: each step executes one action and records it."""

    def __init__(self) -> None:
        self.engine: InferenceEngine | None = None
        self.executed: list[float] = []
        self.stepping = False  # the step's own queue accesses are not the cycle's

    def step(self) -> None:
        assert self.engine is not None
        self.stepping = True
        try:
            action = self.engine.get_action()
        finally:
            self.stepping = False
        assert action is not None, "starved"
        self.executed.append(float(action[0]))


class _TimelineSource:
    """Chunk row ``k`` continues the prefix's timeline; the robot executes ``steps_during_infer``
    actions while each chunk with a prefix is inferred."""

    epoch = 0

    def __init__(self, robot: _Robot, steps_during_infer: int = 2) -> None:
        self.robot = robot
        self.steps_during_infer = steps_during_infer

    def connect(self) -> SourceInfo:
        return SourceInfo(CHUNK, 1, 10, rtc_supported=True)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        start = 0.0
        if request.prefix_model is not None:
            start = float(request.prefix_model[0, 0])
            for _ in range(self.steps_during_infer):
                self.robot.step()
        chunk = (start + np.arange(CHUNK, dtype=np.float32))[:, None]
        header = MsgHeader(seq_id=request.seq_id, episode_id=request.episode_id, session_epoch=0)
        return ActionChunkMsg(header=header, chunk_model=chunk, chunk_robot=chunk.copy())

    def reset(self, episode_id: int) -> None: ...
    def reconnect(self) -> SourceInfo:
        return self.connect()

    def close(self) -> None: ...


class _LockThatSteps:
    """Stands in for the queue's lock: right after the cycle's ``nth`` release, one control step runs."""

    def __init__(self, lock: Any, robot: _Robot, nth: int) -> None:
        self._lock = lock
        self._robot = robot
        self._nth = nth
        self.releases = 0

    def __enter__(self) -> bool:
        return bool(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        if self._robot.stepping:
            return
        self.releases += 1
        if self.releases == self._nth:
            self._robot.step()


def _engine_mid_chunk() -> tuple[_Robot, InferenceEngine]:
    """An engine on its first chunk (0..19) with 0..4 executed: the next cycle switches chunks."""
    robot = _Robot()
    engine = InferenceEngine(
        _TimelineSource(robot), EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=10))
    )
    robot.engine = engine
    engine.connect()
    assert engine.run_cycle(OBS, delay=0)
    for _ in range(5):
        robot.step()
    return robot, engine


def _finish(robot: _Robot, engine: InferenceEngine, arm: Callable[[], None]) -> list[float]:
    arm()
    assert engine.run_cycle(OBS)  # no delay given: merged with the actions really executed
    for _ in range(5):
        robot.step()
    return robot.executed


def test_switch_without_interference_executes_a_continuous_timeline() -> None:
    robot, engine = _engine_mid_chunk()
    assert _finish(robot, engine, lambda: None) == list(range(12))


def test_a_step_right_after_the_cycle_first_reads_the_queue_skips_nothing() -> None:
    """Regression: the read index and the prefix were read under two locks; a step in between made
    the prefix start one action later than the index the merge counted from (one action skipped)."""
    robot, engine = _engine_mid_chunk()

    def arm() -> None:
        engine.queue._lock = _LockThatSteps(engine.queue._lock, robot, nth=1)  # type: ignore[assignment]

    assert _finish(robot, engine, arm) == list(range(13))


def test_a_step_just_before_the_merge_takes_the_queue_lock_repeats_nothing() -> None:
    """Regression: the executed count was read before the merge took the queue lock; a step in
    between was executed but not counted (one action executed twice)."""
    robot, engine = _engine_mid_chunk()
    queue = engine.queue
    merge = queue.merge

    def step_then_merge(*args: Any, **kwargs: Any) -> None:
        robot.step()
        merge(*args, **kwargs)

    def arm() -> None:
        queue.merge = step_then_merge  # type: ignore[method-assign]

    assert _finish(robot, engine, arm) == list(range(13))


def test_the_queue_counts_the_merge_delay_under_its_lock_when_none_is_given() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    chunk = np.arange(6, dtype=np.float32)[:, None]
    queue.merge(chunk, chunk + 100, 0, 0)
    queue.get()
    index = queue.get_action_index()
    queue.get()
    queue.get()
    queue.merge(chunk + 1, chunk + 101, None, index)  # 2 ran since index 1: the new chunk from row 2
    assert queue.get_left_over()[:, 0].tolist() == [3, 4, 5, 6]  # type: ignore[index]
    assert queue.get_processed_left_over()[:, 0].tolist() == [103, 104, 105, 106]  # type: ignore[index]
    with pytest.raises(ValueError, match="needs action_index_before_inference"):
        queue.merge(chunk, chunk, None, None)


def test_the_two_prefixes_start_at_the_same_action_when_a_step_lands_between_them() -> None:
    """Regression: ``prefixes`` read the model-space and robot-space left-overs under two locks; a
    control step in between made the robot prefix start one action after the model prefix."""
    robot, engine = _engine_mid_chunk()
    engine.queue._lock = _LockThatSteps(engine.queue._lock, robot, nth=1)  # type: ignore[assignment]
    prefix_model, prefix_robot = engine.prefixes()
    assert robot.executed == [0, 1, 2, 3, 4, 5]  # the step did land right after the first read
    assert prefix_model is not None and prefix_robot is not None
    assert prefix_model[:, 0].tolist() == list(range(5, 15))  # 5.. : the horizon is 10
    assert prefix_robot[:, 0].tolist() == list(range(5, 15))
