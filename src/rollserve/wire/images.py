"""Camera images on the wire: uint8 HWC RGB, raw (byte-exact) or JPEG at a quality the client picks.

JPEG uses libjpeg-turbo through simplejpeg (the ``jpeg`` extra); quality 0 means raw. Image maps
are decoded only where a message says images belong (``decode_images``), after the count check,
each image's size and a total-pixel budget per message, all read from the JPEG headers before
anything is decompressed. The msgpack decoder itself never decodes an image.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from typing import Any

import numpy as np

from rollserve.wire.errors import BAD_FIELD, BAD_IMAGE, IMAGE_TOO_LARGE, WireError
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits

IMAGE_KEY = b"__image__"


_UINT8 = np.dtype(np.uint8)


def _rgb_size(image: Any) -> tuple[int, int] | None:
    """(height, width) of a uint8 HxWx3 array, else None."""
    if isinstance(image, np.ndarray) and image.dtype == _UINT8:
        shape = image.shape
        if len(shape) == 3 and shape[2] == 3:
            return shape[0], shape[1]
    return None


def _check_pixels(height: int, width: int) -> None:
    """At least one pixel: a policy handed a 0xW image fails deep inside, or answers anyway."""
    if height < 1 or width < 1:
        raise WireError(BAD_IMAGE, f"{height}x{width} image is empty: an image is at least 1x1")


def check_image(image: np.ndarray, name: str = "image") -> None:
    """Images are uint8, HxWx3 RGB, with at least one pixel."""
    size = _rgb_size(image)
    if size is None:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image).__name__)
        raise WireError(BAD_IMAGE, f"{name} must be uint8 HxWx3 RGB, got {dtype} {shape}")
    _check_pixels(*size)


def check_image_count(images: Sized, limits: WireLimits = DEFAULT_LIMITS, name: str = "images") -> None:
    """At most ``limits.max_images`` images: the one count rule of the codec, ``decode_images`` and
    the openpi layouts, checked before any image is decoded (a count costs nothing, a decode megabytes)."""
    if len(images) > limits.max_images:
        message = f"{name!r} holds {len(images)} images; at most {limits.max_images} are accepted"
        raise WireError(BAD_IMAGE, message)


def _check_size(height: int, width: int, limits: WireLimits) -> None:
    _check_pixels(height, width)
    if (
        height > limits.max_image_side
        or width > limits.max_image_side
        or height * width > limits.max_image_pixels
    ):
        raise WireError(IMAGE_TOO_LARGE, f"{height}x{width} image exceeds the configured limits")


def encode_image(
    image: np.ndarray, quality: int = 0, pixels: Callable[[np.ndarray], Any] | None = None
) -> dict[bytes, Any]:
    """Wire map for one image; quality 1..100 selects JPEG, 0 sends the raw pixels.

    ``pixels`` turns the raw pixel array into its wire map (out-of-band framing); without it the
    packer encodes the array itself.
    """
    check_image(image)
    if not 0 <= quality <= 100:
        raise ValueError(f"jpeg quality must be in 0..100, got {quality}")
    if quality == 0:
        # the packer encodes the pixel array: inline (packb) or out of band (pack_frame)
        return {IMAGE_KEY: True, b"format": "raw", b"pixels": image if pixels is None else pixels(image)}
    import simplejpeg

    data = simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality, colorspace="RGB")
    return {IMAGE_KEY: True, b"format": "jpeg", b"data": data}


def decode_image(obj: dict[Any, Any], limits: WireLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The uint8 HWC RGB image a wire map carries."""
    return _decode_checked(obj, _image_size(obj, limits), limits)


