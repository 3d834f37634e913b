"""LeRobot checkpoints served end to end, and golden parity with LeRobot's own local path.

The checkpoints are tiny random-init ACT, Diffusion and SmolVLA policies saved by LeRobot
(``rollserve.adapters.lerobot.tiny``). The local path is LeRobot's own: its policy class loaded
from the directory, its processors (``make_pre_post_processors``), ``prepare_observation_for_inference``
and its ``ActionQueue`` with its RTC. The remote path is a real server over a real websocket.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lerobot")

import httpx
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.factory import get_policy_class, make_pre_post_processors
from lerobot.policies.rtc.action_queue import ActionQueue as LeRobotActionQueue
from lerobot.policies.rtc.configuration_rtc import RTCConfig as LeRobotRTCConfig
from lerobot.policies.utils import populate_queues, prepare_observation_for_inference

from rollserve.client import EngineConfig, PolicyClient, RemoteInferenceEngine
from rollserve.models.loading import load_policy
from rollserve.models.policy import PolicyRequest
from rollserve.rtc import RTCConfig
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

STATE_DIM = 6
CAMERAS = ("top", "wrist")
TASK = "put the cube in the bowl"
SEED = 7
HORIZON = 8  # RTC execution horizon for SmolVLA (its chunk is 10)
DELAYS = [0, 2, 1, 3]
CONSUME_K = 4  # leaves prefixes shorter than the horizon too: the padding must be cut
CHUNK = {"act": 10, "diffusion": 8, "smolvla": 10}
READY = re.compile(r"rollserve serving on http://127\.0\.0\.1:(\d+)")


def _obs(cycle: int) -> dict[str, Any]:
    rng = np.random.default_rng(100 + cycle)
    return {
        "state": (rng.standard_normal(STATE_DIM) * 0.5).astype(np.float32),
        "images": {cam: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for cam in CAMERAS},
        "task": TASK,
    }


def _same_bytes(a: Any, b: Any) -> bool:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class LeRobotLocal:
    """LeRobot's own local inference path for one robot (what its RTC examples run in-process)."""

    def __init__(self, checkpoint: Path, *, rtc: bool) -> None:
        config = PreTrainedConfig.from_pretrained(str(checkpoint))
        if rtc:
            config.rtc_config = LeRobotRTCConfig(enabled=True, execution_horizon=HORIZON)
        self.type = config.type
        self.policy = get_policy_class(config.type).from_pretrained(str(checkpoint), config=config).eval()
        self.pre, self.post = make_pre_post_processors(config, pretrained_path=str(checkpoint))
        self.image_keys = list(config.image_features)
        self.queue = LeRobotActionQueue(LeRobotRTCConfig(enabled=rtc, execution_horizon=HORIZON))
        self.rtc = rtc

    def batch(self, obs: dict[str, Any]) -> dict[str, Any]:
        frame = {"observation.state": obs["state"].copy()}
        frame.update({f"observation.images.{cam}": image.copy() for cam, image in obs["images"].items()})
        batch = self.pre(prepare_observation_for_inference(frame, torch.device("cpu"), TASK, None))
        if self.type == "diffusion":  # what DiffusionPolicy.select_action does before predicting
            batch.pop("action", None)
            batch["observation.images"] = torch.stack([batch[k] for k in self.image_keys], dim=-4)
            populate_queues(self.policy._queues, batch)
        return batch

    def chunk(self, obs: dict[str, Any], **rtc: Any) -> torch.Tensor:
        return self.policy.predict_action_chunk(self.batch(obs), **rtc)

    def cycle(self, obs: dict[str, Any], delay: int) -> None:
        index_before = self.queue.get_action_index()
        left_over = self.queue.get_left_over() if self.rtc else None
        rtc = {"inference_delay": delay, "prev_chunk_left_over": left_over} if self.rtc else {}
        actions = self.chunk(obs, **rtc)
        self.queue.merge(actions.squeeze(0).clone(), self.post(actions).squeeze(0), delay, index_before)


@contextmanager
def _served(checkpoint: Path, **kwargs: Any) -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=kwargs.pop("max_batch_wait_ms", 0.0))
    service = PolicyService.from_spec(f"lerobot:{checkpoint}", settings, policy_kwargs=kwargs)
    try:
        with serving(create_app(settings, policy=service)) as running:
            yield running
    finally:
        service.close()


@contextmanager
def _rollserve_serve(tmp_path: Path, *args: str) -> Iterator[int]:
    """`rollserve serve` as a real subprocess on a free port (this interpreter, so this venv)."""
    command = [sys.executable, "-m", "rollserve.cli", "serve", "--port", "0", *args]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        try:
            match = None
            while match is None:  # LeRobot prints lines of its own before the server's
                try:
                    match = READY.search(lines.get(timeout=180))
                except queue.Empty:
                    pytest.fail(f"server did not start:\n{log_path.read_text()}")
            yield int(match.group(1))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


