"""The robot loop in simulated time: inference takes exactly ``delay`` control steps, deterministically.

What the RTC experiment runs. The policy is called in-process through the server's own request
path (:class:`~rollserve.client.local_engine.LocalChunkSource`), and while a chunk is "in flight"
the robot executes ``delay`` actions of the current chunk (or stalls, holding, if it has none),
exactly as it would on the wall clock with that latency, but as fast as the CPU allows and with
seeded sampling noise, so a run is reproducible.
"""

from __future__ import annotations

from typing import Any

from rollserve.client.local_engine import LocalChunkSource
from rollserve.demo.metrics import EpisodeTrace
from rollserve.demo.recording import RecordingSource
from rollserve.demo.robot import hold_action
from rollserve.demo.strategies import Strategy, StrategyEngine, engine_config
from rollserve.models.policy import Policy
from rollserve.sim.env import TabletopPickPlaceEnv


class SimulatedRobot:
    """One strategy at one inference delay, over as many episodes as asked."""

    def __init__(
        self,
        policy: Policy,
        strategy: Strategy,
        *,
        delay: int,
        refill_margin: int,
        execution_horizon: int,
        fps: float,
        sync_steps: int = 8,
        env: TabletopPickPlaceEnv | None = None,
    ) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.policy = policy
        self.strategy = strategy
        self.delay = delay
        self.refill_margin = refill_margin
        self.dt = 1.0 / fps
        self.env = env or TabletopPickPlaceEnv()
        self.source = RecordingSource(
            LocalChunkSource(policy, execution_horizon=execution_horizon), in_flight=self._in_flight
        )
        config = engine_config(
            strategy, fps=fps, refill_margin=refill_margin, execution_horizon=execution_horizon
        )
        self.engine = StrategyEngine(self.source, config, strategy, sync_steps=sync_steps)
        self.engine.connect()
        self._flight_steps = 0
        self._trace = EpisodeTrace(seed=0)
        self._observation: dict[str, Any] = {}
        self._command = hold_action({"state": [0.0] * 8})
        self._done = False
        self._fresh = False  # the newest observation has not been sent yet: at most one request per tick

    def run_episode(self, seed: int) -> EpisodeTrace:
        reseed = getattr(self.policy, "reseed", None)
        if callable(reseed):
            reseed(seed)  # the same sampling noise for every strategy and delay
        self._trace = EpisodeTrace(seed=seed)
        self._observation, _ = self.env.reset(seed=seed)
        self._command = hold_action(self._observation)
        self._done = False
        self.engine.reset()
        self.engine.queue.forget_merged()
        self._request(flight_steps=0)  # the first chunk is fetched with the robot at rest
        while not self._done:
            if self._wants_chunk():
                self._request(flight_steps=self.delay)
            else:
                self._tick()
        self._trace.seconds = self._trace.ticks * self.dt
        self._trace.chunks = self.engine.queue.forget_merged()
        return self._trace

    def _wants_chunk(self) -> bool:
        if not self._fresh:
            return False
        ready = self.engine.ready_actions()
        if not self.strategy.asynchronous:
            return ready == 0
        return ready <= self.delay + self.refill_margin

    def _request(self, flight_steps: int) -> None:
        self._fresh = False
        self._flight_steps = flight_steps
        hint = self.delay if self.strategy.asynchronous and flight_steps else 0
        try:
            self.engine.run_cycle(self._observation, delay=hint)
        finally:
            self._flight_steps = 0

    def _in_flight(self) -> None:
        for _ in range(self._flight_steps):
            if self._done:
                return
            self._tick()

    def _tick(self) -> None:
        action = self.engine.get_action()
        self._trace.record(action, self.engine.last_chunk_id)
        if action is not None:
            self._command = action
        self._observation, _, terminated, truncated, info = self.env.step(self._command)
        self._fresh = True
        if terminated or truncated:
            self._trace.success = bool(info["success"])
            self._done = True
