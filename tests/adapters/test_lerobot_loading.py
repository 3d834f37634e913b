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


# -- --policy-arg seed=...: checked before LeRobot is imported ------------------------------------


@pytest.mark.parametrize("seed", ["abc", 1.5, 3.0, True, -1, 2**64, [1]])
def test_a_seed_that_is_not_a_whole_number_from_0_is_refused(tmp_path: Path, seed: object) -> None:
    """A string, a fraction, a bool or a negative number would fail at the first session, be cut to
    a whole number, or be wrapped modulo 2**64 by torch: each is refused when the policy loads."""
    with pytest.raises(PolicyLoadError) as info:
        load_policy(f"lerobot:{_checkpoint(tmp_path, 'smolvla')}", seed=seed)
    assert "seed must be a whole number from 0 to 2**64 - 1, got " + repr(seed) in str(info.value)
    assert "pip install" not in str(info.value)  # refused before LeRobot is needed


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here")
@pytest.mark.parametrize("seed", [None, 0, 7, 2**64 - 1])
def test_a_whole_seed_passes_the_check(tmp_path: Path, seed: int | None) -> None:
    """Without LeRobot the next refusal is the install hint: the seed itself was accepted."""
    with pytest.raises(PolicyLoadError, match=r"pip install 'rollserve\[lerobot\]'"):
        load_policy(f"lerobot:{_checkpoint(tmp_path, 'smolvla')}", seed=seed)


@pytest.mark.parametrize(("arg", "shown"), [("seed=abc", "'abc'"), ("seed=-3", "-3"), ("seed=2.5", "2.5")])
def test_serve_refuses_a_bad_policy_arg_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arg: str, shown: str
) -> None:
    from rollserve.cli import main as cli_main

    path = _checkpoint(tmp_path, "act")
    code = cli_main(["serve", "--policy", f"lerobot:{path}", "--policy-arg", arg, "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert f"rollserve serve: error: policy spec 'lerobot:{path}': seed must be a whole number" in err
    assert err.rstrip().endswith(f"got {shown}"), err


# -- the other --policy-arg options: checked before LeRobot is imported ---------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fps": 0}, "fps must be a positive number, got 0"),
        ({"fps": "30"}, "fps must be a positive number, got '30'"),
        ({"fps": float("inf")}, "fps must be a positive number, got inf"),
        ({"fps": True}, "fps must be a positive number, got True"),
        ({"rtc": "false"}, "rtc must be true or false, got 'false'"),
        ({"rtc": 0}, "rtc must be true or false, got 0"),
        ({"execution_horizon": 0}, "execution_horizon must be a whole number from 1, got 0"),
        ({"execution_horizon": 2.5}, "execution_horizon must be a whole number from 1, got 2.5"),
        ({"execution_horizon": True}, "execution_horizon must be a whole number from 1, got True"),
        ({"max_guidance_weight": -1}, "max_guidance_weight must be a positive number, got -1"),
        ({"max_guidance_weight": float("nan")}, "max_guidance_weight must be a positive number, got nan"),
        ({"max_guidance_weight": "5"}, "max_guidance_weight must be a positive number, got '5'"),
    ],
)
def test_an_option_that_would_be_cast_or_fail_late_is_refused(
    tmp_path: Path, kwargs: dict, message: str
) -> None:
    """``int(2.5)`` cut a horizon, a string fps failed only when a client connected, ``"false"`` was
    truthy: each is refused when the policy loads, before LeRobot is needed."""
    with pytest.raises(PolicyLoadError) as info:
        load_policy(f"lerobot:{_checkpoint(tmp_path, 'smolvla')}", **kwargs)
    assert message in str(info.value)
    assert "pip install" not in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="LeRobot is installed here")
@pytest.mark.parametrize(
    "kwargs",
    [{"fps": 15}, {"fps": 12.5}, {"rtc": False}, {"execution_horizon": 8}, {"max_guidance_weight": 5}],
)
def test_valid_options_pass_the_check(tmp_path: Path, kwargs: dict) -> None:
    """Without LeRobot the next refusal is the install hint: the options themselves were accepted."""
    with pytest.raises(PolicyLoadError, match=r"pip install 'rollserve\[lerobot\]'"):
        load_policy(f"lerobot:{_checkpoint(tmp_path, 'smolvla')}", **kwargs)
