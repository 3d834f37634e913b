"""The shipped policies' contracts, pinned from their docs and first principles (mutation review).

The policy protocol's metadata and defaults, the errors a policy raises, the simple numpy policies
(chunk, DROID, echo) and the wide MLP, the flow policy and its velocity net, each checked against
values computed here independently of the implementation (the flow policy against the sampler it
is documented to run, bit for bit).
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.engine import policy_errors
from rollserve.engine.policy_errors import PolicyError
from rollserve.models.flow_net import FlowNetConfig, VelocityNet, time_embedding
from rollserve.models.flow_policy import DEFAULT_RTC, FlowMatchingPolicy
from rollserve.models.flow_sampling import sample_chunks
from rollserve.models.flow_stats import NormStats
from rollserve.models.loading import PolicyLoadError, load_policy
from rollserve.models.policy import (
    PolicyMetadata,
    PolicyRequest,
    Processors,
    SingleAsBatchOfOne,
    make_processors,
)
from rollserve.models.simple_policies import (
    DROID_ACTIONS,
    DROID_CAMERAS,
    LIBERO_ACTIONS,
    LIBERO_CAMERAS,
    ChunkPolicy,
    EchoPolicy,
    WideMLPPolicy,
    chunk_policy,
    droid_policy,
    echo_policy,
    wide_mlp,
)
from rollserve.rtc.config import RTCConfig
from rollserve.rtc.weights import prefix_weights

# -- the protocol ---------------------------------------------------------------------------------


def test_metadata_defaults_and_its_dict_for_clients() -> None:
    """Clients read this dict on connect: tuples become lists, no image shape is None."""
    meta = PolicyMetadata(name="p", action_names=("a", "b", "c"), chunk_size=5, state_dim=2)
    assert meta.action_dim == 3
    assert meta.to_dict() == {
        "name": "p",
        "action_names": ["a", "b", "c"],
        "chunk_size": 5,
        "state_dim": 2,
        "camera_names": [],
        "image_shape": None,
        "fps": 15.0,
        "supports_rtc": False,
        "supports_batching": False,
    }
    full = PolicyMetadata("q", ("x",), 2, 1, ("cam",), (4, 5, 3), 30.0, True, True)
    assert full.to_dict() == {
        "name": "q",
        "action_names": ["x"],
        "chunk_size": 2,
        "state_dim": 1,
        "camera_names": ["cam"],
        "image_shape": [4, 5, 3],
        "fps": 30.0,
        "supports_rtc": True,
        "supports_batching": True,
    }


def test_request_defaults_are_a_plain_call() -> None:
    """A request built from a batch alone is no delay, no prefix, no server-side padding count."""
    request = PolicyRequest({"state": 1})
    assert (request.inference_delay, request.prev_chunk_left_over, request.prefix_steps) == (0, None, None)


def test_default_processors_pass_values_through_unchanged() -> None:
    """Without a factory a session's processors are identities: the very objects come back."""
    observation: dict[str, Any] = {"state": [1.0]}
    chunk = np.ones((2, 2), np.float32)
    for processors in (Processors(), make_processors(object())):  # type: ignore[arg-type]
        assert processors.pre(observation) is observation
        assert processors.post(chunk) is chunk


def test_make_processors_calls_the_policys_factory_each_time() -> None:
    """A fresh pair per session: the factory runs once per call; a non-callable attribute is ignored."""
    made: list[Processors] = []

    class WithFactory:
        def make_processors(self) -> Processors:
            made.append(Processors(pre=lambda o: {"wrapped": o}))
            return made[-1]

    first, second = make_processors(WithFactory()), make_processors(WithFactory())  # type: ignore[arg-type]
    assert first is made[0] and second is made[1] and first is not second

    class NotCallable:
        make_processors = "not a factory"

    chunk = np.zeros(1)
    assert make_processors(NotCallable()).post(chunk) is chunk  # type: ignore[arg-type]


def test_single_call_is_a_batch_of_one_with_every_argument() -> None:
    """``predict_action_chunk`` hands its delay and prefix on as one request, and returns its chunk."""
    seen: list[list[PolicyRequest]] = []

    class Recorder(SingleAsBatchOfOne):
        def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
            seen.append(requests)
            return [np.full((1, 1), 7.0), np.zeros((1, 1))]

    prefix = np.ones((2, 1), np.float32)
    out = Recorder().predict_action_chunk({"state": 3}, inference_delay=2, prev_chunk_left_over=prefix)
    assert out.tolist() == [[7.0]]
    [[request]] = seen
    assert request.batch == {"state": 3} and request.inference_delay == 2
    assert request.prev_chunk_left_over is prefix and request.prefix_steps is None
    Recorder().predict_action_chunk({"state": 4})
    assert seen[-1][0].inference_delay == 0 and seen[-1][0].prev_chunk_left_over is None


# -- errors ---------------------------------------------------------------------------------------


def test_error_codes_are_the_protocols_strings() -> None:
    """docs/protocol.md lists these codes; clients match on them."""
    assert policy_errors.UNKNOWN_SESSION == "unknown_session"
    assert policy_errors.STALE_EPOCH == "stale_epoch"
    assert policy_errors.INFERENCE_ERROR == "inference_error"
    assert policy_errors.UNAVAILABLE == "unavailable"
    assert policy_errors.UNEXPECTED_MESSAGE == "unexpected_message"


def test_policy_error_carries_code_message_and_retryable() -> None:
    """What the server sends comes from these fields; the exception text is ``code: message``."""
    error = PolicyError("stale_epoch", "epoch 3 is not 4")
    assert (error.code, error.message, error.retryable) == ("stale_epoch", "epoch 3 is not 4", False)
    assert str(error) == "stale_epoch: epoch 3 is not 4"
    assert PolicyError("unavailable", "bye", retryable=True).retryable is True


