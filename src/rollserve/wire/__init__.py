"""The wire layer: one codec (msgpack + tensors + images) and the session-protocol messages.

numpy and msgpack only, so a robot computer can import it without torch or the server stack.
"""

from rollserve.wire.codec import (
    decode_action_chunk,
    decode_message,
    decode_observation,
    decode_tensor,
    encode_action_chunk,
    encode_message,
    encode_observation,
    encode_tensor,
    pack_frame,
    packb,
    unpackb,
)
from rollserve.wire.errors import WireError
from rollserve.wire.limits import WireLimits
from rollserve.wire.messages import (
    ActionChunkMsg,
    CloseAck,
    CloseMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
)

__all__ = [
    "ActionChunkMsg",
    "CloseAck",
    "CloseMsg",
    "ErrorMsg",
    "MsgHeader",
    "ObservationMsg",
    "ResetAck",
    "ResetMsg",
    "SessionAck",
    "SessionOpen",
    "WireError",
    "WireLimits",
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
