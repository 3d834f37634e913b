"""Review of `rollserve demo`'s runner (demo/runner.py) against docs/demo.md: its flags and their
defaults, the config they make, each strategy's seeded episodes over a real server and delay proxy,
Ctrl-C, the plot and video lines and the exit codes. Real server, proxy and MuJoCo arm with a numpy
chunk policy and episodes of two or three ticks; stubs stand in for one layer only (the plot, the
video writer, `run_demo` under `main`)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import socket
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from rollserve.demo import plots, runner, video
from rollserve.demo.metrics import EpisodeTrace
from rollserve.demo.strategies import STRATEGIES

CHUNK_POLICY = "rollserve.models.simple_policies:chunk_policy"
# The simulated arm's layout, written out (docs/demo.md: the task's 13-dim state and 8-dim action).
SIM_STATE_DIM = 13
SIM_ACTIONS = (
    "joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "joint_7", "gripper",
)  # fmt: skip
CONTROL_HZ = 10.0  # docs/demo.md: pick and place at 10 Hz
SIM_POLICY_ARGS = (
    "--policy-arg",
    f"state_dim={SIM_STATE_DIM}",
    "--policy-arg",
    f"action_names={json.dumps(SIM_ACTIONS)}",
)


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="rollserve demo")
    runner.add_arguments(built)
    return built


def parse(tmp_path: Path, *flags: str) -> argparse.Namespace:
    return parser().parse_args(["--out", str(tmp_path / "out"), *flags])


def config(tmp_path: Path, *flags: str) -> runner.DemoConfig:
    return runner.config_from_args(parse(tmp_path, *flags))


def test_the_simulated_layout_written_here_is_the_tasks() -> None:
    """The constants above are this file's own; they must still describe the task."""
    from rollserve.sim import layout

    assert (len(SIM_ACTIONS), SIM_STATE_DIM, CONTROL_HZ) == (8, layout.STATE_DIM, layout.CONTROL_HZ)
    assert tuple(layout.ACTION_NAMES) == SIM_ACTIONS


# -- flags and defaults (docs/demo.md's Flags table) --------------------------------------------------


def test_the_flags_default_to_the_documented_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = parser().parse_args([])
    assert args.episodes == 5 and args.delay_ms == 200.0 and isinstance(args.delay_ms, float)
    assert args.strategies == ["sync", "async", "rtc"]
    assert args.seed == 0 and args.out == Path("rollserve-demo") and args.video is None
    assert args.quiet is False
    assert args.policy == "rollserve.models.checkpoint:load_default" and args.policy_arg == []
    assert args.max_steps is None and args.refill_margin == 4 and args.sync_steps == 8
    assert args.rtc_horizon is None
    assert not (tmp_path / "rollserve-demo").exists()  # checked, not created, at parse time


def test_the_defaults_make_the_documented_config(tmp_path: Path) -> None:
    made = config(tmp_path)
    assert [s.name for s in made.strategies] == ["sync", "async", "rtc"]
    assert (made.episodes, made.seed, made.delay_ms, made.max_steps) == (5, 0, 200.0, 120)
    assert (made.refill_margin, made.sync_steps) == (4, 8)
    assert made.rtc_horizon == 6  # docs: margin + max(1, ceil(200 / 100)), "6 at the defaults"
    assert made.fps == CONTROL_HZ and isinstance(made.fps, float)
    assert made.policy == "rollserve.models.checkpoint:load_default" and made.policy_kwargs == {}
    assert made.out == tmp_path / "out" and made.video is None and made.quiet is False
    assert made.seeds == [0, 1, 2, 3, 4]


def test_every_flag_reaches_the_config(tmp_path: Path) -> None:
    made = config(
        tmp_path, "--episodes", "3", "--delay-ms", "150", "--strategies", "rtc,sync", "--seed", "-4",
        "--video", str(tmp_path / "v.gif"), "--quiet", "--policy", "pkg.mod:factory",
        "--policy-arg", "chunk_size=12", "--policy-arg", "name=abc", "--max-steps", "9",
        "--refill-margin", "2", "--sync-steps", "5", "--rtc-horizon", "3",
    )  # fmt: skip
    assert made.strategies == (STRATEGIES["rtc"], STRATEGIES["sync"])
    assert (made.episodes, made.seed, made.delay_ms, made.max_steps) == (3, -4, 150.0, 9)
    assert (made.refill_margin, made.sync_steps, made.rtc_horizon) == (2, 5, 3)
    assert made.policy == "pkg.mod:factory" and made.policy_kwargs == {"chunk_size": 12, "name": "abc"}
    assert made.video == tmp_path / "v.gif" and made.quiet is True and made.out == tmp_path / "out"
    assert made.seeds == [-4, -3, -2]  # episode i uses seed + i


