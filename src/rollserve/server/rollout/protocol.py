"""Request and response models of the world-model rollout API (pydantic, no rules, no HTTP).

Field names and defaults follow vLLM-Omni's P0 rollout API (RFC #3747), so its clients work
unchanged; everything rollserve adds is optional on requests and extra on responses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from rollserve.wire.errors import WireError
from rollserve.wire.images import IMAGE_KEY, decode_images
from rollserve.wire.limits import DEFAULT_LIMITS

M = TypeVar("M", bound=BaseModel)

SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Caps checked before the items are validated (pydantic checks a list's length first).
MAX_VECTOR = 1024  # values in state, joint_positions, gripper_position
MAX_EXTRA_KEYS = 64
MAX_EXTRA_ITEMS = 4096  # values nested inside one extra map (send big data as msgpack tensors)
MAX_PROMPT_CHARS = 4096


def _array_to_list(value: Any) -> Any:
    """msgpack bodies may carry numpy arrays where JSON bodies carry lists."""
    if isinstance(value, np.ndarray) and value.size > MAX_VECTOR:
        raise ValueError(f"at most {MAX_VECTOR} values")
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def _float32(value: float) -> float:
    """Finite *as float32*: 1e308 is finite in float64 but inf once the world casts it."""
    if not -FLOAT32_MAX <= value <= FLOAT32_MAX:  # also False for NaN
        raise ValueError("must be finite and within float32 range")
    return value


def _bounded_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """A small tree of plain values keyed by strings: no bytes keys, at most MAX_EXTRA_ITEMS values."""
    stack, budget = list(extra.values()), MAX_EXTRA_ITEMS
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            raise ValueError(f"extra holds more than {MAX_EXTRA_ITEMS} values; send large data as tensors")
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise ValueError("extra maps must be keyed by strings")
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return extra


def _is_image_map(value: Any) -> bool:
    return isinstance(value, dict) and value.get(IMAGE_KEY) is True


# Strict: a bool is not a number (lax float reads ``true`` as 1.0), nor is a string ("0.5"), as for
# step_id and seed; ints, and the numpy scalars and arrays msgpack bodies carry, still pass. No extra
# validator call: as cheap as the lax float.
Float32 = Annotated[float, Strict(), AfterValidator(_float32)]
FloatList = Annotated[list[Float32], Field(max_length=MAX_VECTOR), BeforeValidator(_array_to_list)]
Extra = Annotated[dict[str, Any], Field(max_length=MAX_EXTRA_KEYS), AfterValidator(_bounded_extra)]
StrictInt = Annotated[int, Strict()]  # a bool is not a number: lax int reads ``true`` as 1
SessionId = Annotated[str, Field(pattern=SESSION_ID_PATTERN)]
Seed = Annotated[int, Strict(), Field(ge=0, lt=2**63)]
StepId = Annotated[int, Strict(), Field(ge=0, lt=2**63, description="Monotonically increasing per session.")]


class Observation(BaseModel):
    """What the robot saw. ``extra`` keys ``observation/*`` and ``seed`` pass through to the world."""

    images: Annotated[dict[str, Any], Field(max_length=DEFAULT_LIMITS.max_images)] | None = None
    state: FloatList | None = None
    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] = ""
    extra: Extra = Field(default_factory=dict)

    @field_validator("images")
    @classmethod
    def _decode_images(cls, images: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        """rollserve wire images (msgpack) are decoded here, where images belong, after the count and
        a total-pixel budget; anything else (a client's own encoding) passes through to the world."""
        if not images:
            return images
        wire = {k: v for k, v in images.items() if isinstance(v, np.ndarray) or _is_image_map(v)}
        if not wire:
            return images
        limits = (info.context or {}).get("limits", DEFAULT_LIMITS)
        try:
            return {**images, **decode_images(wire, limits)}
        except WireError as exc:
            raise ValueError(exc.message) from None


class Action(BaseModel):
    """The executed DROID action: 7 joint positions and one gripper position."""

    joint_positions: FloatList | None = None
    gripper_position: Annotated[Float32 | FloatList | None, BeforeValidator(_array_to_list)] = None
    extra: Extra = Field(default_factory=dict)


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


MAX_FRAME_SIDE = 256
"""Largest rendered frame side: a ``[1, 3, 256, 256]`` float32 frame is 768 KiB (1 MiB as base64)."""

CameraName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class RenderRequest(BaseModel):
    """Camera frames with every observation (rollserve): which cameras, what size, raw or JPEG.

    The first camera's frame is ``video_latent`` (float32 ``[1, 3, H, W]`` in [0, 1]); every camera's
    image is in ``images`` (uint8 HWC RGB, raw or JPEG as on the policy wire) and the state vector in
    ``state``.
    """

    model_config = ConfigDict(extra="forbid")

    cameras: list[CameraName] | None = Field(
        default=None, min_length=1, max_length=8, description="Cameras to render; default: all the world has."
    )
    height: StrictInt = Field(default=64, ge=16, le=MAX_FRAME_SIDE)
    width: StrictInt = Field(default=64, ge=16, le=MAX_FRAME_SIDE)
    jpeg_quality: StrictInt = Field(default=0, ge=0, le=100, description="0 sends raw pixels; 1..100 JPEG.")


class CreateSessionRequest(BaseModel):
    model: str
    mode: Literal["world_model_env"] = "world_model_env"
    render: RenderRequest | None = Field(
        default=None, description="Camera frames with each observation (rollserve)."
    )
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
    step_id: StepId
    observation: Observation
    action: Action
    use_session_context: bool = True
    _fingerprint: str | None = PrivateAttr(default=None)  # set once, off the event loop for big bodies


class RolloutStepResponse(BaseModel):
    step_id: int
    next_observation: dict[str, Any] | None = None
    model_metadata: SessionMetadata
    error: ErrorObject | None = None
    replayed: bool = Field(default=False, description="True when this is the stored result of a duplicate.")


def _refuse_render(body: Any) -> Any:
    """Frames are chosen once, at create: a reset or fork keeps the session's choice. Other unknown
    keys are ignored (as vLLM-Omni does), but a ``render`` here would be a silent no-op."""
    if isinstance(body, dict) and "render" in body:
        raise ValueError("render is chosen when a session is created; a reset or fork keeps the session's")
    return body


class ResetSessionRequest(BaseModel):
    """Optional body of ``reset`` (rollserve): where the new episode starts."""

    seed: Seed | None = None
    state: FloatList | None = None
    _no_render = model_validator(mode="before")(_refuse_render)


class ResetSessionResponse(BaseModel):
    session_id: str
    committed_step_id: int
    context_length: int = 0
    observation: dict[str, Any] | None = None


class ForkSessionRequest(BaseModel):
    session_id: SessionId | None = Field(default=None, description="Id for the new session.")
    _no_render = model_validator(mode="before")(_refuse_render)


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
    # Items refused on their own (index -> message), each answered ``invalid_request`` while the
    # others step; their place in ``items`` holds a stand-in with their session_id and step_id.
    _refused: dict[int, str] | None = PrivateAttr(default=None)


class BatchStepResult(RolloutStepResponse):
    session_id: str
    status: Literal["ok", "error"]


class BatchStepResponse(BaseModel):
    object: Literal["batch_step"] = "batch_step"
    results: list[BatchStepResult]


ACTION_WIDTH = 8  # a DROID action row: 7 joint positions, then the gripper position
_ACTION_ROWS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "array",
        "items": {"type": "number"},
        "minItems": ACTION_WIDTH,
        "maxItems": ACTION_WIDTH,
    },
    "description": "A row per session: 7 joint positions, then the gripper (msgpack: a float32 tensor).",
}


_ROWS_WANTED = f"actions must be rows of {ACTION_WIDTH} numbers (7 joint positions, then the gripper)"


def _action_rows(value: Any) -> np.ndarray:
    """``actions`` of a columnar batch as an ``(N, 8)`` array: a msgpack tensor of numbers, or rows
    of 8 numbers (a bool is not one). Whether each row is finite is checked per row, later."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "fiu":
            raise ValueError("actions must hold numbers")
        rows = value if value.dtype.kind == "f" else value.astype(np.float64)  # ints stand for floats
    elif type(value) is list and all(
        type(row) is list and len(row) == ACTION_WIDTH and all(type(v) in (int, float) for v in row)
        for row in value
    ):
        try:
            rows = np.array(value, dtype=np.float64).reshape(len(value), ACTION_WIDTH)
        except OverflowError:  # an integer beyond any float
            raise ValueError("actions must be within float32 range") from None
    else:
        raise ValueError(_ROWS_WANTED)
    if rows.ndim != 2 or rows.shape[1] != ACTION_WIDTH:
        raise ValueError(_ROWS_WANTED)
    return rows


class BatchStepColumnsRequest(BaseModel):
    """rollserve: the next contextual step of N sessions, as columns (what a vector env sends).

    Row ``i`` is the ``batch_step`` item ``{session_id: session_ids[i], step_id: step_ids[i],
    observation: {}, action: {joint_positions: actions[i][:7], gripper_position: actions[i][7]}}``:
    the same rules, and the same fingerprint, so a row and that item replay each other.
    """

    session_ids: Annotated[list[SessionId], Field(min_length=1)]
    step_ids: list[StepId]
    actions: Annotated[Any, BeforeValidator(_action_rows), WithJsonSchema(_ACTION_ROWS_SCHEMA)]

    @model_validator(mode="after")
    def _same_length(self) -> BatchStepColumnsRequest:
        if not len(self.session_ids) == len(self.step_ids) == len(self.actions):
            raise ValueError("session_ids, step_ids and actions must have one entry per session")
        return self


class BatchStepColumnsResponse(BaseModel):
    """Row ``i`` answers row ``i`` of the request, as the ``batch_step`` item's result would: a
    failed row (``status`` "error") holds zeros in every column but its ``errors`` entry, unless it
    is the replay of a committed step (``replayed``), which holds that step's stored result."""

    object: Literal["batch_step.columns"] = "batch_step.columns"
    session_ids: list[str]
    step_ids: list[int]
    status: list[Literal["ok", "error"]]
    replayed: list[bool]
    committed_step_ids: list[int]
    context_lengths: list[int]
    errors: list[dict[str, str] | None] = Field(description="Per row: null, or its error's code and message.")
    uncertainty: list[float | None]
    next_observation: dict[str, Any] = Field(
        description=(
            "video_latent: every row's observation in one float32 tensor [N, ...] (msgpack: the "
            "tensor; JSON: base64 of its bytes, with shape), state: [N, S] when the world reports a "
            "state vector, reward, terminated and info: one entry per row."
        )
    )
    latency_ms: float


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


def built(cls: type[M], fields: dict[str, Any], private: dict[str, Any] | None = None) -> M:
    """A model from values that already have their declared types, every field given in declaration
    order: what validation would build, without the ~2-5 µs per model of checking and copying them
    again (a 32-item ``batch_step`` builds ~100 models). ``model_construct`` would cost more than
    validating, as it walks every field's default. Tests pin ``built(...) == cls(**fields)``."""
    model = cls.__new__(cls)
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(model, "__pydantic_fields_set__", set(fields))
    object.__setattr__(model, "__pydantic_extra__", None)
    object.__setattr__(model, "__pydantic_private__", private)
    return model
