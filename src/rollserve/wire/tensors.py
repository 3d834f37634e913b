"""Tensors on the wire: ``{__ndarray__, data, dtype, shape}`` maps, the layout openpi-client uses.

Data is the array's little-endian raw bytes, so float32 stays float32 byte for byte. Decoding
checks dtype, shape and element count against the limits before building anything, and wraps the
received buffer without copying.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from rollserve.wire.errors import BAD_SHAPE, MALFORMED_FRAME, TOO_MANY_ELEMENTS, UNSUPPORTED_DTYPE, WireError
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits

NDARRAY_KEY = b"__ndarray__"
NPGENERIC_KEY = b"__npgeneric__"
OOB_KEY = b"oob"  # out-of-band framing: [offset, nbytes] into the frame's payload instead of inline data
# bool, signed and unsigned ints, floats. Object, void, complex, strings and datetimes are refused.
ALLOWED_KINDS = frozenset("biuf")


# The dtype strings senders actually write (``dtype.str``), parsed once: decoding a tensor looks
# them up instead of going through the checks and the cache below, with the same result.
_COMMON_DTYPES: dict[str, np.dtype] = {
    np.dtype(name).str: np.dtype(name)
    for name in ("b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8")
}


def check_dtype(dtype_str: Any) -> np.dtype:
    """Parse a wire dtype string, refusing anything that is not a plain little-endian number."""
    if isinstance(dtype_str, bytes):
        dtype_str = dtype_str.decode("ascii", "replace")
    if not isinstance(dtype_str, str) or len(dtype_str) > 8:
        raise WireError(UNSUPPORTED_DTYPE, f"dtype must be a short string, got {dtype_str!r:.40}")
    return _parse_dtype(dtype_str)


@functools.lru_cache(maxsize=64)
def _parse_dtype(dtype_str: str) -> np.dtype:
    try:
        dtype = np.dtype(dtype_str)
    except Exception:  # not only TypeError/ValueError: np.dtype(",") raises SyntaxError
        raise WireError(UNSUPPORTED_DTYPE, f"unknown dtype {dtype_str!r}") from None
    if dtype.kind not in ALLOWED_KINDS or dtype.byteorder == ">" or dtype.fields is not None:
        raise WireError(
            UNSUPPORTED_DTYPE, f"dtype {dtype_str!r} is not allowed (numbers only, little-endian)"
        )
    return dtype


def _sendable(array: np.ndarray) -> np.ndarray:
    """C order, little-endian, number dtype; no copy when the array already is."""
    dtype = array.dtype
    if dtype.kind not in ALLOWED_KINDS or dtype.fields is not None:
        raise WireError(UNSUPPORTED_DTYPE, f"cannot send arrays of dtype {dtype}")
    if dtype.byteorder == ">":
        array = array.astype(dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # not np.ascontiguousarray: it turns 0-d arrays into 1-d
    return array


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B") if array.size else memoryview(b"")


def encode_array(array: np.ndarray) -> dict[bytes, Any]:
    """The inline wire map for one array (openpi-client's layout)."""
    array = _sendable(array)
    return {
        NDARRAY_KEY: True,
        b"data": _bytes_of(array),
        b"dtype": array.dtype.str,
        b"shape": list(array.shape),
    }


# Native little-endian number dtypes and their wire strings: an array of one of these that is
# C-contiguous is sent as it is, without ``_sendable`` and ``dtype.str`` (~0.5 us per array).
_WIRE_STR: dict[np.dtype, str] = {dtype: name for name, dtype in _COMMON_DTYPES.items()}


def encode_array_header(array: np.ndarray, offset: int) -> tuple[dict[bytes, Any], np.ndarray]:
    """The out-of-band wire map (no data, an ``[offset, nbytes]`` pointer) and the array whose bytes
    to append (C-contiguous, so ``bytes.join`` takes it as it is).

    The shape goes as the array's tuple: msgpack packs a tuple as the same array a list makes.
    """
    dtype_str = _WIRE_STR.get(array.dtype)
    if dtype_str is None or not array.flags.c_contiguous:
        array = _sendable(array)
        dtype_str = array.dtype.str
    header = {
        NDARRAY_KEY: True,
        OOB_KEY: [offset, array.nbytes],
        b"dtype": dtype_str,
        b"shape": array.shape,
    }
    return header, array


def encode_scalar(value: np.generic) -> dict[bytes, Any]:
    if value.dtype.kind not in ALLOWED_KINDS:
        raise WireError(UNSUPPORTED_DTYPE, f"cannot send scalars of dtype {value.dtype}")
    return {NPGENERIC_KEY: True, b"data": value.item(), b"dtype": value.dtype.str}


def _product(values: Any, max_len: int) -> int:
    """The product of a list of at most ``max_len`` non-negative ints (bool excluded), else -1.

    For a shape, that is its element count; one pass instead of a check and then ``math.prod``.
    """
    if type(values) is not list or len(values) > max_len:
        return -1
    product = 1
    for value in values:
        if type(value) is not int or value < 0:
            return -1
        product *= value
    return product


def decode_array(
    obj: dict[Any, Any], limits: WireLimits = DEFAULT_LIMITS, payload: memoryview | None = None
) -> np.ndarray:
    """Build the array a wire map describes, after validating it: a read-only view, never a copy.

    Inline maps carry their bytes in ``data``; out-of-band maps point into ``payload``.
    """
    dtype_str = obj.get(b"dtype")
    dtype = _COMMON_DTYPES.get(dtype_str) if type(dtype_str) is str else None
    if dtype is None:
        dtype = check_dtype(dtype_str)
    shape = obj.get(b"shape")
    count = _product(shape, limits.max_tensor_dims)
    if count < 0:
        raise WireError(BAD_SHAPE, f"shape must be at most {limits.max_tensor_dims} non-negative ints")
    if count > limits.max_tensor_elements:
        raise WireError(
            TOO_MANY_ELEMENTS, f"{count} elements exceeds the limit of {limits.max_tensor_elements}"
        )
    if count == 0 and (others := math.prod(filter(None, shape))) > limits.max_tensor_elements:
        # numpy still sizes an empty array by its other dimensions: (0, 2**63) raises ValueError
        raise WireError(
            TOO_MANY_ELEMENTS,
            f"{others} elements besides the zeros of shape {shape} exceeds the limit of "
            f"{limits.max_tensor_elements}",
        )
    if payload is None:
        data = obj.get(b"data")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise WireError(MALFORMED_FRAME, "tensor data must be binary")
        offset, nbytes = 0, len(data)
        if not isinstance(data, bytes):
            data = memoryview(data).toreadonly()  # a view must never write into the sender's buffer
    else:
        pointer = obj.get(OOB_KEY)
        if type(pointer) is not list or len(pointer) != 2:
            raise WireError(MALFORMED_FRAME, "out-of-band tensor pointer must be [offset, nbytes]")
        offset, nbytes = pointer
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise WireError(MALFORMED_FRAME, "out-of-band tensor pointer must be [offset, nbytes]")
        if offset + nbytes > len(payload):
            raise WireError(BAD_SHAPE, "out-of-band tensor runs past the end of the frame")
        data = payload
    if nbytes != count * dtype.itemsize:
        raise WireError(BAD_SHAPE, f"{nbytes} data bytes do not match shape {list(shape)} of {dtype.str}")
    # A view at ``offset``: no slice, no copy; read-only because its buffer is (setting
    # ``flags.writeable`` afterwards costs ~5 us per array, more than building the view).
    return np.ndarray(shape, dtype, data, offset)


# The Python types a scalar's data may have, per dtype kind: what ``encode_scalar`` writes, and an
# int for a float. Anything else would be cast (1.5 -> 1 in an int, True -> 1 in a uint8).
_SCALAR_DATA = {"b": (bool,), "i": (int,), "u": (int,), "f": (int, float)}


def _fits(value: bool | int | float, dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds ``value`` as it is: numpy would wrap an out-of-range int (-1 as
    uint8 is 255) and turn a float beyond the dtype's range into inf."""
    if type(value) not in _SCALAR_DATA[dtype.kind]:
        return False
    if dtype.kind in ("i", "u"):
        bounds = np.iinfo(dtype)
        return bounds.min <= value <= bounds.max
    with np.errstate(over="ignore"):  # msgpack's ints fit a float64; in a float16 they may be inf
        return not math.isinf(dtype.type(value)) or math.isinf(value)  # an inf sent is an inf


def decode_scalar(obj: dict[Any, Any]) -> np.generic:
    dtype = check_dtype(obj.get(b"dtype"))
    value = obj.get(b"data")
    if not isinstance(value, bool | int | float):
        raise WireError(MALFORMED_FRAME, "numpy scalar data must be a number")
    if not _fits(value, dtype):
        raise WireError(MALFORMED_FRAME, f"{value!r} does not fit dtype {dtype.str}")
    return dtype.type(value)