@pytest.mark.parametrize(
    ("delay_ms", "margin", "horizon"),
    [
        ("200", "4", 6),  # 2 ticks of 100 ms
        ("0", "4", 5),  # at least one tick
        ("50", "0", 1),
        ("100", "4", 5),
        ("101", "4", 6),
        ("250", "4", 7),
        ("300", "4", 7),  # exactly 3 ticks (0.3 * 10 is 3.0000000000000004 in floats)
        ("700", "1", 8),  # exactly 7 ticks (0.7 * 10 is 7.000000000000001 in floats)
        ("300.2", "4", 8),  # just over 3 ticks
        ("100.05", "0", 2),  # just over one tick
    ],
)
def test_the_rtc_horizon_is_the_margin_plus_the_smallest_delay_in_ticks(
    tmp_path: Path, delay_ms: str, margin: str, horizon: int
) -> None:
    made = config(tmp_path, "--delay-ms", delay_ms, "--refill-margin", margin)
    assert made.rtc_horizon == horizon
    assert config(tmp_path, "--delay-ms", delay_ms, "--rtc-horizon", "2").rtc_horizon == 2  # given: kept


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--episodes", "0"), "argument --episodes: "),
        (("--delay-ms", "-1"), "argument --delay-ms: "),
        (("--refill-margin", "-1"), "argument --refill-margin: "),
        (("--sync-steps", "0"), "argument --sync-steps: "),
        (("--max-steps", "0"), "argument --max-steps: "),
        (("--rtc-horizon", "0"), "argument --rtc-horizon: "),
        (("--seed", "1.5"), "argument --seed: "),
        (("--out", "{file}"), "argument --out: "),
        (("--video", "{dir}"), "argument --video: "),
    ],
)
def test_bad_values_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, str], message: str
) -> None:
    (tmp_path / "file").write_text("x")
    value = flags[1].format(file=tmp_path / "file", dir=tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(
            [flags[0], value, "--out", str(tmp_path)] if flags[0] != "--out" else [flags[0], value]
        )
    assert exit_info.value.code == 2
    assert f"rollserve demo: error: {message}" in capsys.readouterr().err


def test_the_smallest_allowed_values_are_accepted(tmp_path: Path) -> None:
    made = config(
        tmp_path, "--episodes", "1", "--delay-ms", "0", "--refill-margin", "0", "--sync-steps", "1",
        "--max-steps", "1", "--rtc-horizon", "1",
    )  # fmt: skip
    assert (made.episodes, made.delay_ms, made.refill_margin, made.sync_steps) == (1, 0.0, 0, 1)
    assert (made.max_steps, made.rtc_horizon, made.seeds) == (1, 1, [0])


def test_policy_args_append_and_quiet_is_a_switch(tmp_path: Path) -> None:
    args = parse(tmp_path, "--policy-arg", "a=1", "--policy-arg", "b=[2, 3]", "--quiet")
    assert args.policy_arg == ["a=1", "b=[2, 3]"] and args.quiet is True


HELP = {
    "--episodes": "episodes per strategy",
    "--delay-ms": "added network round trip, half each way (default 200)",
    "--strategies": "comma-separated subset of sync, async, rtc (default: all three)",
    "--seed": "first episode seed (episode i uses seed + i)",
    "--out": "folder for the plot (default ./rollserve-demo)",
    "--video": "record the first episode of the RTC strategy (.gif; .mp4 with imageio-ffmpeg)",
    "--quiet": "no header or live progress: the table, where the plot (and video) went, and the JSON line",
    "--policy": "policy factory 'module:factory'",
    "--policy-arg": "policy factory argument",
    "--max-steps": "episode time limit in control ticks (default: the task's 120)",
    "--refill-margin": "async: ask for the next chunk when <= expected delay + this many actions are left",
    "--sync-steps": "sync: actions executed per chunk",
    "--rtc-horizon": (
        "server's RTC execution horizon (default: refill margin + the smallest possible delay in steps)"
    ),
}


def test_each_flag_has_its_help_and_metavar() -> None:
    """The help says what docs/demo.md's table says, word for word as `--help` shows it."""
    actions = {action.option_strings[0]: action for action in parser()._actions if action.option_strings}
    assert {flag: actions[flag].help for flag in HELP} == HELP
    assert (actions["--video"].metavar, actions["--policy"].metavar) == ("PATH", "SPEC")
    assert actions["--policy-arg"].metavar == "KEY=VALUE"


# -- --strategies -----------------------------------------------------------------------------------


def test_strategy_names_keep_the_order_given_each_once() -> None:
    assert runner.strategy_names("rtc") == ["rtc"]
    assert runner.strategy_names(" async ,rtc,,async, sync ") == ["async", "rtc", "sync"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "name at least one of sync, async, rtc"),
        (" , ,", "name at least one of sync, async, rtc"),
        ("foo,sync,bar", "unknown 'foo', 'bar'; choose from sync, async, rtc"),
        ("rtc,Sync", "unknown 'Sync'; choose from sync, async, rtc"),
    ],
)
def test_strategy_names_refusals_say_what_to_choose(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        runner.strategy_names(text)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("names", "recorded"), [("sync,async,rtc", "rtc"), ("async,sync", "async"), ("sync", "sync")]
)
def test_the_video_records_rtc_else_the_first_strategy(tmp_path: Path, names: str, recorded: str) -> None:
    assert config(tmp_path, "--strategies", names).video_strategy == recorded


