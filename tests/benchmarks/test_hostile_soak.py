"""The hostile-client soak in a short configuration: correctness, never speed (issue 8).

Every class of hostile input reaches every surface of a real ``rollserve serve`` while a healthy
robot and trainer work: no crash, no traceback leak, RSS within the bound, slowloris connections
closed by the header deadline and opened again all through the attack, and a flood that cannot flood
the log.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _soak(args: list[str]) -> dict[str, Any]:
    """Run the soak with ``args``; its one JSON line."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "hostile_soak.py"), *args],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, "the soak prints exactly one JSON line"
    return json.loads(lines[0])


def test_short_soak_has_no_crash_no_leak_and_bounded_memory(tmp_path: Path) -> None:
    args = ["--per-surface", "600", "--world", "toy", "--idle-seconds", "2", "--slowloris", "10"]
    args += ["--recovery-seconds", "2", "--attacker-nice", "5"]
    args += ["--attack-window-s", "2.5", "--pause-s", "1", "--min-round-requests", "10"]
    args += ["--slowloris-ramp-s", "0.3"]
    result = _soak([*args, "--samples-out", str(tmp_path / "samples.json"), "--max-seconds", "150"])
    assert result["crashes"] == 0 and result["server_alive"], result
    assert result["traceback_leaks"] == 0
    assert result["rss_ok"], (result["rss_peak_over_baseline_mb"], result["rss_bound_mb"])
    # held through every attack window: each one the header deadline (2 s here) closed was opened
    # again; the pauses between windows, and the end, close the rest from the soak's side
    assert result["slowloris"] == 10 and result["slowloris_opened"] > 10
    assert result["slowloris_closed_by_server"] > 0
    closed = result["slowloris_closed_by_server"] + result["slowloris_closed_at_pauses"]
    assert closed == result["slowloris_opened"]
    # interleaved rounds: the attack paused between windows, idle windows on both sides of each
    windows = result["windows"]
    # (one idle window more when the attackers finish during the last pause: it precedes recovery)
    assert windows["attack"] >= 2 and windows["attack"] + 1 <= windows["idle"] <= windows["attack"] + 2, (
        windows
    )
    kinds = [kind for kind, _, _ in json.loads((tmp_path / "samples.json").read_text())["windows"]]
    assert kinds[0] == kinds[-1] == "idle", kinds
    assert "attack" not in {after for before, after in itertools.pairwise(kinds) if before == "attack"}, kinds
    for client in ("robot_p99", "trainer_p99"):
        report = result[client]
        assert report["requests"]["idle"] > 0 and report["requests"]["attack"] > 0, client
        assert 1 <= report["rounds"]["count"] <= windows["attack"], client
        assert report["rounds"]["min"] <= report["rounds"]["median"] <= report["rounds"]["max"]
        assert result[f"{client}_ratio"] == report["ratio"]
    # the samples written out are the ones the report was computed from
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert [kind for kind, _, _ in samples["windows"]].count("attack") == windows["attack"]
    for client in ("robot", "trainer"):
        again = soak_module().p99_report([tuple(x) for x in samples[client]], samples["windows"], 10)
        assert again == result[f"{client}_p99"], client
    assert 0 < result["server_cpu_ms_per_input_net"] < result["server_cpu_ms_per_input"]
    assert result["server_log_lines"] < 100
    for client in ("robot_p99", "trainer_p99"):  # served again once the attack is over
        assert result[client]["after_ms"] > 0, client
    spec = importlib.util.spec_from_file_location("hostile_soak", BENCHMARKS / "hostile_soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    classes = {
        "session_ws": soak.session_inputs(),
        "openpi_ws": soak.openpi_inputs(),
        "rest": soak.rest_inputs(),
    }
    assert result["attacker_nice"] == 5 and result["control"] is False
    # the server's own count (its /metrics): every input it refused, no more than were sent
    assert 0 < result["errors_answered"] <= result["hostile_inputs_sent"], result["errors_answered"]
    assert windows["control"] == 0 and "control_p99" not in result
    for surface in result["surfaces"]:
        assert surface["nice"] == min(19, os.nice(0) + 5), "each attacker ran at the asked priority"
        expected = {name for name, _, _ in classes[surface["surface"]]}
        assert set(surface["classes"]) == expected, surface["surface"]
        assert surface["sent"] >= 590
    # the REST attacker's raw HTTP/1.1 (prebuilt h11 events over a plain socket) read every answer:
    # refusals only, the oversized bodies among them as 413, on connections kept alive
    rest = next(surface for surface in result["surfaces"] if surface["surface"] == "rest")
    assert sum(rest["statuses"].values()) == rest["sent"] and rest["internal"] == 0, rest
    assert set(rest["statuses"]) <= {"400", "404", "413", "415", "422"} and "413" in rest["statuses"], rest
    assert rest["reconnects"] < rest["sent"] // 10, rest
    for surface in result["surfaces"]:  # websockets' sans-I/O protocol on a plain socket: the server's
        if surface["surface"] != "rest":  # 1009 on an oversized message is read as such
            assert surface["closed_1009"] >= 1 and surface["internal"] == 0, surface
            assert surface["reconnects"] < surface["sent"] // 10, surface


