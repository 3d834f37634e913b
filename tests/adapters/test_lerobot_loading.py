"""`lerobot:PATH` specs: the errors a user sees before (or without) LeRobot being imported.

These run in the base environment too: the type check reads config.json only.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rollserve.adapters.lerobot import SUPPORTED_TYPES
from rollserve.models.loading import PolicyLoadError, load_policy


def _checkpoint(tmp_path: Path, policy_type: str) -> Path:
    out = tmp_path / "pretrained_model"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"type": policy_type}))
    return out


def test_unknown_type_names_the_supported_ones(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "tdmpc")
    with pytest.raises(PolicyLoadError) as info:
        load_policy(f"lerobot:{path}")
    message = str(info.value)
    assert "'tdmpc' is not supported" in message
    assert "act, diffusion, pi0, pi05, smolvla" in message
    assert sorted(SUPPORTED_TYPES) == ["act", "diffusion", "pi0", "pi05", "smolvla"]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p / "missing", "is not a directory"),
        (lambda p: p, "has no config.json"),
    ],
)
def test_not_a_checkpoint_dir(tmp_path: Path, make, expected: str) -> None:
    with pytest.raises(PolicyLoadError, match=expected):
        load_policy(f"lerobot:{make(tmp_path)}")


def test_empty_path_and_bare_directory_get_a_hint(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="needs a checkpoint directory"):
        load_policy("lerobot:")
    with pytest.raises(PolicyLoadError, match=f"use 'lerobot:{tmp_path}'"):
        load_policy(str(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here")
def test_without_lerobot_the_error_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match=r"pip install 'rollserve\[lerobot\]'"):
        load_policy(f"lerobot:{_checkpoint(tmp_path, 'act')}")


def test_serve_help_documents_the_lerobot_syntax() -> None:
    import argparse

    from rollserve.server.launch import add_arguments, policy_kwargs_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "'lerobot:PATH' for a LeRobot checkpoint directory" in text and "--action-names" in text
    args = parser.parse_args(["--policy", "lerobot:x", "--action-names", "a,b", "--policy-arg", "seed=3"])
    assert policy_kwargs_of(args) == {"seed": 3, "action_names": ["a", "b"]}
