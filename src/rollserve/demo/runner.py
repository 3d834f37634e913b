"""`rollserve demo`: serve the built-in policy, drive the simulated arm over a delayed link, compare.

The server runs in this process on an ephemeral loopback port; the robot is a *remote* client of
it, through a proxy that adds ``--delay-ms`` of round-trip network delay, on the real session
websocket, at the task's control rate on the wall clock. Each strategy runs the same seeded
episodes; the closing table's figures are repeated as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from rollserve.cli import non_negative_float, non_negative_int, output_dir, output_file, positive_int
from rollserve.demo.metrics import EpisodeTrace, summarize
from rollserve.demo.strategies import STRATEGIES, Strategy, StrategyEngine, engine_config

DEFAULT_POLICY = "rollserve.models.checkpoint:load_default"
DEFAULT_DELAY_MS = 200.0
DEFAULT_EPISODES = 5
DEFAULT_REFILL_MARGIN = 4
DEFAULT_SYNC_STEPS = 8
INTERRUPTED = "rollserve demo: interrupted"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--episodes", type=positive_int, default=DEFAULT_EPISODES, help="episodes per strategy"
    )
    parser.add_argument(
        "--delay-ms", type=non_negative_float, default=DEFAULT_DELAY_MS,
        help=f"added network round trip, half each way (default {DEFAULT_DELAY_MS:.0f})",
    )  # fmt: skip
    parser.add_argument(
        "--strategies", type=strategy_names, default="sync,async,rtc",
        help="comma-separated subset of sync, async, rtc (default: all three)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="first episode seed (episode i uses seed + i)")
    parser.add_argument(
        "--out",
        type=output_dir,
        default="rollserve-demo",
        help="folder for the plot (default ./rollserve-demo)",
    )
    parser.add_argument(
        "--video",
        type=output_file,
        metavar="PATH",
        help="record the first episode of the RTC strategy (.gif; .mp4 with imageio-ffmpeg)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no header or live progress: the table, where the plot (and video) went, and the JSON line",
    )
    parser.add_argument(
        "--policy", default=DEFAULT_POLICY, metavar="SPEC", help="policy factory 'module:factory'"
    )
    parser.add_argument(
        "--policy-arg", metavar="KEY=VALUE", action="append", default=[], help="policy factory argument"
    )
    parser.add_argument(
        "--max-steps",
        type=positive_int,
        default=None,
        help="episode time limit in control ticks (default: the task's 120)",
    )
    parser.add_argument(
        "--refill-margin", type=non_negative_int, default=DEFAULT_REFILL_MARGIN,
        help="async: ask for the next chunk when <= expected delay + this many actions are left",
    )  # fmt: skip
    parser.add_argument(
        "--sync-steps", type=positive_int, default=DEFAULT_SYNC_STEPS, help="sync: actions executed per chunk"
    )
    parser.add_argument(
        "--rtc-horizon", type=positive_int, default=None,
        help="server's RTC execution horizon (default: refill margin + the smallest possible delay in steps)",
    )  # fmt: skip


def strategy_names(text: str) -> list[str]:
    """argparse type: a comma-separated subset of the strategies, each once, in the order given.
    Checked when the flags are parsed, so a typo fails before the policy loads."""
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(map(repr, unknown))}; choose from {', '.join(STRATEGIES)}"
        )
    if not names:
        raise argparse.ArgumentTypeError(f"name at least one of {', '.join(STRATEGIES)}")
    return names


@dataclass(frozen=True)
class DemoConfig:
    policy: str
    policy_kwargs: dict[str, Any]
    strategies: tuple[Strategy, ...]
    episodes: int
    seed: int
    delay_ms: float
    fps: float
    max_steps: int
    refill_margin: int
    sync_steps: int
    rtc_horizon: int
    out: Path
    video: str | None
    quiet: bool

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.episodes)]

    @property
    def video_strategy(self) -> str:
        names = [s.name for s in self.strategies]
        return "rtc" if "rtc" in names else names[0]


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    from rollserve.server.launch import parse_policy_args
    from rollserve.sim.layout import CONTROL_HZ, MAX_EPISODE_STEPS

    if args.episodes < 1 or args.delay_ms < 0 or args.refill_margin < 0 or args.sync_steps < 1:
        raise ValueError("--episodes and --sync-steps must be >= 1; --delay-ms and --refill-margin >= 0")
    if (args.max_steps is not None and args.max_steps < 1) or (
        args.rtc_horizon is not None and args.rtc_horizon < 1
    ):
        raise ValueError("--max-steps and --rtc-horizon must be >= 1 when given")
    fps = float(CONTROL_HZ)
    min_delay_steps = max(1, math.ceil(args.delay_ms / 1000.0 * fps - 1e-9))
    return DemoConfig(
        policy=args.policy,
        policy_kwargs=parse_policy_args(args.policy_arg),
        strategies=tuple(STRATEGIES[name] for name in args.strategies),
        episodes=args.episodes,
        seed=args.seed,
        delay_ms=args.delay_ms,
        fps=fps,
        max_steps=MAX_EPISODE_STEPS if args.max_steps is None else args.max_steps,
        refill_margin=args.refill_margin,
        sync_steps=args.sync_steps,
        # An async client always has at least (smallest delay + margin) actions left when it asks,
        # so every prefix fills this horizon and every chunk is guided over the same rows.
        rtc_horizon=args.refill_margin + min_delay_steps if args.rtc_horizon is None else args.rtc_horizon,
        out=Path(args.out),
        video=args.video,
        quiet=args.quiet,
    )


@dataclass
class StrategyRun:
    traces: list[EpisodeTrace]
    round_trips_ms: list[float]
    inference_ms: list[float]


def run_strategy(config: DemoConfig, strategy: Strategy, url: str, progress: Any) -> StrategyRun:
    """All episodes of one strategy, on its own session, with the engine's background thread."""
    from rollserve.client.remote_engine import RemoteChunkSource
    from rollserve.demo.recording import RecordingSource
    from rollserve.demo.robot import run_realtime_episode
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.layout import ACTION_NAMES, STATE_DIM

    remote = RemoteChunkSource(
        url, robot_type="panda-sim", action_names=ACTION_NAMES, state_dim=STATE_DIM, fps=config.fps,
        rtc_enabled=strategy.send_prefix,
    )  # fmt: skip
    source = RecordingSource(remote)
    engine_settings = engine_config(
        strategy, fps=config.fps, refill_margin=config.refill_margin, execution_horizon=config.rtc_horizon
    )
    engine = StrategyEngine(source, engine_settings, strategy, sync_steps=config.sync_steps)
    env = TabletopPickPlaceEnv(max_episode_steps=config.max_steps)
    traces: list[EpisodeTrace] = []
    progress.begin_strategy(strategy.label, config.episodes)
    try:
        engine.start()
        for index, seed in enumerate(config.seeds):
            record = config.video is not None and index == 0 and strategy.name == config.video_strategy
            trace = run_realtime_episode(
                engine, env, seed, fps=config.fps, record_snapshots=record, on_tick=progress.tick
            )
            traces.append(trace)
            progress.end_episode(trace)
    finally:
        engine.stop()
        env.close()
    round_trips, inference = source.take()
    return StrategyRun(traces, round_trips, inference)


