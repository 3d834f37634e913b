"""Session-protocol messages: plain dataclasses, each with a wire ``type`` and typed fields.

Arrays are numpy (float32 for states and chunks); the codec turns them into tensors on the wire.
``WIRE_FIELDS`` names each field's kind so decoding validates types before anything uses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

SCHEMA_VERSION = 1


@dataclass
class MsgHeader:
    """Identity and ordering of one request; replies echo it so a client can drop stale ones."""

    schema_version: int = SCHEMA_VERSION
    seq_id: int = 0
    episode_id: int = 0
    session_epoch: int = 0
    client_mono_ns: int = 0


@dataclass
class SessionOpen:
    """A robot introduces itself and asks for a policy session."""

    TYPE: ClassVar[str] = "session_open"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {
        "client_uuid": "name", "robot_type": "name", "action_names": "name_list",
        "camera_names": "name_list", "state_dim": "opt_int", "fps": "float", "rtc_enabled": "bool",
        "schema_version": "int", "task": "task",
    }  # fmt: skip

    client_uuid: str = ""
    robot_type: str = ""
    action_names: list[str] = field(default_factory=list)
    camera_names: list[str] = field(default_factory=list)
    state_dim: int | None = None
    fps: float = 15.0
    rtc_enabled: bool = True
    schema_version: int = SCHEMA_VERSION
    task: str = ""


@dataclass
class SessionAck:
    """The server's answer: accepted (with what the policy expects) or a clear reason."""

    TYPE: ClassVar[str] = "session_ack"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {
        "accepted": "bool", "reason": "str", "session_id": "str", "session_epoch": "int", "chunk_size": "int",
        "action_names": "str_list", "camera_names": "str_list", "state_dim": "int", "rtc_supported": "bool",
        "execution_horizon": "int", "fps": "float", "server_load": "dict", "policy": "dict",
    }  # fmt: skip

    accepted: bool = False
    reason: str = ""
    session_id: str = ""
    session_epoch: int = 0
    chunk_size: int = 0
    action_names: list[str] = field(default_factory=list)
    camera_names: list[str] = field(default_factory=list)
    state_dim: int = 0
    rtc_supported: bool = False
    execution_horizon: int = 0
    fps: float = 0.0
    server_load: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)


@dataclass
class ObservationMsg:
    """One observation; with RTC it carries the not-yet-executed prefix in both spaces."""

    TYPE: ClassVar[str] = "observation"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {
        "header": "header", "state": "opt_array", "images": "images", "task": "task",
        "inference_delay_steps": "int", "prefix_model": "opt_array", "prefix_robot": "opt_array",
        "jpeg_quality": "int",
    }  # fmt: skip

    state: np.ndarray | None = None
    images: dict[str, np.ndarray] = field(default_factory=dict)
    task: str = ""
    inference_delay_steps: int = 0
    prefix_model: np.ndarray | None = None
    prefix_robot: np.ndarray | None = None
    jpeg_quality: int = 0
    header: MsgHeader = field(default_factory=MsgHeader)


@dataclass
class ActionChunkMsg:
    """A chunk in model space (for RTC prefixes) and robot space (to execute), with timings."""

    TYPE: ClassVar[str] = "action_chunk"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {
        "header": "header", "chunk_model": "array", "chunk_robot": "array", "inference_delay_steps": "int",
        "queue_wait_ms": "float", "inference_ms": "float", "batch_size": "int",
        "superseded_seq_ids": "int_list",
    }  # fmt: skip

    chunk_model: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    chunk_robot: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    inference_delay_steps: int = 0
    queue_wait_ms: float = 0.0
    inference_ms: float = 0.0
    batch_size: int = 1
    superseded_seq_ids: list[int] = field(default_factory=list)
    header: MsgHeader = field(default_factory=MsgHeader)


@dataclass
class ResetMsg:
    """Start a new episode: drop queued work and per-session processor state."""

    TYPE: ClassVar[str] = "reset"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {"header": "header"}
    header: MsgHeader = field(default_factory=MsgHeader)


@dataclass
class ResetAck:
    TYPE: ClassVar[str] = "reset_ack"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {"header": "header", "session_epoch": "int"}
    header: MsgHeader = field(default_factory=MsgHeader)
    session_epoch: int = 0


@dataclass
class CloseMsg:
    TYPE: ClassVar[str] = "close"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {"header": "header"}
    header: MsgHeader = field(default_factory=MsgHeader)


@dataclass
class CloseAck:
    TYPE: ClassVar[str] = "close_ack"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {"header": "header"}
    header: MsgHeader = field(default_factory=MsgHeader)


@dataclass
class ErrorMsg:
    """A typed error reply: a stable ``code``, a human message (never a traceback), the request's seq."""

    TYPE: ClassVar[str] = "error"
    WIRE_FIELDS: ClassVar[dict[str, str]] = {
        "code": "str", "message": "str", "seq_id": "opt_int", "retryable": "bool",
    }  # fmt: skip

    code: str = ""
    message: str = ""
    seq_id: int | None = None
    retryable: bool = False


Message = (
    SessionOpen
    | SessionAck
    | ObservationMsg
    | ActionChunkMsg
    | ResetMsg
    | ResetAck
    | CloseMsg
    | CloseAck
    | ErrorMsg
)
MESSAGE_TYPES: dict[str, type] = {
    cls.TYPE: cls
    for cls in (
        SessionOpen,
        SessionAck,
        ObservationMsg,
        ActionChunkMsg,
        ResetMsg,
        ResetAck,
        CloseMsg,
        CloseAck,
        ErrorMsg,
    )
}
