"""Gymnasium environments over a served world: ``RolloutEnv`` (one session) and ``RolloutVectorEnv``
(many sessions stepped with one ``batch_step`` request). The same code drives the simulator world
and a learned world; only the server behind the URL changes. Needs the ``gym`` extra.

With ``render={...}`` (cameras, size, JPEG quality; see ``RolloutClient.open_session``) the sessions
render and the observation is a ``Dict``: ``{"state": float32 (S,), "images": {camera: uint8
(H, W, 3)}}``, for training from pixels. Without it, the observation is the world's tensor.
``render_mode="rgb_array"`` (only with ``render``) makes ``render()`` return the first camera's
frame of the last observation, so gymnasium's ``RecordVideo`` can record episodes (it needs moviepy:
the ``gym-video`` extra).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rollserve.client.rollout_client import (
    Observed,
    RolloutClient,
    RolloutRequestError,
    StepCall,
    StepResult,
    check_action_size,
)

T = TypeVar("T")


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


RGB_ARRAY = "rgb_array"


def check_render_mode(render: dict[str, Any] | None, render_mode: str | None) -> None:
    """Refuse a render mode the env cannot honour: only a rendering session has frames to show."""
    if render_mode not in (None, RGB_ARRAY):
        raise ValueError(f"render_mode must be None or {RGB_ARRAY!r}, got {render_mode!r}")
    if render is None and render_mode is not None:
        raise ValueError(f"render_mode={render_mode!r} needs a rendering session: pass render={{...}}")


def render_metadata(
    entry: dict[str, Any], render: dict[str, Any] | None, render_mode: str | None
) -> tuple[dict[str, Any], str | None]:
    """An env's ``metadata`` render keys and the camera ``render()`` shows (None: it shows none).

    The fps is the world's control rate from its ``/v1/models`` entry, when it publishes one.
    """
    if render is None:
        return {"render_modes": []}, None
    metadata: dict[str, Any] = {"render_modes": [RGB_ARRAY]}
    if entry.get("fps"):
        metadata["render_fps"] = float(entry["fps"])
    camera = (render.get("cameras") or entry["cameras"])[0] if render_mode else None
    return metadata, camera


def _frame(observation: Any, camera: str) -> np.ndarray:
    """``camera``'s frame of an observation, copied: the caller may change the observation in place."""
    if observation is None:
        raise gym.error.ResetNeeded("call reset() before render()")
    return np.array(observation["images"][camera], dtype=np.uint8)


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
    """One remote session as an episode: its id, the next step id and the steps taken.

    ``pending`` is a step that was sent but never answered (its reply lost past the client's
    retries): the server may have applied it. The env resends it unchanged before the session's
    next step, so the trajectory holds it exactly once and the step ids stay in line.
    """

    def __init__(self, client: RolloutClient, model: str, render: dict[str, Any] | None = None) -> None:
        self.client, self.model, self.render = client, model, render
        self.session_id: str | None = None
        self.next_step = 0
        self.elapsed = 0
        self.pending: StepCall | None = None
        self.last: Any = None  # the last observation returned, reported again if the session is lost

    def reset(self, seed: int | None) -> Any:
        """The first observation: the tensor, or ``{"state", "images"}`` when the session renders.

        A session the server no longer holds (say, it idled past the TTL during a long policy
        update) is replaced by a new one from the same seed, so the env can always reset. A pending
        step belonged to the old episode: it is dropped.
        """
        observed = self._restart(seed) if self.session_id is not None else None
        if observed is None:
            self.session_id, observed = self.client.open_session(self.model, seed=seed, render=self.render)
        self.next_step, self.elapsed, self.pending = 0, 0, None
        self.last = observed.tensor if self.render is None else _pixels(observed)
        return self.last

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
        """The next step of this session. A malformed action is refused here, before the call can
        become the pending step (which every later step would resend, and fail on, until a reset)."""
        assert self.session_id is not None, "reset() before step()"
        check_action_size(np.size(action))
        return StepCall(self.session_id, self.next_step, action)

    def send(self, call: StepCall) -> StepResult:
        """Step once; the call stays pending unless the server answers."""
        return _sent([self], [call], lambda: self.client.step(call.session_id, call.step_id, call.action))

    def ends(self, result: StepResult, max_episode_steps: int) -> bool:
        """Whether a step's result, not yet committed, ends the episode."""
        return result.terminated or self.elapsed + 1 >= max_episode_steps

    def commit(self, result: StepResult) -> Any:
        """Count a committed step; its observation as the env returns it."""
        self.next_step += 1
        self.elapsed += 1
        self.last = self.observation(result)
        return self.last

    def close(self) -> None:
        """Close the session; one the server no longer has (expired, closed, or unknown after a
        restart) needs no closing."""
        self.pending = None
        if self.session_id is not None:
            try:
                self.client.close_session(self.session_id)
            except RolloutRequestError as exc:
                if exc.code not in GONE:
                    raise
            self.session_id = None


