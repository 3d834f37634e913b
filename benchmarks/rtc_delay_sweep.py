"""The RTC experiment: success and boundary smoothness as the inference delay grows, per strategy.

Reproduces the qualitative result of Black, Galliker and Levine (2025) on the built-in task and
policy: asynchronous execution with RTC holds up as the delay ``d`` (in control steps) grows;
naive asynchronous execution (switch to the new chunk, no guidance) jumps more and more at chunk
boundaries; synchronous execution stays smooth but stalls ``d`` ticks per chunk, so it slows down
and runs out of episode time.

Runs in simulated time (``rollserve.demo.simtime``): the robot executes ``d`` actions of the old
chunk while the new one is in flight, deterministically and as fast as the CPU allows. Each
strategy and delay sees the same seeded layouts and sampling noise. Last line: one JSON object.

    python benchmarks/rtc_delay_sweep.py --quick        # 10 episodes per cell, about a minute
    python benchmarks/rtc_delay_sweep.py                # 50 episodes per cell
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, print_table

from rollserve.cli import non_negative_int, positive_int
from rollserve.demo.metrics import summarize
from rollserve.demo.runner import strategy_names
from rollserve.demo.simtime import SimulatedRobot
from rollserve.demo.strategies import STRATEGIES
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.layout import CONTROL_HZ, MAX_EPISODE_STEPS

DEFAULT_DELAYS = (0, 1, 2, 3, 4, 6)
FIRST_SEED = 100_000  # the policy's evaluation seeds: layouts it was not trained on


def delay_list(text: str) -> list[int]:
    """argparse type: comma-separated delays in control steps, each >= 0, at least one."""
    delays = [non_negative_int(part.strip()) for part in text.split(",") if part.strip()]
    if not delays:
        raise argparse.ArgumentTypeError("at least one delay expected")
    return list(dict.fromkeys(delays))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 episodes per cell (default 50)")
    parser.add_argument("--episodes", type=positive_int, default=None, help="episodes per strategy and delay")
    parser.add_argument(
        "--delays", type=delay_list, default=list(DEFAULT_DELAYS), help="delays in control steps"
    )
    parser.add_argument(
        "--strategies", type=strategy_names, default=list(STRATEGIES), help="subset of sync, async, rtc"
    )
    parser.add_argument("--seed", type=non_negative_int, default=FIRST_SEED, help="first episode seed")
    parser.add_argument(
        "--max-steps",
        type=positive_int,
        default=None,
        help=f"episode time limit in ticks (default {MAX_EPISODE_STEPS})",
    )
    parser.add_argument(
        "--refill-margin",
        type=non_negative_int,
        default=4,
        help="async: ask when <= d + margin actions left",
    )
    parser.add_argument("--sync-steps", type=positive_int, default=8, help="sync: actions executed per chunk")
    parser.add_argument("--policy", default="rollserve.models.checkpoint:load_default", help="policy spec")
    args = parser.parse_args(argv)
    if args.episodes is None:
        args.episodes = 10 if args.quick else 50
    if args.max_steps is None:
        args.max_steps = MAX_EPISODE_STEPS
    return args


def sweep(args: argparse.Namespace) -> dict[str, dict[str, dict[str, Any]]]:
    """``results[strategy][str(delay)]`` = the strategy's figures at that delay."""
    import torch

    from rollserve.models.loading import load_policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead on a shared machine
    try:
        return _sweep(args, load_policy(args.policy))
    finally:
        torch.set_num_threads(threads)


def _sweep(args: argparse.Namespace, policy: Any) -> dict[str, dict[str, dict[str, Any]]]:
    env = TabletopPickPlaceEnv(max_episode_steps=args.max_steps)
    seeds = range(args.seed, args.seed + args.episodes)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for delay in args.delays:
        for name in args.strategies:
            started = time.perf_counter()
            robot = SimulatedRobot(
                policy, STRATEGIES[name], delay=delay, refill_margin=args.refill_margin,
                # the prefix a client sends holds >= delay + margin actions: no zero padding by the server
                execution_horizon=max(1, delay + args.refill_margin), fps=CONTROL_HZ,
                sync_steps=args.sync_steps, env=env,
            )  # fmt: skip
            traces = [robot.run_episode(seed) for seed in seeds]
            round_trips, inference = robot.source.take()
            row = summarize(traces, round_trips_ms=round_trips, inference_ms=inference)
            row["stalls_per_episode"] = row["stall_ticks"] / len(traces)
            row["ticks_per_step"] = row["ticks"] / max(row["executed_steps"], 1)
            row["mean_success_ticks"] = _mean([t.ticks for t in traces if t.success])
            results.setdefault(name, {})[str(delay)] = row
            print(
                f"d={delay} {name:<5} success {row['success_rate']:.2f}  "
                f"jump {row['boundary_jump_rad']:.4f}  {time.perf_counter() - started:.1f}s",
                file=sys.stderr, flush=True,
            )  # fmt: skip
    return results


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else float("nan")


def table_rows(results: dict[str, dict[str, dict[str, Any]]]) -> tuple[list[str], list[list[Any]]]:
    delays = list(next(iter(results.values())))
    columns = ["d"]
    if "sync" in results:
        columns += ["sync success", "sync stalls/ep", "sync slowdown"]
    for name in ("async", "rtc"):
        if name in results:
            columns += [f"{name} success", f"{name} jump rad"]
    rows = []
    for delay in delays:
        row: list[Any] = [delay]
        if "sync" in results:
            sync = results["sync"][delay]
            row += [
                f"{sync['success_rate']:.2f}",
                f"{sync['stalls_per_episode']:.1f}",
                f"{sync['ticks_per_step']:.2f}x",
            ]
        for name in ("async", "rtc"):
            if name in results:
                cell = results[name][delay]
                row += [
                    f"{cell['success_rate']:.2f}",
                    f"{cell['boundary_jump_rad']:.3f} ({cell['jump_ratio']:.1f}x)",
                ]
        rows.append(row)
    return columns, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    results = sweep(args)
    columns, rows = table_rows(results)
    print_table(
        f"RTC delay sweep: {args.episodes} episodes per cell, simulated time. jump = mean joint step at "
        f"chunk boundaries (x = vs inside chunks); slowdown = ticks per executed action",
        columns,
        rows,
    )
    emit_json(
        "rtc_delay_sweep",
        {
            "episodes": args.episodes,
            "delays": args.delays,
            "strategies": args.strategies,
            "max_steps": args.max_steps,
            "first_seed": args.seed,
            "refill_margin": args.refill_margin,
            "sync_steps": args.sync_steps,
            "policy": args.policy,
            "results": _json_ready(results),
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    return 0


def _json_ready(value: Any) -> Any:
    from rollserve.demo.metrics import json_ready

    return json_ready(value)


if __name__ == "__main__":
    raise SystemExit(main())
