"""The README example runs and prints, for each world, the mean return of the episodes it ran and
their success rate; the two worlds roughly agree. README's figures over 20 episodes (-3.39 / -3.16,
100 %; video -23.55, 5 %) come from ``python examples/evaluate_in_worlds.py --episodes 20``."""

from __future__ import annotations

import importlib.util
import re
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
    printed = dict(
        re.findall(r"^\s*(\w+) world: mean return\s+(-?\d+\.\d\d)  success 100%$", out, re.MULTILINE)
    )
    assert set(printed) == {"learned", "sim"}, out  # both worlds, every episode a success
    assert re.search(r"^\s*video world: mean return\s+-?\d+\.\d\d  success \d+%$", out, re.MULTILINE), out
    assert len(returns["video"]) == 2 and np.all(np.isfinite(returns["video"]))  # weak there: not pinned
    assert len(returns["learned"]) == len(returns["sim"]) == 2
    for world, mean in printed.items():
        assert float(mean) == round(float(np.mean(returns[world])), 2)  # the printed value is the mean
    learned, sim = np.mean(returns["learned"]), np.mean(returns["sim"])
    assert np.isfinite(learned) and np.isfinite(sim)
    assert abs(learned - sim) < 5.0  # a success bonus (10) apart would mean the worlds disagree


def test_example_leaves_torch_threads_as_it_found_them() -> None:
    """main() runs on one torch thread for reproducible returns, and puts the caller's back."""
    import torch

    spec = importlib.util.spec_from_file_location("evaluate_in_worlds", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        module.main(["--episodes", "1", "--worlds", "learned"])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
