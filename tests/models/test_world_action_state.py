"""A world-action model's policy sees the world's state vector, whatever the observation tensor is.

A rendering ``sim`` session observes its first camera's frame and sends the state vector next to
it; the ``video`` world observes a latent and always sends the state vector. The policy must plan
from that vector (never the frame or the latent), so ``Action()`` works on every session and a
rendering session acts exactly as a plain one from the same seed. The expected actions are computed
here from the policy alone: its chunk for the state before each planning step, with noise seeded
from that state's float32 bytes, played ``execute`` actions per chunk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rollserve.client.rollout_client import Observed, RolloutClient
from rollserve.models.checkpoint import load_default
from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.sim_world import SimWorld
from rollserve.models.world import WorldInit, WorldModel, WorldStep
from rollserve.models.world_action import DEFAULT_EXECUTE, ActingWorld
from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SETTINGS = ServerSettings(max_batch_wait_ms=0.0)
SIM_RENDER = {"cameras": ["exterior", "wrist"], "height": 32, "width": 32}
VIDEO_RENDER = {"cameras": ["exterior"], "height": 64, "width": 64}
STEPS = DEFAULT_EXECUTE + 2  # one full chunk, then a plan from a later committed state


@pytest.fixture(scope="module")
def reference() -> FlowMatchingPolicy:
    """The test's own copy of the reference policy (the server acts with another one)."""
    torch.set_num_threads(1)
    return load_default()


def serve(world: WorldModel) -> Iterator[str]:
    with serving(create_app(SETTINGS, rollout=RolloutService(world, SETTINGS))) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def acting_sim(reference) -> Iterator[str]:
    yield from serve(ActingWorld(SimWorld(), load_default()))


@pytest.fixture(scope="module")
def acting_video(reference) -> Iterator[str]:
    yield from serve(ActingWorld(load_world("video"), load_default()))


def planned(policy: FlowMatchingPolicy, state: np.ndarray) -> np.ndarray:
    """The robot-space chunk the policy predicts for ``state``, noise seeded from its bytes."""
    state = np.asarray(state, dtype=np.float32)
    digest = hashlib.sha256(np.ascontiguousarray(state, dtype="<f4").tobytes()).digest()
    batch = policy.preprocess({"state": state})
    batch["seed"] = int.from_bytes(digest[:8], "little") >> 1
    return np.asarray(policy.actions_to_robot(policy.predict_action_chunk(batch)), dtype=np.float32)


def expected_actions(policy: FlowMatchingPolicy, states: list[np.ndarray]) -> np.ndarray:
    """The action of each step, given the state before it: a new chunk every ``execute`` steps."""
    actions = []
    for t, state in enumerate(states):
        if t % DEFAULT_EXECUTE == 0:
            chunk = planned(policy, state)
        actions.append(chunk[t % DEFAULT_EXECUTE])
    return np.stack(actions)


def state_of(observed: Observed) -> np.ndarray:
    """The state vector: next to the tensor when the world sends one, else the tensor itself."""
    return observed.state if observed.state is not None else observed.tensor


def act(url: str, model: str, seed: int, render: dict | None, steps: int = STEPS) -> tuple[np.ndarray, list]:
    """Drive a session with ``Action()`` only: the actions it chose and the state before each step."""
    with RolloutClient(url) as client:
        sid, first = client.open_session(model, seed=seed, render=render)
        states, actions = [state_of(first)], []
        for t in range(steps):
            result = client.step(sid, t, None)
            assert result.actions is not None and result.actions.shape == (1, 8)
            actions.append(result.actions[0])
            states.append(result.state if result.state is not None else result.observation)
            if render is not None:
                assert set(result.images or {}) == set(render["cameras"])
        client.close_session(sid)
    return np.stack(actions), states[:-1]


def test_a_rendering_sim_session_acts_on_its_state_vector(acting_sim, reference) -> None:
    actions, states = act(acting_sim, "sim", 5, SIM_RENDER)
    assert all(s.shape == (13,) for s in states)
    np.testing.assert_array_equal(actions, expected_actions(reference, states))


def test_a_plain_sim_session_acts_as_before_and_as_a_rendering_one(acting_sim, reference) -> None:
    plain, plain_states = act(acting_sim, "sim", 5, None)
    np.testing.assert_array_equal(plain, expected_actions(reference, plain_states))
    rendered, rendered_states = act(acting_sim, "sim", 5, SIM_RENDER)
    np.testing.assert_array_equal(rendered, plain)  # asking for frames does not change what it does
    np.testing.assert_array_equal(np.stack(rendered_states), np.stack(plain_states))


@pytest.mark.parametrize("render", [None, VIDEO_RENDER], ids=["plain", "render"])
def test_the_video_world_acts_on_its_state_vector_not_its_latent(acting_video, reference, render) -> None:
    actions, states = act(acting_video, "video", 3, render, steps=3)
    assert all(s.shape == (13,) for s in states)
    np.testing.assert_array_equal(actions, expected_actions(reference, states))


def test_the_learned_world_acts_on_its_observation_vector(reference) -> None:
    """One layer: the learned world's observation is its state vector (it sends no other)."""
    world = ActingWorld(load_world("learned"), load_default())
    first = world.initial_states([WorldInit(seed=2)])[0]
    assert first.vector is None
    out = world.step_batch([WorldStep(first.state, None)])[0]
    np.testing.assert_array_equal(out.action, planned(reference, first.observation)[0])
