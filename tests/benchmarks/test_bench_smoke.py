"""Every benchmark runs in a tiny configuration, prints its table and ends with its JSON line.

Correctness only: no timing is asserted (the machine is shared and noisy). Each script runs as a
subprocess, as a user runs it, so leftover servers or robot processes would show up as a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: float = 180.0) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ, COLUMNS="160"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["tables"], "a benchmark prints at least one table"
    assert result["tables"][0]["title"].split()[0] in "\n".join(lines[:-1])
    return result


def test_codec() -> None:
    result = run_benchmark("bench_codec.py", "--quick")
    assert result["benchmark"] == "codec" and "rollserve" in result["cases"]["action chunk 50x8"]


def test_roundtrip() -> None:
    result = run_benchmark(
        "bench_roundtrip.py", "--rounds", "1", "--requests", "3", "--cameras", "1", "--side", "16",
        "--layouts", "libero", "--clients", "2", "--duration", "1.0", "--repeats", "1",
    )  # fmt: skip
    assert result["benchmark"] == "roundtrip"
    libero = result["layouts"]["libero"]
    names = {
        "floor (bare websockets)",
        "openpi-server",
        "rollserve session protocol",
        "rollserve openpi endpoint",
    }
    assert set(libero["round_trip"]) == names == set(libero["throughput"]["variants"])
    for trip in libero["round_trip"].values():
        assert trip["requests"] == 3 and trip["p99_ms"] >= trip["p50_ms"] > 0 and trip["server_cpu_us"] > 0
    assert all(point["requests_per_s"] > 0 for point in libero["throughput"]["variants"].values())


def test_many_robots() -> None:
    result = run_benchmark(
        "bench_many_robots.py",
        "--model",
        "gpu-like",
        "--clients",
        "1",
        "2",
        "--duration",
        "1.0",
        "--repeats",
        "1",
    )
    points = result["models"]["gpu-like"]["points"]
    assert set(points) == {
        "openpi-server",
        "rollserve, batching off",
        "rollserve, batching on",
        "rollserve openpi endpoint, batching on",
    }
    for by_clients in points.values():
        assert set(by_clients) == {"1", "2"}
        assert all(cell["requests_per_s"] > 0 for cell in by_clients.values())


def test_rollouts() -> None:
    result = run_benchmark(
        "bench_rollouts.py", "--world", "toy", "--sessions", "1", "2", "--steps", "2", "--repeats", "1"
    )
    assert result["benchmark"] == "rollouts" and result["world"] == "toy"
    for point in result["points"].values():
        assert {
            "HTTP batch_step",
            "HTTP batch_step, columns",
            "HTTP step, one thread per session",
            "in-process step_batch",
        } <= set(point)
        assert all(path["steps_per_s"] > 0 for path in point.values())
    assert set(result["columns_speedup"]["HTTP step, one thread per session"]) == {"1", "2"}


def test_batch_step_cpu() -> None:
    result = run_benchmark(
        "bench_batch_step_cpu.py", "--world", "toy", "--sessions", "2", "--seconds", "0.3", "--rounds", "1"
    )
    assert result["benchmark"] == "batch_step_cpu" and result["sessions"] == 2
    (tree,) = result["trees"].values()
    assert tree["wall_ms"] > 0 and tree["server_ms"] >= tree["loop_ms"] >= 0 and tree["client_ms"] >= 0


def test_batch_step_cpu_with_columns() -> None:
    result = run_benchmark(
        "bench_batch_step_cpu.py", "--world", "toy", "--sessions", "2", "--seconds", "0.3", "--rounds", "1",
        "--columns",
    )  # fmt: skip
    assert set(result["trees"]) == {"this tree", "this tree (columns)"}
    for tree in result["trees"].values():
        assert tree["wall_ms"] > 0 and tree["server_ms"] >= tree["loop_ms"] >= 0


def test_batch_step_cpu_together_with_a_client_tree() -> None:
    src = str(BENCHMARKS.parent / "src")
    result = run_benchmark(
        "bench_batch_step_cpu.py", "--world", "toy", "--sessions", "2", "--seconds", "0.3", "--rounds", "1",
        "--together", "--src", src, "--client-src", src,
    )  # fmt: skip
    server, client = result["trees"][src], result["trees"][f"client {src}"]
    assert server["wall_ms"] > 0 and client["wall_ms"] > 0 and client["client_ms"] >= 0
    assert server["server_ms"] != server["server_ms"]  # NaN: the client row shared this server


def test_rest_cpu_measures_every_request_kind() -> None:
    src = str(BENCHMARKS.parent / "src")
    result = run_benchmark("bench_rest_cpu.py", "--requests", "5", "--rounds", "1", "--src", src)
    assert result["benchmark"] == "rest_cpu" and result["world"] == "toy"
    assert set(result["trees"]) == {src}
    for kinds in result["trees"].values():
        assert set(kinds) == {"step", "status", "malformed", "healthz"}
        assert all(kind["server_us"] > 0 and kind["wall_us"] > 0 for kind in kinds.values())


def test_run_all_writes_json_and_markdown(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(BENCHMARKS / "run_all.py"),
        "--quick",
        "--only",
        "codec",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    assert report["quick"] and report["benchmarks"]["codec"]["ok"] and report["machine"]["cpu_count"]
    text = (tmp_path / "latest.md").read_text()
    assert "## codec" in text and "| case |" in text


@pytest.mark.parametrize(
    "script",
    [
        "bench_roundtrip.py",
        "bench_many_robots.py",
        "bench_rollouts.py",
        "bench_batch_step_cpu.py",
        "bench_rest_cpu.py",
        "run_all.py",
    ],
)
def test_help(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "--quick" in done.stdout
