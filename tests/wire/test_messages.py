"""Session-protocol messages: every type round-trips, and garbage never escapes as anything but WireError."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    WireLimits,
    decode_action_chunk,
    decode_message,
    decode_observation,
    encode_action_chunk,
    encode_message,
    encode_observation,
    packb,
)
from rollserve.wire.errors import BAD_FIELD, FRAME_TOO_LARGE, SCHEMA_VERSION, UNKNOWN_MESSAGE

HEADER = MsgHeader(seq_id=7, episode_id=2, session_epoch=3, client_mono_ns=123456789)


def _observation(quality: int = 0) -> ObservationMsg:
    rng = np.random.default_rng(3)
    return ObservationMsg(
        header=HEADER,
        state=rng.standard_normal(8).astype(np.float32),
        images={"exterior": rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)},
        task="push the cube",
        inference_delay_steps=2,
        prefix_model=rng.standard_normal((10, 8)).astype(np.float32),
        prefix_robot=rng.standard_normal((10, 8)).astype(np.float32),
        jpeg_quality=quality,
    )


def test_observation_round_trip_is_byte_exact_with_raw_images() -> None:
    original = _observation()
    decoded = decode_observation(encode_observation(original))
    assert decoded.header == HEADER
    assert decoded.task == original.task
    assert decoded.inference_delay_steps == 2
    for name in ("state", "prefix_model", "prefix_robot"):
        assert getattr(decoded, name).dtype == np.float32
        assert getattr(decoded, name).tobytes() == getattr(original, name).tobytes()
    assert np.array_equal(decoded.images["exterior"], original.images["exterior"])


def test_observation_without_prefix_keeps_none() -> None:
    decoded = decode_observation(encode_observation(ObservationMsg(state=np.zeros(3, np.float32))))
    assert decoded.prefix_model is None and decoded.prefix_robot is None and decoded.images == {}


def test_action_chunk_round_trip_is_byte_exact() -> None:
    rng = np.random.default_rng(5)
    chunk = ActionChunkMsg(
        header=HEADER,
        chunk_model=rng.standard_normal((50, 8)).astype(np.float32),
        chunk_robot=rng.standard_normal((50, 8)).astype(np.float32),
        inference_delay_steps=3,
        queue_wait_ms=0.25,
        inference_ms=12.5,
        batch_size=4,
        superseded_seq_ids=[5, 6],
    )
    decoded = decode_action_chunk(encode_action_chunk(chunk))
    assert decoded.chunk_model.tobytes() == chunk.chunk_model.tobytes()
    assert decoded.chunk_robot.tobytes() == chunk.chunk_robot.tobytes()
    assert (decoded.header, decoded.superseded_seq_ids, decoded.batch_size) == (HEADER, [5, 6], 4)
    assert decoded.inference_ms == 12.5 and decoded.queue_wait_ms == 0.25


@pytest.mark.parametrize(
    "message",
    [
        SessionOpen(
            client_uuid="u1", robot_type="panda", action_names=["a", "b"], camera_names=["wrist"], state_dim=8
        ),
        SessionAck(
            accepted=True, session_id="s", chunk_size=16, action_names=["a"], server_load={"sessions": 1}
        ),
        ResetMsg(header=HEADER),
        ResetAck(header=HEADER, session_epoch=4),
        CloseMsg(header=HEADER),
        CloseAck(header=HEADER),
        ErrorMsg(code="bad_field", message="state has 3 values, expected 8", seq_id=7, retryable=False),
    ],
    ids=lambda m: m.TYPE,
)
def test_control_messages_round_trip(message: object) -> None:
    assert decode_message(encode_message(message)) == message  # type: ignore[arg-type]


def test_wrong_message_type_is_reported() -> None:
    with pytest.raises(WireError) as info:
        decode_observation(encode_message(CloseMsg()))
    assert info.value.code == UNKNOWN_MESSAGE


def test_field_types_are_validated() -> None:
    frame = packb({"type": "observation", "inference_delay_steps": "three"})
    with pytest.raises(WireError) as info:
        decode_message(frame)
    assert info.value.code == BAD_FIELD


def test_future_schema_versions_are_refused() -> None:
    frame = packb({"type": "observation", "header": {"schema_version": 99, "seq_id": 1}})
    with pytest.raises(WireError) as info:
        decode_message(frame)
    assert info.value.code == SCHEMA_VERSION


def test_frames_over_the_limit_are_refused_before_parsing() -> None:
    frame = encode_observation(_observation())
    with pytest.raises(WireError) as info:
        decode_message(frame, WireLimits(max_frame_bytes=len(frame) - 1))
    assert info.value.code == FRAME_TOO_LARGE


@settings(max_examples=300)
@given(st.binary(max_size=256) | st.binary(max_size=256).map(lambda tail: b"RSV1" + tail))
def test_random_bytes_only_raise_wire_errors(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_message(data)


_KEYS = ["type", "header", "state", "images", "task", b"__ndarray__", b"dtype", b"shape", b"data", b"oob",
         b"__image__", b"format"]  # fmt: skip
_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
_msgpack_values = st.recursive(
    _scalars | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=5),
    max_leaves=12,
)


@settings(max_examples=300)
@given(
    st.one_of(
        _msgpack_values, st.fixed_dictionaries({"type": st.sampled_from(["observation", "session_open"])})
    )
)
def test_random_structures_only_raise_wire_errors(value: object) -> None:
    with contextlib.suppress(WireError):
        decode_message(msgpack.packb(value, use_bin_type=True))


def test_fields_a_message_does_not_have_are_ignored_so_older_clients_keep_working() -> None:
    """``episode_start`` was sent by older clients and never read; it is gone, and frames carrying it
    (or any other unknown field) still decode."""
    frame = packb({"type": "observation", "state": np.ones(3, np.float32), "episode_start": True, "x": 1})
    decoded = decode_observation(frame)
    assert decoded.state is not None and decoded.state.tolist() == [1.0, 1.0, 1.0]
    assert not hasattr(decoded, "episode_start")
