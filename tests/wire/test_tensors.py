"""Tensor encoding: byte-exact round trips, refused dtypes, zero-copy decode, limits before allocation."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rollserve.wire import WireError, WireLimits, decode_tensor, encode_tensor, pack_frame, packb, unpackb
from rollserve.wire.errors import BAD_SHAPE, TOO_MANY_ELEMENTS, UNSUPPORTED_DTYPE
from rollserve.wire.tensors import decode_array

NUMBER_DTYPES = st.sampled_from(["<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u4", "|b1"])


def test_non_dyadic_float32_is_byte_exact() -> None:
    rng = np.random.default_rng(7)
    array = (rng.standard_normal((50, 8)) * 0.1).astype(np.float32)
    decoded = decode_tensor(encode_tensor(array))
    assert decoded.dtype == np.float32
    assert decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()


@given(
    hnp.arrays(dtype=NUMBER_DTYPES, shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))
)
def test_any_numeric_array_round_trips_exactly(array: np.ndarray) -> None:
    decoded = decode_tensor(encode_tensor(array))
    assert decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    assert decoded.tobytes() == array.tobytes()


def test_non_contiguous_and_big_endian_inputs_arrive_as_little_endian_c_order() -> None:
    base = np.arange(24, dtype=">f4").reshape(4, 6)
    view = base[:, ::2]
    decoded = decode_tensor(encode_tensor(view))
    assert decoded.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(decoded, view)


@pytest.mark.parametrize(
    "array",
    [np.array([object()], dtype=object), np.zeros(3, np.complex64), np.zeros(2, "V4"), np.array(["a"])],
    ids=["object", "complex", "void", "unicode"],
)
def test_unsafe_dtypes_are_refused_on_encode(array: np.ndarray) -> None:
    with pytest.raises(WireError) as info:
        encode_tensor(array)
    assert info.value.code == UNSUPPORTED_DTYPE


@pytest.mark.parametrize("dtype", ["|O", "<c8", "|V4", ">f4", "<U3", "not-a-dtype", "<M8[s]"])
def test_unsafe_dtypes_are_refused_on_decode(dtype: str) -> None:
    frame = msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": dtype, b"shape": [0]})
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert info.value.code == UNSUPPORTED_DTYPE


def test_decode_is_zero_copy_and_read_only() -> None:
    decoded = decode_tensor(encode_tensor(np.ones((64, 64), np.float32)))
    assert not decoded.flags.owndata
    assert not decoded.flags.writeable


def test_element_count_is_checked_before_allocation() -> None:
    frame = msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [2**20, 2**20]})
    with pytest.raises(WireError) as info:
        unpackb(frame, WireLimits(max_tensor_elements=1000))
    assert info.value.code == TOO_MANY_ELEMENTS


@pytest.mark.parametrize("shape", [[-1], [1.5], "12", [True], [1] * 20])
def test_bad_shapes_are_refused(shape: object) -> None:
    frame = msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": shape})
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert info.value.code == BAD_SHAPE


def test_data_length_must_match_shape() -> None:
    frame = msgpack.packb({b"__ndarray__": True, b"data": b"\x00" * 7, b"dtype": "<f4", b"shape": [2]})
    with pytest.raises(WireError) as info:
        unpackb(frame)
    assert info.value.code == BAD_SHAPE


def test_numpy_scalars_round_trip() -> None:
    values = {"f": np.float32(0.1), "i": np.int64(-3), "b": np.bool_(True)}
    decoded = unpackb(packb(values))
    for key, value in values.items():
        assert decoded[key].dtype == value.dtype and decoded[key] == value


def test_out_of_band_frames_decode_as_views_of_the_frame() -> None:
    image = np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)
    frame = pack_frame({"a": image, "b": np.float32(1.5), "c": np.ones(3, np.float32)})
    assert frame[:4] == b"RSV1"
    decoded = unpackb(frame)
    assert np.array_equal(decoded["a"], image) and decoded["b"] == np.float32(1.5)
    assert np.shares_memory(decoded["a"], np.frombuffer(frame, np.uint8))
    assert decoded["c"].ctypes.data % 4 == 0  # payload is aligned for the dtype


@pytest.mark.parametrize("pointer", [[0, 10**6], [-1, 4], "x", [0]])
def test_out_of_band_pointers_are_checked(pointer: object) -> None:
    frame = bytearray(pack_frame({"a": np.ones(4, np.float32)}))
    header = msgpack.packb(
        {"a": {b"__ndarray__": True, b"oob": pointer, b"dtype": "<f4", b"shape": [4]}}, use_bin_type=True
    )
    forged = (
        b"RSV1" + len(header).to_bytes(4, "little") + header + bytes(-len(header) % 8) + bytes(frame[-16:])
    )
    with pytest.raises(WireError):
        unpackb(forged)


def test_truncated_out_of_band_frame_is_malformed() -> None:
    frame = pack_frame({"a": np.ones(4, np.float32)})
    for cut in (5, 9, len(frame) - 4):
        with pytest.raises(WireError):
            unpackb(frame[:cut])


def test_decode_over_a_bytearray_frame_is_read_only_too() -> None:
    frame = bytearray(pack_frame({"a": np.arange(6, dtype=np.float32)}))
    decoded = unpackb(frame)["a"]
    assert np.shares_memory(decoded, np.frombuffer(frame, np.uint8))
    assert not decoded.flags.writeable
    inline = unpackb(bytearray(packb({"a": np.arange(6, dtype=np.float32)})))["a"]
    assert not inline.flags.writeable
    assert not decode_array(
        {b"__ndarray__": True, b"data": bytearray(8), b"dtype": "<f4", b"shape": [2]}
    ).flags.writeable


def test_odd_sized_tensors_each_start_on_an_8_byte_boundary_and_round_trip_exactly() -> None:
    """Layout worked out by hand: each tensor's bytes, then zero padding to the next multiple of 8."""
    tensors = {
        "a": np.array([1, 2, 3], np.uint8),  # 3 bytes at 0, padded to 8
        "b": np.array([0.1, -2.5, 3e-7, 7.0, -0.0], np.float32),  # 20 bytes at 8, padded to 32
        "c": np.array([True]),  # 1 byte at 32, padded to 40
        "d": np.array([np.pi, -1e300]),  # 16 bytes at 40
        "e": np.arange(7, dtype=np.int16),  # 14 bytes at 56
    }
    frame = pack_frame(tensors)
    header_len = int.from_bytes(frame[4:8], "little")
    header = msgpack.unpackb(frame[8 : 8 + header_len], raw=True)
    pointers = {key.decode(): value[b"oob"] for key, value in header.items()}
    assert pointers == {"a": [0, 3], "b": [8, 20], "c": [32, 1], "d": [40, 16], "e": [56, 14]}
    payload_start = 8 + header_len + (-(8 + header_len) % 8)
    assert payload_start % 8 == 0 and len(frame) == payload_start + 56 + 16  # the last is padded too
    payload = frame[payload_start:]
    assert payload[3:8] == bytes(5) and payload[28:32] == bytes(4) and payload[33:40] == bytes(7)
    decoded = unpackb(frame)
    for key, array in tensors.items():
        assert decoded[key].dtype == array.dtype and decoded[key].tobytes() == array.tobytes()