# -- the chunk policy -----------------------------------------------------------------------------


def ramp(chunk_size: int, action_dim: int) -> np.ndarray:
    """The documented ramp ``0.05 (t + 1)(a + 1) / A``, in float64."""
    return np.array(
        [[0.05 * (t + 1) * (a + 1) / action_dim for a in range(action_dim)] for t in range(chunk_size)]
    )


def test_chunk_policy_at_zero_state_is_the_ramp_plus_the_delay_term() -> None:
    """``tanh(W @ 0) = 0``, so the chunk is the ramp plus ``0.01 delay`` exactly (to float32)."""
    policy = ChunkPolicy(state_dim=3, action_dim=4, chunk_size=5)
    for delay in (0, 3):
        chunk = policy.predict_action_chunk({"state": np.zeros(3)}, inference_delay=delay)
        assert chunk.dtype == np.float32 and chunk.shape == (5, 4)
        np.testing.assert_allclose(chunk, ramp(5, 4) + 0.01 * delay, rtol=1e-6, atol=1e-7)


def test_chunk_policy_is_tanh_of_a_linear_map_of_the_state() -> None:
    """Each row less the ramp is ``tanh(W s)``, the same for every row, and linear in ``s`` under atanh."""
    policy = ChunkPolicy(state_dim=3, action_dim=4, chunk_size=5)
    s1, s2 = np.array([0.1, -0.2, 0.05]), np.array([-0.03, 0.07, 0.2])

    def features(state: np.ndarray) -> np.ndarray:
        rows = policy.predict_action_chunk({"state": state}).astype(np.float64) - ramp(5, 4)
        np.testing.assert_allclose(rows, np.broadcast_to(rows[0], rows.shape), atol=2e-7)
        return np.arctanh(rows[0])

    np.testing.assert_allclose(features(s1 + s2), features(s1) + features(s2), atol=2e-6)
    np.testing.assert_allclose(features(2 * s1), 2 * features(s1), atol=2e-6)
    assert np.all(np.abs(features(s1)) > 1e-4)


@pytest.mark.parametrize(("state_dim", "action_dim"), [(400, 60), (1, 6000)])
def test_chunk_policy_map_has_unit_variance_per_state_unit(state_dim: int, action_dim: int) -> None:
    """The map's entries are standard normal over ``sqrt(S)``: ``W s`` has variance ``|s|^2 / S``."""
    policy = ChunkPolicy(state_dim=state_dim, action_dim=action_dim, chunk_size=1)
    eps = 1e-3
    columns = []
    for i in range(min(state_dim, 40)):
        state = np.zeros(state_dim)
        state[i] = eps
        row = policy.predict_action_chunk({"state": state})[0].astype(np.float64) - ramp(1, action_dim)[0]
        columns.append(np.arctanh(row) / eps)
    entries = np.concatenate(columns)
    variance = float(np.mean(entries**2))
    assert variance == pytest.approx(1.0 / state_dim, rel=0.08)
    assert abs(float(np.mean(entries))) < 4 * math.sqrt(variance / entries.size)


def test_chunk_policy_seed_picks_the_map() -> None:
    """The same seed gives the same chunks; another seed another map."""
    state = {"state": np.linspace(-1, 1, 6)}
    base = ChunkPolicy().predict_action_chunk(state)
    assert np.array_equal(ChunkPolicy(seed=0).predict_action_chunk(state), base)
    assert not np.allclose(ChunkPolicy(seed=1).predict_action_chunk(state), base)


def test_chunk_policy_averages_the_prefix_into_its_first_rows() -> None:
    """With a prefix, row ``t < len(prefix)`` is the mean of the plain row and the prefix row."""
    policy = ChunkPolicy(state_dim=2, action_dim=3, chunk_size=6)
    batch = {"state": np.zeros(2)}
    plain = ramp(6, 3)
    prefix = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = policy.predict_action_chunk(batch, prev_chunk_left_over=prefix)
    np.testing.assert_allclose(out[:4], 0.5 * (plain[:4] + prefix), rtol=1e-6)
    np.testing.assert_allclose(out[4:], plain[4:], rtol=1e-6)
    long_prefix = np.full((9, 3), 2.0, np.float32)  # longer than the chunk: all 6 rows averaged
    np.testing.assert_allclose(
        policy.predict_action_chunk(batch, prev_chunk_left_over=long_prefix), 0.5 * (plain + 2.0), rtol=1e-6
    )
    assert policy.predict_action_chunk(batch, prev_chunk_left_over=long_prefix).dtype == np.float32


def test_chunk_policy_metadata_and_rtc_settings() -> None:
    """Defaults: 6-D state and actions named a0.., chunk 20, horizon 10, 15 fps, RTC and batching on."""
    policy = ChunkPolicy()
    assert policy.metadata == PolicyMetadata(
        name="chunk-policy",
        action_names=tuple(f"a{i}" for i in range(6)),
        chunk_size=20,
        state_dim=6,
        camera_names=(),
        fps=15.0,
        supports_rtc=True,
        supports_batching=True,
    )
    assert policy.rtc.enabled and policy.rtc.execution_horizon == 10
    short = ChunkPolicy(chunk_size=4, execution_horizon=10, camera_names=["c"], name="n", fps=5.0)
    assert short.rtc.execution_horizon == 4  # never longer than the chunk
    assert short.metadata.camera_names == ("c",) and short.metadata.name == "n" and short.metadata.fps == 5.0
    assert ChunkPolicy(supports_batching=False).metadata.supports_batching is False
    assert ChunkPolicy(action_names=["x", "y"]).metadata.action_names == ("x", "y")
    assert (policy.latency_s, policy.record_calls, policy.calls, policy.batch_sizes) == (0.0, False, [], [])


