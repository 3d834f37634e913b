"""Golden parity: the remote request path keeps exactly the queues the local RTC path keeps.

Local side: the loop body a robot runs with the policy in-process (pre-process, prefix normalised
to the execution horizon, policy, post-process, merge), written out here on its own. Remote side:
the same observation through the wire codec both ways and ``PolicyRequestPath.run_inference_request``.
With a deterministic policy both ``ActionQueue``s must stay byte-identical, and both policies
must see byte-identical inputs. The last tests repeat the property over a real websocket with
``RemoteInferenceEngine`` against ``LocalInferenceEngine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollserve.client import EngineConfig, LocalInferenceEngine, RemoteInferenceEngine
from rollserve.engine.request_path import PolicyRequestPath
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.rtc import ActionQueue, RTCConfig, normalize_prefix_length
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.policy.sessions import PolicySession
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    MsgHeader,
    ObservationMsg,
    decode_action_chunk,
    decode_observation,
    decode_tensor,
    encode_action_chunk,
    encode_observation,
    encode_tensor,
)

STATE_DIM = 6
ACTION_DIM = 6
CHUNK_SIZE = 20
EXECUTION_HORIZON = 10
TASK = "put the cube in the bowl"
DELAYS = [0, 2, 1]  # per-cycle delay hints; the second cycle has a real delay
CONSUME_K = 4  # actions executed between cycles, so later prefixes are non-trivial
CAMERAS = ("top", "wrist")


def _policy() -> ChunkPolicy:
    return ChunkPolicy(
        state_dim=STATE_DIM, action_dim=ACTION_DIM, chunk_size=CHUNK_SIZE,
        execution_horizon=EXECUTION_HORIZON, record_calls=True,
    )  # fmt: skip


def _robot_obs(cycle: int, with_images: bool) -> dict[str, Any]:
    rng = np.random.default_rng(100 + cycle)
    obs: dict[str, Any] = {
        "state": (rng.standard_normal(STATE_DIM) * 0.3).astype(np.float32),  # non-dyadic float32 values
        "images": {},
        "task": TASK,
    }
    if with_images:
        obs["images"] = {cam: rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for cam in CAMERAS}
    return obs


def _queue() -> ActionQueue:
    return ActionQueue(RTCConfig(enabled=True, execution_horizon=EXECUTION_HORIZON))


def _local_cycle(
    policy: ChunkPolicy, processors: Any, queue: ActionQueue, obs: dict[str, Any], delay: int
) -> None:
    index_before = queue.get_action_index()
    left_over = queue.get_left_over()
    batch = processors.pre({"state": obs["state"], "images": obs["images"], "task": TASK})
    prefix = None if left_over is None else normalize_prefix_length(left_over, EXECUTION_HORIZON)
    chunk = policy.predict_action_chunk(batch, inference_delay=delay, prev_chunk_left_over=prefix)
    queue.merge(chunk, processors.post(chunk), delay, index_before)


def _assert_same_bytes(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _remote_cycle(
    server: PolicyRequestPath,
    session: PolicySession,
    queue: ActionQueue,
    obs: dict[str, Any],
    delay: int,
    seq_id: int,
) -> None:
    index_before = queue.get_action_index()
    left_model, left_robot = queue.get_left_over(), queue.get_processed_left_over()
    prefix_model = None if left_model is None or not len(left_model) else left_model[:EXECUTION_HORIZON]
    prefix_robot = None if left_robot is None or not len(left_robot) else left_robot[:EXECUTION_HORIZON]
    msg = ObservationMsg(
        state=obs["state"], images=obs["images"], task=TASK, inference_delay_steps=delay,
        prefix_model=prefix_model, prefix_robot=prefix_robot, jpeg_quality=0,
    )  # fmt: skip
    decoded = decode_observation(encode_observation(msg))
    _assert_same_bytes(decoded.state, obs["state"])
    for sent, received in ((prefix_model, decoded.prefix_model), (prefix_robot, decoded.prefix_robot)):
        if sent is None:
            assert received is None
        else:
            _assert_same_bytes(received, sent)
    assert decoded.images.keys() == obs["images"].keys()
    for cam, image in obs["images"].items():
        _assert_same_bytes(decoded.images[cam], image)

    reply = server.run_inference_request(session, MsgHeader(seq_id=seq_id), decoded)
    assert reply.chunk_model.dtype == reply.chunk_robot.dtype == np.float32
    assert reply.header.seq_id == seq_id and reply.inference_delay_steps == delay
    chunk = decode_action_chunk(encode_action_chunk(reply))
    _assert_same_bytes(chunk.chunk_model, reply.chunk_model)
    _assert_same_bytes(chunk.chunk_robot, reply.chunk_robot)
    queue.merge(chunk.chunk_model, chunk.chunk_robot, delay, index_before)


def _assert_queues_equal(local: ActionQueue, remote: ActionQueue, cycle: int, delay: int) -> None:
    assert local.queue is not None and remote.queue is not None
    assert local.original_queue is not None and remote.original_queue is not None
    assert local.queue.tobytes() == remote.queue.tobytes(), f"robot-space queues diverged (cycle {cycle})"
    assert local.original_queue.tobytes() == remote.original_queue.tobytes(), (
        f"model queues diverged ({cycle})"
    )
    assert local.queue.shape == remote.queue.shape == (CHUNK_SIZE - min(delay, CHUNK_SIZE), ACTION_DIM)


def _drive_codec_parity(with_images: bool) -> tuple[ChunkPolicy, ChunkPolicy]:
    policy_local, policy_remote = _policy(), _policy()
    processors_local = policy_local.make_processors()
    server = PolicyRequestPath(policy_remote, execution_horizon=EXECUTION_HORIZON)
    session = PolicySession(
        session_id="parity", client_uuid="parity-client", task=TASK,
        rtc_enabled=True, processors=policy_remote.make_processors(),
    )  # fmt: skip
    queue_local, queue_remote = _queue(), _queue()
    for cycle, delay in enumerate(DELAYS):
        obs = _robot_obs(cycle, with_images)
        _local_cycle(policy_local, processors_local, queue_local, obs, delay)
        _remote_cycle(server, session, queue_remote, obs, delay, seq_id=cycle + 1)
        _assert_queues_equal(queue_local, queue_remote, cycle, delay)
        for _ in range(CONSUME_K):
            action_local, action_remote = queue_local.get(), queue_remote.get()
            assert action_local is not None and action_remote is not None
            _assert_same_bytes(action_local, action_remote)
    return policy_local, policy_remote


def _assert_same_policy_inputs(policy_local: ChunkPolicy, policy_remote: ChunkPolicy) -> None:
    assert len(policy_local.calls) == len(policy_remote.calls) == len(DELAYS)
    for i, (local, remote) in enumerate(zip(policy_local.calls, policy_remote.calls, strict=True)):
        assert local["state"].dtype == remote["state"].dtype == np.float32
        assert local["state"].tobytes() == remote["state"].tobytes(), f"state diverged (call {i})"
        assert local["inference_delay"] == remote["inference_delay"] == DELAYS[i]
        assert local["images"] == remote["images"] and local["task"] == remote["task"] == TASK
        if local["prev_chunk_left_over"] is None:
            assert remote["prev_chunk_left_over"] is None
        else:
            _assert_same_bytes(local["prev_chunk_left_over"], remote["prev_chunk_left_over"])
            assert remote["prev_chunk_left_over"].shape == (EXECUTION_HORIZON, ACTION_DIM)
    # The first cycle has nothing left over; every later one carries a real prefix.
    assert policy_local.calls[0]["prev_chunk_left_over"] is None
    assert all(call["prev_chunk_left_over"] is not None for call in policy_local.calls[1:])


def test_remote_path_matches_local_path_state_only() -> None:
    _drive_codec_parity(with_images=False)


def test_remote_path_matches_local_path_with_raw_images() -> None:
    _drive_codec_parity(with_images=True)


@pytest.mark.parametrize("with_images", [False, True])
def test_both_policies_see_byte_identical_inputs(with_images: bool) -> None:
    policy_local, policy_remote = _drive_codec_parity(with_images)
    _assert_same_policy_inputs(policy_local, policy_remote)
    if with_images:
        assert set(policy_remote.calls[0]["images"]) == set(CAMERAS)


def test_float32_tensor_round_trip_is_byte_exact() -> None:
    values = (np.random.default_rng(7).standard_normal((CHUNK_SIZE, STATE_DIM)) * 0.1).astype(np.float32)
    decoded = decode_tensor(encode_tensor(values))
    _assert_same_bytes(decoded, values)


# -- the same property over the real websocket transport ------------------------------------------
@pytest.fixture
def served_policy() -> Iterator[tuple[ChunkPolicy, RunningServer]]:
    policy = _policy()
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = PolicyService(policy, settings, execution_horizon=EXECUTION_HORIZON)
    with serving(create_app(settings, policy=service)) as running:
        yield policy, running


@pytest.mark.parametrize("with_images", [False, True])
def test_remote_engine_matches_local_engine_over_websocket(
    served_policy: tuple[ChunkPolicy, RunningServer], with_images: bool
) -> None:
    policy_remote, running = served_policy
    policy_local = _policy()
    config = EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=EXECUTION_HORIZON), task=TASK)
    local = LocalInferenceEngine(policy_local, config, execution_horizon=EXECUTION_HORIZON)
    with (
        RemoteInferenceEngine(running.ws_url + "/v1/policy/ws", config, state_dim=STATE_DIM) as remote,
        local,
    ):
        for cycle, delay in enumerate(DELAYS):
            obs = _robot_obs(cycle, with_images)
            assert local.run_cycle(obs, delay=delay) and remote.run_cycle(obs, delay=delay)
            _assert_queues_equal(local.queue, remote.queue, cycle, delay)
            for _ in range(CONSUME_K):
                action_local, action_remote = local.get_action(), remote.get_action()
                assert action_local is not None and action_remote is not None
                _assert_same_bytes(action_local, action_remote)
    _assert_same_policy_inputs(policy_local, policy_remote)
