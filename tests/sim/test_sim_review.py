"""The tabletop task's rules, pinned from docs/sim.md with numbers computed here, not read back.

Written for the mutation review of ``rollserve.sim``: the success and reward rules at their edges,
the start layout's ranges, the gripper convention of the state, what one step applies and what a
snapshot restores and how it is laid out as bytes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import pytest

from rollserve.sim.env import TabletopPickPlaceEnv, gripper_opening_to_command
from rollserve.sim.expert import Phase, ScriptedExpert, _near
from rollserve.sim.kinematics import ArmKinematics
from rollserve.sim.scene import SceneIndex, build_model, build_spec, franka_assets_dir
from rollserve.sim.snapshot import EnvSnapshot
from rollserve.sim.task import TaskConfig

if TYPE_CHECKING:
    import mujoco

REST_Z = 0.025
"""docs/sim.md: a 5 cm cube on a table top at z = 0 rests with its centre 2.5 cm up."""


def test_success_is_within_four_centimetres_and_resting() -> None:
    """docs/sim.md: centre within 4 cm (xy) of the target and at most 1 cm above resting height."""
    task = TaskConfig()
    target = np.array([0.5, -0.1])
    assert task.is_success(np.array([0.5 + 0.0399, -0.1, REST_Z]), target)
    assert not task.is_success(np.array([0.5 + 0.0401, -0.1, REST_Z]), target)
    # 3 cm and 3 cm: 4.24 cm away although each axis alone is within 4 cm
    assert not task.is_success(np.array([0.53, -0.07, REST_Z]), target)
    assert task.is_success(np.array([0.52, -0.08, REST_Z]), target)  # 2.83 cm
    assert task.is_success(np.array([0.5, -0.1, REST_Z + 0.0099]), target)
    assert not task.is_success(np.array([0.5, -0.1, REST_Z + 0.0101]), target)
    assert task.is_success(np.array([0.5, -0.1, REST_Z - 0.002]), target)  # pressed into the table a hair


def test_reward_is_minus_the_xy_distance_plus_ten_on_success() -> None:
    task = TaskConfig()
    cube, target = np.array([0.53, -0.06, 0.3]), np.array([0.5, -0.1])
    assert task.reward(cube, target, False) == pytest.approx(-0.05)  # a 3-4-5 triangle, z ignored
    assert task.reward(cube, target, True) == pytest.approx(10.0 - 0.05)


def test_gripper_state_is_zero_open_one_closed() -> None:
    """docs/sim.md: the state's gripper has the action's convention, 0 open and 1 closed; each finger
    slides 4 cm when open."""
    assert gripper_opening_to_command(np.array([0.04, 0.04])) == 0.0
    assert gripper_opening_to_command(np.array([0.0, 0.0])) == 1.0
    assert gripper_opening_to_command(np.array([0.02, 0.02])) == pytest.approx(0.5)
    assert gripper_opening_to_command(np.array([0.01, 0.03])) == pytest.approx(0.5)  # the mean opening
    assert gripper_opening_to_command(np.array([0.03, 0.03])) == pytest.approx(0.25)
    assert gripper_opening_to_command(np.array([0.05, 0.05])) == 0.0  # clipped into [0, 1]
    assert gripper_opening_to_command(np.array([-0.01, -0.01])) == 1.0


def test_snapshot_bytes_are_magic_length_json_and_little_endian_doubles() -> None:
    env = TabletopPickPlaceEnv()
    env.reset(seed=3)
    snapshot = env.get_snapshot()
    blob = snapshot.to_bytes()
    assert blob[:8] == b"RSSNAP1\0"
    (length,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12 : 12 + length])
    assert header == {"step_count": 0, "rng_state": env.np_random.bit_generator.state}
    physics = np.frombuffer(blob[12 + length :], dtype="<f8")
    np.testing.assert_array_equal(physics, snapshot.physics)


# -- the task's edges -----------------------------------------------------------------------------


def test_success_edges_are_strict() -> None:
    """Exactly 4 cm away, or exactly 1 cm above resting height, is not yet success."""
    task = TaskConfig()
    assert not task.is_success(np.array([0.04, 0.0, REST_Z]), np.array([0.0, 0.0]))  # norm is 0.04 exactly
    assert not task.is_success(np.array([0.0, 0.0, REST_Z + 0.01]), np.array([0.0, 0.0]))


def test_the_target_may_be_given_with_its_height() -> None:
    """The rules read the target's xy only: an xyz target (a mocap position) gives the same answers."""
    task = TaskConfig()
    cube = np.array([0.53, -0.06, REST_Z])
    assert task.reward(cube, np.array([0.5, -0.1, 0.0]), False) == pytest.approx(-0.05)
    assert task.is_success(np.array([0.51, -0.1, REST_Z]), np.array([0.5, -0.1, 0.0]))