def _sent(sessions: list[_Session], calls: list[StepCall], send: Callable[[], T]) -> T:
    """``send()``'s answer. Until the server answers (with results, or a refusal: a refused step
    commits nothing) each call is its session's pending step, so a lost reply leaves it pending."""
    for session, call in zip(sessions, calls, strict=True):
        session.pending = call
    try:
        answer = send()
    except RolloutRequestError:
        _answered(sessions)
        raise
    _answered(sessions)
    return answer


def _answered(sessions: list[_Session]) -> None:
    for session in sessions:
        session.pending = None


LOST = "session_lost"
"""Info key of a sub-env whose session the server no longer holds: the error code (truncated)."""
SETTLED = "settled_step"
"""Info key of a step that reports the settled lost step's episode end: that step's id."""
LATE = "reported_late"
"""Info key (True) of a ``RolloutVectorEnv`` sub-env reporting an episode end, or an autoreset's
first observation, that a ``step`` which raised had recorded: this step applied no action to it."""


class RolloutEnv(gym.Env[np.ndarray, np.ndarray]):
    """One rollout session as a gymnasium env. ``reset(seed=s)`` is reproducible; an episode is
    truncated after ``max_episode_steps`` (the world's own horizon by default).

    A session the server dropped (idle past its TTL, closed) truncates the episode: ``step`` returns
    the last observation, reward 0, ``truncated=True`` and ``info["session_lost"]`` (the code), and
    the next ``reset`` opens a new session. A ``step`` whose reply was lost past the client's
    retries raises, but the server may have applied it: the next ``step`` first resends it unchanged
    (applied at most once), then applies its own action. If that lost step ended the episode, the
    next ``step`` applies nothing and returns its outcome, with ``info["settled_step"]``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [RGB_ARRAY]}

    def __init__(
        self,
        base_url: str | None = None,
        *,
        client: RolloutClient | None = None,
        model: str | None = None,
        max_episode_steps: int | None = None,
        api_key: str | None = None,
        render: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_render_mode(render, render_mode)  # before a client is made
        self.client, self._owns_client, entry = _connect(base_url, client, model, api_key)
        self.model = entry["id"]
        self.metadata, self._camera = render_metadata(entry, render, render_mode)  # type: ignore[misc]
        self.render_mode = render_mode
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
        session = self._session
        try:
            settled = self._settle()
            if settled is not None:
                return self._outcome(settled, {SETTLED: settled.step_id})
            result = session.send(session.call(np.asarray(action, dtype=np.float32)))
        except RolloutRequestError as exc:
            if exc.code not in GONE:
                raise
            return session.last, 0.0, False, True, {LOST: exc.code}
        return self._outcome(result, {})

    def _settle(self) -> StepResult | None:
        """Resend the pending (lost) step unchanged and count it; its result if it ended the
        episode (then this step applies nothing), else None."""
        session = self._session
        if session.pending is None:
            return None
        result = session.send(session.pending)
        if session.ends(result, self.max_episode_steps):
            return result
        session.commit(result)
        return None

    def _outcome(
        self, result: StepResult, extra: dict[str, Any]
    ) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Commit a step's result and return it as gymnasium's 5-tuple."""
        obs = self._session.commit(result)
        truncated = self._session.elapsed >= self.max_episode_steps and not result.terminated
        return obs, result.reward, result.terminated, truncated, {**result.info, **extra}

    def render(self) -> np.ndarray | None:
        """The last observation's first camera frame (uint8 H x W x 3) with ``render_mode="rgb_array"``;
        None without a render mode (gymnasium's convention)."""
        if self._camera is None:
            return None
        return _frame(self._session.last, self._camera)

    def close(self) -> None:
        try:
            self._session.close()
        finally:
            if self._owns_client:
                self.client.close()
        super().close()


