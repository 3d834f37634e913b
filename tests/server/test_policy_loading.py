"""Loading policies from ``module.path:factory`` specs, and the shipped simple policies."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest

from rollserve.models.loading import PolicyLoadError, load_policy
from rollserve.models.policy import PolicyRequest
from rollserve.models.simple_policies import ChunkPolicy, WideMLPPolicy

SIMPLE = "rollserve.models.simple_policies"


@pytest.fixture
def fake_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("fake_policies")
    module.ready = ChunkPolicy()  # type: ignore[attr-defined]
    module.not_a_policy = lambda: object()  # type: ignore[attr-defined]
    module.CONSTANT = 3  # type: ignore[attr-defined]

    def broken() -> ChunkPolicy:
        raise FileNotFoundError("checkpoint.safetensors")

    module.broken = broken  # type: ignore[attr-defined]
    sys.modules["fake_policies"] = module
    yield module
    del sys.modules["fake_policies"]


def test_factory_with_kwargs_and_ready_objects(fake_module: types.ModuleType) -> None:
    policy = load_policy(f"{SIMPLE}:chunk_policy", state_dim=3, chunk_size=5)
    assert isinstance(policy, ChunkPolicy) and policy.metadata.state_dim == 3
    assert load_policy(f"{SIMPLE}:droid_policy").metadata.camera_names == (
        "exterior_image_1_left",
        "wrist_image_left",
    )
    assert load_policy("fake_policies:ready") is fake_module.ready


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon_here", "must look like"),
        (":factory", "must look like"),
        ("a:b:c", "must look like"),
        ("definitely_not_a_module_xyz:make", "no module named 'definitely_not_a_module_xyz'"),
        (f"{SIMPLE}:missing", "has no attribute 'missing'"),
        ("fake_policies:not_a_policy", "no PolicyMetadata"),
        ("fake_policies:CONSTANT", "neither a factory nor a policy"),
        (f"{SIMPLE}:chunk_policy", "calling chunk_policy"),
        ("fake_policies:broken", r"broken\(\) failed: FileNotFoundError: checkpoint"),
    ],
)
def test_bad_specs_explain_themselves(fake_module: types.ModuleType, spec: str, match: str) -> None:
    kwargs = {"no_such_argument": 1} if spec.endswith(":chunk_policy") else {}
    with pytest.raises(PolicyLoadError, match=match):
        load_policy(spec, **kwargs)


def test_module_with_a_missing_dependency_names_it(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "needs_dep_policy.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyLoadError, match="needs 'no_such_dependency_xyz', which is not installed"):
        load_policy("needs_dep_policy:make")


def test_chunk_policy_depends_on_state_delay_and_prefix() -> None:
    policy = ChunkPolicy(record_calls=True)
    batch = {"state": np.zeros(6, np.float32)}
    base = policy.predict_action_chunk(batch)
    assert base.dtype == np.float32 and base.shape == (20, 6)
    assert not np.array_equal(base, policy.predict_action_chunk({"state": np.ones(6, np.float32)}))
    assert not np.array_equal(base, policy.predict_action_chunk(batch, inference_delay=2))
    guided = policy.predict_action_chunk(batch, prev_chunk_left_over=np.ones((10, 6), np.float32))
    assert not np.array_equal(base[:10], guided[:10]) and np.array_equal(base[10:], guided[10:])
    batched = policy.predict_action_chunks([PolicyRequest(batch), PolicyRequest(batch, 2)])
    assert np.array_equal(batched[0], base) and policy.batch_sizes[-1] == 2
    robot = policy.actions_to_robot(base)
    np.testing.assert_allclose(policy.actions_to_model(robot), base, atol=1e-6)


def test_wide_mlp_is_deterministic_and_batches() -> None:
    policy = WideMLPPolicy(state_dim=4, action_dim=3, chunk_size=6, execution_horizon=4, width=32, depth=2)
    again = load_policy(
        f"{SIMPLE}:wide_mlp", state_dim=4, action_dim=3, chunk_size=6, execution_horizon=4, width=32, depth=2
    )
    requests = [
        PolicyRequest({"state": np.full(4, i, np.float32)}, i, np.ones((4, 3), np.float32) if i else None)
        for i in range(3)
    ]
    out = policy.predict_action_chunks(requests)
    assert [o.shape for o in out] == [(6, 3)] * 3 and all(o.dtype == np.float32 for o in out)
    single = again.predict_action_chunk(
        requests[1].batch, inference_delay=1, prev_chunk_left_over=np.ones((4, 3), np.float32)
    )
    np.testing.assert_allclose(single, out[1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out[0], out[1])
