"""A toy world whose episodes end on command, for the env tests of episode ends."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rollserve.models.world import WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld


class EndsOnClosedGripper(ToyWorld):
    """The toy world, but a step commanding the gripper to 1.0 terminates the episode."""

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        outs = super().step_batch(steps)
        return [
            dataclasses.replace(out, terminated=True)
            if isinstance(out, WorldOutput) and float(np.asarray(step.action)[7]) >= 1.0
            else out
            for step, out in zip(steps, outs, strict=True)
        ]
