"""``declared_items``: the item count of a msgpack batch body, read from its first bytes."""

from __future__ import annotations

import msgpack
import pytest

from rollserve.server.rollout.batch_peek import declared_items
from rollserve.wire.codec import encode_tensor
from rollserve.wire.msgpack_codec import pack_frame


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65_535, 65_536, 70_000])
def test_the_count_is_read_from_every_array_header(count: int) -> None:
    # fixarray (<16), array 16 (<65,536), array 32: msgpack picks the header by length
    assert declared_items(msgpack.packb({"items": [0] * count})) == count


@pytest.mark.parametrize("extra_keys", [0, 15, 16, 65_536])
def test_the_count_is_read_after_every_map_header(extra_keys: int) -> None:
    # fixmap (<16 keys), map 16, map 32; "items" first as clients write it
    body = {"items": [1, 2, 3]} | {f"k{i}": 0 for i in range(extra_keys)}
    assert declared_items(msgpack.packb(body)) == 3


def test_a_framed_body_is_read_past_its_prefix() -> None:
    data = pack_frame({"items": [{"a": 1}] * 300})
    assert data[:4] == b"RSV1"
    assert declared_items(data) == 300


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb({"other": 1, "items": [0] * 500}),  # items not first: the ordinary path counts
        msgpack.packb({"items": "not a list"}),
        msgpack.packb({"itemz": [0] * 500}),
        msgpack.packb([0] * 500),  # not a map
        msgpack.packb({}),
        b"",
        b"\x81",  # truncated after the map header
        b"\x81\xa5items",  # truncated after the key
        b"\x81\xa5items\xdc\x01",  # array 16 header cut short
        b"\x81\xa5items\xdd\x00\x00\x01",  # array 32 header cut short
        b'{"items": [1, 2, 3]}',  # JSON
        encode_tensor(__import__("numpy").zeros(3)),
    ],
)
def test_anything_else_is_left_to_the_decoder(data: bytes) -> None:
    assert declared_items(data) is None
