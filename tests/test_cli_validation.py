"""Bad command-line values fail at once as one-line usage errors (exit 2, no traceback).

Each test replaces the long work a command would start with a stub that fails the test, so a value
refused only after the work (or never) shows up as a failure here, fast.
"""

from __future__ import annotations

import importlib.abc
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from rollserve.cli import main as cli_main
from rollserve.training.policy import synthetic_dataset


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of ``rollserve ARGV`` run in this process (an exception fails the test)."""
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def assert_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err
    return err


def _never(name: str):
    def stub(*args: object, **kwargs: object) -> None:
        pytest.fail(f"{name} ran although the command line was invalid")

    return stub


@pytest.fixture
def no_long_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever each command does after checking its flags fails the test instead."""
    from rollserve.demo import runner
    from rollserve.server import launch
    from rollserve.sim import dataset, evaluate
    from rollserve.training import policy, video_world_model, world_model

    monkeypatch.setattr(launch, "listening_socket", _never("serve"))
    monkeypatch.setattr(dataset, "generate_dataset", _never("dataset"))
    monkeypatch.setattr(policy, "_ensure_dataset", _never("dataset generation"))
    monkeypatch.setattr(policy, "_train_with_progress", _never("policy training"))
    monkeypatch.setattr(world_model, "collect", _never("world data collection"))
    monkeypatch.setattr(video_world_model, "collect", _never("video data collection"))
    monkeypatch.setattr(runner, "run_demo", _never("demo"))
    monkeypatch.setattr(evaluate, "evaluate_expert", _never("expert evaluation"))


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "taken"
    path.write_text("not a folder")
    return path


# -- 1. serve --world with a bad spec ------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nosuchmod:f", "no module named 'nosuchmod'"),
        ("rollserve.models.checkpoint:load_default", "not a WorldModel"),
        ("rollserve.models.worlds:no_such_factory", "has no attribute 'no_such_factory'"),
    ],
)
def test_serve_bad_world_spec_is_one_line(spec: str, expected: str, capsys: pytest.CaptureFixture) -> None:
    err = assert_usage_error(
        ["serve", "--port", "0", "--world", spec], capsys, f"world spec {spec!r}", expected
    )
    assert len(err.strip().splitlines()) == 1


# -- 2 and 6. serve's numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "70000"),
        ("--port", "-1"),
        ("--max-sessions", "0"),
        ("--max-sessions", "-1"),
        ("--max-connections", "0"),
        ("--max-connections-per-client", "0"),
        ("--max-body-mb", "-1"),
        ("--max-body-mb", "1e-9"),  # 0.001 bytes: rounds down to a limit of 0 bytes
        ("--max-frame-mb", "-1"),
        ("--max-frame-mb", "1e-9"),
        ("--max-frame-mb", "nan"),
        ("--idle-timeout-s", "-5"),
        ("--max-json-values", "0"),
        ("--rollout-ttl-s", "0"),
        ("--header-timeout-s", "0"),
        ("--keep-alive-s", "-1"),
        ("--refusal-delay-ms", "-1"),
        ("--refusal-delay-max-ms", "-1"),
        ("--refused-lanes", "-1"),
        ("--inline-below-ms", "-0.5"),
        ("--max-wait-ms", "-1"),
        ("--max-batch", "0"),
        ("--rtc-horizon", "0"),
        ("--max-rollout-sessions", "0"),
        ("--replicas", "0"),
    ],
)
def test_serve_refuses_out_of_range_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(
        ["serve", "--world", "toy", flag, value], capsys, f"argument {flag}:", "rollserve serve"
    )


@pytest.mark.parametrize(
    "flag",
    ["--refusal-delay-ms", "--refusal-delay-max-ms", "--refused-lanes", "--inline-below-ms", "--max-wait-ms"],
)
def test_serve_keeps_zero_where_it_turns_a_feature_off(flag: str) -> None:
    import argparse

    from rollserve.server.launch import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert getattr(parser.parse_args([flag, "0"]), flag[2:].replace("-", "_")) == 0


@pytest.mark.parametrize("flag", ["--max-body-mb", "--max-frame-mb"])
def test_serve_sizes_must_be_at_least_one_byte(flag: str, capsys: pytest.CaptureFixture) -> None:
    import argparse

    from rollserve.server.launch import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # one byte is 1 / 1048576 = 9.5367e-07 MiB: 9.5e-07 MiB is 0.996 bytes, 9.6e-07 MiB 1.007 bytes
    assert getattr(parser.parse_args([flag, "9.6e-07"]), flag[2:].replace("-", "_")) == 9.6e-07
    with pytest.raises(SystemExit):
        parser.parse_args([flag, "9.5e-07"])
    assert f"argument {flag}: must be at least 1 byte" in capsys.readouterr().err


