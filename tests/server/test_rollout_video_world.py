"""``rollserve serve --world video`` over real HTTP: a seed-shaped client gets the model's latent, a
rendering session the decoded frames and the state head's prediction; a failed step changes
nothing; fork and replay hold; a batch_step of many sessions is one engine call."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from rollserve.client.rollout_client import RolloutClient, StepCall
from rollserve.models.video_world import frames_to_uint8
from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"


@pytest.fixture(scope="module")
def served():
    settings = ServerSettings(max_batch_wait_ms=0.0)
    world = load_world("video")
    with serving(create_app(settings, rollout=RolloutService(world, settings))) as server:
        yield server.http_url, world


def test_seed_shaped_client_gets_the_models_latent(served) -> None:
    url, world = served
    with httpx.Client(base_url=url, timeout=60) as http:
        created = http.post(SESSIONS, json={"model": "video", "seed": 2}).json()
        first = created["observation"]
        state = np.asarray(first["state"], dtype=np.float32)
        action = {"joint_positions": (state[:7] + 0.1).tolist(), "gripper_position": 0.0}
        body = {"step_id": 0, "observation": {}, "action": action}
        nxt = http.post(f"{SESSIONS}/{created['session_id']}/step", json=body).json()["next_observation"]
    latent = np.frombuffer(base64.b64decode(nxt["video_latent"]), "<f4").reshape(nxt["shape"])
    assert nxt["dtype"] == "float32" and latent.shape == (1, *world.config.latent_shape)
    z0 = np.frombuffer(base64.b64decode(first["video_latent"]), "<f4").reshape(first["shape"])
    with torch.inference_mode():  # the model's own dynamics, applied here to the start latent
        z1, s1 = world.net.step(
            torch.as_tensor(z0.copy()),
            torch.as_tensor(state[None]),
            torch.as_tensor(np.r_[state[:7] + 0.1, 0.0][None]),
        )
    np.testing.assert_allclose(latent, z1.numpy(), atol=1e-5)
    np.testing.assert_allclose(nxt["state"], s1.numpy()[0], atol=1e-5)
    assert "images" not in nxt  # this session did not ask for frames


def test_frames_failed_steps_fork_and_replay(served) -> None:
    url, world = served
    with RolloutClient(url) as client:
        sid, first = client.open_session("video", seed=4, render={})
        assert first.images["exterior"].shape == (64, 64, 3)
        action = np.r_[first.state[:7], 1.0]
        bad = {"step_id": 0, "observation": {}, "action": {"joint_positions": [0.0] * 3}}
        refused = httpx.post(f"{url}{SESSIONS}/{sid}/step", json=bad, timeout=60)
        assert refused.status_code == 400 and client.status(sid)["committed_step_id"] == -1
        one = client.step(sid, 0, action)
        with torch.inference_mode():
            drawn = world.net.decode(torch.as_tensor(one.observation), torch.as_tensor(one.state[None]))
        np.testing.assert_array_equal(one.images["exterior"], frames_to_uint8(drawn.numpy())[0])
        replay = client.step(sid, 0, action)
        assert replay.replayed
        np.testing.assert_array_equal(replay.images["exterior"], one.images["exterior"])
        fork = client.fork(sid)
        a, b = client.step(sid, 1, action), client.step(fork, 1, action)
        np.testing.assert_array_equal(a.observation, b.observation)
        np.testing.assert_array_equal(a.images["exterior"], b.images["exterior"])


def test_batch_step_is_one_model_call(served) -> None:
    url, _ = served
    with RolloutClient(url) as client:
        sids = [client.open_session("video", seed=i, render={} if i % 2 else None)[0] for i in range(8)]
        results = client.batch_step([StepCall(sid, 0, np.zeros(8, np.float32)) for sid in sids])
    assert {r.metadata["batch_size"] for r in results} == {8}
    assert [r.images is not None for r in results] == [bool(i % 2) for i in range(8)]


def test_columns_carry_the_models_latents_and_states_as_items_do(served) -> None:
    """Two sets of sessions from the same seeds, one stepped by items and one by columns, with the
    same actions in batches of the same size: the same latents and predicted states, bit for bit."""
    url, world = served
    acts = np.random.default_rng(3).uniform(-0.1, 0.1, (4, 8)).astype(np.float32)
    with RolloutClient(url) as client:
        by_items = [client.create_session("video", seed=i)[0] for i in range(4)]
        by_rows = [client.create_session("video", seed=i)[0] for i in range(4)]
        for step in range(2):
            items = client.batch_step([StepCall(sid, step, acts[i]) for i, sid in enumerate(by_items)])
            rows = client.batch_step_columns(by_rows, [step] * 4, acts)
            assert rows.ok.all()
            assert rows.observation.shape == (4, *world.spec.observation_shape)
            np.testing.assert_array_equal(rows.observation, np.stack([r.observation for r in items]))
            assert rows.state is not None and rows.state.shape == (4, len(world.spec.state_names))
            np.testing.assert_array_equal(rows.state, np.stack([r.state for r in items]))
            np.testing.assert_array_equal(rows.reward, [r.reward for r in items])
            acts = acts[::-1].copy()
