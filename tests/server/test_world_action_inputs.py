"""Review s10 item 3: a world-action world's policy gets the step's prompt and images, over real HTTP.

A step without an action makes the world ask its policy for a chunk. A served VLA plans from the task
text and the robot's cameras, so the prompt (as the batch's ``task``) and the images the request
carries (under the policy's camera names) must reach it; the plan's noise stays seeded from the
committed state alone. Expected values are computed here: the prompt and the image bytes as sent, the
seed as sha256 of the state's little-endian float32 bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient
from rollserve.models.policy import PolicyRequest
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.models.world_action import ActingWorld
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SETTINGS = ServerSettings(max_batch_wait_ms=0.0)
PROMPT = "put the red cube on the green target"
EXTERIOR = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
WRIST = np.full((8, 8, 3), 7, np.uint8)


class SeedRecordingPolicy(ChunkPolicy):
    """The chunk policy, recording each call's inputs (``calls``) and noise seed (``seeds``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(record_calls=True, **kwargs)
        self.seeds: list[int | None] = []

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        self.seeds.extend(request.batch.get("seed") for request in requests)
        return super().predict_action_chunks(requests)


@pytest.fixture
def served() -> Iterator[tuple[SeedRecordingPolicy, str]]:
    policy = SeedRecordingPolicy(state_dim=15, action_dim=8, chunk_size=4, camera_names=("exterior",))
    service = RolloutService(ActingWorld(ToyWorld(), policy, execute=4), SETTINGS)
    with serving(create_app(SETTINGS, rollout=service)) as server:
        yield policy, server.http_url


def _seed(state: np.ndarray) -> int:
    digest = hashlib.sha256(np.ascontiguousarray(state, dtype="<f4").tobytes()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _sha(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


def test_the_policy_plans_with_the_steps_prompt_and_its_camera_images(
    served: tuple[SeedRecordingPolicy, str],
) -> None:
    policy, url = served
    observation = {"prompt": PROMPT, "images": {"exterior": EXTERIOR, "wrist": WRIST}}
    with RolloutClient(url) as client:
        sid, start = client.create_session("toy", seed=3)
        result = client.step(sid, 0, None, observation=observation)
    assert result.actions is not None and result.actions.shape == (1, 8)
    (call,) = policy.calls
    assert call["task"] == PROMPT
    assert call["images"] == {"exterior": _sha(EXTERIOR)}  # only the policy's own cameras
    assert policy.seeds == [_seed(np.asarray(start, np.float32))]  # noise from the state alone


def test_a_step_without_a_prompt_plans_with_an_empty_task_and_no_images(
    served: tuple[SeedRecordingPolicy, str],
) -> None:
    policy, url = served
    with RolloutClient(url, use_msgpack=False) as client:
        sid, _ = client.create_session("toy", seed=3)
        client.step(sid, 0, None)
    (call,) = policy.calls
    assert (call["task"], call["images"]) == ("", {})


def test_twins_with_the_same_prompt_act_alike_and_the_prompt_does_not_move_the_seed(
    served: tuple[SeedRecordingPolicy, str],
) -> None:
    policy, url = served
    with RolloutClient(url) as client:
        first, _ = client.create_session("toy", seed=4)
        twin, _ = client.create_session("toy", seed=4)
        other, _ = client.create_session("toy", seed=4)
        a = client.step(first, 0, None, observation={"prompt": PROMPT})
        b = client.step(twin, 0, None, observation={"prompt": PROMPT})
        client.step(other, 0, None, observation={"prompt": "another task"})
        replay = client.step(first, 0, None, observation={"prompt": PROMPT})  # a duplicate: stored result
    np.testing.assert_array_equal(a.actions, b.actions)  # type: ignore[arg-type]
    np.testing.assert_array_equal(replay.actions, a.actions)  # type: ignore[arg-type]
    assert [call["task"] for call in policy.calls] == [PROMPT, PROMPT, "another task"]
    assert len(set(policy.seeds)) == 1  # one start state, one seed, whatever the prompt
