"""Without Ray installed, ``rollserve serve --ray`` says how to get it instead of failing obscurely."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here")
def test_serve_ray_without_ray_names_the_extra() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from rollserve.cli import main; sys.exit(main())",
         "serve", "--ray", "--replicas", "2", "--world", "toy", "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert 'pip install "rollserve[ray]"' in result.stderr
    assert "Traceback" not in result.stderr
