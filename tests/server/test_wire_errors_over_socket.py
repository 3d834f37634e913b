"""Tensor maps numpy chokes on, over a real server: a typed error, and the connection goes on.

A dtype of ``","`` (numpy raises SyntaxError) and an empty tensor of shape ``[0, 2**63]`` (numpy
raises ValueError) used to escape the decoder: the session websocket dropped without a close frame,
the openpi endpoint answered "internal server error" and REST answered 500. docs/protocol.md:
"Errors are `error` messages, never a dropped request, never a traceback. The connection and every
other session keep working after any of them." Also here: numpy scalars a client passes for
number fields (``state_dim=np.int64(6)``) reach the server as the numbers they are.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from websockets.sync.client import ClientConnection, connect

from rollserve.client import PolicyClient
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.status_codes import MODE_HEADER, STRICT
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionOpen,
    decode_message,
    encode_message,
    packb,
)

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)
BAD_TENSORS = {
    "comma-dtype": (
        {b"__ndarray__": True, b"data": b"", b"dtype": ",", b"shape": [0]},
        "unsupported_dtype",
        "unknown dtype ','",
    ),
    "empty-2^63": (
        {b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [0, 2**63]},
        "too_many_elements",
        "9223372036854775808 elements besides the zeros of shape [0, 9223372036854775808] exceeds the "
        "limit of 16777216",
    ),
}


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(
        settings,
        policy=PolicyService(ChunkPolicy(), settings),
        rollout=RolloutService(ToyWorld(), settings),
    )
    with serving(app) as server:
        yield server


def _chunk(ws: ClientConnection, seq_id: int) -> np.ndarray:
    ws.send(encode_message(ObservationMsg(state=STATE, header=MsgHeader(seq_id=seq_id))))
    reply = decode_message(ws.recv(timeout=10))
    assert isinstance(reply, ActionChunkMsg) and reply.header.seq_id == seq_id, reply
    return reply.chunk_robot


@pytest.mark.parametrize("name", list(BAD_TENSORS))
def test_the_session_websocket_answers_an_error_and_keeps_serving(running: RunningServer, name: str) -> None:
    tensor, code, message = BAD_TENSORS[name]
    with connect(running.ws_url + PATH, max_size=None, compression=None) as ws:
        ws.send(encode_message(SessionOpen(state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        before = _chunk(ws, 1)
        ws.send(packb({"type": "observation", "header": {"seq_id": 2}, "state": tensor}))
        reply = decode_message(ws.recv(timeout=10))
        assert reply == ErrorMsg(code=code, message=message, seq_id=None, retryable=False)
        np.testing.assert_array_equal(_chunk(ws, 3), before)  # same connection, same session


@pytest.mark.parametrize("name", list(BAD_TENSORS))
def test_the_openpi_endpoint_answers_the_typed_error_and_goes_on(running: RunningServer, name: str) -> None:
    tensor, code, message = BAD_TENSORS[name]
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        ws.send(packb({"state": tensor}))
        assert ws.recv(timeout=10) == f"{code}: {message}"
        ws.send(msgpack_numpy.packb({"state": STATE}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (20, 6)


@pytest.mark.parametrize("name", list(BAD_TENSORS))
def test_a_rest_step_is_refused_and_the_session_steps_on(running: RunningServer, name: str) -> None:
    tensor, code, message = BAD_TENSORS[name]
    with httpx.Client(base_url=running.http_url, timeout=30.0, headers={MODE_HEADER: "strict"}) as http:
        sid = http.post("/v1/realtime/sessions", json={"model": "toy", "seed": 1}).json()["session_id"]
        body = packb({"step_id": 0, "observation": {"state": tensor}})
        headers = {"content-type": "application/msgpack", "accept": "application/json"}
        refused = http.post(f"/v1/realtime/sessions/{sid}/step", content=body, headers=headers)
        assert refused.status_code == STRICT["invalid_request"] == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["message"] == f"msgpack body rejected ({code}): {message}"
        assert "Traceback" not in refused.text
        action = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
        step = {"step_id": 0, "observation": {"prompt": "reach"}, "action": action}
        stepped = http.post(f"/v1/realtime/sessions/{sid}/step", json=step)
        assert stepped.status_code == 200 and stepped.json()["step_id"] == 0, stepped.text


def test_numpy_scalars_from_a_client_are_the_numbers_they_hold(running: RunningServer) -> None:
    """``PolicyClient.open_session(state_dim=np.int64(6))`` and a delay computed with numpy used to
    be refused as "must be an int, got dict"."""
    with PolicyClient(running.ws_url + PATH) as client:
        assert client.open_session(state_dim=np.int64(6), fps=np.float32(15.0)).state_dim == 6
        delay = np.ceil(0.149 / 0.1).astype(int)  # 149 ms at 10 Hz: 2 steps
        by_numpy = client.predict(STATE, inference_delay_steps=delay)
        by_python = client.predict(STATE, inference_delay_steps=2)
        assert by_numpy.inference_delay_steps == by_python.inference_delay_steps == 2
        np.testing.assert_array_equal(by_numpy.chunk_model, by_python.chunk_model)


def test_more_than_16_images_is_bad_image_and_the_session_goes_on(running: RunningServer) -> None:
    """docs/protocol.md's error table: `bad_image` for "more than 16 images" (was `bad_field`)."""
    images = {f"c{i}": np.zeros((2, 2, 3), np.uint8) for i in range(17)}
    with connect(running.ws_url + PATH, max_size=None, compression=None) as ws:
        ws.send(encode_message(SessionOpen(state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        ws.send(encode_message(ObservationMsg(state=STATE, images=images, header=MsgHeader(seq_id=1))))
        reply = decode_message(ws.recv(timeout=10))
        message = "'images' holds 17 images; at most 16 are accepted"
        assert reply == ErrorMsg(code="bad_image", message=message, seq_id=None, retryable=False)
        assert _chunk(ws, 2).shape == (20, 6)