def test_chunk_policy_action_width_comes_from_the_names_or_action_dim() -> None:
    """Six actions by default; the names' count when only names are given; both must agree, and a
    spec loaded with disagreeing ``--policy-arg``s is refused, not served at another width."""
    assert ChunkPolicy().metadata.action_names == ("a0", "a1", "a2", "a3", "a4", "a5")
    assert ChunkPolicy(action_dim=2).metadata.action_names == ("a0", "a1")
    assert ChunkPolicy(action_names=["x", "y", "z"]).metadata.action_dim == 3
    assert ChunkPolicy(action_dim=3, action_names=["x", "y", "z"]).metadata.action_dim == 3
    with pytest.raises(ValueError) as refused:
        ChunkPolicy(action_dim=4, action_names=["x", "y", "z"])
    assert str(refused.value) == "action_dim=4 disagrees with the 3 action_names given"
    with pytest.raises(PolicyLoadError) as load_refused:
        load_policy("rollserve.models.simple_policies:droid_policy", action_dim=7)
    assert str(load_refused.value) == (
        "policy spec 'rollserve.models.simple_policies:droid_policy': calling droid_policy() failed: "
        "ValueError: action_dim=7 disagrees with the 8 action_names given"
    )


def test_chunk_policy_refuses_a_wrong_or_non_finite_state() -> None:
    """A state of another shape, or with NaN or inf, is refused with a message that says which."""
    policy = ChunkPolicy(state_dim=3)
    with pytest.raises(ValueError, match=r"^state must have shape \(3,\), got \(2,\)$"):
        policy.predict_action_chunk({"state": np.zeros(2)})
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^state has non-finite values$"):
            policy.predict_action_chunk({"state": np.array([0.0, bad, 0.0])})


def test_chunk_policy_counts_each_call_and_records_on_request() -> None:
    """``batch_sizes`` gets one entry per model call; ``calls`` the inputs, only with ``record_calls``."""
    quiet = ChunkPolicy(state_dim=1)
    quiet.predict_action_chunks([PolicyRequest({"state": [0.0]})] * 3)
    quiet.predict_action_chunk({"state": [0.0]})
    assert quiet.batch_sizes == [3, 1] and quiet.calls == []
    loud = ChunkPolicy(state_dim=2, action_dim=1, record_calls=True)
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    prefix = np.ones((2, 1), np.float32)
    state = np.array([0.5, -0.5], np.float32)
    loud.predict_action_chunks(
        [
            PolicyRequest({"state": state, "images": {"cam": image}, "task": "stack"}, 2, prefix, 1),
            PolicyRequest({"state": state}),
        ]
    )
    first, second = loud.calls
    assert first["state"].tolist() == [0.5, -0.5] and first["state"] is not state
    assert first["inference_delay"] == 2 and first["prefix_steps"] == 1 and first["task"] == "stack"
    assert (
        first["prev_chunk_left_over"].tolist() == [[1.0], [1.0]]
        and first["prev_chunk_left_over"] is not prefix
    )
    assert first["images"] == {"cam": hashlib.sha256(bytes(range(12))).hexdigest()}
    assert second["images"] == {} and second["task"] == "" and second["prev_chunk_left_over"] is None
    assert second["inference_delay"] == 0 and second["prefix_steps"] is None


def test_chunk_policy_processors_are_fixed_affine_maps() -> None:
    """``pre`` standardises the state with means -0.5..0.5 and spreads 1..2 (evenly spaced);
    ``post`` scales actions by 0.5..1.5 and shifts them by -0.2..0.2; ``actions_to_model`` inverts it."""
    policy = ChunkPolicy(state_dim=3, action_dim=5)
    processors = policy.make_processors()
    mean, std = np.array([-0.5, 0.0, 0.5]), np.array([1.0, 1.5, 2.0])
    batch = processors.pre({"state": [1.0, 2.0, 3.0], "images": {"c": 1}, "task": "t"})
    np.testing.assert_allclose(batch["state"], (np.array([1.0, 2.0, 3.0]) - mean) / std, rtol=1e-6)
    assert batch["images"] == {"c": 1} and batch["task"] == "t"
    bare = processors.pre({"state": [0.0, 0.0, 0.0], "images": None})
    assert bare["images"] == {} and bare["task"] == ""
    scale, offset = np.array([0.5, 0.75, 1.0, 1.25, 1.5]), np.array([-0.2, -0.1, 0.0, 0.1, 0.2])
    chunk = np.arange(10, dtype=np.float32).reshape(2, 5)
    robot = processors.post(chunk)
    assert robot.dtype == np.float32
    np.testing.assert_allclose(robot, chunk * scale + offset, rtol=1e-6, atol=1e-7)
    model = policy.actions_to_model(robot)
    assert model.dtype == np.float32
    np.testing.assert_allclose(model, chunk, rtol=1e-5, atol=1e-6)


def test_chunk_policy_latency_is_paid_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixed latency is one sleep per model call, whatever the batch size; none when 0."""
    import rollserve.models.simple_policies as simple

    slept: list[float] = []
    monkeypatch.setattr(simple.time, "sleep", slept.append)
    ChunkPolicy(state_dim=1, latency_s=0.25).predict_action_chunks([PolicyRequest({"state": [0.0]})] * 4)
    ChunkPolicy(state_dim=1).predict_action_chunks([PolicyRequest({"state": [0.0]})])
    assert slept == [0.25]


def test_spec_factories_pass_their_arguments_on() -> None:
    """``chunk_policy`` is the class; ``droid_policy`` DROID's shape, each default overridable."""
    assert chunk_policy(state_dim=2, chunk_size=3).metadata.chunk_size == 3
    droid = droid_policy()
    assert droid.metadata == PolicyMetadata(
        name="droid-chunk-policy",
        action_names=DROID_ACTIONS,
        chunk_size=10,
        state_dim=8,
        camera_names=DROID_CAMERAS,
        supports_rtc=True,
        supports_batching=True,
    )
    assert DROID_ACTIONS == (
        "joint_0",
        "joint_1",
        "joint_2",
        "joint_3",
        "joint_4",
        "joint_5",
        "joint_6",
        "gripper",
    )
    assert DROID_CAMERAS == ("exterior_image_1_left", "wrist_image_left")
    assert droid_policy(chunk_size=4, name="d").metadata.chunk_size == 4


