"""Round trip on loopback, trivial policy: the serving overhead, against the floor and the peer.

Four servers answer the same observation, each in its own subprocess:

- the **floor**: a bare ``websockets`` server (the library openpi-server uses) that replies with a
  pre-packed chunk and never decodes the request, i.e. what the transport alone costs;
- **openpi-server** 0.1.0 serving the same policy object;
- **rollserve**, through its openpi endpoint and through its session protocol.

openpi endpoints are driven by the unchanged ``openpi_client.WebsocketClientPolicy``, the session
protocol by ``PolicyClient``. Two observations: LIBERO keys with an echo policy (no compute at all)
and DROID keys with ``droid_policy`` (a few numpy ops), each 2 raw 224x224 cameras + an 8-D state.

Per variant: latency of one robot (p50 as the median of the per-round medians, with their spread,
and p99 over all requests), the **server's CPU time per request** (its threads' ``/proc``
counters over the round: less noisy than latency), and the **throughput of 8 closed-loop robots**
(each its own process). Variants run in interleaved rounds, so background load hits them alike.
``--baseline-src DIR`` adds a second rollserve importing its code from ``DIR`` (an A/B in one run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, percentile, print_table, ratio
from loopback import (
    ROBOTS,
    RobotPool,
    ServerProcess,
    cpu_seconds,
    make_observation,
    running,
    start_floor_server,
    start_openpi_server,
    start_rollserve,
)

PEER = "openpi-server"
FLOOR = "floor (bare websockets)"
POLICIES = {
    "libero": "rollserve.models.simple_policies:echo_policy",
    "droid": "rollserve.models.simple_policies:droid_policy",
}


@dataclass(frozen=True)
class Variant:
    name: str
    server: str  # a key of the servers started for a layout
    protocol: str  # a key of loopback.ROBOTS


def variants(with_baseline: bool) -> list[Variant]:
    out = [
        Variant(FLOOR, "floor", "openpi"),
        Variant(PEER, "peer", "openpi"),
        Variant("rollserve openpi endpoint", "rollserve", "openpi"),
        Variant("rollserve session protocol", "rollserve", "session"),
    ]
    if with_baseline:
        out += [
            Variant("baseline rollserve openpi endpoint", "baseline", "openpi"),
            Variant("baseline rollserve session protocol", "baseline", "session"),
        ]
    return out


def measure(robot: Any, count: int) -> list[float]:
    """Latencies (seconds) of ``count`` back-to-back requests."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        robot.infer()
        samples.append(time.perf_counter() - started)
    return samples


def spread(values: list[float]) -> str:
    """The range of the per-round values: how far apart the rounds fell."""
    low, high = min(values), max(values)
    return f"{low:,.0f}-{high:,.0f}" if high >= 100 else f"{low:.3g}-{high:.3g}"


def start_servers(layout: str, policy_args: dict[str, Any], baseline_src: str | None) -> dict[str, Any]:
    policy = POLICIES[layout]
    servers = {
        "floor": start_floor_server(policy, policy_args),
        "peer": start_openpi_server(policy, policy_args),
        "rollserve": start_rollserve(policy, policy_args),
    }
    if baseline_src:
        servers["baseline"] = start_rollserve(policy, policy_args, pythonpath=baseline_src)
    return servers


def round_trips(
    servers: dict[str, ServerProcess],
    chosen: list[Variant],
    obs_kwargs: dict[str, Any],
    rounds: int,
    count: int,
) -> dict[str, dict[str, Any]]:
    """One robot per variant, interleaved rounds: latency and the server's CPU per request."""
    obs = make_observation(**obs_kwargs)
    with ExitStack() as stack:
        robots = {}
        for v in chosen:
            robots[v.name] = ROBOTS[v.protocol](servers[v.server].port, obs)
            stack.callback(robots[v.name].close)
            measure(robots[v.name], 20)  # warm up connections, caches and lazy imports
        samples: dict[str, list[float]] = {v.name: [] for v in chosen}
        round_p50: dict[str, list[float]] = {v.name: [] for v in chosen}
        round_cpu: dict[str, list[float]] = {v.name: [] for v in chosen}
        for _ in range(rounds):
            for v in chosen:
                pid = servers[v.server].process.pid
                cpu_before = cpu_seconds(pid)
                latencies = measure(robots[v.name], count)
                round_cpu[v.name].append((cpu_seconds(pid) - cpu_before) / count * 1e6)
                samples[v.name] += latencies
                round_p50[v.name].append(statistics.median(latencies) * 1e3)
    return {
        name: {
            "p50_ms": statistics.median(round_p50[name]),
            "round_p50_ms": round_p50[name],
            "p99_ms": percentile(values, 99) * 1e3,
            "server_cpu_us": statistics.median(round_cpu[name]),
            "round_server_cpu_us": round_cpu[name],
            "requests": len(values),
        }
        for name, values in samples.items()
    }


