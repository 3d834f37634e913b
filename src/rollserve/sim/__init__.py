"""The simulated robot task: a Franka Panda picks a cube and places it on a target (MuJoCo).

``env`` is the gymnasium environment, ``expert`` the scripted demonstrator, ``dataset`` records
demonstrations. This module stays light: it names the layout and registers the gymnasium id.
"""

from __future__ import annotations

from rollserve.sim.gl import choose_gl_backend

choose_gl_backend()

from rollserve.sim.layout import (  # noqa: E402  (after the GL choice, which must precede mujoco)
    ACTION_DIM,
    ACTION_NAMES,
    CAMERA_NAMES,
    CONTROL_HZ,
    DEFAULT_IMAGE_SIZE,
    MAX_EPISODE_STEPS,
    STATE_DIM,
    STATE_NAMES,
)

ENV_ID = "rollserve/TabletopPickPlace-v0"

try:
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="rollserve.sim.env:TabletopPickPlaceEnv")
except ImportError:  # gymnasium comes with the sim extra; the layout is useful without it
    pass

__all__ = [
    "ACTION_DIM",
    "ACTION_NAMES",
    "CAMERA_NAMES",
    "CONTROL_HZ",
    "DEFAULT_IMAGE_SIZE",
    "ENV_ID",
    "MAX_EPISODE_STEPS",
    "STATE_DIM",
    "STATE_NAMES",
]