@pytest.mark.parametrize("names", [",", " , ,"])
def test_serve_action_names_need_a_name(
    names: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    spec = "rollserve.models.simple_policies:chunk_policy"
    assert_usage_error(
        ["serve", "--policy", spec, "--action-names", names],
        capsys,
        "argument --action-names:",
        "rollserve serve",
    )


def test_serve_bad_port_in_a_real_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollserve.cli", "serve", "--port", "70000"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "argument --port:" in done.stderr and "Traceback" not in done.stderr


# -- 3. dataset --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"), [("--episodes", "-3"), ("--episodes", "0"), ("--action-noise", "-1")]
)
def test_dataset_refuses_bad_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["dataset", flag, value], capsys, f"argument {flag}:")


def test_dataset_refuses_a_directory_as_out(
    tmp_path: Path, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["dataset", "--out", str(tmp_path)], capsys, "argument --out:", "directory")
    assert not list(tmp_path.parent.glob("*.partial"))


def test_dataset_refuses_an_unwritable_out(capsys: pytest.CaptureFixture, no_long_work: None) -> None:
    assert_usage_error(["dataset", "--out", "/proc/nope/x.npz"], capsys, "argument --out:")


def test_dataset_write_failure_leaves_no_partial_file(tmp_path: Path) -> None:
    from rollserve.sim.dataset import write_npz

    target = tmp_path / "taken"
    target.mkdir()
    with pytest.raises(OSError):
        write_npz(target, {"x": np.zeros(1)}, compress=False)
    assert not (tmp_path / "taken.partial").exists()


# -- 4. train policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--batch-size", "0"),
        ("--threads", "0"),
        ("--episodes", "-1"),
        ("--steps", "0"),
        ("--lr", "0"),
        ("--data-seed", "-1"),
    ],
)
def test_train_policy_refuses_non_positive_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(
        ["train", "policy", flag, value], capsys, f"argument {flag}:", "rollserve train policy"
    )


def test_train_policy_checks_out_before_training(
    tmp_path: Path, a_file: Path, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    data = tmp_path / "d.npz"
    np.savez(data, **synthetic_dataset(episodes=2, length=10))
    assert_usage_error(
        ["train", "policy", "--data", str(data), "--out", str(a_file)], capsys, "argument --out:"
    )


def test_train_policy_refuses_an_empty_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollserve.training import policy

    monkeypatch.setattr(policy, "_train_with_progress", _never("policy training"))
    empty = {
        key: value[:0]
        for key, value in synthetic_dataset(episodes=1, length=5).items()
        if key not in ("meta_json", "success")
    }
    np.savez(tmp_path / "empty.npz", **empty, success=np.zeros(0, bool))
    argv = ["train", "policy", "--data", str(tmp_path / "empty.npz"), "--out", str(tmp_path / "ckpt")]
    assert_usage_error(argv, capsys, "argument --data:", "no frames")


# -- 5. train world [--video] -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--episodes", "0"),
        ("--eval-episodes", "0"),
        ("--iterations", "0"),
        ("--threads", "0"),
        ("--noise", "-1"),
    ],
)
def test_train_world_refuses_bad_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["train", "world", flag, value], capsys, f"argument {flag}:", "rollserve train world")


def test_train_world_refuses_an_unroll_longer_than_an_episode(
    capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["train", "world", "--steps", "10", "--unroll", "10"], capsys, "argument --unroll:")


@pytest.mark.parametrize(
    ("flag", "value"), [("--episodes", "0"), ("--eval-episodes", "0"), ("--image-size", "60")]
)
def test_train_video_world_refuses_bad_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["train", "world", "--video", flag, value], capsys, f"argument {flag}:")


def test_evaluate_only_needs_an_existing_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    argv = ["train", "world", "--video", "--evaluate-only", "--out", str(tmp_path / "missing")]
    assert_usage_error(argv, capsys, "argument --out:", "no video world checkpoint")


def test_train_world_checks_out_before_collecting(
    a_file: Path, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["train", "world", "--out", str(a_file)], capsys, "argument --out:")


# -- 7. demo ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-steps", "-3"), ("--max-steps", "0"), ("--episodes", "0"), ("--delay-ms", "-1")],
)
def test_demo_refuses_bad_numbers(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["demo", flag, value], capsys, f"argument {flag}:", "rollserve demo")


