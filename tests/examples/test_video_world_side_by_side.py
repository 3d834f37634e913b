"""The side-by-side example writes a GIF with one frame per step and a two-row PNG strip, from the
real simulator and the shipped video world."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import imageio.v2 as imageio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "video_world_side_by_side.py"


def test_example_writes_the_gif_and_the_strip(tmp_path: Path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("video_world_side_by_side", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = module.main(["--steps", "5", "--scale", "1", "--gif-scale", "1", "--out-dir", str(tmp_path)])
    gif = imageio.mimread(paths["gif"])
    assert len(gif) == 6 and gif[0].shape[:2] == (64, 64 + 64 + module.GAP)
    strip = imageio.imread(paths["png"])
    assert strip.shape[:2] == (64 + module.GAP + 64, 2 * 64 + module.GAP)  # steps 0 and 5
    assert "step   5: RMSE" in capsys.readouterr().out
