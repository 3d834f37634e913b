"""`rollserve demo` end to end: real server, real websocket through the delay proxy, tiny config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DELAY_MS = 60.0
TICKS = 12


def test_demo_prints_the_table_and_a_final_json_line(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "rollserve.cli", "demo", "--episodes", "1", "--max-steps", str(TICKS),
        "--delay-ms", str(DELAY_MS), "--out", str(tmp_path / "out"), "--video", str(tmp_path / "episode.gif"),
        "--quiet", "--seed", "5",
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    for label in ("synchronous", "async, no RTC", "async + RTC"):
        assert any(label in line for line in lines[:-1]), done.stdout

    result = json.loads(lines[-1])
    assert set(result["strategies"]) == {"sync", "async", "rtc"}
    assert result["delay_ms"] == DELAY_MS and result["seeds"] == [5]
    for name, row in result["strategies"].items():
        assert row["episodes"] == 1 and row["ticks"] == TICKS, name  # too short to succeed: runs to the limit
        assert row["executed_steps"] + row["stall_ticks"] == TICKS
        assert row["round_trip_ms_p50"] >= DELAY_MS  # the injected delay is a lower bound on every round trip
        assert row["inference_ms_p50"] > 0
    # synchronous: the 9th tick finds its 8-action chunk used up and has to wait for the next one
    assert result["strategies"]["sync"]["stall_ticks"] >= 1

    assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(result["video"]).read_bytes()[:6] in (b"GIF89a", b"GIF87a")
