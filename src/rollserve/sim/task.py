"""What the task asks: where the cube and the target may start, and when the cube counts as placed.

Pick the cube up and put it down on the target disc. The cube starts on the robot's left, the
target on its right, both jittered by a few centimetres, so one scripted strategy covers every
layout and a small behaviour-cloned policy can learn it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CUBE_HALF_SIZE = 0.025
"""5 cm cube: fits the Panda's 8 cm gripper opening with margin."""

TABLE_TOP_Z = 0.0
"""The robot base stands on the table top, which is the world's z = 0."""

CUBE_REST_Z = TABLE_TOP_Z + CUBE_HALF_SIZE


@dataclass(frozen=True)
class TaskConfig:
    """Randomisation ranges and the success rule; defaults are the task everyone trains on."""

    cube_x: tuple[float, float] = (0.45, 0.60)
    cube_y: tuple[float, float] = (0.05, 0.20)
    target_x: tuple[float, float] = (0.45, 0.60)
    target_y: tuple[float, float] = (-0.20, -0.05)
    success_radius: float = 0.04
    """Cube centre within this xy distance of the target centre."""
    rest_tolerance: float = 0.01
    """Cube centre less than this far above its resting height: put down, not held over the target."""

    def sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Cube xy and target xy for one episode."""
        cube = np.array([rng.uniform(*self.cube_x), rng.uniform(*self.cube_y)])
        target = np.array([rng.uniform(*self.target_x), rng.uniform(*self.target_y)])
        return cube, target

    def is_success(self, cube_pos: np.ndarray, target_xy: np.ndarray) -> bool:
        near = float(np.linalg.norm(cube_pos[:2] - target_xy[:2])) < self.success_radius
        resting = float(cube_pos[2]) < CUBE_REST_Z + self.rest_tolerance
        return near and resting

    def reward(self, cube_pos: np.ndarray, target_xy: np.ndarray, success: bool) -> float:
        """Dense shaping (negative cube-to-target distance) plus a bonus on success."""
        return -float(np.linalg.norm(cube_pos[:2] - target_xy[:2])) + (10.0 if success else 0.0)
