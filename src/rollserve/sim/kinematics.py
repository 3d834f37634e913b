"""Inverse kinematics for the Panda from MuJoCo's own site Jacobian (damped least squares).

Used by the scripted expert to turn end-effector waypoints into joint-position targets, the
action space a DROID-style policy outputs.
"""

from __future__ import annotations

import mujoco
import numpy as np

from rollserve.sim.scene import SceneIndex

DOWN = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]])
"""Gripper pointing at the table, fingers closing along the world y axis."""


class ArmKinematics:
    """Forward and inverse kinematics of the arm on a private ``MjData`` (the sim is never touched)."""

    def __init__(
        self,
        model: mujoco.MjModel,
        rest_posture: np.ndarray,
        damping: float = 0.05,
        posture_gain: float = 0.1,
        max_joint_step: float = 0.2,
    ) -> None:
        self.model = model
        self.index = SceneIndex.of(model)
        self._data = mujoco.MjData(model)
        self._rest = np.asarray(rest_posture, dtype=np.float64)
        self._damping2 = damping**2
        self._posture_gain = posture_gain
        self._max_step = max_joint_step
        self._range = model.jnt_range[[model.dof_jntid[d] for d in self.index.arm_dof]].copy()
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def _place(self, q: np.ndarray) -> None:
        self._data.qpos[self.index.arm_qpos] = q
        mujoco.mj_kinematics(self.model, self._data)
        mujoco.mj_comPos(self.model, self._data)

    def forward(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """End-effector site position (3,) and rotation matrix (3, 3) at arm configuration ``q``."""
        self._place(q)
        site = self.index.ee_site
        return self._data.site_xpos[site].copy(), self._data.site_xmat[site].reshape(3, 3).copy()

    def solve(
        self, q_init: np.ndarray, target_pos: np.ndarray, target_rot: np.ndarray = DOWN, iterations: int = 4
    ) -> np.ndarray:
        """Joint positions that put the site at ``target_pos`` with ``target_rot``, starting from ``q_init``.

        A few Newton-like steps per call suffice when called every control step from the last
        solution; the nullspace pulls toward the rest posture so the redundant joint never drifts.
        """
        q = np.array(q_init, dtype=np.float64)
        site = self.index.ee_site
        dofs = self.index.arm_dof
        for _ in range(iterations):
            self._place(q)
            pos_err = target_pos - self._data.site_xpos[site]
            rot = self._data.site_xmat[site].reshape(3, 3)
            rot_err = 0.5 * np.cross(rot.T, target_rot.T).sum(axis=0)  # small-angle axis * angle
            error = np.concatenate([pos_err, rot_err])
            mujoco.mj_jacSite(self.model, self._data, self._jacp, self._jacr, site)
            jac = np.vstack([self._jacp[:, dofs], self._jacr[:, dofs]])
            jjt = jac @ jac.T
            dq = jac.T @ np.linalg.solve(jjt + self._damping2 * np.eye(6), error)
            null = np.eye(len(q)) - jac.T @ np.linalg.solve(jjt + 1e-9 * np.eye(6), jac)
            dq += null @ (self._posture_gain * (self._rest - q))
            step = np.max(np.abs(dq))
            if step > self._max_step:
                dq *= self._max_step / step
            q = np.clip(q + dq, self._range[:, 0], self._range[:, 1])
        return q
