"""Many rollouts: steps per second of N parallel sessions against a served world model.

Each point steps N sessions of the learned world model for a number of environment steps:

- ``batch_step``: one ``POST /v1/realtime/batch_step`` per environment step carrying all N items;
- ``batch_step`` columns: the same steps as one ``POST /v1/realtime/batch_step/columns`` (an
  ``(N, 8)`` array of actions in, an array of observations out; what ``RolloutVectorEnv`` sends for
  sessions without frames);
- ``step``: every session stepped on its own ``POST .../{id}/step`` from its own client thread (the
  server may still batch concurrent requests on its engine);
- ``step`` in turn: one client steps the sessions one after another (each step its own model call);
- in-process: the world's ``step_batch`` called directly with all N steps (the floor), and one step
  at a time.

The server (``rollserve serve --world ...``) runs in a subprocess with one math thread; the
in-process floor also runs with one. Overhead per step is the time per session-step over HTTP minus
the in-process batched time per session-step. ``--frames on`` (or ``both``) makes every session
render: the first camera at 64x64, raw (the simulator renders it; the video world decodes it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit_json, print_table
from loopback import running, start_rollserve

from rollserve.client.rollout_client import RolloutClient


def random_actions(spec: Any, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` actions drawn inside the world's action box (zeros centred when it has none)."""
    low = np.asarray(spec.action_low if spec.action_low is not None else [-0.1] * spec.action_dim)
    high = np.asarray(spec.action_high if spec.action_high is not None else [0.1] * spec.action_dim)
    return rng.uniform(low, high, (count, spec.action_dim)).astype(np.float32)


def render_spec(world: Any, frames: bool) -> Any:
    """The worlds' render request of a session with frames: its first camera at 64x64."""
    from rollserve.models.world import RenderSpec

    if not frames:
        return None
    height, width = world.spec.frame_size or (64, 64)
    return RenderSpec((world.spec.cameras[0],), height, width)


def in_process(world: Any, sessions: int, steps: int, one_at_a_time: bool, frames: bool = False) -> float:
    """Seconds per session-step calling ``world.step_batch`` directly."""
    from rollserve.models.world import WorldInit, WorldStep

    rng = np.random.default_rng(0)
    render = render_spec(world, frames)
    inits = [WorldInit(seed=i, render=render) for i in range(sessions)]
    states = [out.state for out in world.initial_states(inits)]
    started = time.perf_counter()
    for t in range(steps + 1):
        if t == 1:
            started = time.perf_counter()  # step 0 warms up, as over HTTP
        actions = random_actions(world.spec, sessions, rng)
        calls = [WorldStep(state=s, action=a) for s, a in zip(states, actions, strict=True)]
        outs = [world.step_batch([c])[0] for c in calls] if one_at_a_time else world.step_batch(calls)
        states = [out.state for out in outs]
    return (time.perf_counter() - started) / (steps * sessions)


class Rollouts:
    """N sessions on the served world, each with its own client (and connection)."""

    def __init__(
        self,
        url: str,
        model: str,
        sessions: int,
        render: dict[str, Any] | None = None,
        client_module: Any = None,
    ) -> None:
        """``client_module``: another tree's ``rollout_client`` module (an A/B of client code)."""
        module = client_module or sys.modules[RolloutClient.__module__]
        self.step_call = module.StepCall
        self.clients = [module.RolloutClient(url) for _ in range(sessions)]
        self.ids = [
            client.create_session(model, seed=i, render=render)[0] for i, client in enumerate(self.clients)
        ]
        self.next_step = [0] * sessions

    def batch_step(self, actions: np.ndarray) -> None:
        calls = [self.step_call(sid, self.next_step[i], actions[i]) for i, sid in enumerate(self.ids)]
        for result in self.clients[0].batch_step(calls):
            if isinstance(result, Exception):
                raise result
        self.next_step = [n + 1 for n in self.next_step]

    def batch_step_columns(self, actions: np.ndarray) -> None:
        results = self.clients[0].batch_step_columns(self.ids, self.next_step, actions)
        if not results.ok.all():
            raise next(error for error in results.errors if error is not None)
        self.next_step = [n + 1 for n in self.next_step]

    def step_one(self, index: int, action: np.ndarray) -> None:
        self.clients[index].step(self.ids[index], self.next_step[index], action)
        self.next_step[index] += 1

    def close(self) -> None:
        for client, sid in zip(self.clients, self.ids, strict=True):
            client.close_session(sid)
            client.close()


