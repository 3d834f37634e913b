"""Server CPU per REST request of the rollout API, A/B across source trees.

What one request costs the server beyond its world step decides how many trainers (and how many
hostile clients) one event loop can take. This runs ``rollserve serve --world WORLD`` from each
tree (``--src``, e.g. ``git archive`` of an older commit; this tree by default), all at once, and
drives each with one closed-loop client, round after round, the trees interleaved within each
round so background load hits them alike. Per request kind it reports the server process's CPU
(its ``/proc`` counters: far less noisy on a shared box than wall time) and the client's wall
time, medians of the rounds, and each tree's CPU against the first tree's, round by round
(the median of those ratios and their range):

- ``step``: a valid step of one session (JSON), each the next step id;
- ``status``: ``GET`` that session's status;
- ``malformed``: a step whose body is not JSON (what a sloppy or hostile client sends; the
  servers run with ``--refusal-delay-ms 0``, so refusals are not slowed down on purpose);
- ``healthz``: FastAPI's own ``/healthz`` route, a control the rollout routes' changes do not touch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, print_table
from loopback import ServerProcess, cpu_seconds, running, start_rollserve

from rollserve.cli import positive_int

KINDS = ("step", "status", "malformed", "healthz")
NO_DELAY = ("--refusal-delay-ms", "0")  # refusals answered at once: their CPU, not a deliberate wait


class _Target:
    """One server and the session its requests use."""

    def __init__(self, server: ServerProcess, world: str) -> None:
        self.pid = server.process.pid
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30.0)
        created = self.client.post("/v1/realtime/sessions", json={"model": world})
        created.raise_for_status()
        self.session = created.json()["session_id"]
        self.next_step = 0

    def request(self, kind: str) -> None:
        path = f"/v1/realtime/sessions/{self.session}"
        if kind == "step":
            action = {"joint_positions": [0.0] * 7, "gripper_position": 0.0}
            body = {"step_id": self.next_step, "observation": {}, "action": action}
            answer = self.client.post(f"{path}/step", json=body)
            answer.raise_for_status()
            self.next_step += 1
        elif kind == "status":
            self.client.get(f"{path}/status").raise_for_status()
        elif kind == "malformed":
            json_type = {"content-type": "application/json"}
            answer = self.client.post(f"{path}/step", content=b"{not json", headers=json_type)
            if answer.status_code != 400:
                raise RuntimeError(f"a malformed body got {answer.status_code}, not 400")
        else:
            self.client.get("/healthz").raise_for_status()

    def measure(self, kind: str, count: int) -> dict[str, float]:
        """Server CPU and client wall time per request, over ``count`` requests in a row."""
        for _ in range(10):  # warm the connection and the route
            self.request(kind)
        cpu0, started = cpu_seconds(self.pid), time.perf_counter()
        for _ in range(count):
            self.request(kind)
        wall = time.perf_counter() - started
        cpu = cpu_seconds(self.pid) - cpu0
        return {"server_us": cpu / count * 1e6, "wall_us": wall / count * 1e6}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 300 requests per kind")
    parser.add_argument("--world", default="toy", help="a world rollserve serves (default: toy)")
    parser.add_argument(
        "--requests", type=positive_int, default=None, help="per kind and round (default 1000)"
    )
    parser.add_argument("--rounds", type=positive_int, default=None, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--src", action="append", default=[], help="a source tree's src/ to serve from (repeatable)"
    )
    args = parser.parse_args(argv)
    count = args.requests or (300 if args.quick else 1000)
    rounds = args.rounds or (3 if args.quick else 7)
    trees: list[str | None] = [*args.src] or [None]
    names = [str(tree or "this tree") for tree in trees]
    samples: dict[tuple[str, str], list[dict[str, float]]] = {(n, k): [] for n in names for k in KINDS}
    with ExitStack() as stack:
        servers = [
            stack.enter_context(running(start_rollserve(world=args.world, pythonpath=tree, extra=NO_DELAY)))
            for tree in trees
        ]
        targets = [_Target(server, args.world) for server in servers]
        try:
            for _ in range(rounds):
                for kind in KINDS:
                    for name, target in zip(names, targets, strict=True):
                        samples[(name, kind)].append(target.measure(kind, count))
        finally:
            for target in targets:
                target.client.close()
    rows, results = [], {}
    for kind in KINDS:
        base_runs = [run["server_us"] for run in samples[(names[0], kind)]]
        for name in names:
            runs = [run["server_us"] for run in samples[(name, kind)]]
            ratios = [own / base for own, base in zip(runs, base_runs, strict=True)]  # round by round
            result = {
                "server_us": statistics.median(runs),
                "range": [min(runs), max(runs)],
                "ratio": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "wall_us": statistics.median(run["wall_us"] for run in samples[(name, kind)]),
            }
            results.setdefault(name, {})[kind] = result
            rows.append(
                [
                    kind,
                    name,
                    result["server_us"],
                    f"{min(runs):.0f}-{max(runs):.0f}",
                    result["ratio"],
                    f"{min(ratios):.2f}-{max(ratios):.2f}",
                    result["wall_us"],
                ]
            )
    print_table(
        f"REST requests on world {args.world!r}: server CPU per request, median of {rounds} rounds x {count}"
        f" (load {os.getloadavg()[0]:.1f})",
        [
            "request",
            "server source",
            "server CPU us",
            "rounds",
            f"x {names[0]}",
            "x per round",
            "client wall us",
        ],
        rows,
    )
    out = {"world": args.world, "requests": count, "rounds": rounds, "trees": results}
    emit_json("rest_cpu", out)
    return out


if __name__ == "__main__":
    main()
