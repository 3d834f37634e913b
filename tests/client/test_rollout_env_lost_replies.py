"""A step whose reply is lost past the client's retries raises, but the server did apply it. The
gymnasium wrappers must not get stuck on it: the next ``step`` (with a new action, as a policy
sends) first resends the lost step unchanged, so the session's trajectory holds it exactly once,
then applies the new action. Real server, the toy world; the replies are dropped by a transport
after the server answered (as ``test_rollout_faults.py`` does, here on demand).

Expected observations follow the toy world's rule, computed here: the joints and gripper move
halfway to the action each step (``obs[:8] += 0.5 * (action - obs[:8])``), the action clipped to
its bounds ([-1, 1] per joint, [0, 1] for the gripper).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from toy_rule import moved

from rollserve.client.rollout_client import RolloutClient
from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

RETRIES = 2  # so a lost step is 3 lost replies: the first try and both retries


class DropReplies(httpx.HTTPTransport):
    """Forwards every request; the server does the work, but the replies of the next ``drops``
    requests to a path ending in ``suffix`` are lost (the client sees a read error)."""

    def __init__(self, suffix: str) -> None:
        super().__init__()
        self.suffix, self.drops, self.dropped = suffix, 0, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith(self.suffix) and self.drops > 0:
            self.drops -= 1
            self.dropped += 1
            response.read()
            response.close()
            raise httpx.ReadError("reply lost", request=request)
        return response

    def lose_next_step(self) -> None:
        """Lose every reply of the next step call (first try and retries)."""
        self.drops = RETRIES + 1


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        yield server.http_url


def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to float32 rounding (the server computes in float32, the test too, in another order)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def action(value: float) -> np.ndarray:
    return np.full(8, value, dtype=np.float32)


def single(url: str, transport: DropReplies, **kwargs: int) -> RolloutEnv:
    client = RolloutClient(url, transport=transport, max_retries=RETRIES, backoff_s=0.001)
    return RolloutEnv(client=client, **kwargs)


def committed(env: RolloutEnv, session_id: str | None = None) -> tuple[int, int]:
    status = env.client.status(session_id or env.session_id)  # type: ignore[arg-type]
    return status["committed_step_id"], status["context_length"]


def test_the_step_after_a_lost_reply_settles_it_then_applies_the_new_action(url: str) -> None:
    transport = DropReplies("/step")
    env = single(url, transport)
    try:
        start, _ = env.reset(seed=0)
        env.step(action(0.1))
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            env.step(action(0.2))
        assert transport.dropped == 3 and committed(env) == (1, 2)  # the server did apply it
        obs, reward, terminated, truncated, info = env.step(action(0.3))  # a new action
        assert_near(obs, moved(start, action(0.1), action(0.2), action(0.3)))
        assert (terminated, truncated, info) == (False, False, {})
        assert reward == pytest.approx(-np.linalg.norm(obs[:7] - obs[8:15]), rel=1e-6)
        assert committed(env) == (2, 3)  # the lost step is in the trajectory once
        obs, *_ = env.step(action(0.4))
        assert_near(obs, moved(start, *map(action, (0.1, 0.2, 0.3, 0.4))))
        assert committed(env) == (3, 4)
    finally:
        env.close()


def test_a_failed_settling_resend_stays_pending_and_the_next_step_settles_it(url: str) -> None:
    transport = DropReplies("/step")
    env = single(url, transport)
    try:
        start, _ = env.reset(seed=1)
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            env.step(action(0.2))
        transport.lose_next_step()  # the resend's replies are lost too: the step raises again
        with pytest.raises(httpx.TransportError):
            env.step(action(0.5))
        assert committed(env) == (0, 1)  # step 0 once; the 0.5 was never sent
        obs, *_ = env.step(action(0.7))
        assert_near(obs, moved(start, action(0.2), action(0.7)))
        assert committed(env) == (1, 2)
    finally:
        env.close()


def test_a_reset_drops_the_lost_step_of_the_old_episode(url: str) -> None:
    transport = DropReplies("/step")
    env = single(url, transport)
    try:
        env.reset(seed=2)
        env.step(action(0.1))
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            env.step(action(0.2))
        start, _ = env.reset(seed=3)
        obs, *_ = env.step(action(0.3))
        assert_near(obs, moved(start, action(0.3)))
        assert committed(env) == (0, 1)  # the new episode holds only its own step
    finally:
        env.close()


def test_a_lost_step_that_ended_the_episode_is_reported_by_the_next_step(url: str) -> None:
    transport = DropReplies("/step")
    env = single(url, transport, max_episode_steps=2)
    try:
        start, _ = env.reset(seed=4)
        env.step(action(0.1))
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            env.step(action(0.2))  # step 1 of 2: it truncated the episode
        obs, _, terminated, truncated, info = env.step(action(0.9))
        assert_near(obs, moved(start, action(0.1), action(0.2)))
        assert (terminated, truncated, info) == (False, True, {"settled_step": 1})
        assert committed(env) == (1, 2)  # the 0.9 was not applied to the ended episode
    finally:
        env.close()


def vector(url: str, transport: DropReplies, **kwargs: int) -> RolloutVectorEnv:
    client = RolloutClient(url, transport=transport, max_retries=RETRIES, backoff_s=0.001)
    return RolloutVectorEnv(2, client=client, **kwargs)


def vector_committed(venv: RolloutVectorEnv) -> list[tuple[int, int]]:
    statuses = [venv.client.status(s.session_id) for s in venv._sessions]  # type: ignore[arg-type]
    return [(s["committed_step_id"], s["context_length"]) for s in statuses]


def test_the_vector_step_after_a_lost_batch_reply_settles_it_then_applies_the_new_actions(url: str) -> None:
    transport = DropReplies("/batch_step/columns")  # what the vector env sends (no frames)
    venv = vector(url, transport)
    try:
        start, _ = venv.reset(seed=10)
        venv.step(np.stack([action(0.1), action(-0.1)]))
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            venv.step(np.stack([action(0.2), action(-0.2)]))
        assert vector_committed(venv) == [(1, 2), (1, 2)]
        obs, _, terminated, truncated, info = venv.step(np.stack([action(0.3), action(-0.3)]))
        for i, sign in enumerate((1, -1)):
            expected = moved(start[i], *(action(sign * v) for v in (0.1, 0.2, 0.3)))
            assert_near(obs[i], expected)
        assert not terminated.any() and not truncated.any() and info == {}
        assert vector_committed(venv) == [(2, 3), (2, 3)]
    finally:
        venv.close()


def test_a_lost_vector_step_that_ended_the_episodes_is_reported_then_they_autoreset(url: str) -> None:
    transport = DropReplies("/batch_step/columns")  # what the vector env sends (no frames)
    venv = vector(url, transport, max_episode_steps=2)
    try:
        start, _ = venv.reset(seed=20)
        venv.step(np.stack([action(0.1), action(0.1)]))
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            venv.step(np.stack([action(0.2), action(0.2)]))
        obs, rewards, terminated, truncated, info = venv.step(np.stack([action(0.9), action(0.9)]))
        for i in range(2):
            assert_near(obs[i], moved(start[i], action(0.1), action(0.2)))
            assert rewards[i] == pytest.approx(-np.linalg.norm(obs[i, :7] - obs[i, 8:15]), rel=1e-6)
        assert truncated.tolist() == [True, True] and not terminated.any()
        assert info["settled_step"].tolist() == [1, 1] and info["_settled_step"].tolist() == [True, True]
        assert vector_committed(venv) == [(1, 2), (1, 2)]  # the 0.9s were not applied
        venv.step(np.stack([action(0.3), action(0.3)]))  # the autoreset
        assert vector_committed(venv) == [(-1, 0), (-1, 0)]
    finally:
        venv.close()


def test_a_lost_step_of_a_session_closed_since_truncates_and_the_reset_starts_clean(url: str) -> None:
    transport = DropReplies("/step")
    env = single(url, transport)
    try:
        start, _ = env.reset(seed=5)
        transport.lose_next_step()
        with pytest.raises(httpx.TransportError):
            env.step(action(0.2))
        env.client.close_session(env.session_id)  # type: ignore[arg-type]
        obs, reward, terminated, truncated, info = env.step(action(0.3))  # the resend finds it gone
        np.testing.assert_array_equal(obs, start)  # the last observation the env returned
        assert (reward, terminated, truncated, info) == (0.0, False, True, {"session_lost": "session_closed"})
        start, _ = env.reset(seed=6)
        obs, *_ = env.step(action(0.4))
        assert_near(obs, moved(start, action(0.4)))
        assert committed(env) == (0, 1)
    finally:
        env.close()
