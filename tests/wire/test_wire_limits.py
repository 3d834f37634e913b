"""Every limit and refusal docs/protocol.md and README list, at its boundary, with the exact code and
message a client gets. Expected values are written out by hand (small limits keep frames small)."""

from __future__ import annotations

import dataclasses
import struct
import warnings
from typing import Any

import msgpack
import numpy as np
import pytest
import simplejpeg

from rollserve.wire import (
    ActionChunkMsg,
    ObservationMsg,
    WireError,
    WireLimits,
    decode_message,
    decode_observation,
    decode_tensor,
    encode_action_chunk,
    encode_message,
    pack_frame,
    packb,
    unpackb,
)
from rollserve.wire.errors import (
    BAD_FIELD,
    BAD_IMAGE,
    BAD_SHAPE,
    FRAME_TOO_LARGE,
    IMAGE_TOO_LARGE,
    MALFORMED_FRAME,
    SCHEMA_VERSION,
    TOO_MANY_ELEMENTS,
    UNKNOWN_MESSAGE,
    UNSUPPORTED_DTYPE,
)
from rollserve.wire.images import encode_image

LIMITS = WireLimits(
    max_frame_bytes=4096,
    max_tensor_elements=100,
    max_tensor_dims=3,
    max_image_side=32,
    max_image_pixels=32 * 16,
    max_images=2,
    max_string_bytes=64,
    max_container_items=10,
)
IMAGE_LIMITS = dataclasses.replace(LIMITS, max_tensor_elements=10_000)  # room for the pixel tensors
ND = b"__ndarray__"


def _tensor(data: Any = b"\0" * 8, dtype: Any = "<f4", shape: Any = (2,)) -> dict[bytes, Any]:
    return {
        ND: True,
        b"data": data,
        b"dtype": dtype,
        b"shape": list(shape) if isinstance(shape, tuple) else shape,
    }


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _image(h: int, w: int) -> dict[bytes, Any]:
    return {b"__image__": True, b"format": "raw", b"pixels": _tensor(bytes(h * w * 3), "|u1", (h, w, 3))}


def _obs(**fields: Any) -> bytes:
    return _raw({"type": "observation", **fields})


def _in_images(image: dict[bytes, Any]) -> bytes:
    """Images are decoded only in an observation's ``images`` (issue 8), so that is where they go."""
    return _obs(images={"c": image})


def _refused(frame: Any, code: str, message: str, decode: Any = unpackb, limits: WireLimits = LIMITS) -> None:
    with pytest.raises(WireError) as info:
        decode(frame, limits)
    assert (info.value.code, info.value.message) == (code, message)
    assert str(info.value) == f"{code}: {message}"


# -- frame size ------------------------------------------------------------------------------------------
def test_frame_bytes_limit_is_inclusive() -> None:
    exact = _raw({"pad": bytes(4096 - 8)})  # fixmap + fixstr "pad" (4) + bin16 header (3) = 8 bytes
    assert len(exact) == 4096 and len(unpackb(exact, LIMITS)["pad"]) == 4088
    _refused(_raw({"pad": bytes(4089)}), FRAME_TOO_LARGE, "4097 bytes exceeds the limit of 4096")


def test_only_binary_frames_are_decoded() -> None:
    _refused("text", MALFORMED_FRAME, "expected a binary frame, got str")
    _refused(b"\xc1", MALFORMED_FRAME, "not a valid msgpack frame (FormatError)")


# -- tensors ---------------------------------------------------------------------------------------------
def test_tensor_element_limit_is_inclusive_and_checked_on_the_product() -> None:
    assert unpackb(_raw(_tensor(bytes(400), shape=(10, 10))), LIMITS).shape == (10, 10)
    _refused(_raw(_tensor(b"", shape=(101,))), TOO_MANY_ELEMENTS, "101 elements exceeds the limit of 100")
    _refused(_raw(_tensor(b"", shape=(11, 10))), TOO_MANY_ELEMENTS, "110 elements exceeds the limit of 100")


@pytest.mark.parametrize("shape", [[1, 1, 1, 1], [-1], [1.0], "12", [True], [2, -1]])
def test_shapes_beyond_the_dims_limit_or_not_natural_numbers_are_refused(shape: Any) -> None:
    _refused(_raw(_tensor(b"", shape=shape)), BAD_SHAPE, "shape must be at most 3 non-negative ints")


