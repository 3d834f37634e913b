"""The typed messages' encoding fast path writes exactly the bytes of the general path.

The general path packs the message tree with arrays in place and lets the packer's hook turn each
array into its wire map; the fast path turns them into wire maps first. Both must give one byte
string, and that string must not change between releases (clients decode by it), so a digest taken
from the codec before the fast path existed is pinned here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any
from unittest import mock

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollserve.wire import ActionChunkMsg, MsgHeader, ObservationMsg, encode_message, msgpack_codec
from rollserve.wire.codec import (
    decode_action_chunk,
    decode_message,
    decode_observation,
    pack_frame,
    packb,
    unpackb,
)
from rollserve.wire.errors import MALFORMED_FRAME, TOO_MANY_OBJECTS, WireError
from rollserve.wire.images import encode_image
from rollserve.wire.limits import DEFAULT_LIMITS, WireLimits


def _chunk_message() -> ActionChunkMsg:
    chunk = (np.arange(400, dtype=np.float32).reshape(50, 8) / 7).astype(np.float32)
    return ActionChunkMsg(
        chunk_model=chunk,
        chunk_robot=chunk[:, :7].copy(),
        inference_delay_steps=3,
        queue_wait_ms=0.25,
        inference_ms=1.5,
        batch_size=2,
        superseded_seq_ids=[4, 5],
        header=MsgHeader(seq_id=9, episode_id=2, session_epoch=1, client_mono_ns=123456789),
    )


def _observation_message() -> ObservationMsg:
    image = (np.arange(4 * 5 * 3) % 251).astype(np.uint8).reshape(4, 5, 3)
    return ObservationMsg(
        state=np.arange(8, dtype=np.float32),
        images={"a": image, "b": image[::-1]},  # the second one is not C-contiguous
        task="t",
        prefix_model=_chunk_message().chunk_model[:3],
        header=MsgHeader(seq_id=1),
    )


def _general_path(msg: Any) -> bytes:
    """The tree with arrays (and raw image pixels) in place; pack_frame's hook encodes them."""
    body: dict[str, Any] = {"type": msg.TYPE}
    for name, kind in msg.WIRE_FIELDS.items():
        value = getattr(msg, name)
        if kind == "header":
            value = dataclasses.asdict(value)
        elif kind == "images":
            value = {cam: encode_image(image, msg.jpeg_quality) for cam, image in value.items()}
        body[name] = value
    return pack_frame(body)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_action_chunk_fast_path_writes_the_general_paths_bytes() -> None:
    msg = _chunk_message()
    fast = encode_message(msg)
    assert fast == _general_path(msg)
    assert (len(fast), _sha256(fast)) == (
        3328,
        "0aa17795c8e76af033ced165e107852681127eab6f6d4438bc658bb762238b3d",
    )  # taken from the codec before the fast path
    decoded = decode_action_chunk(fast)
    assert decoded.chunk_robot.tobytes() == msg.chunk_robot.tobytes()
    assert decoded.superseded_seq_ids == [4, 5]


def test_observation_fast_path_writes_the_general_paths_bytes() -> None:
    msg = _observation_message()
    fast = encode_message(msg)
    assert fast == _general_path(msg)
    assert (len(fast), _sha256(fast)) == (
        696,
        "1dc51c8223acfe48062b68a15d07c62ab9ac73eb96e7997199a7deaed831477b",
    )
    decoded = decode_observation(fast)
    assert decoded.images["b"].tobytes() == msg.images["b"].tobytes()


def test_inline_reply_bytes_are_pinned() -> None:
    """The openpi endpoint's ``__ndarray__`` reply, packed by the reused per-thread packer."""
    chunk = _chunk_message().chunk_model
    data = packb({"actions": chunk, "server_timing": {"infer_ms": 0.5}})
    assert (len(data), _sha256(data)) == (
        1687,
        "296d0f93acfb5cbe30281b6bf52a783a48247cb1a6cc2271a9aa09ef14de2097",
    )


