"""Camera images on the wire: uint8 HWC RGB, raw (byte-exact) or JPEG at a quality the client picks.

JPEG uses libjpeg-turbo through simplejpeg (the ``jpeg`` extra); quality 0 means raw. Decoding
reads the JPEG header and checks the size against the limits before decompressing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollserve.wire.errors import BAD_IMAGE, IMAGE_TOO_LARGE, WireError
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits
from rollserve.wire.tensors import decode_array

IMAGE_KEY = b"__image__"


def check_image(image: np.ndarray, name: str = "image") -> None:
    """Images are uint8, HxWx3 RGB."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image).__name__)
        raise WireError(BAD_IMAGE, f"{name} must be uint8 HxWx3 RGB, got {dtype} {shape}")


def _check_size(height: int, width: int, limits: WireLimits) -> None:
    if (
        height > limits.max_image_side
        or width > limits.max_image_side
        or height * width > limits.max_image_pixels
    ):
        raise WireError(IMAGE_TOO_LARGE, f"{height}x{width} image exceeds the configured limits")


def encode_image(image: np.ndarray, quality: int = 0) -> dict[bytes, Any]:
    """Wire map for one image; quality 1..100 selects JPEG, 0 sends the raw pixels."""
    check_image(image)
    if not 0 <= quality <= 100:
        raise ValueError(f"jpeg quality must be in 0..100, got {quality}")
    if quality == 0:
        # the packer encodes the pixel array: inline (packb) or out of band (pack_frame)
        return {IMAGE_KEY: True, b"format": "raw", b"pixels": image}
    import simplejpeg

    data = simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality, colorspace="RGB")
    return {IMAGE_KEY: True, b"format": "jpeg", b"data": data}


def decode_image(obj: dict[Any, Any], limits: WireLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The uint8 HWC RGB image a wire map carries."""
    fmt = obj.get(b"format")
    if fmt == "raw":
        pixels = obj.get(b"pixels")
        image = decode_array(pixels, limits) if isinstance(pixels, dict) else pixels
        if not isinstance(image, np.ndarray):
            raise WireError(BAD_IMAGE, "raw image carries no pixel tensor")
        check_image(image)
        _check_size(image.shape[0], image.shape[1], limits)
        return image
    if fmt == "jpeg":
        data = obj.get(b"data")
        if not isinstance(data, bytes):
            raise WireError(BAD_IMAGE, "jpeg image data must be binary")
        import simplejpeg

        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except Exception:
            raise WireError(BAD_IMAGE, "not a decodable JPEG") from None
        _check_size(height, width, limits)
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except Exception:
            raise WireError(BAD_IMAGE, "not a decodable JPEG") from None
    raise WireError(BAD_IMAGE, f"unknown image format {fmt!r:.20}")
