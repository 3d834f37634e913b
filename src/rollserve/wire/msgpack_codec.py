"""msgpack with numpy arrays, scalars and images: the one byte format of every rollserve transport.

Two framings, one decoder:

* ``packb``: plain msgpack, arrays inline as ``{__ndarray__, data, dtype, shape}`` maps, exactly
  openpi-client's ``msgpack_numpy`` layout (used at the openpi endpoint and for REST bodies).
* ``pack_frame``: the same message with array bytes moved *out of band* behind a small msgpack
  header (``RSV1`` magic, header length, header, 8-byte aligned payload). Encoding copies each
  payload byte once; decoding builds arrays as views of the received frame, with no copy at all.

``unpackb`` reads both. It never unpickles, refuses object/void/complex dtypes and msgpack
extension types, and enforces :class:`WireLimits` before building anything.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np

from rollserve.wire.errors import BAD_SHAPE, FRAME_TOO_LARGE, MALFORMED_FRAME, WireError
from rollserve.wire.images import IMAGE_KEY, decode_image
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits
from rollserve.wire.tensors import (
    NDARRAY_KEY,
    NPGENERIC_KEY,
    OOB_KEY,
    decode_array,
    decode_scalar,
    encode_array,
    encode_array_header,
    encode_scalar,
)

FRAME_MAGIC = b"RSV1"
_PREFIX = struct.Struct("<4sI")  # magic, header length
_ALIGN = 8
_ZEROS = bytes(_ALIGN)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return encode_scalar(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} on the wire")


def packb(obj: Any) -> bytes:
    """Plain msgpack (openpi-client compatible): dicts, lists, str, numbers, bytes, numpy arrays/scalars."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def pack_frame(obj: Any) -> bytes:
    """Out-of-band framing: a msgpack header describing the tree, then the raw array bytes."""
    buffers: list[Any] = []  # arrays and zero padding, joined once at the end
    offset = 0

    def default(value: Any) -> Any:
        nonlocal offset
        if isinstance(value, np.ndarray):
            header, array = encode_array_header(value, offset)
            buffers.append(array)
            pad = -array.nbytes % _ALIGN
            if pad:
                buffers.append(_ZEROS[:pad])
            offset += array.nbytes + pad
            return header
        return _default(value)

    header = msgpack.packb(obj, default=default, use_bin_type=True)
    pad = -(_PREFIX.size + len(header)) % _ALIGN
    return b"".join([_PREFIX.pack(FRAME_MAGIC, len(header)), header, _ZEROS[:pad], *buffers])


def _object_hook(limits: WireLimits, payload: memoryview | None = None):  # type: ignore[no-untyped-def]
    """msgpack's ``object_hook``: tensor, scalar and image maps become arrays; other maps stay maps.

    Out-of-band tensor maps point into ``payload`` (framed frames only); inline ones carry ``data``.
    """

    def hook(obj: dict[Any, Any]) -> Any:
        if NDARRAY_KEY in obj:
            return decode_array(obj, limits, payload if OOB_KEY in obj else None)
        if NPGENERIC_KEY in obj:
            return decode_scalar(obj)
        if IMAGE_KEY in obj:
            return decode_image(obj, limits)
        return obj

    return hook


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(MALFORMED_FRAME, f"msgpack extension type {code} is not accepted")


def _unpack(data: Any, hook: Any, limits: WireLimits) -> Any:
    try:
        return msgpack.unpackb(
            data,
            object_hook=hook,
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


def unpackb(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Any:
    """Decode one frame of either framing, or raise :class:`WireError` (never anything else)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(MALFORMED_FRAME, f"expected a binary frame, got {type(data).__name__}")
    if len(data) > limits.max_frame_bytes:
        raise WireError(FRAME_TOO_LARGE, f"{len(data)} bytes exceeds the limit of {limits.max_frame_bytes}")
    if bytes(data[:4]) != FRAME_MAGIC:
        return _unpack(data, _object_hook(limits), limits)
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    if len(view) < _PREFIX.size:
        raise WireError(MALFORMED_FRAME, "truncated frame prefix")
    _, header_len = _PREFIX.unpack_from(view)
    start = _PREFIX.size + header_len
    if start > len(view):
        raise WireError(BAD_SHAPE if header_len else MALFORMED_FRAME, "frame header runs past the frame")
    payload = view[start + (-start % _ALIGN) :].toreadonly()  # arrays viewing it are read-only too
    return _unpack(view[_PREFIX.size : start], _object_hook(limits, payload), limits)
