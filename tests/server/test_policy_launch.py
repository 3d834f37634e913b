"""`rollserve serve` as a real subprocess, driven by rollserve's client and by the real openpi client."""

from __future__ import annotations

import importlib.util
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets.exceptions
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from rollserve.cli import main as cli_main
from rollserve.client import EngineConfig, PolicyClient, PolicyConnectionError, RemoteInferenceEngine
from rollserve.server.launch import parse_policy_args

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")

SPEC = "rollserve.models.simple_policies:droid_policy"
READY = re.compile(r"rollserve serving on http://127\.0\.0\.1:(\d+)")
CAMERAS = ("exterior_image_1_left", "wrist_image_left")
HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


@contextmanager
def rollserve_serve(tmp_path: Path, *args: str, policy: str | None = SPEC) -> Iterator[tuple[int, str]]:
    """Start `rollserve serve` on a free port; yields (port, startup line); stops it afterwards."""
    chosen = ["--policy", policy] if policy else []
    command = [sys.executable, "-m", "rollserve.cli", "serve", *chosen, "--port", "0", *args]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        try:
            line = lines.get(timeout=90)
        except queue.Empty:
            pytest.fail(f"server did not start:\n{(tmp_path / 'serve.log').read_text()}")
        match = READY.search(line)
        assert match, line
        yield int(match.group(1)), line
    finally:
        proc.terminate()
        try:
            # uvicorn shuts down gracefully, then re-raises SIGTERM (exit status -15).
            assert proc.wait(20) in (0, -15)
            assert "Application shutdown complete" in (tmp_path / "serve.log").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


def _droid_openpi_obs() -> dict[str, object]:
    rng = np.random.default_rng(3)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.random(7),
        "observation/gripper_position": rng.random(1),
        "prompt": "pick up the marker",
    }


def _images() -> dict[str, np.ndarray]:
    return {cam: np.zeros((32, 32, 3), np.uint8) for cam in CAMERAS}


def test_serve_drives_our_client_and_openpi_client(tmp_path: Path) -> None:
    with rollserve_serve(tmp_path, "--max-batch", "4", "--rtc-horizon", "6") as (port, line):
        assert "droid-chunk-policy" in line and "rtc horizon 6" in line and "no api key" in line
        base = f"127.0.0.1:{port}"
        assert httpx.get(f"http://{base}/healthz").status_code == 200
        models = httpx.get(f"http://{base}/v1/models").json()["data"]
        assert models[0]["id"] == "droid-chunk-policy" and models[0]["execution_horizon"] == 6

        with PolicyClient(f"ws://{base}/v1/policy/ws") as client:
            ack = client.open_session(state_dim=8, camera_names=CAMERAS)
            assert ack.execution_horizon == 6 and ack.chunk_size == 10
            chunk = client.predict(np.zeros(8, np.float32), _images(), task="pick")
            assert chunk.chunk_robot.shape == (10, 8)

        config = EngineConfig(fps=30.0)
        with RemoteInferenceEngine(f"ws://{base}/v1/policy/ws", config, camera_names=CAMERAS) as engine:
            observation = {"state": np.ones(8, np.float32), "images": _images()}
            assert engine.run_cycle(observation, delay=0)
            engine.get_action()
            assert engine.run_cycle(observation, delay=1) and engine.queue.qsize() == 9

        openpi = WebsocketClientPolicy("127.0.0.1", port)
        assert openpi.get_server_metadata()["state_dim"] == 8
        result = openpi.infer(_droid_openpi_obs())
        assert result["actions"].shape == (10, 8) and "infer_ms" in result["server_timing"]


def test_serve_with_api_key(tmp_path: Path) -> None:
    with rollserve_serve(tmp_path, "--api-key", "k3y", "--openpi-layout", "droid") as (port, line):
        assert "api key required" in line
        base = f"127.0.0.1:{port}"
        assert httpx.get(f"http://{base}/healthz").status_code == 200
        assert httpx.get(f"http://{base}/v1/models").status_code == 401
        assert (
            httpx.get(f"http://{base}/v1/models", headers={"Authorization": "Api-Key k3y"}).status_code == 200
        )

        with pytest.raises(PolicyConnectionError, match="API key"):
            PolicyClient(f"ws://{base}/v1/policy/ws").connect()
        with PolicyClient(f"ws://{base}/v1/policy/ws", api_key="k3y") as client:
            client.open_session()
            assert client.predict(np.zeros(8, np.float32), _images()).chunk_model.shape == (10, 8)

        with pytest.raises(websockets.exceptions.InvalidStatus):
            WebsocketClientPolicy("127.0.0.1", port, api_key="wrong")
        openpi = WebsocketClientPolicy("127.0.0.1", port, api_key="k3y")
        assert openpi.infer(_droid_openpi_obs())["actions"].shape == (10, 8)


