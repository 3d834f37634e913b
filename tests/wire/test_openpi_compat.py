"""Frames from openpi-client's msgpack_numpy decode with our codec, and ours decode with theirs."""

from __future__ import annotations

import numpy as np
from openpi_client import msgpack_numpy

from rollserve.wire import packb, unpackb


def _droid_observation() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 255, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.standard_normal(7).astype(np.float32),
        "observation/gripper_position": np.array([0.5], np.float32),
        "prompt": "put the cube on the target",
        "step": np.int64(4),
    }


def test_openpi_client_frames_decode_exactly() -> None:
    obs = _droid_observation()
    decoded = unpackb(msgpack_numpy.packb(obs))
    assert decoded["prompt"] == obs["prompt"]
    assert decoded["step"] == 4 and decoded["step"].dtype == np.int64
    for key in ("observation/exterior_image_1_left", "observation/joint_position"):
        assert decoded[key].dtype == obs[key].dtype
        assert decoded[key].tobytes() == obs[key].tobytes()


def test_our_frames_decode_with_openpi_client() -> None:
    reply = {
        "actions": np.linspace(-1, 1, 80, dtype=np.float32).reshape(10, 8),
        "server_timing": {"infer_ms": 1.5},
    }
    decoded = msgpack_numpy.unpackb(packb(reply))
    assert decoded["actions"].tobytes() == reply["actions"].tobytes()
    assert decoded["server_timing"]["infer_ms"] == 1.5
