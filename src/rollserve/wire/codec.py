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
    SCHEMA_VERSION as CURRENT_SCHEMA,
    ActionChunkMsg,
    Message,
    MsgHeader,
    ObservationMsg,
)
from rollserve.wire.msgpack_codec import packb, unpackb

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
    "packb",
    "unpackb",
]


# -- encoding ----------------------------------------------------------------------------------------
def _wire_value(kind: str, value: Any, quality: int) -> Any:
    if kind == "header":
        return dataclasses.asdict(value)
    if kind == "images":
        return {name: encode_image(image, quality) for name, image in value.items()}
    if kind in ("array", "opt_array") and value is not None:
        return np.asarray(value)
    return value


def encode_message(msg: Message) -> bytes:
    """One frame for any session-protocol message."""
    quality = getattr(msg, "jpeg_quality", 0)
    body: dict[str, Any] = {"type": msg.TYPE}
    for name, kind in msg.WIRE_FIELDS.items():
        body[name] = _wire_value(kind, getattr(msg, name), quality)
    return packb(body)


# -- decoding ----------------------------------------------------------------------------------------
def _bad(name: str, expected: str, value: Any) -> WireError:
    return WireError(BAD_FIELD, f"field {name!r} must be {expected}, got {type(value).__name__}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _header(value: Any) -> MsgHeader:
    if not isinstance(value, dict):
        raise _bad("header", "a map", value)
    fields = {}
    for f in dataclasses.fields(MsgHeader):
        if f.name in value:
            if not _is_int(value[f.name]):
                raise _bad(f"header.{f.name}", "an int", value[f.name])
            fields[f.name] = value[f.name]
    header = MsgHeader(**fields)
    if header.schema_version != CURRENT_SCHEMA:
        raise WireError(SCHEMA_VERSION, f"schema_version {header.schema_version} is not {CURRENT_SCHEMA}")
    return header


def _field_value(name: str, kind: str, value: Any, limits: WireLimits) -> Any:  # noqa: C901
    if kind == "header":
        return _header(value)
    if kind == "str":
        if not isinstance(value, str):
            raise _bad(name, "a string", value)
    elif kind == "int":
        if not _is_int(value):
            raise _bad(name, "an int", value)
    elif kind == "opt_int":
        if value is not None and not _is_int(value):
            raise _bad(name, "an int or nil", value)
    elif kind == "float":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _bad(name, "a number", value)
        value = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _bad(name, "a bool", value)
    elif kind in ("str_list", "int_list"):
        check = (lambda v: isinstance(v, str)) if kind == "str_list" else _is_int
        if not isinstance(value, list) or not all(check(v) for v in value):
            raise _bad(name, "a list of " + ("strings" if kind == "str_list" else "ints"), value)
    elif kind == "dict":
        if not isinstance(value, dict):
            raise _bad(name, "a map", value)
    elif kind in ("array", "opt_array"):
        if not (isinstance(value, np.ndarray) or (kind == "opt_array" and value is None)):
            raise _bad(name, "a tensor", value)
    elif kind == "images":
        if not isinstance(value, dict) or len(value) > limits.max_images:
            raise _bad(name, f"a map of at most {limits.max_images} images", value)
        for cam, image in value.items():
            if not isinstance(cam, str):
                raise _bad(name, "keyed by camera name", cam)
            check_image(image, f"image {cam!r}")
    return value


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
        values[name] = _field_value(name, kind, value, limits)
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
    return packb(np.asarray(array))


def decode_tensor(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> np.ndarray:
    value = unpackb(data, limits)
    if not isinstance(value, np.ndarray):
        raise WireError(MALFORMED_FRAME, "frame does not hold a tensor")
    return value
