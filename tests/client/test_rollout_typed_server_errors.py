"""The server's own 5xx errors reach the caller as typed errors, at once, in both status-code modes.

In vLLM-Omni mode (the default) a non-step error carries the HTTP status in ``error.code`` and the
typed code in ``error.reason``; in strict mode the typed code is in ``error.code``. Either body is
the server's answer, not a proxy's: it must raise :class:`RolloutRequestError` after exactly one
request. Only a 5xx without such a body (a proxy's bare page) is retried as a transport failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

BAD_SEED = 13  # this seed makes the world's start raise
BROKEN = 0.625  # a first joint of this makes the world's step raise
ACTION = np.array([0.2] * 7 + [0.5], dtype=np.float32)


class FailingWorld(ToyWorld):
    """The toy world, with a start that fails on ``BAD_SEED`` and a step that fails on ``BROKEN``."""

    def initial_states(self, inits):
        outs = super().initial_states(inits)
        return [
            RuntimeError("no start") if i.seed == BAD_SEED else o for i, o in zip(inits, outs, strict=True)
        ]

    def step_batch(self, steps):
        outs = super().step_batch(steps)
        return [
            RuntimeError("device-side assert") if s.action[0] == np.float32(BROKEN) else o
            for s, o in zip(steps, outs, strict=True)
        ]


class Counting(httpx.BaseTransport):
    """A real HTTP transport that counts the requests it sends, and can fake one proxy failure."""

    def __init__(self, bare_status: int | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests = 0
        self.bare_status = bare_status

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.bare_status is not None:  # the proxy answers instead of the server, once
            status, self.bare_status = self.bare_status, None
            return httpx.Response(status, text="Service Unavailable", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module", params=["vllm-omni", "strict"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def url(mode: str) -> Iterator[str]:
    """A server holding at most one session, whose world fails on demand."""
    settings = ServerSettings(max_batch_wait_ms=0.0, max_rollout_sessions=1, rollout_status_codes=mode)
    with serving(create_app(settings, rollout=RolloutService(FailingWorld(), settings))) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def worldless_url(mode: str) -> Iterator[str]:
    """A server that serves no world: every rollout route answers ``rollout_not_served``."""
    settings = ServerSettings(rollout_status_codes=mode)
    with serving(create_app(settings)) as server:
        yield server.http_url


def refused(
    url: str, call: Callable[[RolloutClient], object], *, use_msgpack: bool = True
) -> RolloutRequestError:
    """The error ``call`` raises on a fresh client, checked to have taken one request and no retry."""
    transport = Counting()
    with RolloutClient(url, transport=transport, use_msgpack=use_msgpack) as client:
        with pytest.raises(RolloutRequestError) as err:
            call(client)
        assert (transport.requests, client.retries) == (1, 0), f"{err.value.code} was retried"
    return err.value


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_at_capacity_on_create_and_fork_raises_at_once(url: str, use_msgpack: bool) -> None:
    with RolloutClient(url) as owner:
        sid, _ = owner.create_session("toy", seed=0)
        try:
            for call in (lambda c: c.create_session("toy", seed=1), lambda c: c.fork(sid)):
                err = refused(url, call, use_msgpack=use_msgpack)
                assert (err.code, err.status, err.committed_step_id) == ("at_capacity", 503, -1)
                assert "maximum of 1 rollout sessions" in err.message
        finally:
            owner.close_session(sid)


def test_a_world_that_cannot_start_raises_inference_error_on_create_and_reset(url: str) -> None:
    err = refused(url, lambda c: c.create_session("toy", seed=BAD_SEED))
    assert (err.code, err.status) == ("inference_error", 500)
    assert "no start" in err.message
    with RolloutClient(url) as owner:
        sid, _ = owner.create_session("toy", seed=0)
        try:
            err = refused(url, lambda c: c.reset(sid, seed=BAD_SEED))
            assert (err.code, err.status) == ("inference_error", 500)
        finally:
            owner.close_session(sid)


def test_a_failed_step_raises_inference_error_without_a_retry(url: str, mode: str) -> None:
    with RolloutClient(url) as owner:
        sid, _ = owner.create_session("toy", seed=0)
        try:
            err = refused(url, lambda c: c.step(sid, 0, [BROKEN] * 7 + [0.5]))
            assert (err.code, err.status) == ("inference_error", {"strict": 500}.get(mode, 200))
            assert err.committed_step_id == -1
        finally:
            owner.close_session(sid)


def test_a_server_without_a_world_raises_rollout_not_served_on_every_route(
    worldless_url: str, mode: str
) -> None:
    status = {"strict": 404}.get(mode, 501)
    calls = {
        "create": lambda c: c.create_session("toy"),
        "step": lambda c: c.step("s1", 0, ACTION),
        "status": lambda c: c.status("s1"),
        "reset": lambda c: c.reset("s1", seed=0),
        "fork": lambda c: c.fork("s1"),
        "batch_step": lambda c: c.batch_step([]),
    }
    for route, call in calls.items():
        err = refused(worldless_url, call)
        assert (err.code, err.status) == ("rollout_not_served", status), route


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_proxys_bare_5xx_is_still_retried(url: str, status: int) -> None:
    transport = Counting(bare_status=status)
    with RolloutClient(url, transport=transport, backoff_s=0.001) as client:
        sid, _ = client.create_session("toy", seed=0)  # the first try met the proxy's page
        try:
            assert (transport.requests, client.retries) == (2, 1)
            assert client.step(sid, 0, ACTION).committed_step_id == 0
        finally:
            client.close_session(sid)


def test_a_dead_network_gives_up_after_one_round_of_retries() -> None:
    """A lost step reply asks the session's status before resending; with the network gone, that
    status call is retried ``max_retries`` times like any call, not ``max_retries`` times per retry."""
    sent: list[str] = []

    def dead(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        raise httpx.ConnectError("no route to host", request=request)

    with (
        RolloutClient(
            "http://127.0.0.1:9", transport=httpx.MockTransport(dead), max_retries=2, backoff_s=0.0
        ) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.step("s1", 0, np.zeros(8, np.float32))
    assert sent == ["POST /v1/realtime/sessions/s1/step"] + ["GET /v1/realtime/sessions/s1/status"] * 3