# -- the env ---------------------------------------------------------------------------------------

HOME = np.array([0.0, -0.4181, 0.0, -2.5794, 0.0, 0.5913, 0.0])
"""The arm's start pose (``env.HOME_QPOS``, gripper 30 cm above the table at x = 0.4 m)."""
ARM_JOINTS = tuple(f"robot:panda0_joint{i}" for i in range(1, 8))


def _hold(obs: dict[str, np.ndarray], gripper: float = 0.0) -> np.ndarray:
    return np.append(obs["state"][:7], gripper).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_a_seeded_start_is_drawn_from_gymnasiums_generator(seed: int) -> None:
    """reset(seed=s) seeds PCG64 from s (gymnasium's convention) and draws, in order, the cube's x and
    y, the target's x and y (docs/sim.md's ranges), then ±0.02 rad of jitter on each start joint."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    cube = [rng.uniform(0.45, 0.60), rng.uniform(0.05, 0.20)]
    target = [rng.uniform(0.45, 0.60), rng.uniform(-0.20, -0.05)]
    arm = HOME + rng.uniform(-0.02, 0.02, size=7)
    env = TabletopPickPlaceEnv()
    obs, info = env.reset(seed=seed)
    np.testing.assert_array_equal(obs["state"][:7], arm.astype(np.float32))
    np.testing.assert_array_equal(obs["state"][8:11], np.array([*cube, REST_Z], dtype=np.float32))
    np.testing.assert_array_equal(obs["state"][11:13], np.array(target, dtype=np.float32))
    assert obs["state"][7] == 0.0 and info["step_count"] == 0


def test_fixing_the_cube_keeps_the_seeded_target_and_arm() -> None:
    env = TabletopPickPlaceEnv()
    free, _ = env.reset(seed=4)
    fixed, _ = env.reset(seed=4, options={"cube_xy": (0.5, 0.1)})
    np.testing.assert_array_equal(fixed["state"][8:10], np.array([0.5, 0.1], dtype=np.float32))
    np.testing.assert_array_equal(fixed["state"][11:13], free["state"][11:13])
    np.testing.assert_array_equal(fixed["state"][:7], free["state"][:7])


def test_a_step_applies_the_action_for_a_tenth_of_a_second() -> None:
    """The arm's position servos get the joint targets, each finger 4 cm times (1 - gripper); a step is
    1 / CONTROL_HZ = 0.1 s of physics."""
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=0)
    action = _hold(obs, 0.3)  # float32, as a policy sends it
    env.step(action)
    index = env.index
    np.testing.assert_array_equal(env.data.ctrl[index.arm_actuators], action[:7].astype(np.float64))
    expected_finger = 0.04 * (1.0 - float(action[7]))  # in float64, from the float32 command
    assert list(env.data.ctrl[index.finger_actuators]) == [expected_finger, expected_finger]
    assert env.data.time == pytest.approx(0.1, abs=1e-9)
    env.step(action)
    assert env.data.time == pytest.approx(0.2, abs=1e-9)


def test_actions_outside_the_joint_ranges_are_clipped_to_them() -> None:
    """The action space is float32, so a clipped target is the joint's range rounded to float32."""
    env = TabletopPickPlaceEnv()
    env.reset(seed=0)
    ranges = np.array([env.model.joint(name).range for name in ARM_JOINTS]).astype(np.float32)
    env.step(np.array([-10.0] * 7 + [-1.0]))
    np.testing.assert_array_equal(env.data.ctrl[env.index.arm_actuators], ranges[:, 0])
    assert list(env.data.ctrl[env.index.finger_actuators]) == [0.04, 0.04]  # gripper -1 is 0: open
    env.step(np.array([10.0] * 7 + [2.0]))
    np.testing.assert_array_equal(env.data.ctrl[env.index.arm_actuators], ranges[:, 1])
    assert list(env.data.ctrl[env.index.finger_actuators]) == [0.0, 0.0]  # gripper 2 is 1: closed
    np.testing.assert_array_equal(env.action_space.low, np.append(ranges[:, 0], 0.0))
    np.testing.assert_array_equal(env.action_space.high, np.append(ranges[:, 1], 1.0))


