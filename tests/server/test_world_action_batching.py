"""A world-action session's actions do not depend on how its steps were batched (real HTTP).

Session A steps alone with ``step``; its twin B (same seed) steps through ``batch_step`` together
with two other acting sessions, so every plan B needs is computed next to theirs. The reference
policy's batched forward pass rounds differently with the batch's size (~1e-7), and the next plan's
noise seed hashes the exact state bits, so a world that planned the batch in one policy call split
the twins within one chunk. The ``sim`` world steps exactly, so the twins must be bit-equal.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rollserve.client.rollout_client import RolloutClient, StepCall
from rollserve.models.checkpoint import load_default
from rollserve.models.sim_world import SimWorld
from rollserve.models.world_action import DEFAULT_EXECUTE, ActingWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SETTINGS = ServerSettings(max_batch_wait_ms=0.0)
STEPS = 2 * DEFAULT_EXECUTE  # two plans each: the second from a state the first batched plan made


@pytest.fixture(scope="module")
def acting_sim() -> Iterator[str]:
    torch.set_num_threads(1)
    world = ActingWorld(SimWorld(), load_default())
    with serving(create_app(SETTINGS, rollout=RolloutService(world, SETTINGS))) as server:
        yield server.http_url


def test_a_session_batched_with_others_acts_exactly_as_its_twin_stepped_alone(acting_sim: str) -> None:
    with RolloutClient(acting_sim) as client:
        alone, _ = client.create_session("sim", seed=7)
        batched, _ = client.create_session("sim", seed=7)
        others = [client.create_session("sim", seed=seed)[0] for seed in (1, 2)]
        for t in range(STEPS):
            want = client.step(alone, t, None)
            results = client.batch_step([StepCall(sid, t, None) for sid in (batched, *others)])
            got = results[0]
            assert not isinstance(got, Exception), got
            assert want.actions is not None and got.actions is not None
            np.testing.assert_array_equal(got.actions, want.actions, err_msg=f"step {t}")
            np.testing.assert_array_equal(got.observation, want.observation, err_msg=f"step {t}")
