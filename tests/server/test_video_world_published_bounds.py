"""``rollserve serve --world video`` publishes the bounds it clamps to on ``/v1/models``: the latent
within +-50, the state vector within +-4. So ``RolloutEnv`` (with and without ``render``) builds finite
spaces, gymnasium's checker has no "infinity" to warn about, and the observations lie in them."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from rollserve.client.rollout_env import RolloutEnv
from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

# written down here, not read from the world: the shipped checkpoint's layout and the documented clamps
LATENT_SHAPE = (1, 16, 8, 8)
LATENT_BOUND = 50.0
STATE_SIZE = 13
STATE_BOUND = 4.0
RENDER = {"cameras": ["exterior"]}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("video"), settings))) as server:
        yield server.http_url


def _entry(url: str) -> dict[str, Any]:
    (entry,) = [m for m in httpx.get(f"{url}/v1/models", timeout=60).json()["data"] if m["id"] == "video"]
    return entry


def test_models_publishes_the_latent_and_state_bounds(url: str) -> None:
    entry = _entry(url)
    observation, state = entry["observation"], entry["state"]
    assert observation["shape"] == list(LATENT_SHAPE)
    for key, bound in (("low", -LATENT_BOUND), ("high", LATENT_BOUND)):
        published = np.asarray(observation[key])
        assert published.shape == LATENT_SHAPE  # nested like the tensor: one value per element
        assert (published == bound).all()
    assert state["shape"] == [STATE_SIZE]
    assert state["low"] == [-STATE_BOUND] * STATE_SIZE
    assert state["high"] == [STATE_BOUND] * STATE_SIZE


def _box_is(box: spaces.Space[Any], shape: tuple[int, ...], bound: float) -> None:
    assert isinstance(box, spaces.Box) and box.shape == shape
    np.testing.assert_array_equal(box.low, np.full(shape, -bound, dtype=np.float32))
    np.testing.assert_array_equal(box.high, np.full(shape, bound, dtype=np.float32))


def _checked(env: RolloutEnv) -> list[str]:
    """gymnasium's checker on ``env``; the messages of the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    return [str(w.message) for w in caught]


def _observations(env: RolloutEnv) -> list[Any]:
    """A reset and a few steps: sampled actions, then the action bounds' corners (far from the data)."""
    env.action_space.seed(0)
    box = env.action_space
    assert isinstance(box, spaces.Box)
    actions = [env.action_space.sample() for _ in range(3)] + [box.low, box.high, box.low]
    seen = [env.reset(seed=1)[0]]
    seen += [env.step(action)[0] for action in actions]
    return seen


def test_env_without_render_has_the_latent_box_and_passes_the_checker(url: str) -> None:
    env = RolloutEnv(url)
    try:
        _box_is(env.observation_space, LATENT_SHAPE, LATENT_BOUND)
        messages = _checked(env)
        assert not [m for m in messages if "infinity" in m], messages
        for obs in _observations(env):
            assert env.observation_space.contains(obs), (obs.min(), obs.max())
    finally:
        env.close()


def test_env_with_render_has_the_state_box_and_passes_the_checker(url: str) -> None:
    env = RolloutEnv(url, render=RENDER)
    try:
        space = env.observation_space
        assert isinstance(space, spaces.Dict)
        _box_is(space["state"], (STATE_SIZE,), STATE_BOUND)
        messages = _checked(env)
        assert not [m for m in messages if "infinity" in m], messages
        for obs in _observations(env):
            assert space.contains(obs), (obs["state"].min(), obs["state"].max())
    finally:
        env.close()
