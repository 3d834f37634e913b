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

import numpy as np

from rollserve.wire import ActionChunkMsg, MsgHeader, ObservationMsg, encode_message
from rollserve.wire.codec import decode_action_chunk, decode_observation, pack_frame, packb
from rollserve.wire.images import encode_image


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
