"""World-action models: a world with a policy, which picks the action itself when a step has none.

DreamZero is a "world action model": it outputs actions next to the next video, so a step with an
empty ``Action()`` succeeds. ``ActingWorld`` gives any served world that ability with any chunking
policy (the reference flow policy, a policy factory, or the policy the same server serves).

The policy sees the world's state vector: ``WorldOutput.vector`` when the world sends one next to
another tensor (a rendering ``sim`` session's camera frame, the ``video`` world's latent), else the
observation itself (``sim`` without frames, ``learned``, ``toy``). It never sees the frames the world
renders: a session renders only if its client asks, so frames would make the chosen action depend
on a view option, and a rendering session must act exactly as a plain one from the same seed. What
the step's request carries it does see, as a served policy does: the prompt as its ``task``, and
the request's images under the policy's camera names (``metadata.camera_names``).

It stays functional. An ``ActingState`` holds the wrapped world's state, the state vector the
policy sees, and the actions still to execute from the last predicted chunk. When a step brings
no action the world plays the next planned action, or, with none left, asks the policy for a chunk
whose noise is seeded from the committed state vector; so the chosen action depends only on the
committed state and the request (its prompt and images), and a retry, a replay, a fork or a second
session from the same seed chooses the same one for the same request. Each session is planned by
its own policy call, also in a batch (see ``_plan``), so how steps were batched never changes a plan.
The wrapped world still steps the batch in one call: the ``sim`` world is exact, but the
``learned`` and ``video`` worlds' batched forward passes can differ in the last bits between batch
compositions, and on them two twins stay bit-equal only when their steps were batched alike. A step
with an action applies it and drops the plan (the client took over).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rollserve.models.policy import Policy, make_processors
from rollserve.models.world import WorldInit, WorldModel, WorldOutput, WorldStep

REFERENCE_POLICY = "rollserve.models.checkpoint:load_default"
DEFAULT_EXECUTE = 8  # actions played from each chunk before the policy is asked again


@dataclass(frozen=True)
class ActingState:
    """The wrapped world's state, the state vector the policy sees, and the planned actions left."""

    inner: Any
    observation: np.ndarray  # the world's state vector (see :func:`policy_state`), flat float32
    plan: np.ndarray  # (k, action_dim) robot-space actions, k may be 0