# -- end to end: `rollserve serve --policy lerobot:DIR`, our engine and an unchanged openpi client ---
@pytest.mark.parametrize("policy_type", ["act", "diffusion", "smolvla"])
def test_rollserve_serve_drives_engine_and_openpi_client(
    lerobot_checkpoints: dict[str, Path], tmp_path: Path, policy_type: str
) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    checkpoint = lerobot_checkpoints[policy_type]
    names = [f"joint_{i}" for i in range(6)]
    rtc = policy_type == "smolvla"
    args = ["--policy", f"lerobot:{checkpoint}", "--action-names", ",".join(names)]
    with _rollserve_serve(tmp_path, *args, "--policy-arg", f"seed={SEED}") as port:
        meta = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["metadata"]
        assert meta["chunk_size"] == CHUNK[policy_type] and meta["state_dim"] == STATE_DIM
        assert meta["camera_names"] == list(CAMERAS) and meta["image_shape"] == [32, 32, 3]
        assert meta["action_names"] == names and meta["supports_rtc"] is rtc

        config = EngineConfig(fps=30.0, rtc=RTCConfig(enabled=rtc, execution_horizon=HORIZON), task=TASK)
        url = f"ws://127.0.0.1:{port}/v1/policy/ws"
        with RemoteInferenceEngine(url, config, state_dim=STATE_DIM, camera_names=CAMERAS) as engine:
            assert engine.run_cycle(_obs(0), delay=0)
            for _ in range(3):
                assert engine.get_action() is not None
            assert engine.run_cycle(_obs(1), delay=1 if rtc else 0)
            action = engine.get_action()
            assert action is not None and action.shape == (6,) and np.isfinite(action).all()

        # An unchanged openpi client on `/` (ALOHA-style keys): a fresh session, so the first chunk
        # is what LeRobot's own local path gives for the same seed, in robot units, byte for byte.
        openpi = WebsocketClientPolicy("127.0.0.1", port)
        assert openpi.get_server_metadata()["chunk_size"] == CHUNK[policy_type]
        obs = _obs(5)
        result = openpi.infer({"state": obs["state"], "images": obs["images"], "prompt": TASK})
        local = LeRobotLocal(checkpoint, rtc=rtc)
        torch.manual_seed(SEED)
        expected = local.post(local.chunk(obs))[0].numpy()
        assert result["actions"].shape == (CHUNK[policy_type], 6)
        assert _same_bytes(np.asarray(result["actions"], np.float32), expected)


# -- golden parity: seed 004's contract with real LeRobot policies ---------------------------------
@pytest.mark.parametrize("policy_type", ["act", "smolvla"])
def test_golden_parity_with_lerobot_local_path(
    lerobot_checkpoints: dict[str, Path], policy_type: str
) -> None:
    """Same observations and seed: byte-identical queues (robot and model space) and actions."""
    checkpoint = lerobot_checkpoints[policy_type]
    rtc = policy_type == "smolvla"
    local = LeRobotLocal(checkpoint, rtc=rtc)
    config = EngineConfig(rtc=RTCConfig(enabled=rtc, execution_horizon=HORIZON), task=TASK)
    with (
        _served(checkpoint, seed=SEED, execution_horizon=HORIZON) as running,
        RemoteInferenceEngine(
            running.ws_url + "/v1/policy/ws", config, state_dim=STATE_DIM, camera_names=CAMERAS
        ) as remote,
    ):
        torch.manual_seed(SEED)  # the local path's noise; the server seeds each session's generator alike
        for cycle, delay in enumerate(DELAYS if rtc else [0] * len(DELAYS)):
            obs = _obs(cycle)
            local.cycle(obs, delay)
            assert remote.run_cycle(obs, delay=delay)
            assert _same_bytes(local.queue.queue, remote.queue.queue), f"robot queues differ ({cycle})"
            assert _same_bytes(local.queue.original_queue, remote.queue.original_queue), f"model ({cycle})"
            for _ in range(CONSUME_K):
                assert _same_bytes(local.queue.get(), remote.get_action())


