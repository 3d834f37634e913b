"""The demo's address and path lines stay one line in a pipe: a wrapped path can't be copied or grepped."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rollserve.demo import plots, runner

NARROW = 40


def narrow_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=NARROW, highlight=False), buffer


def test_print_line_never_wraps() -> None:
    out, buffer = narrow_console()
    text = "rollserve demo: served at ws://127.0.0.1:45678/v1/policy/ws; " + "x" * 100
    runner.print_line(out, text)
    assert buffer.getvalue() == text + "\n"


def test_plot_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("a-long-folder-name-" * 5) / "boundaries.png"
    monkeypatch.setattr(plots, "plot_boundaries", lambda *args, **kwargs: deep)
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    config = runner.config_from_args(parser.parse_args(["--out", str(tmp_path), "--strategies", "sync"]))
    trace: Any = object()
    out, buffer = narrow_console()
    runner._write_artifacts(config, {"sync": runner.StrategyRun([trace], [], [])}, {"sync": "s"}, out)
    assert buffer.getvalue() == f"plot: {deep}\n"
