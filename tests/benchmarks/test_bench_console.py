"""Benchmark tables redirected to a pipe or a file keep their cells whole (rich would assume 80 columns)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
WIDE_ROW = ["rollserve session protocol", "2.83", "2.06-12.10", "0.766", "3.34", "1.11", "1,289", "1.04"]
COLUMNS = [
    "server / protocol", "p50 ms", "round p50s", "p50 - floor ms", "p99 ms", "p50 x openpi-server",
    "server CPU us/req", "CPU x openpi-server",
]  # fmt: skip
SCRIPT = f"import common; common.print_table('t', {COLUMNS!r}, [{WIDE_ROW!r}])"


def print_table_to_a_pipe(**env: str) -> str:
    environ = {key: value for key, value in os.environ.items() if key != "COLUMNS"} | env
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=BENCHMARKS,
        env=environ,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_redirected_table_is_not_cut() -> None:
    out = print_table_to_a_pipe()
    assert "…" not in out
    for cell in WIDE_ROW:
        assert cell in out
    assert (
        max(len(line) for line in out.splitlines()) <= 160
    )  # as wide as run_all makes every benchmark (and the demo)


def test_columns_still_wins() -> None:
    out = print_table_to_a_pipe(COLUMNS="60")
    assert max(len(line) for line in out.splitlines()) <= 60
