"""``RolloutVectorEnv.step`` returns the world's per-step ``info`` (the learned world's ``success``)
batched as gymnasium's vector envs do: an array per key and its ``_key`` mask. It returned an empty
dict, while ``RolloutEnv`` passed the world's info through, so a vectorised trainer could not count
successes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rollserve.client.rollout_env import RolloutEnv, RolloutVectorEnv
from rollserve.models.worlds import load_world
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SEEDS = [7, 8]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("learned"), settings))) as server:
        yield server.http_url


def test_vector_infos_are_the_single_envs_infos_batched(url: str) -> None:
    envs = [RolloutEnv(url) for _ in SEEDS]
    venv = RolloutVectorEnv(len(SEEDS), url)
    try:
        obs = [env.reset(seed=seed)[0] for env, seed in zip(envs, SEEDS, strict=True)]
        venv.reset(seed=SEEDS)
        for _ in range(3):
            actions = np.stack([np.r_[o[:7] + 0.05, 1.0] for o in obs]).astype(np.float32)
            outs = [env.step(a) for env, a in zip(envs, actions, strict=True)]
            _, _, _, _, infos = venv.step(actions)
            obs = [out[0] for out in outs]
            single = [out[4] for out in outs]
            assert all("success" in info for info in single)  # the learned world reports it
            np.testing.assert_array_equal(infos["success"], [info["success"] for info in single])
            np.testing.assert_array_equal(infos["_success"], [True, True])
    finally:
        venv.close()
        for env in envs:
            env.close()
