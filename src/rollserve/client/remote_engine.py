"""RemoteInferenceEngine: the RTC loop with chunks from a rollserve server over the session protocol."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from rollserve.client.inference_loop import ChunkRequest, EngineConfig, InferenceEngine, SourceInfo
from rollserve.client.policy_client import DEFAULT_URL, PolicyClient
from rollserve.wire.messages import ActionChunkMsg


class RemoteChunkSource:
    """A :class:`PolicyClient` with its session; reconnecting reopens the session (new epoch)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        robot_type: str = "",
        action_names: Sequence[str] = (),
        camera_names: Sequence[str] = (),
        state_dim: int | None = None,
        fps: float = 15.0,
        rtc_enabled: bool = True,
        task: str = "",
        jpeg_quality: int = 0,
        timeout: float = 30.0,
    ) -> None:
        if jpeg_quality > 0:
            _require_jpeg(jpeg_quality)
        self.client = PolicyClient(url, api_key=api_key, timeout=timeout)
        self._open_fields = {
            "robot_type": robot_type, "action_names": tuple(action_names),
            "camera_names": tuple(camera_names), "state_dim": state_dim, "fps": fps,
            "rtc_enabled": rtc_enabled, "task": task,
        }  # fmt: skip
        self.task = task
        self.jpeg_quality = jpeg_quality

    @property
    def epoch(self) -> int:
        return self.client.session_epoch

    def connect(self) -> SourceInfo:
        """Connect and open the session. Any failure closes the connection again: a kept one would
        hold a websocket, its threads and one of the server's per-address slots."""
        self.client.connect()
        try:
            ack = self.client.open_session(**self._open_fields)
        except BaseException:
            self.client.close()
            raise
        return SourceInfo(ack.chunk_size, len(ack.action_names), ack.execution_horizon, ack.rtc_supported)

    def infer(self, request: ChunkRequest) -> ActionChunkMsg:
        return self.client.infer(request.to_message(self.epoch, self.task, self.jpeg_quality))

    def reset(self, episode_id: int) -> None:
        self.client.reset(episode_id)

    def reconnect(self) -> SourceInfo:
        self.close()
        return self.connect()

    def close(self) -> None:
        self.client.close()


def _require_jpeg(quality: int) -> None:
    """Refuse JPEG without its encoder up front: otherwise the engine starts, and every request of
    its background thread fails while the robot starves."""
    try:
        importlib.import_module("simplejpeg")
    except ImportError as exc:
        raise ImportError(
            f"jpeg_quality={quality} needs simplejpeg, which is not installed: pip install 'rollserve[jpeg]'"
            " (or use jpeg_quality=0 to send raw images)"
        ) from exc


class RemoteInferenceEngine(InferenceEngine):
    """Robot-side RTC engine talking to ``url``; see :class:`InferenceEngine` for the loop.

    The session is opened with ``config.rtc.enabled`` and ``config.fps``; the server's execution
    horizon and RTC support (from its ack) take precedence over the config's.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        config: EngineConfig | None = None,
        *,
        api_key: str | None = None,
        robot_type: str = "",
        action_names: Sequence[str] = (),
        camera_names: Sequence[str] = (),
        state_dim: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        config = config or EngineConfig()
        source = RemoteChunkSource(
            url, api_key=api_key, robot_type=robot_type, action_names=action_names, camera_names=camera_names,
            state_dim=state_dim, fps=config.fps, rtc_enabled=config.rtc.enabled, task=config.task,
            jpeg_quality=config.jpeg_quality, timeout=timeout,
        )  # fmt: skip
        super().__init__(source, config)

    @property
    def client(self) -> PolicyClient:
        return self.source.client  # type: ignore[attr-defined,no-any-return]
