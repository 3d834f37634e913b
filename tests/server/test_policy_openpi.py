"""The openpi-compatible websocket at ``/``, driven by the real ``openpi_client`` package."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import websockets.exceptions
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.sync.client import connect

from rollserve.models.simple_policies import ChunkPolicy, droid_policy
from rollserve.server.app import create_app
from rollserve.server.metrics import METRICS
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

# openpi-client 0.1.2 itself calls websockets' connect() the pre-17 way.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")


def _droid_obs(seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.random(7),  # float64, as DROID robots send it
        "observation/gripper_position": rng.random(1),
        "prompt": "do something",
    }


@pytest.fixture
def droid_server() -> Iterator[tuple[ChunkPolicy, RunningServer]]:
    policy = droid_policy(record_calls=True)
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(policy, settings))) as running:
        yield policy, running


def test_unchanged_openpi_client_gets_metadata_and_actions(
    droid_server: tuple[ChunkPolicy, RunningServer],
) -> None:
    policy, running = droid_server
    client = WebsocketClientPolicy(running.host, running.port)
    meta = client.get_server_metadata()
    assert meta["name"] == "droid-chunk-policy" and meta["state_dim"] == 8 and meta["chunk_size"] == 10
    assert meta["camera_names"] == ["exterior_image_1_left", "wrist_image_left"]
    assert meta["openpi_input"]["layout"] == "auto"
    obs = _droid_obs()
    for _ in range(2):
        result = client.infer(obs)
        assert result["actions"].shape == (10, 8) and result["actions"].dtype == np.float32
        assert result["server_timing"]["infer_ms"] >= 0
    expected_state = np.concatenate([obs["observation/joint_position"], obs["observation/gripper_position"]])
    call = policy.calls[-1]
    np.testing.assert_array_equal(
        call["state"], policy.preprocess({"state": expected_state.astype(np.float32)})["state"]
    )
    assert (
        set(call["images"]) == {"exterior_image_1_left", "wrist_image_left"}
        and call["task"] == "do something"
    )
    assert call["prev_chunk_left_over"] is None  # openpi has no RTC prefix


@pytest.mark.parametrize("layout", ["aloha", "libero"])
def test_other_openpi_layouts_are_detected(layout: str) -> None:
    rng = np.random.default_rng(1)
    if layout == "aloha":
        policy = ChunkPolicy(state_dim=14, action_dim=14, camera_names=("cam_high", "cam_left_wrist"))
        obs = {
            "state": rng.random(14),
            "images": {
                cam: rng.integers(0, 256, (3, 48, 64), dtype=np.uint8)
                for cam in ("cam_high", "cam_left_wrist")
            },
            "prompt": "fold",
        }
    else:
        policy = ChunkPolicy(state_dim=8, action_dim=7, camera_names=("agentview", "wrist"))
        obs = {
            "observation/image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "observation/state": rng.random(8).astype(np.float32),
            "prompt": "open the drawer",
        }
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(policy, settings))) as running:
        result = WebsocketClientPolicy(running.host, running.port).infer(obs)
    assert result["actions"].shape == (20, policy.metadata.action_dim)


def test_errors_are_text_frames_without_traceback_and_the_connection_survives(
    droid_server: tuple[ChunkPolicy, RunningServer],
) -> None:
    _, running = droid_server
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        bad = _droid_obs()
        bad["observation/joint_position"] = np.zeros(3)
        frames = [b"\xc1 garbage", "text", msgpack_numpy.packb({"nothing": 1}), msgpack_numpy.packb(bad)]
        for frame in frames:
            ws.send(frame)
            reply = ws.recv(timeout=10)
            assert isinstance(reply, str) and "Traceback" not in reply and 'File "' not in reply
        assert reply.startswith("bad_shape")
        ws.send(msgpack_numpy.packb(_droid_obs()))
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (10, 8)
    client = WebsocketClientPolicy(running.host, running.port)
    with pytest.raises(RuntimeError, match="Error in inference server"):
        client.infer({"prompt": "no state"})
    assert client.infer(_droid_obs())["actions"].shape == (10, 8)


def test_forced_layout_and_api_key() -> None:
    settings = ServerSettings(api_key="s3cret", max_batch_wait_ms=0.0)
    service = PolicyService(droid_policy(), settings, openpi_layout="droid")
    with serving(create_app(settings, policy=service)) as running:
        with pytest.raises(websockets.exceptions.InvalidStatus):
            WebsocketClientPolicy(running.host, running.port)
        client = WebsocketClientPolicy(running.host, running.port, api_key="s3cret")
        assert client.get_server_metadata()["openpi_input"]["state_keys"] == [
            "observation/joint_position",
            "observation/gripper_position",
        ]
        assert client.infer(_droid_obs())["actions"].shape == (10, 8)
        with pytest.raises(RuntimeError, match="missing state key"):
            client.infer({"state": np.zeros(8), "prompt": "aloha keys on a droid server"})


def test_array_shaped_but_malformed_input_is_a_bad_observation_without_a_traceback(
    droid_server: tuple[ChunkPolicy, RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A ragged list or an array where a map belongs is the client's fault: ``bad_observation``
    (counted as a refusal, so the refusal delay applies), never an ``inference_error`` with a
    traceback in the server's log."""
    _, running = droid_server
    ragged_state = _droid_obs()
    ragged_state["observation/joint_position"] = [[1.0, 2.0, 3.0], [4.0, 5.0]]
    ragged_image = _droid_obs()
    ragged_image["observation/wrist_image_left"] = [[[1, 2, 3]], [[1, 2]]]
    array_images = {"state": np.zeros(8), "images": np.zeros((2, 3, 3), np.uint8)}
    ragged = "is not a rectangular array (rows of different lengths?)"
    expected = [
        f"bad_observation: 'observation/joint_position' {ragged}",
        f"bad_observation: 'observation/wrist_image_left' {ragged}",
        "bad_observation: 'images' must be a map of camera name to image",
    ]
    labels = {"route": "openpi", "code": "bad_observation"}
    before = METRICS.registry.get_sample_value("rollserve_errors_total", labels) or 0.0
    with caplog.at_level(logging.WARNING), connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        replies = []
        for obs in (ragged_state, ragged_image, array_images):
            ws.send(msgpack_numpy.packb(obs))
            replies.append(ws.recv(timeout=10))
        ws.send(msgpack_numpy.packb(_droid_obs()))  # and the connection still serves
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (10, 8)
    assert replies == expected
    assert METRICS.registry.get_sample_value("rollserve_errors_total", labels) == before + 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
