"""The README example runs and prints a return for each world; the two worlds roughly agree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "evaluate_in_worlds.py"


def test_example_prints_both_returns(capsys) -> None:
    spec = importlib.util.spec_from_file_location("evaluate_in_worlds", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    returns = module.main(["--episodes", "2"])
    out = capsys.readouterr().out
    assert "learned world: mean return" in out and "sim world: mean return" in out
    learned, sim = np.mean(returns["learned"]), np.mean(returns["sim"])
    assert np.isfinite(learned) and np.isfinite(sim)
    assert abs(learned - sim) < 5.0  # a success bonus (10) apart would mean the worlds disagree
