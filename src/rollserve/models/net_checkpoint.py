"""Checkpoint files of the worlds' torch nets: ``model.safetensors`` (weights) + ``config.json``.

One writer and one reader for every net whose config is a flat ``to_dict()`` / ``from_dict()``
dataclass, so each world only names its format and its classes. Loading never runs pickled code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, TypeVar

from safetensors.torch import load_file, save_file
from torch import nn

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class _Config(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


NetT = TypeVar("NetT", bound=nn.Module)


def save_net(net: nn.Module, config: _Config, path: str | Path, *, fmt: str, version: int) -> Path:
    """Write ``net``'s weights and ``config`` to directory ``path`` (created if needed)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": fmt})
    (out / WEIGHTS_FILE).chmod(0o644)  # safetensors writes 0600; a shipped file must be readable by all
    stored = {"format": fmt, "format_version": version, **config.to_dict()}
    (out / CONFIG_FILE).write_text(json.dumps(stored, indent=2) + "\n")
    return out


def read_net_config(path: str | Path, *, fmt: str, version: int) -> dict[str, Any]:
    """The stored config without its format fields; refuses other formats and newer versions."""
    data = json.loads((Path(path) / CONFIG_FILE).read_text())
    if data.pop("format", None) != fmt:
        raise ValueError(f"{path} is not a {fmt} checkpoint")
    if data.pop("format_version", 0) > version:
        raise ValueError(f"{path} was written by a newer rollserve")
    return data


def load_net_weights(net: NetT, path: str | Path) -> NetT:
    net.load_state_dict(load_file(str(Path(path) / WEIGHTS_FILE)))
    return net
