"""A complete, serialisable snapshot of the tabletop env: restoring it replays the future exactly.

The rollout service stores one per committed step (retries and ``fork`` restore it), so it must
cover every input of the next step and travel as plain bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

_MAGIC = b"RSSNAP1\0"


@dataclass(frozen=True)
class EnvSnapshot:
    """MuJoCo's full integration state (``mjSTATE_INTEGRATION``: time, qpos, qvel, act, warmstart,
    ctrl, applied forces, mocap, ...), the episode's step count and the env's RNG state."""

    physics: np.ndarray
    step_count: int
    rng_state: dict[str, Any]

    def to_bytes(self) -> bytes:
        header = json.dumps({"step_count": self.step_count, "rng_state": self.rng_state}).encode()
        physics = np.ascontiguousarray(self.physics, dtype="<f8").tobytes()
        return _MAGIC + struct.pack("<I", len(header)) + header + physics

    @classmethod
    def from_bytes(cls, blob: bytes) -> EnvSnapshot:
        if not blob.startswith(_MAGIC):
            raise ValueError("not a rollserve tabletop snapshot")
        start = len(_MAGIC) + 4
        (header_len,) = struct.unpack_from("<I", blob, len(_MAGIC))
        header = json.loads(blob[start : start + header_len])
        physics = np.frombuffer(blob, dtype="<f8", offset=start + header_len).astype(np.float64)
        return cls(physics=physics, step_count=int(header["step_count"]), rng_state=header["rng_state"])
