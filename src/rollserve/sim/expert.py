"""Scripted pick-and-place expert: phases of end-effector waypoints, turned into joint targets by IK.

It acts from the observation alone (forward kinematics of the measured joints, the cube and the
target), so it is a policy like any other. Its end-effector command moves with bounded velocity
and acceleration and its gripper command ramps, so recorded action chunks are smooth.
"""

from __future__ import annotations

import enum

import numpy as np

from rollserve.sim.env import HOME_QPOS
from rollserve.sim.kinematics import ArmKinematics
from rollserve.sim.layout import CONTROL_HZ, CUBE_SLICE, GRIPPER_INDEX, JOINT_SLICE, TARGET_SLICE
from rollserve.sim.scene import build_model
from rollserve.sim.task import CUBE_REST_Z

HOVER_HEIGHT = 0.10
"""End-effector height above the cube centre before descending onto it."""
GRASP_HEIGHT = 0.035
"""End-effector site above the cube centre when grasping (fingertips 1.5 cm above the table)."""
CARRY_Z = 0.16
"""End-effector height while carrying the cube."""
MAX_SPEED = 0.3
"""m/s of the commanded end effector."""
MAX_ACCEL = 1.5
"""m/s^2 of the commanded end effector."""
GRIPPER_RATE = 0.25
"""Largest change of the gripper command per control step."""
GRASP_STEPS = 6
"""Control steps to hold still while the fingers close."""


class Phase(enum.Enum):
    APPROACH = "approach"
    DESCEND = "descend"
    GRASP = "grasp"
    LIFT = "lift"
    CARRY = "carry"
    LOWER = "lower"
    RELEASE = "release"


class ScriptedExpert:
    """Call ``reset(obs)`` at the start of each episode, then ``act(obs)`` every control step."""

    def __init__(self) -> None:
        self._kin = ArmKinematics(build_model(), rest_posture=HOME_QPOS)
        self._dt = 1.0 / CONTROL_HZ
        self.phase = Phase.APPROACH

    def reset(self, obs: dict[str, np.ndarray]) -> None:
        state = np.asarray(obs["state"], dtype=np.float64)
        self._q_cmd = state[JOINT_SLICE].copy()
        self._pos_cmd, _ = self._kin.forward(self._q_cmd)
        self._vel = np.zeros(3)
        self._gripper = float(state[GRIPPER_INDEX])
        self._phase_steps = 0
        self._grasp_offset = np.array([0.0, 0.0, GRASP_HEIGHT])
        self.phase = Phase.APPROACH

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        state = np.asarray(obs["state"], dtype=np.float64)
        ee, _ = self._kin.forward(state[JOINT_SLICE])
        cube = state[CUBE_SLICE]
        target = state[TARGET_SLICE]
        goal, gripper = self._plan(ee, cube, target)
        self._move_toward(goal)
        self._gripper += float(np.clip(gripper - self._gripper, -GRIPPER_RATE, GRIPPER_RATE))
        self._q_cmd = self._kin.solve(self._q_cmd, self._pos_cmd)
        return np.append(self._q_cmd, self._gripper).astype(np.float32)

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self._phase_steps = 0

    def _plan(self, ee: np.ndarray, cube: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, float]:
        """The waypoint and gripper command of the current phase, advancing phases as they finish."""
        self._phase_steps += 1
        above_cube = cube + np.array([0.0, 0.0, HOVER_HEIGHT])
        at_cube = cube + np.array([0.0, 0.0, GRASP_HEIGHT])
        holding = self._gripper > 0.5 and np.linalg.norm(cube - (ee - self._grasp_offset)) < 0.03

        if self.phase in (Phase.LIFT, Phase.CARRY, Phase.LOWER) and not holding:
            self._enter(Phase.APPROACH)  # dropped or missed it: start over
        if self.phase is Phase.APPROACH:
            if _near(ee, above_cube, 0.015) and _near(self._pos_cmd, above_cube, 0.005):
                self._enter(Phase.DESCEND)
            return above_cube, 0.0
        if self.phase is Phase.DESCEND:
            if _near(ee, at_cube, 0.008):
                self._enter(Phase.GRASP)
            return at_cube, 0.0
        if self.phase is Phase.GRASP:
            if self._phase_steps >= GRASP_STEPS:
                self._grasp_offset = ee - cube
                self._enter(Phase.LIFT)
            return at_cube, 1.0
        carry_goal = np.array([*(target + self._grasp_offset[:2]), CARRY_Z])
        if self.phase is Phase.LIFT:
            if ee[2] > CARRY_Z - 0.03:
                self._enter(Phase.CARRY)
            return np.array([ee[0], ee[1], CARRY_Z]), 1.0
        if self.phase is Phase.CARRY:
            if _near(ee[:2], carry_goal[:2], 0.01):
                self._enter(Phase.LOWER)
            return carry_goal, 1.0
        place_goal = np.array([*carry_goal[:2], CUBE_REST_Z + self._grasp_offset[2] + 0.005])
        if self.phase is Phase.LOWER:
            if cube[2] < CUBE_REST_Z + 0.008:
                self._enter(Phase.RELEASE)
            return place_goal, 1.0
        return place_goal + np.array([0.0, 0.0, 0.08]) if self._gripper < 0.2 else place_goal, 0.0

    def _move_toward(self, goal: np.ndarray) -> None:
        """Advance the commanded position: velocity toward the goal, bounded in speed and acceleration."""
        wanted = _clip_norm(3.0 * (goal - self._pos_cmd), MAX_SPEED)
        self._vel += _clip_norm(wanted - self._vel, MAX_ACCEL * self._dt)
        self._pos_cmd = self._pos_cmd + self._vel * self._dt


def _near(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    return float(np.linalg.norm(a - b)) < tolerance


def _clip_norm(v: np.ndarray, limit: float) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v if norm <= limit else v * (limit / norm)