def warm_up(policy: Any, horizon: int) -> None:
    """One plain and one guided call before the clock starts: the first autograd pass is slow, and
    a real server warms its model up too. Skipped quietly for a policy that needs more input."""
    import numpy as np

    meta = policy.metadata
    batch = {"state": np.zeros(meta.state_dim, np.float32), "images": {}, "task": ""}
    prefix = np.zeros((min(horizon, meta.chunk_size), meta.action_dim), np.float32)
    try:
        policy.predict_action_chunk(batch)
        policy.predict_action_chunk(batch, inference_delay=1, prev_chunk_left_over=prefix)
    except Exception:
        pass


def _one_torch_thread() -> None:
    """The model is tiny: one intra-op thread leaves the other core to the robot, proxy and server."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def run_demo(config: DemoConfig, out: Console) -> dict[str, Any]:
    """Serve, run every strategy, and return the JSON payload (also printing the table)."""
    from rollserve.demo.netdelay import DelayProxy
    from rollserve.demo.progress import LiveProgress
    from rollserve.demo.report import results_table
    from rollserve.server.app import create_app
    from rollserve.server.policy.service import PolicyService
    from rollserve.server.running import start_in_thread

    started = time.perf_counter()
    service = PolicyService.from_spec(
        config.policy, policy_kwargs=config.policy_kwargs, execution_horizon=config.rtc_horizon
    )
    _one_torch_thread()
    warm_up(service.policy, config.rtc_horizon)
    server = start_in_thread(create_app(policy=service), "127.0.0.1", 0)
    try:
        with DelayProxy("127.0.0.1", server.port, config.delay_ms) as proxy:
            url = f"ws://127.0.0.1:{proxy.port}/v1/policy/ws"
            if not config.quiet:
                print_line(
                    out,
                    f"rollserve demo: policy {service.metadata.name!r} served at {server.ws_url}; the robot "
                    f"connects through {proxy.address} (+{config.delay_ms:.0f} ms round trip), "
                    f"{config.fps:.0f} Hz, {config.episodes} episode(s) per strategy, seeds "
                    f"{config.seed}..{config.seed + config.episodes - 1}",
                )
            with LiveProgress(quiet=config.quiet) as progress:
                runs, interrupted = run_strategies(config, url, progress)
    finally:
        server.stop()
    results = {
        name: summarize(run.traces, round_trips_ms=run.round_trips_ms, inference_ms=run.inference_ms)
        for name, run in runs.items()
    }
    labels = {s.name: s.label for s in config.strategies}
    title = (
        f"rollserve demo: {config.episodes} episode(s) per strategy, +{config.delay_ms:.0f} ms round trip, "
        f"{config.fps:.0f} Hz{' (interrupted: finished strategies only)' if interrupted else ''}"
    )
    out.print(results_table(results, labels, title))
    artifacts, cut_short = _write_artifacts(config, runs, labels, out)
    interrupted = interrupted or cut_short
    return {
        "demo": "rollserve",
        "policy": config.policy,
        "delay_ms": config.delay_ms,
        "fps": config.fps,
        "episodes": config.episodes,
        "seeds": config.seeds,
        "max_steps": config.max_steps,
        "refill_margin": config.refill_margin,
        "sync_steps": config.sync_steps,
        "rtc_horizon": config.rtc_horizon,
        "strategies": results,
        **artifacts,
        "seconds": round(time.perf_counter() - started, 1),
        **({"interrupted": True} if interrupted else {}),
    }


def run_strategies(config: DemoConfig, url: str, progress: Any) -> tuple[dict[str, StrategyRun], bool]:
    """Every strategy in turn, and whether Ctrl-C cut the list short: the strategies that finished
    are kept (minutes of measurements); with none finished, the interrupt propagates."""
    runs: dict[str, StrategyRun] = {}
    try:
        for strategy in config.strategies:
            runs[strategy.name] = run_strategy(config, strategy, url, progress)
    except KeyboardInterrupt:
        if not runs:
            raise
        return runs, True
    return runs, False


def print_line(out: Console, text: str) -> None:
    """One physical line whatever the console width: a wrapped address or path can't be copied."""
    out.print(text, soft_wrap=True, highlight=False)


