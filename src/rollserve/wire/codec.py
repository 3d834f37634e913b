"""Messages <-> bytes. The single entry point every transport and client uses.

``encode_message`` / ``decode_message`` handle any session-protocol message; the typed helpers
(``encode_observation`` ...) are the same codec, narrowed so callers get the type they expect.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, TypeVar

import numpy as np

from rollserve.wire.errors import (
    BAD_FIELD,
    MALFORMED_FRAME,
    SCHEMA_VERSION,
    UNKNOWN_MESSAGE,
    WireError,
)
from rollserve.wire.images import check_image_count, decode_images, encode_image
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits
from rollserve.wire.messages import (
    MESSAGE_TYPES,
    ActionChunkMsg,
    Message,
    MsgHeader,
    ObservationMsg,
)
from rollserve.wire.messages import (
    SCHEMA_VERSION as CURRENT_SCHEMA,
)
from rollserve.wire.msgpack_codec import FrameArrays, pack_frame, packb, unpack_message, unpackb
from rollserve.wire.tensors import NDARRAY_KEY, OOB_KEY, decode_array

M = TypeVar("M")
Payload = memoryview | None  # a frame's out-of-band bytes, where its tensor maps point

__all__ = [
    "decode_action_chunk",
    "decode_message",
    "decode_observation",
    "decode_tensor",
    "encode_action_chunk",
    "encode_message",
    "encode_observation",
    "encode_tensor",
    "pack_frame",
    "packb",
    "unpackb",
]


# -- encoding ----------------------------------------------------------------------------------------
_HEADER_FIELDS = tuple(f.name for f in dataclasses.fields(MsgHeader))
_INT_ONLY = {int}
# Field kind -> how encode_message writes it; kinds not listed go as they are. Numbers and bools are
# "scalar": a numpy scalar there goes as its Python value (the decoder takes only those).
_ENCODE_AS = {
    "int": "scalar", "opt_int": "scalar", "float": "scalar", "bool": "scalar",
    "header": "header", "images": "images", "array": "array", "opt_array": "array",
}  # fmt: skip
# Per message class: (field, how it is written), worked out once.
_ENCODE_PLANS: dict[type, tuple[tuple[str, str | None], ...]] = {
    cls: tuple(
        (name, _ENCODE_AS.get(kind))
        for name, kind in cls.WIRE_FIELDS.items()  # type: ignore[attr-defined]
    )
    for cls in MESSAGE_TYPES.values()
}


def _plain_header(header: MsgHeader) -> dict[str, Any]:
    """The header's fields, numpy scalars as their Python values (``np.int64(3)`` -> ``3``).

    The packer would send a numpy scalar as a ``__npgeneric__`` map, which the decoder's int rule
    refuses; its Python value keeps that rule (a ``np.bool_`` is still a bool, not an int).
    """
    fields = vars(header)  # a plain dataclass: its __dict__ is exactly its fields
    if _INT_ONLY.issuperset(map(type, fields.values())):
        return fields  # what every caller sends: no copy
    return {name: value.item() if isinstance(value, np.generic) else value for name, value in fields.items()}


def encode_message(msg: Message) -> bytes:
    """One frame for any session-protocol message (out-of-band arrays: decoded without copying).

    Arrays become their wire maps here, in field order, so the packer needs no Python callback for
    them; the bytes are those of packing the message tree with arrays in place (pinned by a test).
    """
    arrays = FrameArrays()
    body: dict[str, Any] = {"type": msg.TYPE}
    for name, kind in _ENCODE_PLANS[type(msg)]:
        value = getattr(msg, name)
        if kind is None:
            body[name] = value
        elif kind == "scalar":  # a numpy scalar as its Python value, as in _plain_header
            body[name] = value.item() if isinstance(value, np.generic) else value
        elif kind == "header":
            body[name] = _plain_header(value)
        elif kind == "images":
            quality = msg.jpeg_quality  # type: ignore[union-attr]
            body[name] = {cam: encode_image(image, quality, arrays.add) for cam, image in value.items()}
        else:
            body[name] = None if value is None else arrays.add(np.asarray(value))
    return pack_frame(body, arrays)


# -- decoding ----------------------------------------------------------------------------------------
def _bad(name: str, expected: str, value: Any) -> WireError:
    return WireError(BAD_FIELD, f"field {name!r} must be {expected}, got {type(value).__name__}")


def _header(field: str, value: Any, limits: WireLimits, payload: Payload) -> MsgHeader:
    if type(value) is not dict:
        raise _bad(field, "a map", value)
    if tuple(value) == _HEADER_FIELDS and set(map(type, value.values())) == _INT_ONLY:
        header = MsgHeader(*value.values())  # what our own encoder sends: every field, in order
    else:
        fields = {name: value[name] for name in _HEADER_FIELDS if name in value}
        for name, number in fields.items():
            if type(number) is not int:  # bool is not an int here
                raise _bad(f"{field}.{name}", "an int", number)
        header = MsgHeader(**fields)
    if header.schema_version != CURRENT_SCHEMA:
        raise WireError(SCHEMA_VERSION, f"schema_version {header.schema_version} is not {CURRENT_SCHEMA}")
    return header


def _number(name: str, value: Any, limits: WireLimits, payload: Payload) -> float:
    if type(value) not in (int, float):
        raise _bad(name, "a number", value)
    if not math.isfinite(value):
        raise WireError(BAD_FIELD, f"field {name!r} must be finite, got {value}")
    return float(value)


# The converters are module functions, not closures made per rule: the rule table is built at
# import, where a closure's body could not be reached by mutation testing (tools/mutation.py).
def _capped_str(name: str, value: Any, cap: int) -> str:
    """A string of at most ``cap`` characters: client-chosen text stays small."""
    if type(value) is not str:
        raise _bad(name, "a string", value)
    if len(value) > cap:
        raise WireError(BAD_FIELD, f"field {name!r} is longer than {cap} characters")
    return value


def _name(name: str, value: Any, limits: WireLimits, payload: Payload) -> str:
    return _capped_str(name, value, limits.max_name_chars)


def _task(name: str, value: Any, limits: WireLimits, payload: Payload) -> str:
    return _capped_str(name, value, limits.max_task_chars)


def _names(name: str, value: Any, limits: WireLimits, payload: Payload) -> list[str]:
    if type(value) is not list or not all(type(x) is str for x in value):
        raise _bad(name, "a list of strings", value)
    if len(value) > limits.max_names or any(len(x) > limits.max_name_chars for x in value):
        raise WireError(
            BAD_FIELD,
            f"field {name!r} takes at most {limits.max_names} names of {limits.max_name_chars} characters",
        )
    return value


def _list_of(name: str, value: Any, item_type: type, expected: str) -> list[Any]:
    if type(value) is not list or not all(type(x) is item_type for x in value):
        raise _bad(name, expected, value)
    return value


def _str_list(name: str, value: Any, limits: WireLimits, payload: Payload) -> list[str]:
    return _list_of(name, value, str, "a list of strings")


def _int_list(name: str, value: Any, limits: WireLimits, payload: Payload) -> list[int]:
    return _list_of(name, value, int, "a list of ints")


def _tensor(
    name: str, value: Any, limits: WireLimits, payload: Payload, expected: str, nil_allowed: bool
) -> np.ndarray | None:
    """A tensor field: a tensor map (unpacked without hooks) becomes a view of the frame here."""
    if type(value) is dict and NDARRAY_KEY in value:
        return decode_array(value, limits, payload if OOB_KEY in value else None)
    if type(value) is np.ndarray or (value is None and nil_allowed):
        return value
    raise _bad(name, expected, value)


def _array(name: str, value: Any, limits: WireLimits, payload: Payload) -> np.ndarray | None:
    return _tensor(name, value, limits, payload, "a tensor", False)


def _opt_array(name: str, value: Any, limits: WireLimits, payload: Payload) -> np.ndarray | None:
    return _tensor(name, value, limits, payload, "a tensor or nil", True)


def _images(name: str, value: Any, limits: WireLimits, payload: Payload) -> dict[str, np.ndarray]:
    if not isinstance(value, dict):
        raise _bad(name, "a map of camera name to image", value)
    check_image_count(value, limits, name)  # before the loop: no image of too many is decoded
    for cam, image in value.items():  # tensor maps left as maps by unpack_message become arrays
        if type(image) is dict:
            if NDARRAY_KEY in image:
                value[cam] = decode_array(image, limits, payload if OOB_KEY in image else None)
                continue
            pixels = image.get(b"pixels")
            if type(pixels) is dict and NDARRAY_KEY in pixels:
                image[b"pixels"] = decode_array(pixels, limits, payload if OOB_KEY in pixels else None)
    return decode_images(value, limits, name)


class _Rule(NamedTuple):
    """How one field kind is checked: by exact type (the common case, no call), else by ``convert``."""

    types: tuple[type, ...] = ()
    expected: str = ""
    convert: Any = None


_RULES: dict[str, _Rule] = {
    "header": _Rule(convert=_header),
    "str": _Rule((str,), "a string"),
    "name": _Rule(convert=_name),
    "task": _Rule(convert=_task),
    "name_list": _Rule(convert=_names),
    "int": _Rule((int,), "an int"),
    "opt_int": _Rule((int, type(None)), "an int or nil"),
    "float": _Rule(convert=_number),
    "bool": _Rule((bool,), "a bool"),
    "str_list": _Rule(convert=_str_list),
    "int_list": _Rule(convert=_int_list),
    "dict": _Rule((dict,), "a map"),
    "array": _Rule(convert=_array),
    "opt_array": _Rule(convert=_opt_array),
    "images": _Rule(convert=_images),
}
# Per message class: (field, nil allowed, convert, types, expected), worked out once instead of
# on every frame (plain tuples: a named tuple's attributes cost a lookup each).
_DECODE_PLANS: dict[type, tuple[tuple[str, bool, Any, tuple[type, ...], str], ...]] = {
    cls: tuple(
        (name, kind.startswith("opt_"), *_RULES[kind][2:], *_RULES[kind][:2])
        for name, kind in cls.WIRE_FIELDS.items()  # type: ignore[attr-defined]
    )
    for cls in MESSAGE_TYPES.values()
}


# Classes with a free-form map field: a tensor may sit anywhere in it, so they unpack with hooks.
_UNPACK_WITH_HOOKS = frozenset(
    cls
    for cls in MESSAGE_TYPES.values()
    if "dict" in cls.WIRE_FIELDS.values()  # type: ignore[attr-defined]
)


def decode_message(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Message:
    """Parse and validate one frame; raises :class:`WireError` with a stable code on bad input."""
    body, payload = unpack_message(data, limits)
    if not isinstance(body, dict):
        raise WireError(MALFORMED_FRAME, "a message must be a msgpack map")
    message_type = body.get("type")
    cls = MESSAGE_TYPES.get(message_type) if isinstance(message_type, str) else None
    if cls is None:
        raise WireError(UNKNOWN_MESSAGE, f"unknown message type {body.get('type')!r:.40}")
    if cls in _UNPACK_WITH_HOOKS:
        body = unpackb(data, limits)  # rare (once per session): every tensor in it becomes an array
    values = {}
    for name, nil_allowed, convert, types, expected in _DECODE_PLANS[cls]:
        value = body.get(name)
        if value is None and not nil_allowed:
            continue  # absent or nil: the field keeps its default
        if convert is not None:
            value = convert(name, value, limits, payload)
        elif type(value) not in types:
            raise _bad(name, expected, value)
        values[name] = value
    return cls(**values)


def _decode_as(data: bytes, cls: type[M], limits: WireLimits) -> M:
    msg = decode_message(data, limits)
    if not isinstance(msg, cls):
        raise WireError(UNKNOWN_MESSAGE, f"expected {cls.TYPE!r}, got {msg.TYPE!r}")  # type: ignore[attr-defined]
    return msg


def encode_observation(msg: ObservationMsg) -> bytes:
    return encode_message(msg)


def decode_observation(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> ObservationMsg:
    return _decode_as(data, ObservationMsg, limits)


def encode_action_chunk(msg: ActionChunkMsg) -> bytes:
    return encode_message(msg)


def decode_action_chunk(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> ActionChunkMsg:
    return _decode_as(data, ActionChunkMsg, limits)


def encode_tensor(array: np.ndarray) -> bytes:
    """A lone tensor as one frame (handy for tests and benchmarks)."""
    return pack_frame(np.asarray(array))


def decode_tensor(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> np.ndarray:
    value = unpackb(data, limits)
    if not isinstance(value, np.ndarray):
        raise WireError(MALFORMED_FRAME, "frame does not hold a tensor")
    return value
