"""Fault injection: rollouts through a network that drops requests and replies at random (seeded)
commit exactly the trajectories of a fault-free run: no step lost, none applied twice."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient
from rollserve.client.rollout_env import RolloutVectorEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

ROLLOUTS, STEPS, THREADS = 12, 25, 4


class FlakyNetwork(httpx.BaseTransport):
    """Drops a request before the server sees it, or drops the reply after the server answered."""

    def __init__(self, seed: int, p_request: float = 0.15, p_reply: float = 0.15) -> None:
        self.rng = random.Random(seed)
        self.inner = httpx.HTTPTransport()
        self.p_request, self.p_reply = p_request, p_reply
        self.dropped_requests = self.dropped_replies = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.rng.random() < self.p_request:
            self.dropped_requests += 1
            raise httpx.ConnectError("request dropped", request=request)
        response = self.inner.handle_request(request)
        if self.rng.random() < self.p_reply:
            response.read()
            response.close()
            self.dropped_replies += 1
            raise httpx.ReadError("reply dropped", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def policy(obs: np.ndarray, k: int, t: int) -> np.ndarray:
    """Feedback on the observation, so one wrong step would change everything after it."""
    joints = np.clip(0.6 * obs[8:15] + 0.2 * np.sin(k + t + obs[:7]), -1, 1)
    return np.append(joints, 0.5 + 0.4 * np.sin(t)).astype(np.float32)


def rollout(client: RolloutClient, k: int) -> tuple[list[np.ndarray], dict, np.ndarray]:
    sid, obs = client.create_session("toy", seed=k, session_id=f"{client.tag}-{k}")  # type: ignore[attr-defined]
    trajectory = [obs]
    for t in range(STEPS):
        obs = client.step(sid, t, policy(obs, k, t)).observation
        trajectory.append(obs)
    status = client.status(sid)
    probe = client.step(sid, STEPS, policy(obs, k, STEPS)).observation  # the server-side state itself
    return trajectory, status, probe


def run_all(url: str, faulty: bool) -> tuple[list, list[FlakyNetwork]]:
    networks: list[FlakyNetwork] = []

    def worker(w: int) -> list:
        transport = FlakyNetwork(seed=w) if faulty else httpx.HTTPTransport()
        if faulty:
            networks.append(transport)  # type: ignore[arg-type]
        with RolloutClient(url, transport=transport, backoff_s=0.001, max_retries=30) as client:
            client.tag = f"{'f' if faulty else 'c'}{w}"  # type: ignore[attr-defined]
            return [rollout(client, k) for k in range(w, ROLLOUTS, THREADS)]

    with ThreadPoolExecutor(THREADS) as pool:
        per_worker = list(pool.map(worker, range(THREADS)))
    by_rollout = {
        k: r
        for w, runs in enumerate(per_worker)
        for k, r in zip(range(w, ROLLOUTS, THREADS), runs, strict=True)
    }
    return [by_rollout[k] for k in range(ROLLOUTS)], networks


@pytest.fixture(scope="module")
def url():
    settings = ServerSettings(max_batch_wait_ms=1.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        yield server.http_url


def test_dropped_requests_and_replies_change_no_committed_trajectory(url: str) -> None:
    clean, _ = run_all(url, faulty=False)
    flaky, networks = run_all(url, faulty=True)
    assert sum(n.dropped_replies for n in networks) > 20  # the faults really happened...
    assert sum(n.dropped_requests for n in networks) > 20
    for (c_traj, c_status, c_probe), (f_traj, f_status, f_probe) in zip(clean, flaky, strict=True):
        assert len(f_traj) == STEPS + 1
        for c_obs, f_obs in zip(c_traj, f_traj, strict=True):
            np.testing.assert_array_equal(c_obs, f_obs)
        assert f_status["committed_step_id"] == c_status["committed_step_id"] == STEPS - 1
        assert f_status["context_length"] == STEPS  # each step committed exactly once
        np.testing.assert_array_equal(c_probe, f_probe)


def test_vector_env_batch_steps_survive_faults(url: str) -> None:
    def run(transport: httpx.BaseTransport) -> list[np.ndarray]:
        client = RolloutClient(url, transport=transport, backoff_s=0.001, max_retries=30)
        venv = RolloutVectorEnv(4, client=client, max_episode_steps=8)
        try:
            obs, _ = venv.reset(seed=100)
            seen = [obs]
            for t in range(20):
                obs = venv.step(np.stack([policy(o, k, t) for k, o in enumerate(obs)]))[0]
                seen.append(obs)
            return seen
        finally:
            venv.close()
            client.close()

    network = FlakyNetwork(seed=7, p_request=0.2, p_reply=0.2)
    for clean, flaky in zip(run(httpx.HTTPTransport()), run(network), strict=True):
        np.testing.assert_array_equal(clean, flaky)
    assert network.dropped_replies > 3 and network.dropped_requests > 3


def test_a_world_that_acts_by_itself_survives_faults_with_the_same_actions() -> None:
    """Empty actions through the flaky network: the world's chosen actions and the trajectories are
    those of a fault-free run (the choice depends only on the committed state; replays return it)."""
    from rollserve.models.simple_policies import chunk_policy
    from rollserve.models.world_action import ActingWorld

    settings = ServerSettings(max_batch_wait_ms=1.0)
    world = ActingWorld(ToyWorld(), chunk_policy(state_dim=15, action_dim=8, chunk_size=6), execute=3)

    def run(transport: httpx.BaseTransport, tag: str) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        with RolloutClient(base, transport=transport, backoff_s=0.001, max_retries=30) as client:
            for k in range(4):
                sid, _ = client.create_session("toy", seed=k, session_id=f"{tag}-{k}")
                for t in range(15):
                    result = client.step(sid, t, None)
                    out.append((result.actions, result.observation))
                status = client.status(sid)
                assert (status["committed_step_id"], status["context_length"]) == (14, 15)
        return out

    with serving(create_app(settings, rollout=RolloutService(world, settings))) as server:
        base = server.http_url
        network = FlakyNetwork(seed=11, p_request=0.2, p_reply=0.2)
        clean, flaky = run(httpx.HTTPTransport(), "clean"), run(network, "flaky")
    assert network.dropped_replies > 5 and network.dropped_requests > 5
    for (c_action, c_obs), (f_action, f_obs) in zip(clean, flaky, strict=True):
        np.testing.assert_array_equal(c_action, f_action)
        np.testing.assert_array_equal(c_obs, f_obs)


def test_the_video_world_survives_faults_with_identical_latents_states_and_frames() -> None:
    """The learned video world, rendering, through the flaky network: every latent, predicted state
    and decoded frame equals the fault-free run's (a step runs once; a lost reply is replayed)."""
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)

    def run(transport: httpx.BaseTransport, tag: str) -> list[tuple[np.ndarray, ...]]:
        out = []
        with RolloutClient(base, transport=transport, backoff_s=0.001, max_retries=30) as client:
            for k in range(3):
                sid, first = client.open_session("video", seed=k, session_id=f"{tag}-{k}", render={})
                state = first.state
                for t in range(10):
                    action = np.r_[state[:7] + 0.05 * np.sin(k + t + state[:7]), 0.1 * t].astype(np.float32)
                    result = client.step(sid, t, action)
                    state = result.state  # feedback: one wrong step would change everything after it
                    out.append((result.observation, result.state, result.images["exterior"]))
                status = client.status(sid)
                assert (status["committed_step_id"], status["context_length"]) == (9, 10)
        return out

    with serving(create_app(settings, rollout=RolloutService(load_world("video"), settings))) as server:
        base = server.http_url
        network = FlakyNetwork(seed=5, p_request=0.2, p_reply=0.2)
        clean, flaky = run(httpx.HTTPTransport(), "clean"), run(network, "flaky")
    assert network.dropped_replies > 3 and network.dropped_requests > 3
    for c, f in zip(clean, flaky, strict=True):
        for c_part, f_part in zip(c, f, strict=True):
            np.testing.assert_array_equal(c_part, f_part)
