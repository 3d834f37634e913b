"""Tiny LeRobot checkpoints, built once per test run with LeRobot's own classes (no hub)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def lerobot_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed (CI runs these in its own venv)")
    from rollserve.adapters.lerobot import tiny

    root = tmp_path_factory.mktemp("lerobot")
    return {name: build(root / name, seed=0) for name, build in tiny.BUILDERS.items()}