# -- the echo policy ------------------------------------------------------------------------------


def test_echo_policy_repeats_the_state_zero_padded() -> None:
    """Every row is the state's first ``action_dim`` values; a shorter state is zero-padded."""
    policy = EchoPolicy(state_dim=3, action_names=("a", "b", "c", "d"), camera_names=("cam",), chunk_size=2)
    assert policy.metadata == PolicyMetadata(
        name="echo-policy",
        action_names=("a", "b", "c", "d"),
        chunk_size=2,
        state_dim=3,
        camera_names=("cam",),
        supports_batching=True,
    )
    chunk = policy.predict_action_chunk({"state": [1.0, 2.0, 3.0]})
    assert chunk.dtype == np.float32 and chunk.tolist() == [[1, 2, 3, 0], [1, 2, 3, 0]]
    narrow = EchoPolicy(state_dim=3, action_names=("a",), camera_names=())
    assert narrow.metadata.chunk_size == 10
    assert narrow.predict_action_chunk({"state": [5.0, 6.0, 7.0]}).tolist() == [[5.0]] * 10
    both = policy.predict_action_chunks(
        [PolicyRequest({"state": [1, 1, 1]}), PolicyRequest({"state": [2, 0, 2]})]
    )
    assert [c.tolist() for c in both] == [[[1, 1, 1, 0]] * 2, [[2, 0, 2, 0]] * 2]


def test_echo_policy_layouts() -> None:
    """LIBERO (default): 8-D state, 7 actions, ``image``/``wrist_image``; DROID: 8 actions; others refused."""
    libero = echo_policy()
    assert libero.metadata.state_dim == 8 and libero.metadata.action_names == LIBERO_ACTIONS
    assert libero.metadata.camera_names == LIBERO_CAMERAS == ("image", "wrist_image")
    assert LIBERO_ACTIONS == ("x", "y", "z", "roll", "pitch", "yaw", "gripper")
    droid = echo_policy("droid", chunk_size=3)
    assert droid.metadata.state_dim == 8 and droid.metadata.action_names == DROID_ACTIONS
    assert droid.metadata.camera_names == DROID_CAMERAS and droid.metadata.chunk_size == 3
    with pytest.raises(ValueError, match=r"^layout must be one of \['droid', 'libero'\], got 'aloha'$"):
        echo_policy("aloha")


# -- the wide MLP ---------------------------------------------------------------------------------


def test_wide_mlp_shape_and_metadata() -> None:
    """Input: state, the horizon's prefix rows flattened, the delay; ``depth`` GELU layers of ``width``."""
    policy = WideMLPPolicy(state_dim=3, action_dim=2, chunk_size=5, execution_horizon=4, width=16, depth=2)
    assert policy.metadata == PolicyMetadata(
        name="wide-mlp",
        action_names=("a0", "a1"),
        chunk_size=5,
        state_dim=3,
        fps=50.0,
        supports_rtc=True,
        supports_batching=True,
    )
    assert policy.rtc.enabled and policy.rtc.execution_horizon == 4
    linears = [m for m in policy.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3 + 4 * 2 + 1, 16), (16, 16), (16, 10)]
    assert sum(isinstance(m, torch.nn.GELU) for m in policy.net) == 2
    assert not policy.net.training and policy.device == torch.device("cpu")
    assert WideMLPPolicy(chunk_size=3, width=8, depth=1).rtc.execution_horizon == 3
    default = wide_mlp(width=8, depth=1)
    assert default.metadata.state_dim == 14 and default.metadata.chunk_size == 50
    assert default.metadata.action_dim == 14 and default.rtc.execution_horizon == 10


