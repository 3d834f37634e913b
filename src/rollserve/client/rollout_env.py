"""Gymnasium environments over a served world: ``RolloutEnv`` (one session) and ``RolloutVectorEnv``
(many sessions stepped with one ``batch_step`` request). The same code drives the simulator world
and a learned world; only the server behind the URL changes. Needs the ``gym`` extra.

With ``render={...}`` (cameras, size, JPEG quality; see ``RolloutClient.open_session``) the sessions
render and the observation is a ``Dict``: ``{"state": float32 (S,), "images": {camera: uint8
(H, W, 3)}}``, for training from pixels. Without it, the observation is the world's tensor.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rollserve.client.rollout_client import Observed, RolloutClient, RolloutRequestError, StepCall


def spaces_of(entry: dict[str, Any]) -> tuple[spaces.Box, spaces.Box]:
    """Observation and action spaces from a world's ``/v1/models`` entry."""
    return _box(entry["observation"]), _box(entry["action"])


def pixel_spaces_of(entry: dict[str, Any], render: dict[str, Any]) -> tuple[spaces.Dict, spaces.Box]:
    """The ``Dict`` observation space of a rendering session, and the action space."""
    cameras = entry.get("cameras")
    if not cameras:
        raise ValueError(f"world {entry['id']!r} does not render camera frames")
    size = entry.get("frame_size") or [render.get("height", 64), render.get("width", 64)]
    image = spaces.Box(0, 255, shape=(int(size[0]), int(size[1]), 3), dtype=np.uint8)
    images = spaces.Dict({name: image for name in render.get("cameras") or cameras})
    observation = spaces.Dict({"state": _box(entry["state"]), "images": images})
    return observation, _box(entry["action"])


def _pixels(observed: Observed) -> dict[str, Any]:
    if observed.state is None or observed.images is None:
        raise RolloutRequestError("bad_response", "a rendering session answered without state or images")
    return {"state": observed.state, "images": dict(observed.images)}


def _box(layout: dict[str, Any]) -> spaces.Box:
    shape = tuple(layout["shape"])
    low = np.broadcast_to(np.asarray(layout.get("low", -np.inf), dtype=np.float32), shape)
    high = np.broadcast_to(np.asarray(layout.get("high", np.inf), dtype=np.float32), shape)
    return spaces.Box(low.copy(), high.copy(), dtype=np.float32)


def _connect(
    base_url: str | None, client: RolloutClient | None, model: str | None, api_key: str | None
) -> tuple[RolloutClient, bool, dict[str, Any]]:
    """The client to use (made here if none was given: then the env owns it) and the world's entry."""
    if client is None and base_url is None:
        raise ValueError("give base_url or client")
    owned = client is None
    client = client or RolloutClient(base_url, api_key=api_key)  # type: ignore[arg-type]
    return client, owned, client.world(model)


GONE = frozenset({"session_expired", "session_closed", "session_not_found"})
"""Codes of a session the server no longer holds (idle past its TTL, closed, or lost in a restart)."""


class _Session:
    """One remote session as an episode: its id, the next step id and the steps taken."""

    def __init__(self, client: RolloutClient, model: str, render: dict[str, Any] | None = None) -> None:
        self.client, self.model, self.render = client, model, render
        self.session_id: str | None = None
        self.next_step = 0
        self.elapsed = 0

    def reset(self, seed: int | None) -> Any:
        """The first observation: the tensor, or ``{"state", "images"}`` when the session renders.

        A session the server no longer holds (say, it idled past the TTL during a long policy
        update) is replaced by a new one from the same seed, so the env can always reset.
        """
        observed = self._restart(seed) if self.session_id is not None else None
        if observed is None:
            self.session_id, observed = self.client.open_session(self.model, seed=seed, render=self.render)
        self.next_step, self.elapsed = 0, 0
        return observed.tensor if self.render is None else _pixels(observed)

    def _restart(self, seed: int | None) -> Observed | None:
        """The restarted session's first observation, or None (and no id) when the server lost it."""
        assert self.session_id is not None
        try:
            return self.client.restart(self.session_id, seed=seed)
        except RolloutRequestError as exc:
            if exc.code not in GONE:
                raise
            self.session_id = None
            return None

    def observation(self, result: Any) -> Any:
        """What the env returns of a step result."""
        if self.render is None:
            return result.observation
        return _pixels(Observed(result.observation, result.state, result.images))

    def call(self, action: np.ndarray) -> StepCall:
        assert self.session_id is not None, "reset() before step()"
        return StepCall(self.session_id, self.next_step, action)

    def advance(self) -> None:
        self.next_step += 1
        self.elapsed += 1

    def close(self) -> None:
        """Close the session; one the server no longer has (expired, closed, or unknown after a
        restart) needs no closing."""
        if self.session_id is not None:
            try:
                self.client.close_session(self.session_id)
            except RolloutRequestError as exc:
                if exc.code not in GONE:
                    raise
            self.session_id = None


