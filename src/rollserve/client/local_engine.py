"""LocalInferenceEngine: the same RTC loop with the policy in-process (no network, same request path).

Chunks come from :class:`rollserve.engine.request_path.PolicyRequestPath`, the code a server's engine
worker runs for each request, so local and remote runs differ only by the transport.
"""

from __future__ import annotations

from rollserve.client.inference_loop import (
    DEFAULT_RTC,
    ChunkRequest,
    EngineConfig,
    InferenceEngine,
    SourceInfo,
)
from rollserve.models.policy import Policy, make_processors
from rollserve.wire.messages import ActionChunkMsg


class LocalChunkSource:
    """A policy and one session's processors, called directly."""

    epoch = 0

    def __init__(self, policy: Policy, *, execution_horizon: int | None = None, task: str = "") -> None:
        from rollserve.engine.request_path import LocalSession, PolicyRequestPath

        self.request_path = PolicyRequestPath(policy, execution_horizon=execution_horizon)
        self.session = LocalSession(processors=make_processors(policy))  # the task goes in each request
        self.task = task

    def connect(self) -> SourceInfo:
        meta = self.request_path.metadata
        return SourceInfo(
            meta.chunk_size, meta.action_dim, self.request_path.execution_horizon, meta.supports_rtc
        )

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        obs = request.to_message(self.epoch, self.task)
        return self.request_path.run_inference_request(self.session, obs.header, obs)

    def reset(self, episode_id: int) -> None:
        self.session.processors = make_processors(self.request_path.policy)

    def reconnect(self) -> SourceInfo:
        return self.connect()

    def close(self) -> None:
        pass


class LocalInferenceEngine(InferenceEngine):
    """Robot-side RTC engine with ``policy`` in this process; see :class:`InferenceEngine`.

    No server announces an execution horizon here, so the user's is used: ``execution_horizon``
    (the in-process ``--rtc-horizon``: it wins, as a server's does over the config's), else the
    horizon of an ``rtc`` the config sets, else the policy's own (as a server started without
    ``--rtc-horizon`` uses); never beyond the policy's chunk, as on a server.
    """

    def __init__(
        self,
        policy: Policy,
        config: EngineConfig | None = None,
        *,
        execution_horizon: int | None = None,
    ) -> None:
        config = config or EngineConfig()
        if execution_horizon is None and config.rtc is not DEFAULT_RTC:
            execution_horizon = config.rtc.execution_horizon
        source = LocalChunkSource(policy, execution_horizon=execution_horizon, task=config.task)
        super().__init__(source, config)
