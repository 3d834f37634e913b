"""Serve LeRobot checkpoints (ACT, Diffusion, SmolVLA, pi0, pi0.5) with ``--policy lerobot:PATH``.

Importing this package does not import LeRobot; loading a checkpoint does.
"""

from rollserve.adapters.lerobot.loading import LeRobotLoadError, load_lerobot_policy, read_policy_type
from rollserve.adapters.lerobot.support import SUPPORTED_TYPES, TypeSupport, UnsupportedPolicyType

SPEC_PREFIX = "lerobot:"

__all__ = [
    "SPEC_PREFIX",
    "SUPPORTED_TYPES",
    "LeRobotLoadError",
    "TypeSupport",
    "UnsupportedPolicyType",
    "load_lerobot_policy",
    "read_policy_type",
]
