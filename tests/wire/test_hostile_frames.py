"""Hostile frames: the decoder's per-document budget, images decoded only where images belong,
refused extension types, capped client strings and finite numbers (issue 8: H1, H2, H3, lows)."""

from __future__ import annotations

import contextlib
import tracemalloc

import msgpack
import numpy as np
import pytest
import simplejpeg

from rollserve.wire import (
    ObservationMsg,
    SessionOpen,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
    packb,
)
from rollserve.wire.errors import BAD_FIELD, BAD_IMAGE, IMAGE_TOO_LARGE, MALFORMED_FRAME, TOO_MANY_OBJECTS
from rollserve.wire.images import IMAGE_KEY
from rollserve.wire.msgpack_codec import FRAME_MAGIC, unpackb


def _jpeg(side: int) -> dict:
    data = simplejpeg.encode_jpeg(np.zeros((side, side, 3), np.uint8), quality=10, colorspace="RGB")
    return {IMAGE_KEY: True, b"format": "jpeg", b"data": data}


def _peak_bytes(fn) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    with contextlib.suppress(WireError):
        fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_a_frame_of_empty_maps_is_refused_while_unpacking_with_bounded_memory() -> None:
    # 1 MB of empty maps: ~140x its size in Python objects before the per-document budget.
    frame = b"\xdc" + (65535).to_bytes(2, "big") + b"\x80" * 65535
    frame = b"\xdc" + (16).to_bytes(2, "big") + frame * 16
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert info.value.code == TOO_MANY_OBJECTS
    assert _peak_bytes(lambda: unpackb(frame)) < 10 * len(frame)


def test_a_typed_message_of_empty_maps_is_refused_while_unpacking_with_bounded_memory() -> None:
    """``decode_message`` skips the hooks only for a small header: a big one is counted as before."""
    maps = b"\xdc" + (65535).to_bytes(2, "big") + b"\x80" * 65535
    header = b"\x82\xa4type\xabobservation\xa4task" + b"\xdc" + (16).to_bytes(2, "big") + maps * 16
    frame = FRAME_MAGIC + len(header).to_bytes(4, "little") + header
    with pytest.raises(WireError) as info:
        decode_message(frame)
    assert info.value.code == TOO_MANY_OBJECTS
    assert _peak_bytes(lambda: decode_message(frame)) < 10 * len(frame)


def test_a_list_of_many_small_values_is_refused_by_the_object_budget() -> None:
    frame = packb([[0] * 50_000 for _ in range(30)])
    with pytest.raises(WireError) as info:
        unpackb(frame, WireLimits(max_objects=1_000_000))
    assert info.value.code == TOO_MANY_OBJECTS


def test_ordinary_messages_stay_well_inside_the_budget() -> None:
    msg = ObservationMsg(state=np.zeros(13, np.float32), images={"a": np.zeros((8, 8, 3), np.uint8)})
    assert isinstance(decode_message(encode_message(msg)), ObservationMsg)
    assert unpackb(packb({"extra": list(range(10_000))}))["extra"][-1] == 9999


@pytest.mark.parametrize("where", ["top", "list", "map"])
def test_msgpack_timestamps_are_refused(where: str) -> None:
    stamp = msgpack.Timestamp(1, 0)
    value = {"top": stamp, "list": {"a": [1, stamp]}, "map": {"a": {"b": stamp}}}[where]
    frame = msgpack.packb(value)
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert info.value.code == MALFORMED_FRAME


def test_images_outside_the_images_field_are_never_decoded() -> None:
    bomb = _jpeg(2048)
    value = unpackb(packb({"extra": {"x": bomb}}))
    assert isinstance(value["extra"]["x"], dict)  # still the wire map: nothing was decompressed


def test_too_many_images_are_refused_before_any_is_decoded() -> None:
    body = {"type": "observation", "images": {f"c{i}": _jpeg(2048) for i in range(17)}}
    peak = _peak_bytes(lambda: decode_message(packb(body)))
    with pytest.raises(WireError) as info:
        decode_message(packb(body))
    assert info.value.code == BAD_IMAGE  # docs/protocol.md's error table: "more than 16 images"
    assert info.value.message == "'images' holds 17 images; at most 16 are accepted"
    assert peak < 4 * len(packb(body))  # one decoded 2048x2048 image alone would be 12 MB


def test_too_many_images_are_counted_before_the_codec_builds_any_pixel_tensor() -> None:
    """A small frame is unpacked without hooks and the codec turns its pixel maps into arrays in a
    loop: the count comes first, so the bad tensor in the first image is never looked at."""
    bad = {b"__ndarray__": True, b"data": b"", b"dtype": ",", b"shape": [0]}
    images = {
        "c0": {IMAGE_KEY: True, b"format": "raw", b"pixels": bad},
        **{f"c{i}": bad for i in range(1, 17)},
    }
    frame = packb({"type": "observation", "images": images})
    assert len(frame) < 4096  # the hookless path
    with pytest.raises(WireError) as info:
        decode_message(frame)
    assert (info.value.code, info.value.message) == (
        BAD_IMAGE,
        "'images' holds 17 images; at most 16 are accepted",
    )
    del images["c16"]  # 16: the loop runs and meets the bad tensor
    with pytest.raises(WireError) as info:
        decode_message(packb({"type": "observation", "images": images}))
    assert info.value.code == "unsupported_dtype"


def test_total_pixels_of_a_message_are_budgeted_from_the_headers() -> None:
    body = {"type": "observation", "images": {f"c{i}": _jpeg(1024) for i in range(4)}}
    limits = WireLimits(max_total_image_pixels=3 * 1024 * 1024)
    peak = _peak_bytes(lambda: decode_message(packb(body), limits))
    with pytest.raises(WireError) as info:
        decode_message(packb(body), limits)
    assert info.value.code == IMAGE_TOO_LARGE
    assert peak < 3 * 1024 * 1024  # one decoded image would be 3 MB
    decoded = decode_message(packb(body), WireLimits(max_total_image_pixels=4 * 1024 * 1024))
    assert decoded.images["c0"].shape == (1024, 1024, 3)


def test_a_jpeg_whose_body_disagrees_with_its_header_is_refused() -> None:
    with pytest.raises(WireError) as info:
        decode_message(packb({"type": "observation", "images": {"c": {IMAGE_KEY: True, b"format": "tiff"}}}))
    assert info.value.code == BAD_IMAGE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("client_uuid", "u" * 257),
        ("robot_type", "r" * 257),
        ("task", "t" * 4097),
        ("action_names", ["a"] * 65),
        ("camera_names", ["c" * 257]),
    ],
)
def test_client_chosen_strings_are_capped(field: str, value: object) -> None:
    with pytest.raises(WireError) as info:
        decode_message(packb({"type": "session_open", field: value}))
    assert info.value.code == BAD_FIELD
    ok = {"client_uuid": "u" * 256, "task": "t" * 4096, "action_names": ["a"] * 64}
    assert isinstance(decode_message(packb({"type": "session_open", **ok})), SessionOpen)


def test_observation_task_is_capped() -> None:
    with pytest.raises(WireError) as info:
        decode_message(packb({"type": "observation", "task": "t" * 4097}))
    assert info.value.code == BAD_FIELD


@pytest.mark.parametrize("value", [True, float("nan"), float("inf")])
def test_bools_are_not_ints_and_floats_are_finite(value: object) -> None:
    field = "inference_delay_steps" if value is True else "fps"
    kind = "observation" if value is True else "session_open"
    with pytest.raises(WireError) as info:
        decode_message(packb({"type": kind, field: value}))
    assert info.value.code == BAD_FIELD
