"""Built-in input mappings from openpi robots' observation dicts to rollserve's observation.

openpi clients send their own key layouts; each mapping turns one into ``{"state": float32 (S,),
"images": {camera: uint8 HWC}, "task": str}``. A layout is chosen by name or detected from the keys.
Pure data reshuffling: no model work happens here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rollserve.wire.errors import WireError
from rollserve.wire.images import check_image_count

LAYOUT_NAMES = ("droid", "aloha", "libero")
MAX_PROMPT_CHARS = 4096  # as the session protocol's task (WireLimits.max_task_chars)
AUTO = "auto"

# openpi key -> camera name, in the order used when the policy's cameras have other names.
DROID_IMAGES = {
    "observation/exterior_image_1_left": "exterior_image_1_left",
    "observation/wrist_image_left": "wrist_image_left",
}
DROID_STATE = ("observation/joint_position", "observation/gripper_position")
LIBERO_IMAGES = {"observation/image": "image", "observation/wrist_image": "wrist_image"}
LIBERO_STATE = ("observation/state",)


class LayoutError(ValueError):
    """The observation does not fit the layout (or none could be detected); safe to send to clients."""


def _array(value: Any, key: str) -> np.ndarray:
    """``np.asarray`` that refuses what no array can be made of (a ragged list, an odd object) as
    the client's fault: numpy raises ValueError or TypeError for those, which is no server bug."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise LayoutError(f"{key!r} is not a rectangular array (rows of different lengths?)") from exc


def _state(obs: Mapping[str, Any], keys: Sequence[str]) -> np.ndarray:
    parts = []
    for key in keys:
        if key not in obs:
            raise LayoutError(f"missing state key {key!r}")
        value = _array(obs[key], key)
        if value.dtype.kind not in "biuf":
            raise LayoutError(f"{key!r} must be numeric, got dtype {value.dtype}")
        with np.errstate(over="ignore"):  # beyond float32's range becomes inf, refused as bad_field
            parts.append(value.astype(np.float32).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _image(value: Any, key: str) -> np.ndarray:
    """uint8 HWC RGB; openpi's ALOHA sends CHW, which is transposed."""
    image = _array(value, key)
    if image.dtype != np.uint8 or image.ndim != 3:
        raise LayoutError(f"image {key!r} must be uint8 HxWx3 (or 3xHxW), got {image.dtype} {image.shape}")
    if image.shape[2] != 3 and image.shape[0] == 3:
        image = np.ascontiguousarray(image.transpose(1, 2, 0))
    if image.shape[2] != 3:
        raise LayoutError(f"image {key!r} must have 3 channels, got shape {image.shape}")
    if image.shape[0] < 1 or image.shape[1] < 1:  # as on the session wire (wire.images)
        size = f"{image.shape[0]}x{image.shape[1]}"
        raise LayoutError(f"image {key!r} is empty ({size}): an image is at least 1x1")
    return image


def _task(obs: Mapping[str, Any]) -> str:
    task = obs.get("prompt", obs.get("task", ""))
    if isinstance(task, bytes):
        task = task.decode("utf-8", "replace")
    if not isinstance(task, str):
        raise LayoutError(f"prompt must be a string, got {type(task).__name__}")
    if len(task) > MAX_PROMPT_CHARS:
        raise LayoutError(f"prompt is longer than {MAX_PROMPT_CHARS} characters")
    return task


def _flat_images(obs: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, np.ndarray]:
    return {camera: _image(obs[key], key) for key, camera in keys.items() if key in obs}


def droid(obs: Mapping[str, Any]) -> dict[str, Any]:
    """DROID: joint_position (7) + gripper_position (1) -> 8-D state; exterior and wrist cameras."""
    return {"state": _state(obs, DROID_STATE), "images": _flat_images(obs, DROID_IMAGES), "task": _task(obs)}


def libero(obs: Mapping[str, Any]) -> dict[str, Any]:
    """LIBERO: observation/state (8); agent-view and wrist cameras."""
    return {
        "state": _state(obs, LIBERO_STATE),
        "images": _flat_images(obs, LIBERO_IMAGES),
        "task": _task(obs),
    }


def aloha(obs: Mapping[str, Any]) -> dict[str, Any]:
    """ALOHA (and rollserve's own dict form): ``state``, ``images{cam_*}`` (CHW or HWC), ``prompt``."""
    images = obs.get("images")
    if images is None:
        images = {}
    elif not isinstance(images, Mapping):  # before any truth test: an array has no truth value
        raise LayoutError("'images' must be a map of camera name to image")
    try:  # counted before any image is converted: the session wire's rule and message
        check_image_count(images)
    except WireError as exc:
        raise LayoutError(exc.message) from None
    return {
        "state": _state(obs, ("state",)),
        "images": {str(cam): _image(image, f"images/{cam}") for cam, image in images.items()},
        "task": _task(obs),
    }


LAYOUTS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "droid": droid,
    "aloha": aloha,
    "libero": libero,
}
LAYOUT_CAMERAS = {"droid": tuple(DROID_IMAGES.values()), "aloha": (), "libero": tuple(LIBERO_IMAGES.values())}
_STATE_KEYS = {"droid": DROID_STATE, "aloha": ("state",), "libero": LIBERO_STATE}
_IMAGE_KEYS = {"droid": tuple(DROID_IMAGES), "aloha": ("images/<camera>",), "libero": tuple(LIBERO_IMAGES)}


