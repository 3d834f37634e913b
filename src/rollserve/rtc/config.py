"""RTC settings shared by the robot client and the server (numpy only, no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

PrefixSchedule = Literal["zeros", "ones", "linear", "exp"]
SCHEDULES: tuple[str, ...] = ("zeros", "ones", "linear", "exp")


@dataclass(frozen=True)
class RTCConfig:
    """Real-time chunking knobs.

    enabled: guide new chunks toward the not-yet-executed rest of the previous one.
    execution_horizon: how many actions of the previous chunk the prefix covers.
    max_guidance_weight: the clamp ``beta`` on the guidance weight (paper: about 5 to 10).
    prefix_attention_schedule: how the soft mask falls from 1 to 0 between the delay and the horizon.
    """

    enabled: bool = False
    execution_horizon: int = 10
    max_guidance_weight: float = 5.0
    prefix_attention_schedule: PrefixSchedule = "linear"

    def __post_init__(self) -> None:
        if self.execution_horizon < 1:
            raise ValueError(f"execution_horizon must be >= 1, got {self.execution_horizon}")
        if not 0 <= self.max_guidance_weight < math.inf:  # NaN too: every guided chunk would be NaN
            raise ValueError(f"max_guidance_weight must be finite and >= 0, got {self.max_guidance_weight}")
        if self.prefix_attention_schedule not in SCHEDULES:
            schedule = self.prefix_attention_schedule
            raise ValueError(f"prefix_attention_schedule must be one of {SCHEDULES}, got {schedule!r}")