# -- config_from_args called without argparse's checks -------------------------------------------------

COUNTS_MESSAGE = "--episodes and --sync-steps must be >= 1; --delay-ms and --refill-margin >= 0"
GIVEN_MESSAGE = "--max-steps and --rtc-horizon must be >= 1 when given"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("episodes", 0, COUNTS_MESSAGE),
        ("delay_ms", -0.5, COUNTS_MESSAGE),
        ("refill_margin", -1, COUNTS_MESSAGE),
        ("sync_steps", 0, COUNTS_MESSAGE),
        ("max_steps", 0, GIVEN_MESSAGE),
        ("rtc_horizon", 0, GIVEN_MESSAGE),
    ],
)
def test_config_from_args_refuses_values_argparse_would_have(
    tmp_path: Path, field: str, value: float, message: str
) -> None:
    args = parse(tmp_path)
    setattr(args, field, value)
    with pytest.raises(ValueError) as refused:
        runner.config_from_args(args)
    assert str(refused.value) == message


# -- the real server, proxy and arm ---------------------------------------------------------------------


@contextlib.contextmanager
def served(delay_ms: float) -> Iterator[str]:
    """A real server of the numpy chunk policy shaped for the arm, behind a delay proxy: its URL."""
    from rollserve.demo.netdelay import DelayProxy
    from rollserve.server.app import create_app
    from rollserve.server.policy.service import PolicyService
    from rollserve.server.running import start_in_thread

    service = PolicyService.from_spec(
        CHUNK_POLICY, policy_kwargs={"state_dim": SIM_STATE_DIM, "action_names": list(SIM_ACTIONS)}
    )
    server = start_in_thread(create_app(policy=service), "127.0.0.1", 0)
    try:
        with DelayProxy("127.0.0.1", server.port, delay_ms) as proxy:
            yield f"ws://127.0.0.1:{proxy.port}/v1/policy/ws"
    finally:
        server.stop()


class Progress:
    """What `run_strategy` reports to the live progress, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def begin_strategy(self, label: str, episodes: int) -> None:
        self.calls.append(("begin", label, episodes))

    def tick(self, trace: EpisodeTrace) -> None:
        self.calls.append(("tick", trace))

    def end_episode(self, trace: EpisodeTrace) -> None:
        self.calls.append(("end", trace))


class Spies:
    """Records what `run_strategy` builds: the remote source's fields, the engines, the envs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rollserve.client import remote_engine
        from rollserve.sim import env as sim_env

        self.sources: list[dict[str, Any]] = []
        self.engines: list[Any] = []
        self.envs: list[Any] = []
        self.closed: list[Any] = []
        spies = self

        class Source(remote_engine.RemoteChunkSource):
            def __init__(self, url: str, **kwargs: Any) -> None:
                spies.sources.append({"url": url, **kwargs})
                super().__init__(url, **kwargs)

        class Engine(runner.StrategyEngine):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                spies.engines.append(self)

        class Env(sim_env.TabletopPickPlaceEnv):
            def __init__(self, **kwargs: Any) -> None:
                spies.envs.append(kwargs)
                super().__init__(**kwargs)

            def close(self) -> None:
                spies.closed.append(self)
                super().close()

        monkeypatch.setattr(remote_engine, "RemoteChunkSource", Source)
        monkeypatch.setattr(runner, "StrategyEngine", Engine)
        monkeypatch.setattr(sim_env, "TabletopPickPlaceEnv", Env)


DELAY_MS = 30.0


