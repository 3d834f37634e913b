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

console = Console(stderr=False)


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
    }


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right" if column != columns[0] else "left")
    for row in rows:
        table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)


def emit_json(name: str, results: dict[str, Any]) -> None:
    """The last line of every benchmark: machine-readable results."""
    sys.stdout.write(json.dumps({"benchmark": name, "machine": machine_description(), **results}) + "\n")
    sys.stdout.flush()
