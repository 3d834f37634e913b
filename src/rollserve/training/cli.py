"""`rollserve train policy|world`: route to the module that owns each training job.

Modules are imported only when chosen, so training the policy never imports the world model's code.
"""

from __future__ import annotations

import argparse
import importlib

from rollserve.cli import run_command

# subcommand -> (module exposing add_arguments(parser) and main(args) -> int, one-line help)
JOBS: dict[str, tuple[str, str]] = {
    "policy": ("rollserve.training.policy", "behaviour-clone the reference flow-matching policy"),
    "world": ("rollserve.training.world_model", "train the learned world model (--video: the video one)"),
    "video": ("rollserve.training.video_world_model", "train the learned video world model"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", choices=sorted(JOBS), help="what to train")
    parser.add_argument("job_args", nargs=argparse.REMAINDER, help="options of the job (see JOB --help)")


def main(args: argparse.Namespace) -> int:
    job = "video" if args.job == "world" and "--video" in args.job_args else args.job
    job_args = [a for a in args.job_args if a != "--video"] if job == "video" else args.job_args
    module_path, help_text = JOBS[job]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"rollserve train {args.job}", description=help_text)
    return run_command(parser, module, job_args)
