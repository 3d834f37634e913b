"""Codec: encode + decode of a typical observation, an action chunk and the openpi endpoint's reply.

rollserve's codec vs openpi-client's msgpack_numpy vs pickle, and vs a raw memory copy of the same
bytes (the physical floor). The machine is shared and noisy, so every variant of a case is timed in
the same rounds, interleaved (each round times every variant once, in a rotating order), and the
ratios are medians of per-round ratios against openpi-client and against the memcopy. The clock
is this thread's CPU time by default (``--clock cpu``): the codec is CPU-bound, and on a shared box
wall time mostly measures who else got the cores (``--clock wall`` to see it anyway).

``--baseline-src DIR`` adds "before" variants: the same cases run by a worker process importing
rollserve from ``DIR``, timed in the same rounds (an A/B in one run).
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from openpi_client import msgpack_numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, print_table

from rollserve.wire import (
    ActionChunkMsg,
    MsgHeader,
    ObservationMsg,
    decode_action_chunk,
    decode_observation,
    encode_action_chunk,
    encode_observation,
)
from rollserve.wire.codec import packb, unpackb

BEFORE = "before: rollserve"


def make_observation(cameras: int = 2, side: int = 224) -> dict[str, Any]:
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


def codec_cases(cameras: int, jpeg: bool = True) -> dict[str, dict[str, Callable[[], Any]]]:
    obs = make_observation(cameras)
    chunk = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    openpi_obs = {f"observation/{k}": v for k, v in obs["images"].items()} | {
        "observation/state": obs["state"],
        "prompt": obs["prompt"],
    }
    msg_raw = ObservationMsg(state=obs["state"], images=obs["images"], task=obs["prompt"], jpeg_quality=0)
    msg_jpeg = ObservationMsg(state=obs["state"], images=obs["images"], task=obs["prompt"], jpeg_quality=90)
    chunk_msg = ActionChunkMsg(chunk_model=chunk, chunk_robot=chunk)
    # The same content as ``chunk_msg`` in openpi-client's codec (untyped, nothing validated): the
    # target compares with the bare two-key dict above; this row shows what the extra fields cost.
    chunk_fields = {"type": "action_chunk", "header": vars(MsgHeader())} | {
        name: getattr(chunk_msg, name) for name in ActionChunkMsg.WIRE_FIELDS if name != "header"
    }
    reply = {"actions": chunk, "server_timing": {"infer_ms": 0.42}}  # the openpi endpoint's reply
    obs_arrays = [*obs["images"].values(), obs["state"]]
    cases: dict[str, dict[str, Callable[[], Any]]] = {
        f"observation ({cameras} raw cameras + state)": {
            "memcopy (floor)": lambda: _memcopy_round_trip(obs_arrays),
            "rollserve": lambda: decode_observation(encode_observation(msg_raw)),
            "openpi-client": lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(openpi_obs)),
            "pickle": lambda: pickle.loads(pickle.dumps(openpi_obs, protocol=5)),
        },
        "action chunk 50x8": {
            "memcopy (floor)": lambda: _memcopy_round_trip([chunk, chunk]),
            "rollserve": lambda: decode_action_chunk(encode_action_chunk(chunk_msg)),
            "openpi-client": lambda: msgpack_numpy.unpackb(
                msgpack_numpy.packb({"actions": chunk, "actions_robot": chunk})
            ),
            "pickle": lambda: pickle.loads(pickle.dumps({"a": chunk, "b": chunk}, protocol=5)),
            "openpi-client, same fields": lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(chunk_fields)),
        },
        "openpi reply 50x8": {
            "rollserve": lambda: unpackb(packb(reply)),
            "openpi-client": lambda: msgpack_numpy.unpackb(msgpack_numpy.packb(reply)),
        },
        "openpi reply 50x8, encode only (the server's share)": {
            "rollserve": lambda: packb(reply),
            "openpi-client": lambda: msgpack_numpy.packb(reply),
        },
    }
    if jpeg:
        cases["observation (JPEG q90)"] = {
            "rollserve": lambda: decode_observation(encode_observation(msg_jpeg))
        }
    return cases


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _time(fn: Callable[[], Any], inner: int) -> float:
    start = _clock()
    for _ in range(inner):
        fn()
    return (_clock() - start) / inner


def _worker(cameras: int) -> None:
    """Baseline side of an A/B: times the case/variant named on each stdin line, answers on stdout."""
    cases = codec_cases(cameras, jpeg=False)
    for line in sys.stdin:
        case, variant, inner = line.rstrip("\n").split("\t")
        fn = cases[case][variant]
        fn()
        sys.stdout.write(f"{_time(fn, int(inner))!r}\n")
        sys.stdout.flush()


class _Baseline:
    """A worker process importing rollserve from another source tree."""

    def __init__(self, src: str, cameras: int, clock: str) -> None:
        env = {**os.environ, "PYTHONPATH": src}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--cameras", str(cameras), "--clock", clock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip

    def time(self, case: str, inner: int) -> float:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{case}\trollserve\t{inner}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _spread(values: list[float]) -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{quartiles[0] * 1e6:.3g}-{quartiles[2] * 1e6:.3g}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 41, quick 11)")
    parser.add_argument("--cameras", type=int, default=2)
    parser.add_argument("--baseline-src", default=None, help="also time rollserve imported from this src dir")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="thread CPU time or wall time")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    if args.worker:
        _worker(args.cameras)
        return {}
    rounds = args.rounds or (11 if args.quick else 41)
    inner = {"observation": 20, "action": 200, "openpi": 200}  # calls per timing, by case prefix

    cases = codec_cases(args.cameras)
    baseline = _Baseline(args.baseline_src, args.cameras, args.clock) if args.baseline_src else None
    samples: dict[str, dict[str, list[float]]] = {case: {} for case in cases}
    try:
        for round_index in range(rounds):
            for case, variants in cases.items():
                n = inner[case.split()[0]]
                names = list(variants) + ([BEFORE] if baseline and "JPEG" not in case else [])
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:  # rotate who goes first
                    if name == BEFORE:
                        seconds = baseline.time(case, n)  # type: ignore[union-attr]
                    else:
                        variants[name]()  # warm (and, in the first round, lazy imports)
                        seconds = _time(variants[name], n)
                    samples[case].setdefault(name, []).append(seconds)
    finally:
        if baseline:
            baseline.close()

    payload_mb = sum(a.nbytes for a in make_observation(args.cameras)["images"].values()) / 1e6
    results: dict[str, Any] = {"payload_mb": payload_mb, "rounds": rounds, "clock": args.clock, "cases": {}}
    rows = []
    for case, by_name in samples.items():
        reference = by_name.get("openpi-client")
        floor = by_name.get("memcopy (floor)")
        results["cases"][case] = {}
        for name, values in by_name.items():

            def ratio(against: list[float] | None, values: list[float] = values) -> float:
                if not against:
                    return float("nan")
                return statistics.median(v / a for v, a in zip(values, against, strict=True))

            median_us = statistics.median(values) * 1e6
            results["cases"][case][name] = {
                "median_us": median_us,
                "x_openpi_client": ratio(reference),
                "x_memcopy": ratio(floor),
            }
            rows.append([case, name, median_us, _spread(values), ratio(reference), ratio(floor)])
    print_table(
        f"Codec round trip (encode + decode), {args.clock} time, {rounds} interleaved rounds; "
        f"{args.cameras} cameras 224x224 RGB = {payload_mb:.2f} MB",
        ["case", "codec", "median us", "IQR us", "x openpi-client", "x memcopy"],
        rows,
    )
    emit_json("codec", results)
    return results


if __name__ == "__main__":
    main()
