"""Review of the LeRobot adapter against docs/lerobot.md, written for its mutation run.

What is pinned here is what docs/lerobot.md and the adapter's docstrings promise: the supported
types and their chunk fields, the refusals' exact words, the metadata read from each tiny
checkpoint, the per-session pipelines, history and seeded noise, the post-processor's robot units
(computed here from the tiny checkpoints' own stats), and how requests are grouped into LeRobot
calls (a recording stand-in for the LeRobot policy: a one-layer unit test).
"""

from __future__ import annotations

import json
import shutil
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lerobot")

import torch

from rollserve.adapters.lerobot import (
    SPEC_PREFIX,
    SUPPORTED_TYPES,
    LeRobotLoadError,
    TypeSupport,
    UnsupportedPolicyType,
    load_lerobot_policy,
    read_policy_type,
    tiny,
)
from rollserve.adapters.lerobot import loading as lerobot_loading
from rollserve.adapters.lerobot.policy import LeRobotPolicy, _concat
from rollserve.models.policy import PolicyMetadata, PolicyRequest
from rollserve.wire.errors import BAD_FIELD, BAD_SHAPE, UNSUPPORTED_DTYPE, WireError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

CAMERAS = ("top", "wrist")


def _obs(seed: int = 0, **changes: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    obs = {
        "state": rng.standard_normal(6).astype(np.float32),
        "images": {cam: rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for cam in CAMERAS},
        "task": "put the cube in the bowl",
    }
    obs.update(changes)
    return obs


# -- the supported types (docs/lerobot.md "Supported policy types") ------------------------------


def test_the_supported_types_and_what_each_needs() -> None:
    assert SPEC_PREFIX == "lerobot:"
    assert sorted(SUPPORTED_TYPES) == ["act", "diffusion", "pi0", "pi05", "smolvla"]
    assert SUPPORTED_TYPES["act"] == TypeSupport(chunk_field="chunk_size")
    assert SUPPORTED_TYPES["diffusion"] == TypeSupport(
        chunk_field="n_action_steps",
        history=True,
        noise=True,
        noise_length_field="horizon",
        noise_width="action_dim",
    )
    for flow in ("smolvla", "pi0", "pi05"):
        assert SUPPORTED_TYPES[flow] == TypeSupport(chunk_field="chunk_size", rtc=True, noise=True)
    plain = TypeSupport(chunk_field="x")
    assert (plain.rtc, plain.history, plain.noise) == (False, False, False)
    assert (plain.noise_length_field, plain.noise_width) == ("chunk_size", "max_action_dim")


def test_an_unsupported_type_names_the_supported_ones() -> None:
    error = UnsupportedPolicyType("vqbet")
    assert isinstance(error, ValueError)
    assert error.policy_type == "vqbet"
    assert (
        str(error)
        == "LeRobot policy type 'vqbet' is not supported; rollserve serves act, diffusion, pi0, pi05, smolvla"
    )


# -- read_policy_type: config.json only ------------------------------------------------------------


def _dir_with_config(tmp_path: Path, text: str) -> Path:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text(text)
    return out


@pytest.mark.parametrize("policy_type", ["act", "diffusion", "smolvla", "pi0", "pi05"])
def test_read_policy_type_returns_a_supported_type(tmp_path: Path, policy_type: str) -> None:
    assert read_policy_type(_dir_with_config(tmp_path, json.dumps({"type": policy_type}))) == policy_type


def test_read_policy_type_refusals_word_for_word(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(LeRobotLoadError) as info:
        read_policy_type(missing)
    assert str(info.value) == f"{str(missing)!r} is not a directory"
    a_file = tmp_path / "file"
    a_file.write_text("{}")
    with pytest.raises(LeRobotLoadError) as info:
        read_policy_type(a_file)
    assert str(info.value) == f"{str(a_file)!r} is not a directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LeRobotLoadError) as info:
        read_policy_type(empty)
    assert str(info.value) == f"{str(empty)!r} has no config.json (is it a LeRobot pretrained_model dir?)"
    (empty / "config.json").mkdir()  # a directory named config.json is not a config
    with pytest.raises(LeRobotLoadError, match=r"has no config\.json"):
        read_policy_type(empty)


def test_an_unreadable_config_names_the_file(tmp_path: Path) -> None:
    path = _dir_with_config(tmp_path, "{not json")
    with pytest.raises(LeRobotLoadError) as info:
        read_policy_type(path)
    assert str(info.value).startswith(f"cannot read {path / 'config.json'}: Expecting property name")
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize("text", ["[1, 2]", "{}", '{"type": 3}', '{"type": null}', '"act"'])
def test_a_config_without_a_string_type_is_refused(tmp_path: Path, text: str) -> None:
    path = _dir_with_config(tmp_path, text)
    with pytest.raises(LeRobotLoadError) as info:
        read_policy_type(path)
    assert str(info.value) == f"{path / 'config.json'} has no policy 'type'"


def test_an_unknown_type_is_refused_as_unsupported(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedPolicyType) as info:
        read_policy_type(_dir_with_config(tmp_path, '{"type": "tdmpc"}'))
    assert info.value.policy_type == "tdmpc"


# -- the options' checks (unit: the values at their edges) -----------------------------------------


@pytest.mark.parametrize("seed", [None, 0, 1, 2**64 - 1, np.int64(5)])
def test_whole_seeds_from_0_to_2_64_minus_1_pass(seed: object) -> None:
    lerobot_loading._check_seed(seed)


@pytest.mark.parametrize("seed", [-1, 2**64, False, 1.0, "1"])
def test_other_seeds_are_refused_word_for_word(seed: object) -> None:
    with pytest.raises(LeRobotLoadError) as info:
        lerobot_loading._check_seed(seed)
    assert str(info.value) == f"seed must be a whole number from 0 to 2**64 - 1, got {seed!r}"


def test_max_seed_is_two_to_the_64_minus_one() -> None:
    assert lerobot_loading.MAX_SEED == 18446744073709551615


@pytest.mark.parametrize(
    "options",
    [
        (30.0, True, None, None),
        (1e-9, False, 1, 1e-9),
        (15, True, np.int64(3), 5),
        (np.float32(12.5), True, 10, np.float64(2.5)),
    ],
)
def test_valid_options_pass(options: tuple) -> None:
    lerobot_loading._check_options(*options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ((-1.0, True, None, None), "fps must be a positive number, got -1.0"),
        ((float("nan"), True, None, None), "fps must be a positive number, got nan"),
        ((None, True, None, None), "fps must be a positive number, got None"),
        ((30.0, None, None, None), "rtc must be true or false, got None"),
        ((30.0, 1, None, None), "rtc must be true or false, got 1"),
        ((30.0, True, -1, None), "execution_horizon must be a whole number from 1, got -1"),
        ((30.0, True, "4", None), "execution_horizon must be a whole number from 1, got '4'"),
        ((30.0, True, False, None), "execution_horizon must be a whole number from 1, got False"),
        ((30.0, True, None, 0), "max_guidance_weight must be a positive number, got 0"),
        ((30.0, True, None, float("inf")), "max_guidance_weight must be a positive number, got inf"),
        ((30.0, True, None, True), "max_guidance_weight must be a positive number, got True"),
    ],
)
def test_bad_options_are_refused_word_for_word(options: tuple, message: str) -> None:
    with pytest.raises(LeRobotLoadError) as info:
        lerobot_loading._check_options(*options)
    assert str(info.value) == message


def test_options_are_checked_in_the_documented_order() -> None:
    """fps, then rtc, then the horizon, then the guidance weight: the first bad one is named."""
    with pytest.raises(LeRobotLoadError, match=r"^fps"):
        lerobot_loading._check_options(0, "x", 0, 0)
    with pytest.raises(LeRobotLoadError, match=r"^rtc"):
        lerobot_loading._check_options(1, "x", 0, 0)
    with pytest.raises(LeRobotLoadError, match=r"^execution_horizon"):
        lerobot_loading._check_options(1, True, 0, 0)


def test_camera_names_drop_the_images_prefix_only() -> None:
    assert lerobot_loading.IMAGE_PREFIX == "observation.images."
    assert lerobot_loading._camera_name("observation.images.top") == "top"
    assert lerobot_loading._camera_name("observation.images.front.left") == "front.left"
    assert lerobot_loading._camera_name("observation.image") == "observation.image"
    assert lerobot_loading._camera_name("top") == "top"


def test_action_names_default_and_given() -> None:
    names = lerobot_loading._action_names
    assert names(None, 3) == ("action_0", "action_1", "action_2")
    assert names(" a, b ,c", 3) == ("a", "b", "c")
    assert names(["x", " y "], 2) == ("x", "y")
    assert names((1, 2), 2) == ("1", "2")
    with pytest.raises(LeRobotLoadError) as info:
        names("a,b", 3)
    assert str(info.value) == "the checkpoint has 3 action dimensions; got 2 names"
    with pytest.raises(LeRobotLoadError) as info:
        names("a,,c", 3)  # an empty name
    assert str(info.value) == "the checkpoint has 3 action dimensions; got 3 names"
    with pytest.raises(LeRobotLoadError, match="got 4 names"):
        names(["a", "b", "c", "d"], 3)


# -- loading the tiny checkpoints (docs/lerobot.md "metadata" row and the options table) ------------


def test_act_metadata_from_config_json(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_lerobot_policy(lerobot_checkpoints["act"])
    assert policy.metadata == PolicyMetadata(
        name="lerobot-act:act",
        action_names=("action_0", "action_1", "action_2", "action_3", "action_4", "action_5"),
        chunk_size=10,
        state_dim=6,
        camera_names=("top", "wrist"),
        image_shape=(32, 32, 3),
        fps=30.0,
        supports_rtc=False,
        supports_batching=True,
    )
    assert type(policy.metadata.fps) is float and type(policy.metadata.chunk_size) is int
    assert policy.camera_keys == {"top": "observation.images.top", "wrist": "observation.images.wrist"}
    assert policy.image_shape == (32, 32, 3)
    assert policy.device == torch.device("cpu")
    assert policy.seed is None
    assert policy.support is SUPPORTED_TYPES["act"]
    assert not policy.lerobot_policy.training  # eval mode
    assert not hasattr(policy, "rtc")  # not a flow policy: no RTC settings announced


def test_diffusion_metadata_and_options(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_lerobot_policy(
        str(lerobot_checkpoints["diffusion"]),
        seed=11,
        fps=12.5,
        name="mine",
        action_names="a,b,c,d,e,f",
    )
    meta = policy.metadata
    assert (meta.name, meta.chunk_size, meta.fps, meta.supports_rtc) == ("mine", 8, 12.5, False)
    assert meta.action_names == ("a", "b", "c", "d", "e", "f")
    assert policy.seed == 11
    assert policy._noise_shape == (16, 6)  # horizon 16, action_dim 6


def test_smolvla_with_rtc_on_and_overridden(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_lerobot_policy(
        lerobot_checkpoints["smolvla"], execution_horizon=4, max_guidance_weight=2.5, fps=np.int64(15)
    )
    meta = policy.metadata
    assert (meta.name, meta.chunk_size, meta.supports_rtc, meta.fps) == (
        "lerobot-smolvla:smolvla",
        10,
        True,
        15.0,
    )
    assert type(meta.fps) is float
    assert (policy.rtc.enabled, policy.rtc.execution_horizon) == (True, 4)
    rtc = policy.lerobot_policy.config.rtc_config
    assert (rtc.enabled, rtc.execution_horizon, rtc.max_guidance_weight) == (True, 4, 2.5)
    assert type(rtc.execution_horizon) is int and type(rtc.max_guidance_weight) is float
    assert policy._noise_shape == (10, 8)  # chunk_size 10, max_action_dim 8


def test_smolvla_rtc_keeps_the_checkpoints_settings_unless_given(
    lerobot_checkpoints: dict[str, Path],
) -> None:
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    default = RTCConfig()
    policy = load_lerobot_policy(lerobot_checkpoints["smolvla"])
    rtc = policy.lerobot_policy.config.rtc_config
    assert rtc.enabled is True
    assert (rtc.execution_horizon, rtc.max_guidance_weight) == (
        default.execution_horizon,
        default.max_guidance_weight,
    )
    assert policy.rtc.execution_horizon == default.execution_horizon


def test_smolvla_with_rtc_off(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_lerobot_policy(lerobot_checkpoints["smolvla"], rtc=False, execution_horizon=3)
    assert policy.metadata.supports_rtc is False
    assert policy.lerobot_policy.config.rtc_config is None  # the tiny checkpoint leaves it off


def test_load_expands_the_user_home(
    lerobot_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = lerobot_checkpoints["act"]
    monkeypatch.setenv("HOME", str(path.parent))
    assert load_lerobot_policy(f"~/{path.name}").metadata.name == "lerobot-act:act"


def test_a_checkpoint_lerobot_cannot_load_is_refused(
    lerobot_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(lerobot_checkpoints["act"], broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(LeRobotLoadError) as info:
        load_lerobot_policy(broken)
    assert str(info.value).startswith("LeRobot could not load the act checkpoint: ")
    assert info.value.__cause__ is not None


def test_an_environment_state_checkpoint_is_refused(
    lerobot_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """docs/lerobot.md: checkpoints that need observation.environment_state are refused."""
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    inputs, outputs = tiny._features(("top",))
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs["observation.environment_state"] = PolicyFeature(type=FeatureType.ENV, shape=(4,))
    config = ACTConfig(
        input_features=inputs, output_features=outputs, chunk_size=4, n_action_steps=4,
        pretrained_backbone_weights=None, dim_model=16, n_heads=2, dim_feedforward=16,
        n_encoder_layers=1, n_decoder_layers=1, latent_dim=4, device="cpu",
    )  # fmt: skip
    out = tmp_path / "env"
    out.mkdir()
    ACTPolicy(config).save_pretrained(out)
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(config, dataset_stats=None)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    with pytest.raises(LeRobotLoadError) as info:
        load_lerobot_policy(out)
    assert str(info.value) == (
        "this checkpoint needs observation.environment_state, which rollserve's observation lacks"
    )


# -- per session (docs/lerobot.md "What the adapter does, per request") -----------------------------


@pytest.fixture(scope="module")
def act(lerobot_checkpoints: dict[str, Path]) -> Any:
    return load_lerobot_policy(lerobot_checkpoints["act"], seed=5)


def test_pre_gives_lerobots_batch_without_history_or_noise_for_act(act: Any) -> None:
    obs = _obs()
    out = act.make_processors().pre(obs)
    assert set(out) == {"lerobot", "history", "noise"}
    assert out["history"] is None and out["noise"] is None  # ACT: no queues, no noise (seed or not)
    batch = out["lerobot"]
    assert batch["observation.state"].shape == (1, 6)
    for cam in CAMERAS:
        assert batch[f"observation.images.{cam}"].shape == (1, 3, 32, 32)
    # the checkpoint's normaliser on the state (tiny's stats: mean linspace(-0.3, 0.4), std (0.5, 1.5))
    mean, std = np.linspace(-0.3, 0.4, 6), np.linspace(0.5, 1.5, 6)
    np.testing.assert_allclose(
        batch["observation.state"][0].numpy(), (obs["state"] - mean) / std, rtol=1e-5, atol=1e-6
    )
    image = obs["images"]["top"].transpose(2, 0, 1) / 255.0
    np.testing.assert_allclose(
        batch["observation.images.top"][0].numpy(), (image - 0.45) / 0.25, rtol=1e-5, atol=1e-5
    )


def test_each_session_gets_deep_copies_of_the_pipelines(act: Any) -> None:
    """docs/lerobot.md: every session (and reset) gets its own deep copy of both pipelines."""
    from rollserve.adapters.lerobot.policy import SessionState

    def state_of(processors: Any) -> SessionState:
        return next(
            c.cell_contents for c in processors.pre.__closure__ if isinstance(c.cell_contents, SessionState)
        )

    one, two = state_of(act.make_processors()), state_of(act.make_processors())
    for name, template in (("preprocessor", act._pre_template), ("postprocessor", act._post_template)):
        steps = [getattr(one, name).steps, getattr(two, name).steps, template.steps]
        assert len({len(s) for s in steps}) == 1
        for a, b, t in zip(*steps, strict=True):
            assert a is not b and a is not t and b is not t and type(a) is type(t)


def test_the_robots_arrays_are_copied_not_shared(act: Any) -> None:
    obs = _obs()
    state = obs["state"].copy()
    out = act.make_processors().pre(obs)
    obs["state"][:] = 100.0
    obs["images"]["top"][:] = 0
    mean, std = np.linspace(-0.3, 0.4, 6), np.linspace(0.5, 1.5, 6)
    np.testing.assert_allclose(
        out["lerobot"]["observation.state"][0].numpy(), (state - mean) / std, rtol=1e-5, atol=1e-6
    )


def test_the_state_reaches_lerobot_as_float32(act: Any) -> None:
    """A state given as a list of numbers (float64 to numpy) is handed over as float32."""
    state = [0.1, -0.2, 0.3, 0.4, -0.5, 0.6]
    batch = act.make_processors().pre(_obs(state=state))["lerobot"]
    assert batch["observation.state"].dtype == torch.float32
    mean, std = np.linspace(-0.3, 0.4, 6), np.linspace(0.5, 1.5, 6)
    expected = (np.float32(state) - mean.astype(np.float32)) / std.astype(np.float32)
    np.testing.assert_allclose(batch["observation.state"][0].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_lerobots_conversion_gets_the_policys_device_and_the_task(
    act: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lerobot.policies.utils as lerobot_utils

    real = lerobot_utils.prepare_observation_for_inference
    seen = []

    def recording(observation: dict, device: Any, task: Any = None, robot_type: Any = None) -> Any:
        seen.append((device, task, robot_type))
        return real(observation, device, task, robot_type)

    monkeypatch.setattr(lerobot_utils, "prepare_observation_for_inference", recording)
    act.make_processors().pre(_obs(task="pick up the red block"))
    assert seen == [(torch.device("cpu"), "pick up the red block", None)]


@pytest.mark.parametrize("task", [None, ""])
def test_no_task_is_the_empty_task(act: Any, task: Any) -> None:
    batch = act.make_processors().pre(_obs(task=task))["lerobot"]
    assert batch["task"] in ("", [""])


def test_a_task_that_is_not_a_string_is_refused(act: Any) -> None:
    with pytest.raises(WireError) as info:
        act.make_processors().pre(_obs(task=3))
    assert info.value.code == BAD_FIELD
    assert info.value.message == "task must be a string, got int"


def test_images_must_be_uint8_hwc_with_the_checkpoints_channels(act: Any) -> None:
    pre = act.make_processors().pre
    images = _obs()["images"]
    with pytest.raises(WireError) as info:
        pre(_obs(images={**images, "wrist": images["wrist"].astype(np.float32)}))
    assert (info.value.code, info.value.message) == (
        UNSUPPORTED_DTYPE,
        "image 'wrist' must be uint8, got float32",
    )
    with pytest.raises(WireError) as info:
        pre(_obs(images={**images, "top": np.zeros((32, 32, 4), np.uint8)}))
    assert (info.value.code, info.value.message) == (BAD_SHAPE, "image 'top' must be HxWx3, got (32, 32, 4)")
    with pytest.raises(WireError) as info:
        pre(_obs(images={**images, "top": np.zeros((32, 32), np.uint8)}))
    assert (info.value.code, info.value.message) == (BAD_SHAPE, "image 'top' must be HxWx3, got (32, 32)")


def test_post_unnormalises_into_robot_units(act: Any) -> None:
    """ACT's actions are mean/std normalised; tiny's stats: mean linspace(-0.2, 0.6), std (0.5, 1.5)."""
    mean, std = np.linspace(-0.2, 0.6, 6), np.linspace(0.5, 1.5, 6)
    chunk = np.arange(60, dtype=np.float64).reshape(10, 6) / 30 - 1  # float64 in: cast by the adapter
    out = act.make_processors().post(chunk)
    assert out.dtype == np.float32 and out.shape == (10, 6)
    np.testing.assert_allclose(out, chunk * std + mean, rtol=1e-5, atol=1e-6)
    assert chunk[0, 0] == -1.0  # the input is left alone


def test_post_works_in_float32_whatever_the_chunks_dtype(act: Any) -> None:
    """The model's chunks are float32: a float64 chunk is cast first, so it gives the same bytes."""
    chunk = np.random.default_rng(3).standard_normal((10, 6)) * 3  # float64, not float32-exact
    post = act.make_processors().post
    assert post(chunk).tobytes() == post(chunk.astype(np.float32)).tobytes()


def test_a_seed_fixes_each_sessions_noise(lerobot_checkpoints: dict[str, Path]) -> None:
    """A fresh torch.Generator(seed) per session: the draws of torch.normal with it, in order."""
    policy = load_lerobot_policy(lerobot_checkpoints["smolvla"], seed=7)
    generator = torch.Generator().manual_seed(7)
    first = torch.normal(0.0, 1.0, size=(1, 10, 8), generator=generator)
    second = torch.normal(0.0, 1.0, size=(1, 10, 8), generator=generator)
    session = policy.make_processors()
    a, b = session.pre(_obs(1))["noise"], session.pre(_obs(2))["noise"]
    assert a.dtype == torch.float32 and a.shape == (1, 10, 8)
    assert torch.equal(a, first) and torch.equal(b, second)
    assert torch.equal(policy.make_processors().pre(_obs(3))["noise"], first)  # a new session starts over


def test_without_a_seed_there_is_no_noise(lerobot_checkpoints: dict[str, Path]) -> None:
    policy = load_lerobot_policy(lerobot_checkpoints["smolvla"])
    assert policy.make_processors().pre(_obs())["noise"] is None


def test_diffusion_history_fills_as_select_action_fills_it(lerobot_checkpoints: dict[str, Path]) -> None:
    """Two observation steps: the first observation fills both; the next one shifts in."""
    policy = load_lerobot_policy(lerobot_checkpoints["diffusion"], seed=1)
    session = policy.make_processors()
    one = session.pre(_obs(1))
    history = one["history"]
    assert set(history) == {"observation.state", "observation.images"}
    assert history["observation.state"].shape == (1, 2, 6)
    assert history["observation.images"].shape == (1, 2, 2, 3, 32, 32)  # batch, steps, cameras, CHW
    state1 = one["lerobot"]["observation.state"][0]
    assert torch.equal(history["observation.state"][0, 0], state1) and torch.equal(
        history["observation.state"][0, 1], state1
    )
    assert torch.equal(history["observation.images"][0, 0, 1], one["lerobot"]["observation.images.wrist"][0])
    two = session.pre(_obs(2))
    state2 = two["lerobot"]["observation.state"][0]
    assert torch.equal(two["history"]["observation.state"][0, 0], state1)
    assert torch.equal(two["history"]["observation.state"][0, 1], state2)
    assert "action" not in two["lerobot"]
    fresh = policy.make_processors().pre(_obs(2))["history"][
        "observation.state"
    ]  # a new session: empty queues
    assert torch.equal(fresh[0, 0], state2) and torch.equal(fresh[0, 1], state2)
    assert two["noise"].shape == (1, 16, 6)


# -- the model call: grouping (a recording stand-in for the LeRobot policy) ----------------------


class _Recorder:
    """Stands in for a LeRobot policy: records each predict_action_chunk call, returns batch-index rows."""

    def __init__(self, *, history: bool = False) -> None:
        self.config = SimpleNamespace(
            rtc_config=SimpleNamespace(enabled=1, execution_horizon=6.0),
            action_feature=SimpleNamespace(shape=(3,)),
            chunk_size=5,
            max_action_dim=4,
            horizon=7,
        )
        self.calls: list[tuple[dict, dict, Any]] = []
        self._queues = {"observation.state": deque([torch.zeros(1, 2)] * 2, maxlen=2)} if history else None
        self.fail = False

    def reset(self) -> None:
        self._queues = {"observation.state": deque(maxlen=2)}

    def predict_action_chunk(self, batch: dict, **kwargs: Any) -> torch.Tensor:
        self.calls.append((batch, kwargs, self._queues))
        if self.fail:
            raise RuntimeError("boom")
        n = batch["x"].shape[0]
        return batch["x"].reshape(n, 1, 1).expand(n, 5, 3).to(torch.float64)


def _stand_in(
    support: TypeSupport, *, rtc: bool = True, history: bool = False
) -> tuple[LeRobotPolicy, _Recorder]:
    recorder = _Recorder(history=history)
    meta = PolicyMetadata(name="t", action_names=("a", "b", "c"), chunk_size=5, state_dim=0, supports_rtc=rtc)
    policy = LeRobotPolicy(
        recorder,
        None,
        None,
        support=support,
        metadata=meta,
        camera_keys={},
        image_shape=None,
        device="cpu",
        seed=None,
    )
    return policy, recorder


def _request(
    x: float, *, delay: int = 0, prefix_rows: int | None = None, steps: int | None = None, noise: bool = True
):
    batch = {"x": torch.tensor([x]), "noise": torch.full((1, 5, 4), x) if noise else None}
    batch = {"lerobot": {"x": batch["x"], "task": f"t{x:g}"}, "history": None, "noise": batch["noise"]}
    prefix = None if prefix_rows is None else np.full((prefix_rows, 3), x, np.float32)
    return PolicyRequest(batch, delay, prefix, steps)


def test_flow_stand_in_settings(lerobot_checkpoints: dict[str, Path]) -> None:
    policy, _ = _stand_in(SUPPORTED_TYPES["smolvla"])
    assert (policy.rtc.enabled, policy.rtc.execution_horizon) == (True, 6)
    assert type(policy.rtc.execution_horizon) is int
    assert policy._noise_shape == (5, 4)
    plain, _ = _stand_in(SUPPORTED_TYPES["act"])
    assert plain._noise_shape is None and not hasattr(plain, "rtc")


def test_prefix_rows_are_the_real_rows_within_the_prefix() -> None:
    policy, _ = _stand_in(SUPPORTED_TYPES["smolvla"])
    assert policy._prefix_rows(_request(0)) == 0
    assert policy._prefix_rows(_request(0, prefix_rows=6)) == 6
    assert policy._prefix_rows(_request(0, prefix_rows=6, steps=2)) == 2
    assert policy._prefix_rows(_request(0, prefix_rows=6, steps=0)) == 0
    assert policy._prefix_rows(_request(0, prefix_rows=6, steps=9)) == 6
    assert policy._prefix_rows(_request(0, prefix_rows=6, steps=-1)) == 0
    off, _ = _stand_in(SUPPORTED_TYPES["smolvla"], rtc=False)
    assert off._prefix_rows(_request(0, prefix_rows=6, steps=2)) == 0
    assert off._group_key(_request(0, delay=2, prefix_rows=6)) == ("plain",)
    assert policy._group_key(_request(0, delay=2, prefix_rows=6, steps=3)) == (2, 3)
    assert policy._group_key(_request(0, delay=2, prefix_rows=6, steps=0)) == ("plain",)


def test_requests_are_grouped_by_delay_and_prefix_rows() -> None:
    policy, recorder = _stand_in(SUPPORTED_TYPES["smolvla"])
    requests = [
        _request(1, delay=2, prefix_rows=6, steps=3),
        _request(2),
        _request(3, delay=2, prefix_rows=6, steps=3),
        _request(4, delay=1, prefix_rows=6, steps=3),
        _request(5, delay=2, prefix_rows=6, steps=4),
        _request(6, prefix_rows=6, steps=0),  # no real rows: with the plain ones
    ]
    out = policy.predict_action_chunks(requests)
    assert [chunk[0, 0] for chunk in out] == [1, 2, 3, 4, 5, 6]
    assert all(chunk.dtype == np.float32 and chunk.shape == (5, 3) for chunk in out)
    assert len(recorder.calls) == 4
    xs = [call[0]["x"].tolist() for call in recorder.calls]
    assert xs == [[1.0, 3.0], [2.0, 6.0], [4.0], [5.0]]
    first = recorder.calls[0][1]
    assert set(first) == {"noise", "inference_delay", "prev_chunk_left_over", "execution_horizon"}
    assert (first["inference_delay"], first["execution_horizon"]) == (2, 3)
    assert first["prev_chunk_left_over"].shape == (2, 3, 3)  # the padding cut to the 3 real rows
    assert first["prev_chunk_left_over"][:, 0, 0].tolist() == [1.0, 3.0]
    assert first["noise"].shape == (2, 5, 4) and first["noise"][:, 0, 0].tolist() == [1.0, 3.0]
    assert set(recorder.calls[1][1]) == {"noise"}
    assert recorder.calls[1][0]["task"] == ["t2", "t6"]
    assert (recorder.calls[2][1]["inference_delay"], recorder.calls[2][1]["execution_horizon"]) == (1, 3)
    assert recorder.calls[3][1]["execution_horizon"] == 4


def test_noise_and_prefix_go_to_the_policys_device() -> None:
    """What the model gets is on the policy's device (``meta`` stands in for a GPU here)."""
    recorder = _Recorder()
    meta = PolicyMetadata(
        name="t", action_names=("a", "b", "c"), chunk_size=5, state_dim=0, supports_rtc=True
    )
    policy = LeRobotPolicy(
        recorder, None, None, support=SUPPORTED_TYPES["smolvla"], metadata=meta, camera_keys={},
        image_shape=None, device="meta", seed=None,
    )  # fmt: skip
    policy.predict_action_chunks([_request(1, delay=1, prefix_rows=6, steps=2)])
    kwargs = recorder.calls[0][1]
    assert kwargs["noise"].device.type == "meta"
    assert kwargs["prev_chunk_left_over"].device.type == "meta"


@pytest.mark.parametrize(("image_shape", "channels"), [((8, 8, 1), 1), (None, 3)])
def test_images_need_the_checkpoints_channels_else_three(image_shape: Any, channels: int) -> None:
    meta = PolicyMetadata(name="t", action_names=("a",), chunk_size=5, state_dim=0)
    policy = LeRobotPolicy(
        _Recorder(), None, None, support=SUPPORTED_TYPES["act"], metadata=meta,
        camera_keys={"cam": "observation.images.cam"}, image_shape=image_shape, device="cpu", seed=None,
    )  # fmt: skip
    image = np.arange(8 * 8 * channels, dtype=np.uint8).reshape(8, 8, channels)
    frame = policy._frame({"state": None, "images": {"cam": image}})
    assert list(frame) == ["observation.images.cam"]  # no state: the checkpoint has none
    assert frame["observation.images.cam"].tobytes() == image.tobytes()
    assert frame["observation.images.cam"] is not image
    other = np.zeros((8, 8, channels + 2), np.uint8)
    with pytest.raises(WireError) as info:
        policy._frame({"images": {"cam": other}})
    assert info.value.message == f"image 'cam' must be HxWx{channels}, got (8, 8, {channels + 2})"


def test_noise_is_passed_only_when_every_request_has_it() -> None:
    policy, recorder = _stand_in(SUPPORTED_TYPES["smolvla"])
    policy.predict_action_chunks([_request(1), _request(2, noise=False)])
    assert recorder.calls[0][1] == {}
    policy.predict_action_chunks([_request(1, noise=False)])
    assert recorder.calls[1][1] == {}


def test_history_is_handed_over_and_the_policys_queues_restored() -> None:
    policy, recorder = _stand_in(SUPPORTED_TYPES["diffusion"], history=True)
    assert (
        list(policy._empty_queues) == ["observation.state"]
        and len(policy._empty_queues["observation.state"]) == 0
    )
    saved = recorder._queues
    histories = [
        {"observation.state": torch.arange(4.0).reshape(1, 2, 2) + 10 * i} for i in range(2)
    ]  # batch 1, two steps, dim 2
    requests = [_request(i) for i in range(2)]
    for request, history in zip(requests, histories, strict=True):
        request.batch["history"] = history
    policy.predict_action_chunks(requests)
    queues = recorder.calls[0][2]
    assert list(queues) == ["observation.state"]
    steps = list(queues["observation.state"])
    assert (
        len(steps) == 2
        and steps[0].tolist() == [[0.0, 1.0], [10.0, 11.0]]
        and steps[1].tolist() == [[2.0, 3.0], [12.0, 13.0]]
    )
    assert recorder._queues is saved
    recorder.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        policy.predict_action_chunks(requests)
    assert recorder._queues is saved


def test_single_request_goes_through_the_batched_path() -> None:
    policy, recorder = _stand_in(SUPPORTED_TYPES["smolvla"])
    chunk = policy.predict_action_chunk(_request(3).batch, inference_delay=1)
    assert chunk.shape == (5, 3) and chunk[0, 0] == 3
    assert set(recorder.calls[0][1]) == {"noise"}


def test_concat_joins_many_sessions_batches() -> None:
    a = {"t": torch.ones(1, 2), "l": ["x"], "s": "one", "o": 7}
    b = {"t": torch.zeros(1, 2), "l": ["y", "z"], "s": "two", "o": 8}
    merged = _concat([a, b])
    assert merged["t"].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert merged["l"] == ["x", "y", "z"] and merged["s"] == ["one", "two"] and merged["o"] == 7
    single = _concat([a])
    assert single == a and single is not a


# -- the tiny checkpoints (tiny.py: built by each test itself, so mutmut checks the builders here) ---


def _config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text())


def test_tiny_features_and_stats() -> None:
    from lerobot.configs.types import FeatureType

    inputs, outputs = tiny._features(("a", "b"))
    assert list(inputs) == ["observation.state", "observation.images.a", "observation.images.b"]
    assert (inputs["observation.state"].type, inputs["observation.state"].shape) == (FeatureType.STATE, (6,))
    assert (inputs["observation.images.b"].type, inputs["observation.images.b"].shape) == (
        FeatureType.VISUAL,
        (3, 32, 32),
    )
    assert list(outputs) == ["action"]
    assert (outputs["action"].type, outputs["action"].shape) == (FeatureType.ACTION, (6,))
    stats = tiny._stats(("a",))
    assert list(stats) == ["observation.state", "action", "observation.images.a"]
    for key, lo, hi in (("observation.state", -0.3, 0.4), ("action", -0.2, 0.6)):
        mean, std = np.linspace(lo, hi, 6), np.linspace(0.5, 1.5, 6)
        assert set(stats[key]) == {"mean", "std", "min", "max"}
        np.testing.assert_allclose(stats[key]["mean"].numpy(), mean, rtol=1e-6)
        np.testing.assert_allclose(stats[key]["std"].numpy(), std, rtol=1e-6)
        np.testing.assert_allclose(stats[key]["min"].numpy(), mean - 2 * std, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(stats[key]["max"].numpy(), mean + 2 * std, rtol=1e-6, atol=1e-7)
    image = {k: v.numpy() for k, v in stats["observation.images.a"].items()}
    assert {k: v.shape for k, v in image.items()} == {k: (3, 1, 1) for k in ("mean", "std", "min", "max")}
    assert (image["mean"] == np.float32(0.45)).all() and (image["std"] == np.float32(0.25)).all()
    assert (image["min"] == 0).all() and (image["max"] == 1).all()


def test_tiny_act_checkpoint(lerobot_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = tiny.make_act(tmp_path / "a" / "act")  # parents made; default seed 0 and cameras
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in lerobot_checkpoints["act"].iterdir()
    )
    assert (out / "model.safetensors").read_bytes() == (
        lerobot_checkpoints["act"] / "model.safetensors"
    ).read_bytes()
    config = _config(out)
    assert config["type"] == "act" and config["device"] == "cpu"
    expected = {
        "chunk_size": 10, "n_action_steps": 10, "pretrained_backbone_weights": None, "dim_model": 32,
        "n_heads": 2, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "latent_dim": 8,
    }  # fmt: skip
    assert {key: config[key] for key in expected} == expected
    assert list(config["input_features"]) == [
        "observation.state",
        "observation.images.top",
        "observation.images.wrist",
    ]
    stats = load_file(out / "policy_preprocessor_step_3_normalizer_processor.safetensors")
    np.testing.assert_allclose(stats["action.mean"].numpy(), np.linspace(-0.2, 0.6, 6), rtol=1e-6)
    np.testing.assert_allclose(stats["observation.images.top.std"].numpy(), 0.25)
    post = load_file(out / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
    np.testing.assert_allclose(post["action.std"].numpy(), np.linspace(0.5, 1.5, 6), rtol=1e-6)
    (tmp_path / "b").mkdir()  # an existing folder is written into
    other = tiny.make_act(tmp_path / "b", seed=1, cameras=("front",))
    assert (other / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()
    assert list(_config(other)["input_features"]) == ["observation.state", "observation.images.front"]
    assert "observation.images.front.mean" in load_file(
        other / "policy_preprocessor_step_3_normalizer_processor.safetensors"
    )


def test_tiny_diffusion_checkpoint(lerobot_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tiny.make_diffusion(str(tmp_path / "d"), seed=0)
    assert (out / "model.safetensors").read_bytes() == (
        lerobot_checkpoints["diffusion"] / "model.safetensors"
    ).read_bytes()
    config = _config(out)
    assert config["type"] == "diffusion" and config["device"] == "cpu"
    expected = {
        "n_obs_steps": 2, "horizon": 16, "n_action_steps": 8, "pretrained_backbone_weights": None,
        "crop_shape": None, "down_dims": [16, 32], "kernel_size": 3, "n_groups": 4,
        "diffusion_step_embed_dim": 16, "spatial_softmax_num_keypoints": 4, "num_inference_steps": 3,
        "use_group_norm": True, "noise_scheduler_type": "DDIM",
    }  # fmt: skip
    assert {key: config[key] for key in expected} == expected
    assert list(config["input_features"]) == [
        "observation.state",
        "observation.images.top",
        "observation.images.wrist",
    ]
    other = tiny.make_diffusion(tmp_path / "d2", seed=2, cameras=("top",))
    assert (other / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()
    assert list(_config(other)["input_features"]) == ["observation.state", "observation.images.top"]


def test_tiny_smolvla_checkpoint_and_its_vlm(lerobot_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tiny.make_smolvla(str(tmp_path / "s"))
    vlm = tmp_path / "s-vlm"  # written next to the checkpoint
    assert (out / "model.safetensors").read_bytes() == (
        lerobot_checkpoints["smolvla"] / "model.safetensors"
    ).read_bytes()
    config = _config(out)
    assert config["type"] == "smolvla" and config["device"] == "cpu"
    expected = {
        "chunk_size": 10, "n_action_steps": 10, "max_state_dim": 8, "max_action_dim": 8,
        "resize_imgs_with_padding": [32, 32], "tokenizer_max_length": 12, "num_steps": 4,
        "vlm_model_name": str(vlm.resolve()), "load_vlm_weights": False, "num_vlm_layers": 2,
    }  # fmt: skip
    assert {key: config[key] for key in expected} == expected
    words = ["put", "the", "cube", "in", "bowl", "pick", "up", "red", "blue", "block", "place", "on", "plate"]
    words += ["open", "drawer", "close"]
    specials = [
        "<pad>",
        "<unk>",
        "<|im_start|>",
        "<end_of_utterance>",
        "<image>",
        "<fake_token_around_image>",
    ]
    specials += ["<global-img>", "<row_1_col_1>"]
    tokenizer = json.loads((vlm / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "WordLevel" and tokenizer["model"]["unk_token"] == "<unk>"
    assert tokenizer["model"]["vocab"] == {token: i for i, token in enumerate(specials + words)}
    assert tokenizer["pre_tokenizer"]["type"] == "Whitespace"
    assert json.loads((vlm / "special_tokens_map.json").read_text()) == {
        "bos_token": "<|im_start|>", "end_of_utterance_token": "<end_of_utterance>",
        "eos_token": "<end_of_utterance>", "fake_image_token": "<fake_token_around_image>",
        "global_image_token": "<global-img>", "image_token": "<image>", "pad_token": "<pad>",
        "unk_token": "<unk>",
    }  # fmt: skip
    vlm_config = json.loads((vlm / "config.json").read_text())
    assert (vlm_config["scale_factor"], vlm_config["image_token_id"], vlm_config["vocab_size"]) == (2, 4, 24)
    text = {
        "model_type": "llama", "vocab_size": 24, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 512, "pad_token_id": 0,
    }  # fmt: skip
    assert {key: vlm_config["text_config"][key] for key in text} == text
    vision = {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "image_size": 32, "patch_size": 8,
    }  # fmt: skip
    assert {key: vlm_config["vision_config"][key] for key in vision} == vision
    image = json.loads((vlm / "preprocessor_config.json").read_text())
    assert (image["do_resize"], image["do_image_splitting"], image["max_image_size"]) == (
        False,
        False,
        {"longest_edge": 32},
    )
    assert json.loads((vlm / "processor_config.json").read_text())["image_seq_len"] == 4
    assert (vlm / "video_preprocessor_config.json").is_file()
    nested = tiny.make_tiny_vlm(str(tmp_path / "x" / "vlm"))  # parents made, and again into the same folder
    assert tiny.make_tiny_vlm(nested) == nested == tmp_path / "x" / "vlm"
    # a given VLM folder is used as is, and a seed changes the weights
    other = tiny.make_smolvla(tmp_path / "o", seed=3, cameras=("top",), vlm_dir=str(vlm))
    assert not (tmp_path / "o-vlm").exists()
    assert _config(other)["vlm_model_name"] == str(vlm.resolve())
    assert (other / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()
    assert list(_config(other)["input_features"]) == ["observation.state", "observation.images.top"]


def test_builders_table() -> None:
    assert {
        "act": tiny.make_act,
        "diffusion": tiny.make_diffusion,
        "smolvla": tiny.make_smolvla,
    } == tiny.BUILDERS
    assert (tiny.STATE_DIM, tiny.ACTION_DIM, tiny.IMAGE_SHAPE_CHW, tiny.CAMERAS) == (
        6,
        6,
        (3, 32, 32),
        ("top", "wrist"),
    )
