"""A clock the test moves by hand: the rollout service's and store's idle clock, so that TTL
tests never sleep. ``tests/`` is on ``sys.path`` (its conftest), so any test imports it."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