def test_each_strategy_runs_its_seeded_episodes_over_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spies = Spies(monkeypatch)
    made = config(
        tmp_path, "--strategies", "async,sync", "--episodes", "2", "--max-steps", "3", "--seed", "11",
        "--video", str(tmp_path / "v.gif"), "--refill-margin", "3", "--rtc-horizon", "5", "--sync-steps", "6",
    )  # fmt: skip
    progress = Progress()
    with served(DELAY_MS) as url:
        runs, interrupted = runner.run_strategies(made, url, progress)
    assert not interrupted and list(runs) == ["async", "sync"]
    for name, run in runs.items():
        assert [trace.seed for trace in run.traces] == [11, 12], name
        assert [trace.ticks for trace in run.traces] == [3, 3], name  # the time limit given
        assert len(run.round_trips_ms) == len(run.inference_ms) >= 2, name  # a chunk per episode at least
        # every round trip pays the added delay; the numpy policy's own call takes far less
        assert min(run.round_trips_ms) >= DELAY_MS > max(run.inference_ms), name
    # the video's strategy (the first listed without RTC) records its first episode only
    assert [len(trace.snapshots) for trace in runs["async"].traces] == [3, 0]
    assert [len(trace.snapshots) for trace in runs["sync"].traces] == [0, 0]

    expected_calls: list[tuple[Any, ...]] = []
    for name, label in (("async", "async, no RTC"), ("sync", "synchronous")):
        expected_calls.append(("begin", label, 2))
        for trace in runs[name].traces:
            expected_calls += [("tick", trace)] * 3 + [("end", trace)]
    assert progress.calls == expected_calls

    wanted = {
        "robot_type": "panda-sim",
        "action_names": SIM_ACTIONS,
        "state_dim": SIM_STATE_DIM,
        "fps": CONTROL_HZ,
    }
    assert spies.sources == [
        {"url": url, **wanted, "rtc_enabled": False},  # async without RTC sends no prefix
        {"url": url, **wanted, "rtc_enabled": False},
    ]
    assert [engine.strategy for engine in spies.engines] == [STRATEGIES["async"], STRATEGIES["sync"]]
    assert [engine.sync_steps for engine in spies.engines] == [6, 6]
    for engine in spies.engines:
        assert engine.config.fps == CONTROL_HZ and engine.config.rtc.execution_horizon == 5
        assert engine._thread is None  # stopped, its thread joined
    assert [engine.config.refill_margin for engine in spies.engines] == [3, 0]  # sync asks when empty
    assert spies.envs == [{"max_episode_steps": 3}, {"max_episode_steps": 3}]
    assert len(spies.closed) == 2


def test_rtc_sends_its_prefix_and_nothing_is_recorded_without_video(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spies = Spies(monkeypatch)
    made = config(tmp_path, "--strategies", "rtc", "--episodes", "1", "--max-steps", "2", "--seed", "4")
    with served(0.0) as url:
        run = runner.run_strategy(made, STRATEGIES["rtc"], url, Progress())
    assert [(trace.seed, trace.ticks, trace.snapshots) for trace in run.traces] == [(4, 2, [])]
    assert spies.sources[0]["rtc_enabled"] is True
    assert spies.engines[0].config.rtc.execution_horizon == 6  # the config's: margin 4 + 200 ms in ticks


def test_the_engine_stops_and_the_env_closes_when_an_episode_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spies = Spies(monkeypatch)
    made = config(tmp_path, "--strategies", "sync", "--episodes", "2", "--max-steps", "2")

    class Stop(Progress):
        def end_episode(self, trace: EpisodeTrace) -> None:
            raise KeyboardInterrupt

    with served(0.0) as url, pytest.raises(KeyboardInterrupt):
        runner.run_strategy(made, STRATEGIES["sync"], url, Stop())
    assert spies.engines[0]._thread is None and len(spies.closed) == 1


# -- run_strategies and Ctrl-C ------------------------------------------------------------------------------


def test_ctrl_c_keeps_the_finished_strategies_and_starts_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = config(tmp_path, "--strategies", "rtc,sync,async")
    started: list[str] = []
    finished = runner.StrategyRun([], [1.0], [0.5])

    def run_strategy(config: Any, strategy: Any, url: str, progress: Any) -> runner.StrategyRun:
        started.append(strategy.name)
        if strategy.name == "sync":
            raise KeyboardInterrupt
        assert (config, url, progress) == (made, "ws://x", "progress")
        return finished

    monkeypatch.setattr(runner, "run_strategy", run_strategy)
    assert runner.run_strategies(made, "ws://x", "progress") == ({"rtc": finished}, True)
    assert started == ["rtc", "sync"]


def test_ctrl_c_in_the_first_strategy_reaches_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_strategy(config: Any, strategy: Any, url: str, progress: Any) -> runner.StrategyRun:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_strategy", run_strategy)
    with pytest.raises(KeyboardInterrupt):
        runner.run_strategies(config(tmp_path, "--strategies", "async"), "ws://x", None)


# -- warm-up and threads -----------------------------------------------------------------------------------


class WarmPolicy:
    metadata = types.SimpleNamespace(state_dim=3, action_dim=2, chunk_size=4)

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.fail = fail

    def predict_action_chunk(self, batch: dict[str, Any], **kwargs: Any) -> None:
        self.calls.append((batch, kwargs))
        if self.fail:
            raise ValueError("needs images")


@pytest.mark.parametrize(("horizon", "rows"), [(3, 3), (4, 4), (9, 4)])
def test_warm_up_makes_one_plain_and_one_guided_call(horizon: int, rows: int) -> None:
    policy = WarmPolicy()
    runner.warm_up(policy, horizon)
    (plain, plain_kwargs), (guided, guided_kwargs) = policy.calls
    for batch in (plain, guided):
        assert set(batch) == {"state", "images", "task"} and batch["images"] == {} and batch["task"] == ""
        assert batch["state"].dtype == np.float32 and batch["state"].tolist() == [0.0, 0.0, 0.0]
    assert plain_kwargs == {}
    assert set(guided_kwargs) == {"inference_delay", "prev_chunk_left_over"}
    assert guided_kwargs["inference_delay"] == 1
    prefix = guided_kwargs["prev_chunk_left_over"]
    assert prefix.dtype == np.float32 and prefix.shape == (rows, 2) and not prefix.any()


def test_warm_up_of_a_policy_that_needs_more_input_is_skipped_quietly() -> None:
    policy = WarmPolicy(fail=True)
    runner.warm_up(policy, 2)
    assert len(policy.calls) == 1


def test_torch_gets_one_thread_when_it_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(set_num_threads=threads.append))
    runner._one_torch_thread()
    assert threads == [1]
    monkeypatch.delitem(sys.modules, "torch")
    runner._one_torch_thread()  # not loaded: nothing to set, and no import
    assert threads == [1] and "torch" not in sys.modules


