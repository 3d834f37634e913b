"""The MuJoCo tabletop task served as a world: each state is an exact env snapshot.

One env instance does the work for every session: a step restores the session's snapshot, steps
the physics and takes a new snapshot, so sessions never see each other and a failed or repeated
step starts from exactly the committed physics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollserve.models.world import WorldInit, WorldOutput, WorldSpec, WorldStep, per_item
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.layout import ACTION_NAMES, CONTROL_HZ, MAX_EPISODE_STEPS, STATE_NAMES
from rollserve.sim.snapshot import EnvSnapshot

OBSERVATION_BOUND = 4.0
"""Joint angles (rad) and positions (m) of this task stay well inside +-4."""


@dataclass(frozen=True)
class SimState:
    """A session's physics: a snapshot whose arrays are read-only, so no step can alter it."""

    snapshot: EnvSnapshot

    @classmethod
    def of(cls, snapshot: EnvSnapshot) -> SimState:
        snapshot.physics.flags.writeable = False
        return cls(snapshot)


class SimWorld:
    """The simulator itself behind the rollout API; starts are seeded exactly like ``env.reset(seed)``."""

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
        )

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        return per_item(self._initial, inits)

    def _initial(self, init: WorldInit) -> WorldOutput:
        if init.state is not None:
            raise ValueError("the simulator world starts from a seed, not from a state vector")
        obs, info = self.env.reset(seed=init.seed)
        return WorldOutput(state=SimState.of(self.env.get_snapshot()), observation=obs["state"], info=info)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        return per_item(self._step, steps)

    def _step(self, step: WorldStep) -> WorldOutput:
        if not isinstance(step.state, SimState):
            raise TypeError(f"not a simulator state: {type(step.state).__name__}")
        self.env.set_snapshot(step.state.snapshot)
        obs, reward, terminated, _, info = self.env.step(step.action)
        return WorldOutput(
            state=SimState.of(self.env.get_snapshot()),
            observation=obs["state"],
            reward=float(reward),
            terminated=bool(terminated),
            info=info,
        )

    def close(self) -> None:
        self.env.close()
