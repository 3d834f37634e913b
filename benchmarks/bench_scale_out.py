"""Scale-out on Ray Serve: what the shared store costs per step, and what replicas give on this box.

Needs the Ray venv (``pip install -e ".[ray,test]"``). Two parts, each against a baseline measured
in the same run:

1. Per-step cost of the shared committed-state store: one session stepped back to back through
   ``RolloutService`` (no HTTP) with the single-process store, and with the shared store over the
   real Ray actor; interleaved rounds, medians, spread (min-max) and the floor (the fastest round).
2. Through HTTP: rollout steps/s (8 sessions from 8 threads, msgpack) and policy requests/s
   (4 robots on the session protocol, the shipped flow policy) for the single-process server and
   Ray Serve at 1 and 2 replicas. Deployments come up one after the other, so these are blocks of
   repeated rounds, not interleaved; the single-process numbers are measured between them.

    python benchmarks/bench_scale_out.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray
from ray import serve

from rollserve.client import PolicyClient
from rollserve.client.rollout_client import RolloutClient
from rollserve.models.worlds import ToyWorld
from rollserve.scale.actor import table_actor, table_call
from rollserve.scale.deployment import build_app
from rollserve.scale.launch import free_port
from rollserve.scale.store import SharedRolloutStore
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.rollout.protocol import Action, CreateSessionRequest, Observation, RolloutStepRequest
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

POLICY = "rollserve.models.checkpoint:load_default"
SESSIONS, STEPS, ROBOTS, POLICY_S = 8, 40, 4, 4.0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} (spread {min(values):.1f}-{max(values):.1f})"


# -- 1. the store, without HTTP --------------------------------------------------------------------------
async def step_cost_us(service: RolloutService, steps: int) -> float:
    sid = (await service.create_session(CreateSessionRequest(model="toy", seed=0))).session_id
    action = Action(joint_positions=[0.1] * 7, gripper_position=[0.5])
    start = time.perf_counter()
    for t in range(steps):
        answer = await service.step(
            sid, RolloutStepRequest(step_id=t, observation=Observation(), action=action)
        )
        assert answer.error is None
    elapsed = time.perf_counter() - start
    await service.close_session(sid)
    return elapsed / steps * 1e6


def store_overhead(rounds: int, steps: int = 300) -> dict[str, float]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    local = RolloutService(ToyWorld(), settings)
    actor = table_actor("bench-committed-state", 256, 600.0)
    shared = RolloutService(ToyWorld(), settings, store=SharedRolloutStore(table_call(actor), 256))
    samples: dict[str, list[float]] = {"single-process store": [], "shared store (Ray actor)": []}

    async def run() -> None:
        for _ in range(rounds):  # interleaved
            samples["single-process store"].append(await step_cost_us(local, steps))
            samples["shared store (Ray actor)"].append(await step_cost_us(shared, steps))

    asyncio.run(run())
    local.close()
    shared.close()
    ray.kill(actor)
    base = statistics.median(samples["single-process store"])
    print("\nper-step cost through RolloutService (toy world, one session, no HTTP), µs")
    for name, values in samples.items():
        ratio = statistics.median(values) / base
        print(f"  {name:26s} {spread(values):32s} floor {min(values):.1f}  ratio {ratio:.2f}x")
    extra = statistics.median(samples["shared store (Ray actor)"]) - base
    print(f"  shared store adds {extra:.0f} µs per step (2 actor round trips: open + commit)")
    return {name: statistics.median(values) for name, values in samples.items()} | {"added_us": extra}


# -- 2. through HTTP ---------------------------------------------------------------------------------------
def rollout_steps_per_s(url: str, tag: str) -> float:
    def worker(k: int) -> None:
        with RolloutClient(url) as client:
            sid, _ = client.create_session("toy", seed=k, session_id=f"{tag}-{k}")
            for t in range(STEPS):
                client.step(sid, t, np.full(8, 0.1, np.float32))
            client.close_session(sid)

    start = time.perf_counter()
    with ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(worker, range(SESSIONS)))
    return SESSIONS * STEPS / (time.perf_counter() - start)


def policy_requests_per_s(ws_url: str) -> float:
    counts = [0] * ROBOTS
    barrier = threading.Barrier(ROBOTS)

    def robot(i: int) -> None:
        with PolicyClient(f"{ws_url}/v1/policy/ws") as client:
            client.open_session(state_dim=13)
            state = np.zeros(13, np.float32)
            client.predict(state)
            barrier.wait()
            end = time.perf_counter() + POLICY_S
            while time.perf_counter() < end:
                client.predict(state)
                counts[i] += 1

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(ROBOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / POLICY_S


def measure(http_url: str, ws_url: str, rounds: int, tag: str) -> tuple[list[float], list[float]]:
    rollouts = [rollout_steps_per_s(http_url, f"{tag}{r}") for r in range(rounds)]
    policy = [policy_requests_per_s(ws_url) for _ in range(rounds)]
    return rollouts, policy


def single_process(rounds: int, tag: str) -> tuple[list[float], list[float]]:
    settings = ServerSettings()
    policy = PolicyService.from_spec(POLICY, settings)
    app = create_app(settings, policy=policy, rollout=RolloutService(ToyWorld(), settings))
    with serving(app) as server:
        return measure(server.http_url, server.ws_url, rounds, tag)


def on_ray(replicas: int, rounds: int, port: int) -> tuple[list[float], list[float], float]:
    started = time.perf_counter()
    app = build_app({"policy": POLICY, "world": "toy", "replicas": replicas, "replica_cpus": 1})
    serve.run(app, name="rollserve", route_prefix="/")
    up = time.perf_counter() - started
    try:
        rollouts, policy = measure(
            f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", rounds, f"r{replicas}"
        )
    finally:
        serve.delete("rollserve")
        ray.kill(ray.get_actor("rollserve-committed-state", namespace="rollserve"))
    return rollouts, policy, up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, namespace="rollserve", log_to_driver=False)
    store = store_overhead(args.rounds)
    port = free_port("127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rows = {}
    rows["single process (a)"] = single_process(args.rounds, "a")
    *r1, up1 = on_ray(1, args.rounds, port)
    rows["single process (b)"] = single_process(args.rounds, "b")
    *r2, up2 = on_ray(2, args.rounds, port)
    rows["Ray Serve, 1 replica"], rows["Ray Serve, 2 replicas"] = tuple(r1), tuple(r2)
    base_roll = statistics.median(rows["single process (a)"][0] + rows["single process (b)"][0])
    base_pol = statistics.median(rows["single process (a)"][1] + rows["single process (b)"][1])
    print(f"\nthrough HTTP, {args.rounds} rounds each (median, spread); ratios against the single process")
    print(f"  {'server':24s} {'rollout steps/s':34s} {'ratio':7s} {'policy req/s':34s} ratio")
    for name, (rollouts, policy) in rows.items():
        print(
            f"  {name:24s} {spread(rollouts):34s} {statistics.median(rollouts) / base_roll:.2f}x   "
            f"{spread(policy):34s} {statistics.median(policy) / base_pol:.2f}x"
        )
    print(f"  deployments came up in {up1:.1f} s (1 replica) and {up2:.1f} s (2 replicas)")
    serve.shutdown()
    ray.shutdown()
    summary = {name: [statistics.median(r), statistics.median(p)] for name, (r, p) in rows.items()}
    print(json.dumps({"store": store, "http": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
