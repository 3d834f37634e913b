"""The RTC experiment in a tiny configuration: it runs, prints its table and JSON line, shows the effect."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rtc_delay_sweep.py"


def load_sweep():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rtc_delay_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_reproduces_the_qualitative_result(capsys: pytest.CaptureFixture[str]) -> None:
    sweep = load_sweep()
    assert sweep.main(["--episodes", "2", "--delays", "0,6"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any("RTC delay sweep" in line for line in out[:-1])
    result = json.loads(out[-1])
    assert result["benchmark"] == "rtc_delay_sweep" and result["episodes"] == 2
    sync, naive, rtc = (result["results"][name] for name in ("sync", "async", "rtc"))

    # synchronous: no stalls without delay; d stall ticks per chunk with delay
    assert sync["0"]["stall_ticks"] == 0 and sync["6"]["stalls_per_episode"] >= 6
    assert sync["6"]["ticks_per_step"] > 1.2
    # asynchronous never stalls; the naive switch jumps at boundaries as the delay grows, RTC does not
    assert naive["6"]["stall_ticks"] == 0 and rtc["6"]["stall_ticks"] == 0
    assert naive["6"]["boundary_jump_rad"] > naive["0"]["boundary_jump_rad"]
    assert rtc["6"]["boundary_jump_rad"] < naive["6"]["boundary_jump_rad"]
    assert rtc["6"]["success_rate"] >= naive["6"]["success_rate"]