# -- run_demo over the real server --------------------------------------------------------------------------

HEADER = re.compile(
    r"rollserve demo: policy 'review-policy' served at ws://127\.0\.0\.1:(\d+); the robot "
    r"connects through 127\.0\.0\.1:(\d+) \(\+30 ms round trip\), 10 Hz, 2 episode\(s\) per strategy, "
    r"seeds 3\.\.4"
)


class Plots:
    """Stands in for `plot_boundaries` (matplotlib is the plot module's business): records its call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail
        monkeypatch.setattr(plots, "plot_boundaries", self)

    def __call__(self, traces: Any, labels: Any, path: Any, *, title: str) -> Path:
        self.calls.append((traces, labels, path, title))
        if self.fail:
            raise KeyboardInterrupt
        return Path(path)


class Services:
    """Records the policy service `run_demo` builds (its arguments and the service)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rollserve.server.policy.service import PolicyService

        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.built: list[Any] = []
        original = PolicyService.from_spec.__func__  # type: ignore[attr-defined]

        def from_spec(cls: Any, spec: str, settings: Any = None, **kwargs: Any) -> Any:
            self.calls.append((spec, kwargs))
            service = original(cls, spec, settings, **kwargs)
            self.built.append(service)
            return service

        monkeypatch.setattr(PolicyService, "from_spec", classmethod(from_spec))


def ephemeral(port: int) -> bool:
    """Whether the system could have picked ``port`` for a listener bound to port 0."""
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low, high = (int(bound) for bound in ranges.read_text().split()) if ranges.exists() else (1024, 65535)
    return low <= port <= high


def demo_flags(*flags: str) -> tuple[str, ...]:
    return (
        "--policy", CHUNK_POLICY, *SIM_POLICY_ARGS, "--policy-arg", "name=review-policy",
        "--policy-arg", "record_calls=true", "--delay-ms", str(DELAY_MS), "--seed", "3", "--max-steps", "2",
        *flags,
    )  # fmt: skip


