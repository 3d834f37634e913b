"""Images in their JSON form (REST rollouts) and ``decode_any_image``, which reads every wire form:
the exact JSON a client gets, the refusals with their codes and messages, and the size limits."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import simplejpeg

from rollserve.wire import WireError, WireLimits
from rollserve.wire.errors import BAD_IMAGE, IMAGE_TOO_LARGE
from rollserve.wire.images import IMAGE_KEY, decode_any_image, image_to_json

LIMITS = WireLimits(max_image_side=32, max_image_pixels=32 * 16)
IMAGE = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)


def test_the_raw_json_form_is_format_shape_and_base64_of_the_hwc_bytes() -> None:
    strided = np.asfortranarray(IMAGE)  # not C order: the bytes sent are still row-major HWC
    wire = image_to_json(strided)
    assert wire == {"format": "raw", "shape": [4, 5, 3], "data": base64.b64encode(bytes(range(60))).decode()}
    decoded = decode_any_image(wire)
    np.testing.assert_array_equal(decoded, IMAGE)
    assert decoded.dtype == np.uint8 and decoded.flags.writeable  # a copy, not a view of the text


def test_the_jpeg_json_form_is_a_jpeg_file_in_base64() -> None:
    flat = np.full((16, 24, 3), (200, 40, 90), np.uint8)
    wire = image_to_json(flat, quality=90)
    assert wire["format"] == "jpeg" and wire["shape"] == [16, 24, 3]
    data = base64.b64decode(wire["data"])
    assert simplejpeg.decode_jpeg_header(data)[:2] == (16, 24)
    decoded = decode_any_image(wire)
    assert decoded.shape == (16, 24, 3)
    assert np.abs(decoded.astype(int) - flat.astype(int)).max() <= 4


def test_image_to_json_checks_the_image_and_the_quality() -> None:
    with pytest.raises(ValueError, match=r"^jpeg quality must be in 0\.\.100, got 101$"):
        image_to_json(IMAGE, quality=101)
    with pytest.raises(WireError) as info:
        image_to_json(IMAGE.astype(np.float32))
    assert (info.value.code, info.value.message) == (
        BAD_IMAGE,
        "image must be uint8 HxWx3 RGB, got float32 (4, 5, 3)",
    )


def test_arrays_and_msgpack_maps_are_read_too_within_the_limits() -> None:
    assert decode_any_image(IMAGE, LIMITS) is IMAGE
    raw_map = {IMAGE_KEY: True, b"format": "raw", b"pixels": IMAGE}
    assert decode_any_image(raw_map, LIMITS) is IMAGE
    too_tall = np.zeros((33, 2, 3), np.uint8)
    too_many = np.zeros((32, 17, 3), np.uint8)  # each side fits, the pixel count does not
    for image in (too_tall, too_many):
        with pytest.raises(WireError) as info:
            decode_any_image(image, LIMITS)
        h, w = image.shape[:2]
        assert (info.value.code, info.value.message) == (
            IMAGE_TOO_LARGE,
            f"{h}x{w} image exceeds the configured limits",
        )
    with pytest.raises(WireError) as info:
        decode_any_image(np.zeros((2, 2, 4), np.uint8), LIMITS)
    assert (info.value.code, info.value.message) == (
        BAD_IMAGE,
        "image must be uint8 HxWx3 RGB, got uint8 (2, 2, 4)",
    )
    with pytest.raises(WireError) as info:
        decode_any_image({IMAGE_KEY: True, b"format": "raw", b"pixels": too_tall}, LIMITS)
    assert info.value.code == IMAGE_TOO_LARGE


def test_json_images_are_checked_against_the_limits_before_decoding() -> None:
    big = np.zeros((40, 8, 3), np.uint8)
    for quality in (0, 90):
        with pytest.raises(WireError) as info:
            decode_any_image(image_to_json(big, quality), LIMITS)
        assert (info.value.code, info.value.message) == (
            IMAGE_TOO_LARGE,
            "40x8 image exceeds the configured limits",
        )
    assert decode_any_image(image_to_json(np.zeros((32, 16, 3), np.uint8)), LIMITS).shape == (32, 16, 3)


def _json(**overrides: Any) -> dict[str, Any]:
    return {
        "format": "raw",
        "shape": [4, 5, 3],
        "data": base64.b64encode(IMAGE.tobytes()).decode(),
        **overrides,
    }


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_json(format="png"), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(format=None), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(shape=(4, 5, 3)), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(shape=[4, 15]), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(shape=[4, 5, 3, 1]), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(shape=[4, 15, 1]), "a JSON image is raw with shape [H, W, 3], or jpeg"),
        (_json(shape=[4, 4, 3]), "raw image data does not match its shape"),
        (_json(shape=[5, 5, 3]), "raw image data does not match its shape"),
        (_json(format="jpeg"), "not a decodable JPEG"),
        ({"format": "raw", "shape": [4, 5, 3], "data": b"bytes"}, "not a wire image"),
        ({"data": None}, "not a wire image"),
        ({IMAGE_KEY: False, b"format": "raw", b"pixels": IMAGE}, "not a wire image"),
        ("an image", "not a wire image"),
    ],
)  # fmt: skip
def test_malformed_images_are_refused_with_the_reason(obj: Any, message: str) -> None:
    with pytest.raises(WireError) as info:
        decode_any_image(obj)
    assert (info.value.code, info.value.message) == (BAD_IMAGE, message)
