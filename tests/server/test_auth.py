"""The API key over real HTTP and websockets: exactly the configured key opens every route but the
health probes; anything else (wrong, empty, a prefix, another case, another scheme) gets 401."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server.app import create_app
from rollserve.server.auth import extract_key, key_matches
from rollserve.server.policy.service import PolicyService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings

KEY = "s3cret-Key_42"
UNAUTHORIZED = {"error": {"code": "unauthorized", "message": "missing or invalid API key"}}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    settings = ServerSettings(api_key=KEY, max_batch_wait_ms=0.0)
    service = PolicyService(ChunkPolicy(), settings)
    with serving(create_app(settings, policy=service)) as running:
        yield running


def _get(server: RunningServer, path: str, **headers: str) -> httpx.Response:
    return httpx.get(server.http_url + path, headers=headers, timeout=10)


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Api-Key {KEY}"},
        {"Authorization": f"api-key {KEY}"},  # the scheme is case-insensitive (the key is not)
        {"Authorization": f"Bearer {KEY}"},
        {"X-Api-Key": KEY},
    ],
    ids=["api-key", "lower-scheme", "bearer", "x-api-key"],
)
@pytest.mark.parametrize("path", ["/v1/models", "/metrics"])
def test_the_key_opens_every_route(server: RunningServer, path: str, headers: dict[str, str]) -> None:
    response = _get(server, path, **headers)
    assert response.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Api-Key {KEY[:-1]}"},  # a prefix of the key
        {"Authorization": f"Api-Key {KEY}x"},  # the key plus more
        {"Authorization": f"Api-Key {KEY.upper()}"},  # another case
        {"Authorization": f"Api-Key {KEY.lower()}"},
        {"Authorization": "Api-Key wrong"},
        {"Authorization": "Api-Key"},
        {"Authorization": ""},
        {"Authorization": KEY},  # no scheme
        {"Authorization": f"Basic {KEY}"},  # a scheme that is not accepted
        {"Authorization": f"Api-Key: {KEY}"},
        {"X-Api-Key": ""},
        {"X-Api-Key": KEY.upper()},
        {"X-Api-Key": "wrong", "Authorization": f"Api-Key {KEY}"},  # X-Api-Key wins when present
    ],
    ids=[
        "none", "prefix", "longer", "upper", "lower", "wrong", "scheme-only", "empty-header",
        "no-scheme", "basic", "colon", "empty-x-api-key", "upper-x-api-key", "wrong-x-api-key",
    ],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/v1/realtime/sessions/x/status"])
def test_anything_but_the_key_is_refused(server: RunningServer, path: str, headers: dict[str, str]) -> None:
    response = _get(server, path, **headers)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED
    assert response.headers["content-type"] == "application/json"
    assert response.headers["www-authenticate"] == "Api-Key"


@pytest.mark.parametrize("path", ["/healthz", "/health"])
def test_health_probes_need_no_key(server: RunningServer, path: str) -> None:
    assert _get(server, path).status_code != 401


def test_websockets_without_the_key_are_refused_before_the_handshake() -> None:
    """Its own server (not the module's): the key must reach the middleware when the app is built."""
    settings = ServerSettings(api_key=KEY, max_batch_wait_ms=0.0)
    with serving(create_app(settings, policy=PolicyService(ChunkPolicy(), settings))) as server:
        for headers in ({}, {"Authorization": f"Api-Key {KEY.upper()}"}):
            with pytest.raises(InvalidStatus) as info:
                connect(server.ws_url + "/v1/policy/ws", additional_headers=headers, open_timeout=10)
            assert info.value.response.status_code == 403
        with connect(server.ws_url + "/v1/policy/ws", additional_headers={"Authorization": f"Api-Key {KEY}"}):
            pass
        assert _get(server, "/v1/models").status_code == 401


def test_without_a_configured_key_everything_is_open() -> None:
    service = PolicyService(ChunkPolicy(), ServerSettings(max_batch_wait_ms=0.0))
    with serving(create_app(ServerSettings(), policy=service)) as running:
        assert _get(running, "/v1/models").status_code == 200
        assert _get(running, "/metrics", Authorization="Api-Key anything").status_code == 200
    assert key_matches(None, None) and key_matches(None, "x")


def test_key_rules_directly() -> None:
    assert extract_key(None) is None and extract_key("") is None
    assert extract_key("Api-Key  k ") == "k" and extract_key("BEARER k") == "k"
    assert extract_key("Token k") is None and extract_key("Api-Key") is None
    assert extract_key("Api-Key k", "x") == "x" and extract_key("Api-Key k", "") == "k"
    assert key_matches("k", "k") and not key_matches("k", None) and not key_matches("k", "K")
    assert not key_matches("k", "") and not key_matches("", "k") and key_matches("", "")
