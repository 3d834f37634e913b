"""Wire rules pinned number by number: the per-document budget at its exact boundary, when the
decoder yields the GIL, out-of-band versus inline tensors in both unpacking paths, encoding from a
fresh thread, the byte layout of numpy scalars, and the image checks of ``decode_images``.
Expected values are worked out by hand."""

from __future__ import annotations

import dataclasses
import struct
import threading
from types import MappingProxyType, SimpleNamespace
from typing import Any

import msgpack
import numpy as np
import pytest
import simplejpeg

import rollserve.wire.msgpack_codec as msgpack_codec
from rollserve.wire import (
    WireError,
    WireLimits,
    decode_message,
    decode_observation,
    decode_tensor,
    encode_tensor,
    pack_frame,
    packb,
    unpackb,
)
from rollserve.wire.errors import (
    BAD_FIELD,
    BAD_IMAGE,
    IMAGE_TOO_LARGE,
    MALFORMED_FRAME,
    TOO_MANY_ELEMENTS,
    TOO_MANY_OBJECTS,
    UNSUPPORTED_DTYPE,
)
from rollserve.wire.images import check_image_count, decode_images

TIMESTAMP_REFUSED = "msgpack extension type -1 (timestamp) is not accepted"


def _refused(data: Any, code: str, message: str, limits: WireLimits | None = None) -> None:
    with pytest.raises(WireError) as info:
        unpackb(data, limits) if limits else unpackb(data)
    assert (info.value.code, info.value.message) == (code, message)


# -- the document budget ----------------------------------------------------------------------------
def test_a_list_costs_its_items_plus_one_value_exactly() -> None:
    limits = WireLimits(max_objects=10)
    nine = msgpack.packb(list(range(9)))  # 10 bytes: 2 x 10 > 10, so the counted path runs
    assert unpackb(nine, limits) == list(range(9))  # 9 + 1 = 10 values: at the limit
    ten = msgpack.packb(list(range(10)))
    _refused(
        ten, TOO_MANY_OBJECTS, "more than 10 values or 1024 maps and lists in a 11-byte document", limits
    )


def test_a_map_costs_two_values_per_entry_plus_one_exactly() -> None:
    limits = WireLimits(max_objects=11)
    five = msgpack.packb({f"k{i}": i for i in range(5)})  # 2 x 5 + 1 = 11
    assert len(unpackb(five, limits)) == 5
    six = msgpack.packb({f"k{i}": i for i in range(6)})  # 13
    assert len(six) == 25  # containers allowed: 1024 + 25 // 16 = 1025
    _refused(
        six, TOO_MANY_OBJECTS, "more than 11 values or 1025 maps and lists in a 25-byte document", limits
    )


def test_the_decoder_yields_the_gil_once_every_2048_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.sleep(0)`` after containers 2048, 4096, ... of a document's budget (counted down)."""
    sleeps: list[float] = []
    monkeypatch.setattr(msgpack_codec, "time", SimpleNamespace(sleep=sleeps.append))
    limits = WireLimits(container_floor=10_000)
    doc = [[] for _ in range(5000)]  # 5000 lists + the outer one
    data = msgpack.packb(doc)
    budget = limits.container_budget(len(data))  # 10_000 + 5003 // 16 = 10_312
    assert unpackb(data, limits) == doc
    expected = sum(1 for spent in range(1, 5002) if (budget - spent) % 2048 == 0)  # 10_240, 8192, 6144
    assert sleeps == [0] * expected and expected == 3


# -- timestamps (extension type -1) -----------------------------------------------------------------
@pytest.mark.parametrize(
    "doc",
    [{"t": msgpack.Timestamp(1, 0)}, [1, msgpack.Timestamp(1, 0)], msgpack.Timestamp(1, 0)],
    ids=["in-a-map", "in-a-list", "alone"],
)
def test_timestamps_are_refused_with_the_reason(doc: Any) -> None:
    _refused(msgpack.packb(doc), MALFORMED_FRAME, TIMESTAMP_REFUSED)
    padded = {"pad": list(range(3000)), "doc": doc}  # a big document: the same refusal
    _refused(msgpack.packb(padded), MALFORMED_FRAME, TIMESTAMP_REFUSED)


# -- tensors in both paths ----------------------------------------------------------------------------
def _rsv1(header_doc: Any, payload: bytes = b"") -> bytes:
    header = msgpack.packb(header_doc, use_bin_type=True)
    pad = -(8 + len(header)) % 8
    return struct.pack("<4sI", b"RSV1", len(header)) + header + bytes(pad) + payload


