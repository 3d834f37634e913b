"""The tabletop pick-and-place task as a gymnasium environment, with exact snapshot and restore.

Observation: ``{"state": float32 (13,)}`` laid out as ``layout.STATE_NAMES``, plus
``"images": {"exterior", "wrist"}`` (uint8 HWC RGB) when built with ``render_images=True``.
Action: float32 (8,) laid out as ``layout.ACTION_NAMES``: absolute joint-position targets and a
gripper command in [0, 1] (0 open, 1 closed). One step holds the action for 1 / CONTROL_HZ s.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from rollserve.sim.layout import (
    ACTION_DIM,
    CAMERA_NAMES,
    CONTROL_HZ,
    DEFAULT_IMAGE_SIZE,
    MAX_EPISODE_STEPS,
    STATE_DIM,
)
from rollserve.sim.rendering import CameraRig
from rollserve.sim.scene import FINGER_OPEN, PHYSICS_TIMESTEP, SceneIndex, build_model
from rollserve.sim.snapshot import EnvSnapshot
from rollserve.sim.task import CUBE_REST_Z, TaskConfig

HOME_QPOS = np.array([0.0, -0.4181, 0.0, -2.5794, 0.0, 0.5913, 0.0])
"""Arm start pose: gripper 30 cm above the table at x = 0.4 m, pointing down."""

HOME_NOISE = 0.02
"""Uniform jitter (rad) on each start joint, so policies see (and learn from) varied starts."""

PHYSICS_STEPS_PER_CONTROL = round(1.0 / (CONTROL_HZ * PHYSICS_TIMESTEP))


def gripper_opening_to_command(fingers: np.ndarray) -> float:
    """Finger slide positions (m) -> gripper position in [0, 1] (1 closed), the action's convention."""
    return float(np.clip(1.0 - (fingers[0] + fingers[1]) / (2 * FINGER_OPEN), 0.0, 1.0))


