"""Codec: encode + decode of a typical observation and an action chunk.

rollserve's codec vs openpi-client's msgpack_numpy vs pickle, and vs a raw memory copy of the same
bytes (the physical floor). Raw and JPEG images. Ratios are against openpi-client, measured here.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
from openpi_client import msgpack_numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, median_seconds, print_table

from rollserve.wire import (
    ActionChunkMsg,
    ObservationMsg,
    decode_action_chunk,
    decode_observation,
    encode_action_chunk,
    encode_observation,
)


def make_observation(cameras: int = 3, side: int = 224) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    base = np.stack([x, y, (x + y) // 2], axis=-1).astype(np.uint8)  # camera-like, compressible
    images = {f"cam_{i}": (base + rng.integers(0, 8, base.shape, dtype=np.uint8)) for i in range(cameras)}
    return {
        "images": images,
        "state": rng.standard_normal(8).astype(np.float32),
        "prompt": "pick up the cube",
    }


def _memcopy_round_trip(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The floor: one copy of every payload byte into a frame, then views back out of it."""
    frame = b"".join(memoryview(a).cast("B") for a in arrays)
    out, offset = [], 0
    for a in arrays:
        out.append(np.frombuffer(frame, a.dtype, a.size, offset).reshape(a.shape))
        offset += a.nbytes
    return out


def codec_cases(obs: dict[str, Any], chunk: np.ndarray) -> dict[str, dict[str, Any]]:
    openpi_obs = {f"observation/{k}": v for k, v in obs["images"].items()} | {
        "observation/state": obs["state"],
        "prompt": obs["prompt"],
    }
    msg_raw = ObservationMsg(state=obs["state"], images=obs["images"], task=obs["prompt"], jpeg_quality=0)
    msg_jpeg = ObservationMsg(state=obs["state"], images=obs["images"], task=obs["prompt"], jpeg_quality=90)
    chunk_msg = ActionChunkMsg(chunk_model=chunk, chunk_robot=chunk)
    obs_arrays = [*obs["images"].values(), obs["state"]]
    return {
        "observation (raw images)": {
            "memcopy (floor)": lambda: _memcopy_round_trip(obs_arrays),
            "rollserve": lambda: decode_observation(encode_observation(msg_raw)),
            "openpi-client": lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(openpi_obs)),
            "pickle": lambda: pickle.loads(pickle.dumps(openpi_obs, protocol=5)),
        },
        "observation (JPEG q90)": {
            "rollserve": lambda: decode_observation(encode_observation(msg_jpeg)),
        },
        "action chunk 50x8": {
            "memcopy (floor)": lambda: _memcopy_round_trip([chunk, chunk]),
            "rollserve": lambda: decode_action_chunk(encode_action_chunk(chunk_msg)),
            "openpi-client": lambda: msgpack_numpy.unpackb(
                msgpack_numpy.packb({"actions": chunk, "actions_robot": chunk})
            ),
            "pickle": lambda: pickle.loads(pickle.dumps({"a": chunk, "b": chunk}, protocol=5)),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under a minute)")
    parser.add_argument("--cameras", type=int, default=3)
    args = parser.parse_args(argv)
    repeats, inner = (5, 20) if args.quick else (15, 50)

    obs = make_observation(args.cameras)
    chunk = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    payload_mb = sum(a.nbytes for a in obs["images"].values()) / 1e6
    results: dict[str, Any] = {"payload_mb": payload_mb, "cases": {}}
    rows = []
    for case, variants in codec_cases(obs, chunk).items():
        timings = {name: median_seconds(fn, repeats=repeats, inner=inner) for name, fn in variants.items()}
        baseline = timings.get("openpi-client") or timings.get("rollserve")
        floor = timings.get("memcopy (floor)")
        results["cases"][case] = {name: t * 1e6 for name, t in timings.items()}
        for name, seconds in timings.items():
            rows.append(
                [case, name, seconds * 1e6, seconds / baseline if baseline else float("nan"),
                 seconds / floor if floor else float("nan")]
            )  # fmt: skip
    print_table(
        f"Codec round trip (encode + decode), {args.cameras} cameras 224x224 RGB = {payload_mb:.2f} MB",
        ["case", "codec", "median us", "x openpi-client", "x memcopy"],
        rows,
    )
    emit_json("codec", results)
    return results


if __name__ == "__main__":
    main()
