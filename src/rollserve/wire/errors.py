"""Typed wire errors: every rejection of bad input names a stable code a client can branch on."""

from __future__ import annotations

# Codes a client may see. Stable strings: part of the protocol.
FRAME_TOO_LARGE = "frame_too_large"
MALFORMED_FRAME = "malformed_frame"
UNSUPPORTED_DTYPE = "unsupported_dtype"
BAD_SHAPE = "bad_shape"
TOO_MANY_ELEMENTS = "too_many_elements"
BAD_IMAGE = "bad_image"
IMAGE_TOO_LARGE = "image_too_large"
UNKNOWN_MESSAGE = "unknown_message"
BAD_FIELD = "bad_field"
SCHEMA_VERSION = "unsupported_schema_version"
TOO_MANY_OBJECTS = "too_many_objects"  # a document above its object or container budget


class WireError(ValueError):
    """Input that cannot be decoded or violates a limit. Safe to show to the client: no internals."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
