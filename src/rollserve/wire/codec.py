"""Messages <-> bytes. The single entry point every transport and client uses.

``encode_message`` / ``decode_message`` handle any session-protocol message; the typed helpers
(``encode_observation`` ...) are the same codec, narrowed so callers get the type they expect.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np

from rollserve.wire.errors import BAD_FIELD, MALFORMED_FRAME, SCHEMA_VERSION, UNKNOWN_MESSAGE, WireError
from rollserve.wire.images import check_image, encode_image
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
from rollserve.wire.msgpack_codec import pack_frame, packb, unpackb

M = TypeVar("M")

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


def _wire_value(kind: str, value: Any, quality: int) -> Any:
    if kind == "header":
        return {name: getattr(value, name) for name in _HEADER_FIELDS}
    if kind == "images":
        return {name: encode_image(image, quality) for name, image in value.items()}
    if kind in ("array", "opt_array") and value is not None:
        return np.asarray(value)
    return value


def encode_message(msg: Message) -> bytes:
    """One frame for any session-protocol message (out-of-band arrays: decoded without copying)."""
    quality = getattr(msg, "jpeg_quality", 0)
    body: dict[str, Any] = {"type": msg.TYPE}
    for name, kind in msg.WIRE_FIELDS.items():
        body[name] = _wire_value(kind, getattr(msg, name), quality)
    return pack_frame(body)


# -- decoding ----------------------------------------------------------------------------------------
def _bad(name: str, expected: str, value: Any) -> WireError:
    return WireError(BAD_FIELD, f"field {name!r} must be {expected}, got {type(value).__name__}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _header(value: Any) -> MsgHeader:
    if not isinstance(value, dict):
        raise _bad("header", "a map", value)
    fields = {name: value[name] for name in _HEADER_FIELDS if name in value}
    for name, number in fields.items():
        if not _is_int(number):
            raise _bad(f"header.{name}", "an int", number)
    header = MsgHeader(**fields)
    if header.schema_version != CURRENT_SCHEMA:
        raise WireError(SCHEMA_VERSION, f"schema_version {header.schema_version} is not {CURRENT_SCHEMA}")
    return header


def _check(accept: Any, expected: str) -> Any:
    def validate(name: str, value: Any, limits: WireLimits) -> Any:
        if not accept(value):
            raise _bad(name, expected, value)
        return value

    return validate


def _number(name: str, value: Any, limits: WireLimits) -> float:
    if type(value) not in (int, float):
        raise _bad(name, "a number", value)
    return float(value)


def _images(name: str, value: Any, limits: WireLimits) -> dict[str, np.ndarray]:
    if not isinstance(value, dict) or len(value) > limits.max_images:
        raise _bad(name, f"a map of at most {limits.max_images} images", value)
    for cam, image in value.items():
        if not isinstance(cam, str):
            raise _bad(name, "keyed by camera name", cam)
        check_image(image, f"image {cam!r}")
    return value


_FIELD_VALIDATORS: dict[str, Any] = {
    "header": lambda name, value, limits: _header(value),
    "str": _check(lambda v: type(v) is str, "a string"),
    "int": _check(lambda v: type(v) is int, "an int"),
    "opt_int": _check(lambda v: v is None or type(v) is int, "an int or nil"),
    "float": _number,
    "bool": _check(lambda v: type(v) is bool, "a bool"),
    "str_list": _check(lambda v: type(v) is list and all(type(x) is str for x in v), "a list of strings"),
    "int_list": _check(lambda v: type(v) is list and all(type(x) is int for x in v), "a list of ints"),
    "dict": _check(lambda v: type(v) is dict, "a map"),
    "array": _check(lambda v: type(v) is np.ndarray, "a tensor"),
    "opt_array": _check(lambda v: v is None or type(v) is np.ndarray, "a tensor or nil"),
    "images": _images,
}


def decode_message(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Message:
    """Parse and validate one frame; raises :class:`WireError` with a stable code on bad input."""
    body = unpackb(data, limits)
    if not isinstance(body, dict):
        raise WireError(MALFORMED_FRAME, "a message must be a msgpack map")
    message_type = body.get("type")
    cls = MESSAGE_TYPES.get(message_type) if isinstance(message_type, str) else None
    if cls is None:
        raise WireError(UNKNOWN_MESSAGE, f"unknown message type {body.get('type')!r:.40}")
    values = {}
    for name, kind in cls.WIRE_FIELDS.items():
        value = body.get(name)
        if value is None and not kind.startswith("opt_"):
            continue  # absent or nil: the field keeps its default
        values[name] = _FIELD_VALIDATORS[kind](name, value, limits)
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