@dataclass
class _Outcome:
    """One vector step's results, filled in sub-env by sub-env."""

    obs: list[Any]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[str, Any] = field(default_factory=dict)
    errors: list[RolloutRequestError] = field(default_factory=list)
    single_infos: list[dict[str, Any]] = field(default_factory=list)  # each sub-env's, unbatched
    reset: list[int] = field(default_factory=list)  # the sub-envs whose obs is a new episode's first

    @classmethod
    def empty(cls, n: int) -> _Outcome:
        empty = cls([None] * n, np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        empty.single_infos = [{} for _ in range(n)]
        return empty

    def ended(self) -> list[int]:
        """The sub-envs whose episode ended in this step."""
        return [int(i) for i in np.flatnonzero(self.terminated | self.truncated)]


@dataclass(frozen=True)
class _Held:
    """A sub-env's part of a ``step`` that raised after recording it (an episode end, or an
    autoreset's first observation): the next ``step`` reports it."""

    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class RolloutVectorEnv(VectorEnv):
    """``num_envs`` sessions of one world, stepped together in one ``batch_step`` request (one batched
    model call on the server). Finished sub-envs reset on the following ``step`` (next-step autoreset).

    Seeds follow gymnasium's ``SyncVectorEnv``: ``reset(seed=s)`` seeds sub-env ``i`` with ``s + i``,
    ``reset(seed=[...])`` with its own entry, and each sub-env keeps its own generator, seeded by its
    last seeded reset, from which an unseeded reset or an autoreset draws the next seed (exactly as
    ``RolloutEnv.reset()`` does). So sub-env ``i`` equals a ``RolloutEnv`` given the same seeds, and a
    seeded run reproduces across autoresets whichever form the seed took.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "render_modes": [RGB_ARRAY],
    }

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
        render_mode: str | None = None,
    ) -> None:
        check_render_mode(render, render_mode)  # before a client is made
        self.client, self._owns_client, entry = _connect(base_url, client, model, api_key)
        self.num_envs = num_envs
        rendering, self._camera = render_metadata(entry, render, render_mode)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, **rendering}  # type: ignore[misc]
        self.render_mode = render_mode
        self.single_observation_space: spaces.Space[Any]
        if render is None:
            self.single_observation_space, self.single_action_space = spaces_of(entry)
        else:
            self.single_observation_space, self.single_action_space = pixel_spaces_of(entry, render)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.max_episode_steps = max_episode_steps or int(entry.get("max_episode_steps", 200))
        self._sessions = [_Session(self.client, entry["id"], render) for _ in range(num_envs)]
        self._render = render  # sessions without frames step as columns (batch_step_columns)
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._rngs: list[np.random.Generator | None] = [None] * num_envs  # per sub-env, as gymnasium's
        self._held: dict[int, _Held] = {}  # ends and autoresets of a step that raised, for the next

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
        self._held = {}  # ends of the episodes this reset replaces
        obs = [session.reset(self._seed(i, seeds[i])) for i, session in enumerate(self._sessions)]
        self._needs_reset[:] = False
        return self._batched(obs), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every sub-env (finished ones reset instead), in one ``batch_step`` request.

        When some items fail, every item that committed (or replayed) still counts: its sub-env
        advances, then the first item's error is raised. Those sub-envs' transitions are lost to the
        caller, but the env stays usable: the next ``step`` retries each failed sub-env's step (with
        the new action) and moves the others on. No episode end is lost, though: a sub-env whose
        episode ended in a ``step`` that raised (for whatever reason) applies no action on the next
        ``step`` that returns; it reports that end there (its observation, reward, flags and info,
        with ``info["reported_late"]``) and autoresets on the following ``step``, as if that end had
        come one step late. Nor is a new episode's first observation: a sub-env that autoreset in a
        ``step`` that raised applies no action on the next ``step`` that returns either; it reports
        that observation there (reward 0, no end, ``info["reported_late"]``) and its new episode
        steps on the following one. A ``reset`` drops what is held (its episodes are new). A sub-env
        whose session the server no longer holds is no error: it is truncated (last observation,
        reward 0, ``info["session_lost"]``) and resets, with a new session, on the next ``step``.

        A ``step`` whose reply was lost past the client's retries raises, but the server may have
        applied it: the next ``step`` first resends those items unchanged (one more ``batch_step``;
        each applies at most once), then sends the new actions. A sub-env whose episode that lost
        step ended applies no new action: it reports the lost step's outcome, with
        ``info["settled_step"]``, and autoresets on the following ``step``.
        """
        actions = np.asarray(actions, dtype=np.float32)
        out = _Outcome.empty(self.num_envs)
        try:
            stepping = self._settle(self._autoreset(self._report_held(out), out), out)
            calls = [self._sessions[i].call(actions[i]) for i in stepping]
            for i, result in zip(stepping, self._send(stepping, calls), strict=True):
                self._record(i, result, out)
            if out.errors:
                raise out.errors[0]
        except BaseException:
            self._hold(out)
            raise
        return self._batched(out.obs), out.rewards, out.terminated, out.truncated, out.infos

    def _report_held(self, out: _Outcome) -> set[int]:
        """Put the episode ends and autoresets held from a ``step`` that raised into this one's
        outcome; those sub-envs, which neither reset nor step now."""
        held, self._held = self._held, {}
        for i, part in held.items():
            out.obs[i], out.rewards[i] = part.obs, part.reward
            out.terminated[i], out.truncated[i] = part.terminated, part.truncated
            if not (part.terminated or part.truncated):
                out.reset.append(i)  # a first observation: held again if this step raises too
            self._info(out, i, part.info)
        return set(held)

    def _hold(self, out: _Outcome) -> None:
        """Keep the episode ends and autoresets of a ``step`` about to raise, for the next ``step``
        to report: their sub-envs already moved on (an ended one would otherwise autoreset unseen,
        a reset one step its new episode before its first observation was seen)."""
        for i in [*out.ended(), *out.reset]:
            info = {**out.single_infos[i], LATE: True}
            flags = bool(out.terminated[i]), bool(out.truncated[i])
            self._held[i] = _Held(out.obs[i], float(out.rewards[i]), *flags, info)

    def _info(self, out: _Outcome, i: int, info: dict[str, Any]) -> None:
        """Add sub-env ``i``'s info: batched (gymnasium's vector infos) and as its own."""
        self._add_info(out.infos, info, i)
        out.single_infos[i].update(info)

    def _autoreset(self, reporting: set[int], out: _Outcome) -> list[int]:
        """Reset the sub-envs whose episode ended (their observation is the new episode's first);
        the others, which step, but for those ``reporting`` a held episode end (they do neither)."""
        stepping = []
        for i, session in enumerate(self._sessions):
            if i in reporting:
                continue
            if self._needs_reset[i]:
                out.obs[i] = session.reset(self._seed(i, None))
                self._needs_reset[i] = False
                out.reset.append(i)
            else:
                stepping.append(i)
        return stepping

    def _settle(self, stepping: list[int], out: _Outcome) -> list[int]:
        """Resend the pending (lost) steps unchanged, in one batch, and count them; the sub-envs
        that step on (those whose lost step ended the episode, or failed, report that instead)."""
        pending = {i: call for i in stepping if (call := self._sessions[i].pending) is not None}
        settling, reported = list(pending), set()
        for i, result in zip(settling, self._send(settling, list(pending.values())), strict=True):
            session = self._sessions[i]
            if isinstance(result, StepResult) and not session.ends(result, self.max_episode_steps):
                session.commit(result)
                continue
            self._record(i, result, out)
            if isinstance(result, StepResult):
                self._info(out, i, {SETTLED: result.step_id})
            reported.add(i)
        return [i for i in stepping if i not in reported]

    def _send(self, indices: list[int], calls: list[StepCall]) -> list[StepResult | RolloutRequestError]:
        """One ``batch_step`` of sub-envs ``indices`` (none when empty); the calls stay pending
        until the server answers."""
        if not calls:
            return []
        sessions = [self._sessions[i] for i in indices]
        if self._render is None:  # every call is a contextual step of 8 values (``_Session.call``)
            ids, step_ids = [c.session_id for c in calls], [c.step_id for c in calls]
            actions = np.stack([np.asarray(c.action, dtype=np.float32).reshape(-1) for c in calls])
            return _sent(
                sessions, calls, lambda: self.client.batch_step_columns(ids, step_ids, actions).results()
            )
        return _sent(sessions, calls, lambda: self.client.batch_step(calls))

    def _record(self, i: int, result: StepResult | RolloutRequestError, out: _Outcome) -> None:
        """Sub-env ``i``'s part of this step: a committed step, a lost session (truncated, reset on
        the next step), or an error (raised once every sub-env is recorded)."""
        session = self._sessions[i]
        if isinstance(result, RolloutRequestError):
            if result.code not in GONE:
                out.errors.append(result)
                return
            out.obs[i], out.truncated[i] = session.last, True
            self._info(out, i, {LOST: result.code})
        else:
            out.obs[i] = session.commit(result)
            out.rewards[i], out.terminated[i] = result.reward, result.terminated
            out.truncated[i] = session.elapsed >= self.max_episode_steps and not result.terminated
            if result.info:  # the world's own (``success``), batched as gymnasium's vector infos
                self._info(out, i, dict(result.info))
        self._needs_reset[i] = out.terminated[i] or out.truncated[i]

    def _batched(self, obs: list[Any]) -> Any:
        """Per-env observations stacked as the batched space lays them out."""
        if not isinstance(obs[0], dict):
            return np.stack(obs).astype(np.float32, copy=False)
        cameras = obs[0]["images"]
        return {
            "state": np.stack([o["state"] for o in obs]),
            "images": {cam: np.stack([o["images"][cam] for o in obs]) for cam in cameras},
        }

    def render(self) -> tuple[np.ndarray, ...] | None:
        """Each sub-env's last observation's first camera frame, as ``SyncVectorEnv`` gives its
        envs' ``render()``; None without a render mode."""
        if self._camera is None:
            return None
        return tuple(_frame(session.last, self._camera) for session in self._sessions)

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
