"""Sessions that render: the real simulator's camera frames over the real HTTP server.

A seed-shaped client (plain JSON, as vLLM-Omni's tests post it) gets ``video_latent`` as float32
``[1, 3, H, W]``; the frames equal what the simulator renders for the same seed and actions, and
rendering never changes the physics (the state next to the frames equals a plain session's).
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient
from rollserve.models.worlds import ToyWorld, load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.sim.env import TabletopPickPlaceEnv

SESSIONS = "/v1/realtime/sessions"


@pytest.fixture(scope="module")
def url():
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("sim"), settings))) as server:
        yield server.http_url


def tensor(field: dict) -> np.ndarray:
    """How a vLLM-Omni client reads ``video_latent``: base64 float32 bytes and a shape."""
    assert field["dtype"] == "float32"
    return np.frombuffer(base64.b64decode(field["video_latent"]), dtype="<f4").reshape(field["shape"])


def simulator_frames(seed: int, actions: list[np.ndarray], size: tuple[int, int]) -> list[dict]:
    """The simulator's own frames (both cameras) after reset(seed) and after each action."""
    env = TabletopPickPlaceEnv(image_size=size, max_episode_steps=10_000)
    env.reset(seed=seed)
    frames = [env.render_cameras()]
    for action in actions:
        env.step(action)
        frames.append(env.render_cameras())
    env.close()
    return frames


def as_latent(image: np.ndarray) -> np.ndarray:
    return image.transpose(2, 0, 1)[None].astype(np.float32) / 255.0


def test_seed_shaped_client_gets_float32_frames_equal_to_the_simulators(url: str) -> None:
    size = (48, 64)
    render = {"cameras": ["exterior", "wrist"], "height": size[0], "width": size[1]}
    with httpx.Client(base_url=url, timeout=60) as http:
        created = http.post(SESSIONS, json={"model": "sim", "seed": 7, "render": render}).json()
        sid, first = created["session_id"], created["observation"]
        state = np.asarray(first["state"], dtype=np.float32)
        actions = [np.r_[state[:7] + 0.05 * k, 0.5 * k].astype(np.float32) for k in (1, 2)]
        steps = []
        for step_id, action in enumerate(actions):
            body = {
                "step_id": step_id,
                "observation": {},
                "action": {"joint_positions": action[:7].tolist(), "gripper_position": float(action[7])},
            }
            resp = http.post(f"{SESSIONS}/{sid}/step", json=body)
            assert resp.status_code == 200, resp.text
            steps.append(resp.json()["next_observation"])
        plain = http.post(SESSIONS, json={"model": "sim", "seed": 7}).json()
    expected = simulator_frames(7, actions, size)
    for seen, truth in zip([first, *steps], expected, strict=True):
        frames = tensor(seen)
        assert frames.shape == (1, 3, *size) and frames.dtype == np.float32
        np.testing.assert_array_equal(frames, as_latent(truth["exterior"]))
        for camera in ("exterior", "wrist"):
            image = seen["images"][camera]
            assert image["format"] == "raw" and image["shape"] == [*size, 3]
            pixels = np.frombuffer(base64.b64decode(image["data"]), np.uint8).reshape(*size, 3)
            np.testing.assert_array_equal(pixels, truth[camera])
        assert len(seen["state"]) == 13
    np.testing.assert_array_equal(np.asarray(first["state"], np.float32), tensor(plain["observation"]))


def test_rendering_leaves_the_physics_alone_and_jpeg_is_close(url: str) -> None:
    with RolloutClient(url) as client:
        sid, start = client.open_session("sim", seed=3, render={"cameras": ["wrist"], "jpeg_quality": 90})
        plain, plain_start = client.create_session("sim", seed=3)
        assert start.images is not None and set(start.images) == {"wrist"}
        np.testing.assert_array_equal(start.state, plain_start)
        action = np.r_[plain_start[:7] - 0.1, 1.0]
        framed, bare = client.step(sid, 0, action), client.step(plain, 0, action)
        np.testing.assert_array_equal(framed.state, bare.observation)
        assert framed.observation.shape == (1, 3, 64, 64) and framed.images is not None
        raw = as_latent(framed.images["wrist"])  # the JPEG decoded by the client
        assert np.abs(raw - framed.observation).mean() < 0.02  # video_latent is the exact frame


def test_fork_and_replay_keep_the_frames(url: str) -> None:
    with RolloutClient(url) as client:
        sid, start = client.open_session("sim", seed=11, render={})
        action = np.r_[start.state[:7], 0.0]
        first = client.step(sid, 0, action)
        again = client.step(sid, 0, action)  # a duplicate: the stored result, frames included
        assert again.replayed
        np.testing.assert_array_equal(again.images["exterior"], first.images["exterior"])
        fork = client.fork(sid)
        a, b = client.step(sid, 1, action), client.step(fork, 1, action)
        for camera in ("exterior", "wrist"):
            np.testing.assert_array_equal(a.images[camera], b.images[camera])
        reset = client.restart(fork, seed=11)
        np.testing.assert_array_equal(reset.images["exterior"], start.images["exterior"])


@pytest.mark.parametrize(
    "render",
    [{"cameras": ["nope"]}, {"cameras": ["wrist", "wrist"]}, {"height": 4096}, {"jpeg_quality": 101}],
)
def test_bad_render_requests_are_refused_and_create_nothing(url: str, render: dict) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        resp = http.post(SESSIONS, json={"model": "sim", "session_id": "bad-render", "render": render})
        assert resp.status_code == 400, resp.text
        assert http.get(f"{SESSIONS}/bad-render/status").status_code != 200


def test_a_world_without_cameras_refuses_render() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        resp = httpx.post(server.http_url + SESSIONS, json={"model": "toy", "render": {}}, timeout=60)
    assert resp.status_code == 400 and "does not render" in resp.text