# -- SmolVLA: LeRobot's RTC over the network -------------------------------------------------------
def _frozen_prefix_error(checkpoint: Path, delay: int) -> tuple[float, float]:
    """Mean |new - prefix| over the ``delay`` frozen actions, with and without the prefix sent."""
    obs = _obs(0)
    with (
        _served(checkpoint, seed=SEED, execution_horizon=HORIZON) as running,
        PolicyClient(running.ws_url + "/v1/policy/ws") as client,
    ):
        client.open_session(state_dim=STATE_DIM, camera_names=CAMERAS, task=TASK)
        first = client.predict(obs["state"], obs["images"], task=TASK).chunk_model
        prefix = np.ascontiguousarray(first[delay : delay + HORIZON])
        guided = client.predict(
            obs["state"], obs["images"], task=TASK, inference_delay_steps=delay, prefix_model=prefix
        ).chunk_model
        plain = client.predict(obs["state"], obs["images"], task=TASK).chunk_model
    frozen = prefix[:delay]
    return float(np.abs(guided[:delay] - frozen).mean()), float(np.abs(plain[:delay] - frozen).mean())


def test_smolvla_rtc_guidance_freezes_the_prefix_over_the_network(
    lerobot_checkpoints: dict[str, Path],
) -> None:
    guided, plain = _frozen_prefix_error(lerobot_checkpoints["smolvla"], delay=3)
    assert plain > 0.3  # a fresh sample lands far from the old chunk ...
    assert guided < 0.1 * plain  # ... LeRobot's guidance pulls the frozen actions onto it


def test_short_prefix_padding_is_cut_not_used_as_targets(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_policy(f"lerobot:{lerobot_checkpoints['smolvla']}", seed=SEED, execution_horizon=HORIZON)
    obs = _obs(2)
    real = (np.random.default_rng(0).standard_normal((3, 6)) * 0.5).astype(np.float32)
    padded = np.concatenate([real, np.zeros((HORIZON - 3, 6), np.float32)])

    def chunk(prefix: np.ndarray, steps: int | None) -> np.ndarray:
        batch = policy.make_processors().pre(obs)  # a fresh session: the same noise every time
        return policy.predict_action_chunks([PolicyRequest(batch, 1, prefix, prefix_steps=steps)])[0]

    cut = chunk(real, None)
    assert _same_bytes(chunk(padded, 3), cut)  # padding with prefix_steps == the real rows alone
    assert not np.allclose(chunk(padded, None), cut, atol=1e-3)  # zeros as targets would change it


def test_batching_groups_robots_by_delay_and_matches_one_by_one(
    lerobot_checkpoints: dict[str, Path],
) -> None:
    policy = load_policy(f"lerobot:{lerobot_checkpoints['smolvla']}", seed=SEED, execution_horizon=HORIZON)
    prefix = (np.random.default_rng(1).standard_normal((HORIZON, 6)) * 0.5).astype(np.float32)
    specs = [(0, None), (2, prefix), (2, prefix[::-1].copy()), (3, prefix)]  # delay 2 shares a call

    def requests() -> list[PolicyRequest]:
        return [
            PolicyRequest(policy.make_processors().pre(_obs(i)), d, p, prefix_steps=None if p is None else 8)
            for i, (d, p) in enumerate(specs)
        ]

    calls: list[int] = []
    original = policy.lerobot_policy.predict_action_chunk

    def counting(batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
        calls.append(int(batch["observation.state"].shape[0]))
        return original(batch, **kwargs)

    policy.lerobot_policy.predict_action_chunk = counting
    batched = policy.predict_action_chunks(requests())
    assert sorted(calls) == [1, 1, 2]  # no prefix | delay 2 (two robots) | delay 3
    one_by_one = [policy.predict_action_chunks([r])[0] for r in requests()]
    for a, b in zip(batched, one_by_one, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)


# -- Diffusion: observation history per session, reset with the session ----------------------------
def test_diffusion_history_is_per_session_and_reset_with_it(lerobot_checkpoints: dict[str, Path]) -> None:
    checkpoint = lerobot_checkpoints["diffusion"]
    with _served(checkpoint, seed=SEED) as running:
        url = running.ws_url + "/v1/policy/ws"
        with PolicyClient(url) as a, PolicyClient(url) as b:
            for client in (a, b):
                client.open_session(state_dim=STATE_DIM, camera_names=CAMERAS, task=TASK)
            o1, o2 = _obs(1), _obs(2)
            a1 = a.predict(o1["state"], o1["images"], task=TASK).chunk_robot
            a2 = a.predict(o2["state"], o2["images"], task=TASK).chunk_robot
            b1 = b.predict(o1["state"], o1["images"], task=TASK).chunk_robot  # B never saw A's o2
            assert _same_bytes(a1, b1)
            a.reset()
            again = a.predict(o1["state"], o1["images"], task=TASK).chunk_robot
            assert _same_bytes(again, a1)

    # What LeRobot itself gives: its select_action history (o1 twice, then o1 + o2), same noise.
    local = LeRobotLocal(checkpoint, rtc=False)
    torch.manual_seed(SEED)
    assert _same_bytes(local.post(local.chunk(o1))[0], a1)
    assert _same_bytes(local.post(local.chunk(o2))[0], a2)
