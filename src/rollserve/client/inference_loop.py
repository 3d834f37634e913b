"""The robot-side RTC loop, shared by the remote and the local engine.

The control loop calls :meth:`InferenceEngine.act` (or ``update_observation`` + ``get_action``)
at the robot's rate; a background thread asks a :class:`ChunkSource` for a new chunk whenever the
queue runs low, sending the not-yet-executed actions as the RTC prefix and the expected delay
(``ceil(latency / dt)`` over recent round trips), and merges the reply. Only the source differs:
a websocket to a server, or the policy in-process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from rollserve.client.policy_client import REOPEN_CODES
from rollserve.rtc.config import RTCConfig
from rollserve.rtc.latency import LatencyTracker
from rollserve.rtc.queue import ActionQueue
from rollserve.wire.errors import FRAME_TOO_LARGE
from rollserve.wire.messages import ActionChunkMsg, MsgHeader, ObservationMsg

logger = logging.getLogger(__name__)

Fallback = Literal["hold", "repeat", "zero"]
# The ``rtc`` of a config that sets none: ``LocalInferenceEngine`` tells it from one a user set (by identity).
DEFAULT_RTC = RTCConfig(enabled=True, execution_horizon=10)


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the loop. ``fallback`` is what ``get_action`` returns when the queue is empty:
    ``hold`` -> None (send no command, the robot holds), ``repeat`` -> the last action, ``zero`` -> zeros."""

    rtc: RTCConfig = DEFAULT_RTC
    fps: float = 15.0
    refill_margin: int = 2  # ask for a chunk once the queue holds <= expected delay + this many actions
    fallback: Fallback = "hold"
    latency_window: int = 16
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0
    task: str = ""
    jpeg_quality: int = 0

    def __post_init__(self) -> None:
        if self.fps <= 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")
        if type(self.refill_margin) is not int or self.refill_margin < 0:
            # below 0 an empty queue could wait for more than the delay: the robot would starve
            raise ValueError(f"refill_margin must be an int >= 0, got {self.refill_margin!r}")
        if self.fallback not in ("hold", "repeat", "zero"):
            raise ValueError(f"fallback must be hold, repeat or zero, got {self.fallback!r}")
        if type(self.jpeg_quality) is not int or not 0 <= self.jpeg_quality <= 100:
            # checked here: a bad value would fail every background request, and the robot starve
            raise ValueError(
                f"jpeg_quality must be an int in 0..100 (0: raw images), got {self.jpeg_quality!r}"
            )


@dataclass
class ChunkRequest:
    """What one cycle asks for."""

    observation: Mapping[str, Any]
    inference_delay: int
    prefix_model: np.ndarray | None
    prefix_robot: np.ndarray | None
    seq_id: int
    episode_id: int

    def to_message(self, session_epoch: int, task: str = "", jpeg_quality: int = 0) -> ObservationMsg:
        obs = self.observation
        return ObservationMsg(
            state=None if obs.get("state") is None else np.asarray(obs["state"], dtype=np.float32),
            images=dict(obs.get("images") or {}),
            task=obs.get("task") or task,
            inference_delay_steps=self.inference_delay,
            prefix_model=self.prefix_model,
            prefix_robot=self.prefix_robot,
            jpeg_quality=jpeg_quality,
            header=MsgHeader(
                seq_id=self.seq_id, episode_id=self.episode_id, session_epoch=session_epoch,
                client_mono_ns=time.monotonic_ns(),
            ),
        )  # fmt: skip


@dataclass
class SourceInfo:
    """What the source serves (from the session ack, or the local policy's metadata)."""

    chunk_size: int
    action_dim: int
    execution_horizon: int
    rtc_supported: bool


class ChunkSource(Protocol):
    """Where chunks come from. ``infer`` returns the reply message; connection trouble raises
    ``ConnectionError`` or ``TimeoutError``; ``epoch`` is the session's current epoch."""

    epoch: int

    def connect(self) -> SourceInfo: ...
    def infer(self, request: ChunkRequest) -> ActionChunkMsg: ...
    def reset(self, episode_id: int) -> None: ...
    def reconnect(self) -> SourceInfo: ...
    def close(self) -> None: ...


@dataclass
class LoopStats:
    chunks_merged: int = 0
    dropped_replies: int = 0
    starved_steps: int = 0
    reconnects: int = 0
    errors: int = 0
    last_queue_wait_ms: float = 0.0
    last_inference_ms: float = 0.0
    last_batch_size: int = 0