def test_serve_policy_and_world_together(tmp_path: Path) -> None:
    with rollserve_serve(tmp_path, "--world", "toy") as (port, line):
        assert "rollouts at /v1/realtime/sessions" in line
        kinds = [m["kind"] for m in httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]]
        assert kinds[0] == "policy" and "world" in kinds


def test_bad_policy_spec_fails_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["serve", "--policy", "no_such_module_xyz:make", "--port", "0"]) == 2
    assert "no module named 'no_such_module_xyz'" in capsys.readouterr().err


def test_policy_args_parse_json_or_text() -> None:
    assert parse_policy_args(["latency_s=0.05", "name=x", 'camera_names=["a"]']) == {
        "latency_s": 0.05,
        "name": "x",
        "camera_names": ["a"],
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_policy_args(["oops"])


def test_rollserve_serve_takes_the_key_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "env-Key-7"
    monkeypatch.setenv("ROLLSERVE_API_KEY", key)
    with rollserve_serve(tmp_path) as (port, line):
        assert "api key required" in line
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        for presented, status in ((key[:-1], 401), (key.upper(), 401), (key, 200)):
            headers = {"Authorization": f"Api-Key {presented}"}
            assert httpx.get(f"{base}/v1/models", headers=headers, timeout=10).status_code == status


def test_serve_without_flags_serves_the_built_in_policy_and_the_sim_world(tmp_path: Path) -> None:
    flags = ("--max-rollout-sessions", "1", "--rollout-ttl-s", "300")  # the rollout limits are flags too
    with rollserve_serve(tmp_path, *flags, policy=None) as (port, line):
        assert "rollouts at" in line and "policy" in line
        assert line.rstrip().endswith("uvloop event loop" if HAS_UVLOOP else "asyncio event loop")
        base = f"http://127.0.0.1:{port}"
        kinds = {model["kind"] for model in httpx.get(f"{base}/v1/models").json()["data"]}
        assert "policy" in kinds and len(kinds) == 2
        first = httpx.post(f"{base}/v1/realtime/sessions", json={"model": "sim", "seed": 0}, timeout=60)
        assert first.status_code == 200, first.text
        second = httpx.post(f"{base}/v1/realtime/sessions", json={"model": "sim", "seed": 1}, timeout=60)
        assert second.status_code == 503 and "1 rollout sessions" in second.text
        with PolicyClient(f"ws://127.0.0.1:{port}/v1/policy/ws") as client:
            ack = client.open_session(state_dim=13, task="put the cube on the target")
            assert client.predict(np.zeros(13, np.float32)).chunk_robot.shape == (ack.chunk_size, 8)


def test_serve_on_asyncios_own_loop(tmp_path: Path) -> None:
    with rollserve_serve(tmp_path, "--loop", "asyncio") as (port, line):
        assert line.rstrip().endswith("| asyncio event loop")
        with PolicyClient(f"ws://127.0.0.1:{port}/v1/policy/ws") as client:
            client.open_session(state_dim=8, camera_names=CAMERAS)
            chunk = client.predict(np.zeros(8, np.float32), _images(), task="pick")
            assert chunk.chunk_robot.shape == (10, 8)


def test_ctrl_c_shuts_down_cleanly_with_exit_0(tmp_path: Path) -> None:
    """Ctrl-C: a graceful shutdown, exit status 0 and no traceback (uvicorn raises the interrupt
    again after shutting down; ``rollserve serve`` treats a finished shutdown as success)."""
    command = [sys.executable, "-m", "rollserve.cli", "serve", "--world", "toy", "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert READY.search(proc.stdout.readline() if proc.stdout else "")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Application shutdown complete" in err and "Traceback" not in err
