"""Servers in their own processes and the robot clients that drive them, for the loopback benchmarks.

Each server runs in a subprocess, so client and server never share a GIL: rollserve through its own
CLI (``rollserve serve --port 0``), the peer through ``openpi_server.WebsocketPolicyServer`` wrapping
the very same policy object with the same openpi key mapping and processors. Both get one BLAS/OpenMP
thread (``OMP_NUM_THREADS=1``), so neither steals the other cores from the clients.

Run as a script, this module is the peer server: ``python benchmarks/loopback.py --policy SPEC
[--policy-arg KEY=VALUE ...] --port PORT``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

DROID_CAMERAS = ("exterior_image_1_left", "wrist_image_left")
LIBERO_CAMERAS = ("image", "wrist_image")
_READY = re.compile(r"rollserve serving on http://([\d.]+):(\d+)")
_START_TIMEOUT_S = 60.0


def server_env() -> dict[str, str]:
    """Environment of every server process: one math thread, unbuffered output."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


@dataclass
class ServerProcess:
    """A server subprocess listening on 127.0.0.1:``port``."""

    name: str
    process: subprocess.Popen[str]
    port: int

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _policy_arg_flags(policy_args: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in policy_args.items():
        flags += ["--policy-arg", f"{key}={json.dumps(value)}"]
    return flags


def rollserve_command() -> list[str]:
    """How to run rollserve's CLI: ``python -m rollserve.cli``, or ``$ROLLSERVE_BENCH_CLI`` (a command
    line, e.g. ``python patched_cli.py``) to A/B a server change without touching the tree."""
    override = os.environ.get("ROLLSERVE_BENCH_CLI")
    if not override:
        return [sys.executable, "-m", "rollserve.cli"]
    command = shlex.split(override)
    return [sys.executable, *command[1:]] if command[0] in ("python", "python3") else command


def start_rollserve(
    policy: str | None = None,
    policy_args: dict[str, Any] | None = None,
    *,
    world: str | None = None,
    max_batch: int = 8,
    max_wait_ms: float = 2.0,
    pythonpath: str | None = None,
    start_timeout_s: float = _START_TIMEOUT_S,
    extra: Sequence[str] = (),
) -> ServerProcess:
    """``rollserve serve --port 0`` in a subprocess; returns once it prints its address.

    ``pythonpath`` (a ``src`` directory) runs another tree's rollserve: an A/B in one run.
    ``extra``: more ``serve`` flags.
    """
    command = [*rollserve_command(), "serve", "--port", "0", "--log-level", "warning"]
    if policy:
        command += ["--policy", policy, *_policy_arg_flags(policy_args or {})]
        command += ["--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
    if world:
        command += ["--world", world]
    command += extra
    env = server_env() | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    deadline = time.monotonic() + start_timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if match := _READY.search(line):
            return ServerProcess("rollserve", process, int(match.group(2)))
    ServerProcess("rollserve", process, 0).stop()
    raise RuntimeError("rollserve serve did not start:\n" + "".join(seen[-20:]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_openpi_server(policy: str, policy_args: dict[str, Any] | None = None) -> ServerProcess:
    """The openpi-server peer in a subprocess; returns once ``/healthz`` answers."""
    return _start_peer("openpi-server", policy, policy_args)


def start_floor_server(policy: str, policy_args: dict[str, Any] | None = None) -> ServerProcess:
    """The floor in a subprocess: a bare ``websockets`` server (the library openpi-server uses) that
    answers every frame with one pre-packed chunk, never decoding the request."""
    return _start_peer("floor", policy, policy_args)


def _start_peer(name: str, policy: str, policy_args: dict[str, Any] | None) -> ServerProcess:
    import importlib.util

    import httpx

    if importlib.util.find_spec("openpi_server") is None:
        raise RuntimeError('the openpi-server baseline is not installed: pip install -e ".[bench]"')
    port = free_port()
    command = [sys.executable, __file__, "--policy", policy, "--port", str(port)]
    command += _policy_arg_flags(policy_args or {}) + (["--floor"] if name == "floor" else [])
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env()
    )
    server = ServerProcess(name, process, port)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return server
        time.sleep(0.1)
    died = process.poll() is not None
    output = process.stdout.read() if died and process.stdout is not None else ""
    server.stop()
    raise RuntimeError(f"{name} did not start on port {port}: {output[-500:]}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the live threads of process ``pid`` have used, in seconds.

    Read from ``/proc/<pid>/task/*/schedstat`` (nanoseconds; ``/proc/<pid>/stat`` counts 10 ms
    ticks, too coarse for one round). Threads that exited are not counted: servers keep theirs.
    """
    total = 0
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), open(f"{task.path}/schedstat") as stat:
                total += int(stat.read().split()[0])
    return total / 1e9


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    try:
        yield server
    finally:
        server.stop()


# -- what a robot sends -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One robot observation in both wire layouts: rollserve's session protocol and openpi's keys
    (DROID's or LIBERO's, by ``layout``)."""

    state: np.ndarray
    images: dict[str, np.ndarray]
    prompt: str
    layout: str = "droid"

    @property
    def openpi(self) -> dict[str, Any]:
        keyed = {f"observation/{name}": image for name, image in self.images.items()}
        if self.layout == "libero":
            return keyed | {"observation/state": self.state, "prompt": self.prompt}
        return keyed | {
            "observation/joint_position": self.state[:7],
            "observation/gripper_position": self.state[7:8],
            "prompt": self.prompt,
        }


CAMERAS = {"droid": DROID_CAMERAS, "libero": LIBERO_CAMERAS}


def make_observation(cameras: int = 2, side: int = 224, seed: int = 0, layout: str = "droid") -> Observation:
    """An 8-D state (DROID: 7 joints + gripper) and ``cameras`` uint8 images, named as in ``layout``."""
    rng = np.random.default_rng(seed)
    names = CAMERAS[layout][:cameras]
    images = {name: rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for name in names}
    return Observation(rng.uniform(-1, 1, 8).astype(np.float32), images, "pick up the cube", layout)


class SessionRobot:
    """A robot on rollserve's session protocol (``PolicyClient`` on ``/v1/policy/ws``)."""

    def __init__(self, port: int, obs: Observation) -> None:
        from rollserve.client import PolicyClient

        self.obs = obs
        self.client = PolicyClient(f"ws://127.0.0.1:{port}/v1/policy/ws").connect()
        self.client.open_session(state_dim=len(obs.state), camera_names=list(obs.images), rtc_enabled=False)

    def infer(self) -> np.ndarray:
        return self.client.predict(self.obs.state, self.obs.images, task=self.obs.prompt).chunk_robot

    def close(self) -> None:
        self.client.close()


class OpenpiRobot:
    """A robot on the openpi protocol (``openpi_client``'s ``WebsocketClientPolicy``), for either server."""

    def __init__(self, port: int, obs: Observation) -> None:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        self.request = obs.openpi
        self.client = WebsocketClientPolicy("127.0.0.1", port)

    def infer(self) -> np.ndarray:
        return self.client.infer(self.request)["actions"]

    def close(self) -> None:
        self.client._ws.close()  # openpi-client 0.1.2 has no close()


ROBOTS = {"session": SessionRobot, "openpi": OpenpiRobot}


# -- robot processes ------------------------------------------------------------------------------------
def _robot_loop(conn: Connection) -> None:
    """One robot process: run each job ``(protocol, port, duration, observation kwargs)`` and send back
    its latencies. After connecting and warming up it reports ready and waits for the common start
    time, so every robot of a point runs through the whole window (a loaded machine may take
    seconds to connect eight robots)."""
    from openpi_client import websocket_client_policy  # noqa: F401  (imported once, not in a window)

    import rollserve.client  # noqa: F401

    while (job := conn.recv()) is not None:
        protocol, port, duration, obs_kwargs = job
        try:
            robot = ROBOTS[protocol](port, make_observation(**obs_kwargs))
            for _ in range(3):
                robot.infer()
            conn.send("ready")
            start = conn.recv()
            latencies = []
            time.sleep(max(0.0, start - time.monotonic()))
            end = start + duration
            while (sent := time.monotonic()) < end:
                robot.infer()
                done = time.monotonic()
                if done <= end:
                    latencies.append(done - sent)
            robot.close()
            conn.send(latencies)
        except Exception:
            conn.send(traceback.format_exc())


class RobotPool:
    """``size`` robot processes, started once (spawned: no inherited threads) and reused for every point."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_robot_loop, args=(child,), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(
        self, robots: int, protocol: str, port: int, duration: float, obs_kwargs: dict[str, Any] | None = None
    ) -> list[float]:
        """All latencies of ``robots`` robots hammering ``port`` together for ``duration`` seconds, each
        sending ``make_observation(**obs_kwargs)`` (no cameras by default)."""
        job_obs = obs_kwargs if obs_kwargs is not None else {"cameras": 0}
        conns = self.conns[:robots]
        for conn in conns:
            conn.send((protocol, port, duration, job_obs))
        for conn in conns:  # every robot connected and warmed up (or failed)
            if (reply := conn.recv()) != "ready":
                raise RuntimeError(f"robot failed:\n{reply}")
        start = time.monotonic() + 0.05
        for conn in conns:
            conn.send(start)
        latencies: list[float] = []
        for conn in conns:
            reply = conn.recv()
            if isinstance(reply, str):
                raise RuntimeError(f"robot failed:\n{reply}")
            latencies += reply
        return latencies

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()


# -- the peer server ------------------------------------------------------------------------------------
class OpenpiPolicyAdapter:
    """A rollserve policy as an openpi ``BasePolicy``: the same key mapping, processors and model call
    that rollserve's openpi endpoint runs, minus the transport."""

    def __init__(self, policy: Any) -> None:
        from rollserve.models.policy import make_processors

        self.policy = policy
        self.processors = make_processors(policy)

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        from rollserve.server.policy.openpi_layouts import to_observation

        observation, _ = to_observation(obs, camera_names=self.policy.metadata.camera_names)
        chunk = self.policy.predict_action_chunk(self.processors.pre(observation))
        return {"actions": np.asarray(self.processors.post(np.asarray(chunk, dtype=np.float32)))}

    def reset(self) -> None:
        pass


def serve_openpi(policy_spec: str, policy_args: dict[str, Any], port: int) -> None:
    from openpi_server import WebsocketPolicyServer

    from rollserve.models.loading import load_policy

    policy = load_policy(policy_spec, **policy_args)
    metadata = policy.metadata.to_dict()
    WebsocketPolicyServer(
        OpenpiPolicyAdapter(policy), host="127.0.0.1", port=port, metadata=metadata
    ).serve_forever()


def serve_floor(policy_spec: str, policy_args: dict[str, Any], port: int) -> None:
    """The floor: what any websocket policy server costs before it does any work of its own."""
    import asyncio
    import http

    import websockets.asyncio.server as ws_server
    from openpi_client import msgpack_numpy

    from rollserve.models.loading import load_policy

    meta = load_policy(policy_spec, **policy_args).metadata
    metadata = msgpack_numpy.packb(meta.to_dict())
    chunk = np.zeros((meta.chunk_size, meta.action_dim), np.float32)
    reply = msgpack_numpy.packb({"actions": chunk, "server_timing": {"infer_ms": 0.0, "prev_total_ms": 0.0}})

    async def handler(websocket: ws_server.ServerConnection) -> None:
        await websocket.send(metadata)
        async for _ in websocket:  # every frame is read whole, then never looked at
            await websocket.send(reply)

    def health(connection: ws_server.ServerConnection, request: ws_server.Request) -> Any:
        return connection.respond(http.HTTPStatus.OK, "OK\n") if request.path == "/healthz" else None

    async def run() -> None:
        async with ws_server.serve(
            handler, "127.0.0.1", port, compression=None, max_size=None, process_request=health
        ) as server:
            await server.serve_forever()

    asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> None:
    from rollserve.server.launch import parse_policy_args

    parser = argparse.ArgumentParser(
        description="openpi-server (the peer) or the floor, serving a rollserve policy"
    )
    parser.add_argument("--policy", required=True)
    parser.add_argument("--policy-arg", action="append", default=[])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--floor", action="store_true", help="reply a pre-packed chunk without decoding")
    args = parser.parse_args(argv)
    serve = serve_floor if args.floor else serve_openpi
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.policy, parse_policy_args(args.policy_arg), args.port)


if __name__ == "__main__":
    main()
