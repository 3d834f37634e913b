"""The MuJoCo scene: the Franka Panda from the installed gymnasium-robotics assets, a table, a cube,
a target marker and two cameras.

The Panda's MJCF and meshes are included from the installed ``gymnasium_robotics`` package (never
copied), then adjusted through ``MjSpec``: gravity compensation on the arm (its position servos are
too soft to hold it up accurately on their own) and a wrist camera on the hand.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

import mujoco
import numpy as np

from rollserve.sim.task import CUBE_HALF_SIZE, TABLE_TOP_Z

PHYSICS_TIMESTEP = 0.004
"""Seconds per physics step; the implicit integrator keeps the damped Panda stable at 4 ms."""

ARM_JOINTS = tuple(f"robot:panda0_joint{i}" for i in range(1, 8))
FINGER_JOINTS = ("robot:panda0_finger_joint1", "robot:panda0_finger_joint2")
FINGER_OPEN = 0.04
"""Finger slide joint position (m) when fully open; 0 is closed."""
EE_SITE = "end_effector"
"""Site between the finger pads, z axis along the fingers."""
EXTERIOR_EYE = np.array([1.05, 0.6, 0.6])
"""Exterior camera position: front-left of the robot, seeing the arm, the cube and the target."""


def franka_assets_dir() -> Path:
    """Where the installed gymnasium-robotics keeps the Panda MJCF (found without importing it)."""
    spec = importlib.util.find_spec("gymnasium_robotics")
    if spec is None or spec.origin is None:
        raise ImportError("gymnasium-robotics is needed for the tabletop scene: pip install 'rollserve[sim]'")
    path = Path(spec.origin).parent / "envs" / "assets" / "kitchen_franka" / "franka_assets"
    if not (path / "chain.xml").is_file():
        raise FileNotFoundError(f"Panda assets not found at {path}")
    return path


def _camera_axes(eye: np.ndarray, look_at: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Right and up axes of a camera at ``eye`` looking at ``look_at`` (MuJoCo cameras look along -z)."""
    forward = (look_at - eye) / np.linalg.norm(look_at - eye)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    return right, np.cross(right, forward)


def _xyaxes(eye: np.ndarray, look_at: np.ndarray, up: np.ndarray) -> str:
    """MJCF ``xyaxes`` attribute for a look-at camera."""
    return " ".join(f"{v:.6f}" for v in np.concatenate(_camera_axes(eye, look_at, up)))


