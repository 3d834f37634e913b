"""Checkpoints: save/load round trip, the config contents, the shipped checkpoint via its spec string."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rollserve.models.checkpoint import default_checkpoint_dir, load_flow_policy, save_flow_policy
from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.flow_stats import NormStats
from rollserve.rtc.config import RTCConfig

SPEC = "rollserve.models.checkpoint:load_default"


def small_policy() -> FlowMatchingPolicy:
    torch.manual_seed(0)
    net = VelocityNet(FlowNetConfig(chunk_size=10, action_dim=4, state_dim=3, hidden_dim=32, depth=1))
    rng = np.random.default_rng(0)
    stats = NormStats.fit(rng.normal(size=(50, 3)), rng.normal(size=(50, 4)))
    return FlowMatchingPolicy(
        net,
        stats,
        ["x", "y", "z", "grip"],
        state_names=["s0", "s1", "s2"],
        control_hz=10.0,
        num_steps=8,
        rtc=RTCConfig(
            enabled=True, execution_horizon=6, max_guidance_weight=8.0, prefix_attention_schedule="exp"
        ),
        info={"steps": 3},
    )


def test_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    policy = small_policy()
    save_flow_policy(policy, tmp_path / "ckpt")
    loaded = load_flow_policy(tmp_path / "ckpt")
    assert loaded.metadata == policy.metadata
    assert loaded.rtc == policy.rtc and loaded.num_steps == 8 and loaded.info == {"steps": 3}
    prefix = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    for kwargs in ({}, {"inference_delay": 2, "prev_chunk_left_over": prefix}):
        batch = {"state": np.array([0.1, -0.2, 0.3], np.float32), "seed": 4}
        np.testing.assert_array_equal(
            policy.predict_action_chunk(batch, **kwargs), loaded.predict_action_chunk(batch, **kwargs)
        )
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architecture"]["chunk_size"] == 10 and config["state_names"] == ["s0", "s1", "s2"]
    assert set(config["normalization"]) == {"state_mean", "state_std", "action_mean", "action_std"}


def test_overrides_and_wrong_format(tmp_path: Path) -> None:
    save_flow_policy(small_policy(), tmp_path / "ckpt")
    assert load_flow_policy(tmp_path / "ckpt", num_steps=3).num_steps == 3
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError):
        load_flow_policy(tmp_path / "bad")


def test_shipped_checkpoint_loads_through_the_spec_string() -> None:
    if not (default_checkpoint_dir() / "config.json").exists():
        pytest.skip("no checkpoint shipped yet")
    module_name, _, factory = SPEC.partition(":")
    policy = getattr(importlib.import_module(module_name), factory)()
    assert isinstance(policy, FlowMatchingPolicy)
    meta = policy.metadata
    assert meta.supports_rtc and meta.supports_batching and meta.action_dim == 8
    size = sum(f.stat().st_size for f in default_checkpoint_dir().iterdir())
    assert size < 5 * 1024 * 1024
    batch = policy.make_processors().pre({"state": np.zeros(meta.state_dim, np.float32)})
    chunk = policy.predict_action_chunk({**batch, "seed": 0})
    assert chunk.shape == (meta.chunk_size, 8) and np.isfinite(chunk).all()


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("action_mean", [0.5], "action_mean must be 4 finite values, got shape (1,)"),
        ("state_std", [1.0, 1.0], "state_std must be 3 finite values, got shape (2,)"),
        ("state_mean", [0.0, float("nan"), 0.0], "state_mean must be 3 finite values"),
        ("action_std", [1.0, 0.0, 1.0, 1.0], "action_std must be positive"),
    ],
)
def test_a_checkpoint_with_wrong_normalization_is_refused(
    tmp_path: Path, name: str, values: list[float], message: str
) -> None:
    """A short statistics list would broadcast over every dimension and serve wrong actions."""
    save_flow_policy(small_policy(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["normalization"][name] = values
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_flow_policy(tmp_path)