def test_run_demo_serves_runs_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    threads: list[str] = []
    monkeypatch.setattr(runner, "_one_torch_thread", lambda: threads.append("set"))
    plotted = Plots(monkeypatch)
    services = Services(monkeypatch)
    made = config(tmp_path, *demo_flags("--strategies", "sync", "--episodes", "2", "--refill-margin", "2"))
    buffer = io.StringIO()
    payload = runner.run_demo(made, Console(file=buffer, width=300))

    lines = buffer.getvalue().splitlines()
    header = HEADER.fullmatch(lines[0])
    assert header is not None, lines[0]
    server_port, proxy_port = (int(port) for port in header.groups())
    assert server_port != proxy_port
    assert ephemeral(server_port)  # port 0 asked for: the system picked one
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server_port), timeout=2):
        pass  # the server was stopped
    assert any(
        line.strip() == "rollserve demo: 2 episode(s) per strategy, +30 ms round trip, 10 Hz"
        for line in lines
    )
    assert any("synchronous" in line for line in lines)
    assert lines[-1] == f"plot: {tmp_path / 'out' / 'boundaries.png'}"
    # not quiet: one progress line per episode (stderr is not a terminal here)
    assert capsys.readouterr().err.count("\n") == 2

    rtc_horizon = 2 + 1  # margin 2 + max(1, ceil(30 ms / 100 ms))
    assert services.calls == [
        (
            CHUNK_POLICY,
            {
                "policy_kwargs": {
                    "state_dim": SIM_STATE_DIM, "action_names": list(SIM_ACTIONS), "name": "review-policy",
                    "record_calls": True,
                },
                "execution_horizon": rtc_horizon,
            },
        )
    ]  # fmt: skip
    warm_plain, warm_guided = services.built[0].policy.calls[:2]  # warmed up before the first episode
    assert warm_plain["prev_chunk_left_over"] is None
    assert warm_guided["inference_delay"] == 1
    assert warm_guided["prev_chunk_left_over"].shape == (rtc_horizon, 8)
    assert threads == ["set"]

    seconds = payload.pop("seconds")
    assert isinstance(seconds, float) and seconds == round(seconds, 1) and 0 < seconds < 120
    row = payload.pop("strategies")["sync"]
    assert payload == {
        "demo": "rollserve", "policy": CHUNK_POLICY, "delay_ms": DELAY_MS, "fps": CONTROL_HZ, "episodes": 2,
        "seeds": [3, 4], "max_steps": 2, "refill_margin": 2, "sync_steps": 8, "rtc_horizon": rtc_horizon,
        "plot": str(tmp_path / "out" / "boundaries.png"), "video": None,
    }  # fmt: skip
    assert row["episodes"] == 2 and row["ticks"] == 4 and row["executed_steps"] + row["stall_ticks"] == 4
    assert row["round_trip_ms_p50"] >= DELAY_MS > row["inference_ms_p50"]
    ((traces, labels, path, title),) = plotted.calls
    assert list(traces) == ["sync"] and traces["sync"].seed == 3  # the first episode of each strategy
    assert labels == {"sync": "synchronous"} and path == tmp_path / "out" / "boundaries.png"
    assert title == "actions around chunk boundaries, +30 ms round trip"


def test_run_demo_interrupted_in_a_later_strategy_reports_the_finished_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(runner, "_one_torch_thread", lambda: None)
    Plots(monkeypatch)
    real = runner.run_strategy

    def run_strategy(config: Any, strategy: Any, url: str, progress: Any) -> runner.StrategyRun:
        if strategy.name == "rtc":
            raise KeyboardInterrupt
        return real(config, strategy, url, progress)

    monkeypatch.setattr(runner, "run_strategy", run_strategy)
    made = config(tmp_path, *demo_flags("--strategies", "async,rtc", "--episodes", "1", "--quiet"))
    buffer = io.StringIO()
    payload = runner.run_demo(made, Console(file=buffer, width=300))
    assert payload["interrupted"] is True and list(payload["strategies"]) == ["async"]
    assert payload["plot"] == str(tmp_path / "out" / "boundaries.png")
    lines = [line.strip() for line in buffer.getvalue().splitlines()]
    assert not any(line.startswith("rollserve demo: policy") for line in lines)  # quiet: no header
    title = (
        "rollserve demo: 1 episode(s) per strategy, +30 ms round trip, 10 Hz"
        " (interrupted: finished strategies only)"
    )
    assert title in lines
    assert lines[-1] == f"plot: {tmp_path / 'out' / 'boundaries.png'}"  # quiet still says where it went
    assert capsys.readouterr().err == ""  # quiet: no progress


def test_run_demo_cut_short_in_the_plot_still_returns_the_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "_one_torch_thread", lambda: None)
    Plots(monkeypatch, fail=True)
    made = config(tmp_path, *demo_flags("--strategies", "sync", "--episodes", "1", "--quiet"))
    buffer = io.StringIO()
    payload = runner.run_demo(made, Console(file=buffer, width=300))
    assert payload["interrupted"] is True and payload["plot"] is None and payload["video"] is None
    assert payload["strategies"]["sync"]["ticks"] == 2
    lines = [line.strip() for line in buffer.getvalue().splitlines()]
    assert "rollserve demo: 1 episode(s) per strategy, +30 ms round trip, 10 Hz" in lines  # no "interrupted"
    assert lines[-1] == "plot or video skipped: interrupted"


# -- the plot and video lines --------------------------------------------------------------------------------


def trace_of(seed: int, actions: list[Any]) -> EpisodeTrace:
    trace = EpisodeTrace(seed=seed)
    for action in actions:
        trace.record(action, None if action is None else 1)
    trace.snapshots = [f"s{seed}-{i}".encode() for i in range(len(actions))]
    return trace


