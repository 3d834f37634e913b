"""`rollserve serve --ray` without `--ray-address` starts its own local Ray, serves, and on Ctrl-C
takes everything down again; Serve's proxy closes idle keep-alive connections after `--keep-alive-s`
(Ray's own default is 90 s). Skipped where Ray is not installed."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve")

from rollserve.client.rollout_client import RolloutClient
from rollserve.scale.launch import free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from test_serve_trained_world import MARK, _retrained  # a marked copy of the shipped checkpoint

pytestmark = pytest.mark.slow


def test_serve_ray_starts_a_local_cluster_and_stops_cleanly(tmp_path: Path) -> None:
    """Also: the replicas build the world with its ``--world-arg`` (a retrained folder, given by a
    path relative to where the command runs)."""
    _retrained("learned", tmp_path)
    port = free_port("127.0.0.1")
    command = [
        sys.executable, "-c", "import sys; from rollserve.cli import main; sys.exit(main())",
        "serve", "--ray", "--replicas", "1", "--world", "learned", "--world-arg", "path=learned_retrained",
        "--port", str(port), "--log-level", "warning", "--keep-alive-s", "1",
    ]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("rollserve serving on" in line for line in lines):
            assert server.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.5)
        line = next(line for line in lines if "rollserve serving on" in line)
        assert f"http://127.0.0.1:{port}" in line and "1 replica(s) on Ray Serve (a local Ray)" in line
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"]
        (learned,) = [m for m in models if m["id"] == "learned"]
        assert learned["action"]["high"][0] == MARK  # the retrained folder, not the shipped checkpoint
        with RolloutClient(f"http://127.0.0.1:{port}") as client:
            sid, _ = client.create_session("learned", seed=0)
            client.step(sid, 0, np.zeros(8, np.float32))
            assert client.status(sid)["committed_step_id"] == 0
        assert _closed_after_idle(port, seconds=4.0), "the proxy kept an idle keep-alive connection open"
        server.send_signal(signal.SIGINT)
        assert server.wait(120) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    with pytest.raises(httpx.TransportError):  # the port is free again: Serve's proxy is gone
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def _closed_after_idle(port: int, seconds: float) -> bool:
    """Whether the server closes a keep-alive connection that stays idle after one answered request."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        sock.settimeout(seconds)
        try:
            while sock.recv(4096):  # the rest of the body, then the close (b"")
                pass
        except TimeoutError:
            return False
        return True
