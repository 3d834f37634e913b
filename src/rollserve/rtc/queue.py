"""ActionQueue: the chunk a robot is executing, in robot space and in model space.

With RTC, a new chunk replaces the queue from index ``d`` on (the first ``d`` actions were executed
while it was inferred); without RTC, the new chunk is appended after what is still unexecuted.
numpy only: the robot side never needs torch.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from rollserve.rtc.config import RTCConfig

logger = logging.getLogger(__name__)


class ActionQueue:
    """Thread-safe: the control loop calls ``get`` while the inference thread calls ``merge``."""

    def __init__(self, config: RTCConfig) -> None:
        self.config = config
        self.queue: np.ndarray | None = None  # robot space, what the robot executes
        self.original_queue: np.ndarray | None = None  # model space, what RTC prefixes are made of
        self.last_index = 0
        self._lock = threading.Lock()

    def get(self) -> np.ndarray | None:
        """The next action (robot space), or None when starved. Advances the read index."""
        with self._lock:
            if self.queue is None or self.last_index >= len(self.queue):
                return None
            action = self.queue[self.last_index].copy()
            self.last_index += 1
            return action

    def qsize(self) -> int:
        with self._lock:
            return 0 if self.queue is None else len(self.queue) - self.last_index

    def empty(self) -> bool:
        return self.qsize() == 0

    def get_action_index(self) -> int:
        with self._lock:
            return self.last_index

    def get_left_over(self) -> np.ndarray | None:
        """Unexecuted actions in model space (the RTC prefix), or None before the first chunk."""
        with self._lock:
            return None if self.original_queue is None else self.original_queue[self.last_index :].copy()

    def get_processed_left_over(self) -> np.ndarray | None:
        """Unexecuted actions in robot space."""
        with self._lock:
            return None if self.queue is None else self.queue[self.last_index :].copy()

    def left_overs(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Both left-overs (model space, robot space) under one lock: a control step between two
        separate reads would make them start one action apart."""
        with self._lock:
            index = self.last_index
            return (
                None if self.original_queue is None else self.original_queue[index:].copy(),
                None if self.queue is None else self.queue[index:].copy(),
            )

    def clear(self) -> None:
        """Forget everything (a new episode)."""
        with self._lock:
            self.queue = None
            self.original_queue = None
            self.last_index = 0

    def merge(
        self,
        original_actions: np.ndarray,
        processed_actions: np.ndarray,
        real_delay: int | None,
        action_index_before_inference: int | None = 0,
    ) -> None:
        """Fold a new chunk in. ``real_delay``: actions executed while it was inferred; None counts
        them here, under the lock, since ``action_index_before_inference`` (a count read before the
        merge would miss a ``get`` that runs in between)."""
        original = np.asarray(original_actions)
        processed = np.asarray(processed_actions)
        if original.shape[0] != processed.shape[0]:
            raise ValueError(f"chunk lengths differ: model {original.shape} vs robot {processed.shape}")
        with self._lock:
            delay = self._delay(real_delay, action_index_before_inference)
            if self.config.enabled:
                delay = max(0, min(int(delay), len(original)))
                self.original_queue = original[delay:].copy()
                self.queue = processed[delay:].copy()
            elif self.queue is None:
                self.original_queue = original.copy()
                self.queue = processed.copy()
            else:
                assert self.original_queue is not None
                self.original_queue = np.concatenate([self.original_queue[self.last_index :], original])
                self.queue = np.concatenate([self.queue[self.last_index :], processed])
            self.last_index = 0

    def _delay(self, real_delay: int | None, index_before: int | None) -> int:
        """The delay to merge with (under the lock): ``real_delay``, or if None the actions executed
        since ``index_before``; a hint that differs from what ran is logged."""
        executed = None if index_before is None else self.last_index - index_before
        if real_delay is None:
            if executed is None:
                raise ValueError("real_delay=None needs action_index_before_inference")
            return executed
        if executed is not None and executed != real_delay:
            logger.debug("delay hint %d, but %d actions ran during inference", real_delay, executed)
        return real_delay