def _write_artifacts(
    config: DemoConfig, runs: dict[str, StrategyRun], labels: dict[str, str], out: Console
) -> tuple[dict[str, Any], bool]:
    """The plot and the optional video, and whether Ctrl-C cut them short: the table is out by
    then, and the measurements (minutes of them) still go in the JSON line."""
    artifacts: dict[str, Any] = {"plot": None, "video": None}
    try:
        _plot_and_video(config, runs, labels, out, artifacts)
    except KeyboardInterrupt:
        print_line(out, "plot or video skipped: interrupted")
        return artifacts, True
    return artifacts, False


def _plot_and_video(
    config: DemoConfig,
    runs: dict[str, StrategyRun],
    labels: dict[str, str],
    out: Console,
    artifacts: dict[str, Any],
) -> None:
    """Fill ``artifacts`` with each path as soon as its file is written."""
    from rollserve.demo.plots import plot_boundaries
    from rollserve.demo.video import write_video

    first = {name: run.traces[0] for name, run in runs.items()}
    plot = plot_boundaries(
        first, labels, config.out / "boundaries.png",
        title=f"actions around chunk boundaries, +{config.delay_ms:.0f} ms round trip",
    )  # fmt: skip
    artifacts["plot"] = str(plot)
    print_line(out, f"plot: {plot}")
    if config.video is not None and config.video_strategy not in first:
        print_line(out, f"video skipped: interrupted before {labels[config.video_strategy]} ran")
    elif config.video is not None:
        trace = first[config.video_strategy]
        stalls = [action is None for action in trace.actions]
        try:
            video = write_video(trace.snapshots, stalls, config.video, config.fps)
        except Exception as exc:  # no usable GL on this machine: keep the results, say why
            print_line(out, f"video skipped: {type(exc).__name__}: {exc} (see docs/sim.md, rendering)")
        else:
            artifacts["video"] = str(video)
            print_line(out, f"video ({labels[config.video_strategy]}, seed {trace.seed}): {video}")


def main(args: argparse.Namespace) -> int:
    from rollserve.demo.report import json_line

    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=160)  # a pipe or file: don't squeeze the table into 80 columns
    try:
        config = config_from_args(args)
        from rollserve.models.worlds import check_world_dependencies

        check_world_dependencies("sim")  # the simulated robot: a missing [sim] extra is named at once
    except ValueError as exc:
        print(f"rollserve demo: {exc}", file=sys.stderr)
        return 2
    try:
        payload = run_demo(config, out)
    except KeyboardInterrupt:  # in the first strategy, or while reporting: say so, no traceback
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a refused session, a policy that fails to load, an unreachable server
        print(f"rollserve demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    print(json_line(payload), flush=True)
    if payload.get("interrupted"):  # the finished strategies' rows are out; the exit status still says Ctrl-C
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """``python -m rollserve.demo.runner [flags]``: the same as ``rollserve demo``."""
    parser = argparse.ArgumentParser(prog="rollserve demo")
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(run())
