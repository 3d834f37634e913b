"""The demo's closing table (rich) and its last line (the same figures as one JSON object)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from rollserve.demo.metrics import json_ready


def _num(value: float, digits: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


CAPTION = (
    "stalls: ticks with no action ready / all ticks. ms: p50 / p99; round trip includes the added delay. "
    "jump: mean joint-space step (rad) between consecutive executed actions, at a chunk boundary vs "
    "inside a chunk; ratio = boundary / inside (1 = seamless)."
)


def results_table(results: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str], title: str) -> Table:
    """One row per strategy; see docs/demo.md for how to read each column."""
    table = Table(title=title, title_justify="left", caption=CAPTION, caption_justify="left")
    table.add_column("strategy", justify="left")
    for column in (
        "success",
        "steps/s",
        "stalls",
        "infer ms",
        "round trip ms",
        "jump: boundary",
        "in chunk",
        "ratio",
    ):
        table.add_column(column, justify="right")
    for name, row in results.items():
        table.add_row(
            labels.get(name, name),
            f"{row['successes']}/{row['episodes']}",
            _num(row["steps_per_s"], 2),
            f"{row['stall_ticks']}/{row['ticks']}",
            f"{_num(row['inference_ms_p50'], 1)} / {_num(row['inference_ms_p99'], 1)}",
            f"{_num(row['round_trip_ms_p50'])} / {_num(row['round_trip_ms_p99'])}",
            _num(row["boundary_jump_rad"], 4),
            _num(row["within_jump_rad"], 4),
            _num(row["jump_ratio"], 2),
        )
    return table


def json_line(payload: Mapping[str, Any]) -> str:
    """One line, NaN as null, floats rounded."""
    return json.dumps(json_ready(dict(payload)), separators=(",", ":"))
