"""CPU per ``batch_step``: where one N-session batch goes, in the server and in the client, A/B.

A busy 2-core box makes wall-clock times swing by 2x from one minute to the next; CPU seconds swing
much less. This drives ``POST /v1/realtime/batch_step`` of N sessions of a served world for a few
seconds and reports, per batch: the wall time, the client's CPU, the server process's CPU and the
part of it spent on the server's event-loop thread (everything but the model, which runs on the
engine thread). ``--src`` runs the server from other source trees (e.g. ``git archive`` of an
older commit), rounds interleaved, so each change gets its own row measured under the same load.
``--together`` runs every tree's server at once and alternates them batch by batch: on a machine
whose load changes from one second to the next, that is the only fair split (the client is this
tree's in every row, so only the server columns compare trees). ``--client-src`` adds, in that
mode, a row per client tree: that tree's ``RolloutClient`` (loaded from its file) driving its own
sessions on the first server, so the client columns compare client code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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

from rollserve.cli import positive_float, positive_int


def _cpu_s(path: str) -> float:
    """utime + stime of a process or thread, from its ``/proc`` stat line."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    world: str, src: str | None, sessions: int, seconds: float, frames: bool, path: str = "items"
) -> dict[str, float]:
    """One server (from ``src``, or this tree), N sessions, batch_step for ``seconds``: ms per batch.
    ``path`` is ``items`` (``batch_step``) or ``columns`` (``batch_step/columns``)."""
    from rollserve.models.worlds import load_world

    spec = load_world(world).spec
    with running(start_rollserve(world=world, pythonpath=src)) as server:
        pid = server.process.pid
        render = {"cameras": [spec.cameras[0]], "height": 64, "width": 64} if frames else None
        rollouts = Rollouts(f"http://127.0.0.1:{server.port}", spec.name, sessions, render)
        step = rollouts.batch_step_columns if path == "columns" else rollouts.batch_step
        try:
            rng = np.random.default_rng(0)
            for _ in range(3):  # warm-up, not counted
                step(random_actions(spec, sessions, rng))
            server0, loop0 = _cpu_s(f"/proc/{pid}/stat"), _cpu_s(f"/proc/{pid}/task/{pid}/stat")
            client0, started, batches = time.process_time(), time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                step(random_actions(spec, sessions, rng))
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


def _client_module(src: str) -> Any:
    """``rollserve.client.rollout_client`` as another tree has it, under a name of its own."""
    path = Path(src) / "rollserve" / "client" / "rollout_client.py"
    name = f"rollout_client_{abs(hash(src))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def measure_together(
    world: str,
    trees: list[str | None],
    sessions: int,
    seconds: float,
    frames: bool,
    client_trees: list[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Every tree's server at once, one batch each in turn for ``seconds``: ms per batch per tree
    (and per client tree: its client against the first server)."""
    from rollserve.models.worlds import load_world

    spec = load_world(world).spec
    render = {"cameras": [spec.cameras[0]], "height": 64, "width": 64} if frames else None
    rng = np.random.default_rng(0)
    client_trees = client_trees or []
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(running(start_rollserve(world=world, pythonpath=t))) for t in trees]
        rollouts = []
        for server in servers:
            rollouts.append(Rollouts(f"http://127.0.0.1:{server.port}", spec.name, sessions, render))
            stack.callback(rollouts[-1].close)
        for src in client_trees:
            url = f"http://127.0.0.1:{servers[0].port}"
            rollouts.append(Rollouts(url, spec.name, sessions, render, client_module=_client_module(src)))
            stack.callback(rollouts[-1].close)
        for r in rollouts:
            for _ in range(3):  # warm-up, not counted
                r.batch_step(random_actions(spec, sessions, rng))
        pids = [server.process.pid for server in servers] + [servers[0].process.pid] * len(client_trees)
        server0 = [_cpu_s(f"/proc/{pid}/stat") for pid in pids]
        loop0 = [_cpu_s(f"/proc/{pid}/task/{pid}/stat") for pid in pids]
        wall, client = [0.0] * len(rollouts), [0.0] * len(rollouts)
        started, batches = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            actions = random_actions(spec, sessions, rng)
            for k, r in enumerate(rollouts):
                w0, c0 = time.perf_counter(), time.process_time()
                r.batch_step(actions)
                wall[k] += time.perf_counter() - w0
                client[k] += time.process_time() - c0
            batches += 1
        server_cpu = [_cpu_s(f"/proc/{pid}/stat") - s0 for pid, s0 in zip(pids, server0, strict=True)]
        loop = [_cpu_s(f"/proc/{pid}/task/{pid}/stat") - l0 for pid, l0 in zip(pids, loop0, strict=True)]
    per = 1000.0 / batches
    names = [str(tree or "this tree") for tree in trees] + [f"client {src}" for src in client_trees]
    out = {}
    for k, name in enumerate(names):
        out[name] = {"wall_ms": wall[k] * per, "client_ms": client[k] * per}
        if k < len(trees) and not (k == 0 and client_trees):  # client rows share the first server
            out[name] |= {"server_ms": server_cpu[k] * per, "loop_ms": loop[k] * per}
        else:
            out[name] |= {"server_ms": float("nan"), "loop_ms": float("nan")}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 s per point, one round")
    parser.add_argument("--world", default="video", help="a world rollserve serves (default: video)")
    parser.add_argument("--sessions", type=positive_int, default=32)
    parser.add_argument("--seconds", type=positive_float, default=None, help="per point (default 8)")
    parser.add_argument("--rounds", type=positive_int, default=None, help="interleaved rounds (default 3)")
    parser.add_argument("--frames", action="store_true", help="every session renders its first camera")
    parser.add_argument(
        "--columns",
        action="store_true",
        help="also measure batch_step/columns (a row per tree; not with --frames or --together)",
    )
    parser.add_argument(
        "--src", action="append", default=[], help="a source tree's src/ to serve from (repeatable)"
    )
    parser.add_argument(
        "--together", action="store_true", help="all trees' servers at once, alternating batch by batch"
    )
    parser.add_argument(
        "--client-src", action="append", default=[], help="with --together: a tree's client too (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.client_src and not args.together:  # else every run is measured, then the table has no rows
        parser.error("--client-src only applies with --together")
    if args.columns and (args.frames or args.together):
        parser.error("--columns measures sessions without frames, one server at a time")
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 8.0)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    trees: list[str | None] = [*args.src] or [None]
    samples: dict[str, list[dict[str, float]]] = {str(t or "this tree"): [] for t in trees}
    samples |= {f"client {src}": [] for src in args.client_src}
    paths = ["items", "columns"] if args.columns else ["items"]
    samples |= {f"{t or 'this tree'} (columns)": [] for t in trees if args.columns}
    for _ in range(rounds):  # interleaved, so background load hits every tree alike
        if args.together:
            runs = measure_together(args.world, trees, args.sessions, seconds, args.frames, args.client_src)
            for name, run in runs.items():
                samples[name].append(run)
            continue
        for tree in trees:
            for path in paths:
                name = str(tree or "this tree") + (" (columns)" if path == "columns" else "")
                samples[name].append(measure(args.world, tree, args.sessions, seconds, args.frames, path))
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
