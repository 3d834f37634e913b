"""A toy world whose episodes end on command, served, for the env tests of episode ends."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from rollserve.models.world import WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings


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


@contextlib.contextmanager
def serving_ending_toy_world() -> Iterator[str]:
    """A real server (127.0.0.1, an ephemeral port) over :class:`EndsOnClosedGripper`; its URL."""
    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(EndsOnClosedGripper(), settings))) as server:
        yield server.http_url


def go(value: float) -> np.ndarray:
    """An action of 8 equal values (1.0 closes the gripper: the episode ends)."""
    return np.full(8, value, dtype=np.float32)
