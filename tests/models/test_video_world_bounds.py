"""What ``WorldSpec`` publishes on ``/v1/models`` and checks a start state against, when a world's
observation is not its state vector (the video world's latent) and when it is (every other world).

The video world clamps its latent to +-50 and its state to +-4 and publishes exactly those bounds;
the other worlds' entries stay byte-for-byte what they were before the state got bounds of its own
(pinned below as written before that change)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from rollserve.models.world import WorldSpec
from rollserve.models.worlds import load_world

LATENT_BOUND = 50.0  # the documented clamps, written down here (not read from the module)
STATE_BOUND = 4.0

# Values written down as the entries had them before the change (shared by the pins below).
TASK_NAMES = ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "joint_7", "gripper"]
TASK_NAMES += ["cube_x", "cube_y", "cube_z", "target_x", "target_y"]
TASK_LOW, TASK_HIGH = [-4.0] * 13, [4.0] * 13
FRANKA_LOW = [-2.8973000049591064, -1.7627999782562256, -2.8973000049591064, -3.0717999935150146]
FRANKA_LOW += [-2.8973000049591064, -1.6572999954223633, -2.8973000049591064, 0.0]
FRANKA_HIGH = [2.8973000049591064, 1.7627999782562256, 2.8973000049591064, -0.4000000059604645]
FRANKA_HIGH += [2.8973000049591064, 2.1126999855041504, 2.8973000049591064, 1.0]

PINNED: dict[str, dict[str, Any]] = {
    "sim": {
        "cameras": ["exterior", "wrist"],
        "frame_size": None,
        "state": {
            "names": TASK_NAMES,
            "shape": [13],
            "dtype": "float32",
            "field": "next_observation.state",
            "low": TASK_LOW,
            "high": TASK_HIGH,
        },
        "id": "sim",
        "object": "model",
        "owned_by": "rollserve",
        "kind": "world",
        "description": "MuJoCo tabletop pick-and-place (Franka Panda), exact physics",
        "fps": 10.0,
        "max_episode_steps": 120,
        "acts": False,
        "observation": {
            "names": TASK_NAMES,
            "shape": [13],
            "dtype": "float32",
            "field": "next_observation.video_latent",
            "low": TASK_LOW,
            "high": TASK_HIGH,
        },
        "action": {
            "names": ["joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "joint_7", "gripper"],
            "shape": [8],
            "dtype": "float32",
            "fields": {"joint_positions": 7, "gripper_position": 1},
            "low": FRANKA_LOW,
            "high": FRANKA_HIGH,
        },
    },
    "toy": {
        "id": "toy",
        "object": "model",
        "owned_by": "rollserve",
        "kind": "world",
        "description": "toy reaching world (tests and benchmarks)",
        "fps": 15.0,
        "max_episode_steps": 50,
        "acts": False,
        "observation": {
            "names": [
                "joint_0",
                "joint_1",
                "joint_2",
                "joint_3",
                "joint_4",
                "joint_5",
                "joint_6",
                "gripper",
                "target_0",
                "target_1",
                "target_2",
                "target_3",
                "target_4",
                "target_5",
                "target_6",
            ],
            "shape": [15],
            "dtype": "float32",
            "field": "next_observation.video_latent",
            "low": [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
            "high": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        },
        "action": {
            "names": ["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "gripper"],
            "shape": [8],
            "dtype": "float32",
            "fields": {"joint_positions": 7, "gripper_position": 1},
            "low": [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 0.0],
            "high": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        },
    },
    "learned": {
        "id": "learned",
        "object": "model",
        "owned_by": "rollserve",
        "kind": "world",
        "description": "learned world model of the tabletop task (5-member MLP ensemble)",
        "fps": 10.0,
        "max_episode_steps": 120,
        "acts": False,
        "observation": {
            "names": TASK_NAMES,
            "shape": [13],
            "dtype": "float32",
            "field": "next_observation.video_latent",
            "low": TASK_LOW,
            "high": TASK_HIGH,
        },
        "action": {
            "names": ["joint_0", "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "gripper"],
            "shape": [8],
            "dtype": "float32",
            "fields": {"joint_positions": 7, "gripper_position": 1},
            "low": FRANKA_LOW,
            "high": FRANKA_HIGH,
        },
    },
}


@pytest.fixture(scope="module")
def video() -> Any:
    world = load_world("video")
    yield world
    world.close()


@pytest.mark.parametrize("name", list(PINNED))
def test_other_worlds_publish_exactly_what_they_did(name: str) -> None:
    world = load_world(name)
    try:
        assert json.dumps(world.spec.describe()) == json.dumps(PINNED[name])
    finally:
        world.close()


def test_video_publishes_latent_and_state_bounds(video: Any) -> None:
    entry = video.spec.describe()
    shape = tuple(entry["observation"]["shape"])
    assert shape == (1, 16, 8, 8)
    assert np.asarray(entry["observation"]["low"]).shape == shape
    assert (np.asarray(entry["observation"]["low"]) == -LATENT_BOUND).all()
    assert (np.asarray(entry["observation"]["high"]) == LATENT_BOUND).all()
    assert entry["state"]["low"] == [-STATE_BOUND] * 13
    assert entry["state"]["high"] == [STATE_BOUND] * 13


def test_video_clamps_to_exactly_the_published_bounds(video: Any) -> None:
    """Predictions far outside the data land on the published bounds, not inside or past them."""
    entry = video.spec.describe()
    n = 4
    latents = np.zeros((n, 16, 8, 8), dtype=np.float32)
    latents[:2], latents[2:] = 1e6, -1e6
    vectors = np.zeros((n, 13), dtype=np.float32)
    vectors[::2], vectors[1::2] = 1e6, -1e6
    actions = np.zeros((n, 8), dtype=np.float32)
    z, s, _ = video.predict(latents, vectors, actions)
    low, high = np.asarray(entry["observation"]["low"])[0], np.asarray(entry["observation"]["high"])[0]
    assert ((z >= low) & (z <= high)).all()
    assert z.max() == LATENT_BOUND and z.min() == -LATENT_BOUND
    assert ((s >= entry["state"]["low"]) & (s <= entry["state"]["high"])).all()
    assert s.max() == STATE_BOUND and s.min() == -STATE_BOUND


def _latent_spec(**bounds: Any) -> WorldSpec:
    """A world like the video world: a (1, 2, 2) latent observation and a 3-value state vector."""
    return WorldSpec(
        name="latent",
        observation_names=("z0", "z1", "z2", "z3"),
        state_names=("a", "b", "c"),
        cameras=("front",),
        observation_shape=(1, 2, 2),
        **bounds,
    )


def test_a_latent_world_checks_a_start_state_against_the_state_bounds() -> None:
    spec = _latent_spec(
        observation_low=(-50.0,) * 4,
        observation_high=(50.0,) * 4,
        state_low=(-1.0, -2.0, -3.0),
        state_high=(1.0, 2.0, 3.0),
    )
    spec.check_start_state(np.float32([-1.0, 2.0, 0.0]))  # inclusive
    with pytest.raises(
        ValueError, match=r"^start state value 2\.5 at index 1 \(b\) is above state_high 2\.0$"
    ):
        spec.check_start_state(np.float32([0.0, 2.5, 0.0]))
    with pytest.raises(
        ValueError, match=r"^start state value -4\.0 at index 2 \(c\) is below state_low -3\.0$"
    ):
        spec.check_start_state(np.float32([0.0, 0.0, -4.0]))
    with pytest.raises(ValueError, match=r"at index 0 \(a\) is not a number$"):
        spec.check_start_state(np.float32([np.nan, 0.0, 0.0]))


def test_a_latent_worlds_observation_bounds_are_not_its_states() -> None:
    """Without state bounds of its own, a latent world's state is unbounded: the latent's bounds say
    nothing about it (and have another length)."""
    spec = _latent_spec(observation_low=(-1.0,) * 4, observation_high=(1.0,) * 4)
    assert spec.state_bounds is None
    assert "low" not in spec.describe()["state"]
    spec.check_start_state(np.float32([7.0, 7.0, 7.0]))
    assert spec.describe()["observation"]["low"] == [[[-1.0, -1.0], [-1.0, -1.0]]]


def test_a_world_whose_observation_is_the_state_checks_the_observation_bounds() -> None:
    spec = WorldSpec(
        name="flat", observation_names=("x", "y"), observation_low=(-1.0, -1.0), observation_high=(1.0, 1.0)
    )
    assert spec.state_bounds == ((-1.0, -1.0), (1.0, 1.0))
    spec.check_start_state(np.float32([1.0, -1.0]))
    with pytest.raises(
        ValueError, match=r"^start state value 1\.5 at index 1 \(y\) is above observation_high 1\.0$"
    ):
        spec.check_start_state(np.float32([0.0, 1.5]))


@pytest.mark.parametrize(
    "bounds",
    [
        {"state_low": (-1.0,) * 3},  # without its high
        {"state_low": (-1.0,) * 2, "state_high": (1.0,) * 2},  # the state has 3 values
        {"observation_low": (-1.0,) * 3, "observation_high": (1.0,) * 3},  # the latent has 4
    ],
)
def test_bounds_that_do_not_fit_their_layout_are_refused(bounds: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"latent: (state|observation)"):
        _latent_spec(**bounds)