class Videos:
    """Stands in for `write_video` (rendering is the video module's business): records its call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, error: BaseException | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error
        monkeypatch.setattr(video, "write_video", self)

    def __call__(self, snapshots: Any, stalls: Any, requested: Any, fps: float) -> Path:
        self.calls.append((snapshots, stalls, requested, fps))
        if self.error is not None:
            raise self.error
        return Path(str(requested) + ".written")


LABELS = {"sync": "synchronous", "rtc": "async + RTC"}


def artifacts_of(made: runner.DemoConfig, runs: dict[str, runner.StrategyRun]) -> tuple[Any, bool, list[str]]:
    buffer = io.StringIO()
    artifacts, cut_short = runner._write_artifacts(made, runs, LABELS, Console(file=buffer, width=40))
    return artifacts, cut_short, buffer.getvalue().splitlines()


def two_runs() -> dict[str, runner.StrategyRun]:
    action = np.zeros(8, np.float32)
    return {
        "sync": runner.StrategyRun([trace_of(9, [action]), trace_of(10, [action])], [], []),
        "rtc": runner.StrategyRun([trace_of(9, [None, action, None]), trace_of(10, [action])], [], []),
    }


def test_the_plot_and_the_video_of_the_first_rtc_episode_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plotted, videos = Plots(monkeypatch), Videos(monkeypatch)
    made = config(
        tmp_path, "--strategies", "sync,rtc", "--delay-ms", "125", "--video", str(tmp_path / "e.gif")
    )
    runs = two_runs()
    artifacts, cut_short, lines = artifacts_of(made, runs)
    plot_path = tmp_path / "out" / "boundaries.png"
    written = f"{tmp_path / 'e.gif'}.written"
    assert (artifacts, cut_short) == ({"plot": str(plot_path), "video": written}, False)
    assert lines == [f"plot: {plot_path}", f"video (async + RTC, seed 9): {written}"]
    ((traces, labels, path, title),) = plotted.calls
    assert traces == {"sync": runs["sync"].traces[0], "rtc": runs["rtc"].traces[0]} and labels == LABELS
    assert (path, title) == (plot_path, "actions around chunk boundaries, +125 ms round trip")
    assert videos.calls == [
        ([b"s9-0", b"s9-1", b"s9-2"], [True, False, True], tmp_path / "e.gif", CONTROL_HZ)
    ]


def test_without_video_only_the_plot_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Plots(monkeypatch)
    videos = Videos(monkeypatch)
    artifacts, cut_short, lines = artifacts_of(config(tmp_path, "--strategies", "sync,rtc"), two_runs())
    assert artifacts["video"] is None and not cut_short and len(lines) == 1 and videos.calls == []


def test_a_video_that_cannot_be_rendered_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Plots(monkeypatch)
    Videos(monkeypatch, RuntimeError("no GL"))
    made = config(tmp_path, "--strategies", "sync,rtc", "--video", str(tmp_path / "e.gif"))
    artifacts, cut_short, lines = artifacts_of(made, two_runs())
    assert artifacts == {"plot": str(tmp_path / "out" / "boundaries.png"), "video": None} and not cut_short
    assert lines[1] == "video skipped: RuntimeError: no GL (see docs/sim.md, rendering)"


def test_the_video_of_a_strategy_that_never_ran_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Plots(monkeypatch)
    videos = Videos(monkeypatch)
    made = config(tmp_path, "--strategies", "sync,rtc", "--video", str(tmp_path / "e.gif"))
    artifacts, cut_short, lines = artifacts_of(made, {"sync": two_runs()["sync"]})
    assert artifacts["video"] is None and not cut_short and videos.calls == []
    assert lines[1] == "video skipped: interrupted before async + RTC ran"


def test_ctrl_c_in_the_video_keeps_the_plot_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Plots(monkeypatch)
    Videos(monkeypatch, KeyboardInterrupt())
    made = config(tmp_path, "--strategies", "sync,rtc", "--video", str(tmp_path / "e.gif"))
    artifacts, cut_short, lines = artifacts_of(made, two_runs())
    assert (artifacts, cut_short) == ({"plot": str(tmp_path / "out" / "boundaries.png"), "video": None}, True)
    assert lines[-1] == "plot or video skipped: interrupted"


def test_ctrl_c_in_the_plot_writes_nothing_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Plots(monkeypatch, fail=True)
    videos = Videos(monkeypatch)
    made = config(tmp_path, "--strategies", "sync,rtc", "--video", str(tmp_path / "e.gif"))
    artifacts, cut_short, lines = artifacts_of(made, two_runs())
    assert (artifacts, cut_short, lines) == (
        {"plot": None, "video": None},
        True,
        ["plot or video skipped: interrupted"],
    )
    assert videos.calls == []


def test_print_line_is_one_plain_line_on_a_narrow_colour_terminal() -> None:
    buffer = io.StringIO()
    out = Console(file=buffer, width=30, force_terminal=True, color_system="truecolor", highlight=True)
    text = "served at ws://127.0.0.1:45678/v1/policy/ws, 12 episodes, seed 3, path /tmp/x"
    runner.print_line(out, text)
    assert buffer.getvalue() == text + "\n"


# -- main and run: exit codes and the last line ------------------------------------------------------------


class Demo:
    """Stands in for `run_demo` under `main`: records the console and answers or raises."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answer: Any) -> None:
        self.consoles: list[Console] = []
        self.configs: list[runner.DemoConfig] = []
        self.answer = answer
        monkeypatch.setattr(runner, "run_demo", self)

    def __call__(self, config: runner.DemoConfig, out: Console) -> dict[str, Any]:
        self.consoles.append(out)
        self.configs.append(config)
        out.print("the table")
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_main_prints_the_payload_as_the_last_line_and_exits_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = {
        "demo": "rollserve",
        "strategies": {"sync": {"jump_ratio": math.nan, "ticks": 12}},
        "seconds": 1.5,
    }
    demo = Demo(monkeypatch, payload)
    assert runner.main(parse(tmp_path, "--episodes", "2")) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "the table" and len(lines) == 2
    assert json.loads(lines[-1]) == {
        "demo": "rollserve",
        "strategies": {"sync": {"jump_ratio": None, "ticks": 12}},
        "seconds": 1.5,
    }
    assert captured.err == ""
    assert demo.configs[0].episodes == 2
    assert demo.consoles[0].width == 160  # a pipe: wide enough for the table


