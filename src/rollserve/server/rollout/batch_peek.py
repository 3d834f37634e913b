"""How many items a msgpack ``batch_step`` body declares, read before anything is unpacked.

Refusing a 10,000-item batch used to cost a full decode (about 30,000 maps through the document
budget's hooks, ~30 ms of CPU holding the GIL) before its "at most N items" answer. A client
writes ``{"items": [...]}`` with ``items`` first, so the count is in the array header right after
the key: a few bytes. Any other layout returns None and takes the ordinary path (decoded with the
budget, then counted), so this can only answer sooner, never differently.
"""

from __future__ import annotations

from rollserve.wire.msgpack_codec import FRAME_MAGIC

_ITEMS_KEY = b"\xa5items"  # fixstr of length 5
_FRAME_PREFIX = 8  # magic + header length (the out-of-band framing, wire/msgpack_codec.py)


def declared_items(data: bytes) -> int | None:
    """The length of the ``items`` array of a msgpack map that opens with that key, else None."""
    start = _FRAME_PREFIX if data[:4] == FRAME_MAGIC else 0
    first = data[start] if len(data) > start else -1
    if 0x81 <= first <= 0x8F:  # fixmap
        at = start + 1
    elif first == 0xDE:  # map 16
        at = start + 3
    elif first == 0xDF:  # map 32
        at = start + 5
    else:
        return None
    if data[at : at + len(_ITEMS_KEY)] != _ITEMS_KEY:
        return None
    at += len(_ITEMS_KEY)
    tag = data[at] if len(data) > at else -1
    if 0x90 <= tag <= 0x9F:  # fixarray
        return tag & 0x0F
    if tag == 0xDC:  # array 16
        return int.from_bytes(data[at + 1 : at + 3], "big") if len(data) >= at + 3 else None
    if tag == 0xDD:  # array 32
        return int.from_bytes(data[at + 1 : at + 5], "big") if len(data) >= at + 5 else None
    return None
