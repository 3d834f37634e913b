"""NumPy scalars in a message's number and bool fields go on the wire as their Python values.

A client computes a delay with numpy (``np.ceil(0.149 / 0.1).astype(int)``) or passes
``state_dim=np.int64(8)``: the packer used to send those as ``__npgeneric__`` maps, which the
decoder's int, float and bool rules refused ("must be an int, got dict"). The rules themselves stay:
a bool is not an int, and only a bool is a bool.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollserve.wire import (
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
    WireError,
    decode_message,
    encode_message,
)
from rollserve.wire.errors import BAD_FIELD

STATE = np.arange(4, dtype=np.float32)
CHUNK = np.arange(6, dtype=np.float32).reshape(3, 2)
PY_HEADER = MsgHeader(seq_id=7, episode_id=2, session_epoch=3, client_mono_ns=123456789)
NP_HEADER = MsgHeader(
    schema_version=np.int64(1),
    seq_id=np.int64(7),
    episode_id=np.uint32(2),
    session_epoch=np.int16(3),
    client_mono_ns=np.int64(123456789),
)

# (with Python scalars, the same with numpy scalars); float values are exact in float16/32.
PAIRS: dict[str, tuple[Any, Any]] = {
    "session_open": (
        SessionOpen(state_dim=8, fps=12.5, rtc_enabled=False, schema_version=1),
        SessionOpen(state_dim=np.int64(8), fps=np.float32(12.5), rtc_enabled=np.bool_(False),
                    schema_version=np.int8(1)),
    ),
    "session_ack": (
        SessionAck(accepted=True, session_epoch=2, chunk_size=16, state_dim=8, rtc_supported=True,
                   execution_horizon=5, fps=15.0),
        SessionAck(accepted=np.bool_(True), session_epoch=np.int32(2), chunk_size=np.uint16(16),
                   state_dim=np.int64(8), rtc_supported=np.bool_(True), execution_horizon=np.int8(5),
                   fps=np.float64(15.0)),
    ),
    "observation": (
        ObservationMsg(state=STATE, inference_delay_steps=2, header=PY_HEADER),
        ObservationMsg(state=STATE, inference_delay_steps=np.ceil(0.149 / 0.1).astype(int),
                       jpeg_quality=np.uint8(0), header=NP_HEADER),
    ),
    "action_chunk": (
        ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, inference_delay_steps=3, queue_wait_ms=0.25,
                       inference_ms=1.5, batch_size=2, header=PY_HEADER),
        ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, inference_delay_steps=np.int64(3),
                       queue_wait_ms=np.float32(0.25), inference_ms=np.float16(1.5), batch_size=np.intp(2),
                       header=NP_HEADER),
    ),
    "reset": (ResetMsg(header=PY_HEADER), ResetMsg(header=NP_HEADER)),
    "reset_ack": (
        ResetAck(header=PY_HEADER, session_epoch=4), ResetAck(header=NP_HEADER, session_epoch=np.int64(4))
    ),
    "close": (CloseMsg(header=PY_HEADER), CloseMsg(header=NP_HEADER)),
    "close_ack": (CloseAck(header=PY_HEADER), CloseAck(header=NP_HEADER)),
    "error": (
        ErrorMsg(code="bad_field", message="m", seq_id=7, retryable=True),
        ErrorMsg(code="bad_field", message="m", seq_id=np.int64(7), retryable=np.bool_(True)),
    ),
}  # fmt: skip
# The scalars each decoded message must carry, as Python values of these exact types.
EXPECTED: dict[str, dict[str, Any]] = {
    "session_open": {"state_dim": 8, "fps": 12.5, "rtc_enabled": False, "schema_version": 1},
    "session_ack": {"accepted": True, "session_epoch": 2, "chunk_size": 16, "state_dim": 8,
                    "rtc_supported": True, "execution_horizon": 5, "fps": 15.0},
    "observation": {"inference_delay_steps": 2, "jpeg_quality": 0},
    "action_chunk": {"inference_delay_steps": 3, "queue_wait_ms": 0.25, "inference_ms": 1.5, "batch_size": 2},
    "reset": {}, "reset_ack": {"session_epoch": 4}, "close": {}, "close_ack": {},
    "error": {"seq_id": 7, "retryable": True},
}  # fmt: skip
HEADER_VALUES = {
    "schema_version": 1, "seq_id": 7, "episode_id": 2, "session_epoch": 3, "client_mono_ns": 123456789
}  # fmt: skip

DELAY, EPISODE = "field 'inference_delay_steps'", "field 'header.episode_id'"


def _typed(value: Any) -> tuple[type, Any]:
    return type(value), value


@pytest.mark.parametrize("name", list(PAIRS))
def test_numpy_scalars_encode_as_the_python_values_bytes(name: str) -> None:
    python, numpy = PAIRS[name]
    assert encode_message(numpy) == encode_message(python)


@pytest.mark.parametrize("name", list(PAIRS))
def test_numpy_scalars_decode_as_python_numbers_and_bools(name: str) -> None:
    decoded = decode_message(encode_message(PAIRS[name][1]))
    assert type(decoded) is type(PAIRS[name][0])
    for field, value in EXPECTED[name].items():
        assert _typed(getattr(decoded, field)) == _typed(value), field
    header = getattr(decoded, "header", None)
    if header is not None:
        assert {field: _typed(value) for field, value in vars(header).items()} == {
            field: _typed(value) for field, value in HEADER_VALUES.items()
        }


def test_the_numpy_header_is_left_as_the_caller_made_it() -> None:
    header = MsgHeader(seq_id=np.int64(7))
    encode_message(ResetMsg(header=header))
    assert type(header.seq_id) is np.int64 and header.seq_id == 7


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (ObservationMsg(inference_delay_steps=np.bool_(True)), f"{DELAY} must be an int, got bool"),
        (ObservationMsg(inference_delay_steps=np.float32(2.0)), f"{DELAY} must be an int, got float"),
        (SessionOpen(state_dim=np.bool_(False)), "field 'state_dim' must be an int or nil, got bool"),
        (SessionOpen(rtc_enabled=np.int64(1)), "field 'rtc_enabled' must be a bool, got int"),
        (SessionOpen(fps=np.bool_(True)), "field 'fps' must be a number, got bool"),
        (ResetMsg(header=MsgHeader(seq_id=np.bool_(True))), "field 'header.seq_id' must be an int, got bool"),
        (ResetMsg(header=MsgHeader(episode_id=np.float32(1))), f"{EPISODE} must be an int, got float"),
    ],
    ids=["bool-delay", "float-delay", "bool-state-dim", "int-rtc", "bool-fps", "bool-seq", "float-episode"],
)  # fmt: skip
def test_a_numpy_scalar_of_the_wrong_kind_is_refused_as_its_python_value(message: Any, error: str) -> None:
    with pytest.raises(WireError) as info:
        decode_message(encode_message(message))
    assert (info.value.code, info.value.message) == (BAD_FIELD, error)
