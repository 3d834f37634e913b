"""Checkpoint files as users load them: the flow policy's (``models/checkpoint.py``), the worlds'
nets' (``models/net_checkpoint.py``) and the normalisation statistics (``models/flow_stats.py``).

Real checkpoints are written and read through the real code in ``tmp_path``; the expected numbers
are computed here, by hand or with numpy, not read back from the code under test.
"""

from __future__ import annotations

import json
import shutil
import stat
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

from rollserve.models import learned_world, video_world
from rollserve.models.checkpoint import (
    default_checkpoint_dir,
    load_default,
    load_flow_policy,
    save_flow_policy,
)
from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.flow_stats import NormStats
from rollserve.models.net_checkpoint import load_net_weights, read_net_config, save_net
from rollserve.rtc.config import RTCConfig


def f32(values: list[Any]) -> np.ndarray:
    """Expected values as the float32 arrays the code must return (compared with ``strict=True``:
    shape and dtype too, so a 0-d array is not broadcast against a whole row)."""
    return np.array(values, np.float32)


def small_policy() -> FlowMatchingPolicy:
    """A policy of 3 states and 2 actions whose statistics are exact in binary."""
    torch.manual_seed(0)
    net = VelocityNet(FlowNetConfig(chunk_size=4, action_dim=2, state_dim=3, hidden_dim=16, depth=1))
    stats = NormStats(
        np.array([1.0, -2.0, 0.5], np.float32),
        np.array([2.0, 0.25, 4.0], np.float32),
        np.array([0.5, -1.5], np.float32),
        np.array([0.5, 8.0], np.float32),
    )
    return FlowMatchingPolicy(
        net,
        stats,
        ["x", "grip"],
        state_names=["s0", "s1", "s2"],
        control_hz=12.5,
        num_steps=5,
        rtc=RTCConfig(enabled=True, execution_horizon=3, max_guidance_weight=4.0),
        name="review-policy",
        info={"steps": 7, "note": "review"},
    )