def test_main_on_a_terminal_keeps_its_width_and_no_highlighting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "93")
    demo = Demo(monkeypatch, {"demo": "rollserve"})
    assert runner.main(parse(tmp_path)) == 0
    assert demo.consoles[0].width == 93 and demo.consoles[0]._highlight is False


def test_main_on_a_pipe_has_no_highlighting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = Demo(monkeypatch, {"demo": "rollserve"})
    runner.main(parse(tmp_path))
    assert demo.consoles[0]._highlight is False


def test_main_exits_130_after_the_json_line_of_an_interrupted_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Demo(monkeypatch, {"demo": "rollserve", "interrupted": True})
    assert runner.main(parse(tmp_path)) == 130  # 128 + SIGINT, as a shell reports Ctrl-C
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1]) == {"demo": "rollserve", "interrupted": True}
    assert captured.err == "rollserve demo: interrupted\n"


class Sink(io.RawIOBase):
    """One pipe for stdout and stderr, as `rollserve demo 2>&1 | tee log` gives: the order written."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, chunk: Any) -> int:
        self.data += bytes(chunk)
        return len(chunk)


def test_the_json_line_reaches_a_shared_pipe_before_the_interrupted_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Demo(monkeypatch, {"demo": "rollserve", "interrupted": True})
    sink = Sink()
    stdout = io.TextIOWrapper(
        io.BufferedWriter(sink, buffer_size=1 << 16), encoding="utf-8"
    )  # a pipe: buffered
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(sink, encoding="utf-8", write_through=True))
    code = runner.main(parse(tmp_path))
    stdout.flush()
    lines = sink.data.decode().splitlines()
    assert code == 130
    assert len(lines) == 3 and lines[0] == "the table" and lines[2] == "rollserve demo: interrupted"
    assert json.loads(lines[1]) == {"demo": "rollserve", "interrupted": True}


def test_main_exits_130_with_one_line_when_ctrl_c_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Demo(monkeypatch, KeyboardInterrupt())
    assert runner.main(parse(tmp_path)) == 130
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("the table\n", "rollserve demo: interrupted\n")


def test_main_exits_1_naming_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    Demo(monkeypatch, RuntimeError("session refused"))
    assert runner.main(parse(tmp_path)) == 1
    assert capsys.readouterr().err == "rollserve demo failed: RuntimeError: session refused\n"


def test_main_exits_2_on_a_bad_value_before_the_demo_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = Demo(monkeypatch, {"demo": "rollserve"})
    args = parse(tmp_path)
    args.sync_steps = 0
    assert runner.main(args) == 2
    assert capsys.readouterr() == ("", f"rollserve demo: {COUNTS_MESSAGE}\n")
    assert demo.configs == []


def test_main_exits_2_naming_a_missing_sim_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollserve.models import worlds

    demo = Demo(monkeypatch, {"demo": "rollserve"})
    monkeypatch.setattr(worlds, "_installed", lambda module: module != "mujoco")
    assert runner.main(parse(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollserve demo: world 'sim' needs mujoco, not installed here")
    assert demo.configs == []


def test_run_parses_the_flags_for_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(runner, "main", lambda args: seen.append(args) or 7)
    assert runner.run(["--episodes", "3", "--out", str(tmp_path)]) == 7
    assert seen[0].episodes == 3 and seen[0].delay_ms == 200.0


def test_run_refuses_a_bad_flag_as_rollserve_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        runner.run(["--strategies", "nope"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rollserve demo ")
    assert "rollserve demo: error: argument --strategies: unknown 'nope'" in err
