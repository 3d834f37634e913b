"""CPU per ``batch_step``: where one N-session batch goes, in the server and in the client, A/B.

A busy 2-core box makes wall-clock times swing by 2x from one minute to the next; CPU seconds swing
much less. This drives ``POST /v1/realtime/batch_step`` of N sessions of a served world for a few
seconds and reports, per batch: the wall time, the client's CPU, the server process's CPU and the
part of it spent on the server's event-loop thread (everything but the model, which runs on the
engine thread). ``--src`` runs the server from other source trees (e.g. ``git archive`` of an
older commit), rounds interleaved, so each change gets its own row measured under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollouts import Rollouts, random_actions
from common import emit_json, print_table
from loopback import running, start_rollserve


def _cpu_s(path: str) -> float:
    """utime + stime of a process or thread, from its ``/proc`` stat line."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(world: str, src: str | None, sessions: int, seconds: float, frames: bool) -> dict[str, float]:
    """One server (from ``src``, or this tree), N sessions, batch_step for ``seconds``: ms per batch."""
    from rollserve.models.worlds import load_world

    spec = load_world(world).spec
    with running(start_rollserve(world=world, pythonpath=src)) as server:
        pid = server.process.pid
        render = {"cameras": [spec.cameras[0]], "height": 64, "width": 64} if frames else None
        rollouts = Rollouts(f"http://127.0.0.1:{server.port}", spec.name, sessions, render)
        try:
            rng = np.random.default_rng(0)
            for _ in range(3):  # warm-up, not counted
                rollouts.batch_step(random_actions(spec, sessions, rng))
            server0, loop0 = _cpu_s(f"/proc/{pid}/stat"), _cpu_s(f"/proc/{pid}/task/{pid}/stat")
            client0, started, batches = time.process_time(), time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                rollouts.batch_step(random_actions(spec, sessions, rng))
                batches += 1
            wall = time.perf_counter() - started
            client = time.process_time() - client0
            server_cpu = _cpu_s(f"/proc/{pid}/stat") - server0
            loop = _cpu_s(f"/proc/{pid}/task/{pid}/stat") - loop0
        finally:
            rollouts.close()
    per = 1000.0 / batches
    return {
        "wall_ms": wall * per,
        "client_ms": client * per,
        "server_ms": server_cpu * per,
        "loop_ms": loop * per,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 s per point, one round")
    parser.add_argument("--world", default="video", help="a world rollserve serves (default: video)")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=None, help="per point (default 8)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    parser.add_argument("--frames", action="store_true", help="every session renders its first camera")
    parser.add_argument(
        "--src", action="append", default=[], help="a source tree's src/ to serve from (repeatable)"
    )
    args = parser.parse_args(argv)
    seconds = args.seconds or (2.0 if args.quick else 8.0)
    rounds = args.rounds or (1 if args.quick else 3)
    trees: list[str | None] = [*args.src] or [None]
    samples: dict[str, list[dict[str, float]]] = {str(t or "this tree"): [] for t in trees}
    for _ in range(rounds):  # interleaved, so background load hits every tree alike
        for tree in trees:
            samples[str(tree or "this tree")].append(
                measure(args.world, tree, args.sessions, seconds, args.frames)
            )
    rows, results = [], {}
    for name, runs in samples.items():
        medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        results[name] = {**medians, "runs": runs}
        per_item = medians["wall_ms"] * 1000.0 / args.sessions
        rows.append(
            [
                name,
                medians["wall_ms"],
                per_item,
                medians["client_ms"],
                medians["server_ms"],
                medians["loop_ms"],
            ]
        )
    print_table(
        f"batch_step of {args.sessions} sessions on world {args.world!r}"
        f"{' with frames' if args.frames else ''}: ms per batch, median of {rounds} x {seconds:g} s"
        f" (load {os.getloadavg()[0]:.1f})",
        ["server source", "wall", "wall us/item", "client CPU", "server CPU", "event-loop CPU"],
        rows,
    )
    out = {"world": args.world, "sessions": args.sessions, "frames": args.frames, "trees": results}
    emit_json("batch_step_cpu", out)
    return out


if __name__ == "__main__":
    main()
