"""Under ``--ray`` Serve's proxy owns the HTTP connections: the flags for rollserve's own connection
handling (header deadline, connection cap, event loop) cannot apply there, so giving one is a clear
error at start, not a limit silently missing. Checked before Ray is imported: runs without Ray."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from rollserve.scale.launch import flags_without_effect
from rollserve.server.launch import add_arguments


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--ray", *argv])


def test_defaults_and_flags_the_replicas_apply_are_accepted() -> None:
    assert flags_without_effect(_args()) == []
    # the keep-alive goes to the proxy; body, frame and session limits are the replicas' own
    assert (
        flags_without_effect(_args("--keep-alive-s", "2", "--max-body-mb", "4", "--max-sessions", "3")) == []
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--header-timeout-s", "3"), ["--header-timeout-s"]),
        (("--max-connections", "100"), ["--max-connections"]),
        (("--loop", "asyncio"), ["--loop"]),
        (
            ("--max-connections", "100", "--header-timeout-s", "3"),
            ["--header-timeout-s", "--max-connections"],
        ),
    ],
)
def test_each_proxy_owned_flag_given_is_named(argv: tuple[str, ...], named: list[str]) -> None:
    assert flags_without_effect(_args(*argv)) == named


def test_serve_ray_refuses_a_flag_it_cannot_apply() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from rollserve.cli import main; sys.exit(main())",
         "serve", "--ray", "--world", "toy", "--port", "0", "--header-timeout-s", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--header-timeout-s cannot apply with --ray" in result.stderr
    assert "Ray Serve's proxy owns the HTTP connections" in result.stderr
    assert "Traceback" not in result.stderr