def throughput(
    servers: dict[str, ServerProcess],
    chosen: list[Variant],
    pool: RobotPool,
    clients: int,
    obs_kwargs: dict[str, Any],
    duration: float,
    repeats: int,
) -> dict[str, dict[str, Any]]:
    """``clients`` closed-loop robot processes per variant, interleaved repeats."""
    rates: dict[str, list[float]] = {v.name: [] for v in chosen}
    cpu: dict[str, list[float]] = {v.name: [] for v in chosen}
    p50: dict[str, list[float]] = {v.name: [] for v in chosen}
    for _ in range(repeats):
        for v in chosen:
            server = servers[v.server]
            cpu_before = cpu_seconds(server.process.pid)  # includes connecting: small against ~1,000 requests
            latencies = pool.run(clients, v.protocol, server.port, duration, obs_kwargs)
            used = cpu_seconds(server.process.pid) - cpu_before
            rates[v.name].append(len(latencies) / duration)
            cpu[v.name].append(used / max(len(latencies), 1) * 1e6)
            p50[v.name].append(percentile(latencies, 50) * 1e3)
    return {
        name: {
            "requests_per_s": statistics.median(rates[name]),
            "repeat_requests_per_s": rates[name],
            "server_cpu_us": statistics.median(cpu[name]),
            "p50_ms": statistics.median(p50[name]),
        }
        for name in rates
    }


def report(layout: str, clients: int, trips: dict[str, Any], rates: dict[str, Any], note: str) -> None:
    peer, floor = trips[PEER], trips[FLOOR]
    rows = []
    for name, s in trips.items():
        s["over_floor_ms"] = s["p50_ms"] - floor["p50_ms"]
        s["p50_x_peer"] = ratio(s["p50_ms"], peer["p50_ms"])
        s["cpu_x_peer"] = ratio(s["server_cpu_us"], peer["server_cpu_us"])
        rows.append(
            [name, s["p50_ms"], spread(s["round_p50_ms"]), s["over_floor_ms"], s["p99_ms"], s["p50_x_peer"],
             s["server_cpu_us"], s["cpu_x_peer"]]
        )  # fmt: skip
    print_table(
        f"Round trip, one robot, {layout} keys, {note}",
        ["server / protocol", "p50 ms", "round p50s", "p50 - floor ms", "p99 ms", f"p50 x {PEER}",
         "server CPU us/req", f"CPU x {PEER}"],
        rows,
    )  # fmt: skip
    if not rates:
        return
    rows = []
    for name, s in rates.items():
        s["x_peer"] = ratio(s["requests_per_s"], rates[PEER]["requests_per_s"])
        s["x_floor"] = ratio(s["requests_per_s"], rates[FLOOR]["requests_per_s"])
        rows.append(
            [name, s["requests_per_s"], spread(s["repeat_requests_per_s"]), s["x_peer"], s["x_floor"],
             s["p50_ms"], s["server_cpu_us"]]
        )  # fmt: skip
    print_table(
        f"Throughput, {clients} closed-loop robots, {layout} keys, {note}",
        ["server / protocol", "req/s", "repeats", f"x {PEER}", "x floor", "p50 ms", "server CPU us/req"],
        rows,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter points (about 2 min)")
    parser.add_argument("--layouts", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per variant")
    parser.add_argument("--requests", type=int, default=None, help="requests per variant per round")
    parser.add_argument("--cameras", type=int, default=2, help="camera images per observation (0-2)")
    parser.add_argument("--side", type=int, default=224, help="image height and width")
    parser.add_argument("--clients", type=int, default=8, help="robots of the throughput point (0: skip it)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per throughput point")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats per throughput point")
    parser.add_argument(
        "--baseline-src", default=None, help="also run a rollserve importing from this src dir"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (7 if args.quick else 10)
    count = args.requests or (150 if args.quick else 300)
    duration = args.duration or (1.5 if args.quick else 3.0)
    repeats = args.repeats or (3 if args.quick else 5)

    chosen = variants(args.baseline_src is not None)
    results: dict[str, Any] = {"rounds": rounds, "requests_per_round": count, "layouts": {}}
    pool = RobotPool(args.clients) if args.clients else None
    try:
        for layout in args.layouts:
            obs_kwargs = {"cameras": args.cameras, "side": args.side, "layout": layout}
            obs = make_observation(**obs_kwargs)
            policy_args = {"camera_names": list(obs.images)}
            with ExitStack() as stack:
                servers = {
                    k: stack.enter_context(running(s))
                    for k, s in start_servers(layout, policy_args, args.baseline_src).items()
                }
                trips = round_trips(servers, chosen, obs_kwargs, rounds, count)
                rates = (
                    throughput(servers, chosen, pool, args.clients, obs_kwargs, duration, repeats)
                    if pool
                    else {}
                )
            payload_kb = sum(image.nbytes for image in obs.images.values()) / 1e3
            note = (
                f"{POLICIES[layout].split(':')[1]}, {len(obs.images)} x {args.side}x{args.side} images "
                f"= {payload_kb:.0f} kB"
            )
            report(layout, args.clients, trips, rates, note)
            results["layouts"][layout] = {
                "policy": POLICIES[layout],
                "observation": obs_kwargs,
                "round_trip": trips,
                "throughput": {
                    "clients": args.clients,
                    "duration_s": duration,
                    "repeats": repeats,
                    "variants": rates,
                },
            }
    finally:
        if pool:
            pool.close()
    emit_json("roundtrip", results)
    return results


if __name__ == "__main__":
    main()
