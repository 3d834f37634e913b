"""openpi layouts and the session wire share the image rules: an image with no pixels is refused
(it used to reach the policy as a 0x0x3 array), and "at most 16 images" is one rule with one
message wherever it is checked (the codec, ``decode_images`` and the ALOHA layout each had their
own copy and wording). Pure mapping, no server; expected messages are written out by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollserve.server.policy.openpi_layouts import LayoutError, to_observation
from rollserve.wire import WireError, decode_message, packb
from rollserve.wire.images import decode_images, encode_image

PIXEL = np.zeros((1, 1, 3), np.uint8)


def _empty_in(layout: str, shape: tuple[int, ...]) -> tuple[dict[str, Any], str]:
    """An observation of ``layout`` whose one image has ``shape``, and that image's key."""
    image = np.zeros(shape, np.uint8)
    if layout == "droid":
        key = "observation/wrist_image_left"
        obs = {
            "observation/joint_position": np.zeros(7),
            "observation/gripper_position": np.zeros(1),
            key: image,
        }
        return obs, key
    if layout == "libero":
        return {"observation/state": np.zeros(8), "observation/image": image}, "observation/image"
    return {"state": np.zeros(14), "images": {"cam_high": image}}, "images/cam_high"


@pytest.mark.parametrize("layout", ["droid", "libero", "aloha"])
@pytest.mark.parametrize(
    ("shape", "size"),
    [((0, 0, 3), "0x0"), ((0, 4, 3), "0x4"), ((4, 0, 3), "4x0")],
)
def test_an_empty_image_is_refused_by_every_layout(layout: str, shape: tuple[int, ...], size: str) -> None:
    obs, key = _empty_in(layout, shape)
    with pytest.raises(LayoutError) as info:
        to_observation(obs, layout)
    assert str(info.value) == f"image {key!r} is empty ({size}): an image is at least 1x1"


@pytest.mark.parametrize(("chw", "size"), [((3, 0, 4), "0x4"), ((3, 4, 0), "4x0"), ((3, 0, 0), "0x0")])
def test_an_empty_aloha_chw_image_is_refused_after_its_transpose(chw: tuple[int, ...], size: str) -> None:
    with pytest.raises(LayoutError) as info:
        to_observation({"state": np.zeros(14), "images": {"cam_high": np.zeros(chw, np.uint8)}}, "aloha")
    assert str(info.value) == f"image 'images/cam_high' is empty ({size}): an image is at least 1x1"


@pytest.mark.parametrize("layout", ["droid", "libero", "aloha"])
def test_a_one_pixel_image_is_an_image(layout: str) -> None:
    obs, _ = _empty_in(layout, (1, 1, 3))
    out, _ = to_observation(obs, layout)
    assert [image.shape for image in out["images"].values()] == [(1, 1, 3)]


def test_seventeen_images_get_one_message_from_the_codec_decode_images_and_the_aloha_layout() -> None:
    message = "'images' holds 17 images; at most 16 are accepted"
    images = {f"c{i}": PIXEL for i in range(17)}
    with pytest.raises(LayoutError) as layout:
        to_observation({"state": np.zeros(14), "images": images}, "aloha")
    with pytest.raises(WireError) as codec:
        decode_message(
            packb({"type": "observation", "images": {c: encode_image(i) for c, i in images.items()}})
        )
    with pytest.raises(WireError) as direct:
        decode_images(images)
    assert [str(layout.value), codec.value.message, direct.value.message] == [message] * 3
    assert codec.value.code == direct.value.code == "bad_image"


def test_sixteen_images_are_accepted_by_all_three() -> None:
    images = {f"c{i}": PIXEL for i in range(16)}
    assert len(to_observation({"state": np.zeros(14), "images": images}, "aloha")[0]["images"]) == 16
    frame = packb({"type": "observation", "images": {c: encode_image(i) for c, i in images.items()}})
    assert len(decode_message(frame).images) == 16
    assert len(decode_images(images)) == 16
