"""Flow-policy checkpoints: ``model.safetensors`` (weights) + ``config.json`` (everything else).

``config.json`` holds the architecture, sampling and RTC settings, action/state names, the
normalisation statistics and the training provenance, so a checkpoint directory is self-contained
and loading it never runs pickled code.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import FlowMatchingPolicy
from rollserve.models.flow_stats import NormStats
from rollserve.rtc.config import RTCConfig

FORMAT = "rollserve.flow_policy"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def default_checkpoint_dir() -> Path:
    """The checkpoint shipped inside the package."""
    return Path(str(resources.files("rollserve") / "checkpoints" / "flow_policy"))


def save_flow_policy(policy: FlowMatchingPolicy, path: str | Path) -> Path:
    """Write ``policy`` to directory ``path`` (created if needed); returns the directory."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in policy.net.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    (out / WEIGHTS_FILE).chmod(0o644)  # safetensors writes 0600; a shipped file must be readable by all
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": policy.metadata.name,
        "architecture": policy.config.to_dict(),
        "sampling": {"num_steps": policy.num_steps, "integrator": "euler", "tau": "0=noise -> 1=data"},
        "rtc": dataclasses.asdict(policy.rtc),
        "action_names": list(policy.metadata.action_names),
        "state_names": list(policy.state_names),
        "control_hz": policy.metadata.fps,
        "normalization": policy.stats.to_dict(),
        "training": policy.info,
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    config = json.loads((Path(path) / CONFIG_FILE).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} checkpoint (format={config.get('format')!r})")
    if config.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {config['format_version']} is newer than this rollserve")
    return config


def load_flow_policy(
    path: str | Path, *, device: str | torch.device = "cpu", seed: int = 0, **overrides: Any
) -> FlowMatchingPolicy:
    """Load a checkpoint directory; ``overrides`` (e.g. ``num_steps``, ``rtc``) replace stored settings."""
    path = Path(path)
    config = read_config(path)
    net = VelocityNet(FlowNetConfig.from_dict(config["architecture"]))
    net.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    settings: dict[str, Any] = {
        "state_names": config["state_names"],
        "control_hz": config["control_hz"],
        "num_steps": config["sampling"]["num_steps"],
        "rtc": RTCConfig(**config["rtc"]),
        "name": config["name"],
        "info": config.get("training", {}),
    }
    settings.update(overrides)
    return FlowMatchingPolicy(
        net,
        NormStats.from_dict(config["normalization"]),
        config["action_names"],
        seed=seed,
        device=device,
        **settings,
    )


def load_default(device: str = "cpu", **kwargs: Any) -> FlowMatchingPolicy:
    """Load the checkpoint shipped in ``rollserve/checkpoints/flow_policy``.

    The factory behind the spec string ``rollserve.models.checkpoint:load_default``.
    """
    return load_flow_policy(default_checkpoint_dir(), device=device, **kwargs)
