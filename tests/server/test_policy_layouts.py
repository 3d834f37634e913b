"""openpi input layouts -> rollserve observations (pure mapping, no server)."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.server.policy.openpi_layouts import (
    LayoutError,
    describe_layout,
    detect_layout,
    match_cameras,
    to_observation,
)

IMG = np.zeros((8, 10, 3), np.uint8)


def test_droid_concatenates_joints_and_gripper_as_float32() -> None:
    obs = {
        "observation/joint_position": np.arange(7, dtype=np.float64),
        "observation/gripper_position": np.array([0.5]),
        "observation/exterior_image_1_left": IMG,
        "observation/wrist_image_left": IMG,
        "prompt": "pick",
    }
    out, layout = to_observation(obs)
    assert layout == "droid"
    assert out["state"].dtype == np.float32 and out["state"].tolist() == [0, 1, 2, 3, 4, 5, 6, 0.5]
    assert sorted(out["images"]) == ["exterior_image_1_left", "wrist_image_left"] and out["task"] == "pick"


def test_aloha_images_are_transposed_from_chw() -> None:
    chw = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    out, layout = to_observation({"state": np.zeros(14), "images": {"cam_high": chw}, "prompt": "fold"})
    assert layout == "aloha" and out["images"]["cam_high"].shape == (4, 5, 3)
    np.testing.assert_array_equal(out["images"]["cam_high"][..., 1], chw[1])


def test_libero_detected_and_cameras_renamed_in_order() -> None:
    obs = {"observation/state": np.ones(8), "observation/image": IMG, "observation/wrist_image": IMG + 1}
    out, layout = to_observation(obs, camera_names=("front", "hand"))
    assert layout == "libero" and out["task"] == ""
    assert out["images"]["front"].max() == 0 and out["images"]["hand"].max() == 1


@pytest.mark.parametrize(
    ("obs", "layout", "match"),
    [
        ({"foo": 1}, "auto", "cannot tell"),
        ([1, 2], "auto", "must be a map"),
        ({"state": np.zeros(2)}, "droid", "missing state key"),
        ({"state": np.array(["a"])}, "aloha", "numeric"),
        ({"state": np.zeros(2), "images": {"c": np.zeros((4, 4, 3), np.float32)}}, "aloha", "uint8"),
        ({"state": np.zeros(2), "images": {"c": np.zeros((4, 4, 2), np.uint8)}}, "aloha", "3 channels"),
        ({"state": np.zeros(2), "prompt": 3}, "aloha", "prompt"),
        ({"state": np.zeros(2)}, "nope", "unknown layout"),
        # array-shaped but malformed: numpy's ValueError/TypeError is the client's fault too
        ({"state": [[1.0, 2.0], [3.0]]}, "aloha", r"^'state' is not a rectangular array"),
        (
            {"observation/joint_position": [[1, 2, 3], [4, 5]], "observation/gripper_position": [0]},
            "auto",
            r"^'observation/joint_position' is not a rectangular array",
        ),
        (
            {"state": np.zeros(2), "images": {"c": [[[1, 2, 3]], [[1, 2]]]}},
            "aloha",
            r"^'images/c' is not a rectangular array",
        ),
        (
            {"observation/state": np.zeros(8), "observation/image": [[[0, 0, 0]], [[0]]]},
            "libero",
            r"^'observation/image' is not a rectangular array",
        ),
        ({"state": np.zeros(2), "images": np.zeros((2, 3, 3), np.uint8)}, "aloha", "^'images' must be a map"),
        ({"state": np.zeros(2), "images": np.zeros(1, np.uint8)}, "aloha", "^'images' must be a map"),
        # 17 images, refused before any is converted (the last is not even an image)
        (
            {
                "state": np.zeros(2),
                "images": {**{f"c{i}": np.zeros((2, 2, 3), np.uint8) for i in range(16)}, "x": 0},
            },
            "aloha",
            r"^'images' holds 17 images; at most 16 are accepted$",
        ),
    ],
)
def test_bad_observations_raise_layout_errors(obs: object, layout: str, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        to_observation(obs, layout)


def test_missing_cameras_and_descriptions() -> None:
    with pytest.raises(LayoutError, match="needs 2 camera"):
        match_cameras({"a": IMG}, ("x", "y"))
    assert match_cameras({"x": IMG, "y": IMG, "z": IMG}, ("x", "y")).keys() == {"x", "y", "z"}
    assert detect_layout({"observation/joint_position": 0, "state": 0}) == "droid"
    assert describe_layout("libero")["state_keys"] == ["observation/state"]
    assert describe_layout("auto")["detects"] == ["droid", "aloha", "libero"]


def _distinct(value: int) -> np.ndarray:
    return np.full((4, 4, 3), value, np.uint8)


def test_cameras_that_match_by_name_keep_their_images() -> None:
    """Only the policy's cameras without an image of their name take the remaining images, in the
    layout's order: a matching camera never gets another camera's image."""
    agent, wrist = _distinct(1), _distinct(2)
    libero = {"observation/state": np.zeros(8), "observation/image": agent, "observation/wrist_image": wrist}
    images = to_observation(libero, "libero", ("wrist_image", "agentview"))[0]["images"]
    assert list(images) == ["wrist_image", "agentview"]
    assert images["wrist_image"] is wrist and images["agentview"] is agent
    low, high = _distinct(3), _distinct(4)
    aloha = {"state": np.zeros(2), "images": {"cam_low": low, "cam_high": high}}
    images = to_observation(aloha, "aloha", ("cam_high", "cam_left_wrist"))[0]["images"]
    assert images["cam_high"] is high and images["cam_left_wrist"] is low
    # a policy with names of its own still gets the layout's images in order
    images = to_observation(libero, "libero", ("front", "hand"))[0]["images"]
    assert images["front"] is agent and images["hand"] is wrist


def test_a_layout_camera_the_client_did_not_send_is_missing_not_filled() -> None:
    droid = {
        "observation/joint_position": np.zeros(7),
        "observation/gripper_position": np.zeros(1),
        "observation/wrist_image_left": _distinct(5),
    }
    with pytest.raises(LayoutError, match="needs 1 camera"):
        to_observation(droid, "droid", ("exterior_image_1_left",))


def test_sixteen_images_are_accepted() -> None:
    images = {f"c{i}": np.zeros((2, 2, 3), np.uint8) for i in range(16)}
    observation, _ = to_observation({"state": np.zeros(2), "images": images}, "aloha")
    assert list(observation["images"]) == list(images)