class TabletopPickPlaceEnv(gym.Env[dict[str, Any], np.ndarray]):
    """Franka Panda, a 5 cm cube and a target disc; success is the cube put down on the target."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": CONTROL_HZ}

    def __init__(
        self,
        render_images: bool = False,
        image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
        task: TaskConfig | None = None,
        max_episode_steps: int = MAX_EPISODE_STEPS,
        terminate_on_success: bool = True,
        render_mode: str | None = None,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', not {render_mode!r}")
        self.render_mode = render_mode
        self.render_images = render_images
        self.image_size = tuple(image_size)
        self.task = task or TaskConfig()
        self.max_episode_steps = max_episode_steps
        self.terminate_on_success = terminate_on_success

        self.model = build_model()
        self.data = mujoco.MjData(self.model)
        self.index = SceneIndex.of(self.model)
        self._state_spec = mujoco.mjtState.mjSTATE_INTEGRATION
        self._cameras: CameraRig | None = None
        self.step_count = 0

        arm_range = self.model.jnt_range[[self.model.dof_jntid[d] for d in self.index.arm_dof]]
        self.action_space = spaces.Box(
            low=np.append(arm_range[:, 0], 0.0).astype(np.float32),
            high=np.append(arm_range[:, 1], 1.0).astype(np.float32),
            dtype=np.float32,
        )
        obs: dict[str, spaces.Space] = {
            "state": spaces.Box(-np.inf, np.inf, shape=(STATE_DIM,), dtype=np.float32)
        }
        if render_images:
            image = spaces.Box(0, 255, shape=(*self.image_size, 3), dtype=np.uint8)
            obs["images"] = spaces.Dict({name: image for name in CAMERA_NAMES})
        self.observation_space = spaces.Dict(obs)
        self._reset_physics(np.array([0.5, 0.1]), np.array([0.5, -0.1]), HOME_QPOS)

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; ``options`` may fix ``cube_xy`` and/or ``target_xy`` instead of sampling."""
        super().reset(seed=seed)
        cube_xy, target_xy = self.task.sample(self.np_random)
        arm = HOME_QPOS + self.np_random.uniform(-HOME_NOISE, HOME_NOISE, size=HOME_QPOS.shape)
        options = options or {}
        if "cube_xy" in options:
            cube_xy = np.asarray(options["cube_xy"], dtype=np.float64)
        if "target_xy" in options:
            target_xy = np.asarray(options["target_xy"], dtype=np.float64)
        self._reset_physics(cube_xy, target_xy, arm)
        self.step_count = 0
        return self._observation(), self._info()

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Hold ``action`` for one control period. A malformed action raises before anything changes."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (ACTION_DIM,):
            raise ValueError(f"action must have shape ({ACTION_DIM},), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError("action must be finite")
        action = np.clip(action, self.action_space.low, self.action_space.high)
        self.data.ctrl[self.index.arm_actuators] = action[:7]
        self.data.ctrl[self.index.finger_actuators] = FINGER_OPEN * (1.0 - action[7])
        mujoco.mj_step(self.model, self.data, nstep=PHYSICS_STEPS_PER_CONTROL)
        self.step_count += 1

        info = self._info()
        reward = self.task.reward(self.cube_position, self.target_xy, info["success"])
        terminated = bool(info["success"] and self.terminate_on_success)
        truncated = self.step_count >= self.max_episode_steps
        return self._observation(), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The exterior camera view (``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array":
            return None
        return self._camera_rig().render(self.data)["exterior"]

    def close(self) -> None:
        if self._cameras is not None:
            self._cameras.close()
            self._cameras = None

    # -- snapshot / restore --------------------------------------------------------------------

    def get_snapshot(self) -> EnvSnapshot:
        """Everything the future depends on: full MuJoCo integration state, step count, RNG state."""
        physics = np.empty(mujoco.mj_stateSize(self.model, self._state_spec))
        mujoco.mj_getState(self.model, self.data, physics, self._state_spec)
        return EnvSnapshot(
            physics=physics, step_count=self.step_count, rng_state=self.np_random.bit_generator.state
        )

    def set_snapshot(self, snapshot: EnvSnapshot | bytes) -> None:
        """Restore a snapshot (of this env or another instance): the same actions then give
        bit-identical observations, rewards and infos."""
        if isinstance(snapshot, bytes | bytearray | memoryview):
            snapshot = EnvSnapshot.from_bytes(bytes(snapshot))
        expected = mujoco.mj_stateSize(self.model, self._state_spec)
        if snapshot.physics.shape != (expected,):
            raise ValueError(
                f"snapshot holds {snapshot.physics.size} physics values, this env needs {expected}"
            )
        mujoco.mj_setState(self.model, self.data, snapshot.physics, self._state_spec)
        mujoco.mj_forward(self.model, self.data)
        self.step_count = snapshot.step_count
        self.np_random.bit_generator.state = snapshot.rng_state

    # -- readings ------------------------------------------------------------------------------

    @property
    def cube_position(self) -> np.ndarray:
        adr = self.index.cube_qpos
        return self.data.qpos[adr : adr + 3].copy()

    @property
    def target_xy(self) -> np.ndarray:
        return self.data.mocap_pos[self.index.target_mocap, :2].copy()

    def state_vector(self) -> np.ndarray:
        """The ``state`` observation, float32, laid out as ``layout.STATE_NAMES``."""
        qpos = self.data.qpos
        adr = self.index.cube_qpos
        state = np.empty(STATE_DIM, dtype=np.float32)
        state[:7] = qpos[self.index.arm_qpos]
        state[7] = gripper_opening_to_command(qpos[self.index.finger_qpos])
        state[8:11] = qpos[adr : adr + 3]
        state[11:13] = self.data.mocap_pos[self.index.target_mocap, :2]
        return state

    def render_cameras(self) -> dict[str, np.ndarray]:
        """All cameras now, whatever ``render_images`` says (e.g. for a demo video)."""
        return self._camera_rig().render(self.data)

    # -- internals -----------------------------------------------------------------------------

    def _reset_physics(self, cube_xy: np.ndarray, target_xy: np.ndarray, arm: np.ndarray) -> None:
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[self.index.arm_qpos] = arm
        self.data.qpos[self.index.finger_qpos] = FINGER_OPEN
        self.data.ctrl[self.index.arm_actuators] = arm
        self.data.ctrl[self.index.finger_actuators] = FINGER_OPEN
        adr = self.index.cube_qpos
        self.data.qpos[adr : adr + 7] = [cube_xy[0], cube_xy[1], CUBE_REST_Z, 1.0, 0.0, 0.0, 0.0]
        self.data.mocap_pos[self.index.target_mocap] = [target_xy[0], target_xy[1], 0.0]
        mujoco.mj_forward(self.model, self.data)

    def _camera_rig(self) -> CameraRig:
        if self._cameras is None:
            self._cameras = CameraRig(self.model, self.image_size)
        return self._cameras

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {"state": self.state_vector()}
        if self.render_images:
            obs["images"] = self._camera_rig().render(self.data)
        return obs

    def _info(self) -> dict[str, Any]:
        cube = self.cube_position
        success = self.task.is_success(cube, self.target_xy)
        return {
            "success": success,
            "is_success": success,
            "cube_to_target": float(np.linalg.norm(cube[:2] - self.target_xy)),
            "step_count": self.step_count,
        }
