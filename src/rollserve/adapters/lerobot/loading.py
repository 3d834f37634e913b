"""Load a LeRobot checkpoint directory (``save_pretrained`` / a run's ``pretrained_model/``).

The metadata comes from the checkpoint's ``config.json``: chunk length, state dimension, cameras
and image shape, and whether the type supports RTC. The pre/post-processors are the checkpoint's
own (``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their normalisation stats).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollserve.adapters.lerobot.support import SUPPORTED_TYPES, UnsupportedPolicyType
from rollserve.models.policy import PolicyMetadata

IMAGE_PREFIX = "observation.images."


class LeRobotLoadError(ValueError):
    """The directory is not a LeRobot checkpoint rollserve can serve; the message says why."""


def read_policy_type(path: Path) -> str:
    """The checkpoint's ``type`` from ``config.json``, checked before LeRobot is imported."""
    config_file = path / "config.json"
    if not path.is_dir():
        raise LeRobotLoadError(f"{str(path)!r} is not a directory")
    if not config_file.is_file():
        raise LeRobotLoadError(f"{str(path)!r} has no config.json (is it a LeRobot pretrained_model dir?)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LeRobotLoadError(f"cannot read {config_file}: {exc}") from exc
    policy_type = config.get("type") if isinstance(config, dict) else None
    if not isinstance(policy_type, str):
        raise LeRobotLoadError(f"{config_file} has no policy 'type'")
    if policy_type not in SUPPORTED_TYPES:
        raise UnsupportedPolicyType(policy_type)
    return policy_type


def _import_lerobot() -> None:
    try:
        import lerobot  # noqa: F401
    except ImportError as exc:
        raise LeRobotLoadError(
            "serving a LeRobot checkpoint needs LeRobot: pip install 'rollserve[lerobot]' "
            f"(import failed: {exc})"
        ) from exc


def load_lerobot_policy(
    path: str | Path,
    *,
    device: str = "cpu",
    seed: int | None = None,
    action_names: Sequence[str] | str | None = None,
    fps: float = 30.0,
    rtc: bool = True,
    execution_horizon: int | None = None,
    max_guidance_weight: float | None = None,
    name: str | None = None,
) -> Any:
    """A :class:`~rollserve.adapters.lerobot.policy.LeRobotPolicy` for the checkpoint at ``path``.

    ``seed`` fixes each session's sampling noise (a fresh generator per session and reset) for
    flow and diffusion policies; ``rtc`` turns LeRobot's RTC on for flow policies (SmolVLA,
    pi0, pi0.5) whose config leaves it off, with ``execution_horizon`` / ``max_guidance_weight``
    overriding the checkpoint's values. ``action_names`` is a list or a comma-separated string.
    """
    _check_seed(seed)
    _check_options(fps, rtc, execution_horizon, max_guidance_weight)
    path = Path(path).expanduser()
    policy_type = read_policy_type(path)
    support = SUPPORTED_TYPES[policy_type]
    _import_lerobot()
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    from rollserve.adapters.lerobot.policy import LeRobotPolicy

    config = PreTrainedConfig.from_pretrained(str(path))
    config.device = device
    if support.rtc and rtc:
        _enable_rtc(config, execution_horizon, max_guidance_weight)
    try:
        policy = get_policy_class(policy_type).from_pretrained(str(path), config=config)
    except Exception as exc:
        raise LeRobotLoadError(f"LeRobot could not load the {policy_type} checkpoint: {exc}") from exc
    policy.to(torch.device(device)).eval()
    overrides = {"device_processor": {"device": device}} if device != "cpu" else {}
    preprocessor, postprocessor = make_pre_post_processors(
        config, pretrained_path=str(path), preprocessor_overrides=overrides,
        postprocessor_overrides={},
    )  # fmt: skip

    camera_keys = {_camera_name(key): key for key in config.image_features}
    image_shape = None
    if config.image_features:
        channels, height, width = next(iter(config.image_features.values())).shape
        image_shape = (int(height), int(width), int(channels))
    if config.env_state_feature is not None:
        raise LeRobotLoadError(
            "this checkpoint needs observation.environment_state, which rollserve's observation lacks"
        )
    state_dim = int(config.robot_state_feature.shape[0]) if config.robot_state_feature else 0
    action_dim = int(config.action_feature.shape[0])
    names = _action_names(action_names, action_dim)
    metadata = PolicyMetadata(
        name=name or f"lerobot-{policy_type}:{path.name}",
        action_names=names,
        chunk_size=int(getattr(config, support.chunk_field)),
        state_dim=state_dim,
        camera_names=tuple(camera_keys),
        image_shape=image_shape,
        fps=float(fps),
        supports_rtc=bool(support.rtc and getattr(config, "rtc_config", None) is not None and rtc),
        supports_batching=True,
    )
    return LeRobotPolicy(
        policy, preprocessor, postprocessor, support=support, metadata=metadata,
        camera_keys=camera_keys, image_shape=image_shape, device=device, seed=seed,
    )  # fmt: skip


MAX_SEED = 2**64 - 1
"""The largest seed ``torch.Generator.manual_seed`` takes as given (it wraps negative ones)."""


def _check_seed(seed: object) -> None:
    """Refuse a seed that is not a whole number from 0 to ``MAX_SEED`` when the policy loads.

    ``--policy-arg seed=VALUE`` hands over whatever JSON made of VALUE: a string would only fail
    at the first session, a fraction or a bool would be cut to a whole number, and torch wraps a
    negative seed modulo 2**64, so another value than the one given would seed the noise.
    """
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        raise LeRobotLoadError(f"seed must be a whole number from 0 to 2**64 - 1, got {seed!r}")


def _check_options(fps: object, rtc: object, horizon: object, guidance: object) -> None:
    """Refuse ``--policy-arg`` values that would be cut, cast or fail late, when the policy loads:
    ``fps`` and ``max_guidance_weight`` positive finite numbers, ``execution_horizon`` a whole
    number from 1, ``rtc`` true or false (JSON hands over whatever VALUE parses to)."""
    if not _positive_number(fps):
        raise LeRobotLoadError(f"fps must be a positive number, got {fps!r}")
    if not isinstance(rtc, bool):
        raise LeRobotLoadError(f"rtc must be true or false, got {rtc!r}")
    whole = isinstance(horizon, numbers.Integral) and not isinstance(horizon, bool)
    if horizon is not None and not (whole and horizon >= 1):  # type: ignore[operator]
        raise LeRobotLoadError(f"execution_horizon must be a whole number from 1, got {horizon!r}")
    if guidance is not None and not _positive_number(guidance):
        raise LeRobotLoadError(f"max_guidance_weight must be a positive number, got {guidance!r}")


def _positive_number(value: object) -> bool:
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return real and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]


def _enable_rtc(config: Any, execution_horizon: int | None, max_guidance_weight: float | None) -> None:
    """Turn on LeRobot's own RTC (``lerobot.policies.rtc``), as LeRobot's RTC examples do."""
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    rtc = config.rtc_config or RTCConfig()
    rtc.enabled = True
    if execution_horizon is not None:
        rtc.execution_horizon = int(execution_horizon)
    if max_guidance_weight is not None:
        rtc.max_guidance_weight = float(max_guidance_weight)
    config.rtc_config = rtc


def _camera_name(feature_key: str) -> str:
    return feature_key[len(IMAGE_PREFIX) :] if feature_key.startswith(IMAGE_PREFIX) else feature_key


def _action_names(action_names: Sequence[str] | str | None, action_dim: int) -> tuple[str, ...]:
    if action_names is None:
        return tuple(f"action_{i}" for i in range(action_dim))
    names = action_names.split(",") if isinstance(action_names, str) else list(action_names)
    names = [str(n).strip() for n in names]
    if len(names) != action_dim or not all(names):
        raise LeRobotLoadError(f"the checkpoint has {action_dim} action dimensions; got {len(names)} names")
    return tuple(names)