class RolloutEnv(gym.Env[np.ndarray, np.ndarray]):
    """One rollout session as a gymnasium env. ``reset(seed=s)`` is reproducible; an episode is
    truncated after ``max_episode_steps`` (the world's own horizon by default). A session the server
    dropped (idle past its TTL, closed) is replaced by a new one at the next ``reset``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        base_url: str | None = None,
        *,
        client: RolloutClient | None = None,
        model: str | None = None,
        max_episode_steps: int | None = None,
        api_key: str | None = None,
        render: dict[str, Any] | None = None,
    ) -> None:
        self.client, self._owns_client, entry = _connect(base_url, client, model, api_key)
        self.model = entry["id"]
        self.observation_space: spaces.Space[Any]
        if render is None:
            self.observation_space, self.action_space = spaces_of(entry)
        else:
            self.observation_space, self.action_space = pixel_spaces_of(entry, render)
        self.max_episode_steps = max_episode_steps or int(entry.get("max_episode_steps", 200))
        self._session = _Session(self.client, self.model, render)

    @property
    def session_id(self) -> str | None:
        return self._session.session_id

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:  # continue this env's seeded sequence (and keep a retried reset idempotent)
            seed = int(self.np_random.integers(2**31))
        return self._session.reset(seed), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        call = self._session.call(np.asarray(action, dtype=np.float32))
        result = self.client.step(call.session_id, call.step_id, call.action)
        self._session.advance()
        truncated = self._session.elapsed >= self.max_episode_steps and not result.terminated
        obs = self._session.observation(result)
        return obs, result.reward, result.terminated, truncated, dict(result.info)

    def close(self) -> None:
        try:
            self._session.close()
        finally:
            if self._owns_client:
                self.client.close()
        super().close()


class RolloutVectorEnv(VectorEnv):
    """``num_envs`` sessions of one world, stepped together in one ``batch_step`` request (one batched
    model call on the server). Finished sub-envs reset on the following ``step`` (next-step autoreset).

    Seeds follow gymnasium's ``SyncVectorEnv``: ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``,
    ``reset(seed=[...])`` with its own entry, and each sub-env keeps its own generator, seeded by its
    last seeded reset, from which an unseeded reset or an autoreset draws the next seed (exactly as
    ``RolloutEnv.reset()`` does). So sub-env ``i`` equals a ``RolloutEnv`` given the same seeds, and a
    seeded run reproduces across autoresets whichever form the seed took.
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int,
        base_url: str | None = None,
        *,
        client: RolloutClient | None = None,
        model: str | None = None,
        max_episode_steps: int | None = None,
        api_key: str | None = None,
        render: dict[str, Any] | None = None,
    ) -> None:
        self.client, self._owns_client, entry = _connect(base_url, client, model, api_key)
        self.num_envs = num_envs
        self.single_observation_space: spaces.Space[Any]
        if render is None:
            self.single_observation_space, self.single_action_space = spaces_of(entry)
        else:
            self.single_observation_space, self.single_action_space = pixel_spaces_of(entry, render)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.max_episode_steps = max_episode_steps or int(entry.get("max_episode_steps", 200))
        self._sessions = [_Session(self.client, entry["id"], render) for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._rngs: list[np.random.Generator | None] = [None] * num_envs  # per sub-env, as gymnasium's

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed if isinstance(seed, int) else None)
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"a seed list needs num_envs={self.num_envs} entries, got {len(seeds)}")
        obs = [session.reset(self._seed(i, seeds[i])) for i, session in enumerate(self._sessions)]
        self._needs_reset[:] = False
        return self._batched(obs), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every sub-env (finished ones reset instead), in one ``batch_step`` request.

        When some items fail, every item that committed (or replayed) still counts: its sub-env
        advances and its episode end is recorded, then the first item's error is raised. Those
        sub-envs' transitions are lost to the caller, but the env stays usable: the next ``step``
        retries each failed sub-env's step (with the new action) and moves the others on.
        """
        actions = np.asarray(actions, dtype=np.float32)
        n = self.num_envs
        obs: list[Any] = [None] * n
        rewards, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        stepping = [i for i in range(n) if not self._needs_reset[i]]
        for i in range(n):
            if self._needs_reset[i]:
                obs[i] = self._sessions[i].reset(self._seed(i, None))
                self._needs_reset[i] = False
        results = (
            self.client.batch_step([self._sessions[i].call(actions[i]) for i in stepping]) if stepping else []
        )
        errors = [r for r in results if isinstance(r, RolloutRequestError)]
        for i, result in zip(stepping, results, strict=True):
            if isinstance(result, RolloutRequestError):
                continue
            self._sessions[i].advance()
            obs[i] = self._sessions[i].observation(result)
            rewards[i], terminated[i] = result.reward, result.terminated
            truncated[i] = self._sessions[i].elapsed >= self.max_episode_steps and not result.terminated
        self._needs_reset = terminated | truncated
        if errors:
            raise errors[0]
        return self._batched(obs), rewards, terminated, truncated, {}

    def _batched(self, obs: list[Any]) -> Any:
        """Per-env observations stacked as the batched space lays them out."""
        if not isinstance(obs[0], dict):
            return np.stack(obs).astype(np.float32, copy=False)
        cameras = obs[0]["images"]
        return {
            "state": np.stack([o["state"] for o in obs]),
            "images": {cam: np.stack([o["images"][cam] for o in obs]) for cam in cameras},
        }

    def _seed(self, i: int, seed: int | None) -> int:
        """Sub-env ``i``'s reset seed: ``seed``, which also reseeds its generator (as ``Env.reset``
        does), else the next draw of that generator (one from OS entropy if it was never seeded)."""
        rng = self._rngs[i]
        if seed is not None or rng is None:
            rng, _ = seeding.np_random(seed)
            self._rngs[i] = rng
        return seed if seed is not None else int(rng.integers(2**31))

    def close_extras(self, **kwargs: Any) -> None:
        try:
            for session in self._sessions:
                session.close()
        finally:
            if self._owns_client:
                self.client.close()


__all__ = ["RolloutEnv", "RolloutVectorEnv", "pixel_spaces_of", "spaces_of"]