def detect_layout(obs: Mapping[str, Any]) -> str:
    """The layout whose state keys the observation carries."""
    if "observation/joint_position" in obs:
        return "droid"
    if "observation/state" in obs:
        return "libero"
    if "state" in obs:
        return "aloha"
    keys = sorted(str(key) for key in obs)[:12]
    raise LayoutError(
        f"cannot tell the observation layout from keys {keys}; start the server with --openpi-layout"
    )


def match_cameras(
    images: dict[str, np.ndarray], expected: Sequence[str], layout_cameras: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """Name the images as the policy does: by name where the names match; the policy's other
    cameras take the remaining images in the layout's order. An image goes to a camera of another
    name only when that camera is not one the layout knows: a camera the layout names but the client
    did not send is missing, never filled with another camera's image."""
    if not expected or all(cam in images for cam in expected):
        return images
    unfilled = [cam for cam in expected if cam not in images]
    missing = [cam for cam in unfilled if cam in layout_cameras]
    spare = [image for cam, image in images.items() if cam not in expected]
    if missing or len(spare) < len(unfilled):
        raise LayoutError(
            f"policy needs {len(expected)} camera image(s) {list(expected)}, got {sorted(images)}"
        )
    filled = dict(zip(unfilled, spare, strict=False))
    return {cam: images[cam] if cam in images else filled[cam] for cam in expected}


def to_observation(
    obs: Any, layout: str = AUTO, camera_names: Sequence[str] = ()
) -> tuple[dict[str, Any], str]:
    """``(rollserve observation, layout used)`` for one openpi request."""
    if not isinstance(obs, Mapping):
        raise LayoutError(f"an observation must be a map, got {type(obs).__name__}")
    name = detect_layout(obs) if layout == AUTO else layout
    if name not in LAYOUTS:
        raise LayoutError(f"unknown layout {name!r}; choose one of {(AUTO, *LAYOUT_NAMES)}")
    observation = LAYOUTS[name](obs)
    observation["images"] = match_cameras(observation["images"], camera_names, LAYOUT_CAMERAS[name])
    return observation, name


def describe_layout(layout: str) -> dict[str, Any]:
    """For the metadata sent on connect: which keys the server reads."""
    if layout == AUTO:
        return {"layout": AUTO, "detects": list(LAYOUT_NAMES)}
    return {
        "layout": layout,
        "state_keys": list(_STATE_KEYS[layout]),
        "image_keys": list(_IMAGE_KEYS[layout]),
        "prompt_key": "prompt",
    }