def test_wide_mlp_feeds_state_prefix_and_delay_in_that_order() -> None:
    """The net's input row is ``[state, prefix[:horizon].ravel(), 0-padding, delay]``."""
    policy = WideMLPPolicy(state_dim=2, action_dim=2, chunk_size=4, execution_horizon=3, width=16, depth=1)
    prefix = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.float32)  # one row past the horizon
    requests = [
        PolicyRequest({"state": [0.5, -0.5]}, 2, prefix),
        PolicyRequest({"state": [1.5, 0.25]}, 1, prefix[:1]),
        PolicyRequest({"state": [0.0, 1.0]}),
    ]
    rows = np.array(
        [
            [0.5, -0.5, 1, 2, 3, 4, 5, 6, 2.0],
            [1.5, 0.25, 1, 2, 0, 0, 0, 0, 1.0],
            [0.0, 1.0, 0, 0, 0, 0, 0, 0, 0.0],
        ],
        np.float32,
    )
    with torch.no_grad():
        expected = policy.net(torch.from_numpy(rows)).numpy().reshape(3, 4, 2)
    out = policy.predict_action_chunks(requests)
    for got, want in zip(out, expected, strict=True):
        assert got.shape == (4, 2) and got.dtype == np.float32 and got.flags["C_CONTIGUOUS"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_wide_mlp_weights_come_from_the_seed_at_fan_in_scale() -> None:
    """Same seed, same weights; each parameter is standard normal over the root of its last dimension."""
    first = WideMLPPolicy(
        state_dim=4, action_dim=4, chunk_size=8, execution_horizon=4, width=256, depth=2, seed=3
    )
    again = WideMLPPolicy(
        state_dim=4, action_dim=4, chunk_size=8, execution_horizon=4, width=256, depth=2, seed=3
    )
    other = WideMLPPolicy(
        state_dim=4, action_dim=4, chunk_size=8, execution_horizon=4, width=256, depth=2, seed=4
    )
    for a, b, c in zip(first.net.parameters(), again.net.parameters(), other.net.parameters(), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
        if a.ndim == 2:
            std = float(a.detach().double().std()) * math.sqrt(a.shape[-1])
            assert std == pytest.approx(1.0, rel=0.1)


# -- the velocity net -----------------------------------------------------------------------------


def test_flow_net_config_defaults_and_dict() -> None:
    """Stored verbatim in ``config.json``; reading one keeps known keys only, as ints."""
    config = FlowNetConfig()
    expected = {
        "chunk_size": 16,
        "action_dim": 8,
        "state_dim": 16,
        "hidden_dim": 256,
        "depth": 3,
        "time_embed_dim": 64,
    }
    assert config.to_dict() == expected
    read = FlowNetConfig.from_dict({"chunk_size": "4", "depth": 2.0, "unknown": 9})
    assert read == FlowNetConfig(chunk_size=4, depth=2)
    assert type(read.chunk_size) is int and type(read.depth) is int


def test_time_embedding_is_sin_and_cos_over_log_spaced_frequencies() -> None:
    """``dim // 2`` frequencies from 1 to 1000, geometrically spaced; sines first, then cosines."""
    tau = torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64)
    out = time_embedding(tau, 8)
    freqs = np.array([1000.0 ** (k / 3) for k in range(4)])
    angles = np.array([0.0, 0.25, 1.0])[:, None] * freqs[None, :]
    assert out.shape == (3, 8) and out.dtype == torch.float64
    np.testing.assert_allclose(
        out.numpy(), np.concatenate([np.sin(angles), np.cos(angles)], axis=1), rtol=1e-9
    )


def _layer_norm(x: np.ndarray, norm: torch.nn.LayerNorm) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.eps) * _np(norm.weight) + _np(norm.bias)


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().double().numpy()


def _linear(x: np.ndarray, layer: torch.nn.Linear) -> np.ndarray:
    return x @ _np(layer.weight).T + _np(layer.bias)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def test_velocity_net_is_the_documented_residual_mlp() -> None:
    """Recomputed in numpy: condition MLP over ``[state, time features]``, input layer over ``[chunk, cond]``,
    pre-norm blocks ``h + fc2(silu(fc1(norm(h)) + cond_proj(cond)))``, then norm and out, reshaped."""
    torch.manual_seed(0)
    config = FlowNetConfig(chunk_size=3, action_dim=2, state_dim=4, hidden_dim=12, depth=2, time_embed_dim=6)
    net = VelocityNet(config).double()
    with torch.no_grad():  # non-trivial norms, so a dropped norm or a swapped one shows
        for module in net.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    chunk = np.random.default_rng(1).standard_normal((2, 3, 2))
    state = np.random.default_rng(2).standard_normal((2, 4))
    tau = np.array([0.1, 0.7])
    freqs = np.array([1000.0 ** (k / 2) for k in range(3)])
    temb = np.concatenate([np.sin(tau[:, None] * freqs), np.cos(tau[:, None] * freqs)], axis=1)
    cond_mlp = net.cond_mlp
    cond = _linear(_silu(_linear(np.concatenate([state, temb], 1), cond_mlp[0])), cond_mlp[2])
    h = _linear(np.concatenate([chunk.reshape(2, 6), cond], 1), net.inp)
    assert len(net.blocks) == 2
    for block in net.blocks:
        h = h + _linear(
            _silu(_linear(_layer_norm(h, block.norm), block.fc1) + _linear(cond, block.cond)), block.fc2
        )
    expected = _linear(_layer_norm(h, net.out_norm), net.out).reshape(2, 3, 2)
    with torch.no_grad():
        got = net(torch.from_numpy(chunk), torch.from_numpy(state), torch.from_numpy(tau))
    assert got.shape == (2, 3, 2)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-12)
    with torch.no_grad():  # a scalar flow time is every item's
        scalar = net(torch.from_numpy(chunk), torch.from_numpy(state), torch.tensor(0.1, dtype=torch.float64))
        per_item = net(
            torch.from_numpy(chunk), torch.from_numpy(state), torch.tensor([0.1, 0.1], dtype=torch.float64)
        )
    assert torch.equal(scalar, per_item)


def test_velocity_net_layer_shapes() -> None:
    """Sizes follow the config: condition ``S + T``, input ``H*A + hidden``, ``depth`` blocks, out ``H*A``."""
    net = VelocityNet(
        FlowNetConfig(chunk_size=3, action_dim=2, state_dim=4, hidden_dim=12, depth=3, time_embed_dim=6)
    )
    assert (net.cond_mlp[0].in_features, net.cond_mlp[0].out_features) == (10, 12)
    assert isinstance(net.cond_mlp[1], torch.nn.SiLU)
    assert (net.cond_mlp[2].in_features, net.cond_mlp[2].out_features) == (12, 12)
    assert (net.inp.in_features, net.inp.out_features) == (18, 12)
    assert len(net.blocks) == 3 and all(b.norm.normalized_shape == (12,) for b in net.blocks)
    assert all(b.fc1.in_features == b.fc2.out_features == b.cond.in_features == 12 for b in net.blocks)
    assert net.out_norm.normalized_shape == (12,)
    assert (net.out.in_features, net.out.out_features) == (12, 6)


# -- the chunk policy, to the bit ----------------------------------------------------------------


