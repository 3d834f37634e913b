"""Closed-loop evaluation of the shipped policy in the sim: synchronous and delayed RTC execution."""

from __future__ import annotations

import importlib.util

import pytest

from rollserve.models.checkpoint import default_checkpoint_dir, load_default
from rollserve.training.policy_eval import ChunkActor, evaluate_policy

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the sim extra"),
    pytest.mark.skipif(not (default_checkpoint_dir() / "config.json").exists(), reason="no checkpoint"),
]


@pytest.mark.parametrize(("delay", "rtc"), [(0, False), (3, True)])
def test_shipped_policy_solves_the_task(delay: int, rtc: bool) -> None:
    result = evaluate_policy(load_default(), episodes=2, inference_delay=delay, rtc=rtc)
    assert result["successes"] == 2, result
    assert result["mean_switch_jump_rad"] > 0 and result["mean_step_rad"] > 0


def test_delay_must_leave_room_in_the_chunk() -> None:
    with pytest.raises(ValueError):
        ChunkActor(load_default(), 0, execute_steps=8, inference_delay=9)
