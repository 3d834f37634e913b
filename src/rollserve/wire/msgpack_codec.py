"""msgpack with numpy arrays, scalars and images: the one byte format of every rollserve transport.

Two framings, one decoder:

* ``packb``: plain msgpack, arrays inline as ``{__ndarray__, data, dtype, shape}`` maps, exactly
  openpi-client's ``msgpack_numpy`` layout (used at the openpi endpoint and for REST bodies).
* ``pack_frame``: the same message with array bytes moved *out of band* behind a small msgpack
  header (``RSV1`` magic, header length, header, 8-byte aligned payload). Encoding copies each
  payload byte once; decoding builds arrays as views of the received frame, with no copy at all.

``unpackb`` reads both. It never unpickles, refuses object/void/complex dtypes and msgpack
extension types (the Timestamp type -1 too), and enforces :class:`WireLimits` before building
anything, including a budget of objects and containers for the whole document, counted while
unpacking. Image maps are left as maps: they are decoded only where a message expects images.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import msgpack
import numpy as np

from rollserve.wire.errors import BAD_SHAPE, FRAME_TOO_LARGE, MALFORMED_FRAME, TOO_MANY_OBJECTS, WireError
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


# msgpack.packb builds a new Packer (and its 1 MiB buffer) per call, a few microseconds each; one
# reusable Packer per thread (the default hooks run Python code, so threads must not share one).
_packers = threading.local()


class FrameArrays:
    """The out-of-band arrays of one frame being built: each ``add`` returns the array's wire map
    (an ``[offset, nbytes]`` pointer) and queues its bytes, padded to the alignment."""

    __slots__ = ("buffers", "offset")

    def __init__(self) -> None:
        self.buffers: list[Any] = []  # arrays and zero padding, joined once at the end
        self.offset = 0

    def add(self, array: np.ndarray) -> dict[bytes, Any]:
        header, array = encode_array_header(array, self.offset)
        self.buffers.append(array)
        pad = -array.nbytes % _ALIGN
        if pad:
            self.buffers.append(_ZEROS[:pad])
        self.offset += array.nbytes + pad
        return header


def _frame_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _packers.frame_arrays.add(value)
    return _default(value)


def _packer(name: str, default: Any) -> msgpack.Packer:
    packer = getattr(_packers, name, None)
    if packer is None:
        packer = msgpack.Packer(default=default, use_bin_type=True)
        setattr(_packers, name, packer)
    return packer


def packb(obj: Any) -> bytes:
    """Plain msgpack (openpi-client compatible): dicts, lists, str, numbers, bytes, numpy arrays/scalars."""
    return _packer("inline", _default).pack(obj)


def pack_frame(obj: Any, arrays: FrameArrays | None = None) -> bytes:
    """Out-of-band framing: a msgpack header describing the tree, then the raw array bytes.

    ``arrays`` holds arrays the caller already turned into wire maps inside ``obj`` (the typed
    messages' fast path); arrays still in ``obj`` are added as the packer meets them.
    """
    arrays = FrameArrays() if arrays is None else arrays
    _packers.frame_arrays = arrays
    try:
        header = _packer("frame", _frame_default).pack(obj)
    finally:
        _packers.frame_arrays = None
    pad = -(_PREFIX.size + len(header)) % _ALIGN
    return b"".join([_PREFIX.pack(FRAME_MAGIC, len(header)), header, _ZEROS[:pad], *arrays.buffers])


# msgpack turns extension type -1 into a Timestamp itself (ext_hook never sees it): the hooks refuse it.
_TIMESTAMP = msgpack.Timestamp
_TIMESTAMP_REFUSED = "msgpack extension type -1 (timestamp) is not accepted"
_YIELD_EVERY = 0x7FF  # containers between two GIL releases (about a millisecond of unpacking)


def _hooks(limits: WireLimits, size: int, payload: memoryview | None = None):  # type: ignore[no-untyped-def]
    """msgpack's ``object_hook`` and ``list_hook``: they count every container against the
    document's budget (called as each one completes, so unpacking stops at the first one over),
    and turn tensor and scalar maps into arrays. Out-of-band tensor maps point into ``payload``.
    """
    budget = [limits.max_objects, limits.container_budget(size)]  # values, containers left

    def spend(count: int) -> None:
        budget[0] -= count
        budget[1] -= 1
        if not budget[1] & _YIELD_EVERY:
            # A big document is decoded on a worker thread; let the event loop have the GIL now and
            # then instead of waiting out the 5 ms switch interval at every step (GIL convoy).
            time.sleep(0)
        if budget[0] < 0 or budget[1] < 0:
            raise WireError(
                TOO_MANY_OBJECTS,
                f"more than {limits.max_objects} values or {limits.container_budget(size)} maps and lists "
                f"in a {size}-byte document",
            )

    def object_hook(obj: dict[Any, Any]) -> Any:
        spend(2 * len(obj) + 1)
        if NDARRAY_KEY in obj:
            return decode_array(obj, limits, payload if OOB_KEY in obj else None)
        if NPGENERIC_KEY in obj:
            return decode_scalar(obj)
        if _TIMESTAMP in map(type, obj.values()):  # keys are str or bytes (strict_map_key)
            raise WireError(MALFORMED_FRAME, _TIMESTAMP_REFUSED)
        return obj

    def list_hook(obj: list[Any]) -> Any:
        spend(len(obj) + 1)
        if _TIMESTAMP in map(type, obj):
            raise WireError(MALFORMED_FRAME, _TIMESTAMP_REFUSED)
        return obj

    return object_hook, list_hook


def _refuse_ext(code: int, data: bytes) -> Any:
    raise WireError(MALFORMED_FRAME, f"msgpack extension type {code} is not accepted")


def _tensor_hook(limits: WireLimits, payload: memoryview | None):  # type: ignore[no-untyped-def]
    """The ``object_hook`` of a document whose budget cannot run out: tensors and scalars only."""

    def object_hook(obj: dict[Any, Any]) -> Any:
        if NDARRAY_KEY in obj:
            return decode_array(obj, limits, payload if OOB_KEY in obj else None)
        if NPGENERIC_KEY in obj:
            return decode_scalar(obj)
        return obj

    return object_hook


_SMALL_DOCUMENT = 4096  # bytes: a document this small decodes in microseconds, nothing to yield for
_LENGTHS = (4, 8, 12)  # the sizes a Timestamp's data may have


def _may_hold_timestamp(data: bytes) -> bool:
    """Whether ``data`` may spell a Timestamp (extension type -1, a 0xff byte, holding 4, 8 or 12
    bytes: fixext 4 or 8, ext 8/16/32). A match may be data that merely looks like one: that only
    costs the counted path, which refuses real ones."""
    at = data.find(b"\xff")
    while at >= 0:
        if at >= 1 and data[at - 1] in (0xD6, 0xD7):
            return True
        if (
            at >= 2
            and data[at - 1] in _LENGTHS
            and (
                data[at - 2] == 0xC7
                or data[at - 3 : at - 1] == b"\xc8\x00"
                or data[at - 5 : at - 1] == b"\xc9\x00\x00\x00"
            )
        ):
            return True
        at = data.find(b"\xff", at + 1)
    return False


def _budget_cannot_run_out(data: Any, limits: WireLimits, size: int) -> bool:
    """True when counting containers and values while unpacking ``data`` cannot fail, and it
    holds no Timestamp: then the per-container hooks are skipped (a session message's header).

    Every container and every value takes at least one byte, and a value is counted at most twice
    (as an entry of its parent and, being a container, as itself), so ``n`` bytes hold at most
    ``n`` containers and ``2n`` counted values.
    """
    if type(data) is not bytes and not (type(data) is memoryview and data.format == "B" and data.contiguous):
        return False
    n = len(data)
    return (
        n <= _SMALL_DOCUMENT
        and n <= limits.container_budget(size)
        and 2 * n <= limits.max_objects
        and not _may_hold_timestamp(data if type(data) is bytes else bytes(data))
    )


def _unpack(
    data: Any, limits: WireLimits, size: int, payload: memoryview | None = None, tensors: bool = True
) -> Any:
    if not _budget_cannot_run_out(data, limits, size):
        object_hook, list_hook = _hooks(limits, size, payload)
    elif tensors:
        object_hook, list_hook = _tensor_hook(limits, payload), None
    else:
        object_hook = list_hook = None  # the caller turns the tensor maps it expects into arrays
    try:
        value = msgpack.unpackb(
            data,
            object_hook=object_hook,
            list_hook=list_hook,
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
    if type(value) is _TIMESTAMP:
        raise WireError(MALFORMED_FRAME, _TIMESTAMP_REFUSED)
    return value


def _split(data: Any, limits: WireLimits) -> tuple[Any, int, memoryview | None]:
    """The msgpack part of a frame of either framing, the frame's size, and its out-of-band payload."""
    if type(data) is bytes and data[:4] == FRAME_MAGIC and len(data) <= limits.max_frame_bytes:
        # the common case, spelled out: a received frame (bytes are read-only, views of them too)
        header_len = int.from_bytes(data[4:8], "little")
        start = _PREFIX.size + header_len
        if _PREFIX.size <= start <= len(data):
            view = memoryview(data)
            return view[_PREFIX.size : start], len(data), view[start + (-start % _ALIGN) :]
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError(MALFORMED_FRAME, f"expected a binary frame, got {type(data).__name__}")
    size = len(data)
    if size > limits.max_frame_bytes:
        raise WireError(FRAME_TOO_LARGE, f"{size} bytes exceeds the limit of {limits.max_frame_bytes}")
    if bytes(data[:4]) != FRAME_MAGIC:
        return data, size, None
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    size = len(view)
    if size < _PREFIX.size:
        raise WireError(MALFORMED_FRAME, "truncated frame prefix")
    _, header_len = _PREFIX.unpack_from(view)
    start = _PREFIX.size + header_len
    if start > size:
        raise WireError(BAD_SHAPE if header_len else MALFORMED_FRAME, "frame header runs past the frame")
    payload = view[start + (-start % _ALIGN) :].toreadonly()  # arrays viewing it are read-only too
    return view[_PREFIX.size : start], size, payload


def unpackb(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Any:
    """Decode one frame of either framing, or raise :class:`WireError` (never anything else)."""
    document, size, payload = _split(data, limits)
    return _unpack(document, limits, size, payload)


def unpack_message(
    data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS
) -> tuple[Any, memoryview | None]:
    """``unpackb`` for a caller that knows where tensors belong (the typed messages' decoder).

    Returns the document and the frame's out-of-band payload. When the document's budget cannot
    run out, msgpack unpacks it without any Python hook and tensor maps stay maps, for the caller
    to turn into arrays with ``decode_array(map, limits, payload)`` where it expects one (a tensor
    anywhere else is never built). Otherwise tensors come back as arrays, exactly as from ``unpackb``.
    """
    document, size, payload = _split(data, limits)
    return _unpack(document, limits, size, payload, tensors=False), payload
