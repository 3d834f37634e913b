"""``rollserve serve --world learned|video --world-arg path=DIR`` serves a world trained to another
``--out`` (``rollserve train world [--video] --out DIR``), not the shipped checkpoint."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import httpx
import pytest

from rollserve.models.learned_world import default_checkpoint_dir as learned_dir
from rollserve.models.video_world import default_checkpoint_dir as video_dir
from rollserve.models.worlds import WorldLoadError, load_world
from rollserve.server.app import create_app
from rollserve.server.launch import add_arguments, load_services, parse_policy_args
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SHIPPED = {"learned": learned_dir(), "video": video_dir()}
MARK = 0.125  # a first action bound no shipped checkpoint has: it shows which folder was read


def _retrained(world: str, tmp_path: Path) -> Path:
    """A copy of the shipped checkpoint whose first action bound is ``MARK``."""
    folder = shutil.copytree(SHIPPED[world], tmp_path / f"{world}_retrained")
    config = json.loads((folder / "config.json").read_text())
    assert config["action_high"][0] != MARK
    config["action_high"][0] = MARK
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _served_action_high(argv: list[str]) -> list[float]:
    """``/v1/models``' action bounds of the world ``rollserve serve ARGV`` would serve."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    settings = ServerSettings()
    _, rollout = load_services(
        None, args.world, settings, policy_kwargs={}, execution_horizon=None, openpi_layout="auto",
        world_kwargs=parse_policy_args(args.world_arg, "--world-arg"),
    )  # fmt: skip
    with serving(create_app(settings, rollout=rollout)) as server:
        models = httpx.get(server.http_url + "/v1/models", timeout=30).json()["data"]
    rollout.close()
    (entry,) = [m for m in models if m["id"] == args.world]
    return entry["action"]["high"]


@pytest.mark.parametrize("world", ["learned", "video"])
def test_serve_a_world_trained_to_another_folder(world: str, tmp_path: Path) -> None:
    folder = _retrained(world, tmp_path)
    assert _served_action_high(["--world", world, "--world-arg", f"path={folder}"])[0] == MARK
    assert _served_action_high(["--world", world])[0] != MARK  # without it: the shipped one


@pytest.mark.parametrize(
    ("spec", "kwargs", "expected"),
    [
        ("toy", {"path": "x"}, "world 'toy' takes no argument 'path' (--world-arg); it takes none"),
        ("learned", {"seed": 1}, "world 'learned' takes no argument 'seed' (--world-arg); it takes path"),
        ("learned", {"path": "/no/such/folder"}, "No such file or directory"),
    ],
)
def test_bad_world_args_are_world_load_errors(spec: str, kwargs: dict[str, str], expected: str) -> None:
    with pytest.raises(WorldLoadError) as info:
        load_world(spec, **kwargs)
    assert expected in str(info.value)