@pytest.mark.parametrize("pad", [0, 3000], ids=["small-header", "big-header"])
def test_out_of_band_and_inline_tensors_in_one_frame(pad: int) -> None:
    """A frame's header may hold both kinds; each is read from where its map says (small headers
    skip the per-container hooks, big ones use them: both paths agree)."""
    inline = np.array([1.5, -2.0], np.float32)
    oob = np.arange(3, dtype=np.int16)
    doc = {
        "inline": {b"__ndarray__": True, b"data": inline.tobytes(), b"dtype": "<f4", b"shape": [2]},
        "oob": {b"__ndarray__": True, b"oob": [0, 6], b"dtype": "<i2", b"shape": [3]},
        "pad": list(range(pad)),
    }
    value = unpackb(_rsv1(doc, oob.tobytes() + bytes(2)))
    np.testing.assert_array_equal(value["inline"], inline)
    np.testing.assert_array_equal(value["oob"], oob)
    encoded = unpackb(pack_frame({"a": oob, "pad": list(range(pad))}))
    np.testing.assert_array_equal(encoded["a"], oob)


def test_encoding_works_from_a_fresh_thread() -> None:
    """Each thread gets its own packers, made on its first call, with the numpy hooks."""
    out: dict[str, Any] = {}

    def encode() -> None:
        out["inline"] = packb({"a": np.arange(3, dtype=np.int32), "s": np.float32(2.5)})
        out["frame"] = pack_frame({"a": np.arange(3, dtype=np.int32), "s": np.float32(2.5)})
        out["again"] = packb(np.ones(2, np.uint8))

    thread = threading.Thread(target=encode)
    thread.start()
    thread.join(10)
    for key in ("inline", "frame"):
        value = unpackb(out[key])
        np.testing.assert_array_equal(value["a"], [0, 1, 2])
        assert value["s"] == np.float32(2.5) and value["s"].dtype == np.float32
    np.testing.assert_array_equal(unpackb(out["again"]), [1, 1])


def test_numpy_scalars_use_openpi_clients_layout_byte_for_byte() -> None:
    expected = msgpack.packb({b"__npgeneric__": True, b"data": 1.5, b"dtype": "<f4"}, use_bin_type=True)
    assert packb(np.float32(1.5)) == expected


def test_fortran_order_arrays_are_sent_in_c_order() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3).T  # F-contiguous
    for data in (packb(array), pack_frame(array)):
        np.testing.assert_array_equal(unpackb(data), array)