def test_info_names_success_distance_and_step_count() -> None:
    env = TabletopPickPlaceEnv()
    obs, _ = env.reset(seed=0, options={"cube_xy": [0.5, 0.1], "target_xy": [0.53, 0.14]})
    _, _, _, _, info = env.step(_hold(obs))
    assert set(info) == {"success", "is_success", "cube_to_target", "step_count"}
    cube = env.data.qpos[env.index.cube_qpos : env.index.cube_qpos + 2]
    assert info["cube_to_target"] == pytest.approx(float(np.hypot(*(cube - [0.53, 0.14]))), abs=1e-12)
    assert info["cube_to_target"] == pytest.approx(0.05, abs=1e-3)  # the cube stayed put
    assert info["step_count"] == 1 and info["success"] is False and info["is_success"] is False


def test_without_terminate_on_success_a_success_goes_on() -> None:
    env = TabletopPickPlaceEnv(terminate_on_success=False)
    obs, _ = env.reset(seed=0, options={"cube_xy": [0.5, -0.1], "target_xy": [0.5, -0.1]})
    _, reward, terminated, truncated, info = env.step(_hold(obs))
    assert info["success"] and info["is_success"] and not terminated and not truncated
    assert reward == pytest.approx(10.0 - info["cube_to_target"])


def test_refusals_say_what_was_wrong() -> None:
    env = TabletopPickPlaceEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"^action must have shape \(8,\), got \(7,\)$"):
        env.step(np.zeros(7))
    with pytest.raises(ValueError, match=r"^action must be finite$"):
        env.step(np.array([0.0] * 7 + [np.inf]))
    size = env.get_snapshot().physics.size
    with pytest.raises(ValueError, match=f"^snapshot holds 3 physics values, this env needs {size}$"):
        env.set_snapshot(EnvSnapshot(physics=np.zeros(3), step_count=0, rng_state={}))
    with pytest.raises(ValueError, match=r"^render_mode must be None or 'rgb_array', not 'human'$"):
        TabletopPickPlaceEnv(render_mode="human")


