"""The shared argparse types and the `rollserve` dispatcher, word for word (mutation review).

Every subcommand refuses a bad value through these helpers, so their messages and bounds are what a
user reads (``rollserve CMD: error: argument --x: ...``, exit 2). Expected texts are written out
here from the rules in the docstrings, never read back from the code under test.
"""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from rollserve import cli


def _refusal(kind: object, text: str) -> str:
    """The message ``kind(text)`` refuses ``text`` with (the test fails if it is accepted)."""
    with pytest.raises(argparse.ArgumentTypeError) as info:
        kind(text)  # type: ignore[operator]
    return str(info.value)


# -- numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (cli.positive_int, "abc", "a whole number expected, got 'abc'"),
        (cli.positive_int, "1.5", "a whole number expected, got '1.5'"),
        (cli.non_negative_int, "", "a whole number expected, got ''"),
        (cli.port_number, "http", "a whole number expected, got 'http'"),
        (cli.positive_float, "abc", "a number expected, got 'abc'"),
        (cli.non_negative_float, "1,5", "a number expected, got '1,5'"),
        (cli.positive_float, "nan", "a finite number expected, got 'nan'"),
        (cli.positive_float, "inf", "a finite number expected, got 'inf'"),
        (cli.non_negative_float, "-inf", "a finite number expected, got '-inf'"),
        (cli.non_negative_float, "NaN", "a finite number expected, got 'NaN'"),
    ],
)
def test_unreadable_numbers_say_what_was_expected(kind: object, text: str, message: str) -> None:
    assert _refusal(kind, text) == message


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (cli.positive_int, "0", "must be >= 1, got 0"),
        (cli.positive_int, "-7", "must be >= 1, got -7"),
        (cli.non_negative_int, "-1", "must be >= 0, got -1"),
        (cli.positive_float, "0", "must be > 0, got 0"),
        (cli.positive_float, "0.0", "must be > 0, got 0.0"),
        (cli.positive_float, "-0.25", "must be > 0, got -0.25"),
        (cli.non_negative_float, "-0.5", "must be >= 0, got -0.5"),
        (cli.non_negative_float, "-1e-9", "must be >= 0, got -1e-9"),
    ],
)
def test_out_of_range_numbers_name_the_bound(kind: object, text: str, message: str) -> None:
    assert _refusal(kind, text) == message


@pytest.mark.parametrize(
    ("kind", "text", "value", "type_"),
    [
        (cli.positive_int, "1", 1, int),
        (cli.positive_int, "12", 12, int),
        (cli.non_negative_int, "0", 0, int),
        (cli.non_negative_int, "3", 3, int),
        (cli.positive_float, "1e-9", 1e-9, float),
        (cli.positive_float, "2", 2.0, float),
        (cli.non_negative_float, "0", 0.0, float),
        (cli.non_negative_float, "0.5", 0.5, float),
    ],
)
def test_values_on_and_inside_the_bounds_are_kept(kind: object, text: str, value: float, type_: type) -> None:
    """The bound itself is accepted where the rule says >= (and refused where it says >)."""
    got = kind(text)  # type: ignore[operator]
    assert got == value and type(got) is type_


@pytest.mark.parametrize(("text", "port"), [("0", 0), ("1", 1), ("8000", 8000), ("65535", 65535)])
def test_ports_from_0_to_65535_are_kept(text: str, port: int) -> None:
    got = cli.port_number(text)
    assert got == port and type(got) is int


@pytest.mark.parametrize("text", ["-1", "65536", "70000"])
def test_ports_outside_the_range_are_refused(text: str) -> None:
    assert _refusal(cli.port_number, text) == f"a port is 0-65535, got {text}"


# -- files and folders --------------------------------------------------------------------------------


def test_output_file_may_sit_in_folders_not_made_yet(tmp_path: Path) -> None:
    """The check creates nothing: the folders appear only when the work writes its result."""
    target = tmp_path / "a" / "b" / "out.npz"
    assert cli.output_file(str(target)) == target
    assert list(tmp_path.iterdir()) == []


def test_output_file_refuses_a_directory(tmp_path: Path) -> None:
    assert _refusal(cli.output_file, str(tmp_path)) == f"{tmp_path} is a directory; give a file path"