def test_the_written_config_holds_every_setting_under_its_key(tmp_path: Path) -> None:
    """``config.json`` is the checkpoint's documented format: other tools read it without rollserve."""
    save_flow_policy(small_policy(), tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert config["format"] == "rollserve.flow_policy" and config["format_version"] == 1
    assert config["name"] == "review-policy"
    assert config["sampling"] == {"num_steps": 5, "integrator": "euler", "tau": "0=noise -> 1=data"}
    assert config["action_names"] == ["x", "grip"] and config["state_names"] == ["s0", "s1", "s2"]
    assert config["control_hz"] == 12.5
    assert config["training"] == {"steps": 7, "note": "review"}
    assert config["normalization"] == {
        "state_mean": [1.0, -2.0, 0.5],
        "state_std": [2.0, 0.25, 4.0],
        "action_mean": [0.5, -1.5],
        "action_std": [0.5, 8.0],
    }


# -- the shipped checkpoints: read and written back, byte for byte ---------------------------------


def _files_equal(written: Path, shipped: Path) -> None:
    for name in ("config.json", "model.safetensors"):
        assert (written / name).read_bytes() == (shipped / name).read_bytes(), name


def test_the_shipped_policy_written_back_is_the_shipped_files(tmp_path: Path) -> None:
    """Loading and saving loses nothing: same weights, same settings, same text (2-space indent,
    a final new line), into a directory whose parents are made on the way."""
    out = save_flow_policy(load_default(), tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b"
    _files_equal(out, default_checkpoint_dir())


@pytest.mark.parametrize(
    ("load", "save", "shipped"),
    [
        (
            learned_world.load_world_model,
            learned_world.save_world_model,
            learned_world.default_checkpoint_dir(),
        ),
        (
            video_world.load_video_world_net,
            video_world.save_video_world,
            video_world.default_checkpoint_dir(),
        ),
    ],
    ids=["learned", "video"],
)
def test_a_shipped_world_net_written_back_is_the_shipped_files(
    tmp_path: Path, load: Callable[[Path], Any], save: Callable[[Any, Path], Path], shipped: Path
) -> None:
    """The worlds' nets go through the one writer and reader: what ships reads and writes back
    unchanged, so a retrained net's files differ from the shipped ones only by what training did."""
    out = save(load(shipped), tmp_path / "a" / "b")
    assert out == tmp_path / "a" / "b"
    _files_equal(out, shipped)


def test_the_weights_file_names_its_format_and_is_readable_by_all(tmp_path: Path) -> None:
    """safetensors creates its file 0600: a checkpoint shipped or copied for another user must load."""
    out = save_flow_policy(small_policy(), tmp_path / "ck")
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o644
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        assert weights.metadata() == {"format": "rollserve.flow_policy"}
    net_out = save_net(nn.Linear(2, 3), _Config(), tmp_path / "net" / "ck", fmt="test.net", version=4)
    with safe_open(str(net_out / "model.safetensors"), "pt") as weights:
        assert weights.metadata() == {"format": "test.net"}
    assert json.loads((net_out / "config.json").read_text()) == {
        "format": "test.net",
        "format_version": 4,
        "width": 3,
    }


class _Config:
    """A net's config as ``save_net`` takes it: anything with a flat ``to_dict``."""

    def to_dict(self) -> dict[str, Any]:
        return {"width": 3}


# -- the flow policy's loader: settings, overrides, refusals ---------------------------------------


def test_a_loaded_policy_has_every_stored_setting(tmp_path: Path) -> None:
    save_flow_policy(small_policy(), tmp_path / "ck")
    loaded = load_flow_policy(tmp_path / "ck")
    meta = loaded.metadata
    assert meta.name == "review-policy" and meta.fps == 12.5 and meta.action_names == ("x", "grip")
    assert loaded.state_names == ("s0", "s1", "s2") and loaded.num_steps == 5
    assert loaded.rtc == RTCConfig(enabled=True, execution_horizon=3, max_guidance_weight=4.0)
    assert loaded.info == {"steps": 7, "note": "review"}
    assert loaded.stats.state_std.dtype == np.float32 and loaded.stats.action_mean.dtype == np.float32
    np.testing.assert_array_equal(loaded.stats.state_std, f32([2.0, 0.25, 4.0]), strict=True)
    np.testing.assert_array_equal(loaded.stats.action_mean, f32([0.5, -1.5]), strict=True)


def test_overrides_replace_the_stored_settings(tmp_path: Path) -> None:
    save_flow_policy(small_policy(), tmp_path / "ck")
    rtc = RTCConfig(enabled=False, execution_horizon=2)
    loaded = load_flow_policy(tmp_path / "ck", rtc=rtc, name="other", control_hz=30.0, num_steps=2)
    assert loaded.rtc == rtc and loaded.metadata.name == "other" and loaded.metadata.fps == 30.0
    assert loaded.num_steps == 2 and not loaded.metadata.supports_rtc


def test_the_seed_given_to_the_loader_seeds_the_policys_noise(tmp_path: Path) -> None:
    """A load with a seed serves, for unseeded requests, the chunks of a policy built in memory
    with that seed; without one, those of seed 0 (a policy's own default)."""
    policy = small_policy()
    save_flow_policy(policy, tmp_path / "ck")
    batch = {"state": np.zeros(3, np.float32)}
    built = FlowMatchingPolicy(policy.net, policy.stats, ["x", "grip"], seed=3, num_steps=5, rtc=policy.rtc)
    loaded = load_flow_policy(tmp_path / "ck", seed=3)
    np.testing.assert_array_equal(loaded.predict_action_chunk(batch), built.predict_action_chunk(batch))
    default = load_flow_policy(tmp_path / "ck")
    assert not np.array_equal(default.predict_action_chunk(batch), loaded.predict_action_chunk(batch))
    built_0 = FlowMatchingPolicy(policy.net, policy.stats, ["x", "grip"], seed=0, num_steps=5, rtc=policy.rtc)
    np.testing.assert_array_equal(
        load_flow_policy(tmp_path / "ck").predict_action_chunk(batch), built_0.predict_action_chunk(batch)
    )


def test_load_default_passes_its_device_and_settings_on() -> None:
    """The factory behind ``rollserve serve``'s default policy: ``device`` and ``--policy-arg``s
    reach the loader (the meta device tells a dropped device from the CPU default)."""
    policy = load_default(device="meta", num_steps=2, seed=1)
    assert policy.device == torch.device("meta") and next(policy.net.parameters()).is_meta
    assert policy.num_steps == 2
    assert load_default().device == torch.device("cpu")


def _edited_copy(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(default_checkpoint_dir(), copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_checkpoint_without_a_version_or_training_record_loads(tmp_path: Path) -> None:
    """A checkpoint written before ``format_version`` (version 0) or without its training record
    is still this format."""
    path = _edited_copy(tmp_path, lambda c: [c.pop("format_version"), c.pop("training")])
    policy = load_flow_policy(path)
    assert policy.info == {} and policy.metadata.action_dim == 8


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c.update(format="rollserve.world_model"),
            "is not a rollserve.flow_policy checkpoint (format='rollserve.world_model')",
        ),
        (lambda c: c.pop("format"), "is not a rollserve.flow_policy checkpoint (format=None)"),
        (lambda c: c.update(format_version=2), ": format_version 2 is newer than this rollserve"),
    ],
    ids=["other-format", "no-format", "newer"],
)
def test_a_checkpoint_of_another_format_or_a_newer_version_is_refused_in_words(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = _edited_copy(tmp_path, edit)
    with pytest.raises(ValueError) as refused:
        load_flow_policy(path)
    expected = f"{path}{message}" if message.startswith(":") else f"{path} {message}"
    assert str(refused.value) == expected


# -- the worlds' nets: the config without its format fields, refusals in words ----------------------


def test_a_world_nets_config_is_read_without_its_format_fields() -> None:
    shipped = learned_world.default_checkpoint_dir()
    stored = json.loads((shipped / "config.json").read_text())
    read = read_net_config(shipped, fmt="rollserve.world_model", version=1)
    assert read == {k: v for k, v in stored.items() if k not in ("format", "format_version")}


def test_a_world_net_without_a_version_loads_and_a_newer_or_unnamed_one_is_refused(tmp_path: Path) -> None:
    save_net(nn.Linear(2, 3), _Config(), tmp_path / "old", fmt="test.net", version=1)
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["format_version"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    assert read_net_config(tmp_path / "old", fmt="test.net", version=1) == {"width": 3}
    save_net(nn.Linear(2, 3), _Config(), tmp_path / "new", fmt="test.net", version=2)
    with pytest.raises(ValueError) as refused:
        read_net_config(tmp_path / "new", fmt="test.net", version=1)
    assert str(refused.value) == f"{tmp_path / 'new'} was written by a newer rollserve"
    with pytest.raises(ValueError) as refused:
        read_net_config(tmp_path / "new", fmt="test.other", version=2)
    assert str(refused.value) == f"{tmp_path / 'new'} is not a test.other checkpoint"
    del config["format"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as refused:
        read_net_config(tmp_path / "old", fmt="test.net", version=1)
    assert str(refused.value) == f"{tmp_path / 'old'} is not a test.net checkpoint"


def test_world_net_weights_load_into_the_net_given(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = nn.Linear(2, 3)
    save_net(saved, _Config(), tmp_path / "ck", fmt="test.net", version=1)
    fresh = nn.Linear(2, 3)
    assert load_net_weights(fresh, tmp_path / "ck") is fresh
    torch.testing.assert_close(fresh.weight, saved.weight, rtol=0, atol=0)
    torch.testing.assert_close(fresh.bias, saved.bias, rtol=0, atol=0)


# -- normalisation statistics ----------------------------------------------------------------------


def review_stats() -> NormStats:
    return small_policy().stats


def test_fitted_statistics_are_float64_moments_floored_at_a_hundredth() -> None:
    """Column 0 is 2**24 and three ones: float32 sums would drop every one (mean 4194304); the
    moments are taken in float64 and rounded once. A constant column and one whose spread is
    under 0.01 get the floor 0.01, so a constant joint does not divide by zero when served."""
    states = np.array([[2**24, 3.0, 0.0], [1, 3.0, 0.01], [1, 3.0, 0.0], [1, 3.0, 0.01]], np.float32)
    actions = np.array([[1.0], [3.0], [1.0], [3.0]], np.float32)
    mean0 = Fraction(2**24 + 3, 4)
    var0 = ((2**24 - mean0) ** 2 + 3 * (1 - mean0) ** 2) / 4
    stats = NormStats.fit(states, actions)
    for values in (stats.state_mean, stats.state_std, stats.action_mean, stats.action_std):
        assert values.dtype == np.float32
    np.testing.assert_array_equal(stats.state_mean, f32([float(mean0), 3.0, 0.005]), strict=True)
    np.testing.assert_array_equal(stats.state_std, f32([float(var0) ** 0.5, 0.01, 0.01]), strict=True)
    np.testing.assert_array_equal(stats.action_mean, f32([2.0]), strict=True)
    np.testing.assert_array_equal(stats.action_std, f32([1.0]), strict=True)


def test_identity_statistics_are_zeros_and_ones_of_each_size() -> None:
    stats = NormStats.identity(3, 2)
    for values, size, fill in (
        (stats.state_mean, 3, 0.0),
        (stats.state_std, 3, 1.0),
        (stats.action_mean, 2, 0.0),
        (stats.action_std, 2, 1.0),
    ):
        assert values.dtype == np.float32
        np.testing.assert_array_equal(values, np.full(size, fill, np.float32), strict=True)


def test_states_and_actions_are_normalised_with_each_dimensions_statistics() -> None:
    """(x - mean) / std and back, by hand: state means (1, -2, 0.5), stds (2, 0.25, 4); action
    means (0.5, -1.5), stds (0.5, 8)."""
    stats = review_stats()
    state = stats.normalize_state(np.array([3.0, -1.5, 2.5]))
    assert state.dtype == np.float32
    np.testing.assert_array_equal(state, f32([1.0, 2.0, 0.5]), strict=True)
    actions = stats.normalize_actions(np.array([[1.0, 6.5], [0.0, -1.5]]))
    assert actions.dtype == np.float32
    np.testing.assert_array_equal(actions, f32([[1.0, 1.0], [-1.0, 0.0]]), strict=True)
    robot = stats.unnormalize_actions(np.array([[1.0, 1.0], [-1.0, 0.0]]))
    assert robot.dtype == np.float32
    np.testing.assert_array_equal(robot, f32([[1.0, 6.5], [0.0, -1.5]]), strict=True)


def test_float64_inputs_are_rounded_to_float32_before_the_arithmetic() -> None:
    """Served requests arrive as float32, training data may be float64: both round the input to
    float32 first, so a value a quarter float32 step off the mean normalises to exactly 0."""
    stats = review_stats()
    np.testing.assert_array_equal(
        stats.normalize_state(np.array([1 + 2.0**-30, -2.0, 0.5])), f32([0, 0, 0]), strict=True
    )
    np.testing.assert_array_equal(
        stats.normalize_actions(np.array([[0.5 + 2.0**-30, -1.5]])), f32([[0, 0]]), strict=True
    )
    np.testing.assert_array_equal(
        stats.unnormalize_actions(np.array([[-1 - 2.0**-25, 0.0]])), f32([[0, -1.5]]), strict=True
    )


def test_statistics_read_from_a_dict_are_float32() -> None:
    stats = NormStats.from_dict(
        {"state_mean": [0.1], "state_std": [1.0], "action_mean": [0.2, 0.3], "action_std": [2.0, 4.0]}
    )
    for values in (stats.state_mean, stats.state_std, stats.action_mean, stats.action_std):
        assert values.dtype == np.float32
    np.testing.assert_array_equal(stats.state_mean, f32([0.1]), strict=True)
    np.testing.assert_array_equal(stats.action_mean, f32([0.2, 0.3]), strict=True)


def _with(name: str, values: list[float]) -> NormStats:
    fields = {k: np.asarray(v, np.float32) for k, v in review_stats().to_dict().items()}
    fields[name] = np.asarray(values, np.float32)
    return NormStats(**fields)


def test_statistics_that_fit_pass_the_check_and_means_may_be_negative() -> None:
    review_stats().check(3, 2)
    _with("state_mean", [-1.0, -2.0, 0.0]).check(3, 2)
    _with("action_mean", [-0.5, 0.0]).check(3, 2)


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("state_mean", [1.0, 2.0], "normalization state_mean must be 3 finite values, got shape (2,)"),
        ("state_std", [1.0, 1.0], "normalization state_std must be 3 finite values, got shape (2,)"),
        ("action_mean", [0.5, 0.5, 0.5], "normalization action_mean must be 2 finite values, got shape (3,)"),
        ("action_std", [1.0], "normalization action_std must be 2 finite values, got shape (1,)"),
        ("action_std", [[1.0, 1.0]], "normalization action_std must be 2 finite values, got shape (1, 2)"),
        (
            "state_std",
            [1.0, float("inf"), 1.0],
            "normalization state_std must be 3 finite values, got shape (3,)",
        ),
        (
            "action_mean",
            [float("-inf"), 0.0],
            "normalization action_mean must be 2 finite values, got shape (2,)",
        ),
        ("state_std", [1.0, -0.5, 1.0], "normalization state_std must be positive"),
        ("action_std", [0.0, 1.0], "normalization action_std must be positive"),
    ],
)
def test_statistics_that_do_not_fit_are_refused_in_words(
    name: str, values: list[float], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        _with(name, values).check(3, 2)
    assert str(refused.value) == message


def test_a_checkpoint_with_a_negative_std_is_refused_when_it_loads(tmp_path: Path) -> None:
    path = _edited_copy(tmp_path, lambda c: c["normalization"]["state_std"].__setitem__(0, -1.0))
    with pytest.raises(ValueError) as refused:
        load_flow_policy(path)
    assert str(refused.value) == "normalization state_std must be positive"
