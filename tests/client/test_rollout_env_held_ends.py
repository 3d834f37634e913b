"""No episode end of a ``RolloutVectorEnv`` is lost when a ``step`` raises.

A ``step`` can record an episode end and still raise: a settled lost step ended sub-env 0's episode
and then the batch of new actions failed (its replies lost, or one item refused), or sub-env 0's
step ended its episode in a batch where another item was refused. That end must still reach the
caller: the next ``step`` that returns reports it (sub-env 0 applies no new action), and sub-env 0
autoresets on the one after, as gymnasium's next-step autoreset does. Before, sub-env 0 autoreset
at once and the caller never saw ``terminated``. Likewise a sub-env that autoreset in a ``step``
that raised reports its new episode's first observation on the next ``step`` (applying no action);
before, that observation was lost and the caller's next action went to an episode it never saw.

Real server; a toy world whose episode ends when the gripper is commanded fully closed (1.0), so
one sub-env can end while the other goes on. Expected observations follow the toy world's rule,
computed here: joints and gripper move halfway to the (clipped) action each step.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from ending_toy_world import go, serving_ending_toy_world
from toy_rule import moved

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.client.rollout_env import RolloutVectorEnv

RETRIES = 2  # a lost batch is 3 lost replies: the first try and both retries
LOST = [True] * (RETRIES + 1)


class DropPlanned(httpx.HTTPTransport):
    """Forwards every request; the server does the work. Each ``batch_step`` (items or columns)
    takes the next entry of ``plan``: True loses its reply (the client sees a read error), False
    (or none left) passes."""

    def __init__(self) -> None:
        super().__init__()
        self.plan: list[bool] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if "/batch_step" in request.url.path and self.plan and self.plan.pop(0):
            response.read()
            response.close()
            raise httpx.ReadError("reply lost", request=request)
        return response


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving_ending_toy_world() as served:
        yield served


END = go(1.0)  # joints to 1.0, gripper closed: ends the episode
NAN = np.full(8, np.nan, dtype=np.float32)  # refused by the server: that item fails


def reward_of(obs: np.ndarray) -> float:
    return float(-np.linalg.norm(obs[:7] - obs[8:15]))


def vector(url: str, transport: DropPlanned) -> RolloutVectorEnv:
    client = RolloutClient(url, transport=transport, max_retries=RETRIES, backoff_s=0.001)
    return RolloutVectorEnv(2, client=client)


def committed(venv: RolloutVectorEnv) -> list[int]:
    return [venv.client.status(s.session_id)["committed_step_id"] for s in venv._sessions]  # type: ignore[arg-type]


def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("failure", ["replies_lost", "item_refused"])
def test_a_settled_episode_end_survives_a_failed_batch_of_new_actions(url: str, failure: str) -> None:
    transport = DropPlanned()
    venv = vector(url, transport)
    try:
        start, _ = venv.reset(seed=30)
        transport.plan = list(LOST)
        with pytest.raises(httpx.TransportError):
            venv.step(np.stack([END, go(0.1)]))  # applied: sub-env 0's episode ended
        assert committed(venv) == [0, 0]
        # The settling batch answers; the new actions' batch fails.
        if failure == "replies_lost":
            transport.plan = [False, *LOST]
            with pytest.raises(httpx.TransportError):
                venv.step(np.stack([go(0.5), go(0.2)]))
            sub1 = (go(0.1), go(0.2), go(0.3))  # the lost 0.2 is settled by the next step
        else:
            with pytest.raises(RolloutRequestError) as refused:
                venv.step(np.stack([go(0.5), NAN]))
            assert refused.value.code == "invalid_request"
            sub1 = (go(0.1), go(0.3))
        obs, rewards, terminated, truncated, info = venv.step(np.stack([go(0.7), go(0.3)]))
        assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
        assert_near(obs[0], moved(start[0], END))
        assert rewards[0] == pytest.approx(reward_of(obs[0]), rel=1e-6)
        assert info["settled_step"][0] == 0 and info["_settled_step"].tolist() == [True, False]
        assert_near(obs[1], moved(start[1], *sub1))
        assert committed(venv) == [0, len(sub1) - 1]  # sub-env 0 applied neither 0.5 nor 0.7
        obs, _, terminated, truncated, info = venv.step(np.stack([go(0.4), go(0.4)]))
        assert committed(venv) == [-1, len(sub1)]  # now sub-env 0 autoresets
        assert not terminated.any() and not truncated.any() and "settled_step" not in info
    finally:
        venv.close()


def test_an_episode_end_in_a_batch_with_a_refused_item_is_reported_by_the_next_step(url: str) -> None:
    transport = DropPlanned()
    venv = vector(url, transport)
    try:
        start, _ = venv.reset(seed=40)
        with pytest.raises(RolloutRequestError):
            venv.step(np.stack([END, NAN]))  # sub-env 0 ends; sub-env 1's item is refused
        assert committed(venv) == [0, -1]
        obs, rewards, terminated, truncated, info = venv.step(np.stack([go(0.7), go(0.3)]))
        assert terminated.tolist() == [True, False] and not truncated.any()
        assert_near(obs[0], moved(start[0], END))
        assert rewards[0] == pytest.approx(reward_of(obs[0]), rel=1e-6)
        assert info["reported_late"].tolist()[0] is True and info["_reported_late"].tolist() == [True, False]
        assert_near(obs[1], moved(start[1], go(0.3)))
        assert committed(venv) == [0, 0]
        venv.step(np.stack([go(0.4), go(0.4)]))
        assert committed(venv) == [-1, 1]
    finally:
        venv.close()


def test_a_held_episode_end_survives_a_second_failed_step_and_a_reset_drops_it(url: str) -> None:
    transport = DropPlanned()
    venv = vector(url, transport)
    try:
        venv.reset(seed=50)
        with pytest.raises(RolloutRequestError):
            venv.step(np.stack([END, NAN]))
        with pytest.raises(RolloutRequestError):
            venv.step(np.stack([go(0.7), NAN]))  # fails again: sub-env 0's end is still held
        _, _, terminated, *_ = venv.step(np.stack([go(0.7), go(0.3)]))
        assert terminated.tolist() == [True, False]
        venv.step(np.stack([go(0.2), go(0.2)]))  # sub-env 0 autoresets
        with pytest.raises(RolloutRequestError):
            venv.step(np.stack([END, NAN]))  # held again
        venv.reset(seed=60)  # a reset starts new episodes: nothing held is reported after it
        _, _, terminated, truncated, info = venv.step(np.stack([go(0.2), go(0.2)]))
        assert not terminated.any() and not truncated.any() and info == {}
        assert committed(venv) == [0, 0]
    finally:
        venv.close()


def toy_start(seed: int) -> np.ndarray:
    """The toy world's first observation from ``seed`` (its rule, written out here)."""
    rng = np.random.default_rng(seed)
    joints, target = rng.uniform(-0.5, 0.5, 7), rng.uniform(-0.9, 0.9, 7)
    return np.concatenate([joints, [0.0], target]).astype(np.float32)


