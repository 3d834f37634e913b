"""A world checkpoint whose task does not fit its layouts is refused when it loads, not served:
a one-value action bound would broadcast over every action, a short home pose would start every
session with a state shorter than its layout, and an action box needs both of its bounds."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollserve.models import learned_world, video_world

LOADERS: dict[str, tuple[Callable[[Any], Any], Path]] = {
    "learned": (learned_world.load_default, learned_world.default_checkpoint_dir()),
    "video": (video_world.load_default, video_world.default_checkpoint_dir()),
}


def _broken_copy(tmp_path: Path, kind: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    _, shipped = LOADERS[kind]
    copy = tmp_path / kind
    shutil.copytree(shipped, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_the_shipped_world_checkpoints_pass_the_checks(kind: str) -> None:
    load, shipped = LOADERS[kind]
    assert load(shipped).config.start is not None


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(action_low=c["action_low"][:1]), "action_low has 1 values for 8 actions"),
        (lambda c: c.update(action_high=c["action_high"] + [1.0]), "action_high has 9 values for 8 actions"),
        (
            lambda c: c["start"].update(home_qpos=c["start"]["home_qpos"][:6]),
            "the start distribution gives 12 values for 13 states",
        ),
        (
            lambda c: c.update(action_high=[]),
            "action_low and action_high go together",
        ),
    ],
    ids=["short-low", "long-high", "short-home", "half-box"],
)
def test_a_world_checkpoint_that_does_not_fit_its_layouts_is_refused(
    tmp_path: Path, kind: str, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    load, _ = LOADERS[kind]
    with pytest.raises(ValueError, match=message):
        load(_broken_copy(tmp_path, kind, edit))