def over_http(
    url: str,
    model: str,
    spec: Any,
    sessions: int,
    steps: int,
    mode: str,
    pool: ThreadPoolExecutor,
    frames: bool = False,
) -> float:
    """Seconds per session-step over HTTP; ``mode`` is ``batch_step``, ``columns``, ``step`` or
    ``step in turn``."""
    rng = np.random.default_rng(0)
    render = {"cameras": [spec.cameras[0]], "height": 64, "width": 64} if frames else None
    rollouts = Rollouts(url, model, sessions, render)
    try:
        plan = [random_actions(spec, sessions, rng) for _ in range(steps + 1)]
        run = {"batch_step": rollouts.batch_step, "columns": rollouts.batch_step_columns}.get(mode)

        def one_session(index: int, start: int) -> None:
            for t in range(start, steps + 1):
                rollouts.step_one(index, plan[t][index])

        if mode == "step in turn":
            for i in range(sessions):  # warm-up step, not timed
                rollouts.step_one(i, plan[0][i])
            started = time.perf_counter()
            for t in range(1, steps + 1):
                for i in range(sessions):
                    rollouts.step_one(i, plan[t][i])
        elif run is not None:
            run(plan[0])  # warm-up step, not timed
            started = time.perf_counter()
            for t in range(1, steps + 1):
                run(plan[t])
        else:
            list(pool.map(lambda i: rollouts.step_one(i, plan[0][i]), range(sessions)))
            started = time.perf_counter()
            list(pool.map(lambda i: one_session(i, 1), range(sessions)))
        return (time.perf_counter() - started) / (steps * sessions)
    finally:
        rollouts.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (about a minute)")
    parser.add_argument("--world", default="learned", help="sim, learned, toy or module.path:factory")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=None, help="environment steps per point")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per point (median reported)")
    parser.add_argument(
        "--frames", choices=["off", "on", "both"], default="off", help="sessions render camera frames"
    )
    args = parser.parse_args(argv)
    steps = args.steps or (20 if args.quick else 50)
    repeats = args.repeats or (3 if args.quick else 5)

    import torch

    from rollserve.models.worlds import load_world

    torch.set_num_threads(1)  # like the server process
    note = ""
    try:
        world = load_world(args.world)
    except FileNotFoundError as exc:
        if args.world != "learned":
            raise
        note = f"learned world checkpoint missing ({exc.filename}); measured the toy world instead"
        print(f"[bench_rollouts] {note}", file=sys.stderr)
        args.world, world = "toy", load_world("toy")
    spec = world.spec
    results: dict[str, Any] = {"world": spec.name, "steps": steps, "repeats": repeats, "points": {}}
    if note:
        results["note"] = note
    rows = []
    frame_modes = {"off": [False], "on": [True], "both": [False, True]}[args.frames]
    if any(frame_modes) and not spec.cameras:
        raise SystemExit(f"world {spec.name!r} does not render camera frames")
    with running(start_rollserve(world=args.world)) as server, ThreadPoolExecutor(max(args.sessions)) as pool:
        url = f"http://127.0.0.1:{server.port}"
        for frames, n in ((f, n) for f in frame_modes for n in args.sessions):
            timings: dict[str, list[float]] = {
                "in-process step_batch": [], "in-process, one step per call": [], "HTTP batch_step": [],
                "HTTP batch_step, columns": [], "HTTP step, one thread per session": [],
                "HTTP step, sessions in turn": [],
            }  # fmt: skip
            for _ in range(repeats):  # interleaved, so background load hits every path alike
                timings["in-process step_batch"].append(
                    in_process(world, n, steps, one_at_a_time=False, frames=frames)
                )
                timings["in-process, one step per call"].append(
                    in_process(world, n, steps, one_at_a_time=True, frames=frames)
                )
                timings["HTTP batch_step"].append(
                    over_http(url, spec.name, spec, n, steps, "batch_step", pool, frames)
                )
                if not frames:  # columns carry no frames (a rendering session steps by items)
                    timings["HTTP batch_step, columns"].append(
                        over_http(url, spec.name, spec, n, steps, "columns", pool, frames)
                    )
                timings["HTTP step, one thread per session"].append(
                    over_http(url, spec.name, spec, n, steps, "step", pool, frames)
                )
                timings["HTTP step, sessions in turn"].append(
                    over_http(url, spec.name, spec, n, steps, "step in turn", pool, frames)
                )
            medians = {path: statistics.median(values) for path, values in timings.items() if values}
            floor = medians["in-process step_batch"]
            point = {}
            for path, seconds in medians.items():
                point[path] = {
                    "steps_per_s": 1.0 / seconds,
                    "us_per_step": seconds * 1e6,
                    "overhead_us_per_step": (seconds - floor) * 1e6,
                    "x_in_process": seconds / floor,
                }
                rows.append(
                    [
                        n,
                        "yes" if frames else "no",
                        path,
                        1.0 / seconds,
                        seconds * 1e6,
                        (seconds - floor) * 1e6,
                        seconds / floor,
                    ]
                )
            key = f"{n} frames" if frames else n
            results["points"][key] = point
            for path in ("HTTP step, one thread per session", "HTTP step, sessions in turn"):
                ratio = medians[path] / medians["HTTP batch_step"]
                results.setdefault("batch_step_speedup", {}).setdefault(path, {})[key] = ratio
                if "HTTP batch_step, columns" in medians:
                    ratio = medians[path] / medians["HTTP batch_step, columns"]
                    results.setdefault("columns_speedup", {}).setdefault(path, {})[key] = ratio
    world.close()
    print_table(
        f"Rollouts on world {spec.name!r}: N sessions x {steps} steps, median of {repeats}"
        + (f" ({note})" if note else ""),
        ["sessions", "frames", "path", "steps/s", "us/step", "overhead us/step", "x in-process batch"],
        rows,
    )
    emit_json("rollouts", results)
    return results


if __name__ == "__main__":
    main()