def decode_images(
    value: Any, limits: WireLimits = DEFAULT_LIMITS, name: str = "images"
) -> dict[str, np.ndarray]:
    """``{camera: image}`` from a map of wire images (or already decoded arrays).

    Count first, then every image's size and the message's total pixels from headers alone; only
    then is anything decompressed, so a decompression bomb costs a header read.
    """
    if not (type(value) is dict or isinstance(value, Mapping)):
        raise WireError(BAD_IMAGE, f"field {name!r} must be a map of camera name to image")
    check_image_count(value, limits, name)
    images: dict[str, Any] = {}  # raw pixels at once; JPEG maps until every size is known
    jpeg_sizes: dict[str, tuple[int, int]] = {}
    total = 0
    for cam, image in value.items():
        if not isinstance(cam, str):
            message = f"field {name!r} must be keyed by camera name, got {type(cam).__name__}"
            raise WireError(BAD_FIELD, message)
        if isinstance(image, np.ndarray):
            size = _rgb_size(image)
            if size is None:
                check_image(image, f"image {cam!r}")  # raises BAD_IMAGE
            _check_size(*size, limits)  # type: ignore[misc]
        elif isinstance(image, dict) and image.get(IMAGE_KEY) is True:
            size = _image_size(image, limits)
            if image.get(b"format") == "raw":
                image = image[b"pixels"]
            else:
                jpeg_sizes[cam] = size
        else:
            check_image(image, f"image {cam!r}")  # not an image at all: raises BAD_IMAGE
            raise AssertionError("unreachable")
        images[cam] = image
        total += size[0] * size[1]  # type: ignore[index]
    if total > limits.max_total_image_pixels:
        raise WireError(
            IMAGE_TOO_LARGE,
            f"{total} pixels in {len(images)} images exceeds the limit of {limits.max_total_image_pixels}",
        )
    for cam, size in jpeg_sizes.items():
        images[cam] = _decode_checked(images[cam], size, limits)
    return images


def _image_size(obj: dict[Any, Any], limits: WireLimits) -> tuple[int, int]:
    """(height, width) of a wire image, from its tensor shape or JPEG header; checked against the limits."""
    fmt = obj.get(b"format")
    if fmt == "raw":
        image = obj.get(b"pixels")
        if not isinstance(image, np.ndarray):
            raise WireError(BAD_IMAGE, "raw image carries no pixel tensor")
        size = _rgb_size(image)
        if size is None:
            check_image(image)  # raises BAD_IMAGE
        height, width = size  # type: ignore[misc]
    elif fmt == "jpeg":
        data = obj.get(b"data")
        if not isinstance(data, bytes):
            raise WireError(BAD_IMAGE, "jpeg image data must be binary")
        import simplejpeg

        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except Exception:
            raise WireError(BAD_IMAGE, "not a decodable JPEG") from None
    else:
        raise WireError(BAD_IMAGE, f"unknown image format {fmt!r:.20}")
    _check_size(height, width, limits)
    return height, width


def _decode_checked(obj: dict[Any, Any], size: tuple[int, int], limits: WireLimits) -> np.ndarray:
    if obj.get(b"format") == "raw":
        return obj[b"pixels"]
    import simplejpeg

    try:
        image = simplejpeg.decode_jpeg(obj[b"data"], colorspace="RGB")
    except Exception:
        raise WireError(BAD_IMAGE, "not a decodable JPEG") from None
    if image.shape[:2] != size:
        raise WireError(BAD_IMAGE, "JPEG size differs from its header")
    return image


def image_to_json(image: np.ndarray, quality: int = 0) -> dict[str, Any]:
    """The JSON form of a wire image: ``{"format": "raw"|"jpeg", "shape": [H, W, 3], "data": base64}``.

    Raw data is the HWC RGB bytes; JPEG data is the JPEG file. Same ``quality`` rule as ``encode_image``.
    """
    import base64

    wire = encode_image(image, quality)
    data = wire[b"data"] if quality else np.ascontiguousarray(image).tobytes()
    return {
        "format": wire[b"format"],
        "shape": list(image.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }


def decode_any_image(obj: Any, limits: WireLimits = DEFAULT_LIMITS) -> np.ndarray:
    """An image in any of its wire forms: a decoded array, a msgpack image map, or the JSON form."""
    if isinstance(obj, np.ndarray):
        check_image(obj)
        _check_size(obj.shape[0], obj.shape[1], limits)
        return obj
    if isinstance(obj, dict) and obj.get(IMAGE_KEY) is True:
        return decode_image(obj, limits)
    if isinstance(obj, dict) and isinstance(obj.get("data"), str):
        import base64

        data = base64.b64decode(obj["data"])
        if obj.get("format") == "jpeg":
            return decode_image({b"format": "jpeg", b"data": data}, limits)
        shape = obj.get("shape")
        if obj.get("format") != "raw" or not isinstance(shape, list) or len(shape) != 3 or shape[2] != 3:
            raise WireError(BAD_IMAGE, "a JSON image is raw with shape [H, W, 3], or jpeg")
        _check_size(int(shape[0]), int(shape[1]), limits)
        if len(data) != shape[0] * shape[1] * 3:
            raise WireError(BAD_IMAGE, "raw image data does not match its shape")
        return np.frombuffer(data, dtype=np.uint8).reshape(shape).copy()
    raise WireError(BAD_IMAGE, "not a wire image")