def test_three_dims_are_allowed() -> None:
    assert unpackb(_raw(_tensor(bytes(4), shape=(1, 1, 1))), LIMITS).shape == (1, 1, 1)


def test_tensor_data_must_be_binary_and_match_the_shape() -> None:
    _refused(_raw(_tensor("abcdefgh")), MALFORMED_FRAME, "tensor data must be binary")
    _refused(_raw(_tensor(b"\0" * 7)), BAD_SHAPE, "7 data bytes do not match shape [2] of <f4")


@pytest.mark.parametrize(
    ("dtype", "message"),
    [
        ("<f4aaaaaa", "dtype must be a short string, got '<f4aaaaaa'"),
        (4, "dtype must be a short string, got 4"),
        ("<c8", "dtype '<c8' is not allowed (numbers only, little-endian)"),
        (">f4", "dtype '>f4' is not allowed (numbers only, little-endian)"),
        ("|O", "dtype '|O' is not allowed (numbers only, little-endian)"),
        ("<U4", "dtype '<U4' is not allowed (numbers only, little-endian)"),
        ("nonsense", "unknown dtype 'nonsense'"),
    ],
)
def test_only_little_endian_numbers_are_decoded(dtype: Any, message: str) -> None:
    _refused(_raw(_tensor(dtype=dtype)), UNSUPPORTED_DTYPE, message)


def test_a_dtype_sent_as_bytes_is_read_as_ascii() -> None:
    decoded = unpackb(_raw(_tensor(np.array([1.5, -2], "<f4").tobytes(), dtype=b"<f4")), LIMITS)
    assert decoded.dtype == np.float32 and decoded.tolist() == [1.5, -2.0]
    assert unpackb(_raw(_tensor(bytes(16), dtype="float64")), LIMITS).dtype == np.float64  # 7 chars


def test_scalars_must_be_numbers_that_fit() -> None:
    scalar = {b"__npgeneric__": True, b"dtype": "<i8"}
    _refused(_raw({**scalar, b"data": "x"}), MALFORMED_FRAME, "numpy scalar data must be a number")
    _refused(_raw({**scalar, b"data": 2**64 - 1}), MALFORMED_FRAME, f"{2**64 - 1} does not fit dtype <i8")
    assert unpackb(_raw({**scalar, b"data": 2**63 - 1}), LIMITS) == np.int64(2**63 - 1)
    with pytest.raises(WireError) as info:
        packb(np.complex64(1j))
    assert (info.value.code, info.value.message) == (
        UNSUPPORTED_DTYPE,
        "cannot send scalars of dtype complex64",
    )


# Each dtype's bounds written out: (dtype, values that fit, values that do not).
SCALAR_RANGES = [
    ("|u1", [0, 255], [-1, 256]),
    ("|i1", [-128, 127], [-129, 128]),
    ("<u2", [0, 65535], [-1, 65536]),
    ("<i4", [-(2**31), 2**31 - 1], [-(2**31) - 1, 2**31]),
    ("<u8", [0, 2**64 - 1], [-1]),
    ("<i8", [-(2**63), 2**63 - 1], [2**63]),  # msgpack holds no int below -(2**63)
    ("<f2", [65504.0, -65504.0, 70000 - 6000], [70000.0, -1e10, 10**6]),  # float16's max is 65504
    ("<f4", [3.4e38, 1e-50, 7], [1e39, -1e300]),  # 1e-50 rounds to 0: a float's rounding, not overflow
]


@pytest.mark.parametrize(("dtype", "fit", "too_big"), SCALAR_RANGES)
def test_a_scalar_out_of_its_dtypes_range_is_refused_not_wrapped(
    dtype: str, fit: list, too_big: list
) -> None:
    """``{dtype: "|u1", data: -1}`` used to decode as 255 and an f4 1e300 as inf."""
    for value in fit:
        decoded = unpackb(_raw({b"__npgeneric__": True, b"dtype": dtype, b"data": value}), LIMITS)
        # ints exactly; floats as Python's struct rounds them to half or single precision
        fmt = {"<f2": "<e", "<f4": "<f"}.get(dtype)
        rounded = struct.unpack(fmt, struct.pack(fmt, value))[0] if fmt else value
        assert decoded.dtype == np.dtype(dtype) and decoded.item() == rounded
    for value in too_big:
        frame = _raw({b"__npgeneric__": True, b"dtype": dtype, b"data": value})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused quietly: no numpy overflow warning in the log
            _refused(frame, MALFORMED_FRAME, f"{value!r} does not fit dtype {dtype}")


