"""FlowMatchingPolicy: the Policy protocols, reproducible noise, batching, processors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.flow_stats import NormStats
from rollserve.models.policy import BatchedPolicy, Policy, PolicyRequest, make_processors
from rollserve.rtc.config import RTCConfig

H, A, S = 12, 8, 5


def make_policy(seed: int = 0, **kwargs: object) -> FlowMatchingPolicy:
    torch.manual_seed(0)
    net = VelocityNet(FlowNetConfig(chunk_size=H, action_dim=A, state_dim=S, hidden_dim=32, depth=2))
    rng = np.random.default_rng(0)
    stats = NormStats.fit(rng.normal(2.0, 3.0, (100, S)), rng.normal(-1.0, 0.5, (100, A)))
    return FlowMatchingPolicy(net, stats, [f"a{i}" for i in range(A)], seed=seed, **kwargs)


@pytest.fixture(scope="module")
def policy() -> FlowMatchingPolicy:
    return make_policy()


def state(i: int) -> np.ndarray:
    return np.random.default_rng(i).normal(size=S).astype(np.float32)


def test_implements_the_protocols(policy: FlowMatchingPolicy) -> None:
    assert isinstance(policy, Policy) and isinstance(policy, BatchedPolicy)
    meta = policy.metadata
    assert (meta.chunk_size, meta.action_dim, meta.state_dim) == (H, A, S)
    assert meta.supports_rtc and meta.supports_batching


def test_chunk_shape_dtype_and_seed_reproducibility(policy: FlowMatchingPolicy) -> None:
    first = policy.predict_action_chunk({"state": state(0), "seed": 7})
    again = policy.predict_action_chunk({"state": state(0), "seed": 7})
    other = policy.predict_action_chunk({"state": state(0), "seed": 8})
    assert first.shape == (H, A) and first.dtype == np.float32
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


def test_explicit_noise_equals_seeded_noise(policy: FlowMatchingPolicy) -> None:
    noise = torch.randn((H, A), generator=torch.Generator().manual_seed(5)).numpy()
    seeded = policy.predict_action_chunk({"state": state(1), "seed": 5})
    explicit = policy.predict_action_chunk({"state": state(1), "noise": noise})
    np.testing.assert_array_equal(seeded, explicit)


def test_policy_generator_is_seeded_at_construction() -> None:
    a, b = make_policy(seed=3), make_policy(seed=3)
    for _ in range(2):
        np.testing.assert_array_equal(
            a.predict_action_chunk({"state": state(2)}), b.predict_action_chunk({"state": state(2)})
        )


def requests() -> list[PolicyRequest]:
    rng = np.random.default_rng(9)
    prefix = rng.normal(size=(10, A)).astype(np.float32)
    return [
        PolicyRequest({"state": state(0), "seed": 1}),
        PolicyRequest({"state": state(1), "seed": 2}, inference_delay=3, prev_chunk_left_over=prefix),
        PolicyRequest({"state": state(2), "seed": 3}, inference_delay=0, prev_chunk_left_over=prefix[:6]),
        PolicyRequest({"state": state(3), "seed": 4}, inference_delay=10, prev_chunk_left_over=prefix),
    ]


def test_batched_equals_unbatched(policy: FlowMatchingPolicy) -> None:
    batched = policy.predict_action_chunks(requests())
    for request, chunk in zip(requests(), batched, strict=True):
        single = policy.predict_action_chunk(
            request.batch,
            inference_delay=request.inference_delay,
            prev_chunk_left_over=request.prev_chunk_left_over,
        )
        np.testing.assert_allclose(chunk, single, rtol=1e-5, atol=1e-5)


def test_batched_equals_unbatched_with_the_policy_generator() -> None:
    a, b = make_policy(seed=11), make_policy(seed=11)
    items = [PolicyRequest({"state": state(i)}) for i in range(3)]
    batched = a.predict_action_chunks(items)
    singles = [b.predict_action_chunk(item.batch) for item in items]
    np.testing.assert_allclose(np.stack(batched), np.stack(singles), rtol=1e-5, atol=1e-5)


def test_prefix_pulls_frozen_actions(policy: FlowMatchingPolicy) -> None:
    prefix = np.full((10, A), 1.5, np.float32)
    guided = policy.predict_action_chunk(
        {"state": state(4), "seed": 0}, inference_delay=4, prev_chunk_left_over=prefix
    )
    plain = policy.predict_action_chunk({"state": state(4), "seed": 0})
    assert np.abs(guided[:4] - 1.5).mean() * 5 < np.abs(plain[:4] - 1.5).mean()


def test_rtc_disabled_ignores_the_prefix_and_says_so() -> None:
    """With RTC off the policy does not advertise it (the ack's ``rtc_supported``), so a client
    neither sends prefixes nor merges as if the chunk continued them; a prefix sent anyway is ignored."""
    off = make_policy(rtc=RTCConfig(enabled=False))
    assert off.metadata.supports_rtc is False
    assert make_policy(rtc=RTCConfig(enabled=True)).metadata.supports_rtc is True
    prefix = np.full((10, A), 1.5, np.float32)
    guided = off.predict_action_chunk(
        {"state": state(4), "seed": 0}, inference_delay=4, prev_chunk_left_over=prefix
    )
    np.testing.assert_array_equal(guided, off.predict_action_chunk({"state": state(4), "seed": 0}))


def test_bad_inputs_are_refused(policy: FlowMatchingPolicy) -> None:
    with pytest.raises(ValueError):
        policy.predict_action_chunk({"state": np.zeros(S + 1, np.float32)})
    with pytest.raises(ValueError):
        policy.predict_action_chunk(
            {"state": state(0)}, prev_chunk_left_over=np.zeros((4, A + 1), np.float32)
        )
    assert policy.predict_action_chunks([]) == []


def test_processors_normalise_state_and_invert_actions(policy: FlowMatchingPolicy) -> None:
    processors = make_processors(policy)
    batch = processors.pre({"state": policy.stats.state_mean + policy.stats.state_std, "task": "place"})
    np.testing.assert_allclose(batch["state"], np.ones(S), rtol=1e-5)
    assert batch["task"] == "place" and batch["images"] == {}
    actions = np.random.default_rng(0).normal(-1.0, 0.5, (H, A)).astype(np.float32)
    np.testing.assert_allclose(
        processors.post(policy.actions_to_model(actions)), actions, rtol=1e-5, atol=1e-6
    )
    chunk = policy.predict_action_chunk(batch)
    np.testing.assert_allclose(policy.actions_to_model(processors.post(chunk)), chunk, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        processors.pre({"state": np.zeros(S + 2)})
