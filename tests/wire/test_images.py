"""Images: raw is byte-exact, JPEG is close at a client-chosen quality, sizes are checked before decoding."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from rollserve.wire import WireError, WireLimits, packb, unpackb
from rollserve.wire.errors import BAD_IMAGE, IMAGE_TOO_LARGE
from rollserve.wire.images import IMAGE_KEY, decode_image, decode_images, encode_image


def _smooth_image(height: int = 96, width: int = 128) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], axis=-1).astype(np.uint8)


def test_raw_images_are_byte_exact() -> None:
    image = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    decoded = decode_image(unpackb(packb(encode_image(image, quality=0))))
    assert decoded.dtype == np.uint8 and decoded.shape == image.shape
    assert np.array_equal(decoded, image)


@pytest.mark.parametrize("quality", [50, 90])
def test_jpeg_images_are_close_and_smaller(quality: int) -> None:
    image = _smooth_image()
    wire = encode_image(image, quality=quality)
    decoded = decode_image(unpackb(packb(wire)))
    assert decoded.shape == image.shape and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - image.astype(int)).mean() < 6
    assert len(wire[b"data"]) < image.nbytes / 3


def test_jpeg_size_is_checked_from_the_header_before_decoding() -> None:
    big = simplejpeg.encode_jpeg(np.zeros((512, 512, 3), np.uint8), quality=50, colorspace="RGB")
    with pytest.raises(WireError) as info:
        decode_image({IMAGE_KEY: True, b"format": "jpeg", b"data": big}, WireLimits(max_image_side=256))
    assert info.value.code == IMAGE_TOO_LARGE


@pytest.mark.parametrize(
    "wire",
    [
        {IMAGE_KEY: True, b"format": "jpeg", b"data": b"\xff\xd8 not really a jpeg"},
        {IMAGE_KEY: True, b"format": "png", b"data": b""},
        {IMAGE_KEY: True, b"format": "raw", b"pixels": "nope"},
    ],
)
def test_garbage_images_get_a_typed_error(wire: dict) -> None:
    with pytest.raises(WireError) as info:
        decode_images({"cam": unpackb(packb(wire))})
    assert info.value.code == BAD_IMAGE


@pytest.mark.parametrize(
    "image", [np.zeros((8, 8), np.uint8), np.zeros((8, 8, 3), np.float32), np.zeros((8, 8, 4), np.uint8)]
)
def test_only_uint8_hwc_rgb_is_sent(image: np.ndarray) -> None:
    with pytest.raises(WireError) as info:
        encode_image(image)
    assert info.value.code == BAD_IMAGE