def test_control_soak_takes_turns_with_an_identical_attack_on_a_decoy(tmp_path: Path) -> None:
    """``--control``: attack windows (the healthy clients' server attacked) and control windows (the
    same attack on a decoy) take turns, an idle window between any two; each server answers only
    its own attackers' inputs (its /metrics error count is at most what was sent to it), and the
    healthy clients' p99 is reported for both kinds of window."""
    args = ["--per-surface", "200", "--world", "toy", "--idle-seconds", "1", "--slowloris", "5"]
    args += ["--recovery-seconds", "1", "--attack-window-s", "1.5", "--pause-s", "0.5"]
    args += ["--min-round-requests", "5", "--slowloris-ramp-s", "0.3", "--control"]
    result = _soak([*args, "--samples-out", str(tmp_path / "samples.json"), "--max-seconds", "100"])
    assert result["control"] is True and result["crashes"] == 0 and result["traceback_leaks"] == 0, result
    decoy = result["control_decoy"]
    assert result["hostile_inputs_sent"] >= 590 and decoy["hostile_inputs_sent"] >= 590
    assert 0 < result["errors_answered"] <= result["hostile_inputs_sent"], result["errors_answered"]
    assert 0 < decoy["errors_answered"] <= decoy["hostile_inputs_sent"], decoy["errors_answered"]
    assert decoy["slowloris_opened"] >= 5 and result["slowloris_opened"] >= 5
    kinds = [kind for kind, _, _ in json.loads((tmp_path / "samples.json").read_text())["windows"]]
    busy = [kind for kind in kinds if kind != "idle"]
    assert busy[:2] == ["attack", "control"], kinds  # in turn, from the first window
    assert kinds[0] == kinds[-1] == "idle" and all("idle" in pair for pair in itertools.pairwise(kinds)), (
        kinds
    )
    assert result["windows"]["control"] == busy.count("control") >= 1
    for client in ("robot", "trainer"):
        control = result["control_p99"][client]
        assert control["requests"]["attack"] > 0 and control["requests"]["idle"] > 0, client
        assert result[f"{client}_p99_ratio_control"] == control["ratio"]
        assert control["idle_ms"] == result[f"{client}_p99"]["idle_ms"], "both against the same idle windows"


def soak_module() -> Any:
    spec = importlib.util.spec_from_file_location("hostile_soak", BENCHMARKS / "hostile_soak.py")
    assert spec is not None and spec.loader is not None
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    return soak


def test_p99_report_takes_each_attack_window_against_the_idle_windows_beside_it() -> None:
    soak = soak_module()
    windows = [("idle", 0.0, 10.0), ("attack", 10.0, 20.0), ("idle", 20.0, 30.0), ("attack", 30.0, 40.0)]
    windows.append(("idle", 40.0, 50.0))
    # 100 requests a window, at t = start + 0.1 k; round trips 1..100 ms times the window's factor
    factors = [1.0, 3.0, 2.0, 4.0, 1.0]
    samples = [
        (start + 0.1 * k, (k + 1) * factor)
        for (_, start, _), factor in zip(windows, factors, strict=True)
        for k in range(100)
    ]
    samples.append((55.0, 1000.0))  # outside every window: ignored
    report = soak.p99_report(samples, windows, min_round=100)
    # common.percentile takes the sorted value at index round(0.99 * (n - 1)): in one window of 100
    # index 98, the 99th smallest; pooled idle (1..100 twice, 2..200 by 2; n = 300) index 296, 194 ms;
    # pooled attack (3..300 by 3, 4..400 by 4; n = 200) index 197, 392 ms
    assert report["idle_ms"] == 194.0 and report["attack_ms"] == 392.0
    assert report["ratio"] == round(392.0 / 194.0, 2) == 2.02
    assert report["after_ms"] == 99.0  # the last idle window alone
    # round 1: 297 ms against windows 0 and 2 pooled (n = 200, index 197: 196 ms); round 2: 396 ms
    # against windows 2 and 4 (196 ms again); the median of two is the lower (index round(0.5) = 0)
    assert report["rounds"]["values"] == [round(297.0 / 196.0, 2), round(396.0 / 196.0, 2)] == [1.52, 2.02]
    assert report["rounds"]["count"] == 2
    rounds = report["rounds"]
    assert (rounds["median"], rounds["min"], rounds["max"]) == (1.52, 1.52, 2.02)
    assert report["requests"] == {"idle": 300, "attack": 200}
    assert soak.p99_report(samples, windows, min_round=101)["rounds"]["count"] == 0


def test_gate_counts_inputs_in_flight_and_parks_senders_between_windows() -> None:
    import multiprocessing
    import threading

    soak = soak_module()
    gate = soak.Gate(multiprocessing.get_context("spawn"))
    entered: list[bool] = []
    sender = threading.Thread(target=lambda: entered.append(gate.enter()))
    sender.start()
    sender.join(0.3)
    assert sender.is_alive() and gate.idle(), "parked while the window is closed, nothing in flight"
    gate.go.set()
    sender.join(10)
    assert entered == [True] and not gate.idle()
    gate.leave()
    assert gate.idle()
    gate.halt.set()
    assert gate.enter() is False and gate.idle()
