"""The WorldModel protocol: what the rollout service asks of a world, and nothing about HTTP.

Worlds are *functional*: a session's state is a value the world hands back and the service keeps.
A step never mutates the state it was given, so a failed step (or one whose output could not be
encoded) leaves the session exactly as committed, a fork is a second reference to the same value,
and a retried step starts from the same state as the first try.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

DROID_ACTION_NAMES: tuple[str, ...] = (*(f"joint_{i}" for i in range(7)), "gripper")
"""The action layout every served world takes: 7 joint-position targets and one gripper position."""


@dataclass(frozen=True)
class WorldSpec:
    """What a world observes and accepts; published by ``GET /v1/models``."""

    name: str
    observation_names: tuple[str, ...]
    action_names: tuple[str, ...] = DROID_ACTION_NAMES
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    observation_low: tuple[float, ...] | None = None
    """Per value of ``observation_names`` (flat, even when ``observation_shape`` is a tensor's)."""
    observation_high: tuple[float, ...] | None = None
    fps: float = 15.0
    max_episode_steps: int = 200
    requires_action: bool = True
    acts: bool = False  # a world-action model: a step without an action gets the world's own
    description: str = ""
    aliases: tuple[str, ...] = ()
    state_names: tuple[str, ...] = ()
    """Names of the state vector sent next to a tensor observation (``next_observation.state``)."""
    cameras: tuple[str, ...] = ()
    """Cameras whose frames a session may ask for."""
    observation_shape: tuple[int, ...] | None = None
    """Shape of ``video_latent`` when it is not the flat ``observation_names`` vector."""
    frame_size: tuple[int, int] | None = None
    """The one (height, width) the world's frames have, or None when a session may choose it."""
    state_low: tuple[float, ...] | None = None
    """Bounds of the state vector (``state_layout``) when the observation is not that vector (a
    latent): a world whose observation is the state needs none, its observation bounds are the
    state's (see :attr:`state_bounds`)."""
    state_high: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        """A bound that does not fit its layout would publish a space no observation can be in."""
        for what, low, high, size in (
            ("action", self.action_low, self.action_high, self.action_dim),
            ("observation", self.observation_low, self.observation_high, self.observation_dim),
            ("state", self.state_low, self.state_high, len(self.state_layout)),
        ):
            if (low is None) != (high is None):
                raise ValueError(f"{self.name}: {what}_low and {what}_high go together")
            if low is not None and high is not None and not len(low) == len(high) == size:
                raise ValueError(f"{self.name}: {what} bounds need {size} values each")

    @property
    def observation_dim(self) -> int:
        return len(self.observation_names)

    @property
    def state_layout(self) -> tuple[str, ...]:
        """Names of the state vector a rendering session gets next to its frames."""
        return self.state_names or self.observation_names

    @property
    def observation_is_state(self) -> bool:
        """Whether the observation is the flat state vector itself (not a latent or other tensor)."""
        return self.observation_shape is None and self.state_layout == self.observation_names

    @property
    def state_bounds(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The state vector's (low, high): its own, else the observation's when the observation is
        the state (one bound for both, so they cannot disagree), else None (unbounded)."""
        if self.state_low is not None and self.state_high is not None:
            return self.state_low, self.state_high
        if (
            self.observation_is_state
            and self.observation_low is not None
            and self.observation_high is not None
        ):
            return self.observation_low, self.observation_high
        return None

    @property
    def action_dim(self) -> int:
        return len(self.action_names)

    def serves(self, model: str) -> bool:
        return model == self.name or model in self.aliases

    def check_start_state(self, state: np.ndarray) -> None:
        """Raise ``ValueError`` unless a client's start state (a state vector) lies within the state
        bounds published here (inclusive, as ``observation_space`` is): the first observation would
        fall outside them, and clamping would start an episode from a state the client did not ask
        for. For a world whose observation is the state these are its observation bounds.

        ``state`` is the values as the client sent them (float64 from JSON), not yet rounded to
        float32: they are compared exactly with the bounds as ``/v1/models`` publishes them, so a
        value past a bound by less than float32's rounding is refused, not rounded onto the bound.
        Rounding after the check cannot leave the bounds' float32 box (rounding keeps order).

        A bound float32 cannot hold also counts in its float32 rounding (``0.1`` as
        ``0.100000001...``): that is the bound of the float32 ``observation_space`` a gymnasium
        client holds, and it rounds to the same float32 start as the bound itself."""
        bounds = self.state_bounds
        if bounds is None:
            return
        values = np.asarray(state, dtype=np.float64)  # exact for float32 and float64 input
        low, high = (np.asarray(b, dtype=np.float64) for b in bounds)
        inside = (values >= low) & (values <= high)
        inside |= (values == low.astype(np.float32)) | (values == high.astype(np.float32))
        outside = np.flatnonzero(~inside)
        if outside.size == 0:
            return
        i = int(outside[0])
        kind = "observation" if self.state_low is None else "state"
        where = f"start state value {state[i]!s} at index {i} ({self.state_layout[i]})"
        if values[i] < low[i]:
            raise ValueError(f"{where} is below {kind}_low {bounds[0][i]}")
        if values[i] > high[i]:
            raise ValueError(f"{where} is above {kind}_high {bounds[1][i]}")
        raise ValueError(f"{where} is not a number")

    def describe(self) -> dict[str, Any]:
        """The OpenAI-style ``/v1/models`` entry, with the layouts a client needs to build requests."""
        action: dict[str, Any] = {
            "names": list(self.action_names),
            "shape": [self.action_dim],
            "dtype": "float32",
            "fields": {"joint_positions": self.action_dim - 1, "gripper_position": 1},
        }
        if self.action_low is not None and self.action_high is not None:
            action["low"] = list(self.action_low)
            action["high"] = list(self.action_high)
        observation: dict[str, Any] = {
            "names": list(self.observation_names),
            "shape": [self.observation_dim],
            "dtype": "float32",
            "field": "next_observation.video_latent",
        }
        if self.observation_low is not None and self.observation_high is not None:
            observation["low"] = _published(self.observation_low, self.observation_shape)
            observation["high"] = _published(self.observation_high, self.observation_shape)
        if self.observation_shape is not None:
            observation["shape"] = list(self.observation_shape)
            observation.pop("names")
        entry_extra: dict[str, Any] = {}
        if self.cameras:
            entry_extra["cameras"] = list(self.cameras)
            entry_extra["frame_size"] = list(self.frame_size) if self.frame_size else None
            entry_extra["state"] = {
                "names": list(self.state_layout),
                "shape": [len(self.state_layout)],
                "dtype": "float32",
                "field": "next_observation.state",
            }
            bounds = self.state_bounds
            if bounds is not None:
                entry_extra["state"]["low"] = list(bounds[0])
                entry_extra["state"]["high"] = list(bounds[1])
        return {
            **entry_extra,
            "id": self.name,
            "object": "model",
            "owned_by": "rollserve",
            "kind": "world",
            "description": self.description,
            "fps": self.fps,
            "max_episode_steps": self.max_episode_steps,
            "acts": self.acts,
            "observation": observation,
            "action": action,
        }


def _published(bound: tuple[float, ...], shape: tuple[int, ...] | None) -> list[Any]:
    """A bound as ``/v1/models`` publishes it: one value per element, nested in the observation's
    shape when it has one (so ``np.asarray(low)`` has the shape a client builds its space with)."""
    if shape is None:
        return list(bound)
    return np.asarray(bound, dtype=np.float64).reshape(shape).tolist()


@dataclass(frozen=True)
class RenderSpec:
    """Which camera frames a session gets with each observation, and at what size."""

    cameras: tuple[str, ...]
    height: int
    width: int


@dataclass(frozen=True)
class WorldInit:
    """Where a fresh context starts: a seeded initial state, or an explicit observation vector.

    ``state`` is the client's vector as it was sent (float64): a world checks it against its bounds
    (``spec.check_start_state``) before rounding it to its own dtype, so a value just past a bound is
    refused rather than rounded onto it. ``render`` asks for camera frames from this context on
    (worlds keep it in their state, so every step, fork and retry of the context renders the same way).
    """

    seed: int | None = None
    state: np.ndarray | None = None
    render: RenderSpec | None = None


@dataclass(frozen=True)
class WorldStep:
    """One step: the state to step from, the DROID action, and the folded request (prompt, images).

    ``action`` is None only for a world whose ``spec.acts``: the world picks the action itself.
    """

    state: Any
    action: np.ndarray | None
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorldOutput:
    """A world's answer: the new state (opaque to the service) and what the client sees of it.

    ``observation`` is array-like (numpy or a tensor); the service converts it to float32 before it
    commits anything, so a world may hand back whatever its model produced.
    """

    state: Any
    observation: Any
    reward: float = 0.0
    terminated: bool = False
    uncertainty: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    action: Any = None  # the action a world-action model chose itself (None when it applied the request's)
    vector: Any = None
    """The state vector, when ``observation`` is something else (frames, a latent)."""
    images: dict[str, np.ndarray] | None = None
    """Camera frames, uint8 HWC RGB, by camera name (sessions that render)."""


@runtime_checkable
class WorldModel(Protocol):
    """A batched, functional world. Each method returns one output or exception per item, so one bad
    item never fails the others; the service runs every call on one engine thread."""

    spec: WorldSpec

    def initial_states(self, inits: Sequence[WorldInit]) -> Sequence[WorldOutput | BaseException]: ...

    def step_batch(self, steps: Sequence[WorldStep]) -> Sequence[WorldOutput | BaseException]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class WorldCall:
    """One unit of engine work: start a fresh context (``init``), then step it if ``step`` is given.

    A step with ``init`` ignores ``step.state`` and starts from the fresh context instead (a
    stateless step, or the first step conditioned on an explicit start state).
    """

    init: WorldInit | None = None
    step: WorldStep | None = None


@dataclass(frozen=True)
class FromStart:
    """A step the world made from a fresh context, and that context's start state (what
    ``run_world_calls(..., keep_starts=True)`` answers for it): the rollout service commits the
    start as the episode's ``root``, where its later stateless steps begin."""

    out: WorldOutput
    start: Any


def run_world_calls(
    world: WorldModel, calls: Sequence[WorldCall], keep_starts: bool = False
) -> list[WorldOutput | FromStart | BaseException]:
    """The engine's ``run_batch``: every init of the batch in one call, then every step in one call.
    With ``keep_starts``, a step from a fresh context answers a :class:`FromStart`."""
    results: list[WorldOutput | BaseException | None] = [None] * len(calls)
    init_idx = [i for i, call in enumerate(calls) if call.init is not None]
    if init_idx:
        inits = _checked(world.initial_states([calls[i].init for i in init_idx]), len(init_idx))  # type: ignore[misc]
        for i, out in zip(init_idx, inits, strict=True):
            results[i] = out
    steps: list[tuple[int, WorldStep]] = []
    for i, call in enumerate(calls):
        if call.step is None or isinstance(results[i], BaseException):
            continue
        start = results[i]
        step = call.step if start is None else WorldStep(start.state, call.step.action, call.step.inputs)
        steps.append((i, step))
    if steps:
        outs = _checked(world.step_batch([s for _, s in steps]), len(steps))
        for (i, _), out in zip(steps, outs, strict=True):
            start = results[i]
            fresh = keep_starts and start is not None and not isinstance(out, BaseException)
            results[i] = FromStart(out, start.state) if fresh else out  # type: ignore[union-attr]
    return [r if r is not None else RuntimeError("world call did nothing") for r in results]


def per_item(fn: Callable[[Any], WorldOutput], items: Sequence[Any]) -> list[WorldOutput | BaseException]:
    """``fn`` over ``items``, an item's exception becoming that item's answer (not the batch's)."""
    outs: list[WorldOutput | BaseException] = []
    for item in items:
        try:
            outs.append(fn(item))
        except Exception as exc:
            outs.append(exc)
    return outs


def _checked(outs: Sequence[WorldOutput | BaseException], expected: int) -> list[WorldOutput | BaseException]:
    outs = list(outs)
    if len(outs) != expected:
        raise RuntimeError(f"world returned {len(outs)} results for {expected} items")
    return outs
