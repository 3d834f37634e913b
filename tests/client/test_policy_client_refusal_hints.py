"""What PolicyClient says when the server refuses the websocket handshake over HTTP, against real
servers: 403 is both a wrong key and a path without a policy websocket (Starlette's answer to an
unknown websocket route), so the hint names both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollserve.client import PolicyClient, PolicyConnectionError
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

KEY = "s3cret-key"
BOTH_CAUSES = (
    "HTTP 403 (wrong or missing API key, or no policy websocket at this URL: check the path,"
    " /v1/policy/ws, and that the server serves a policy)"
)


def _serve(api_key: str | None) -> Iterator[RunningServer]:
    settings = ServerSettings(max_batch_wait_ms=0.0, api_key=api_key)
    with serving(create_app(settings, policy=PolicyService(ChunkPolicy(), settings))) as running:
        yield running


@pytest.fixture
def open_server() -> Iterator[RunningServer]:
    yield from _serve(None)


@pytest.fixture
def keyed_server() -> Iterator[RunningServer]:
    yield from _serve(KEY)


def _refusal(url: str, api_key: str | None = None) -> str:
    with pytest.raises(PolicyConnectionError) as info:
        PolicyClient(url, api_key=api_key).connect()
    return str(info.value)


def test_a_wrong_path_is_named_as_a_cause(open_server: RunningServer) -> None:
    """Regression: a typo in the path (no key needed here) was reported as a key problem only."""
    url = open_server.ws_url + "/v1/policy"
    assert _refusal(url) == f"{url} refused the connection: {BOTH_CAUSES}"


def test_a_wrong_key_gets_the_same_hint(keyed_server: RunningServer) -> None:
    url = keyed_server.ws_url + "/v1/policy/ws"
    assert _refusal(url, api_key="wrong") == f"{url} refused the connection: {BOTH_CAUSES}"
    PolicyClient(url, api_key=KEY).connect().close()  # the right key on the right path connects
