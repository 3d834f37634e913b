"""The three execution strategies the demo compares, all on the shared robot-side inference loop.

- ``sync``: the robot executes the first ``sync_steps`` actions of a chunk, then stops and waits
  for the next one (the classic lockstep client). Inference time is dead time: stalls.
- ``async``: the next chunk is asked for while the current one still runs, and the robot switches
  to it as soon as it arrives, skipping the actions whose time has passed (``chunk[d:]``). No
  prefix is sent, so the new chunk is sampled independently of the old one: jumps at boundaries.
- ``rtc``: the same timing, plus real-time chunking: the not-yet-executed rest of the current
  chunk goes to the server as a prefix, and the new chunk is guided to continue it.

Only what a strategy needs is changed on :class:`~rollserve.client.inference_loop.InferenceEngine`
(whether a prefix is sent, the delay hint for a stopped robot); the queue is tagged so every
executed action is known to come from a given chunk.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from rollserve.client.inference_loop import ChunkSource, EngineConfig, InferenceEngine, SourceInfo
from rollserve.rtc.config import RTCConfig
from rollserve.rtc.queue import ActionQueue


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    asynchronous: bool  # the next chunk is inferred while the current one runs
    send_prefix: bool  # RTC: guide the next chunk toward the current one's rest


STRATEGIES: dict[str, Strategy] = {
    "sync": Strategy("sync", "synchronous", asynchronous=False, send_prefix=False),
    "async": Strategy("async", "async, no RTC", asynchronous=True, send_prefix=False),
    "rtc": Strategy("rtc", "async + RTC", asynchronous=True, send_prefix=True),
}


class TaggedQueue(ActionQueue):
    """An :class:`ActionQueue` that numbers its chunks and says which one each served action came from."""

    def __init__(self, config: RTCConfig) -> None:
        super().__init__(config)
        self._tag_lock = threading.Lock()  # merge vs get: the tag must match the action served
        self.generation = 0  # chunks merged so far
        self.served_generation = 0  # the chunk the last served action came from
        self.served_in_generation = 0  # actions served from that chunk
        self.merged: dict[int, np.ndarray] = {}  # chunk id -> robot-space queue right after its merge

    def merge(
        self,
        original_actions: np.ndarray,
        processed_actions: np.ndarray,
        real_delay: int,
        action_index_before_inference: int | None = 0,
    ) -> None:
        with self._tag_lock:
            super().merge(original_actions, processed_actions, real_delay, action_index_before_inference)
            self.generation += 1
            assert self.queue is not None
            self.merged[self.generation] = self.queue.copy()

    def get(self) -> np.ndarray | None:
        with self._tag_lock:
            action = super().get()
            if action is not None:
                if self.served_generation != self.generation:
                    self.served_generation, self.served_in_generation = self.generation, 0
                self.served_in_generation += 1
            return action

    def expire_after(self, served: int) -> None:
        """Drop the rest of the current chunk once ``served`` of its actions were played."""
        with self._tag_lock:
            if self.served_generation == self.generation and self.served_in_generation >= served:
                super().clear()

    def forget_merged(self) -> dict[int, np.ndarray]:
        """Hand over (and drop) the recorded chunks, e.g. at the end of an episode."""
        with self._tag_lock:
            merged, self.merged = self.merged, {}
            return merged


class StrategyEngine(InferenceEngine):
    """The inference loop playing one :class:`Strategy`; ``last_chunk_id`` tags the last action."""

    def __init__(
        self, source: ChunkSource, config: EngineConfig, strategy: Strategy, *, sync_steps: int = 8
    ) -> None:
        super().__init__(source, config)
        self.strategy = strategy
        self.sync_steps = sync_steps
        self.queue: TaggedQueue = TaggedQueue(self.queue.config)
        self.last_chunk_id: int | None = None

    def connect(self) -> SourceInfo:
        info = super().connect()
        if not isinstance(self.queue, TaggedQueue):  # the server overrode our RTC setting
            raise RuntimeError(f"strategy {self.strategy.name!r}: the server does not support RTC")
        return info

    def estimated_delay(self) -> int:
        """A stopped robot executes nothing while it waits, so the synchronous hint is 0."""
        return super().estimated_delay() if self.strategy.asynchronous else 0

    def prefixes(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        return super().prefixes() if self.strategy.send_prefix else (None, None)

    def ready_actions(self) -> int:
        """Actions the strategy may still play without a new chunk."""
        self._expire_synchronous_chunk()
        return self.queue.qsize()

    def get_action(self) -> np.ndarray | None:
        self._expire_synchronous_chunk()
        action = super().get_action()
        self.last_chunk_id = self.queue.served_generation if action is not None else None
        return action

    def _expire_synchronous_chunk(self) -> None:
        if not self.strategy.asynchronous:
            self.queue.expire_after(self.sync_steps)


def engine_config(
    strategy: Strategy, *, fps: float, refill_margin: int, execution_horizon: int
) -> EngineConfig:
    """The loop's knobs for a strategy.

    Asynchronous strategies use the RTC queue (the new chunk replaces the old from index ``d``)
    and ask for a chunk once ``qsize <= expected delay + refill_margin``; the synchronous one
    appends to an empty queue and asks only when it has nothing left.
    """
    rtc = RTCConfig(enabled=strategy.asynchronous, execution_horizon=execution_horizon)
    margin = refill_margin if strategy.asynchronous else 0
    return EngineConfig(rtc=rtc, fps=fps, refill_margin=margin, fallback="hold")
