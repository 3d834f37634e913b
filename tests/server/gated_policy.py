"""A policy whose first model call blocks until the test releases it, so a test can queue, replace
or reset requests while one is inside the model (shared by the policy route and service tests)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from rollserve.models.policy import PolicyRequest
from rollserve.models.simple_policies import ChunkPolicy


class GatedPolicy(ChunkPolicy):
    """``entered`` is set when the first call starts; it returns once ``release`` is set (10 s at
    most). ``call_spans`` records each call's (start, end, batch size)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.call_spans: list[tuple[float, float, int]] = []

    def predict_action_chunks(self, requests: list[PolicyRequest]) -> list[np.ndarray]:
        started = time.monotonic()
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(10)
        out = super().predict_action_chunks(requests)
        self.call_spans.append((started, time.monotonic(), len(requests)))
        return out
