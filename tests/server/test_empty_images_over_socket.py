"""An image with no pixels, over a real server: the session protocol answers ``bad_image`` and the
openpi endpoint ``bad_observation`` (its code for every observation its layout cannot read,
docs/protocol.md); the policy never sees the image, and the connection goes on. Both endpoints
used to hand a 0x4x3 array to the policy and answer with a chunk."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from websockets.sync.client import connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionOpen,
    decode_message,
    pack_frame,
)
from rollserve.wire import encode_message as encode
from rollserve.wire.images import IMAGE_KEY

PATH = "/v1/policy/ws"
STATE = np.linspace(-1, 1, 6, dtype=np.float32)
PIXEL = np.zeros((1, 1, 3), np.uint8)
PIXEL_SHA = hashlib.sha256(bytes(3)).hexdigest()  # how the policy records an image: its bytes' hash
Served = tuple[ChunkPolicy, RunningServer]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    policy = ChunkPolicy(record_calls=True)
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(policy, settings))) as running:
        yield policy, running


@pytest.mark.parametrize("shape", [(0, 4, 3), (4, 0, 3), (0, 0, 3)])
def test_the_session_protocol_answers_bad_image(served: Served, shape: tuple) -> None:
    policy, running = served
    calls = len(policy.calls)
    with connect(running.ws_url + PATH, max_size=None, compression=None) as ws:
        ws.send(encode(SessionOpen(state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        images = {"top": PIXEL, "wrist": np.zeros(shape, np.uint8)}  # by hand: encode() refuses it
        wire = {cam: {IMAGE_KEY: True, b"format": "raw", b"pixels": image} for cam, image in images.items()}
        ws.send(pack_frame({"type": "observation", "header": {"seq_id": 1}, "state": STATE, "images": wire}))
        message = f"{shape[0]}x{shape[1]} image is empty: an image is at least 1x1"
        assert decode_message(ws.recv(timeout=10)) == ErrorMsg(code="bad_image", message=message)
        assert len(policy.calls) == calls  # the policy never saw it
        ws.send(encode(ObservationMsg(state=STATE, images={"top": PIXEL}, header=MsgHeader(seq_id=2))))
        reply = decode_message(ws.recv(timeout=10))
        assert isinstance(reply, ActionChunkMsg) and reply.header.seq_id == 2
    assert [call["images"] for call in policy.calls[calls:]] == [{"top": PIXEL_SHA}]


@pytest.mark.parametrize("shape", [(0, 4, 3), (4, 0, 3), (3, 0, 0)])  # the last: ALOHA's CHW
def test_the_openpi_endpoint_answers_bad_observation(served: Served, shape: tuple) -> None:
    policy, running = served
    calls = len(policy.calls)
    with connect(running.ws_url, max_size=None, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        ws.send(msgpack_numpy.packb({"state": STATE, "images": {"cam_high": np.zeros(shape, np.uint8)}}))
        size = "0x0" if shape == (3, 0, 0) else f"{shape[0]}x{shape[1]}"
        expected = f"bad_observation: image 'images/cam_high' is empty ({size}): an image is at least 1x1"
        assert ws.recv(timeout=10) == expected
        assert len(policy.calls) == calls
        ws.send(msgpack_numpy.packb({"state": STATE, "images": {"cam_high": PIXEL}}))
        assert msgpack_numpy.unpackb(ws.recv(timeout=10))["actions"].shape == (20, 6)
    assert [call["images"] for call in policy.calls[calls:]] == [{"cam_high": PIXEL_SHA}]
