"""A step the server answers with ``request_timeout`` (408: its body never arrived whole, so it did
not run) is sent again, like a step whose connection dropped. It used to raise: under Ray, a body
stalled behind a replica kill ended a trainer's rollout although nothing had been applied.

The first step's body is withheld from a real server (headers only, over a raw socket) until the
server's body deadline answers 408; the client then resends, and the step commits once.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

BODY_DEADLINE_S = 0.2
ACTION = np.r_[np.full(7, 0.1), 0.5].astype(np.float32)


class FirstStepBodyWithheld(httpx.BaseTransport):
    """Sends the first step's headers but never its body, and returns the server's own answer."""

    def __init__(self, server: RunningServer) -> None:
        self.server, self.inner, self.withheld = server, httpx.HTTPTransport(), 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.withheld or not request.url.path.endswith("/step"):
            return self.inner.handle_request(request)
        self.withheld += 1
        head = [f"POST {request.url.raw_path.decode()} HTTP/1.1", f"host: {self.server.host}"]
        head += [f"{k}: {v}" for k, v in request.headers.items() if k.lower() != "host"]
        with socket.create_connection((self.server.host, self.server.port)) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())  # content-length set, no body
            reply = b""
            while chunk := sock.recv(65536):  # the server closes after its 408
                reply += chunk
        status_line, _, rest = reply.partition(b"\r\n")
        header_block, _, body = rest.partition(b"\r\n\r\n")
        headers = [tuple(line.decode().split(": ", 1)) for line in header_block.split(b"\r\n")]
        return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = RolloutService(ToyWorld(), settings, body_timeout_s=BODY_DEADLINE_S)
    with serving(create_app(settings, rollout=service)) as running:
        yield running


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_a_step_answered_408_is_resent_and_commits_once(server: RunningServer, use_msgpack: bool) -> None:
    transport = FirstStepBodyWithheld(server)
    client = RolloutClient(server.http_url, transport=transport, use_msgpack=use_msgpack, backoff_s=0.0)
    session_id, _ = client.open_session("toy", seed=0)
    result = client.step(session_id, 0, ACTION)
    assert transport.withheld == 1 and client.retries >= 1
    assert result.step_id == 0 and not result.replayed
    status = client.status(session_id)
    assert (status["committed_step_id"], status["context_length"]) == (0, 1)
