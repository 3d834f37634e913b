"""`rollserve` command line: one entry point, each subcommand in the module that owns the work.

Subcommand modules are imported only when chosen, so `rollserve --help` stays fast and a robot
computer without the server extras can still run the light commands.

The argparse ``type=`` helpers below are shared by every subcommand, so a bad value is refused the
same way everywhere (``rollserve CMD: error: argument --x: ...``, exit 2) before any work starts.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from rollserve import __version__

T = TypeVar("T")

# name -> (module exposing add_arguments(parser) and main(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("rollserve.server.launch", "serve a policy and/or a world model (websocket + REST)"),
    "demo": ("rollserve.demo.runner", "simulated robot driven by the served reference policy"),
    "train": ("rollserve.training.cli", "train the reference policy or the learned world model"),
    "dataset": ("rollserve.sim.dataset", "record expert demonstrations of the MuJoCo task"),
}


class Command(Protocol):
    """What a subcommand module exposes."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int | None: ...


class UsageError(ValueError):
    """A flag value found wrong only after parsing (it needs another flag or a file's contents).

    ``main`` reports it as argparse reports a bad value (usage line, ``error: ...``, exit 2), so a
    check that cannot be a ``type=`` still reads the same and never shows a traceback.
    """


# -- argparse types ---------------------------------------------------------------------------------


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    """``text`` as ``kind``; floats must be finite (NaN would slip through every comparison)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{'a whole number' if kind is int else 'a number'} expected, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number expected, got {text!r}")
    return value


def _at_least(text: str, kind: type[int] | type[float], low: float, *, strict: bool) -> int | float:
    value = _number(text, kind)
    if value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a count or size >= 1 (0 would mean no work done, or a crash late in it)."""
    return int(_at_least(text, int, 1, strict=False))


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0, for flags where 0 means off or none."""
    return int(_at_least(text, int, 0, strict=False))


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (durations and sizes that 0 would make refuse everything)."""
    return float(_at_least(text, float, 0.0, strict=True))


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0, for delays and noise levels where 0 means none."""
    return float(_at_least(text, float, 0.0, strict=False))


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0 picks a free one); the socket layer would raise."""
    port = int(_number(text, int))
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {text}")
    return port


def _check_can_create(folder: Path) -> None:
    """Raise unless ``folder`` exists or can be made and written in, without creating anything."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {folder}: {existing} is not a directory")
    try:  # a real probe: file permissions say nothing to root, and /proc-like folders lie
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = f"{existing}" if existing == folder else f"{folder}: cannot write in {existing}"
        raise argparse.ArgumentTypeError(f"cannot create {where} ({exc.strerror or exc})") from None


def output_file(text: str) -> Path:
    """argparse type: a file to write (or read when present), checked before the work it ends."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path")
    _check_can_create(path.parent)
    return path


def output_dir(text: str) -> Path:
    """argparse type: a folder to write into, checked before the work whose results go there."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    _check_can_create(path)
    return path


def checked(flag: str, kind: Callable[[str], T], value: object) -> T:
    """``kind(str(value))`` for a value settled after parsing (a default computed at run time),
    refused as a ``UsageError`` naming ``flag``, so it reads like argparse's own error."""
    try:
        return kind(str(value))
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument {flag}: {exc}") from None


# -- dispatch ---------------------------------------------------------------------------------------


def run_command(parser: argparse.ArgumentParser, command: Command, argv: list[str]) -> int:
    """Parse ``argv`` with ``command``'s flags and run it; a ``UsageError`` exits as argparse does."""
    command.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return int(command.main(args) or 0)
    except UsageError as exc:
        parser.error(str(exc))  # exits 2


def _top_level_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollserve",
        description="Serve robot-learning policies and world models over the network.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<10}{text}" for name, (_, text) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    parser.add_argument("--version", action="version", version=f"rollserve {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # no command is a usage error: the help goes to stderr, exit 2 (--help exits 0)
        _top_level_parser().print_help(sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        parser = _top_level_parser()
        args = parser.parse_args(argv)  # --help, --version, or an unknown command: exits
        parser.error(f"the command comes first: rollserve {args.command} ...")  # e.g. `rollserve -- serve`
    name, rest = argv[0], argv[1:]
    module_path, help_text = COMMANDS[name]
    module = importlib.import_module(module_path)
    return run_command(argparse.ArgumentParser(prog=f"rollserve {name}", description=help_text), module, rest)


if __name__ == "__main__":
    raise SystemExit(main())