@pytest.mark.parametrize(
    ("dtype", "value"),
    [("<i8", 1.5), ("|u1", 2.0), ("<i4", -0.0), ("|u1", True), ("<i8", False), ("|b1", 1), ("|b1", 0.5)],
)
def test_a_scalar_of_another_kind_than_its_dtype_is_refused_not_cast(dtype: str, value: Any) -> None:
    """A float for an int dtype used to be truncated (1.5 -> 1), a bool or number for another kind cast."""
    _refused(
        _raw({b"__npgeneric__": True, b"dtype": dtype, b"data": value}),
        MALFORMED_FRAME,
        f"{value!r} does not fit dtype {dtype}",
    )


def test_scalars_of_their_own_kind_decode_exactly() -> None:
    def decoded(dtype: str, value: Any) -> Any:
        return unpackb(_raw({b"__npgeneric__": True, b"dtype": dtype, b"data": value}), LIMITS)

    assert decoded("|b1", True) is np.True_ and decoded("|b1", False) is np.False_
    assert decoded("|u1", 200) == 200 and decoded("<i2", -300) == -300
    assert decoded("<f8", 0.1) == 0.1 and decoded("<f4", 0.1) == np.float32(0.1)
    assert decoded("<f8", 3).dtype == np.float64 and decoded("<f8", 3) == 3.0  # an int is a float's value
    assert np.isinf(decoded("<f4", float("inf"))) and np.isnan(decoded("<f2", float("nan")))  # they fit


def test_unsendable_arrays_are_refused_on_encode() -> None:
    with pytest.raises(WireError) as info:
        packb(np.array(["a"]))
    assert (info.value.code, info.value.message) == (UNSUPPORTED_DTYPE, "cannot send arrays of dtype <U1")


@pytest.mark.parametrize("frame_of", [packb, pack_frame])
def test_non_contiguous_and_big_endian_arrays_are_sent_in_c_order_little_endian(frame_of: Any) -> None:
    base = np.arange(12, dtype=">f8").reshape(3, 4)
    decoded = unpackb(frame_of({"t": base.T}))["t"]  # a transposed, big-endian view
    assert decoded.dtype == np.dtype("<f8") and decoded.flags.c_contiguous
    assert decoded.tolist() == base.T.tolist()
    assert unpackb(frame_of({"e": np.zeros((0, 3), np.float32)}))["e"].shape == (0, 3)


def test_out_of_band_pointers_must_stay_inside_the_frame() -> None:
    def forged(pointer: Any, payload: bytes = bytes(8)) -> bytes:
        header = _raw({"a": {ND: True, b"oob": pointer, b"dtype": "<f4", b"shape": [2]}})
        pad = bytes(-(8 + len(header)) % 8)
        return b"RSV1" + len(header).to_bytes(4, "little") + header + pad + payload

    assert unpackb(forged([0, 8]), LIMITS)["a"].tolist() == [0.0, 0.0]  # exactly the payload
    assert unpackb(forged([8, 8], bytes(16)), LIMITS)["a"].shape == (2,)
    past = "out-of-band tensor runs past the end of the frame"
    _refused(forged([1, 8]), BAD_SHAPE, past)
    _refused(forged([0, 9]), BAD_SHAPE, past)
    for pointer in ([0], [0, 8, 0], [-1, 8], "x", [0, True]):
        _refused(forged(pointer), MALFORMED_FRAME, "out-of-band tensor pointer must be [offset, nbytes]")


def test_framed_prefix_and_header_are_checked() -> None:
    _refused(b"RSV1\x00", MALFORMED_FRAME, "truncated frame prefix")
    _refused(b"RSV1" + (100).to_bytes(4, "little") + b"ab", BAD_SHAPE, "frame header runs past the frame")
    header = _raw({"a": 1})
    exact = b"RSV1" + len(header).to_bytes(4, "little") + header  # the header ends the frame exactly
    assert unpackb(exact, LIMITS) == {"a": 1}
    assert unpackb(bytearray(exact), LIMITS) == {"a": 1} and unpackb(memoryview(exact), LIMITS) == {"a": 1}


