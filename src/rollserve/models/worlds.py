"""Choosing a world for ``rollserve serve --world``: ``sim``, ``learned``, ``video``, ``toy`` or
``module.path:factory``.

Also home of the toy world: a deterministic, dependency-free world with the DROID action layout,
cheap enough for tests and benchmarks of the serving layer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rollserve.models.loading import import_spec_module
from rollserve.models.world import (
    DROID_ACTION_NAMES,
    WorldInit,
    WorldModel,
    WorldOutput,
    WorldSpec,
    WorldStep,
    per_item,
)

_TOY_OBSERVATION = (*(f"joint_{i}" for i in range(7)), "gripper", *(f"target_{i}" for i in range(7)))


class ToyWorld:
    """Seven joints that move halfway to their commanded targets each step; the reward is minus the
    distance to a seeded goal, and an episode ends when the joints reach it."""

    spec = WorldSpec(
        name="toy",
        observation_names=_TOY_OBSERVATION,
        action_names=DROID_ACTION_NAMES,
        action_low=(-1.0,) * 7 + (0.0,),
        action_high=(1.0,) * 7 + (1.0,),
        observation_low=(-1.0,) * 15,
        observation_high=(1.0,) * 15,
        max_episode_steps=50,
        description="toy reaching world (tests and benchmarks)",
    )
    gain = 0.5
    success_radius = 0.05

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        return per_item(self._initial, inits)

    def _initial(self, init: WorldInit) -> WorldOutput:
        if init.state is not None:
            obs = np.asarray(init.state, dtype=np.float32).reshape(-1)
            if obs.shape != (self.spec.observation_dim,):
                raise ValueError(f"toy start state must have {self.spec.observation_dim} values")
        else:
            rng = np.random.default_rng(init.seed)
            joints = rng.uniform(-0.5, 0.5, 7)
            target = rng.uniform(-0.9, 0.9, 7)
            obs = np.concatenate([joints, [0.0], target]).astype(np.float32)
        obs = _frozen(obs)
        return WorldOutput(state=obs, observation=obs)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        if not steps:
            return []
        obs = np.stack([np.asarray(s.state, dtype=np.float32) for s in steps])
        act = np.stack([np.asarray(s.action, dtype=np.float32) for s in steps])
        low, high = np.asarray(self.spec.action_low), np.asarray(self.spec.action_high)
        act = np.clip(act, low, high)
        nxt = obs.copy()
        nxt[:, :8] = obs[:, :8] + self.gain * (act - obs[:, :8])
        dist = np.linalg.norm(nxt[:, :7] - nxt[:, 8:15], axis=1)
        done = dist < self.success_radius
        return [
            WorldOutput(state=_frozen(row), observation=row, reward=float(-d), terminated=bool(end))
            for row, d, end in zip(nxt, dist, done, strict=True)
        ]

    def close(self) -> None:
        pass


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float32, copy=True)
    array.flags.writeable = False
    return array


class WorldLoadError(ValueError):
    """The spec does not name a loadable world; the message says why (``serve`` prints it as is)."""


class NotAWorldError(WorldLoadError, TypeError):
    """The factory returned something else; also a ``TypeError``, as this error always was."""


def _sim_world() -> WorldModel:
    from rollserve.models.sim_world import SimWorld

    return SimWorld()


def _learned_world() -> WorldModel:
    from rollserve.models.learned_world import load_default

    return load_default()


def _video_world() -> WorldModel:
    from rollserve.models.video_world import load_default as load_video

    return load_video()


BUILT_IN_WORLDS: dict[str, Callable[[], WorldModel]] = {
    "toy": ToyWorld,
    "sim": _sim_world,
    "learned": _learned_world,
    "video": _video_world,
}


def world_builder(spec: str) -> Callable[[], WorldModel]:
    """What builds the world ``spec`` names, resolved but not called: a Serve deployment checks a
    spec this way before its replicas build the world on their own devices. A spec that names
    nothing loadable raises ``WorldLoadError``."""
    if spec in BUILT_IN_WORLDS:
        return BUILT_IN_WORLDS[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise WorldLoadError(f"unknown world {spec!r}: use sim, learned, video, toy or module.path:factory")
    factory = _world_factory(spec, module_name, attr)

    def build() -> WorldModel:
        world = _call_factory(factory, spec, attr)
        if not isinstance(world, WorldModel):
            raise NotAWorldError(
                f"world spec {spec!r} returned {type(world).__name__}, which is not a WorldModel"
            )
        return world

    return build


def load_world(spec: str) -> WorldModel:
    """Build the world named by ``spec``: ``sim`` (the MuJoCo task), ``learned`` (the shipped
    checkpoint), ``video`` (the shipped video world model), ``toy``, or ``module.path:factory`` (any
    callable returning a WorldModel). A spec that names nothing loadable raises ``WorldLoadError``."""
    return world_builder(spec)()


def _world_factory(spec: str, module_name: str, attr: str) -> Any:
    """The factory ``module_name:attr`` names; import problems become ``WorldLoadError``."""
    module = import_spec_module(spec, module_name, "world", WorldLoadError)
    if not hasattr(module, attr):
        raise WorldLoadError(f"world spec {spec!r}: {module_name!r} has no attribute {attr!r}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise WorldLoadError(f"world spec {spec!r}: {attr!r} is not a factory")
    return factory


def _call_factory(factory: Any, spec: str, attr: str) -> Any:
    try:
        return factory()
    except Exception as exc:
        raise WorldLoadError(
            f"world spec {spec!r}: calling {attr}() failed: {type(exc).__name__}: {exc}"
        ) from exc