def float32_chunk(policy: ChunkPolicy, state: np.ndarray, delay: int, seed: int = 0) -> np.ndarray:
    """The documented formula in float32 throughout, the map drawn as documented from ``seed``:
    numpy's ``default_rng(seed)`` standard normals ``(A, S)`` over ``sqrt(S)``."""
    meta = policy.metadata
    a_dim, s_dim = meta.action_dim, meta.state_dim
    w = (np.random.default_rng(seed).standard_normal((a_dim, s_dim)) / math.sqrt(s_dim)).astype(np.float32)
    f32 = np.float32
    ramp32 = np.array(
        [
            [f32(0.05) * f32(t + 1) * f32(a + 1) / f32(a_dim) for a in range(a_dim)]
            for t in range(meta.chunk_size)
        ],
        np.float32,
    )
    rows = np.tanh(w @ state.astype(np.float32))[None, :] + ramp32
    return rows + f32(0.01) * f32(delay)


def test_chunk_policy_computes_in_float32_to_the_bit() -> None:
    """The chunk is the formula evaluated in float32 (so every numpy gives the same bits)."""
    policy = ChunkPolicy(state_dim=5, action_dim=7, chunk_size=9)
    states = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)
    for i, state in enumerate(states):
        got = policy.predict_action_chunk({"state": state}, inference_delay=i + 1)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, float32_chunk(policy, state, i + 1))


def test_chunk_policy_rounds_float64_inputs_to_float32_first() -> None:
    """A float64 state or prefix gives exactly the chunk of its float32 rounding; a state beyond
    float32's range is refused as non-finite."""
    policy = ChunkPolicy(state_dim=6, action_dim=6, chunk_size=8)
    rng = np.random.default_rng(4)
    for _ in range(5):
        state = rng.normal(size=6)
        prefix = rng.normal(size=(5, 6))
        got = policy.predict_action_chunk({"state": state}, prev_chunk_left_over=prefix)
        want = policy.predict_action_chunk(
            {"state": state.astype(np.float32)}, prev_chunk_left_over=prefix.astype(np.float32)
        )
        np.testing.assert_array_equal(got, want)
    huge = np.zeros(6)
    huge[2] = 1e39
    with pytest.raises(ValueError, match=r"^state has non-finite values$"), np.errstate(over="ignore"):
        policy.predict_action_chunk({"state": huge})


def test_chunk_policy_processors_compute_in_float32_to_the_bit() -> None:
    """``pre`` gives a float32 state; ``post`` and its inverse are float32 affine maps of float32
    values (a float64 chunk is rounded first), so the bits match float32 arithmetic."""
    policy = ChunkPolicy(state_dim=3, action_dim=7)
    f32 = np.float32
    scale = np.array([0.5 + i / 6 for i in range(7)]).astype(np.float32)
    offset = np.array([-0.2 + 0.4 * i / 6 for i in range(7)]).astype(np.float32)
    chunk64 = np.random.default_rng(5).normal(size=(50, 7))
    chunk32 = chunk64.astype(np.float32)
    robot = policy.actions_to_robot(chunk32)
    np.testing.assert_array_equal(robot, chunk32 * scale + offset)
    np.testing.assert_array_equal(policy.actions_to_robot(chunk64), robot)
    model = policy.actions_to_model(chunk32)
    np.testing.assert_array_equal(model, (chunk32 - offset) / scale)
    np.testing.assert_array_equal(policy.actions_to_model(chunk64), model)
    assert robot.dtype == model.dtype == np.float32
    batch = policy.preprocess({"state": [1.0, 2.0, 3.0]})
    assert batch["state"].dtype == np.float32
    mean, std = np.array([-0.5, 0, 0.5], np.float32), np.array([1, 1.5, 2], np.float32)
    np.testing.assert_array_equal(batch["state"], (np.array([1, 2, 3], f32) - mean) / std)


# -- the wide MLP, its seed and its device --------------------------------------------------------


def test_wide_mlp_defaults() -> None:
    """By default: 2048 wide, 3 hidden layers, seed 0."""
    policy = WideMLPPolicy()
    linears = [m for m in policy.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (14 + 10 * 14 + 1, 2048),
        (2048, 2048),
        (2048, 2048),
        (2048, 50 * 14),
    ]
    small, seeded = WideMLPPolicy(width=8, depth=1), WideMLPPolicy(width=8, depth=1, seed=0)
    for a, b in zip(small.net.parameters(), seeded.net.parameters(), strict=True):
        assert torch.equal(a, b)


def test_wide_mlp_parameters_are_the_seeds_normal_draws_in_order() -> None:
    """Each parameter in turn takes the seed generator's standard normals over the root of its last
    dimension (a 1-wide bias, as for a 1x1 chunk, is divided by 1)."""
    policy = WideMLPPolicy(
        state_dim=2, action_dim=1, chunk_size=1, execution_horizon=1, width=4, depth=1, seed=9
    )
    generator = torch.Generator().manual_seed(9)
    for param in policy.net.parameters():
        draw = torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[-1])
        assert torch.equal(param.detach(), draw)
    assert policy.net[-1].bias.shape == (1,)


def test_wide_mlp_runs_on_its_device() -> None:
    """The net and its input rows are on the policy's device (checked on torch's meta device, which
    holds no data: the copy back to numpy then fails, after the net ran there)."""
    policy = WideMLPPolicy(
        state_dim=2, action_dim=1, chunk_size=2, execution_horizon=1, width=4, depth=1, device="meta"
    )
    assert policy.device == torch.device("meta")
    assert all(p.device.type == "meta" for p in policy.net.parameters())
    seen: list[torch.device] = []
    policy.net.register_forward_pre_hook(lambda _module, args: seen.append(args[0].device))
    with pytest.raises((NotImplementedError, RuntimeError)):
        policy.predict_action_chunks([PolicyRequest({"state": [1.0, 2.0]})])
    assert seen == [torch.device("meta")]


# -- the velocity net's dtype and device ----------------------------------------------------------