def test_demo_checks_out_before_running(
    a_file: Path, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["demo", "--out", str(a_file)], capsys, "argument --out:", "not a directory")


def test_demo_default_episode_limit_is_the_tasks() -> None:
    import argparse

    from rollserve.demo.runner import add_arguments, config_from_args
    from rollserve.sim.layout import MAX_EPISODE_STEPS

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args([])).max_steps == MAX_EPISODE_STEPS
    assert config_from_args(parser.parse_args(["--max-steps", "7"])).max_steps == 7


# -- 8. train world shows progress ------------------------------------------------------------------------


def test_train_world_prints_progress(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tiny = "--episodes 2 --eval-episodes 1 --steps 12 --ensemble 1 --hidden 8 --depth 1 --iterations 40"
    tiny += " --batch 8 --unroll 3 --unroll-iterations 20 --noise 0.0"
    assert cli_main(["train", "world", *tiny.split(), "--out", str(tmp_path / "w")]) == 0
    out = capsys.readouterr().out
    one_step = re.findall(r"^one-step fit \d+/40: ", out, re.MULTILINE)
    unrolled = re.findall(r"^unrolled fit \d+/20: ", out, re.MULTILINE)
    assert 2 <= len(one_step) <= 11 and 2 <= len(unrolled) <= 11, out
    assert re.search(r"^collected \d+/2 training episodes", out, re.MULTILINE), out
    assert (tmp_path / "w" / "config.json").exists()


# -- 9. no command -----------------------------------------------------------------------------------------


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    code, err = _run([], capsys)
    assert code == 2
    assert "commands:" in err and "Traceback" not in err


def test_help_still_exits_zero(capsys: pytest.CaptureFixture) -> None:
    code, _ = _run(["--help"], capsys)
    assert code == 0


def test_version_is_the_packages(capsys: pytest.CaptureFixture) -> None:
    """``rollserve --version`` says the version pyproject.toml gives, and exits 0."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"rollserve {project['version']}\n"


# -- train world: seeds and frame sizes -----------------------------------------------------------


@pytest.mark.parametrize("video", [[], ["--video"]])
def test_train_world_refuses_a_negative_seed(
    video: list[str], capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    assert_usage_error(["train", "world", *video, "--seed", "-1"], capsys, "argument --seed:", "must be >= 0")


@pytest.mark.parametrize("size", ["8", "264", "512"])
def test_train_video_world_refuses_frames_it_cannot_score_or_render(
    size: str, capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    """Below 16 px SSIM's 11x11 window does not fit (after all the training); above 256 px the
    scene's offscreen framebuffer is too small (at the first render)."""
    argv = ["train", "world", "--video", "--image-size", size]
    assert_usage_error(argv, capsys, "argument --image-size:", "from 16", "to 256")


@pytest.mark.parametrize("size", ["16", "256"])
def test_train_video_world_keeps_the_ends_of_the_range(size: str, tmp_path: Path, no_long_work: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="video data collection ran"):
        cli_main(["train", "world", "--video", "--image-size", size, "--out", str(tmp_path / "v")])


def test_evaluate_only_refuses_another_image_size_than_the_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_long_work: None
) -> None:
    from rollserve.models.video_world import VideoWorldNet, save_video_world
    from rollserve.training.video_world_model import task_config

    save_video_world(VideoWorldNet(task_config(4, 8, 8, 16)), tmp_path / "v16")
    argv = [
        "train",
        "world",
        "--video",
        "--evaluate-only",
        "--out",
        str(tmp_path / "v16"),
        "--image-size",
        "64",
    ]
    assert_usage_error(argv, capsys, "argument --image-size:", "16px", "got 64")


def test_sim_evaluate_refuses_zero_episodes(capsys: pytest.CaptureFixture[str], no_long_work: None) -> None:
    from rollserve.sim.evaluate import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--episodes", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "argument --episodes:" in err and "must be >= 1" in err, err


# -- serve: a chosen world's optional dependencies ---------------------------------------------------


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Makes ``names`` (and their submodules) unimportable, as on an install without their extra."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


SIM_EXTRA = ("mujoco", "gymnasium_robotics", "matplotlib")  # what `rollserve[server]` lacks


