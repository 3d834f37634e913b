"""The robot side: a light client (numpy, msgpack, websockets) and RTC inference engines.

No torch and no server stack here: a robot computer installs ``rollserve`` without extras.
"""

from rollserve.client.inference_loop import EngineConfig, InferenceEngine
from rollserve.client.local_engine import LocalInferenceEngine
from rollserve.client.policy_client import (
    FrameTooLarge,
    PolicyClient,
    PolicyConnectionError,
    SendTimeout,
    ServerError,
    SessionRejected,
)
from rollserve.client.remote_engine import RemoteInferenceEngine

__all__ = [
    "EngineConfig",
    "FrameTooLarge",
    "InferenceEngine",
    "LocalInferenceEngine",
    "PolicyClient",
    "PolicyConnectionError",
    "RemoteInferenceEngine",
    "SendTimeout",
    "ServerError",
    "SessionRejected",
]
