"""The MuJoCo tabletop task served as a world: each state is an exact env snapshot.

One env instance does the work for every session: a step restores the session's snapshot, steps
the physics and takes a new snapshot, so sessions never see each other and a failed or repeated
step starts from exactly the committed physics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollserve.models.world import RenderSpec, WorldInit, WorldOutput, WorldSpec, WorldStep, per_item
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.layout import ACTION_NAMES, CAMERA_NAMES, CONTROL_HZ, MAX_EPISODE_STEPS, STATE_NAMES
from rollserve.sim.rendering import CameraRig
from rollserve.sim.snapshot import EnvSnapshot

OBSERVATION_BOUND = 4.0
"""Joint angles (rad) and positions (m) of this task stay well inside +-4."""


MAX_RIGS = 4
"""Camera rigs (one GL context each) kept for distinct (size, cameras) requests; older ones close."""


@dataclass(frozen=True)
class SimState:
    """A session's physics: a snapshot whose arrays are read-only, so no step can alter it, and
    what the session renders (``None``: the state vector only)."""

    snapshot: EnvSnapshot
    render: RenderSpec | None = None

    @classmethod
    def of(cls, snapshot: EnvSnapshot, render: RenderSpec | None = None) -> SimState:
        snapshot.physics.flags.writeable = False
        return cls(snapshot, render)


def frames_tensor(image: np.ndarray) -> np.ndarray:
    """One uint8 HWC frame as the float32 ``[T=1, 3, H, W]`` tensor in [0, 1] of ``video_latent``."""
    return (image.transpose(2, 0, 1)[None] / np.float32(255.0)).astype(np.float32)


def fresh_seed() -> int:
    """A seed from OS entropy, for an unseeded start: ``env.reset(seed=None)`` would go on with the
    generator of whichever session the shared env restored last, so two unseeded starts could draw
    the same layout."""
    return int(np.random.SeedSequence().entropy)


class SimWorld:
    """The simulator itself behind the rollout API; starts are seeded exactly like ``env.reset(seed)``,
    and an unseeded start gets a seed of its own from OS entropy."""

    def __init__(self) -> None:
        self.env = TabletopPickPlaceEnv(max_episode_steps=2**31 - 1)
        space = self.env.action_space
        self.spec = WorldSpec(
            name="sim",
            observation_names=STATE_NAMES,
            action_names=ACTION_NAMES,
            action_low=tuple(float(x) for x in space.low),
            action_high=tuple(float(x) for x in space.high),
            observation_low=(-OBSERVATION_BOUND,) * len(STATE_NAMES),
            observation_high=(OBSERVATION_BOUND,) * len(STATE_NAMES),
            fps=CONTROL_HZ,
            max_episode_steps=MAX_EPISODE_STEPS,
            description="MuJoCo tabletop pick-and-place (Franka Panda), exact physics",
            aliases=("tabletop",),
            cameras=CAMERA_NAMES,
        )
        self._rigs: dict[tuple[int, int, tuple[str, ...]], CameraRig] = {}

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        return per_item(self._initial, inits)

    def _initial(self, init: WorldInit) -> WorldOutput:
        if init.state is not None:
            raise ValueError("the simulator world starts from a seed, not from a state vector")
        obs, info = self.env.reset(seed=init.seed if init.seed is not None else fresh_seed())
        return self._output(SimState.of(self.env.get_snapshot(), init.render), obs["state"], info=info)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        return per_item(self._step, steps)

    def _step(self, step: WorldStep) -> WorldOutput:
        if not isinstance(step.state, SimState):
            raise TypeError(f"not a simulator state: {type(step.state).__name__}")
        self.env.set_snapshot(step.state.snapshot)
        obs, reward, terminated, _, info = self.env.step(step.action)
        state = SimState.of(self.env.get_snapshot(), step.state.render)
        return self._output(state, obs["state"], reward=float(reward), terminated=bool(terminated), info=info)

    def _output(self, state: SimState, vector: np.ndarray, **fields: object) -> WorldOutput:
        """The state vector alone, or (rendering) the first camera's frame as the tensor observation,
        every asked-for camera's image, and the state vector next to them. Renders ``self.env``'s data,
        which holds exactly ``state`` here."""
        if state.render is None:
            return WorldOutput(state=state, observation=vector, **fields)  # type: ignore[arg-type]
        images = self._rig(state.render).render(self.env.data)
        first = images[state.render.cameras[0]]
        return WorldOutput(
            state=state,
            observation=frames_tensor(first),
            vector=vector,
            images=images,
            **fields,  # type: ignore[arg-type]
        )

    def _rig(self, render: RenderSpec) -> CameraRig:
        key = (render.height, render.width, render.cameras)
        rig = self._rigs.pop(key, None)
        if rig is None:
            unknown = set(render.cameras) - set(CAMERA_NAMES)
            if unknown or not render.cameras:
                raise ValueError(f"cameras must be among {list(CAMERA_NAMES)}")
            if len(self._rigs) >= MAX_RIGS:
                oldest = next(iter(self._rigs))
                self._rigs.pop(oldest).close()
            rig = CameraRig(self.env.model, (render.height, render.width), render.cameras)
        self._rigs[key] = rig  # most recently used last
        return rig

    def close(self) -> None:
        for rig in self._rigs.values():
            rig.close()
        self._rigs.clear()
        self.env.close()
