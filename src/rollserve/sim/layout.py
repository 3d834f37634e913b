"""Names, sizes and rates of the tabletop task: what a policy, a dataset or a client can rely on.

Kept free of MuJoCo so the robot side and the server can read the layout without the simulator.
"""

from __future__ import annotations

CONTROL_HZ: float = 10.0
"""Policy/env step rate (DROID records at 15 Hz; 10 Hz keeps episodes short for CPU training)."""

MAX_EPISODE_STEPS: int = 120
"""Truncation horizon in control steps (12 s); the scripted expert finishes in about 60."""

ACTION_NAMES: tuple[str, ...] = (
    "joint_1",
    "joint_2",
    "joint_3",
    "joint_4",
    "joint_5",
    "joint_6",
    "joint_7",
    "gripper",
)
"""DROID layout: 7 absolute joint-position targets (rad) + gripper position in [0, 1] (0 open, 1 closed)."""

STATE_NAMES: tuple[str, ...] = (
    *(f"joint_{i}" for i in range(1, 8)),
    "gripper",
    "cube_x",
    "cube_y",
    "cube_z",
    "target_x",
    "target_y",
)
"""Measured joint positions (rad), gripper opening as in the action, cube centre (m), target (m)."""

CAMERA_NAMES: tuple[str, ...] = ("exterior", "wrist")
"""Rendered only when images are asked for; uint8 HWC RGB."""

DEFAULT_IMAGE_SIZE: tuple[int, int] = (96, 96)
"""(height, width) of rendered camera images."""

ACTION_DIM: int = len(ACTION_NAMES)
STATE_DIM: int = len(STATE_NAMES)

JOINT_SLICE = slice(0, 7)
GRIPPER_INDEX = 7
CUBE_SLICE = slice(8, 11)
TARGET_SLICE = slice(11, 13)
