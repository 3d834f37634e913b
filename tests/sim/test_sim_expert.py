"""The scripted expert solves the task, and the kinematics it relies on are right."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rollserve.sim.env import HOME_QPOS
from rollserve.sim.evaluate import evaluate_expert
from rollserve.sim.evaluate import main as evaluate_main
from rollserve.sim.kinematics import DOWN, ArmKinematics
from rollserve.sim.scene import build_model


def test_ik_reaches_workspace_points_pointing_down() -> None:
    kin = ArmKinematics(build_model(), rest_posture=HOME_QPOS)
    for goal in ([0.6, 0.2, 0.06], [0.45, -0.2, 0.06], [0.5, 0.0, 0.2]):
        q = HOME_QPOS.copy()
        for _ in range(10):
            q = kin.solve(q, np.array(goal))
        pos, rot = kin.forward(q)
        np.testing.assert_allclose(pos, goal, atol=1e-3)
        np.testing.assert_allclose(rot, DOWN, atol=1e-2)


def test_expert_succeeds_on_every_sampled_seed() -> None:
    """README: 200/200 over seeds 0..199 (``python -m rollserve.sim.evaluate --episodes 200``); these
    five are among them, so every one must succeed."""
    result = evaluate_expert(range(100, 105))
    assert result.successes == (True,) * 5, result
    assert max(result.episode_steps) < 100


def test_the_evaluate_command_prints_the_measured_score(capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate_main(["--episodes", "2"]) == 0
    line = capsys.readouterr().out.strip()
    match = re.fullmatch(
        r"expert: (\d+)/(\d+) successes over seeds 0\.\.1, mean episode ([\d.]+) steps, \d+ steps/s", line
    )
    assert match, line
    assert match.group(1, 2) == ("2", "2") and 40 < float(match.group(3)) < 100