class ActingWorld:
    """``world`` plus ``policy``: a step whose action is ``None`` gets the policy's action.

    The policy must take the world's state vector (``spec.state_layout``) as its state and return
    actions in the world's action layout; ``execute`` actions of each chunk are played before
    predicting again. It gets the planning step's prompt (``task``) and the images that step's
    request carries under its camera names, never the frames the world renders (see the module
    docstring).
    Its processors must be pure functions (the reference policy's normalise and unnormalise).
    """

    def __init__(self, world: WorldModel, policy: Policy, *, execute: int = DEFAULT_EXECUTE) -> None:
        meta = policy.metadata
        spec = world.spec
        if meta.state_dim != len(spec.state_layout):
            raise ValueError(
                f"policy {meta.name!r} takes a {meta.state_dim}-value state, but world {spec.name!r} "
                f"has a {len(spec.state_layout)}-value state vector"
            )
        if meta.action_dim != spec.action_dim:
            raise ValueError(
                f"policy {meta.name!r} outputs {meta.action_dim} actions, "
                f"world {spec.name!r} takes {spec.action_dim}"
            )
        if not 1 <= execute <= meta.chunk_size:
            raise ValueError(f"execute must be in [1, {meta.chunk_size}], got {execute}")
        self.world = world
        self.policy = policy
        self.execute = execute
        self._processors = make_processors(policy)
        note = f"acts with policy {meta.name!r} when a step has no action"
        self.spec = replace(
            spec, acts=True, description=f"{spec.description}; {note}" if spec.description else note
        )

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        return [
            self._wrap(out, np.empty((0, self.spec.action_dim), np.float32))
            for out in self.world.initial_states(inits)
        ]

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        """Plan where needed (one policy call per item, see :meth:`_plan`), then one batched step of the
        wrapped world."""
        empty = np.empty((0, self.spec.action_dim), np.float32)
        # per item: (action to apply, plan left afterwards), or the error that stops the item
        chosen: list[tuple[np.ndarray, np.ndarray] | BaseException] = []
        need: list[int] = []
        for i, step in enumerate(steps):
            state = step.state
            if not isinstance(state, ActingState):
                chosen.append(TypeError(f"an acting world steps ActingState, not {type(state).__name__}"))
            elif step.action is not None:  # the client acts: apply its action, drop the plan
                chosen.append((np.asarray(step.action, np.float32), empty))
            elif len(state.plan):
                chosen.append((state.plan[0], state.plan[1:]))
            else:
                chosen.append(RuntimeError("not planned"))  # replaced once the policy planned
                need.append(i)
        for i, plan in zip(need, self._plan([steps[i] for i in need]), strict=True):
            chosen[i] = plan if isinstance(plan, BaseException) else (plan[0], plan[1:])
        results: list[WorldOutput | BaseException] = []
        runnable: list[tuple[int, np.ndarray, np.ndarray]] = []
        for i, item in enumerate(chosen):
            results.append(item if isinstance(item, BaseException) else RuntimeError("not stepped"))
            if not isinstance(item, BaseException):
                runnable.append((i, *item))
        inner = [WorldStep(steps[i].state.inner, action, steps[i].inputs) for i, action, _ in runnable]
        for (i, action, rest), out in zip(
            runnable, self.world.step_batch(inner) if inner else [], strict=True
        ):
            wrapped = self._wrap(out, rest)
            if isinstance(wrapped, WorldOutput) and steps[i].action is None:
                wrapped = replace(wrapped, action=action)
            results[i] = wrapped
        return results

    def close(self) -> None:
        self.world.close()

    # -- helpers -----------------------------------------------------------------------------------
    def _plan(self, steps: list[WorldStep]) -> list[np.ndarray | BaseException]:
        """The next ``execute`` robot-space actions for each step, or the error that stopped it.

        One policy call per step, never one batched call: a batched forward pass rounds
        differently with the batch's size and rows (the reference policy by ~1e-7), and the next
        plan's noise seed hashes the exact state bits, so a twin session stepped in another batch
        would drift away. Planned alone, the action depends only on the committed state and its request.
        """
        return [self._plan_one(step.state.observation, step.inputs) for step in steps]

    def _plan_one(self, observation: np.ndarray, inputs: dict[str, Any]) -> np.ndarray | BaseException:
        """One state vector's plan; an error is returned, not raised, so it fails only its own item."""
        try:
            batch = self._processors.pre(self._policy_observation(observation, inputs))
            batch["seed"] = seed_of(observation)  # from the state alone, never the prompt or images
            chunk = self.policy.predict_action_chunk(batch)
            robot = np.asarray(self._processors.post(np.asarray(chunk)), dtype=np.float32)[: self.execute]
            usable = robot.ndim == 2 and len(robot) and robot.shape[1] == self.spec.action_dim
            if not usable or not np.all(np.isfinite(robot)):  # an empty chunk would fail the batch
                raise ValueError(f"policy returned an unusable chunk of shape {robot.shape}")
            return _frozen(robot)
        except Exception as exc:
            return exc

    def _policy_observation(self, observation: np.ndarray, inputs: dict[str, Any]) -> dict[str, Any]:
        """What a policy's processors take (``state``, ``images``, ``task``): the state vector, and of
        the step's request (folded by the rollout service) its prompt and its camera images."""
        images = {name: inputs[name] for name in self.policy.metadata.camera_names if name in inputs}
        state = np.array(observation, dtype=np.float32)
        return {"state": state, "images": images, "task": str(inputs.get("prompt") or "")}

    @staticmethod
    def _wrap(out: WorldOutput | BaseException, plan: np.ndarray) -> WorldOutput | BaseException:
        if isinstance(out, BaseException):
            return out
        return replace(out, state=ActingState(out.state, policy_state(out), _frozen(plan)))


def policy_state(out: WorldOutput) -> np.ndarray:
    """The state vector the policy plans from: ``vector`` when the world sends one (its observation
    is then a frame or a latent), else the observation, which is the state vector itself."""
    state = out.vector if out.vector is not None else out.observation
    return _frozen(np.asarray(state, dtype=np.float32).reshape(-1))


def seed_of(observation: np.ndarray) -> int:
    """The policy's noise seed for a committed observation: the same state always plans the same."""
    digest = hashlib.sha256(np.ascontiguousarray(observation, dtype="<f4").tobytes()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float32, copy=True)
    array.flags.writeable = False
    return array