# -- msgpack containers and strings ------------------------------------------------------------------------
def test_string_and_container_limits_are_inclusive() -> None:
    assert unpackb(_raw({"s": "x" * 64}), LIMITS)["s"] == "x" * 64
    _refused(_raw({"s": "x" * 65}), MALFORMED_FRAME, "not a valid msgpack frame (ValueError)")
    assert len(unpackb(_raw({"l": list(range(10))}), LIMITS)["l"]) == 10
    _refused(_raw({"l": list(range(11))}), MALFORMED_FRAME, "not a valid msgpack frame (ValueError)")
    assert len(unpackb(_raw({str(i): i for i in range(10)}), LIMITS)) == 10
    _refused(_raw({str(i): i for i in range(11)}), MALFORMED_FRAME, "not a valid msgpack frame (ValueError)")


def test_strings_decode_as_str_and_binary_as_bytes() -> None:
    decoded = unpackb(_raw({"s": "é", "b": b"\x00\xff"}), LIMITS)
    assert decoded == {"s": "é", "b": b"\x00\xff"}
    assert msgpack.unpackb(packb({"b": b"\x00"}), raw=False) == {"b": b"\x00"}  # bin, not str


@pytest.mark.parametrize("code", [0, 5, 127])
def test_extension_types_are_refused(code: int) -> None:
    frame = _raw({"x": msgpack.ExtType(code, b"data")})
    _refused(frame, MALFORMED_FRAME, f"msgpack extension type {code} is not accepted")


def test_arbitrary_objects_cannot_be_encoded() -> None:
    with pytest.raises(TypeError, match=r"^cannot encode object on the wire$"):
        packb({"x": object()})


# -- images ------------------------------------------------------------------------------------------------
def test_image_side_and_pixel_limits_are_inclusive_and_read_height_first() -> None:
    for h, w in ((32, 16), (16, 32)):
        decoded = decode_observation(_obs(images={"cam": _image(h, w)}), IMAGE_LIMITS)
        assert decoded.images["cam"].shape == (h, w, 3)
    for h, w in ((33, 1), (1, 33), (32, 17), (17, 32)):
        message = f"{h}x{w} image exceeds the configured limits"
        _refused(_obs(images={"c": _image(h, w)}), IMAGE_TOO_LARGE, message, decode_observation, IMAGE_LIMITS)


def test_at_most_max_images_keyed_by_camera_name() -> None:
    two = {"a": _image(2, 2), "b": _image(2, 2)}
    assert sorted(decode_observation(_obs(images=two), LIMITS).images) == ["a", "b"]
    too_many = "'images' holds 3 images; at most 2 are accepted"
    # too many is the images' code (docs/protocol.md: "more than 16 images"); not a map is a bad field
    _refused(_obs(images={**two, "c": _image(2, 2)}), BAD_IMAGE, too_many, decode_observation)
    not_a_map = "field 'images' must be a map of camera name to image, got list"
    _refused(_obs(images=[1]), BAD_FIELD, not_a_map, decode_observation)
    message = "field 'images' must be keyed by camera name, got bytes"
    _refused(_obs(images={b"cam": _image(2, 2)}), BAD_FIELD, message, decode_observation)


def test_images_must_be_uint8_hwc_rgb() -> None:
    gray = {b"__image__": True, b"format": "raw", b"pixels": _tensor(bytes(4), "|u1", (2, 2))}
    _refused(
        _in_images(gray), BAD_IMAGE, "image must be uint8 HxWx3 RGB, got uint8 (2, 2)", decode_observation
    )
    floats = {b"__image__": True, b"format": "raw", b"pixels": _tensor(bytes(48), "<f4", (2, 2, 3))}
    _refused(
        _in_images(floats),
        BAD_IMAGE,
        "image must be uint8 HxWx3 RGB, got float32 (2, 2, 3)",
        decode_observation,
    )
    _refused(
        _in_images({b"__image__": True, b"format": "raw", b"pixels": 5}),
        BAD_IMAGE,
        "raw image carries no pixel tensor",
        decode_observation,
    )
    _refused(
        _in_images({b"__image__": True, b"format": "png"}),
        BAD_IMAGE,
        "unknown image format 'png'",
        decode_observation,
    )
    _refused(
        _in_images({b"__image__": True, b"format": "jpeg", b"data": "x"}),
        BAD_IMAGE,
        "jpeg image data must be binary",
        decode_observation,
    )
    _refused(
        _in_images({b"__image__": True, b"format": "jpeg", b"data": b"nope"}),
        BAD_IMAGE,
        "not a decodable JPEG",
        decode_observation,
    )
    message = ObservationMsg(images={"cam": np.zeros((2, 2, 3), np.float32)})  # type: ignore[dict-item]
    with pytest.raises(WireError) as info:
        encode_message(message)
    assert info.value.message == "image must be uint8 HxWx3 RGB, got float32 (2, 2, 3)"
    with pytest.raises(WireError) as info:
        decode_observation(_raw({"type": "observation", "images": {"top": [1, 2]}}), LIMITS)
    assert info.value.message == "image 'top' must be uint8 HxWx3 RGB, got list None"


