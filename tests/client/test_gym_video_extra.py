"""moviepy (for gymnasium's ``RecordVideo``) comes with the ``gym-video`` extra only: it brings a
bundled ffmpeg (~190 MB installed), so neither the base install, nor ``[gym]`` (the robot side's
gymnasium envs), nor the test venv (``[test]``, which CI installs) may pull it in."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _requirements(extra: str | None) -> set[str]:
    """Distribution names an install of ``rollserve[extra]`` (None: no extra) asks for, through the
    extras that name ``rollserve[...]`` again."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    names, todo, seen = set(), list(project["dependencies"]), set()
    todo += [] if extra is None else [f"rollserve[{extra}]"]
    while todo:
        spec = todo.pop()
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()  # type: ignore[union-attr]
        if name != "rollserve":
            names.add(name)
            continue
        for wanted in re.findall(r"[A-Za-z0-9_-]+", spec.partition("[")[2]):
            if wanted not in seen:
                seen.add(wanted)
                todo += extras[wanted]
    return names


def test_gym_video_is_gym_plus_moviepy() -> None:
    assert _requirements("gym-video") == _requirements("gym") | {"moviepy"}


def test_no_other_install_pulls_moviepy() -> None:
    for extra in (None, "gym", "server", "sim", "all", "test"):
        assert "moviepy" not in _requirements(extra), extra
    assert "gymnasium" in _requirements("gym")  # the walk does see extras' requirements
