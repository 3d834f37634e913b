"""A LeRobot SmolVLA checkpoint served by rollserve: RTC guidance over the network, and batching.

Runs in the LeRobot venv (see docs/lerobot.md). The checkpoint is a tiny random-init SmolVLA saved
by LeRobot (``rollserve.adapters.lerobot.tiny``), served through ``lerobot:DIR`` by a real server
on 127.0.0.1; robots are rollserve ``PolicyClient``s over real websockets.

1. **Guidance effect.** A robot gets a chunk, then asks again with the rest of it as the RTC prefix
   and a delay ``d``. The frozen-prefix error is mean |new[:d] - prefix[:d]| (model space): with
   the prefix sent (LeRobot's RTC guidance, server side) against the same request without it (the
   baseline, same run, same observations).
2. **Batching.** 1 robot, then 4 robots in closed loop (each sends its next RTC request as soon as
   its chunk arrives, delay 2 for all, so LeRobot's one-delay-per-call rule lets them share a call),
   with batching off (``max_batch 1``) and on (``max_batch 4``); each server is a ``rollserve serve``
   subprocess with one math thread, the robots threads of this process. Rounds interleaved; medians.
   Also the model alone: 4 requests in one ``predict_action_chunks`` call vs one call each.

    python benchmarks/bench_lerobot.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, percentile, print_table
from loopback import running, start_rollserve

from rollserve.adapters.lerobot import load_lerobot_policy, tiny
from rollserve.client import PolicyClient
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

CAMERAS = tiny.CAMERAS
TASK = "put the cube in the bowl"
HORIZON = 8


def _obs(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 + seed)
    return {
        "state": (rng.standard_normal(tiny.STATE_DIM) * 0.5).astype(np.float32),
        "images": {cam: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for cam in CAMERAS},
    }


def guidance_effect(policy: Any, delays: list[int], episodes: int) -> list[dict[str, Any]]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = PolicyService(policy, settings)
    rows = []
    with serving(create_app(settings, policy=service)) as running:
        for delay in delays:
            guided, plain = [], []
            for episode in range(episodes):
                obs = _obs(episode)
                with PolicyClient(running.ws_url + "/v1/policy/ws") as client:
                    client.open_session(state_dim=tiny.STATE_DIM, camera_names=CAMERAS, task=TASK)
                    first = client.predict(obs["state"], obs["images"], task=TASK).chunk_model
                    prefix = np.ascontiguousarray(first[delay : delay + HORIZON])
                    with_rtc = client.predict(
                        obs["state"], obs["images"], task=TASK,
                        inference_delay_steps=delay, prefix_model=prefix,
                    ).chunk_model  # fmt: skip
                    without = client.predict(obs["state"], obs["images"], task=TASK).chunk_model
                guided.append(float(np.abs(with_rtc[:delay] - prefix[:delay]).mean()))
                plain.append(float(np.abs(without[:delay] - prefix[:delay]).mean()))
            rows.append(
                {
                    "delay": delay,
                    "episodes": episodes,
                    "guided_median": statistics.median(guided),
                    "guided_max": max(guided),
                    "plain_median": statistics.median(plain),
                    "plain_min": min(plain),
                    "ratio": statistics.median(guided) / statistics.median(plain),
                }
            )
    service.close()
    return rows


def _robot(url: str, seed: int, requests: int, latencies: list[float], batches: list[int]) -> None:
    obs = _obs(seed)
    with PolicyClient(url) as client:
        client.open_session(state_dim=tiny.STATE_DIM, camera_names=CAMERAS, task=TASK)
        chunk = client.predict(obs["state"], obs["images"], task=TASK).chunk_model
        for _ in range(requests):
            started = time.perf_counter()
            reply = client.predict(
                obs["state"], obs["images"], task=TASK,
                inference_delay_steps=2, prefix_model=np.ascontiguousarray(chunk[2 : 2 + HORIZON]),
            )  # fmt: skip
            latencies.append(time.perf_counter() - started)
            batches.append(reply.batch_size)
            chunk = reply.chunk_model


def _one_point(url: str, robots: int, requests: int) -> dict[str, float]:
    latencies: list[float] = []
    batches: list[int] = []
    threads = [
        threading.Thread(target=_robot, args=(url, seed, requests, latencies, batches))
        for seed in range(robots)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return {
        "chunks_per_s": robots * requests / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "mean_batch": statistics.fmean(batches),
    }


def batching(checkpoint: Path, rounds: int, requests: int) -> list[dict[str, Any]]:
    """Each variant is its own ``rollserve serve --policy lerobot:DIR`` subprocess (one math thread);
    the robots are threads of this process, so no robot shares the server's GIL."""
    variants = {"1 robot": (1, 4), "4 robots, batching off": (4, 1), "4 robots, batching on": (4, 4)}
    points: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                running(
                    start_rollserve(
                        f"lerobot:{checkpoint}",
                        {"seed": 0, "execution_horizon": HORIZON},
                        max_batch=max_batch,
                        max_wait_ms=5.0,
                        start_timeout_s=600.0,
                    )
                )
            )
            for name, (_, max_batch) in variants.items()
        }
        for _ in range(rounds):
            for name, (robots, _) in variants.items():
                url = f"ws://127.0.0.1:{servers[name].port}/v1/policy/ws"
                points[name].append(_one_point(url, robots, requests))
    base = statistics.median(p["chunks_per_s"] for p in points["1 robot"])
    rows = []
    for name, values in points.items():
        throughput = [p["chunks_per_s"] for p in values]
        rows.append(
            {
                "variant": name,
                "chunks_per_s": statistics.median(throughput),
                "spread": [min(throughput), max(throughput)],
                "p50_ms": statistics.median(p["p50_ms"] for p in values),
                "mean_batch": statistics.median(p["mean_batch"] for p in values),
                "x_1_robot": statistics.median(throughput) / base,
            }
        )
    return rows


