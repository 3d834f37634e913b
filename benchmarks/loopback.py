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
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DROID_CAMERAS = ("exterior_image_1_left", "wrist_image_left")
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
) -> ServerProcess:
    """``rollserve serve --port 0`` in a subprocess; returns once it prints its address."""
    command = [*rollserve_command(), "serve", "--port", "0", "--log-level", "warning"]
    if policy:
        command += ["--policy", policy, *_policy_arg_flags(policy_args or {})]
        command += ["--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
    if world:
        command += ["--world", world]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env()
    )
    assert process.stdout is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
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
    import importlib.util

    import httpx

    if importlib.util.find_spec("openpi_server") is None:
        raise RuntimeError('the openpi-server baseline is not installed: pip install -e ".[bench]"')
    port = free_port()
    command = [sys.executable, __file__, "--policy", policy, "--port", str(port)]
    command += _policy_arg_flags(policy_args or {})
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env()
    )
    server = ServerProcess("openpi-server", process, port)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return server
        time.sleep(0.1)
    died = process.poll() is not None
    output = process.stdout.read() if died and process.stdout is not None else ""
    server.stop()
    raise RuntimeError(f"openpi-server did not start on port {port}: {output[-500:]}")


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    try:
        yield server
    finally:
        server.stop()


# -- what a robot sends -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """One robot observation in both wire layouts: rollserve's session protocol and openpi's DROID keys."""

    state: np.ndarray
    images: dict[str, np.ndarray]
    prompt: str

    @property
    def openpi(self) -> dict[str, Any]:
        keyed = {f"observation/{name}": image for name, image in self.images.items()}
        return keyed | {
            "observation/joint_position": self.state[:7],
            "observation/gripper_position": self.state[7:8],
            "prompt": self.prompt,
        }


def make_observation(cameras: int = 2, side: int = 224, seed: int = 0) -> Observation:
    """A DROID-shaped observation: 8-D state (7 joints + gripper) and ``cameras`` uint8 images."""
    rng = np.random.default_rng(seed)
    images = {name: rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for name in DROID_CAMERAS[:cameras]}
    return Observation(rng.uniform(-1, 1, 8).astype(np.float32), images, "pick up the cube")


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


def main(argv: Sequence[str] | None = None) -> None:
    from rollserve.server.launch import parse_policy_args

    parser = argparse.ArgumentParser(description="openpi-server (the peer) serving a rollserve policy")
    parser.add_argument("--policy", required=True)
    parser.add_argument("--policy-arg", action="append", default=[])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        serve_openpi(args.policy, parse_policy_args(args.policy_arg), args.port)


if __name__ == "__main__":
    main()
