"""A world served under another name too (``WorldSpec.aliases``, e.g. ``video_world`` for ``video``):
the server creates sessions under either name, so the client must find the world under either.
Regression: ``RolloutEnv(model=<alias>)`` was refused with ``model_not_found``, because ``/v1/models``
did not publish the aliases and ``RolloutClient.world`` compared the id only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.client.rollout_env import RolloutEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings


class AliasedToy(ToyWorld):
    spec = dataclasses.replace(ToyWorld.spec, aliases=("toy-v2", "toy_world"))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(AliasedToy(), settings))) as server:
        yield server.http_url


@pytest.mark.parametrize("name", ["toy", "toy-v2", "toy_world", None])
def test_the_client_finds_the_world_by_its_id_or_any_alias(url: str, name: str | None) -> None:
    with RolloutClient(url) as client:
        entry = client.world(name)
    assert (entry["id"], entry["aliases"]) == ("toy", ["toy-v2", "toy_world"])


def test_a_name_the_server_does_not_serve_is_still_refused(url: str) -> None:
    with RolloutClient(url) as client, pytest.raises(RolloutRequestError) as err:
        client.world("toy-v3")
    assert err.value.code == "model_not_found"
    assert err.value.message == "the server serves no world 'toy-v3'"


def test_an_env_made_with_an_alias_rolls_out(url: str) -> None:
    env = RolloutEnv(url, model="toy_world", max_episode_steps=2)
    try:
        assert env.model == "toy"
        first, _ = env.reset(seed=3)
        assert env.observation_space.contains(first)
        _, _, terminated, truncated, _ = env.step(np.zeros(8, np.float32))
        _, _, terminated, truncated, _ = env.step(np.zeros(8, np.float32))
        assert (terminated, truncated) == (False, True)
    finally:
        env.close()
    with RolloutClient(url) as client:
        sid, by_alias = client.create_session("toy-v2", seed=3)
        np.testing.assert_array_equal(by_alias, first)  # the same world under its other name
        client.close_session(sid)


def test_an_entry_without_aliases_is_found_by_its_id_only() -> None:
    """A server that publishes no ``aliases`` (an older rollserve, vLLM-Omni): the id still works."""

    def models(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        return httpx.Response(200, json={"data": [{"id": "toy", "kind": "world"}]})

    with RolloutClient("http://rollout.test", transport=httpx.MockTransport(models)) as client:
        assert client.world("toy")["id"] == "toy"
        with pytest.raises(RolloutRequestError) as err:
            client.world("toy-v2")
    assert err.value.code == "model_not_found"
