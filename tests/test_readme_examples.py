"""README's Python examples run as written (each in a fresh interpreter, against a real server).

Blocks that name the placeholder host ``gpu-box`` show how to reach a remote machine and are
not run; every other ``python`` block is.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
RUNNABLE = [block for block in BLOCKS if "gpu-box" not in block]


def test_readme_has_runnable_examples() -> None:
    assert len(RUNNABLE) >= 2


@pytest.mark.parametrize("code", RUNNABLE, ids=[f"block{i}" for i in range(len(RUNNABLE))])
def test_readme_example_runs(code: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = re.findall(r"print\(.*\)\s+#\s*(.+)", code)
    for line in expected:
        assert line.strip() in done.stdout
    assert done.stdout.strip(), "an example should show its result"
    if "RolloutEnv" in code:  # the world example: the policy succeeds in both worlds, returns agree
        results = re.findall(
            r"^(\w+): return (-?\d+\.\d\d), success (True|False)$", done.stdout, re.MULTILINE
        )
        assert [(world, ok) for world, _, ok in results] == [("learned", "True"), ("sim", "True")], (
            done.stdout
        )
        learned, sim = (float(value) for _, value, _ in results)
        assert abs(learned - sim) < 5.0  # a success bonus (10) apart would mean the worlds disagree