def test_render_is_the_exterior_view_and_only_in_rgb_array_mode() -> None:
    env = TabletopPickPlaceEnv(image_size=(32, 40), render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.shape == (32, 40, 3) and frame.dtype == np.uint8
    views = env.render_cameras()
    assert set(views) == {"exterior", "wrist"}
    np.testing.assert_array_equal(frame, views["exterior"])
    assert not np.array_equal(views["exterior"], views["wrist"])  # two cameras, two views
    env.close()
    assert TabletopPickPlaceEnv().render() is None


def test_an_env_renders_again_after_close_and_closes_twice() -> None:
    env = TabletopPickPlaceEnv(image_size=(16, 16))
    env.reset(seed=0)
    first = env.render_cameras()
    env.close()
    env.close()
    again = env.render_cameras()
    np.testing.assert_array_equal(again["wrist"], first["wrist"])
    env.close()


def test_rendering_needs_no_gl_setting_once_mujoco_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an EGL context is unbound after a render; without ``MUJOCO_GL`` there is nothing to do."""
    env = TabletopPickPlaceEnv(image_size=(16, 16))
    env.reset(seed=0)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    assert env.render_cameras()["exterior"].shape == (16, 16, 3)
    env.close()


def test_a_snapshot_moves_the_layout_into_another_env() -> None:
    """The target is a mocap body: restoring a snapshot brings its target along, and the time."""
    source, other = TabletopPickPlaceEnv(), TabletopPickPlaceEnv()
    obs, _ = source.reset(seed=1, options={"cube_xy": [0.58, 0.18], "target_xy": [0.46, -0.19]})
    source.step(_hold(obs, 1.0))
    other.reset(seed=2)
    other.set_snapshot(source.get_snapshot())
    np.testing.assert_array_equal(other.target_xy, [0.46, -0.19])
    np.testing.assert_array_equal(other.state_vector(), source.state_vector())
    assert other.data.time == source.data.time and other.step_count == 1
    np.testing.assert_array_equal(other.data.ctrl, source.data.ctrl)


# -- snapshot bytes --------------------------------------------------------------------------------


def test_a_float32_snapshot_travels_as_doubles() -> None:
    snapshot = EnvSnapshot(physics=np.array([0.1, -2.5, 3.0], dtype=np.float32), step_count=2, rng_state={})
    back = EnvSnapshot.from_bytes(snapshot.to_bytes())
    assert back.physics.dtype == np.float64
    np.testing.assert_array_equal(
        back.physics, np.array([0.1, -2.5, 3.0], dtype=np.float32).astype(np.float64)
    )
    assert len(snapshot.to_bytes()) == 8 + 4 + len(b'{"step_count": 2, "rng_state": {}}') + 3 * 8


def test_a_foreign_blob_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^not a rollserve tabletop snapshot$"):
        EnvSnapshot.from_bytes(b"RSSNAP2\0" + bytes(16))


# -- the scene -------------------------------------------------------------------------------------
# build_model() copies a model compiled once per process, so these compile their own from the spec.


def _fresh() -> tuple[mujoco.MjModel, mujoco.MjData]:
    import mujoco  # here, not at the top: rollserve.sim picks the GL backend before mujoco loads

    model = build_spec().compile()
    data = mujoco.MjData(model)
    data.qpos[[model.joint(name).qposadr[0] for name in ARM_JOINTS]] = HOME
    mujoco.mj_forward(model, data)
    return model, data


def test_the_panda_comes_from_the_installed_gymnasium_robotics() -> None:
    """docs/sim.md: envs/assets/kitchen_franka/franka_assets of the installed package."""
    import gymnasium_robotics

    path = franka_assets_dir()
    assert path == Path(gymnasium_robotics.__file__).parent / "envs/assets/kitchen_franka/franka_assets"
    assert (path / "chain.xml").is_file()


def test_missing_panda_assets_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec

    def absent(name: str, *args: object) -> object:
        return None if name == "gymnasium_robotics" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", absent)
    message = "gymnasium-robotics is needed for the tabletop scene: pip install 'rollserve[sim]'"
    with pytest.raises(ImportError, match=f"^{re.escape(message)}$"):
        franka_assets_dir()

    fake = SimpleNamespace(origin=str(tmp_path / "gymnasium_robotics" / "__init__.py"))

    def elsewhere(name: str, *args: object) -> object:
        return fake if name == "gymnasium_robotics" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", elsewhere)
    expected = tmp_path / "gymnasium_robotics" / "envs" / "assets" / "kitchen_franka" / "franka_assets"
    with pytest.raises(FileNotFoundError, match=f"^Panda assets not found at {re.escape(str(expected))}$"):
        franka_assets_dir()


def test_the_table_top_is_the_world_z_zero_and_the_cube_rests_on_it() -> None:
    model, data = _fresh()
    top = model.geom("table_top")
    assert data.geom_xpos[top.id][2] + top.size[2] == pytest.approx(0.0, abs=1e-12)
    assert data.geom_xpos[top.id][2] - top.size[2] == pytest.approx(-0.05)  # a 5 cm slab under it
    assert data.geom_xpos[model.geom("floor").id][2] == pytest.approx(-0.75)  # a table's height down
    cube = model.joint("cube").qposadr[0]
    assert model.qpos0[cube + 2] == pytest.approx(REST_Z)
    assert model.geom("cube").size == pytest.approx([REST_Z] * 3)  # 5 cm cube


def test_the_arm_alone_is_gravity_compensated() -> None:
    model, _ = _fresh()
    compensated = {model.body(i).name for i in range(model.nbody) if model.body_gravcomp[i] == 1.0}
    assert {f"panda0_link{i}" for i in range(8)} <= compensated
    assert {"panda0_leftfinger", "panda0_rightfinger"} <= compensated
    assert all(model.body_gravcomp[i] in (0.0, 1.0) for i in range(model.nbody))
    assert model.body_gravcomp[model.body("cube").id] == 0.0


def _in_view(model: mujoco.MjModel, data: mujoco.MjData, camera: str, point: np.ndarray) -> float:
    """How far off the optical axis ``point`` is, as a fraction of half the field of view (< 1: seen)."""
    cam = model.camera(camera).id
    axes = data.cam_xmat[cam].reshape(3, 3)  # columns: right, up, backwards (MuJoCo looks along -z)
    offset = point - data.cam_xpos[cam]
    depth = -offset @ axes[:, 2]
    if depth <= 0:
        return np.inf
    half = np.tan(np.radians(model.cam_fovy[cam]) / 2)
    return max(abs(offset @ axes[:, 0]), abs(offset @ axes[:, 1])) / depth / half


def test_the_exterior_camera_sees_the_arm_cube_and_target_upright() -> None:
    """docs/sim.md: front-left of the robot, seeing the arm, the cube and the target."""
    model, data = _fresh()
    cam = model.camera("exterior").id
    np.testing.assert_allclose(data.cam_xpos[cam], [1.05, 0.6, 0.6])
    assert model.cam_fovy[cam] == 50.0
    corners = [np.array([x, y, REST_Z]) for x in (0.45, 0.6) for y in (0.2, 0.05, -0.05, -0.2)]
    for point in [*corners, np.array([0.0, 0.0, 0.333]), np.array([0.4, 0.0, 0.3])]:
        assert _in_view(model, data, "exterior", point) < 0.7, point
    right = data.cam_xmat[cam].reshape(3, 3)[:, 0]
    assert right[2] == pytest.approx(0.0, abs=1e-6)  # the horizon is level in the image
    # the middle of the two start areas is near the image centre
    assert _in_view(model, data, "exterior", np.array([0.525, 0.0, REST_Z])) < 0.3


def test_the_wrist_camera_rides_the_hand_and_looks_past_the_fingertips() -> None:
    """Beside the hand, 8 cm off its axis diagonally between the hand's x and -y, 10 cm along it,
    looking at the hand's axis 5 cm past the point between the finger pads (site 21 cm along it)."""
    import mujoco

    model, data = _fresh()
    cam = model.camera("wrist").id
    hand = model.body("panda0_link7").id
    assert model.cam_bodyid[cam] == hand and model.cam_fovy[cam] == 80.0
    side = np.array([1.0, -1.0, 0.0]) / np.sqrt(2)
    np.testing.assert_allclose(model.cam_pos[cam], 0.08 * side + [0.0, 0.0, 0.1], atol=1e-9)
    rotation = np.zeros(9)
    mujoco.mju_quat2Mat(rotation, model.cam_quat[cam])
    rotation = rotation.reshape(3, 3)
    look = np.array([0.0, 0.0, 0.26]) - model.cam_pos[cam]
    np.testing.assert_allclose(-rotation[:, 2], look / np.linalg.norm(look), atol=1e-6)
    assert rotation[:, 1] @ side > 0 and rotation[:, 0] @ side == pytest.approx(0.0, abs=1e-6)
    site = model.site("end_effector").id
    assert model.site_bodyid[site] == hand
    np.testing.assert_allclose(model.site_pos[site], [0.0, 0.0, 0.21])
    assert _in_view(model, data, "wrist", data.site_xpos[site]) < 0.5  # the fingertips are in the image


def test_the_end_effector_site_is_not_drawn() -> None:
    import mujoco

    model, _ = _fresh()
    group = model.site_group[model.site("end_effector").id]
    assert group == 4 and mujoco.MjvOption().sitegroup[group] == 0  # hidden from every camera


def test_the_scene_index_points_at_the_cube() -> None:
    model, _ = _fresh()
    index = SceneIndex.of(model)
    assert model.jnt_dofadr[model.joint("cube").id] == index.cube_dof
    assert model.body("cube").id == index.cube_body
    assert model.body_dofadr[index.cube_body] == index.cube_dof and model.body_dofnum[index.cube_body] == 6


# -- the kinematics --------------------------------------------------------------------------------


def test_one_ik_call_closes_a_five_centimetre_gap() -> None:
    """A few damped Newton steps per call (docs/sim.md): from 5 cm off, one call lands within 1 mm."""
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    start, _ = kin.forward(HOME)
    for offset in ([0.05, 0.0, 0.0], [0.0, 0.05, -0.05 / np.sqrt(2)]):
        goal = start + np.array(offset)
        reached, _ = kin.forward(kin.solve(HOME, goal))
        assert np.linalg.norm(reached - goal) < 1e-3


def test_an_ik_step_moves_no_joint_more_than_its_limit() -> None:
    """Each iteration's joint step is scaled down to at most ``max_joint_step`` (0.2 rad by default)."""
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    far = kin.solve(HOME, np.array([0.9, 0.0, -0.3]), iterations=1)
    assert np.max(np.abs(far - HOME)) == pytest.approx(0.2, abs=1e-12)  # a far goal: a full step
    near = kin.solve(HOME, kin.forward(HOME)[0] + [0.0, 0.0, 0.002], iterations=1)
    assert 0 < np.max(np.abs(near - HOME)) < 0.05  # a near one: the step it needs


def test_ik_never_leaves_the_joint_ranges() -> None:
    model = build_model()
    ranges = np.array([model.joint(name).range for name in ARM_JOINTS])
    kin = ArmKinematics(model, rest_posture=HOME)
    at_bounds = []
    for goal in ([0.0, 0.0, 0.0], [0.9, 0.0, -0.3]):  # out of reach: the joints run into their stops
        q = HOME.copy()
        for _ in range(30):
            q = kin.solve(q, np.array(goal))
            assert np.all(q >= ranges[:, 0]) and np.all(q <= ranges[:, 1])
        at_bounds.append((np.sum(q == ranges[:, 0]), np.sum(q == ranges[:, 1])))
    assert at_bounds[0][0] > 0 and at_bounds[1][1] > 0  # both ends of the ranges were reached


# -- the expert ------------------------------------------------------------------------------------


def _expert_episode(seed: int, steps: int = 90) -> list[dict]:
    """An expert episode that goes on after success; per act: phase before and after, the action,
    the end effector (forward kinematics of the measured joints) and the cube before the act."""
    env, expert = TabletopPickPlaceEnv(terminate_on_success=False), ScriptedExpert()
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    obs, _ = env.reset(seed=seed)
    expert.reset(obs)
    rows = []
    for _ in range(steps):
        before = expert.phase
        action = expert.act(obs)
        state = obs["state"].astype(np.float64)
        ee, _ = kin.forward(state[:7])
        rows.append(
            {"before": before, "after": expert.phase, "action": action, "ee": ee, "cube": state[8:11]}
        )
        obs, *_ = env.step(action)
    rows.append({"cube": obs["state"][8:11].astype(np.float64), "target": obs["state"][11:13]})
    return rows


def test_a_new_expert_is_approaching() -> None:
    assert ScriptedExpert().phase is Phase.APPROACH


def test_the_expert_goes_through_its_phases_once_in_order() -> None:
    rows = _expert_episode(11)[:-1]
    order = [rows[0]["before"]]
    for row in rows:
        if row["after"] is not order[-1]:
            order.append(row["after"])
    assert order == list(Phase)
    assert sum(row["before"] is Phase.GRASP for row in rows) == 6  # GRASP_STEPS of holding still


def test_the_expert_gripper_command_ramps_within_zero_and_one() -> None:
    """docs/sim.md: the gripper ramps by at most 0.25 per step; it is open until the grasp, closed
    while carrying, and open again at the end."""
    rows = _expert_episode(11)[:-1]
    grippers = np.array([row["action"][7] for row in rows])
    assert all(row["action"].dtype == np.float32 and row["action"].shape == (8,) for row in rows)
    assert np.all(grippers >= 0.0) and np.all(grippers <= 1.0)
    assert np.all(np.abs(np.diff(grippers)) <= 0.25 + 1e-7)
    opening = [row["action"][7] for row in rows if row["before"] in (Phase.APPROACH, Phase.DESCEND)]
    assert opening and max(opening) == 0.0
    carrying = [row["action"][7] for row in rows if row["before"] in (Phase.LIFT, Phase.CARRY, Phase.LOWER)]
    assert carrying and min(carrying) == 1.0
    assert grippers[-1] == 0.0


def test_the_expert_commands_a_speed_and_acceleration_limited_path() -> None:
    """docs/sim.md: the waypoint moves at most 0.3 m/s and 1.5 m/s^2; the joint targets follow it
    (IK is not exact, so 1 mm of slack per step)."""
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    rows = _expert_episode(11)[:-1]
    commanded = np.array([kin.forward(row["action"][:7].astype(np.float64))[0] for row in rows])
    steps = np.linalg.norm(np.diff(commanded, axis=0), axis=1)
    assert steps.max() <= 0.3 * 0.1 + 1e-3
    assert np.linalg.norm(np.diff(commanded, 2, axis=0), axis=1).max() <= 1.5 * 0.1 * 0.1 + 2e-3
    assert steps.max() > 0.02  # it does travel near full speed somewhere


def test_the_expert_grasps_low_lifts_straight_up_and_carries_high() -> None:
    rows = _expert_episode(11)
    end = rows.pop()
    grasp = next(row for row in rows if row["after"] is Phase.GRASP)
    assert np.linalg.norm(grasp["ee"] - (grasp["cube"] + [0.0, 0.0, 0.035])) < 0.008  # GRASP_HEIGHT
    lift = [row["ee"][:2] for row in rows if row["before"] is Phase.LIFT]
    assert lift and np.max(np.linalg.norm(np.array(lift) - lift[0], axis=1)) < 0.005
    start_xy, target_xy = rows[0]["cube"][:2], end["target"]
    for row in rows:
        cube = row["cube"]
        if min(np.linalg.norm(cube[:2] - start_xy), np.linalg.norm(cube[:2] - target_xy)) > 0.02:
            assert cube[2] > REST_Z + 0.05, row  # moved sideways only once lifted
    released = next(row for row in rows if row["after"] is Phase.RELEASE)
    assert released["cube"][2] < REST_Z + 0.008  # let go only once the cube is down
    assert np.linalg.norm(end["cube"][:2] - target_xy) < 0.01


def test_the_expert_lets_go_before_it_backs_off_eight_centimetres() -> None:
    rows = _expert_episode(11)[:-1]
    release = [row for row in rows if row["before"] is Phase.RELEASE]
    let_go = release[0]["ee"]
    opened = next(row for row in release if row["action"][7] < 0.2)
    assert opened["ee"][2] <= let_go[2] + 0.002  # no lifting while the fingers are still closed
    grasp_end = [row for row in rows if row["before"] is Phase.GRASP][-1]
    put_down = REST_Z + (grasp_end["ee"][2] - grasp_end["cube"][2]) + 0.005  # 5 mm above the grasp height
    final = release[-1]["ee"]
    assert final[2] == pytest.approx(put_down + 0.08, abs=0.005)
    assert np.linalg.norm(final[:2] - let_go[:2]) < 0.01  # straight up


def test_the_expert_starts_over_when_the_cube_is_lost() -> None:
    """docs/sim.md: if the cube is dropped, the expert starts over (approach, gripper opening)."""
    env, expert = TabletopPickPlaceEnv(terminate_on_success=False), ScriptedExpert()
    obs, _ = env.reset(seed=11)
    expert.reset(obs)
    while expert.phase is not Phase.CARRY:
        obs, *_ = env.step(expert.act(obs))
    gripper = expert.act(obs)[7]
    assert expert.phase is Phase.CARRY and gripper == 1.0
    dropped = {"state": obs["state"].copy()}
    dropped["state"][8:11] = [0.6, 0.2, REST_Z]  # back on the table, 17 cm from the hand
    action = expert.act(dropped)
    assert expert.phase is Phase.APPROACH and action[7] == 0.75


# -- second round: what the first recheck left ------------------------------------------------------


def test_a_new_env_already_holds_the_scenes_layout() -> None:
    """Before any reset the env is at the scene's own layout (cube at (0.5, 0.1), target at (0.5, -0.1),
    arm home, fingers open, step 0), so a snapshot of it is a valid start."""
    env = TabletopPickPlaceEnv()
    assert env.step_count == 0
    expected = np.array([*HOME, 0.0, 0.5, 0.1, REST_Z, 0.5, -0.1], dtype=np.float32)
    np.testing.assert_array_equal(env.state_vector(), expected)
    snapshot = env.get_snapshot()
    assert snapshot.step_count == 0 and np.all(np.isfinite(snapshot.physics))


def test_a_reset_holds_the_start_pose_with_an_upright_cube_and_the_target_on_the_table() -> None:
    """The servos' targets are the start pose (nothing moves until a policy acts), the cube is not
    rotated (docs/sim.md: its yaw is not randomised), the target disc lies on the table top."""
    env = TabletopPickPlaceEnv()
    env.reset(seed=5)
    index = env.index
    np.testing.assert_array_equal(env.data.ctrl[index.arm_actuators], env.data.qpos[index.arm_qpos])
    assert list(env.data.ctrl[index.finger_actuators]) == [0.04, 0.04]
    adr = index.cube_qpos
    assert list(env.data.qpos[adr + 3 : adr + 7]) == [1.0, 0.0, 0.0, 0.0]
    assert env.data.mocap_pos[index.target_mocap][2] == 0.0
    assert np.all(np.isfinite(env.get_snapshot().physics))


def test_image_observations_are_uint8_in_0_255() -> None:
    env = TabletopPickPlaceEnv(render_images=True, image_size=(20, 24))
    state = env.observation_space["state"]
    assert state.dtype == np.float32 and state.shape == (13,)
    for name in ("exterior", "wrist"):
        space = env.observation_space["images"][name]
        assert space.dtype == np.uint8 and space.shape == (20, 24, 3)
        assert np.all(space.low == 0) and np.all(space.high == 255)
    env.close()


def test_an_action_of_any_real_numbers_is_taken_as_doubles() -> None:
    """``step`` converts the action to float64 first: exact fractions act as the floats they round to."""
    from fractions import Fraction

    exact, rounded = TabletopPickPlaceEnv(), TabletopPickPlaceEnv()
    obs, _ = exact.reset(seed=0)
    rounded.reset(seed=0)
    action = [Fraction(float(v)).limit_denominator(1000) for v in obs["state"][:7]] + [Fraction(1, 3)]
    first = exact.step(action)
    second = rounded.step(np.array([float(v) for v in action]))
    np.testing.assert_array_equal(first[0]["state"], second[0]["state"])
    assert first[1:] == second[1:]


def test_near_means_strictly_within_the_tolerance() -> None:
    assert not _near(np.array([3.0, 4.0]), np.zeros(2), 5.0)
    assert _near(np.array([3.0, 4.0]), np.zeros(2), 5.0 + 1e-9)


def test_the_expert_descends_once_hand_and_command_are_over_the_cube() -> None:
    """APPROACH ends when the measured hand is within 1.5 cm of the hover point, 10 cm above the cube,
    and the commanded point (what the last action's joints reach) within 5 mm of it."""
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    rows = _expert_episode(11, steps=30)[:-1]
    at = next(
        i for i, row in enumerate(rows) if row["before"] is Phase.APPROACH and row["after"] is Phase.DESCEND
    )
    hover = rows[at]["cube"] + [0.0, 0.0, 0.10]
    assert np.linalg.norm(rows[at]["ee"] - hover) < 0.015
    commanded, _ = kin.forward(rows[at - 1]["action"][:7].astype(np.float64))
    assert np.linalg.norm(commanded - hover) < 0.005


def test_the_expert_waits_for_a_hand_that_does_not_come() -> None:
    """With the arm stuck at its start (the same observation again and again) the command reaches the
    hover point but the hand does not: the expert keeps approaching, gripper open."""
    env, expert = TabletopPickPlaceEnv(), ScriptedExpert()
    obs, _ = env.reset(seed=11)
    expert.reset(obs)
    actions = [expert.act(obs) for _ in range(60)]  # 6 s: the command arrives within about 1.5 s
    assert expert.phase is Phase.APPROACH
    assert all(action[7] == 0.0 for action in actions)


def test_one_ik_call_is_four_limited_steps() -> None:
    """``solve`` runs 4 iterations by default: toward a far goal one joint moves 4 x 0.2 rad."""
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    q = kin.solve(HOME, np.array([0.9, 0.0, -0.3]))
    assert np.max(np.abs(q - HOME)) == pytest.approx(0.8, abs=1e-9)


def test_ik_answers_float64_joints_even_without_iterating() -> None:
    kin = ArmKinematics(build_model(), rest_posture=HOME)
    start = HOME.astype(np.float32)
    q = kin.solve(start, np.array([0.5, 0.0, 0.2]), iterations=0)
    assert q.dtype == np.float64 and q is not start
    np.testing.assert_array_equal(q, start.astype(np.float64))


def test_the_expert_puts_the_cube_not_its_hand_on_the_target() -> None:
    """The carry goal makes up for where the cube sits in the hand: told at the end of the grasp that
    the cube sits 2 cm further along x than it does (and so on after), the expert puts the cube it
    believes in down on the target, with its hand 2 cm short."""
    shift = np.array([0.02, 0.0, 0.0])
    env, expert = TabletopPickPlaceEnv(terminate_on_success=False), ScriptedExpert()
    obs, _ = env.reset(seed=11)
    expert.reset(obs)
    grasp_acts, told = 0, False
    for _ in range(90):
        grasp_acts += expert.phase is Phase.GRASP
        told = told or grasp_acts == 6  # from the act that measures the grasp offset on
        seen = {"state": obs["state"].copy()}
        if told:
            seen["state"][8:11] += shift
        action = expert.act(seen)
        if expert.phase is Phase.RELEASE:
            break
        obs, *_ = env.step(action)
    assert told and expert.phase is Phase.RELEASE
    believed = obs["state"][8:10] + shift[:2]
    assert np.linalg.norm(believed - obs["state"][11:13]) < 0.01
