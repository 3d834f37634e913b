"""Round trip on loopback, one robot, trivial policy: the serving overhead, p50 and p99.

rollserve's session protocol (``PolicyClient``) and its openpi-compatible endpoint
(``openpi_client.WebsocketClientPolicy``) vs the ``openpi-server`` package driven by the same openpi
client. rollserve runs twice: with its default batching window (``--max-wait-ms 2``) and without
one. Every server runs in its own subprocess with the same numpy policy (``droid_policy``: DROID
state, two 224x224 cameras), so the client never shares a GIL with a server. The variants are
measured in interleaved rounds, so background load hits them alike; ratios are against
openpi-server in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, percentile, print_table
from loopback import (
    OpenpiRobot,
    SessionRobot,
    make_observation,
    running,
    start_openpi_server,
    start_rollserve,
)

POLICY = "rollserve.models.simple_policies:droid_policy"
PEER = "openpi-server"


def measure(robot: Any, count: int) -> list[float]:
    """Latencies (seconds) of ``count`` back-to-back requests."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        robot.infer()
        samples.append(time.perf_counter() - started)
    return samples


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests (about 30 s)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per variant")
    parser.add_argument("--requests", type=int, default=None, help="requests per variant per round")
    parser.add_argument("--cameras", type=int, default=2, help="camera images per observation (0-2)")
    parser.add_argument("--side", type=int, default=224, help="image height and width")
    parser.add_argument(
        "--max-wait-ms", type=float, default=2.0, help="batching window of the first rollserve (its default)"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (7 if args.quick else 10)
    count = args.requests or (150 if args.quick else 300)

    obs = make_observation(args.cameras, args.side)
    policy_args = {"camera_names": list(obs.images)}
    with ExitStack() as stack:
        default = stack.enter_context(
            running(start_rollserve(POLICY, policy_args, max_wait_ms=args.max_wait_ms))
        )
        no_window = stack.enter_context(running(start_rollserve(POLICY, policy_args, max_wait_ms=0.0)))
        peer = stack.enter_context(running(start_openpi_server(POLICY, policy_args)))
        robots = {
            "rollserve session protocol": SessionRobot(default.port, obs),
            "rollserve openpi endpoint": OpenpiRobot(default.port, obs),
            "rollserve session, --max-wait-ms 0": SessionRobot(no_window.port, obs),
            "rollserve openpi, --max-wait-ms 0": OpenpiRobot(no_window.port, obs),
            PEER: OpenpiRobot(peer.port, obs),
        }
        for robot in robots.values():
            stack.callback(robot.close)
            measure(robot, 20)  # warm up connections, caches and lazy imports
        samples: dict[str, list[float]] = {name: [] for name in robots}
        round_p50: dict[str, list[float]] = {name: [] for name in robots}
        for _ in range(rounds):
            for name, robot in robots.items():
                latencies = measure(robot, count)
                samples[name] += latencies
                round_p50[name].append(statistics.median(latencies))

    stats = {
        name: {
            "p50_ms": statistics.median(values) * 1e3,
            "p99_ms": percentile(values, 99) * 1e3,
            "round_p50_ms": [v * 1e3 for v in round_p50[name]],
            "requests": len(values),
        }
        for name, values in samples.items()
    }
    peer_stats = stats[PEER]
    rows = []
    for name, s in stats.items():
        s["p50_x_peer"] = s["p50_ms"] / peer_stats["p50_ms"]
        s["p99_x_peer"] = s["p99_ms"] / peer_stats["p99_ms"]
        rows.append([name, s["p50_ms"], s["p99_ms"], s["p50_x_peer"], s["p99_x_peer"]])
    payload_kb = sum(image.nbytes for image in obs.images.values()) / 1e3
    print_table(
        f"Round trip, one robot on loopback, trivial policy ({len(obs.images)} x {args.side}x{args.side} "
        f"images = {payload_kb:.0f} kB), {rounds} x {count} requests each",
        ["server / protocol", "p50 ms", "p99 ms", f"p50 x {PEER}", f"p99 x {PEER}"],
        rows,
    )
    results = {
        "policy": POLICY,
        "cameras": len(obs.images),
        "side": args.side,
        "rounds": rounds,
        "requests_per_round": count,
        "rollserve_max_wait_ms": args.max_wait_ms,
        "variants": stats,
    }
    emit_json("roundtrip", results)
    return results


if __name__ == "__main__":
    main()