@pytest.fixture
def server_extra_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented GPU-server install, ``pip install "rollserve[server]"``: no simulator. Modules
    that imported it already are dropped too, so a world built now imports it afresh."""
    for name in list(sys.modules):
        if name.split(".")[0] in SIM_EXTRA or name in ("rollserve.sim.env", "rollserve.models.sim_world"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(SIM_EXTRA), *sys.meta_path])


@pytest.mark.parametrize("world", [[], ["--world", "sim"], ["--world", "video"]])
def test_serve_names_the_extra_a_world_needs_before_serving(
    world: list[str], capsys: pytest.CaptureFixture, no_long_work: None, server_extra_only: None
) -> None:
    """Plain ``serve`` (the sim world) and ``--world video`` (its start frames are rendered by the
    simulator) need the [sim] extra: refused before the socket opens, not a traceback or a 500 on
    every create."""
    err = assert_usage_error(["serve", *world], capsys, "needs mujoco", 'pip install "rollserve[sim]"')
    assert len(err.strip().splitlines()) == 1


def test_serve_learned_world_needs_no_simulator(no_long_work: None, server_extra_only: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="serve ran"):
        cli_main(["serve", "--world", "learned"])


def test_a_missing_module_while_building_a_world_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, server_extra_only: None
) -> None:
    """Past the up-front check (here: switched off), a built-in world's import failure still ends
    as a one-line error naming the module, never a traceback."""
    from rollserve.models import worlds

    monkeypatch.setattr(worlds, "WORLD_MODULES", {})
    err = assert_usage_error(["serve", "--port", "0", "--world", "sim"], capsys, "needs the module 'mujoco'")
    assert 'pip install "rollserve[all]"' in err


# -- serve: flags that other flags would make ignored or fail late ----------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--replicas", "3"), ("--replica-cpus", "2"), ("--replica-gpus", "1"), ("--ray-address", "auto")],
)
def test_serve_ray_flags_need_ray(
    flag: str, value: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    argv = ["serve", "--world", "toy", flag, value]
    assert_usage_error(argv, capsys, f"argument {flag}:", "only with --ray")


def test_serve_one_replica_without_ray_is_still_fine(no_long_work: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="serve ran"):
        cli_main(["serve", "--world", "toy", "--replicas", "1"])


def test_serve_world_policy_needs_a_world(capsys: pytest.CaptureFixture, no_long_work: None) -> None:
    policy = "rollserve.models.simple_policies:chunk_policy"
    argv = ["serve", "--policy", policy, "--world-policy", "reference"]
    assert_usage_error(argv, capsys, "argument --world-policy:", "needs --world")


def test_serve_world_policy_with_the_default_world_is_fine(no_long_work: None) -> None:
    """No --policy and no --world serves both built-ins, so --world-policy has its world."""
    with pytest.raises(pytest.fail.Exception, match="serve ran"):
        cli_main(["serve", "--world-policy", "served"])


@pytest.mark.parametrize(
    "policy",
    [
        [],  # the built-in policy, served by default
        ["--policy", "rollserve.models.checkpoint:load_default"],
        ["--policy", "rollserve.models.checkpoint:load_flow_policy", "--policy-arg", "path=x"],
    ],
)
def test_serve_action_names_clash_with_a_checkpoint_that_names_its_actions(
    policy: list[str], capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    argv = ["serve", *policy, "--action-names", "a,b,c"]
    assert_usage_error(argv, capsys, "argument --action-names:", "names its actions from its checkpoint")


# -- train: --help matches the docs (train policy / train world [--video]) ---------------------------


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("video", [[], ["--video"]])
def test_train_world_help_lists_video(video: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["train", "world", *video], capsys)
    assert re.search(r"^  --video\s+train the video world model", out, re.MULTILINE), out


def test_train_help_lists_only_the_documented_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    out = _help(["train"], capsys)
    assert "{policy,world}" in out and "video" not in out, out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--policy", "rollserve.models.simple_policies:chunk_policy", "--world-arg", "path=x"],
            "needs --world",
        ),
        (["--world", "learned", "--world-arg", "=x"], "must look like KEY=VALUE"),
    ],
)
def test_serve_world_arg_needs_a_world_and_key_value_pairs(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture, no_long_work: None
) -> None:
    assert_usage_error(["serve", *argv], capsys, "--world-arg", expected)


def test_demo_names_the_extra_its_simulated_robot_needs(
    capsys: pytest.CaptureFixture, no_long_work: None, server_extra_only: None
) -> None:
    """``rollserve demo`` on the GPU-server install: a one-line usage error naming the extra, not
    "demo failed: ModuleNotFoundError" after the server started."""
    err = assert_usage_error(["demo"], capsys, "needs mujoco", 'pip install "rollserve[sim]"')
    assert len(err.strip().splitlines()) == 1
