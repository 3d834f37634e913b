"""The examples refuse bad arguments with a one-line usage error (exit 2) before any rollout, and
write nothing; ``video_world_side_by_side.py --checkpoint DIR`` draws the video world at DIR (what
``rollserve train world --video --out DIR`` wrote), not the shipped one. The scripts run as a user
runs them: ``python examples/NAME.py ARGS``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIDE_BY_SIDE = EXAMPLES / "video_world_side_by_side.py"
EVALUATE = EXAMPLES / "evaluate_in_worlds.py"
GAP = 2  # the side-by-side example's white gap between panels, in pixels at scale 1
LEARNED_CHECKPOINT = Path(__file__).resolve().parents[2] / "src" / "rollserve" / "checkpoints" / "world_model"


def _run(script: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*")}


def _assert_usage_error(done: subprocess.CompletedProcess[str], flag: str) -> None:
    """Exit 2; stderr is argparse's usage plus one ``error: argument FLAG: ...`` line, no traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and done.stderr.splitlines()[-1] == errors[0], done.stderr
    assert f"error: argument {flag}: " in errors[0], done.stderr
    assert done.stdout == "", done.stdout  # no "wrote ..." and no step table


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "-3"], "--steps"),
        (["--scale", "0"], "--scale"),
        (["--gif-scale", "0"], "--gif-scale"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**63)], "--seed"),
        (["--name", "a/b"], "--name"),
        (["--name", ".."], "--name"),
        (["--name", ""], "--name"),
        (["--out-dir", "afile"], "--out-dir"),  # an existing file
        (["--out-dir", "afile/sub"], "--out-dir"),  # under a file: cannot be created
        (["--checkpoint", "missing"], "--checkpoint"),
        (["--checkpoint", "afile"], "--checkpoint"),
        (["--checkpoint", str(LEARNED_CHECKPOINT)], "--checkpoint"),  # a checkpoint, not a video world's
    ],
)
def test_side_by_side_refuses_bad_arguments_before_any_rollout(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    (tmp_path / "afile").write_text("not a folder")
    out = ["--out-dir", "out"] if "--out-dir" not in args else []
    done = _run(SIDE_BY_SIDE, [*args, *out], tmp_path)
    _assert_usage_error(done, flag)
    assert _files(tmp_path) == {Path("afile")}  # no GIF, no PNG, no folder


def test_side_by_side_refuses_an_output_that_is_a_folder(tmp_path: Path) -> None:
    (tmp_path / "out" / "x.png").mkdir(parents=True)
    done = _run(SIDE_BY_SIDE, ["--out-dir", "out", "--name", "x"], tmp_path)
    _assert_usage_error(done, "--out-dir")
    assert _files(tmp_path) == {Path("out"), Path("out/x.png")}


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--episodes", "0"], "--episodes"),
        (["--episodes", "-2"], "--episodes"),
        (["--first-seed", "-5"], "--first-seed"),  # gymnasium refuses negative seeds
        (["--first-seed", "-1", "--episodes", "3"], "--first-seed"),
        (["--first-seed", str(2**64 // 1000)], "--first-seed"),  # the policy's noise seed overflows
        (["--worlds", "learned", "bogus"], "--worlds"),
    ],
)
def test_evaluate_refuses_bad_arguments_before_any_episode(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    done = _run(EVALUATE, args, tmp_path)
    _assert_usage_error(done, flag)
    assert "nan" not in done.stdout + done.stderr
    assert _files(tmp_path) == set()


@pytest.fixture(scope="module")
def small_video_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16 px video world saved the way ``rollserve train world --video --image-size 16 --out DIR``
    saves its net (same config builder, same writer), untrained: training takes minutes."""
    from rollserve.models.video_world import VideoWorldNet, save_video_world
    from rollserve.training.video_world_model import task_config

    folder = tmp_path_factory.mktemp("video16") / "v16"
    save_video_world(VideoWorldNet(task_config(4, 8, 8, 16)), folder)
    return folder


def test_side_by_side_draws_the_checkpoint_it_is_given(small_video_world: Path, tmp_path: Path) -> None:
    """Its 16 px frames (the shipped world's are 64 px) show the example drew that world, and the
    simulator panel is rendered at the same size."""
    args = ["--checkpoint", str(small_video_world), "--steps", "5", "--scale", "1", "--out-dir", "out"]
    done = _run(SIDE_BY_SIDE, args, tmp_path)
    assert done.returncode == 0, done.stderr
    gif = imageio.mimread(tmp_path / "out" / "video_world_side_by_side.gif")
    assert len(gif) == 6 and gif[0].shape[:2] == (16, 16 + GAP + 16)
    strip = imageio.imread(tmp_path / "out" / "video_world_side_by_side.png")
    assert strip.shape[:2] == (16 + GAP + 16, 16 + GAP + 16)  # steps 0 and 5
    assert "step   5: RMSE" in done.stdout
