"""The scripted expert solves the task, and the kinematics it relies on are right."""

from __future__ import annotations

import numpy as np

from rollserve.sim.env import HOME_QPOS
from rollserve.sim.evaluate import evaluate_expert
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


def test_expert_succeeds_on_most_seeds() -> None:
    result = evaluate_expert(range(100, 105))
    assert sum(result.successes) >= 4, result
    assert max(result.episode_steps) < 100