def test_jpeg_size_is_checked_from_its_header_before_decoding() -> None:
    big = simplejpeg.encode_jpeg(np.zeros((40, 8, 3), np.uint8), quality=90, colorspace="RGB")
    _refused(_in_images({b"__image__": True, b"format": "jpeg", b"data": big}), IMAGE_TOO_LARGE,
             "40x8 image exceeds the configured limits", decode_observation)  # fmt: skip
    truncated = big[: len(big) // 2]
    _refused(
        _in_images({b"__image__": True, b"format": "jpeg", b"data": truncated}),
        BAD_IMAGE,
        "not a decodable JPEG",
        decode_observation,
    )


@pytest.mark.parametrize("quality", [-1, 101])
def test_jpeg_quality_is_0_to_100(quality: int) -> None:
    with pytest.raises(ValueError, match=rf"^jpeg quality must be in 0\.\.100, got {quality}$"):
        encode_image(np.zeros((2, 2, 3), np.uint8), quality)


def test_jpeg_quality_picks_the_encoding_and_colour_survives() -> None:
    image = np.zeros((16, 16, 3), np.uint8)
    image[..., 0] = 200  # pure red: a colourspace mix-up would move it to another channel
    assert encode_image(image)[b"format"] == "raw" and encode_image(image, 100)[b"format"] == "jpeg"
    decoded = decode_observation(encode_message(ObservationMsg(images={"c": image}, jpeg_quality=100)))
    assert np.abs(decoded.images["c"].astype(int) - image).max() <= 3
    raw = decode_observation(encode_message(ObservationMsg(images={"c": image})))
    assert np.array_equal(raw.images["c"], image)
    low = encode_image(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8), 1)
    high = encode_image(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8), 100)
    assert len(low[b"data"]) < len(high[b"data"])  # the quality reaches the encoder


# -- messages ----------------------------------------------------------------------------------------------
def test_message_envelope_errors() -> None:
    _refused(_raw([1]), MALFORMED_FRAME, "a message must be a msgpack map", decode_message)
    _refused(_raw({"type": "nope"}), UNKNOWN_MESSAGE, "unknown message type 'nope'", decode_message)
    _refused(_raw({"kind": "x"}), UNKNOWN_MESSAGE, "unknown message type None", decode_message)
    chunk = encode_action_chunk(ActionChunkMsg(chunk_model=np.zeros((1, 1), np.float32)))
    _refused(chunk, UNKNOWN_MESSAGE, "expected 'observation', got 'action_chunk'", decode_observation)
    _refused(_raw({"a": 1}), MALFORMED_FRAME, "frame does not hold a tensor", decode_tensor)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"header": 3}, "field 'header' must be a map, got int"),
        ({"header": {"seq_id": "1"}}, "field 'header.seq_id' must be an int, got str"),
        ({"header": {"seq_id": True}}, "field 'header.seq_id' must be an int, got bool"),
        ({"task": 5}, "field 'task' must be a string, got int"),
        ({"inference_delay_steps": 1.5}, "field 'inference_delay_steps' must be an int, got float"),
        ({"state": "x"}, "field 'state' must be a tensor or nil, got str"),
    ],
)
def test_observation_fields_are_typed(fields: dict[str, Any], message: str) -> None:
    _refused(_obs(**fields), BAD_FIELD, message, decode_observation)


