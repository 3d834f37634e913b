"""Request and response models of the world-model rollout API (pydantic, no rules, no HTTP).

Field names and defaults follow vLLM-Omni's P0 rollout API (RFC #3747), so its clients work
unchanged; everything rollserve adds is optional on requests and extra on responses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, FiniteFloat

SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


def _array_to_list(value: Any) -> Any:
    """msgpack bodies may carry numpy arrays where JSON bodies carry lists."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


FloatList = Annotated[list[FiniteFloat], BeforeValidator(_array_to_list)]
SessionId = Annotated[str, Field(pattern=SESSION_ID_PATTERN)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]


class Observation(BaseModel):
    """What the robot saw. ``extra`` keys ``observation/*`` and ``seed`` pass through to the world."""

    images: dict[str, Any] | None = None
    state: FloatList | None = None
    prompt: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)


class Action(BaseModel):
    """The executed DROID action: 7 joint positions and one gripper position."""

    joint_positions: FloatList | None = None
    gripper_position: Annotated[FiniteFloat | FloatList | None, BeforeValidator(_array_to_list)] = None
    extra: dict[str, Any] = Field(default_factory=dict)


class SessionMetadata(BaseModel):
    latency_ms: float
    steps_generated: int
    context_length: int
    committed_step_id: int = Field(description="Highest committed step_id; -1 when none is.")
    session_memory_bytes: int | None = None
    uncertainty: float | None = None
    queue_wait_ms: float | None = None
    batch_size: int | None = None


class ErrorObject(BaseModel):
    code: str
    message: str
    step_id: int | None = None
    committed_step_id: int = -1


class CreateSessionRequest(BaseModel):
    model: str
    mode: Literal["world_model_env"] = "world_model_env"
    seed: Seed | None = Field(default=None, description="Seeds the initial state (rollserve).")
    session_id: SessionId | None = Field(
        default=None, description="Client-chosen id; creating it again returns the same session (rollserve)."
    )


class CreateSessionResponse(BaseModel):
    session_id: str
    mode: str
    created_at: float
    model: str | None = None
    committed_step_id: int = -1
    context_length: int = 0
    observation: dict[str, Any] | None = Field(default=None, description="The initial observation.")
    forked_from: str | None = None


class RolloutStepRequest(BaseModel):
    step_id: int = Field(ge=0, description="Monotonically increasing per session.")
    observation: Observation
    action: Action
    use_session_context: bool = True


class RolloutStepResponse(BaseModel):
    step_id: int
    next_observation: dict[str, Any] | None = None
    model_metadata: SessionMetadata
    error: ErrorObject | None = None
    replayed: bool = Field(default=False, description="True when this is the stored result of a duplicate.")


class ResetSessionRequest(BaseModel):
    """Optional body of ``reset`` (rollserve): where the new episode starts."""

    seed: Seed | None = None
    state: FloatList | None = None


class ResetSessionResponse(BaseModel):
    session_id: str
    committed_step_id: int
    context_length: int = 0
    observation: dict[str, Any] | None = None


class ForkSessionRequest(BaseModel):
    session_id: SessionId | None = Field(default=None, description="Id for the new session.")


class CloseSessionResponse(BaseModel):
    session_id: str
    closed: bool = True
    committed_step_id: int = -1


class SessionStatusResponse(BaseModel):
    session_id: str
    committed_step_id: int
    context_length: int
    closed: bool
    closed_reason: str | None = None
    model: str | None = None


class BatchStepItem(RolloutStepRequest):
    session_id: str


class BatchStepRequest(BaseModel):
    items: list[BatchStepItem] = Field(min_length=1)


class BatchStepResult(RolloutStepResponse):
    session_id: str
    status: Literal["ok", "error"]


class BatchStepResponse(BaseModel):
    object: Literal["batch_step"] = "batch_step"
    results: list[BatchStepResult]


class ErrorResponse(BaseModel):
    """Body of a non-step error in strict mode: the code, a message, the session's committed step."""

    model_config = ConfigDict(extra="allow")
    error: ErrorObject


class VllmErrorInfo(BaseModel):
    """vLLM's error object, with rollserve's typed code (``reason``) and ``committed_step_id`` added."""

    message: str
    type: str = Field(description="The HTTP status phrase, e.g. 'Not Found'.")
    param: str | None = None
    code: int = Field(description="The HTTP status.")
    reason: str = Field(description="rollserve's error code, e.g. 'session_not_found'.")
    committed_step_id: int = -1


class VllmErrorResponse(BaseModel):
    """Body of a non-step error in vLLM-Omni mode (the default): vLLM's error body plus FastAPI's detail."""

    detail: str
    error: VllmErrorInfo
