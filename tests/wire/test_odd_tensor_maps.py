"""Tensor maps numpy itself chokes on are refused with a typed error, not numpy's exception.

``np.dtype(",")`` raises SyntaxError, and ``np.ndarray((0, 2**63), ...)`` raises ValueError although
the array is empty (numpy sizes it by its other dimensions). Both used to escape ``unpackb`` (whose
contract is "WireError, never anything else") and ``decode_message`` (which builds a typed field's
tensor outside msgpack's try): the session websocket dropped and REST answered 500. Expected codes
and messages are written out by hand.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from rollserve.wire import WireError, WireLimits, decode_message, pack_frame, unpackb
from rollserve.wire.errors import TOO_MANY_ELEMENTS, UNSUPPORTED_DTYPE
from rollserve.wire.limits import DEFAULT_LIMITS

ND = b"__ndarray__"
LIMITS = WireLimits(max_tensor_elements=100, max_tensor_dims=3)
# A zero-size tensor whose other dimensions hold 2**63 elements: numpy cannot build it.
HUGE = 2**63
HUGE_MESSAGE = (
    "9223372036854775808 elements besides the zeros of shape [0, 9223372036854775808]"
    " exceeds the limit of 16777216"
)


def _frame(tensor: dict[bytes, Any], framing: str, typed: bool) -> bytes:
    """``tensor`` as a message's ``state`` (typed) or alone, in one of the three ways a frame can
    carry it: plain msgpack, plain msgpack over 4096 bytes (the counted path, tensors built in
    msgpack's hook), or out of band (``RSV1`` framing, an empty payload)."""
    if framing == "out-of-band":
        tensor = {ND: True, b"oob": [0, 0], b"dtype": tensor[b"dtype"], b"shape": tensor[b"shape"]}
        return pack_frame({"type": "observation", "state": tensor} if typed else {"t": tensor})
    body: dict[str, Any] = {"type": "observation", "state": tensor} if typed else {"t": tensor}
    if framing == "counted":
        body["pad"] = bytes(5000)
    return msgpack.packb(body, use_bin_type=True)


def _empty(dtype: str = "<f4", shape: Any = (0,)) -> dict[bytes, Any]:
    return {ND: True, b"data": b"", b"dtype": dtype, b"shape": list(shape)}


FRAMINGS = ["inline", "counted", "out-of-band"]
DECODERS = {"unpackb": (unpackb, False), "decode_message": (decode_message, True)}


def _refusal(
    decoder: str, tensor: dict[bytes, Any], framing: str, limits: WireLimits = DEFAULT_LIMITS
) -> WireError:
    decode, typed = DECODERS[decoder]
    with pytest.raises(WireError) as info:
        decode(_frame(tensor, framing, typed), limits)
    return info.value


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("dtype", [",", ",f4", "f4,,", ",1aHLL"])
def test_a_dtype_numpy_cannot_parse_is_an_unsupported_dtype(decoder: str, framing: str, dtype: str) -> None:
    error = _refusal(decoder, _empty(dtype), framing)
    assert (error.code, error.message) == (UNSUPPORTED_DTYPE, f"unknown dtype {dtype!r}")


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_an_empty_tensor_with_a_dimension_numpy_cannot_size_is_too_many_elements(
    decoder: str, framing: str
) -> None:
    error = _refusal(decoder, _empty(shape=(0, HUGE)), framing)
    assert (error.code, error.message) == (TOO_MANY_ELEMENTS, HUGE_MESSAGE)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_dimensions_whose_product_overflows_numpy_are_too_many_elements(framing: str) -> None:
    """Each dimension alone fits numpy; their product (2**80) does not: the rule is the product."""
    error = _refusal("unpackb", _empty(shape=(0, 2**40, 2**40)), framing)
    expected = (
        "1208925819614629174706176 elements besides the zeros of shape [0, 1099511627776, 1099511627776]"
        " exceeds the limit of 16777216"
    )
    assert (error.code, error.message) == (TOO_MANY_ELEMENTS, expected)


@pytest.mark.parametrize("shape", [(0, 100), (100, 0), (0, 10, 10), (10, 0, 10), (0, 0), (0, 0, 0)])
def test_empty_tensors_whose_other_dimensions_hold_at_most_the_limit_decode(shape: tuple[int, ...]) -> None:
    """Inclusive, as for tensors that are not empty: 100 elements besides the zeros is the limit."""
    for framing in FRAMINGS:
        array = unpackb(_frame(_empty(shape=shape), framing, False), LIMITS)["t"]
        assert array.shape == shape and array.dtype == np.float32 and array.size == 0


@pytest.mark.parametrize(
    ("shape", "others"),
    [((0, 101), 101), ((101, 0), 101), ((0, 10, 11), 110), ((11, 0, 10), 110), ((0, 0, 101), 101)],
)
def test_empty_tensors_whose_other_dimensions_hold_more_than_the_limit_are_refused(
    shape: tuple[int, ...], others: int
) -> None:
    for framing in FRAMINGS:
        error = _refusal("unpackb", _empty(shape=shape), framing, LIMITS)
        expected = f"{others} elements besides the zeros of shape {list(shape)} exceeds the limit of 100"
        assert (error.code, error.message) == (TOO_MANY_ELEMENTS, expected)
