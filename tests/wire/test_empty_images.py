"""An image with no pixels (height or width 0) is refused as ``bad_image`` wherever images are
decoded (an observation's ``images`` in both framings, ``decode_images`` for REST rollouts, every
form ``decode_any_image`` reads) and before one is encoded. It used to be sent, accepted and handed
to the policy as a 0x0x3 array.
Expected messages are written out by hand."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from rollserve.wire import ObservationMsg, WireError, decode_message, encode_message, pack_frame, packb
from rollserve.wire.errors import BAD_IMAGE
from rollserve.wire.images import IMAGE_KEY, decode_any_image, decode_images, encode_image, image_to_json

EMPTY_SIDES = [(0, 0), (0, 4), (4, 0)]


def _refused(decode: Any, *args: Any) -> WireError:
    with pytest.raises(WireError) as info:
        decode(*args)
    assert info.value.code == BAD_IMAGE
    return info.value


@pytest.mark.parametrize(("height", "width"), EMPTY_SIDES)
@pytest.mark.parametrize("framing", [pack_frame, packb])  # out of band (session protocol), inline
def test_an_observation_with_an_empty_image_is_bad_image(height: int, width: int, framing: Any) -> None:
    """Built by hand: ``encode_message`` itself refuses to send one (below)."""
    images = {"top": np.ones((2, 2, 3), np.uint8), "wrist": np.zeros((height, width, 3), np.uint8)}
    wire = {cam: {IMAGE_KEY: True, b"format": "raw", b"pixels": image} for cam, image in images.items()}
    error = _refused(decode_message, framing({"type": "observation", "images": wire}))
    assert error.message == f"{height}x{width} image is empty: an image is at least 1x1"


@pytest.mark.parametrize(("height", "width"), EMPTY_SIDES)
def test_an_empty_image_is_refused_before_it_is_sent(height: int, width: int) -> None:
    message = f"{height}x{width} image is empty: an image is at least 1x1"
    empty = np.zeros((height, width, 3), np.uint8)
    assert _refused(encode_message, ObservationMsg(images={"c": empty})).message == message
    for quality in (0, 90):
        assert _refused(encode_image, empty, quality).message == message
        assert _refused(image_to_json, empty, quality).message == message


@pytest.mark.parametrize(("height", "width"), EMPTY_SIDES)
def test_decode_images_and_decode_any_image_refuse_empty_images(height: int, width: int) -> None:
    message = f"{height}x{width} image is empty: an image is at least 1x1"
    empty = np.zeros((height, width, 3), np.uint8)
    assert _refused(decode_images, {"c": empty}).message == message
    assert (
        _refused(decode_images, {"c": {IMAGE_KEY: True, b"format": "raw", b"pixels": empty}}).message
        == message
    )
    assert _refused(decode_any_image, empty).message == message
    json_form = {"format": "raw", "shape": [height, width, 3], "data": ""}
    assert _refused(decode_any_image, json_form).message == message


def test_a_negative_json_side_is_refused_as_bad_image_not_a_numpy_error() -> None:
    """``[-1, 0, 3]`` with no data matched its (negative) byte count; numpy's reshape then raised."""
    error = _refused(decode_any_image, {"format": "raw", "shape": [-1, 0, 3], "data": ""})
    assert error.message == "-1x0 image is empty: an image is at least 1x1"


def test_the_smallest_image_is_one_pixel() -> None:
    pixel = np.array([[[1, 2, 3]]], np.uint8)
    decoded = decode_message(encode_message(ObservationMsg(images={"c": pixel})))
    assert decoded.images["c"].tolist() == [[[1, 2, 3]]]
    assert decode_images({"c": pixel})["c"] is pixel
    json_form = {"format": "raw", "shape": [1, 1, 3], "data": base64.b64encode(b"\x01\x02\x03").decode()}
    assert decode_any_image(json_form).tolist() == [[[1, 2, 3]]]