class InferenceEngine:
    """Queue + loop + delay estimate over any :class:`ChunkSource`.

    Use it either with the background thread (:meth:`start`, then :meth:`act` from the control loop)
    or step by step with :meth:`run_cycle` (deterministic; what tests and replays do).
    """

    def __init__(self, source: ChunkSource, config: EngineConfig | None = None) -> None:
        self.source = source
        self.config = config or EngineConfig()
        self.queue = ActionQueue(self.config.rtc)
        self.latency = LatencyTracker(self.config.latency_window)
        self.stats = LoopStats()
        self.info: SourceInfo | None = None
        self._horizon = self.config.rtc.execution_horizon
        self._rtc = self.config.rtc.enabled
        self._state_lock = threading.Lock()  # the queue object, episode and reset state vs merges
        self._cycle_lock = threading.Lock()  # one request at a time
        self._lifecycle_lock = threading.Lock()  # start/stop vs the thread's own exit
        self._cond = threading.Condition()
        self._observation: Mapping[str, Any] | None = None
        self._obs_version = 0
        self._used_version = 0
        self._episode_id = 0
        self._reset_pending = False
        self._seq = 0
        self._last_action: np.ndarray | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False  # the thread is in its loop (under _lifecycle_lock)
        self._close_on_exit = False  # stop() timed out: the thread closes the source when it is done
        self.last_error: BaseException | None = None  # the last exception the background loop caught
        self._failing = False  # the loop's latest request or reconnect failed and none succeeded since
        self._backoff = self.config.backoff_initial_s  # the next wait; back to initial only on an answer
        self._source_open = False  # connect() succeeded and stop() has not closed the source since

    # -- lifecycle --------------------------------------------------------------------------------
    def connect(self) -> SourceInfo:
        """Open the source (for a remote one: connect and open the session)."""
        self._adopt(self.source.connect())
        self._source_open = True
        assert self.info is not None
        return self.info

    def start(self) -> InferenceEngine:
        """Connect unless connected (a restart after :meth:`stop` connects again) and run the loop in
        a background thread (one at most). Raises if connecting or opening the session fails.

        Raises ``RuntimeError`` while the thread of an earlier :meth:`stop` that timed out is still
        inside its request: a second loop would share the (not thread-safe) source with it.
        """
        with self._lifecycle_lock:
            if self._running:
                if not self._stop.is_set():
                    return self  # already running
                raise RuntimeError("the stopped inference thread is still finishing a request; retry later")
            if not self._source_open:
                self.connect()
            self._stop.clear()
            self._close_on_exit = False
            self._running = True
            self._thread = threading.Thread(target=self._run, name="rollserve-inference", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and close the source. If the thread is still inside a request after
        ``timeout``, it keeps the source until that request returns and closes it then."""
        self._stop.set()
        self._source_open = False  # closed below, or by the thread when its request returns
        with self._cond:
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            with self._lifecycle_lock:
                if self._running:
                    self._close_on_exit = True
                    logger.warning(
                        "inference thread still in a request after %.1fs; it closes the source", timeout
                    )
                    return
                self._thread = None
        self.source.close()

    def __enter__(self) -> InferenceEngine:
        if not self._source_open:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _adopt(self, info: SourceInfo) -> None:
        """Follow what the server says: its execution horizon, and no RTC if it has none."""
        with self._state_lock:  # the control loop may be merging into or reading the queue
            self.info = info
            self._horizon = info.execution_horizon or self.config.rtc.execution_horizon
            rtc = self.config.rtc.enabled and info.rtc_supported
            if rtc != self._rtc:
                self._rtc = rtc
                self.queue = ActionQueue(RTCConfig(enabled=rtc, execution_horizon=self._horizon))

    # -- the control loop's side --------------------------------------------------------------
    def update_observation(self, observation: Mapping[str, Any]) -> None:
        """The latest observation; the loop uses it for its next request."""
        with self._cond:
            self._observation = observation
            self._obs_version += 1
            self._cond.notify_all()

    def get_action(self) -> np.ndarray | None:
        """The next action to execute, or the fallback when starved."""
        action = self.queue.get()
        with self._cond:
            self._cond.notify_all()  # the queue shrank: maybe time to refill
        if action is not None:
            self._last_action = action
            return action
        self.stats.starved_steps += 1
        if self.config.fallback == "repeat" and self._last_action is not None:
            return self._last_action.copy()
        if self.config.fallback == "zero" and self.info is not None:
            return np.zeros(self.info.action_dim, dtype=np.float32)
        return None

    def act(self, observation: Mapping[str, Any]) -> np.ndarray | None:
        """``update_observation`` then ``get_action``: one control step."""
        self.update_observation(observation)
        return self.get_action()

    def reset(self) -> None:
        """Start a new episode: forget queued actions; replies of the old episode are dropped."""
        with self._state_lock:
            self.queue.clear()
            self._episode_id += 1
            self._reset_pending = True
            self._last_action = None
        with self._cond:
            self._cond.notify_all()  # the loop asks for the new episode's first chunk now

    @property
    def episode_id(self) -> int:
        return self._episode_id

    @property
    def healthy(self) -> bool:
        """False from a failure the background loop caught (a request or a reconnect attempt) until
        one of its requests is answered again. ``last_error`` keeps the failure after a recovery, for
        diagnosis; a health check reads this."""
        return not self._failing

    # -- one request ------------------------------------------------------------------------------
    def estimated_delay(self) -> int:
        """Actions that will execute before a chunk asked for now arrives (``ceil(latency / dt)``)."""
        return self.latency.delay_steps(1.0 / self.config.fps, max_steps=self._horizon)

    def prefixes(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The left-over in model and robot space, cut to the execution horizon (None if nothing is left)."""
        if not self._rtc:
            return None, None
        left_model, left_robot = self.queue.left_overs()
        return self._cut(left_model), self._cut(left_robot)

    def _index_and_prefixes(self) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """The read index and the prefixes that start at it: the merge counts executed actions from
        this index, so a control step between the reads would skip one. ``prefixes`` is a hook
        (subclasses override it) that reads the queue itself, so the index is read on both sides
        and the read repeats if it moved; within a cycle it only grows, or drops to 0 and stays."""
        while True:
            index = self.queue.get_action_index()
            prefix_model, prefix_robot = self.prefixes()
            if self.queue.get_action_index() == index:
                return index, prefix_model, prefix_robot

    def _cut(self, left_over: np.ndarray | None) -> np.ndarray | None:
        if left_over is None or len(left_over) == 0:
            return None
        return np.ascontiguousarray(left_over[: self._horizon], dtype=np.float32)

    def run_cycle(self, observation: Mapping[str, Any] | None = None, *, delay: int | None = None) -> bool:
        """Ask for one chunk and merge it; False when the reply was stale and dropped.

        ``delay`` given: it is both the hint sent and the delay merged with (deterministic).
        Otherwise the hint is :meth:`estimated_delay` and the merge uses the actions really
        executed while waiting.
        """
        with self._cycle_lock:
            if observation is None:
                observation = self._observation
            if observation is None:
                raise ValueError("no observation yet")
            with self._state_lock:
                reset, episode_id = self._reset_pending, self._episode_id
            if reset:
                self._reset_source(episode_id)
            index_before, prefix_model, prefix_robot = self._index_and_prefixes()
            self._seq += 1
            request = ChunkRequest(
                observation, self.estimated_delay() if delay is None else delay, prefix_model, prefix_robot,
                self._seq, episode_id,
            )  # fmt: skip
            started = time.perf_counter()
            reply = self.source.infer(request)
            self.latency.record(time.perf_counter() - started)
            return self._merge(request, reply, index_before, delay)

    def _reset_source(self, episode_id: int) -> None:
        """Reset the source for ``episode_id``. The pending flag is cleared only once the reset landed
        (and no later ``reset()`` asked for another): a failed one raises and is retried by the next
        cycle, never skipped, so the new episode never runs on the old one's processors."""
        self.source.reset(episode_id)
        with self._state_lock:
            if self._episode_id == episode_id:
                self._reset_pending = False

    def _merge(
        self, request: ChunkRequest, reply: ActionChunkMsg, index_before: int, delay: int | None
    ) -> bool:
        header = reply.header
        self.stats.last_queue_wait_ms = reply.queue_wait_ms
        self.stats.last_inference_ms = reply.inference_ms
        self.stats.last_batch_size = reply.batch_size
        with self._state_lock:
            stale = (
                header.seq_id != request.seq_id
                or header.episode_id != self._episode_id
                or header.session_epoch != self.source.epoch
            )
            if stale:
                self.stats.dropped_replies += 1
                return False
            # delay None: the queue counts the actions executed since index_before under its own lock.
            self.queue.merge(reply.chunk_model, reply.chunk_robot, delay, index_before)
            self.stats.chunks_merged += 1
        return True

    # -- the background thread ----------------------------------------------------------------
    def _wants_chunk(self) -> bool:
        fresh = self._obs_version > self._used_version
        if not fresh:
            return False
        with self._state_lock:  # written by reset() under this lock
            reset_pending = self._reset_pending
        return reset_pending or self.queue.qsize() <= self.estimated_delay() + self.config.refill_margin

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            with self._lifecycle_lock:
                self._running = False
                close, self._close_on_exit = self._close_on_exit, False
            if close:
                self.source.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                if not self._wants_chunk():
                    self._cond.wait(0.5 / self.config.fps)
                    continue
                observation, self._used_version = self._observation, self._obs_version
            try:
                self.run_cycle(observation)
                self._backoff = self.config.backoff_initial_s
                self._failing = False  # answered (a stale reply too): the source works again
            except Exception as exc:
                self._on_failure(exc)

    def _on_failure(self, exc: Exception) -> None:
        """Record a failed request, then back off and/or reconnect.

        One backoff runs across cycles until a request is answered: a connection that opens and
        then drops on its first request (e.g. a frame over the server's limit) is reconnected after
        growing waits, not once per control tick. The first failure after an answer reconnects at once.
        """
        failing_already = self._failing
        self._record_failure(exc)
        code = getattr(exc, "code", None)
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.warning("policy source unavailable (%s); reconnecting", exc)
        elif code in REOPEN_CODES:
            logger.warning("session lost (%s); reopening", exc)
        elif code == FRAME_TOO_LARGE:
            # The server closed the connection; only a smaller observation helps: no traceback.
            logger.error("%s; reconnecting in %.2fs", exc, self._backoff)
            failing_already = True
        else:
            # Possibly a bug in the caller's code (e.g. the observation): keep its traceback.
            logger.error("inference request failed; retrying in %.2fs", self._backoff, exc_info=exc)
            self._back_off()
            return
        if failing_already:
            self._back_off()
        self._recover()

    def _back_off(self) -> None:
        """Wait the current backoff (or until stopped), then double it up to ``backoff_max_s``."""
        self._stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, self.config.backoff_max_s)

    def _recover(self) -> None:
        """Reconnect and reopen the session, backing off between attempts, until it works or we stop.

        A refusal is retried too: the server may free up, or be fixed, and the robot then resumes
        without a restart; meanwhile every failed attempt is visible (:meth:`_failed_attempt`).
        """
        while not self._stop.is_set():
            try:
                self._adopt(self.source.reconnect())
                self.stats.reconnects += 1
                return
            except Exception as exc:
                self._failed_attempt(exc, self._backoff)
            self._back_off()

    def _failed_attempt(self, exc: Exception, backoff: float) -> None:
        """Record a failed recovery in ``last_error`` and the error count. An unreachable server
        is expected while it restarts; a refusal (e.g. ``SessionRejected``) needs a person: an error."""
        self._record_failure(exc)
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            logger.info("reconnect failed (%s); retrying in %.2fs", exc, backoff)
        else:
            logger.error("reopening the session failed (%s); retrying in %.2fs", exc, backoff)

    def _record_failure(self, exc: BaseException) -> None:
        """A caught failure: kept in ``last_error``, counted, and the engine unhealthy until an answer."""
        self.last_error = exc
        self.stats.errors += 1
        self._failing = True

    # -- stats ------------------------------------------------------------------------------------
    def latency_stats(self) -> dict[str, float]:
        """Round-trip percentiles (ms), the delay estimate, and the loop's counters."""
        p50, p90, p99 = self.latency.percentiles(50, 90, 99)
        return {
            "count": self.latency.count,
            "p50_ms": p50 * 1000.0,
            "p90_ms": p90 * 1000.0,
            "p99_ms": p99 * 1000.0,
            "recent_max_ms": self.latency.recent_max() * 1000.0,
            "delay_steps": self.estimated_delay(),
            "chunks_merged": self.stats.chunks_merged,
            "dropped_replies": self.stats.dropped_replies,
            "starved_steps": self.stats.starved_steps,
            "reconnects": self.stats.reconnects,
            "errors": self.stats.errors,
            "last_queue_wait_ms": self.stats.last_queue_wait_ms,
            "last_inference_ms": self.stats.last_inference_ms,
            "last_batch_size": self.stats.last_batch_size,
        }