def test_time_embedding_stays_on_taus_device() -> None:
    """The frequencies are made where ``tau`` is (checked on the meta device)."""
    out = time_embedding(torch.zeros(3, device="meta"), 8)
    assert out.device.type == "meta" and out.shape == (3, 8)


def test_velocity_net_casts_tau_to_the_chunks_dtype() -> None:
    """A float64 flow time with float32 chunks gives the float32 result of its rounding."""
    torch.manual_seed(0)
    net = VelocityNet(FlowNetConfig(chunk_size=2, action_dim=2, state_dim=3, hidden_dim=8, depth=1))
    chunk, state = torch.randn(2, 2, 2), torch.randn(2, 3)
    with torch.no_grad():
        got = net(chunk, state, torch.tensor([0.3, 0.6], dtype=torch.float64))
        want = net(chunk, state, torch.tensor([0.3, 0.6], dtype=torch.float32))
    assert got.dtype == torch.float32 and torch.equal(got, want)


# -- the flow policy ------------------------------------------------------------------------------

FH, FA, FS = 6, 3, 4  # chunk, actions, state of the small flow policies below


def flow_parts() -> tuple[VelocityNet, NormStats]:
    """A small net with fixed weights and statistics, made afresh for each policy."""
    torch.manual_seed(0)
    net = VelocityNet(FlowNetConfig(chunk_size=FH, action_dim=FA, state_dim=FS, hidden_dim=16, depth=1))
    rng = np.random.default_rng(0)
    return net, NormStats.fit(rng.normal(1.0, 2.0, (50, FS)), rng.normal(0.0, 0.5, (50, FA)))


def flow(**kwargs: Any) -> FlowMatchingPolicy:
    net, stats = flow_parts()
    return FlowMatchingPolicy(net, stats, [f"a{i}" for i in range(FA)], **kwargs)


def fstate(i: int) -> np.ndarray:
    return np.random.default_rng(100 + i).normal(size=FS).astype(np.float32)


def fnoise(i: int) -> np.ndarray:
    return np.random.default_rng(200 + i).normal(size=(FH, FA)).astype(np.float32)


def test_flow_policy_defaults() -> None:
    """docs/policy.md: Euler with 10 steps; 15 Hz, the default name, seed 0 and RTC on by default."""
    policy = flow()
    assert policy.num_steps == 10 and policy.rtc == DEFAULT_RTC
    assert policy.metadata.fps == 15.0 and policy.metadata.name == "rollserve-flow-policy"
    assert policy.state_names == tuple(f"state_{i}" for i in range(FS)) and policy.info == {}
    batch = {"state": fstate(0)}
    first = policy.predict_action_chunk(batch)
    assert np.array_equal(first, flow(seed=0).predict_action_chunk(batch))
    assert not np.allclose(first, flow(seed=1).predict_action_chunk(batch))


def test_flow_policy_reseed_restarts_its_noise_stream() -> None:
    """After ``reseed(s)`` the policy draws what a policy built with seed ``s`` draws first."""
    policy = flow(seed=3)
    batch = {"state": fstate(1)}
    policy.predict_action_chunk(batch)
    policy.reseed(7)
    np.testing.assert_array_equal(
        policy.predict_action_chunk(batch), flow(seed=7).predict_action_chunk(batch)
    )


def test_flow_policy_refusals_say_what_was_wrong() -> None:
    """Each refusal names the expected shape and the one it got."""
    net, stats = flow_parts()
    with pytest.raises(ValueError, match=r"^2 action names for action_dim 3$"):
        FlowMatchingPolicy(net, stats, ["a", "b"])
    policy = flow()
    with pytest.raises(ValueError, match=r"^state must have shape \(4,\), got \(5,\)$"):
        policy.preprocess({"state": np.zeros(5)})
    with pytest.raises(ValueError, match="could not convert string to float"):
        policy.preprocess({"state": "abcd"})
    with pytest.raises(ValueError, match=r"^batch\['state'\] must have shape \(4,\), got \(3,\)$"):
        policy.predict_action_chunk({"state": np.zeros(3)})
    with pytest.raises(ValueError, match=r"^batch\['noise'\] must have shape \(6, 3\), got \(6, 2\)$"):
        policy.predict_action_chunk({"state": fstate(0), "noise": np.zeros((6, 2))})
    for bad in (np.zeros(3), np.zeros((2, 4)), np.zeros((1, 2, 3))):
        with pytest.raises(
            ValueError, match=rf"^prefix must have shape \(steps, 3\), got {re.escape(str(bad.shape))}$"
        ):
            policy.predict_action_chunk({"state": fstate(0)}, prev_chunk_left_over=bad)


def test_flow_policy_preprocess_keeps_the_observation_and_fills_defaults() -> None:
    """``pre`` normalises the state, keeps every other key (a seed, noise), adds no images and an
    empty task when they are missing, and keeps them when given."""
    policy = flow()
    batch = policy.preprocess({"state": [1.0, 2.0, 3.0, 4.0], "seed": 5})
    assert set(batch) == {"state", "seed", "images", "task"}
    assert batch["seed"] == 5 and batch["images"] == {} and batch["task"] == ""
    np.testing.assert_array_equal(
        batch["state"], policy.stats.normalize_state(np.array([1, 2, 3, 4], np.float32))
    )
    given = policy.preprocess({"state": np.zeros(4), "images": {"c": 1}, "task": "stack"})
    assert given["images"] == {"c": 1} and given["task"] == "stack"


