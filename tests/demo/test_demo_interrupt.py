"""Ctrl-C during `rollserve demo`: one line and exit 130, and the strategies that finished still reported."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rollserve.demo import plots, runner

SHELL_EXIT_FOR_SIGINT = 128 + 2  # what a shell reports for a command stopped by Ctrl-C (SIGINT = 2)


def parse(tmp_path: Path, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    return parser.parse_args(["--out", str(tmp_path / "out"), *flags])


def test_ctrl_c_before_any_strategy_finished_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(config: Any, out: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_demo", interrupted)
    try:
        code = runner.main(parse(tmp_path))
    except KeyboardInterrupt:  # not re-raised: it would stop the whole pytest session
        pytest.fail("KeyboardInterrupt escaped main (a traceback for the user)")
    assert code == SHELL_EXIT_FOR_SIGINT
    captured = capsys.readouterr()
    assert captured.err == "rollserve demo: interrupted\n"
    assert captured.out == ""


def test_ctrl_c_after_some_strategies_prints_their_json_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = {"demo": "rollserve", "strategies": {"sync": {"episodes": 1}}, "interrupted": True}
    monkeypatch.setattr(runner, "run_demo", lambda config, out: payload)
    assert runner.main(parse(tmp_path)) == SHELL_EXIT_FOR_SIGINT
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1]) == payload
    assert captured.err == "rollserve demo: interrupted\n"


def test_strategies_that_finished_before_ctrl_c_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runner.config_from_args(parse(tmp_path, "--strategies", "sync,async,rtc"))
    done = runner.StrategyRun([], [1.0], [2.0])
    started: list[str] = []

    def run_strategy(config: Any, strategy: Any, url: str, progress: Any) -> runner.StrategyRun:
        started.append(strategy.name)
        if strategy.name == "async":
            raise KeyboardInterrupt
        return done

    monkeypatch.setattr(runner, "run_strategy", run_strategy)
    runs, interrupted = runner.run_strategies(config, "ws://unused", progress=None)
    assert (runs, interrupted) == ({"sync": done}, True)
    assert started == ["sync", "async"]  # nothing runs after the interrupt


def test_ctrl_c_during_the_first_strategy_propagates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = runner.config_from_args(parse(tmp_path, "--strategies", "sync,rtc"))

    def run_strategy(config: Any, strategy: Any, url: str, progress: Any) -> runner.StrategyRun:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_strategy", run_strategy)
    with pytest.raises(KeyboardInterrupt):
        runner.run_strategies(config, "ws://unused", progress=None)


def test_without_ctrl_c_every_strategy_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = runner.config_from_args(parse(tmp_path, "--strategies", "sync,rtc"))
    done = runner.StrategyRun([], [], [])
    monkeypatch.setattr(runner, "run_strategy", lambda config, strategy, url, progress: done)
    assert runner.run_strategies(config, "ws://unused", progress=None) == ({"sync": done, "rtc": done}, False)


def test_video_of_a_strategy_that_never_ran_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "plot_boundaries", lambda *args, **kwargs: tmp_path / "boundaries.png")
    config = runner.config_from_args(
        parse(tmp_path, "--strategies", "sync,rtc", "--video", str(tmp_path / "episode.gif"))
    )
    buffer = io.StringIO()
    out = Console(file=buffer, width=200)
    trace: Any = object()
    labels = {"sync": "synchronous", "rtc": "async + RTC"}
    artifacts, cut_short = runner._write_artifacts(
        config, {"sync": runner.StrategyRun([trace], [], [])}, labels, out
    )
    assert artifacts == {"plot": str(tmp_path / "boundaries.png"), "video": None} and not cut_short
    assert "video skipped: interrupted before async + RTC ran" in buffer.getvalue()


def test_ctrl_c_while_writing_the_plot_keeps_the_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the real demo (server, delay proxy, MuJoCo robot), one short episode; Ctrl-C in the plot
    def interrupted_plot(*args: Any, **kwargs: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_boundaries", interrupted_plot)
    monkeypatch.setattr(runner, "_one_torch_thread", lambda: None)  # leave this process's torch as it is
    flags = ("--strategies", "sync", "--episodes", "1", "--max-steps", "12", "--delay-ms", "20", "--quiet")
    config = runner.config_from_args(parse(tmp_path, *flags))
    buffer = io.StringIO()
    payload = runner.run_demo(config, Console(file=buffer, width=200))
    assert payload["interrupted"] is True  # main prints this payload as the JSON line, then exits 130
    assert payload["plot"] is None and payload["video"] is None
    assert payload["strategies"]["sync"]["ticks"] == 12
    assert "plot or video skipped: interrupted" in buffer.getvalue()