def test_a_failed_encode_leaves_the_reused_packer_clean() -> None:
    msg = _chunk_message()
    expected = encode_message(msg)
    bad = dataclasses.replace(msg, superseded_seq_ids=[object()])
    try:
        encode_message(bad)
    except TypeError:
        pass
    else:  # pragma: no cover - the assertion below explains
        raise AssertionError("an object() must not be encodable")
    assert encode_message(msg) == expected
    assert packb({"a": 1}) == b"\x81\xa1a\x01"


def test_threads_encoding_at_once_each_get_their_own_bytes() -> None:
    """Packers are reused per thread: concurrent encodes must not interleave their buffers."""
    messages = [dataclasses.replace(_chunk_message(), batch_size=i) for i in range(8)]
    expected = [_general_path(m) for m in messages]
    failures: list[int] = []

    def work(i: int) -> None:
        for _ in range(200):
            if encode_message(messages[i]) != expected[i]:
                failures.append(i)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# -- decoding: a small document skips the per-container budget hooks ----------------------------------
_TIMESTAMP_SPELLINGS = [
    msgpack.packb(msgpack.Timestamp(1, 0)),  # fixext 4
    msgpack.packb(msgpack.Timestamp(1, 5)),  # fixext 8
    msgpack.packb(msgpack.Timestamp(2**40, 5)),  # ext 8, 12 bytes
    b"\xc7\x04\xff" + bytes(4),  # ext 8 holding 4 bytes
    b"\xc8\x00\x08\xff" + bytes(8),  # ext 16 holding 8 bytes
    b"\xc9\x00\x00\x00\x0c\xff" + bytes(12),  # ext 32 holding 12 bytes
]


@pytest.mark.parametrize("timestamp", _TIMESTAMP_SPELLINGS)
def test_every_spelling_of_a_timestamp_takes_the_counted_path_and_is_refused(timestamp: bytes) -> None:
    document = b"\x82\xa1a\x01\xa1b" + timestamp  # {"a": 1, "b": <timestamp>}
    assert not msgpack_codec._budget_cannot_run_out(document, DEFAULT_LIMITS, len(document))
    with pytest.raises(WireError) as info:
        unpackb(document)
    assert info.value.code == MALFORMED_FRAME
    frame = msgpack_codec.FRAME_MAGIC + len(document).to_bytes(4, "little") + document
    with pytest.raises(WireError):
        unpackb(frame)


def test_only_documents_whose_budget_cannot_run_out_skip_counting() -> None:
    small = packb({"a": [1, 2, 3]})
    assert msgpack_codec._budget_cannot_run_out(small, DEFAULT_LIMITS, len(small))
    large = packb([{}] * 3000)  # 3,000 containers in 3,003 bytes: over the floor of 1,024
    assert not msgpack_codec._budget_cannot_run_out(large, DEFAULT_LIMITS, len(large))
    tight = WireLimits(container_floor=2, bytes_per_container=10**9)  # 2 containers allowed
    nested = packb([[], []])  # 3 containers in 3 bytes
    assert not msgpack_codec._budget_cannot_run_out(nested, tight, len(nested))
    with pytest.raises(WireError) as info:
        unpackb(nested, tight)
    assert info.value.code == TOO_MANY_OBJECTS
    few_values = WireLimits(max_objects=3)
    assert not msgpack_codec._budget_cannot_run_out(small, few_values, len(small))


def test_the_session_messages_take_the_uncounted_path() -> None:
    frame = encode_message(_chunk_message())
    header_len = int.from_bytes(frame[4:8], "little")
    header = memoryview(frame)[8 : 8 + header_len]
    assert msgpack_codec._budget_cannot_run_out(header, DEFAULT_LIMITS, len(frame))


_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.builds(msgpack.Timestamp, st.integers(0, 2**34), st.integers(0, 999_999_999))
)
_documents = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=4) | st.binary(max_size=4), inner, max_size=5)
    ),
    max_leaves=30,
)


def _outcome(data: bytes, limits: WireLimits) -> Any:
    try:
        return ("value", unpackb(data, limits))
    except WireError as exc:
        return ("error", exc.code)


