"""How RolloutClient reads msgpack replies: without the server's counting hooks, with the same result.

``unpack_reply`` leaves tensor maps as maps and the client turns them into arrays where it reads
them; every field a trainer sees must equal what the counted decoder (``unpackb``, used before)
gives for the same bytes, with frames raw or JPEG, inline or out of band.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from rollserve.client.rollout_client import StepResult, _step_result, decode_observation, unpack_reply
from rollserve.wire.codec import pack_frame, packb, unpackb
from rollserve.wire.errors import WireError
from rollserve.wire.images import encode_image

RNG = np.random.default_rng(7)


def _item(k: int, quality: int) -> dict[str, Any]:
    """One ``batch_step`` result as rollserve's rollout routes build it before packing."""
    image = RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    return {
        "session_id": f"s{k}",
        "status": "ok",
        "step_id": k,
        "replayed": False,
        "error": None,
        "next_observation": {
            "video_latent": RNG.standard_normal((1, 16, 8, 8)).astype(np.float32),
            "shape": [1, 16, 8, 8],
            "dtype": "float32",
            "encoding": "tensor",
            "state": RNG.standard_normal(13).astype(np.float32).tolist(),
            "images": {"exterior": encode_image(image, quality)},
            "reward": -0.25 * k,
            "terminated": k == 2,
            "info": {"success": k == 2},
            "actions": [RNG.standard_normal(8).astype(np.float32).tolist()] if k == 1 else None,
        },
        "model_metadata": {"committed_step_id": k, "context_length": k + 1, "batch_size": 3},
    }


def _fields(result: StepResult) -> dict[str, Any]:
    return {name: getattr(result, name) for name in StepResult.__dataclass_fields__}


@pytest.mark.parametrize("quality", [0, 90])
@pytest.mark.parametrize("pack", [packb, pack_frame])
def test_a_reply_decodes_exactly_as_with_the_counted_decoder(quality: int, pack: Any) -> None:
    body = pack({"object": "batch_step", "results": [_item(k, quality) for k in range(3)]})
    new = [_step_result(None, item) for item in unpack_reply(body)["results"]]
    old = [_step_result(None, item) for item in unpackb(body)["results"]]
    for a, b in zip(new, old, strict=True):
        fa, fb = _fields(a), _fields(b)
        for name in ("observation", "state", "actions"):
            x, y = fa.pop(name), fb.pop(name)
            if y is None:
                assert x is None
            else:
                assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
                np.testing.assert_array_equal(x, y)
        xi, yi = fa.pop("images"), fb.pop("images")
        assert xi.keys() == yi.keys() == {"exterior"}
        assert xi["exterior"].dtype == np.uint8 and xi["exterior"].shape == (64, 64, 3)
        np.testing.assert_array_equal(xi["exterior"], yi["exterior"])
        assert fa == fb
    assert new[1].actions.shape == (1, 8) and new[2].terminated and new[0].observation.flags.writeable


def test_a_plain_reply_keeps_its_tensor_maps_until_the_client_reads_them() -> None:
    latent = np.arange(4, dtype=np.float32).reshape(1, 4)
    body = packb({"observation": {"video_latent": latent, "shape": [1, 4], "state": [1.0]}})
    payload = unpack_reply(body)
    assert isinstance(payload["observation"]["video_latent"], dict)  # no hook ran
    observed = decode_observation(payload["observation"])
    np.testing.assert_array_equal(observed.tensor, latent)
    assert observed.state.tolist() == [1.0]


def test_extension_types_and_broken_bodies_are_refused() -> None:
    timestamp_free_ext = msgpack.packb({"x": msgpack.ExtType(5, b"abc")})
    with pytest.raises(WireError, match="extension type 5"):
        unpack_reply(timestamp_free_ext)
    with pytest.raises(WireError, match="not a valid msgpack reply"):
        unpack_reply(packb({"a": 1})[:-1])
    with pytest.raises(WireError):
        unpack_reply(packb({"a": 1}) + b"\x00")  # trailing bytes
