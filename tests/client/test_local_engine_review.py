"""What the in-process engine's chunk source hands the policy and reads from it, which its first
mutation run (`local_engine` in tools/mutation.py) found unchecked: the configured task reaching the
policy (unless the observation names its own), what the source serves (chunk size, action count,
horizon, RTC), each episode's fresh processors from the policy, and the config the loop runs on.

The policy is the real numpy ``ChunkPolicy``, run through the server's own request path."""

from __future__ import annotations

import numpy as np

from rollserve.client import EngineConfig, LocalInferenceEngine
from rollserve.client.inference_loop import ChunkRequest, SourceInfo
from rollserve.client.local_engine import LocalChunkSource
from rollserve.models.policy import Processors
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.rtc import RTCConfig

STATE = np.array([0.5, -0.25, 0.125, 1.0, -1.0, 0.0], np.float32)


class CountingPolicy(ChunkPolicy):
    """``ChunkPolicy`` that counts the processor pairs it makes (one per session or episode)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(record_calls=True, **kwargs)  # type: ignore[arg-type]
        self.made = 0

    def make_processors(self) -> Processors:
        self.made += 1
        return super().make_processors()


def _request(observation: dict[str, object], seq_id: int = 0) -> ChunkRequest:
    return ChunkRequest(observation, 0, None, None, seq_id, 0)


def test_the_sources_task_reaches_the_policy_unless_the_observation_names_one() -> None:
    policy = CountingPolicy()
    source = LocalChunkSource(policy, task="stack the cube")
    source.infer(_request({"state": STATE}))
    source.infer(_request({"state": STATE, "task": "wipe"}, seq_id=1))
    assert [call["task"] for call in policy.calls] == ["stack the cube", "wipe"]


def test_the_engines_configured_task_reaches_the_policy() -> None:
    policy = CountingPolicy()
    config = EngineConfig(task="open the drawer")
    engine = LocalInferenceEngine(policy, config)
    assert engine.config is config
    engine.source.infer(_request({"state": STATE}))
    assert policy.calls[-1]["task"] == "open the drawer"


def test_the_source_serves_what_the_policy_says() -> None:
    policy = ChunkPolicy(action_dim=4, chunk_size=12, execution_horizon=5)
    assert LocalChunkSource(policy).connect() == SourceInfo(12, 4, 5, True)
    assert LocalChunkSource(policy, execution_horizon=3).connect() == SourceInfo(12, 4, 3, True)


def test_each_episode_gets_fresh_processors_from_the_policy() -> None:
    policy = CountingPolicy()
    source = LocalChunkSource(policy)
    assert policy.made == 1
    source.reset(1)
    assert policy.made == 2
    reply = source.infer(_request({"state": STATE}))
    # the policy's processors, not the identity: the chunk is scaled into robot space
    np.testing.assert_array_equal(reply.chunk_robot, policy.actions_to_robot(reply.chunk_model))
    assert not np.array_equal(reply.chunk_robot, reply.chunk_model)


def test_the_engines_horizon_comes_from_an_rtc_the_config_sets() -> None:
    policy = ChunkPolicy(chunk_size=20, execution_horizon=10)
    engine = LocalInferenceEngine(policy, EngineConfig(rtc=RTCConfig(enabled=True, execution_horizon=4)))
    assert engine.connect() == SourceInfo(20, 6, 4, True)


def test_a_source_without_a_task_gives_the_policy_an_empty_one() -> None:
    policy = CountingPolicy()
    LocalChunkSource(policy).infer(_request({"state": STATE}))
    assert policy.calls[-1]["task"] == ""
