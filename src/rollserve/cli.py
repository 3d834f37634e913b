"""`rollserve` command line: one entry point, each subcommand in the module that owns the work.

Subcommand modules are imported only when chosen, so `rollserve --help` stays fast and a robot
computer without the server extras can still run the light commands.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module exposing add_arguments(parser) and main(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("rollserve.server.launch", "serve a policy and/or a world model (websocket + REST)"),
    "demo": ("rollserve.demo.runner", "simulated robot driven by the served reference policy"),
    "train": ("rollserve.training.cli", "train the reference policy or the learned world model"),
    "dataset": ("rollserve.sim.dataset", "record expert demonstrations of the MuJoCo task"),
}


def _top_level_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollserve",
        description="Serve robot-learning policies and world models over the network.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<10}{text}" for name, (_, text) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        _top_level_parser().parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    module_path, help_text = COMMANDS[name]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"rollserve {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
