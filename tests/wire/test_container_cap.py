"""A big document of empty containers is refused after a bounded number of them, whatever its
size (issue 8: "no request may block other clients for more than a few tens of milliseconds").

Each map or list costs a Python call while unpacking; the size-scaled budget alone let an 8 MB
frame of empty maps run about 500,000 of them before its refusal. Counted here by wrapping the
unpacker's hooks, never by timing.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rollserve.wire import WireError, WireLimits, msgpack_codec
from rollserve.wire.errors import TOO_MANY_OBJECTS
from rollserve.wire.msgpack_codec import unpackb


def _nested_empty_maps(lists: int, per_list: int) -> bytes:
    """A list of ``lists`` lists of ``per_list`` empty maps (each list within the per-container cap)."""
    one = b"\xdd" + per_list.to_bytes(4, "big") + b"\x80" * per_list
    return b"\xdc" + lists.to_bytes(2, "big") + one * lists


@pytest.fixture
def hook_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many map and list hooks the next unpacks ran, in total."""
    calls = [0]
    real = msgpack.unpackb

    def counting(data: Any, **kwargs: Any) -> Any:
        for name in ("object_hook", "list_hook"):
            hook = kwargs.get(name)
            if hook is not None:

                def counted(obj: Any, hook: Any = hook) -> Any:
                    calls[0] += 1
                    return hook(obj)

                kwargs[name] = counted
        return real(data, **kwargs)

    monkeypatch.setattr(msgpack_codec.msgpack, "unpackb", counting)
    return calls


def test_an_8_mb_document_of_empty_maps_stops_at_the_container_cap(hook_calls: list[int]) -> None:
    data = _nested_empty_maps(79, 100_000)  # 7.9 MB, 7.9 M maps
    limits = WireLimits(max_frame_bytes=8 * 1024 * 1024)
    assert limits.container_floor + len(data) // limits.bytes_per_container > 400_000  # size-scaled
    with pytest.raises(WireError) as info:
        unpackb(data, limits)
    assert info.value.code == TOO_MANY_OBJECTS
    assert hook_calls[0] <= limits.max_containers + 1 == 65_537


def test_the_cap_is_a_limit_and_documents_below_it_decode(hook_calls: list[int]) -> None:
    limits = WireLimits(max_containers=1000)
    assert limits.container_budget(10**9) == 1000
    assert limits.container_budget(0) == min(1000, limits.container_floor)
    assert unpackb(msgpack.packb([{}] * 999), limits) == [{}] * 999  # 999 maps and the list
    with pytest.raises(WireError) as info:
        unpackb(msgpack.packb([{}] * 1000), limits)
    assert info.value.code == TOO_MANY_OBJECTS
    assert hook_calls[0] <= 1000 + 1000 + 1