def _look_quat(eye: np.ndarray, look_at: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Orientation quaternion (w, x, y, z) of a look-at camera, for ``MjSpec``."""
    right, cam_up = _camera_axes(eye, look_at, up)
    mat = np.column_stack([right, cam_up, np.cross(right, cam_up)])
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.flatten())
    return quat


def scene_xml(assets: Path) -> str:
    """The scene as MJCF text; the Panda comes in by ``<include>`` from ``assets``."""
    h = CUBE_HALF_SIZE

    def file(name: str) -> str:  # absolute path as an XML attribute value, quotes included
        return quoteattr(str(assets / name))

    exterior = _xyaxes(EXTERIOR_EYE, np.array([0.42, 0.0, 0.12]), np.array([0.0, 0.0, 1.0]))
    return f"""
<mujoco model="rollserve_tabletop">
  <include file={file("assets.xml")}/>
  <compiler angle="radian" meshdir={file("meshes")}/>
  <option timestep="{PHYSICS_TIMESTEP}" integrator="implicitfast"/>
  <include file={file("actuator.xml")}/>
  <visual>
    <quality shadowsize="0"/>
    <global offwidth="256" offheight="256"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.5 0.5 0.5"/>
  </visual>
  <asset>
    <texture name="floor" type="2d" builtin="checker" rgb1=".25 .28 .3" rgb2=".18 .2 .22"
             width="256" height="256"/>
    <material name="floor" texture="floor" texrepeat="4 4"/>
    <material name="table" rgba=".62 .5 .38 1"/>
    <texture name="sky" type="skybox" builtin="gradient" rgb1=".55 .62 .7" rgb2=".15 .17 .2"
             width="64" height="64"/>
  </asset>
  <worldbody>
    <light pos="0.4 0 1.8" dir="0 0 -1" diffuse=".6 .6 .6" castshadow="false"/>
    <geom name="floor" type="plane" pos="0 0 {TABLE_TOP_Z - 0.75}" size="3 3 0.1" material="floor"/>
    <body name="table" pos="0.45 0 {TABLE_TOP_Z - 0.025}">
      <geom name="table_top" type="box" size="0.6 0.6 0.025" material="table" friction="0.8 0.005 0.0001"/>
    </body>
    <include file={file("chain.xml")}/>
    <body name="cube" pos="0.5 0.1 {TABLE_TOP_Z + h}">
      <freejoint name="cube"/>
      <geom name="cube" type="box" size="{h} {h} {h}" mass="0.05" rgba=".85 .2 .15 1"
            friction="1.0 0.01 0.001" condim="4"/>
    </body>
    <body name="target" mocap="true" pos="0.5 -0.1 {TABLE_TOP_Z}">
      <geom name="target" type="cylinder" size="0.04 0.0015" contype="0" conaffinity="0"
            rgba=".15 .75 .3 .8"/>
    </body>
    <camera name="exterior" pos="{" ".join(map(str, EXTERIOR_EYE))}" xyaxes="{exterior}" fovy="50"/>
  </worldbody>
  <contact>
    <exclude body1="panda0_link0" body2="table"/>
    <exclude body1="panda0_link1" body2="table"/>
  </contact>
</mujoco>
"""


def build_spec() -> mujoco.MjSpec:
    """The scene as an editable spec, with the arm gravity-compensated and the wrist camera added."""
    spec = mujoco.MjSpec.from_string(scene_xml(franka_assets_dir()))
    for body in spec.bodies:
        if body.name.startswith("panda0_"):
            body.gravcomp = 1.0
    hand = spec.body("panda0_link7")
    # Beside the hand, on its narrow side (across the finger travel), looking past the fingertips.
    side = np.array([np.sqrt(0.5), -np.sqrt(0.5), 0.0])
    eye = 0.08 * side + np.array([0.0, 0.0, 0.1])
    look_at = np.array([0.0, 0.0, 0.26])
    hand.add_camera(name="wrist", pos=eye, quat=_look_quat(eye, look_at, side), fovy=80.0)
    spec.site(EE_SITE).group = 4  # a marker for code, not for cameras
    return spec


@functools.cache
def _compiled() -> mujoco.MjModel:
    return build_spec().compile()


def build_model() -> mujoco.MjModel:
    """A fresh compiled model (a copy of a per-process cached one: compiling reads the meshes)."""
    return copy.copy(_compiled())


@dataclass(frozen=True)
class SceneIndex:
    """Addresses into ``MjData`` that the env and the expert read every step."""

    arm_qpos: np.ndarray
    arm_dof: np.ndarray
    finger_qpos: np.ndarray
    cube_qpos: int
    cube_dof: int
    cube_body: int
    target_mocap: int
    ee_site: int
    arm_actuators: np.ndarray
    finger_actuators: np.ndarray

    @classmethod
    def of(cls, model: mujoco.MjModel) -> SceneIndex:
        arm = [model.joint(name) for name in ARM_JOINTS]
        fingers = [model.joint(name) for name in FINGER_JOINTS]
        cube = model.joint("cube")
        return cls(
            arm_qpos=np.array([int(j.qposadr[0]) for j in arm]),
            arm_dof=np.array([int(j.dofadr[0]) for j in arm]),
            finger_qpos=np.array([int(j.qposadr[0]) for j in fingers]),
            cube_qpos=int(cube.qposadr[0]),
            cube_dof=int(cube.dofadr[0]),
            cube_body=model.body("cube").id,
            target_mocap=int(model.body("target").mocapid[0]),
            ee_site=model.site(EE_SITE).id,
            arm_actuators=np.array([model.actuator(f"panda0_joint{i}").id for i in range(1, 8)]),
            finger_actuators=np.array(
                [model.actuator("r_gripper_finger_joint").id, model.actuator("l_gripper_finger_joint").id]
            ),
        )
