"""A reset sent after an observation over the server's frame limit meets the connection the server
closed (1009) on that observation: it raises FrameTooLarge, and the message names the observation's
size, not the reset's (the refused message need not be the last one sent)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from waiting import wait_until

from rollserve.client import PolicyClient
from rollserve.client.policy_client import FrameTooLarge
from rollserve.server.running import RunningServer
from rollserve.wire import ObservationMsg, WireLimits

LIMIT = 64 * 1024  # the server's frame limit in these tests
STATE = np.zeros(6, np.float32)
BIG = {"top": np.zeros((200, 200, 3), np.uint8)}  # 120,000 bytes of pixels: over LIMIT


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with serving_chunk_policy(WireLimits(max_frame_bytes=LIMIT)) as running:
        yield running


def test_a_reset_after_a_refused_observation_names_the_observation_size(server: RunningServer) -> None:
    """Regression: the message said the server "refused a message of 96 bytes" (the reset's size)."""
    client = PolicyClient(server.ws_url + "/v1/policy/ws")
    client.connect()
    client.open_session(state_dim=6)
    client.send_observation(ObservationMsg(state=STATE, images=BIG, header=client.next_header()))
    ws = client._ws
    assert ws is not None
    wait_until(lambda: ws.close_code is not None)  # the server's close is in before the reset is sent
    with pytest.raises(FrameTooLarge) as info:
        client.reset(1)
    message = str(info.value)
    client_part, _, server_reason = message.partition("(1009: ")
    (refused,) = re.findall(r"frame with (\d+) bytes", server_reason)  # the server's count
    assert int(refused) > LIMIT and f"{refused} bytes" in client_part, message
    client.connect()  # the frame limit closed that connection; a new one works
    client.open_session(state_dim=6)
    client.close()