def autoreset_seed(seed: int) -> int:
    """The seed of a sub-env's first autoreset after ``reset(seed=...)`` gave it ``seed``: the first
    draw of a generator seeded with it (gymnasium's ``np_random``), as ``SyncVectorEnv`` does."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    return int(rng.integers(2**31))


def fail_step_of_sub_env_1(venv: RolloutVectorEnv, transport: DropPlanned, failure: str) -> None:
    """A ``step`` that raises: sub-env 1's item is refused, or the batch's replies are all lost."""
    if failure == "replies_lost":
        transport.plan = list(LOST)
        with pytest.raises(httpx.TransportError):
            venv.step(np.stack([go(0.5), go(0.2)]))
    else:
        with pytest.raises(RolloutRequestError):
            venv.step(np.stack([go(0.5), NAN]))


@pytest.mark.parametrize("failures", [1, 2], ids=["once", "twice"])
@pytest.mark.parametrize("failure", ["item_refused", "replies_lost"])
def test_an_autoreset_in_a_step_that_raises_is_reported_by_the_next_step(
    url: str, failure: str, failures: int
) -> None:
    """Sub-env 0 autoresets in a ``step`` that raises: its new episode's first observation still
    reaches the caller, from the next ``step`` that returns (no action applied to it, reward 0, no
    end, ``info["reported_late"]``), and its new episode steps from there on the one after."""
    transport = DropPlanned()
    venv = vector(url, transport)
    try:
        start, _ = venv.reset(seed=70)
        _, _, terminated, *_ = venv.step(np.stack([END, go(0.1)]))  # sub-env 0's episode ends
        assert terminated.tolist() == [True, False]
        sub1 = [go(0.1)]
        for _ in range(failures):  # sub-env 0 autoresets, then the step raises
            fail_step_of_sub_env_1(venv, transport, failure)
            assert committed(venv)[0] == -1
        if failure == "replies_lost":  # the first lost step: a second failing step lost its resend
            sub1.append(go(0.2))  # applied by the server, settled by the next step
        first = toy_start(autoreset_seed(70))
        obs, rewards, terminated, truncated, info = venv.step(np.stack([go(0.7), go(0.3)]))
        sub1.append(go(0.3))
        assert_near(obs[0], first)  # the new episode's first observation, not moved(first, 0.7)
        assert rewards[0] == 0.0 and not terminated.any() and not truncated.any()
        assert info["reported_late"][0] is np.True_ and info["_reported_late"].tolist() == [True, False]
        assert_near(obs[1], moved(start[1], *sub1))
        assert committed(venv) == [-1, len(sub1) - 1]  # sub-env 0 applied no action
        obs, *_ = venv.step(np.stack([go(0.4), go(0.4)]))  # the new episode steps from ``first``
        assert_near(obs[0], moved(first, go(0.4)))
        assert committed(venv) == [0, len(sub1)]
    finally:
        venv.close()
