"""Benchmark flags are checked at parse time: a bad value is a usage error before anything is measured."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TASK_EPISODE_TICKS = 120  # the task's 12 s episode at 10 Hz (docs/demo.md)


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import common, loopback, ... as siblings
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def usage_error(capsys: pytest.CaptureFixture[str], call: Any) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_client_src_without_together_is_refused_before_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load("bench_batch_step_cpu")

    def measure(*args: Any) -> dict[str, float]:
        raise AssertionError("measured although the flags were wrong")

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "measure_together", measure)
    err = usage_error(
        capsys, lambda: bench.main(["--client-src", "src", "--seconds", "0.1", "--rounds", "1"])
    )
    assert "--client-src only applies with --together" in err


@pytest.mark.parametrize(
    "flags", [["--sessions", "0"], ["--seconds", "0"], ["--rounds", "0"], ["--rounds", "-2"]]
)
def test_batch_step_cpu_counts_must_be_positive(
    flags: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--seconds 0`` / ``--rounds 0`` silently became the defaults, ``--sessions 0`` measured nothing."""
    bench = load("bench_batch_step_cpu")

    def measure(*args: Any) -> dict[str, float]:
        raise AssertionError("measured although the flags were wrong")

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "measure_together", measure)
    assert flags[0] in usage_error(capsys, lambda: bench.main(["--world", "toy", *flags]))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--episodes", "0"], "--episodes"),
        (["--episodes", "-1"], "--episodes"),
        (["--max-steps", "0"], "--max-steps"),
        (["--strategies", "rtc,foo"], "foo"),
        (["--strategies", ","], "--strategies"),
        (["--delays", "0,-1"], "--delays"),
        (["--delays", "1,x"], "--delays"),
        (["--sync-steps", "0"], "--sync-steps"),
        (["--refill-margin", "-1"], "--refill-margin"),
    ],
)
def test_sweep_refuses_bad_values_at_parse_time(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = load("rtc_delay_sweep")
    assert message in usage_error(capsys, lambda: sweep.parse_args(flags))


def test_sweep_defaults_and_explicit_values() -> None:
    sweep = load("rtc_delay_sweep")
    defaults = sweep.parse_args([])
    assert (defaults.episodes, defaults.max_steps) == (50, TASK_EPISODE_TICKS)
    assert defaults.delays == [0, 1, 2, 3, 4, 6] and defaults.strategies == ["sync", "async", "rtc"]
    assert sweep.parse_args(["--quick"]).episodes == 10
    given = sweep.parse_args(
        ["--quick", "--episodes", "3", "--max-steps", "7", "--delays", "2, 0", "--strategies", "rtc"]
    )
    assert (given.episodes, given.max_steps, given.delays, given.strategies) == (3, 7, [2, 0], ["rtc"])


def test_sweep_json_records_the_effective_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = load("rtc_delay_sweep")
    cell = {"success_rate": 1.0, "boundary_jump_rad": 0.03, "jump_ratio": 0.9}
    monkeypatch.setattr(sweep, "sweep", lambda args: {"rtc": {"2": cell, "5": cell}})
    assert sweep.main(["--episodes", "1", "--delays", "2,5", "--strategies", "rtc"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 1 and result["max_steps"] == TASK_EPISODE_TICKS
    assert result["delays"] == [2, 5] and result["strategies"] == ["rtc"]
