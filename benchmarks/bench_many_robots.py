"""Many robots: 1, 4, 8, 16 concurrent clients, aggregate requests/s and p99 latency.

Each robot is its own process (spawned once, reused), sending its next observation as soon as the
previous chunk arrives (closed loop, no think time), so the numbers are serving capacity. Every
server runs in its own subprocess with one math thread and serves the same policy object, one of
two models (``--model``; both by default):

- ``gpu-like``: ``chunk_policy(latency_s=0.01)``, a model call that takes 10 ms whatever the
  batch size and leaves the CPU free meanwhile, as waiting on a GPU kernel does;
- ``mlp``: ``wide_mlp``, real compute on this CPU (its cost still grows with the batch on a CPU:
  see the calibration line in the JSON).

Variants: openpi-server (the peer, one inference at a time on its event loop), rollserve with
batching off (``--max-batch 1``), and with batching on (``--max-batch 16``) through its session
protocol and through its openpi endpoint. Points are interleaved across variants and repeated; the
table shows medians over repeats and the ratio to openpi-server.
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
from common import emit_json, percentile, print_table
from loopback import RobotPool, ServerProcess, running, start_openpi_server, start_rollserve

PEER = "openpi-server"
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu-like": (
        "rollserve.models.simple_policies:chunk_policy",
        {"state_dim": 8, "action_dim": 8, "chunk_size": 50, "latency_s": 0.01},
    ),
    "mlp": ("rollserve.models.simple_policies:wide_mlp", {"state_dim": 8, "action_dim": 8, "width": 2048}),
}


@dataclass(frozen=True)
class Variant:
    name: str
    server: str  # "rollserve-on", "rollserve-off" or "peer"
    protocol: str  # a key of loopback.ROBOTS


VARIANTS = (
    Variant(PEER, "peer", "openpi"),
    Variant("rollserve, batching off", "rollserve-off", "session"),
    Variant("rollserve, batching on", "rollserve-on", "session"),
    Variant("rollserve openpi endpoint, batching on", "rollserve-on", "openpi"),
)


# -- the benchmark --------------------------------------------------------------------------------------
def calibrate(model: str, batches: tuple[int, ...] = (1, 8, 16)) -> dict[int, float]:
    """In-process milliseconds per model call at a few batch sizes (one math thread, like the servers)."""
    import numpy as np
    import torch

    from rollserve.models.loading import load_policy
    from rollserve.models.policy import PolicyRequest

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, kwargs = MODELS[model]
        policy: Any = load_policy(spec, **kwargs)
        request = PolicyRequest({"state": np.zeros(8, np.float32)}, 0, None)
        out = {}
        for batch in batches:
            policy.predict_action_chunks([request] * batch)
            started = time.perf_counter()
            for _ in range(5):
                policy.predict_action_chunks([request] * batch)
            out[batch] = (time.perf_counter() - started) / 5 * 1e3
        return out
    finally:
        torch.set_num_threads(threads)


def batch_counters(server: ServerProcess) -> tuple[float, float]:
    """``(sum, count)`` of rollserve's policy batch-size histogram: one sample per model call, so
    sum / count is the mean number of requests per model call."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5.0).text
    values = {}
    for line in text.splitlines():
        for field in ("sum", "count"):
            if line.startswith(f'rollserve_batch_size_{field}{{kind="policy"}}'):
                values[field] = float(line.split()[-1])
    return values.get("sum", 0.0), values.get("count", 0.0)


def start_servers(model: str, max_wait_ms: float) -> dict[str, ServerProcess]:
    spec, kwargs = MODELS[model]
    return {
        "peer": start_openpi_server(spec, kwargs),
        "rollserve-off": start_rollserve(spec, kwargs, max_batch=1, max_wait_ms=0.0),
        "rollserve-on": start_rollserve(spec, kwargs, max_batch=16, max_wait_ms=max_wait_ms),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1.5 s points, 3 repeats (about 4 min)")
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--duration", type=float, default=None, help="seconds per point")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per point (median reported)")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="rollserve's batching window")
    args = parser.parse_args(argv)
    duration = args.duration or (1.5 if args.quick else 4.0)
    repeats = args.repeats or (3 if args.quick else 5)
    models = list(MODELS) if args.model == "both" else [args.model]

    results: dict[str, Any] = {"duration_s": duration, "repeats": repeats, "models": {}}
    pool = RobotPool(max(args.clients))
    try:
        for model in models:
            results["models"][model] = run_model(
                model, pool, args.clients, duration, repeats, args.max_wait_ms
            )
    finally:
        pool.close()
    emit_json("many_robots", results)
    return results


def run_model(
    model: str, pool: RobotPool, clients: list[int], duration: float, repeats: int, max_wait_ms: float
) -> dict[str, Any]:
    calibration = calibrate(model)
    points: dict[str, dict[int, list[tuple[float, float, float, float]]]] = {
        v.name: {n: [] for n in clients} for v in VARIANTS
    }
    with ExitStack() as stack:
        servers = {k: stack.enter_context(running(s)) for k, s in start_servers(model, max_wait_ms).items()}
        for n in clients:
            for _ in range(repeats):
                for variant in VARIANTS:
                    server = servers[variant.server]
                    before = batch_counters(server) if variant.server != "peer" else (0.0, 0.0)
                    latencies = pool.run(n, variant.protocol, server.port, duration)
                    after = batch_counters(server) if variant.server != "peer" else (1.0, 1.0)
                    batch = (after[0] - before[0]) / max(after[1] - before[1], 1.0)
                    points[variant.name][n].append(
                        (len(latencies) / duration, percentile(latencies, 50) * 1e3,
                         percentile(latencies, 99) * 1e3, batch)
                    )  # fmt: skip
    table: dict[str, dict[int, dict[str, float]]] = {}
    for name, by_n in points.items():
        table[name] = {
            n: {
                "requests_per_s": statistics.median(p[0] for p in reps),
                "p50_ms": statistics.median(p[1] for p in reps),
                "p99_ms": statistics.median(p[2] for p in reps),
                "mean_batch": statistics.median(p[3] for p in reps),
            }
            for n, reps in by_n.items()
        }
    rows = []
    for n in clients:
        peer_rate = table[PEER][n]["requests_per_s"]
        for name in table:
            cell = table[name][n]
            cell["x_peer"] = cell["requests_per_s"] / peer_rate if peer_rate else float("nan")
            rows.append(
                [n, name, *(cell[k] for k in ("requests_per_s", "x_peer", "p50_ms", "p99_ms", "mean_batch"))]
            )
    spec, kwargs = MODELS[model]
    calls = ", ".join(f"batch {b}: {ms:.1f} ms" for b, ms in calibration.items())
    print_table(
        f"Many robots, model {model!r} ({calls} per call in-process), {duration:g} s per point, "
        f"median of {repeats}",
        ["robots", "server", "req/s", f"x {PEER}", "p50 ms", "p99 ms", "batch"],
        rows,
    )
    return {"policy": spec, "policy_args": kwargs, "calibration_ms": calibration, "points": table}


if __name__ == "__main__":
    main()