def test_output_file_refuses_a_parent_that_is_a_file(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    message = _refusal(cli.output_file, str(taken / "sub" / "out.npz"))
    assert message == f"cannot create {taken / 'sub'}: {taken} is not a directory"


def test_output_dir_accepts_an_existing_folder_and_a_new_one(tmp_path: Path) -> None:
    assert cli.output_dir(str(tmp_path)) == tmp_path
    assert cli.output_dir(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert list(tmp_path.iterdir()) == []


def test_output_dir_refuses_an_existing_file(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert _refusal(cli.output_dir, str(taken)) == f"{taken} exists and is not a directory"


def test_output_dir_refuses_a_folder_under_a_file(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    message = _refusal(cli.output_dir, str(taken / "runs"))
    assert message == f"cannot create {taken / 'runs'}: {taken} is not a directory"


def test_a_folder_nothing_can_be_written_in_is_refused() -> None:
    """/proc takes no new files, whatever its mode bits say (root passes every permission check)."""
    assert _refusal(cli.output_dir, "/proc") == "cannot create /proc (No such file or directory)"
    message = _refusal(cli.output_dir, "/proc/rollserve-runs/a")
    assert message == (
        "cannot create /proc/rollserve-runs/a: cannot write in /proc (No such file or directory)"
    )
    message = _refusal(cli.output_file, "/proc/rollserve.npz")
    assert message == "cannot create /proc (No such file or directory)"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        message = _refusal(cli.output_dir, str(locked / "runs"))
    finally:
        locked.chmod(stat.S_IRWXU)
    assert message == f"cannot create {locked / 'runs'}: cannot write in {locked} (Permission denied)"


# -- values settled after parsing ---------------------------------------------------------------------


def test_checked_returns_the_value_its_type_makes() -> None:
    assert cli.checked("--episodes", cli.positive_int, 3) == 3
    assert cli.checked("--rate", cli.positive_float, "2.5") == 2.5


def test_checked_refuses_as_argparse_would_name_the_flag() -> None:
    with pytest.raises(cli.UsageError) as info:
        cli.checked("--episodes", cli.positive_int, 0)
    assert str(info.value) == "argument --episodes: must be >= 1, got 0"
    assert isinstance(info.value, ValueError)  # callers that catch ValueError still see it


# -- dispatch -----------------------------------------------------------------------------------------


class _Command:
    """A subcommand that records what it was given and answers with ``result`` or ``error``."""

    def __init__(self, result: int | None = None, error: Exception | None = None) -> None:
        self.result, self.error = result, error
        self.args: argparse.Namespace | None = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--steps", type=cli.positive_int, default=1)

    def main(self, args: argparse.Namespace) -> int | None:
        self.args = args
        if self.error is not None:
            raise self.error
        return self.result


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="rollserve job")


@pytest.mark.parametrize(("result", "code"), [(None, 0), (0, 0), (3, 3)])
def test_run_command_returns_the_commands_exit_code(result: int | None, code: int) -> None:
    command = _Command(result)
    assert cli.run_command(_parser(), command, ["--steps", "4"]) == code
    assert command.args is not None and command.args.steps == 4


def test_a_usage_error_after_parsing_reads_like_argparses_own(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command(error=cli.UsageError("argument --steps: needs --other"))
    with pytest.raises(SystemExit) as info:
        cli.run_command(_parser(), command, [])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "usage: rollserve job [-h] [--steps STEPS]\nrollserve job: error: argument --steps: needs --other\n"
    )


def test_other_errors_are_not_turned_into_usage_errors() -> None:
    """Only ``UsageError`` is a usage error: a bug in the work still raises, with its traceback."""
    with pytest.raises(RuntimeError, match="boom"):
        cli.run_command(_parser(), _Command(error=RuntimeError("boom")), [])


def test_a_bad_type_value_is_refused_before_the_command_runs(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command()
    with pytest.raises(SystemExit) as info:
        cli.run_command(_parser(), command, ["--steps", "0"])
    assert info.value.code == 2 and command.args is None
    assert capsys.readouterr().err.endswith("rollserve job: error: argument --steps: must be >= 1, got 0\n")


EXPECTED_COMMANDS = (
    "commands:\n"
    "  serve     serve a policy and/or a world model (websocket + REST)\n"
    "  demo      simulated robot driven by the served reference policy\n"
    "  train     train the reference policy or the learned world model\n"
    "  dataset   record expert demonstrations of the MuJoCo task\n"
)


def test_no_command_prints_the_help_with_every_command_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: rollserve [-h] [--version] {dataset,demo,serve,train}\n")
    assert "Serve robot-learning policies and world models over the network.\n" in err
    assert err.endswith(EXPECTED_COMMANDS)


def test_top_level_help_exits_zero_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rollserve [-h] [--version] {dataset,demo,serve,train}\n")
    assert out.endswith(EXPECTED_COMMANDS)


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["sreve"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "rollserve: error: argument command: invalid choice: 'sreve' "
        "(choose from 'dataset', 'demo', 'serve', 'train')\n"
    )


def test_no_arguments_reads_sys_argv(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr("sys.argv", ["rollserve", "--version"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("rollserve ")
    monkeypatch.setattr("sys.argv", ["rollserve"])
    assert cli.main() == 2


@pytest.mark.parametrize(
    ("name", "description"),
    [
        ("serve", "serve a policy and/or a world model (websocket + REST)"),
        ("demo", "simulated robot driven by the served reference policy"),
        ("train", "train the reference policy or the learned world model"),
        ("dataset", "record expert demonstrations of the MuJoCo task"),
    ],
)
def test_each_command_has_its_own_prog_and_description(
    name: str, description: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rollserve {name} ")
    assert f"\n\n{description}\n\n" in out


def test_a_commands_usage_error_names_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["dataset", "--episodes", "0"])
    assert info.value.code == 2
    expected = "rollserve dataset: error: argument --episodes: must be >= 1, got 0\n"
    assert capsys.readouterr().err.endswith(expected)


def test_top_level_help_says_what_the_command_argument_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "positional arguments:\n  {dataset,demo,serve,train}\n" in out
    assert "\n                        what to run\n" in out


def test_a_command_after_a_double_dash_is_refused_with_where_it_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``rollserve -- serve`` parses at the top level (``--`` ends the options) but is not dispatched:
    only a command given first runs; the error says where it goes instead of exiting silently."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--", "serve"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: rollserve ")
    assert err.endswith("rollserve: error: the command comes first: rollserve serve ...\n")


# -- `rollserve train`: the router to each training job ----------------------------------------------


def test_train_help_says_what_each_argument_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "\n  {policy,world}  what to train\n  job_args        options of the job (see JOB --help)\n" in out


@pytest.mark.parametrize(
    ("job_args", "prog", "description"),
    [
        (["policy"], "rollserve train policy", "behaviour-clone the reference flow-matching policy"),
        (["world"], "rollserve train world", "train the learned world model (--video: the video one)"),
        (["world", "--video"], "rollserve train world", "train the learned video world model"),
    ],
)
def test_each_training_job_has_its_own_prog_and_description(
    job_args: list[str],
    prog: str,
    description: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as info:
        cli.main(["train", *job_args, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} [-h]")
    assert f"\n\n{description}\n\n" in out
