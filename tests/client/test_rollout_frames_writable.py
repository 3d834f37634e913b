"""Camera frames from the rollout client are writable arrays whatever the codec (msgpack or JSON,
raw or JPEG): a raw msgpack image used to be a read-only view into the reply, which in-place
augmentation (``img -= 1``) and ``torch.from_numpy`` refuse. Real server, the video world (fast)."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient, StepCall
from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

CODECS = [(m, q) for m in (True, False) for q in (0, 80)]
IDS = [f"{'msgpack' if m else 'json'}-{'jpeg' if q else 'raw'}" for m, q in CODECS]


@pytest.fixture(scope="module")
def url():
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("video"), settings))) as server:
        yield server.http_url


def assert_writable(images: dict[str, np.ndarray] | None, ndim: int = 3) -> None:
    """Uint8 RGB images (``ndim`` 4: a vector env's, one per sub-env) that in-place ops accept."""
    assert images, "a rendering session answers with images"
    for name, image in images.items():
        assert image.dtype == np.uint8 and image.ndim == ndim and image.shape[-1] == 3, name
        assert image.flags.writeable, f"camera {name!r} is read-only"
        image -= 1  # the in-place op the read-only view refused


def action_of(state: np.ndarray) -> np.ndarray:
    return np.r_[state[:7], 0.5].astype(np.float32)


@pytest.mark.parametrize(("use_msgpack", "quality"), CODECS, ids=IDS)
def test_client_images_are_writable(url: str, use_msgpack: bool, quality: int) -> None:
    with RolloutClient(url, use_msgpack=use_msgpack) as client:
        sid, first = client.open_session("video", seed=1, render={"jpeg_quality": quality})
        assert_writable(first.images)
        stepped = client.step(sid, 0, action_of(first.state))
        assert_writable(stepped.images)
        [batched] = client.batch_step([StepCall(sid, 1, action_of(stepped.state))])
        assert not isinstance(batched, Exception), batched
        assert_writable(batched.images)
        assert_writable(client.restart(sid, seed=2).images)
        client.close_session(sid)


@pytest.mark.parametrize(("use_msgpack", "quality"), CODECS, ids=IDS)
def test_env_images_are_writable(url: str, use_msgpack: bool, quality: int) -> None:
    render = {"jpeg_quality": quality}
    client = RolloutClient(url, use_msgpack=use_msgpack)
    env = RolloutEnv(client=client, render=render)
    venv = RolloutVectorEnv(2, client=client, render=render)
    try:
        obs, _ = env.reset(seed=3)
        assert_writable(obs["images"])
        assert_writable(env.step(action_of(obs["state"]))[0]["images"])
        v_obs, _ = venv.reset(seed=3)
        assert_writable(v_obs["images"], ndim=4)
        actions = np.stack([action_of(s) for s in v_obs["state"]])
        assert_writable(venv.step(actions)[0]["images"], ndim=4)
    finally:
        env.close()
        venv.close()
        client.close()
