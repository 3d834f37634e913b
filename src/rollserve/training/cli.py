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
}
# `train world --video`: the video world model, a job of its own with its own flags
VIDEO_JOB = ("rollserve.training.video_world_model", "train the learned video world model")
VIDEO_HELP = "train the video world model instead (its flags: rollserve train world --video --help)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", choices=sorted(JOBS), help="what to train")
    parser.add_argument("job_args", nargs=argparse.REMAINDER, help="options of the job (see JOB --help)")


def main(args: argparse.Namespace) -> int:
    video = args.job == "world" and "--video" in args.job_args
    module_path, help_text = VIDEO_JOB if video else JOBS[args.job]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"rollserve train {args.job}", description=help_text)
    if args.job == "world":  # listed in both jobs' --help; the trainers ignore it
        parser.add_argument("--video", action="store_true", help=VIDEO_HELP)
    return run_command(parser, module, args.job_args)