def model_call(policy: Any, rounds: int) -> dict[str, Any]:
    """The model alone: 4 robots' RTC requests (delay 2) in one call vs one call each."""
    from rollserve.models.policy import PolicyRequest

    prefix = (np.random.default_rng(0).standard_normal((HORIZON, tiny.STATE_DIM)) * 0.5).astype(np.float32)

    def requests() -> list[PolicyRequest]:
        return [PolicyRequest(policy.make_processors().pre(_obs(i)), 2, prefix, HORIZON) for i in range(4)]

    together, apart = [], []
    for _ in range(rounds):
        batch = requests()
        started = time.perf_counter()
        policy.predict_action_chunks(batch)
        together.append(time.perf_counter() - started)
        batch = requests()
        started = time.perf_counter()
        for request in batch:
            policy.predict_action_chunks([request])
        apart.append(time.perf_counter() - started)
    return {
        "one_call_ms": statistics.median(together) * 1000,
        "one_call_spread_ms": [min(together) * 1000, max(together) * 1000],
        "four_calls_ms": statistics.median(apart) * 1000,
        "four_calls_spread_ms": [min(apart) * 1000, max(apart) * 1000],
        "speedup": statistics.median(apart) / statistics.median(together),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes and rounds")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    episodes, rounds, requests = (4, 3, 8) if args.quick else (10, 5, 15)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = tiny.make_smolvla(Path(tmp) / "smolvla", seed=0)
        policy = load_lerobot_policy(checkpoint, seed=0, execution_horizon=HORIZON)
        effect = guidance_effect(policy, [2, 4], episodes)
        call = model_call(policy, rounds * 3)
        batched = batching(checkpoint, rounds, requests)
    print_table(
        "SmolVLA (tiny, random init): frozen-prefix error |new[:d] - prefix[:d]|, model space",
        ["delay d", "episodes", "RTC guidance: median (max)", "no prefix: median (min)", "ratio"],
        [
            [r["delay"], r["episodes"], f"{r['guided_median']:.4f} ({r['guided_max']:.4f})",
             f"{r['plain_median']:.3f} ({r['plain_min']:.3f})", f"{r['ratio']:.4f}"]
            for r in effect
        ],
    )  # fmt: skip
    print_table(
        f"SmolVLA RTC requests (delay 2), closed loop, {rounds} interleaved rounds x {requests} per robot",
        ["variant", "chunks/s median [min, max]", "p50 ms", "mean batch", "x 1 robot"],
        [
            [r["variant"], f"{r['chunks_per_s']:.1f} [{r['spread'][0]:.1f}, {r['spread'][1]:.1f}]",
             f"{r['p50_ms']:.1f}", f"{r['mean_batch']:.2f}", f"{r['x_1_robot']:.2f}"]
            for r in batched
        ],
    )  # fmt: skip
    print_table(
        f"The model alone: 4 RTC requests (delay 2), {rounds * 3} interleaved rounds",
        ["variant", "ms median [min, max]", "x one call"],
        [
            ["4 requests, one batched call", f"{call['one_call_ms']:.1f} "
             f"[{call['one_call_spread_ms'][0]:.1f}, {call['one_call_spread_ms'][1]:.1f}]", "1.00"],
            ["4 requests, one call each", f"{call['four_calls_ms']:.1f} "
             f"[{call['four_calls_spread_ms'][0]:.1f}, {call['four_calls_spread_ms'][1]:.1f}]",
             f"{call['speedup']:.2f}"],
        ],
    )  # fmt: skip
    emit_json(
        "bench_lerobot",
        {
            "guidance": effect,
            "model_call": call,
            "batching": batched,
            "seconds": time.perf_counter() - started,
        },
    )


if __name__ == "__main__":
    main()
