"""Run every benchmark, print each table, and write ``results/latest.json`` and ``results/latest.md``.

Each benchmark runs in its own process (a crash or a leftover thread in one cannot skew the next);
its last stdout line is its JSON result, which carries its tables. ``--quick`` runs everything in
under 10 minutes on 2 cores.

    python benchmarks/run_all.py --quick
    python benchmarks/run_all.py --only roundtrip many_robots
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PIPE_COLUMNS, machine_description

HERE = Path(__file__).resolve().parent

# name -> script; a script that is not there yet (the RTC sweep is optional) is skipped.
BENCHMARKS: dict[str, str] = {
    "codec": "bench_codec.py",
    "roundtrip": "bench_roundtrip.py",
    "many_robots": "bench_many_robots.py",
    "rollouts": "bench_rollouts.py",
    "rtc_delay_sweep": "rtc_delay_sweep.py",
}


def run_one(script: Path, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run one benchmark, echoing its output; returns its JSON result (or why there is none)."""
    env = dict(os.environ, COLUMNS=os.environ.get("COLUMNS", str(PIPE_COLUMNS)), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env, cwd=HERE.parent
    )
    assert process.stdout is not None
    last_json: dict[str, Any] | None = None
    watchdog = threading.Timer(timeout_s, process.kill)  # a hung benchmark must not hang the run
    watchdog.start()
    for line in process.stdout:
        if line.startswith("{"):
            try:
                last_json = json.loads(line)
                continue  # the JSON line goes to latest.json, not the console
            except json.JSONDecodeError:
                pass
        sys.stdout.write(line)
    returncode = process.wait()
    watchdog.cancel()
    seconds = time.monotonic() - started
    if returncode != 0 or last_json is None:
        return {"ok": False, "seconds": seconds, "returncode": returncode, "result": last_json}
    return {"ok": True, "seconds": seconds, "returncode": 0, "result": last_json}


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    lines = [
        f"# rollserve benchmarks, {report['date']}",
        "",
        f"Command: `{report['command']}` ({report['total_seconds']:.0f} s). Machine: {machine['cpu_count']} "
        f"x {machine['cpu_model']} ({machine['machine']}), Python {machine['python']}, 1-minute load "
        f"average {machine['load_average_1m']:.1f} at the start (shared machine: compare ratios, not "
        "absolute numbers).",
        "",
    ]
    for name, run in report["benchmarks"].items():
        lines.append(f"## {name} ({run['seconds']:.0f} s)")
        lines.append("")
        if not run["ok"]:
            lines += [f"Failed (exit code {run['returncode']}); see the console output.", ""]
        for table in (run.get("result") or {}).get("tables", []):
            lines += [f"**{table['title']}**", ""]
            lines.append("| " + " | ".join(table["columns"]) + " |")
            lines.append("|" + "|".join(["---"] + ["---:"] * (len(table["columns"]) - 1)) + "|")
            lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark in its quick mode (< 10 min)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run just these")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="where latest.json/.md go")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed per benchmark")
    args = parser.parse_args(argv)
    timeout_s = args.timeout or (300.0 if args.quick else 1800.0)
    names = args.only or list(BENCHMARKS)

    started = time.monotonic()
    machine = machine_description()
    runs: dict[str, Any] = {}
    for name in names:
        script = HERE / BENCHMARKS[name]
        if not script.exists():
            print(f"[run_all] {name}: {script.name} not present, skipped", flush=True)
            continue
        print(f"[run_all] {name} ...", flush=True)
        runs[name] = run_one(script, ["--quick"] if args.quick else [], timeout_s)
        status = "ok" if runs[name]["ok"] else f"FAILED (exit {runs[name]['returncode']})"
        print(f"[run_all] {name}: {status} in {runs[name]['seconds']:.0f} s", flush=True)

    argv_text = " ".join(["python benchmarks/run_all.py", *(argv if argv is not None else sys.argv[1:])])
    report = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": argv_text,
        "quick": args.quick,
        "total_seconds": time.monotonic() - started,
        "machine": machine,
        "benchmarks": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "latest.md").write_text(markdown(report) + "\n")
    total = report["total_seconds"]
    print(f"[run_all] {len(runs)} benchmarks in {total:.0f} s; wrote {args.out}/latest.json and latest.md")
    return 0 if all(run["ok"] for run in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