def test_other_field_kinds_are_typed() -> None:
    base = {"type": "action_chunk", "chunk_model": _tensor(), "chunk_robot": _tensor()}
    message = "field 'queue_wait_ms' must be a number, got str"
    _refused(_raw({**base, "queue_wait_ms": "x"}), BAD_FIELD, message, decode_message)
    assert decode_message(_raw({**base, "queue_wait_ms": 3}), LIMITS).queue_wait_ms == 3.0
    _refused(_raw({**base, "superseded_seq_ids": [1, "2"]}), BAD_FIELD,
             "field 'superseded_seq_ids' must be a list of ints, got list", decode_message)  # fmt: skip
    _refused(_raw({**base, "superseded_seq_ids": 1}), BAD_FIELD,
             "field 'superseded_seq_ids' must be a list of ints, got int", decode_message)  # fmt: skip
    _refused(_raw({"type": "session_open", "camera_names": ["a", 1]}), BAD_FIELD,
             "field 'camera_names' must be a list of strings, got list", decode_message)  # fmt: skip
    _refused(_raw({"type": "session_open", "rtc_enabled": 1}), BAD_FIELD,
             "field 'rtc_enabled' must be a bool, got int", decode_message)  # fmt: skip


def test_schema_version_is_checked() -> None:
    _refused(
        _obs(header={"schema_version": 99}), SCHEMA_VERSION, "schema_version 99 is not 1", decode_observation
    )


def test_nil_keeps_a_fields_default_and_stays_nil_where_nil_is_allowed() -> None:
    decoded = decode_observation(_obs(task=None, inference_delay_steps=None, state=None, prefix_model=None))
    assert decoded.task == "" and decoded.inference_delay_steps == 0
    assert decoded.state is None and decoded.prefix_model is None
    assert decoded.header.seq_id == 0


def test_names_and_the_task_are_capped_at_their_limits() -> None:
    """``max_name_chars`` (client_uuid, robot_type, each name), ``max_names`` and ``max_task_chars``:
    the limit itself is accepted, one more is refused naming the field and the limit."""
    limits = dataclasses.replace(LIMITS, max_name_chars=5, max_task_chars=8, max_names=2)
    fields = {"client_uuid": "u" * 5, "robot_type": "r" * 5, "action_names": ["x" * 5, "y"], "task": "t" * 8}
    opened = decode_message(_raw({"type": "session_open", **fields}), limits)
    assert (opened.client_uuid, opened.robot_type, opened.action_names, opened.task) == (
        "uuuuu", "rrrrr", ["xxxxx", "y"], "tttttttt"
    )  # fmt: skip

    def open_with(**changed: Any) -> bytes:
        return _raw({"type": "session_open", **fields, **changed})

    _refused(open_with(client_uuid="u" * 6), BAD_FIELD, "field 'client_uuid' is longer than 5 characters",
             decode_message, limits)  # fmt: skip
    _refused(open_with(robot_type="r" * 6), BAD_FIELD, "field 'robot_type' is longer than 5 characters",
             decode_message, limits)  # fmt: skip
    _refused(open_with(task="t" * 9), BAD_FIELD, "field 'task' is longer than 8 characters",
             decode_message, limits)  # fmt: skip
    _refused(open_with(robot_type=3), BAD_FIELD, "field 'robot_type' must be a string, got int",
             decode_message, limits)  # fmt: skip
    too_many = "field 'action_names' takes at most 2 names of 5 characters"
    _refused(open_with(action_names=["x" * 6]), BAD_FIELD, too_many, decode_message, limits)
    _refused(open_with(action_names=["a", "b", "c"]), BAD_FIELD, too_many, decode_message, limits)
    _refused(
        _obs(task="t" * 9), BAD_FIELD, "field 'task' is longer than 8 characters", decode_observation, limits
    )
    assert decode_observation(_obs(task="t" * 8), limits).task == "tttttttt"


@pytest.mark.parametrize(
    ("value", "shown"), [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")]
)
def test_numbers_must_be_finite(value: float, shown: str) -> None:
    frame = _raw({"type": "action_chunk", "inference_ms": value})
    _refused(frame, BAD_FIELD, f"field 'inference_ms' must be finite, got {shown}", decode_message)


def test_tensor_fields_refuse_other_values_and_nil_keeps_the_default() -> None:
    _refused(_raw({"type": "action_chunk", "chunk_model": "x"}), BAD_FIELD,
             "field 'chunk_model' must be a tensor, got str", decode_message)  # fmt: skip
    _refused(_raw({"type": "action_chunk", "chunk_robot": [1.0]}), BAD_FIELD,
             "field 'chunk_robot' must be a tensor, got list", decode_message)  # fmt: skip
    chunk = decode_message(_raw({"type": "action_chunk", "chunk_model": None}), LIMITS)
    assert chunk.chunk_model.shape == (0, 0)  # type: ignore[union-attr]