def test_flow_policy_rounds_float64_inputs_to_float32() -> None:
    """A float64 state or noise gives the chunk of its float32 rounding; the drawn noise is float32
    even when torch's default dtype is float64."""
    policy = flow()
    state64, noise64 = fstate(2).astype(np.float64), fnoise(2).astype(np.float64)
    want = policy.predict_action_chunk({"state": fstate(2), "noise": fnoise(2)})
    np.testing.assert_array_equal(policy.predict_action_chunk({"state": state64, "noise": fnoise(2)}), want)
    np.testing.assert_array_equal(policy.predict_action_chunk({"state": fstate(2), "noise": noise64}), want)
    seeded = policy.predict_action_chunk({"state": fstate(2), "seed": 4})
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        again = policy.predict_action_chunk({"state": fstate(2), "seed": 4})
    finally:
        torch.set_default_dtype(default)
    assert again.dtype == np.float32
    np.testing.assert_array_equal(again, seeded)


def reference(
    policy: FlowMatchingPolicy, items: list[tuple[int, tuple[np.ndarray, int, int] | None]]
) -> np.ndarray:
    """``sample_chunks`` over the policy's net, with each item's real prefix rows (zero-padded to the
    chunk, float32) and the RTC mask over them (docs/policy.md); ``None``: no prefix, zero weights."""
    prefixes, masks = [], []
    for _, guide in items:
        prefix, mask = np.zeros((FH, FA), np.float32), np.zeros(FH, np.float32)
        if guide is not None:
            rows, delay, horizon = guide
            prefix[:horizon] = rows[:horizon]
            mask = prefix_weights(delay, horizon, FH, policy.rtc.prefix_attention_schedule)
        prefixes.append(prefix)
        masks.append(mask)
    guided = any(guide is not None for _, guide in items)
    out = sample_chunks(
        policy.net,
        torch.from_numpy(np.stack([fstate(i) for i, _ in items])),
        torch.from_numpy(np.stack([fnoise(i) for i, _ in items])),
        num_steps=policy.num_steps,
        prefix=torch.from_numpy(np.stack(prefixes)) if guided else None,
        weights=torch.from_numpy(np.stack(masks)) if guided else None,
        max_weight=policy.rtc.max_guidance_weight,
    )
    return out.numpy()


def test_flow_policy_is_the_sampler_with_the_padded_prefix_and_its_mask() -> None:
    """A mixed batch (guided and plain items) is, bit for bit, the sampler run over float32 prefixes
    cut to the horizon: the policy's, the server's ``prefix_steps``, the rows given and the chunk,
    whichever is least."""
    policy = flow(rtc=RTCConfig(enabled=True, execution_horizon=20, max_guidance_weight=3.0))
    long_rows = np.random.default_rng(7).normal(size=(9, FA))  # float64, more rows than the chunk
    short_rows = np.random.default_rng(8).normal(size=(2, FA)).astype(np.float32)
    cases: list[tuple[PolicyRequest, tuple[np.ndarray, int, int] | None]] = [
        (PolicyRequest({}, 1, long_rows), (long_rows.astype(np.float32), 1, FH)),  # chunk
        (PolicyRequest({}, 0, long_rows, prefix_steps=8), (long_rows.astype(np.float32), 0, FH)),  # chunk
        (PolicyRequest({}, 1, short_rows, prefix_steps=5), (short_rows, 1, 2)),  # rows given
        (PolicyRequest({}, 2, long_rows, prefix_steps=4), (long_rows.astype(np.float32), 2, 4)),  # steps
        (PolicyRequest({}), None),
    ]
    for i, (request, _) in enumerate(cases):
        request.batch.update(state=fstate(i), noise=fnoise(i))
    got = policy.predict_action_chunks([request for request, _ in cases])
    want = reference(policy, [(i, guide) for i, (_, guide) in enumerate(cases)])
    for chunk, expected in zip(got, want, strict=True):
        assert chunk.dtype == np.float32 and chunk.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(chunk, expected)
    short = flow(rtc=RTCConfig(enabled=True, execution_horizon=3))
    request = PolicyRequest({"state": fstate(0), "noise": fnoise(0)}, 0, long_rows)
    np.testing.assert_array_equal(
        short.predict_action_chunks([request])[0],
        reference(short, [(0, (long_rows.astype(np.float32), 0, 3))])[0],
    )


def test_flow_policy_samples_on_its_device_and_returns_cpu_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """States, noise, prefix and mask go to the policy's device (torch's meta device here); the sample
    comes back to the CPU as float32 (the sampler is replaced: a meta tensor holds no data)."""
    import rollserve.models.flow_policy as flow_policy_module

    seen: dict[str, Any] = {}

    class Sample:
        def to(self, *args: Any) -> torch.Tensor:
            devices = [a for a in args if isinstance(a, (str, torch.device))]
            dtypes = [a for a in args if isinstance(a, torch.dtype)]
            seen["device"] = torch.device(devices[0]) if devices else None
            out = torch.ones((2, FH, FA), dtype=torch.float64)
            return out.to(dtypes[0]) if dtypes else out

    def sampler(net: Any, state: torch.Tensor, noise: torch.Tensor, **kwargs: Any) -> Sample:
        seen["inputs"] = [t.device.type for t in (state, noise, kwargs["prefix"], kwargs["weights"])]
        seen["dtypes"] = [t.dtype for t in (state, noise, kwargs["prefix"], kwargs["weights"])]
        return Sample()

    monkeypatch.setattr(flow_policy_module, "sample_chunks", sampler)
    policy = flow(device="meta")
    assert policy.device == torch.device("meta")
    assert all(p.device.type == "meta" for p in policy.net.parameters())
    out = policy.predict_action_chunks(
        [PolicyRequest({"state": fstate(0)}, 0, np.ones((2, FA))), PolicyRequest({"state": fstate(1)})]
    )
    assert seen["inputs"] == ["meta"] * 4 and seen["dtypes"] == [torch.float32] * 4
    assert seen["device"] == torch.device("cpu")
    assert [chunk.dtype for chunk in out] == [np.float32, np.float32]
