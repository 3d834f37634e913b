"""Training and sim-evaluation flags refused at once (exit 2, no traceback), before any work starts.

As in ``test_cli_validation.py``, the long work each command would start is replaced by a stub that
fails the test, so a value refused only after that work (or never) shows up here as a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollserve.cli import main as cli_main


def _never(name: str):
    def stub(*args: object, **kwargs: object) -> None:
        pytest.fail(f"{name} ran although the command line was invalid")

    return stub


@pytest.fixture
def no_long_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollserve.sim import evaluate
    from rollserve.training import video_world_model, world_model

    monkeypatch.setattr(world_model, "collect", _never("world data collection"))
    monkeypatch.setattr(video_world_model, "collect", _never("video rendering"))
    monkeypatch.setattr(evaluate, "evaluate_expert", _never("expert evaluation"))


def assert_usage_error(code_of: int | None, err: str, *expected: str) -> None:
    assert code_of == 2, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err


def _exit_code(run, capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str]:
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize("video", [[], ["--video"]])
def test_train_world_refuses_a_negative_seed(
    video: list[str], capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    code, err = _exit_code(lambda: cli_main(["train", "world", *video, "--seed", "-1"]), capsys)
    assert_usage_error(code, err, "argument --seed:", "must be >= 0")


@pytest.mark.parametrize("size", ["8", "264", "512"])
def test_train_video_world_refuses_frames_it_cannot_score_or_render(
    size: str, capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    """Below 16 px SSIM's 11x11 window does not fit (after all the training); above 256 px the
    scene's offscreen framebuffer is too small (at the first render)."""
    code, err = _exit_code(lambda: cli_main(["train", "world", "--video", "--image-size", size]), capsys)
    assert_usage_error(code, err, "argument --image-size:", "from 16", "to 256")


@pytest.mark.parametrize("size", ["16", "256"])
def test_train_video_world_keeps_the_ends_of_the_range(size: str, tmp_path: Path, no_long_work: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="video rendering ran"):
        cli_main(["train", "world", "--video", "--image-size", size, "--out", str(tmp_path / "v")])


def test_evaluate_only_refuses_another_image_size_than_the_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    from rollserve.models.video_world import VideoWorldNet, save_video_world
    from rollserve.training.video_world_model import task_config

    save_video_world(VideoWorldNet(task_config(4, 8, 8, 16)), tmp_path / "v16")
    argv = ["train", "world", "--video", "--evaluate-only", "--out", str(tmp_path / "v16")]
    argv += ["--image-size", "64"]
    code, err = _exit_code(lambda: cli_main(argv), capsys)
    assert_usage_error(code, err, "argument --image-size:", "16px", "got 64")


def test_sim_evaluate_refuses_zero_episodes(capsys: pytest.CaptureFixture[str], no_long_work: None) -> None:
    from rollserve.sim.evaluate import main

    code, err = _exit_code(lambda: main(["--episodes", "0"]), capsys)
    assert_usage_error(code, err, "argument --episodes:", "must be >= 1")
