"""Choosing a world for ``rollserve serve --world``: ``sim``, ``learned``, ``video``, ``toy`` or
``module.path:factory``.

Also home of the toy world: a deterministic, dependency-free world with the DROID action layout,
cheap enough for tests and benchmarks of the serving layer itself.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from functools import partial
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
            sent = np.asarray(init.state, dtype=np.float64).reshape(-1)  # as the client sent it
            if sent.shape != (self.spec.observation_dim,):
                raise ValueError(f"toy start state must have {self.spec.observation_dim} values")
            self.spec.check_start_state(sent)  # before rounding: a value just past a bound is refused
            obs = sent.astype(np.float32)
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


def _learned_world(path: str | None = None) -> WorldModel:
    from rollserve.models.learned_world import load_default

    return load_default(path)


def _video_world(path: str | None = None) -> WorldModel:
    from rollserve.models.video_world import load_default as load_video

    return load_video(path)


BUILT_IN_WORLDS: dict[str, Callable[..., WorldModel]] = {
    "toy": ToyWorld,
    "sim": _sim_world,
    "learned": _learned_world,
    "video": _video_world,
}
# the keyword arguments (``--world-arg``) each built-in world takes: a retrained checkpoint's folder
BUILT_IN_WORLD_ARGS: dict[str, tuple[str, ...]] = {"learned": ("path",), "video": ("path",)}


# The optional modules each built-in world imports (some only at its first start), and the extra of
# pyproject.toml that installs each. The documented GPU-server install (``rollserve[server]``) has
# torch but not the simulator, which the video world renders its start frames with.
WORLD_MODULES: dict[str, tuple[str, ...]] = {
    "sim": ("mujoco", "gymnasium", "gymnasium_robotics"),
    "learned": ("torch",),
    "video": ("torch", "mujoco", "gymnasium", "gymnasium_robotics"),
}
MODULE_EXTRAS: dict[str, str] = {
    "torch": "server",
    "mujoco": "sim",
    "gymnasium": "sim",
    "gymnasium_robotics": "sim",
}


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (mujoco takes ~0.3 s)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # blocked, or in sys.modules without a spec
        return False


def check_world_dependencies(spec: str) -> None:
    """Refuse a built-in world whose optional dependencies are not installed, naming the extra to
    install, before anything is served: the video world would otherwise start serving and fail
    every create. Specs ``module.path:factory`` are checked when they are imported."""
    missing = [module for module in WORLD_MODULES.get(spec, ()) if not _installed(module)]
    if missing:
        extras = ",".join(dict.fromkeys(MODULE_EXTRAS[module] for module in missing))
        raise WorldLoadError(
            f"world {spec!r} needs {', '.join(missing)}, not installed here: "
            f'pip install "rollserve[{extras}]" (or "rollserve[all]")'
        )


def world_builder(spec: str, **kwargs: Any) -> Callable[[], WorldModel]:
    """What builds the world ``spec`` names with ``kwargs`` (``--world-arg``), resolved but not
    called: a Serve deployment checks a spec this way before its replicas build the world on their
    own devices. A spec that names nothing loadable raises ``WorldLoadError``."""
    if spec in BUILT_IN_WORLDS:
        return _built_in_builder(spec, kwargs)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise WorldLoadError(f"unknown world {spec!r}: use sim, learned, video, toy or module.path:factory")
    factory = _world_factory(spec, module_name, attr)

    def build() -> WorldModel:
        world = _call_factory(partial(factory, **kwargs), spec, attr)
        if not isinstance(world, WorldModel):
            raise NotAWorldError(
                f"world spec {spec!r} returned {type(world).__name__}, which is not a WorldModel"
            )
        return world

    return build


def _built_in_builder(spec: str, kwargs: dict[str, Any]) -> Callable[[], WorldModel]:
    """A built-in world's builder; arguments it does not take are refused before anything loads,
    and a failed load with arguments (a folder that is no checkpoint) is a ``WorldLoadError``."""
    known = BUILT_IN_WORLD_ARGS.get(spec, ())
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        takes = f"it takes {', '.join(known)}" if known else "it takes none"
        raise WorldLoadError(f"world {spec!r} takes no argument {unknown[0]!r} (--world-arg); {takes}")
    if not kwargs:
        return BUILT_IN_WORLDS[spec]
    return partial(_call_factory, partial(BUILT_IN_WORLDS[spec], **kwargs), spec, "load_default")


def load_world(spec: str, **kwargs: Any) -> WorldModel:
    """Build the world named by ``spec``: ``sim`` (the MuJoCo task), ``learned`` (the shipped
    checkpoint, or the one at ``path``), ``video`` (the shipped video world model, or ``path``),
    ``toy``, or ``module.path:factory`` (any callable returning a WorldModel, called with
    ``kwargs``). A spec that names nothing loadable raises ``WorldLoadError``."""
    return world_builder(spec, **kwargs)()


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