@settings(max_examples=300, deadline=None)
@given(_documents, st.sampled_from([DEFAULT_LIMITS, WireLimits(container_floor=3, max_objects=12)]))
def test_skipping_the_count_never_changes_what_a_document_decodes_to(
    document: Any, limits: WireLimits
) -> None:
    data = msgpack.packb(document, use_bin_type=True)
    fast = _outcome(data, limits)
    counted_only = mock.patch.object(msgpack_codec, "_budget_cannot_run_out", lambda *args: False)
    with counted_only:
        counted = _outcome(data, limits)
    assert fast == counted


# -- decoding typed messages: tensor maps left as maps become arrays where the message expects them -------
def _plain(value: Any) -> Any:
    """Something ``==`` compares: arrays as (dtype, shape, bytes, writeable), recursively."""
    if isinstance(value, np.ndarray | np.generic):
        return (type(value).__name__, value.dtype.str, value.shape, value.tobytes(), value.flags.writeable)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value):
        return _plain(vars(value))
    return value


def _decoded_both_ways(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> tuple[Any, Any]:
    """What ``decode_message`` gives (or which error code) on its hook-free path and on the counted one."""

    def outcome() -> Any:
        try:
            msg = decode_message(data, limits)
        except WireError as exc:
            return ("error", exc.code)
        return ("value", type(msg).__name__, _plain(vars(msg)))

    fast = outcome()
    with mock.patch.object(msgpack_codec, "_budget_cannot_run_out", lambda *args: False):
        counted = outcome()
    return fast, counted


def _tensor_map(
    shape: tuple[int, ...] = (2,), data: bytes = bytes(8), dtype: str = "<f4"
) -> dict[bytes, Any]:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": list(shape)}


_image_tensor = _tensor_map((2, 2, 3), bytes(range(12)), "|u1")
_TYPED_DOCUMENTS = {
    "chunk": encode_message(_chunk_message()),
    "observation, out of band": encode_message(_observation_message()),
    "observation, inline tensors": packb(
        {
            "type": "observation",
            "state": _tensor_map(),
            "images": {
                "a": {b"__image__": True, b"format": "raw", b"pixels": _image_tensor},
                "b": _image_tensor,
            },
        }  # an image may also be a bare tensor
    ),
    "a bad tensor where a tensor belongs": packb(
        {"type": "observation", "state": _tensor_map(data=bytes(4))}
    ),
    "a bad pointer": encode_message(_chunk_message()).replace(  # [0, 1600] -> [0, 65535]: past the end
        b"\x03oob\x92\x00\xcd\x06\x40", b"\x03oob\x92\x00\xcd\xff\xff"
    ),
    "a bad raw image": packb(
        {
            "type": "observation",
            "images": {"a": {b"__image__": True, b"format": "raw", b"pixels": _tensor_map()}},
        }
    ),
    "a tensor where a string belongs": packb({"type": "observation", "task": _tensor_map()}),
    "a free-form map holding tensors": packb(
        {"type": "session_ack", "accepted": True, "policy": {"norm": _tensor_map(), "scale": np.float32(2)}}
    ),
}


@pytest.mark.parametrize("name", list(_TYPED_DOCUMENTS))
def test_typed_decoding_without_hooks_matches_the_counted_path(name: str) -> None:
    fast, counted = _decoded_both_ways(_TYPED_DOCUMENTS[name])
    assert fast == counted
    assert fast[0] == ("error" if name.startswith("a bad") or "string" in name else "value")


def test_the_bad_pointer_document_differs_from_the_message() -> None:
    assert _TYPED_DOCUMENTS["a bad pointer"] != _TYPED_DOCUMENTS["chunk"]


def test_a_free_form_map_keeps_its_tensors_as_arrays() -> None:
    ack = decode_message(_TYPED_DOCUMENTS["a free-form map holding tensors"])
    assert isinstance(ack.policy["norm"], np.ndarray) and ack.policy["scale"] == np.float32(2)
