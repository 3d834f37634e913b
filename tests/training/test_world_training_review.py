"""World and video-world training: checkpoints readable by all, written before the report, and
``--evaluate-only`` at the checkpoint's own frame size."""

from __future__ import annotations

import importlib.util
import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from rollserve.cli import main as cli_main
from rollserve.models.net_checkpoint import CONFIG_FILE, WEIGHTS_FILE, save_net


@dataclass(frozen=True)
class _Config:
    width: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_net_checkpoints_are_readable_by_all(tmp_path: Path) -> None:
    """safetensors creates its file 0600; a shipped checkpoint must load for every user."""
    out = save_net(nn.Linear(2, 2), _Config(), tmp_path / "ck", fmt="test", version=1)
    assert _mode(out / WEIGHTS_FILE) == 0o644
    assert _mode(out / CONFIG_FILE) & 0o444 == 0o444


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the sim extra")
def test_a_16px_video_world_is_saved_before_its_report_and_evaluates_at_16px(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollserve.training import video_world_model

    out = tmp_path / "v16"
    real_report = video_world_model.horizon_errors
    seen_at_report: list[int] = []

    def report_after_saving(net: Any, data: Any) -> dict[str, Any]:
        seen_at_report.append(_mode(out / WEIGHTS_FILE))  # FileNotFoundError: not saved yet
        return real_report(net, data)

    monkeypatch.setattr(video_world_model, "horizon_errors", report_after_saving)
    tiny = "--episodes 1 --eval-episodes 1 --steps 2 --unroll 1 --ae-iterations 1 --dyn-iterations 1"
    tiny += " --decoder-iterations 0 --batch 2 --latent-channels 4 --width 8 --dynamics-width 8"
    tiny += " --image-size 16"
    assert cli_main(["train", "world", "--video", *tiny.split(), "--out", str(out)]) == 0
    assert seen_at_report == [0o644]
    stored = json.loads((out / CONFIG_FILE).read_text())
    assert stored["image_size"] == 16 and "evaluation" in stored["training"]
    capsys.readouterr()

    argv = ["train", "world", "--video", "--evaluate-only", "--out", str(out), "--eval-episodes", "1"]
    assert cli_main([*argv, "--steps", "2"]) == 0
    out_text = capsys.readouterr().out
    report = json.loads(out_text[out_text.index("{") :])  # after the rendering progress lines
    assert report["episodes"] == 1 and list(report["horizon_steps"]) == ["1"]


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the sim extra")
def test_a_world_model_is_saved_before_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report that fails after the training (here: at once) leaves the trained checkpoint."""
    from rollserve.models.learned_world import load_world_model
    from rollserve.training import world_model

    out = tmp_path / "w"

    def failing_report(world: Any, data: Any) -> dict[str, Any]:
        assert _mode(out / WEIGHTS_FILE) == 0o644  # FileNotFoundError: not saved yet
        raise RuntimeError("report failed")

    monkeypatch.setattr(world_model, "horizon_errors", failing_report)
    tiny = "--episodes 1 --eval-episodes 1 --steps 3 --ensemble 1 --hidden 8 --depth 1 --iterations 2"
    tiny += " --batch 2 --unroll 1 --unroll-iterations 0"
    with pytest.raises(RuntimeError, match="report failed"):
        cli_main(["train", "world", *tiny.split(), "--out", str(out)])
    stored = json.loads((out / CONFIG_FILE).read_text())
    assert stored["training"]["episodes"] == 1 and "evaluation" not in stored["training"]
    assert load_world_model(out).config.ensemble == 1
