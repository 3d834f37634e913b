"""A :class:`ChunkSource` wrapper that measures every request (and, in simulated time, lets the robot act).

The loop itself keeps only the last reply's timings; the demo's table needs all of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rollserve.client.inference_loop import ChunkRequest, ChunkSource, SourceInfo
from rollserve.wire.messages import ActionChunkMsg


class RecordingSource:
    """Delegates to ``inner``; records round trip and server inference time of every reply.

    ``in_flight`` (simulated time only) is called after each reply is produced and before it is
    returned, i.e. while the chunk is "in flight": the robot executes its ``d`` actions there.
    """

    def __init__(self, inner: ChunkSource, in_flight: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.in_flight = in_flight
        self.round_trips_ms: list[float] = []
        self.inference_ms: list[float] = []
        self._lock = threading.Lock()

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    def connect(self) -> SourceInfo:
        return self.inner.connect()

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        started = time.perf_counter()
        reply = self.inner.infer(request)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        with self._lock:
            self.round_trips_ms.append(elapsed_ms)
            self.inference_ms.append(reply.inference_ms)
        if self.in_flight is not None:
            self.in_flight()
        return reply

    def reset(self, episode_id: int) -> None:
        self.inner.reset(episode_id)

    def reconnect(self) -> SourceInfo:
        return self.inner.reconnect()

    def close(self) -> None:
        self.inner.close()

    def take(self) -> tuple[list[float], list[float]]:
        """Round trips and inference times (ms) recorded since the last call."""
        with self._lock:
            taken = (self.round_trips_ms, self.inference_ms)
            self.round_trips_ms, self.inference_ms = [], []
            return taken
