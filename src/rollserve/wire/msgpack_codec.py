"""msgpack with numpy arrays, scalars and images: the one byte format of every rollserve transport.

Compatible with openpi-client's ``msgpack_numpy`` in both directions. Never unpickles; refuses
object/void/complex dtypes and msgpack extension types; enforces :class:`WireLimits` while parsing.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from rollserve.wire.errors import FRAME_TOO_LARGE, MALFORMED_FRAME, WireError
from rollserve.wire.images import IMAGE_KEY, decode_image
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits
from rollserve.wire.tensors import NDARRAY_KEY, NPGENERIC_KEY, decode_array, decode_scalar, encode_array, encode_scalar


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return encode_scalar(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


_packer_kwargs = {"default": _default, "use_bin_type": True}


def packb(obj: Any) -> bytes:
    """Encode a message tree (dicts, lists, str, numbers, bytes, numpy arrays and scalars)."""
    return msgpack.packb(obj, **_packer_kwargs)


def _object_hook(limits: WireLimits):  # type: ignore[no-untyped-def]
    def hook(obj: dict[Any, Any]) -> Any:
        if NDARRAY_KEY in obj:
            return decode_array(obj, limits)
        if NPGENERIC_KEY in obj:
            return decode_scalar(obj)
        if IMAGE_KEY in obj:
            return decode_image(obj, limits)
        return obj

    return hook


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(MALFORMED_FRAME, f"msgpack extension type {code} is not accepted")


def unpackb(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Any:
    """Decode one frame, or raise :class:`WireError` (never anything else) on bad input."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(MALFORMED_FRAME, f"expected a binary frame, got {type(data).__name__}")
    if len(data) > limits.max_frame_bytes:
        raise WireError(FRAME_TOO_LARGE, f"{len(data)} bytes exceeds the limit of {limits.max_frame_bytes}")
    try:
        return msgpack.unpackb(
            data,
            object_hook=_object_hook(limits),
            ext_hook=_refuse_ext,
            raw=False,
            max_bin_len=limits.max_frame_bytes,
            max_str_len=limits.max_string_bytes,
            max_array_len=limits.max_container_items,
            max_map_len=limits.max_container_items,
        )
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise WireError(MALFORMED_FRAME, f"not a valid msgpack frame ({type(exc).__name__})") from None