@pytest.mark.parametrize(
    ("dtype", "message"),
    [
        (b"\xff4", "unknown dtype '\ufffd4'"),
        (["<f4"], "dtype must be a short string, got ['<f4']"),
    ],
)
def test_odd_dtype_values_are_refused_as_dtypes(dtype: Any, message: str) -> None:
    tensor = {b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": dtype, b"shape": [1]}
    _refused(msgpack.packb({"t": tensor}, use_bin_type=True), UNSUPPORTED_DTYPE, message)


def test_decode_tensor_applies_the_limits_it_is_given() -> None:
    with pytest.raises(WireError) as info:
        decode_tensor(encode_tensor(np.zeros(101, np.float32)), WireLimits(max_tensor_elements=100))
    assert (info.value.code, info.value.message) == (
        TOO_MANY_ELEMENTS,
        "101 elements exceeds the limit of 100",
    )


# -- decode_images, called directly -------------------------------------------------------------------
LIMITS = WireLimits(max_image_side=32, max_image_pixels=32 * 16, max_images=2, max_total_image_pixels=48)


def test_decode_images_counts_and_types_first() -> None:
    three = {c: np.zeros((1, 1, 3), np.uint8) for c in "abc"}
    for value, message in (
        (three, "'images' holds 3 images; at most 2 are accepted"),
        ([np.zeros((1, 1, 3), np.uint8)], "field 'images' must be a map of camera name to image"),
    ):
        with pytest.raises(WireError) as info:
            decode_images(value, LIMITS)
        assert (info.value.code, info.value.message) == (BAD_IMAGE, message)
    with pytest.raises(WireError) as info:
        decode_images({"top": np.zeros((2, 2), np.uint8)}, LIMITS)
    assert (info.value.code, info.value.message) == (
        BAD_IMAGE,
        "image 'top' must be uint8 HxWx3 RGB, got uint8 (2, 2)",
    )
    with pytest.raises(WireError) as info:
        decode_images({"top": np.zeros((33, 1, 3), np.uint8)}, LIMITS)
    assert (info.value.code, info.value.message) == (
        IMAGE_TOO_LARGE,
        "33x1 image exceeds the configured limits",
    )


def test_the_image_count_rule_defaults_to_16_images() -> None:
    check_image_count([0] * 16)
    with pytest.raises(WireError) as info:
        check_image_count([0] * 17)
    message = "'images' holds 17 images; at most 16 are accepted"
    assert (info.value.code, info.value.message) == (BAD_IMAGE, message)
    with pytest.raises(WireError) as info:
        check_image_count({"a": 0, "b": 0, "c": 0}, LIMITS, "cams")
    assert info.value.message == "'cams' holds 3 images; at most 2 are accepted"


def test_decode_images_total_pixels_are_height_times_width_summed() -> None:
    a, b = np.zeros((4, 8, 3), np.uint8), np.zeros((8, 2, 3), np.uint8)  # 32 + 16 = 48
    decoded = decode_images({"a": a, "b": b}, LIMITS)
    assert decoded["a"] is a and decoded["b"] is b
    c = np.zeros((7, 1, 3), np.uint8)  # 32 + 7 = 39, then 39 + 16 = 55
    with pytest.raises(WireError) as info:
        decode_images({"a": a, "c": c, "b": b}, dataclasses.replace(LIMITS, max_images=3))
    assert (info.value.code, info.value.message) == (
        IMAGE_TOO_LARGE,
        "55 pixels in 3 images exceeds the limit of 48",
    )


def test_a_cut_jpeg_body_is_refused_after_a_whole_header() -> None:
    image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    jpeg = simplejpeg.encode_jpeg(image, quality=90)
    cut = jpeg[: len(jpeg) // 2]
    assert simplejpeg.decode_jpeg_header(cut)[:2] == (64, 64)  # the header is whole: only the body fails
    with pytest.raises(WireError) as info:
        decode_images({"top": {b"__image__": True, b"format": "jpeg", b"data": cut}})
    assert (info.value.code, info.value.message) == (BAD_IMAGE, "not a decodable JPEG")


def test_decode_images_takes_any_mapping() -> None:
    image = np.zeros((2, 2, 3), np.uint8)
    assert decode_images(MappingProxyType({"top": image}), LIMITS) == {"top": image}


# -- typed messages: the header's fast path, lists, images as tensors -------------------------------
def _observation(header: dict[str, Any]) -> bytes:
    return msgpack.packb({"type": "observation", "header": header}, use_bin_type=True)


def test_headers_are_read_by_field_name_in_any_order_or_subset() -> None:
    full = {"schema_version": 1, "seq_id": 7, "episode_id": 3, "session_epoch": 2, "client_mono_ns": 99}
    expected = (1, 7, 3, 2, 99)
    for header in (full, dict(reversed(full.items()))):
        h = decode_observation(_observation(header)).header
        assert (h.schema_version, h.seq_id, h.episode_id, h.session_epoch, h.client_mono_ns) == expected
    h = decode_observation(_observation({"seq_id": 7, "episode_id": 3})).header
    assert (h.schema_version, h.seq_id, h.episode_id, h.session_epoch, h.client_mono_ns) == (1, 7, 3, 0, 0)


@pytest.mark.parametrize("bad", [True, "7", 7.0])
def test_a_complete_header_in_order_still_has_its_types_checked(bad: Any) -> None:
    header = {"schema_version": 1, "seq_id": bad, "episode_id": 3, "session_epoch": 2, "client_mono_ns": 99}
    with pytest.raises(WireError) as info:
        decode_observation(_observation(header))
    assert (info.value.code, info.value.message) == (
        BAD_FIELD, f"field 'header.seq_id' must be an int, got {type(bad).__name__}"
    )  # fmt: skip


def test_string_lists_name_the_field() -> None:
    frame = msgpack.packb({"type": "session_ack", "action_names": ["a", 1]})
    with pytest.raises(WireError) as info:
        decode_message(frame)
    assert (info.value.code, info.value.message) == (
        BAD_FIELD,
        "field 'action_names' must be a list of strings, got list",
    )


def test_images_sent_as_bare_tensors_are_read_out_of_band_and_inline() -> None:
    """A sender may put a pixel tensor where an image goes (no image map): every camera's tensor is
    read from where its map says, out of band or inline, in a frame of either kind."""
    a = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    b = np.full((4, 1, 3), 7, np.uint8)
    frame = pack_frame({"type": "observation", "images": {"a": a, "b": b}})
    images = decode_observation(frame).images
    np.testing.assert_array_equal(images["a"], a)
    np.testing.assert_array_equal(images["b"], b)

    def inline(array: np.ndarray) -> dict[bytes, Any]:
        return {b"__ndarray__": True, b"data": array.tobytes(), b"dtype": "|u1", b"shape": list(array.shape)}

    as_map = {b"__image__": True, b"format": "raw", b"pixels": inline(b)}
    mixed = _rsv1({"type": "observation", "images": {"a": inline(a), "b": as_map}})
    images = decode_observation(mixed).images
    np.testing.assert_array_equal(images["a"], a)
    np.testing.assert_array_equal(images["b"], b)


def test_typed_messages_build_tensors_only_where_a_tensor_belongs() -> None:
    """A tensor map in a field that is not a tensor is never built: an unknown field's is ignored
    (even a refused dtype), a string field's is refused as the map it is; an inline tensor where one
    belongs is read inline even in an out-of-band frame."""
    complex_map = {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<c8", b"shape": [1]}
    state = np.array([0.5, -1.0], np.float32)
    inline_state = {b"__ndarray__": True, b"data": state.tobytes(), b"dtype": "<f4", b"shape": [2]}
    frame = _rsv1({"type": "observation", "state": inline_state, "junk": complex_map})
    np.testing.assert_array_equal(decode_observation(frame).state, state)
    with pytest.raises(WireError) as info:
        decode_observation(msgpack.packb({"type": "observation", "task": inline_state}))
    assert (info.value.code, info.value.message) == (BAD_FIELD, "field 'task' must be a string, got dict")


def test_messages_with_free_form_maps_apply_the_limits_they_are_given() -> None:
    tensor = {b"__ndarray__": True, b"data": b"\0" * 404, b"dtype": "<f4", b"shape": [101]}
    frame = msgpack.packb({"type": "session_ack", "policy": {"t": tensor}})
    with pytest.raises(WireError) as info:
        decode_message(frame, WireLimits(max_tensor_elements=100))
    assert (info.value.code, info.value.message) == (
        TOO_MANY_ELEMENTS,
        "101 elements exceeds the limit of 100",
    )


def test_a_document_may_hold_exactly_its_container_budget() -> None:
    limits = WireLimits(container_floor=3)  # 3 + 6 // 16 = 3 maps and lists for a 6-byte document
    three = msgpack.packb([[], [], 0, 0, 0])
    assert len(three) == 6 and unpackb(three, limits) == [[], [], 0, 0, 0]
    four = msgpack.packb([[], [], [], 0, 0])
    _refused(
        four, TOO_MANY_OBJECTS, "more than 1000000 values or 3 maps and lists in a 6-byte document", limits
    )


def test_an_empty_out_of_band_header_is_refused_the_same_from_bytes_and_bytearray() -> None:
    for frame in (b"RSV1\0\0\0\0", bytearray(b"RSV1\0\0\0\0")):
        _refused(frame, MALFORMED_FRAME, "not a valid msgpack frame (ValueError)")


def test_the_header_length_is_little_endian_even_when_read_big_endian_would_fit() -> None:
    """A 256-byte header (``00 01 00 00``) read big-endian is 65,536 bytes: with a payload over that,
    only the little-endian reading decodes the frame."""
    payload = np.arange(20_000, dtype=np.float32)  # 80,000 bytes
    for pad in range(200, 260):
        frame = pack_frame({"a": payload, "s": "x" * pad})
        if int.from_bytes(frame[4:8], "little") == 256:
            break
    else:
        pytest.fail("no padding gives a 256-byte header")
    value = unpackb(frame)
    assert value["s"] == "x" * pad
    np.testing.assert_array_equal(value["a"], payload)


def test_a_bytearray_document_is_counted_and_checked_like_bytes() -> None:
    _refused(bytearray(msgpack.packb({"t": msgpack.Timestamp(1, 0)})), MALFORMED_FRAME, TIMESTAMP_REFUSED)
    message = "more than 10 values or 1024 maps and lists in a 11-byte document"
    _refused(bytearray(msgpack.packb(list(range(10)))), TOO_MANY_OBJECTS, message, WireLimits(max_objects=10))


def test_frames_received_as_bytearray_or_memoryview_read_the_aligned_payload() -> None:
    array = np.arange(5, dtype=np.float64)
    frame = pack_frame({"a": array})
    assert (8 + int.from_bytes(frame[4:8], "little")) % 8 != 0  # the header is padded before the payload
    for received in (bytearray(frame), memoryview(frame), memoryview(bytearray(frame))):
        np.testing.assert_array_equal(unpackb(received)["a"], array)
