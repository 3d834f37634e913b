"""generate_dataset refuses arguments that would write a useless or mislabelled file, before writing."""

from __future__ import annotations

import argparse
import math
import re

import numpy as np
import pytest

from rollserve.sim.dataset import add_arguments, generate_dataset, load_dataset

EPISODES = "num_episodes must be a whole number >= 1, got "
SEED = "seed must be a whole number >= 0, got "
NOISE = "action_noise must be a finite number >= 0 (rad), got "


@pytest.mark.parametrize(
    ("num_episodes", "seed", "action_noise", "message"),
    [
        (0, 0, 0.0, EPISODES + "0"),  # used to write an empty dataset
        (-1, 0, 0.0, EPISODES + "-1"),
        (True, 0, 0.0, EPISODES + "True"),
        (2.0, 0, 0.0, EPISODES + "2.0"),
        (1, -1, 0.0, SEED + "-1"),
        (1, 0.5, 0.0, SEED + "0.5"),
        (1, 0, -0.1, NOISE + "-0.1"),  # used to record without noise, its meta saying -0.1
        (1, 0, math.nan, NOISE + "nan"),  # the same, meta saying NaN
        (1, 0, math.inf, NOISE + "inf"),
        (1, 0, "0.1", NOISE + "'0.1'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_created(
    tmp_path, num_episodes, seed, action_noise, message
) -> None:
    out = tmp_path / "new_folder" / "demos.npz"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        generate_dataset(num_episodes, seed, out, progress=False, action_noise=action_noise)
    assert list(tmp_path.iterdir()) == []


def test_numpy_integers_are_plain_counts_in_the_file(tmp_path) -> None:
    summary = generate_dataset(np.int64(1), np.int64(4), tmp_path / "d.npz", progress=False)
    meta = load_dataset(summary.path).meta
    assert (meta["num_episodes"], meta["seed"], meta["action_noise"]) == (1, 4, 0.0)


def test_the_cli_refuses_a_negative_seed(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--seed", "-1", "--out", str(tmp_path / "d.npz")])
    assert exit_.value.code == 2
    assert "--seed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
