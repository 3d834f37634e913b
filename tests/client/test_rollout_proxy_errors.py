"""A proxy's bare 5xx (Ray Serve answers ``500 Internal Server Error`` when the replica under a
request dies) is a transport failure: the client retries it like a lost reply, while rollserve's
own typed 5xx errors (``inference_error``) still reach the caller."""

from __future__ import annotations

import httpx
import numpy as np

from rollserve.client.rollout_client import RolloutClient
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving


class DyingReplica(httpx.BaseTransport):
    """Every other step reaches the server, which runs it, but the client gets a proxy's bare 500."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.steps = self.bare_500s = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/step"):
            self.steps += 1
            if self.steps % 2:
                response.read()
                self.bare_500s += 1
                return httpx.Response(500, text="Internal Server Error", request=request)
        return response


def test_bare_500_from_a_proxy_is_retried_and_commits_once() -> None:
    with serving(create_app(rollout=RolloutService(ToyWorld()))) as server:
        transport = DyingReplica()
        with (
            RolloutClient(server.http_url, transport=transport, backoff_s=0.001) as flaky,
            RolloutClient(server.http_url) as clean,
        ):
            a, _ = flaky.create_session("toy", seed=4)
            b, _ = clean.create_session("toy", seed=4)
            for t in range(6):
                action = np.full(8, 0.1 * t, np.float32)
                got, want = flaky.step(a, t, action), clean.step(b, t, action)
                np.testing.assert_array_equal(got.observation, want.observation)
            assert transport.bare_500s >= 6
            assert flaky.status(a)["context_length"] == 6  # each step committed exactly once
