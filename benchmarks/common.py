"""Shared by every benchmark: repeat-and-median timing, a table on stdout, and one JSON line.

The machine is shared and noisy, so each benchmark measures its baseline in the same run and
reports ratios; absolute numbers are for orientation only.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

from rich.console import Console
from rich.table import Table

PIPE_COLUMNS = 160  # table width on a pipe or in a file (and run_all's COLUMNS): 80 would cut cells


def make_console() -> Console:
    """Tables on stdout: a terminal's own width, ``COLUMNS`` when set, else ``PIPE_COLUMNS`` when
    redirected, so a log file gets whole cells instead of rich's 80-column default."""
    console = Console(stderr=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(stderr=False, width=PIPE_COLUMNS)
    return console


console = make_console()
TABLES: list[dict[str, Any]] = []  # every table printed so far; emit_json carries them (run_all's markdown)


def median_seconds(fn: Callable[[], Any], *, repeats: int, inner: int) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls."""
    fn()  # warm up caches and lazy imports
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline``, NaN when the baseline measured nothing (a starved window on a loaded box)."""
    return value / baseline if baseline else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine_description() -> dict[str, Any]:
    return {
        "date": date.today().isoformat(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_model": _cpu_model(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def format_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right" if column != columns[0] else "left")
    cells = [[format_cell(v) for v in row] for row in rows]
    for row in cells:
        table.add_row(*row)
    console.print(table)
    TABLES.append({"title": title, "columns": list(columns), "rows": cells})


def emit_json(name: str, results: dict[str, Any]) -> None:
    """The last line of every benchmark: machine-readable results."""
    line = {"benchmark": name, "machine": machine_description(), **results, "tables": list(TABLES)}
    TABLES.clear()
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
