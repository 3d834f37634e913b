"""`rollserve train` flags: the policy trainer's seed refused like the world trainer's, and every
trainer's flags explained in --help."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from rollserve.cli import main as cli_main
from rollserve.training import policy, video_world_model, world_model


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of ``rollserve ARGV``, which must exit 2 as argparse does (no traceback)."""
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        pytest.fail("the dataset or the training started although --seed was invalid")

    monkeypatch.setattr(policy, "_ensure_dataset", never)
    monkeypatch.setattr(policy, "_train_with_progress", never)


@pytest.mark.parametrize("value", ["-1", "1.5", "x"])
def test_a_bad_seed_is_refused_as_the_world_trainer_refuses_it(
    value: str, capsys: pytest.CaptureFixture[str], no_training: None
) -> None:
    err = _usage_error(["train", "policy", "--seed", value], capsys)
    world_err = _usage_error(["train", "world", "--seed", value], capsys)
    reason = world_err.strip().splitlines()[-1].split("argument --seed: ", 1)[1]  # the shared validator's
    assert err.strip().splitlines()[-1] == f"rollserve train policy: error: argument --seed: {reason}"


def test_seed_zero_is_still_the_default_and_accepted() -> None:
    parser = argparse.ArgumentParser()
    policy.add_arguments(parser)
    assert parser.parse_args([]).seed == 0
    assert parser.parse_args(["--seed", "0"]).seed == 0
    assert parser.parse_args(["--seed", "7"]).seed == 7


@pytest.mark.parametrize(
    ("trainer", "count"),
    [(policy, 15), (world_model, 14), (video_world_model, 18)],
    ids=["policy", "world", "video"],
)
def test_every_flag_of_every_trainer_has_help_text(trainer: ModuleType, count: int) -> None:
    parser = argparse.ArgumentParser()
    trainer.add_arguments(parser)
    flags = [action for action in parser._actions if action.option_strings and action.dest != "help"]
    assert len(flags) == count  # a new flag must come with its help
    assert [a.option_strings[0] for a in flags if not (a.help or "").strip()] == []
