"""LocalInferenceEngine: the same RTC loop with the policy in-process (no network, same request path).

Chunks come from :class:`rollserve.engine.request_path.PolicyRequestPath`, the code a server's engine
worker runs for each request, so local and remote runs differ only by the transport.
"""

from __future__ import annotations

from typing import Any

from rollserve.client.inference_loop import ChunkRequest, EngineConfig, InferenceEngine, SourceInfo
from rollserve.models.policy import Policy, make_processors
from rollserve.wire.messages import ActionChunkMsg


class LocalChunkSource:
    """A policy and one session's processors, called directly."""

    epoch = 0

    def __init__(self, policy: Policy, *, execution_horizon: int | None = None, task: str = "") -> None:
        from rollserve.engine.request_path import LocalSession, PolicyRequestPath

        self.request_path = PolicyRequestPath(policy, execution_horizon=execution_horizon)
        self.session = LocalSession(processors=make_processors(policy), task=task)
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
    """Robot-side RTC engine with ``policy`` in this process; see :class:`InferenceEngine`."""

    def __init__(self, policy: Policy, config: EngineConfig | None = None, **source_kwargs: Any) -> None:
        config = config or EngineConfig()
        super().__init__(LocalChunkSource(policy, task=config.task, **source_kwargs), config)
