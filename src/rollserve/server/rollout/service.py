"""The rules of rollout sessions: who may step, what commits, what a retry gets. No HTTP here.

A contextual step must carry ``step_id == committed_step_id + 1``. It runs on the engine thread
from the session's committed state; only when the world answered *and* its output converted to a
float32 tensor does the session move (state, ``committed_step_id``, ``context_length``, the stored
result) in one synchronous assignment. Anything that fails before leaves the session exactly as
committed, because worlds are functional (see ``models.world``). A duplicate of the last committed
step gets its stored result back without running the model.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import logging
import math
import time
import weakref
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from rollserve.engine import BatchingWorker, Completed, EngineClosed
from rollserve.models.world import (
    FromStart,
    RenderSpec,
    WorldCall,
    WorldInit,
    WorldModel,
    WorldOutput,
    WorldSpec,
    WorldStep,
    run_world_calls,
)
from rollserve.server.metrics import METRICS
from rollserve.server.rollout.protocol import (
    FLOAT32_MAX,
    MAX_VECTOR,
    Action,
    BatchStepColumnsRequest,
    BatchStepColumnsResponse,
    BatchStepRequest,
    BatchStepResponse,
    BatchStepResult,
    CloseSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    ErrorObject,
    ForkSessionRequest,
    Observation,
    RenderRequest,
    ResetSessionRequest,
    ResetSessionResponse,
    RolloutStepRequest,
    RolloutStepResponse,
    SessionMetadata,
    SessionStatusResponse,
    built,
)
from rollserve.server.rollout.store import (
    Commit,
    Frames,
    RolloutError,
    RolloutSession,
    RolloutStore,
    SessionStore,
    StepRecord,
    closed_error,
    new_session_id,
)
from rollserve.wire.images import check_image, encode_image, image_to_json

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rollserve.server.settings import ServerSettings

__all__ = ["RolloutError", "RolloutService", "fold_action_into_observation"]

logger = logging.getLogger(__name__)

JOINT_KEY = "observation/joint_position"
GRIPPER_KEY = "observation/gripper_position"
START_STATE_KEY = "observation/state"
PASS_THROUGH_KEYS = frozenset({"seed", "embodiment_name"})
VECTOR_KEYS = frozenset({JOINT_KEY, GRIPPER_KEY, START_STATE_KEY})
_MESSAGE_LIMIT = 300
# Metric children looked up once, not per step (each ``labels()`` call hashes and locks), as the
# policy routes do. Model time and batch size are the engine's to record (once per model call).
_QUEUE_WAIT = METRICS.queue_wait.labels(kind="world")
_ACTIVE_SESSIONS = METRICS.active_sessions.labels(kind="rollout")


def fold_action_into_observation(
    observation: Observation, action: Action | None, *, state_fallback: bool = True
) -> dict[str, Any]:
    """The world's input in DROID keys: the executed action becomes ``observation/joint_position``
    (7) and ``observation/gripper_position`` (1); without one, ``observation.state`` supplies them
    (unless ``state_fallback`` is off: a world-action model picks its own). Raises ``ValueError``
    on a wrong count."""
    folded: dict[str, Any] = {"prompt": observation.prompt, **(observation.images or {})}
    for key, value in observation.extra.items():
        if key in VECTOR_KEYS:  # numbers the world reads: checked like the action
            folded[key] = _finite_array(value, f"observation.extra[{key!r}]")
        elif key.startswith("observation/") or key in PASS_THROUGH_KEYS:
            folded[key] = value
    joints = action.joint_positions if action is not None else None
    gripper = action.gripper_position if action is not None else None
    state = (observation.state or []) if state_fallback else []
    if joints is None and state:
        joints = state[:7]
        if gripper is None and len(state) > 7:
            gripper = state[7:8]
    if joints is not None:
        folded[JOINT_KEY] = _exactly(joints, 7, "joint_positions")
    if gripper is not None:
        folded[GRIPPER_KEY] = _exactly(gripper, 1, "gripper_position")
    return folded


def _exactly(values: Any, count: int, name: str) -> np.ndarray:
    array = _finite_array(values, name)
    if array.size != count:
        raise ValueError(f"DROID {name} must have {count} value{'s' if count > 1 else ''}, got {array.size}")
    return array


def _finite_array(values: Any, name: str) -> np.ndarray:
    """Numbers that stay finite as float32 (what the worlds compute in), flattened to float64."""
    if type(values) is float:  # a validated scalar (gripper_position): the common case, checked in Python
        values = [values]
    if type(values) is list and len(values) <= MAX_VECTOR and all(type(v) is float for v in values):
        if not all(-FLOAT32_MAX <= v <= FLOAT32_MAX for v in values):  # NaN compares False too
            raise ValueError(f"{name} must be finite and within float32 range")
        return np.array(values, dtype=np.float64)
    if isinstance(values, np.ndarray) and values.size > MAX_VECTOR:
        raise ValueError(f"{name} holds more than {MAX_VECTOR} values")
    if _holds_bool(values):  # numpy would read True as 1.0, as JSON's true is no number
        raise ValueError(f"{name} must hold numbers, not booleans")
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size > MAX_VECTOR:
        raise ValueError(f"{name} holds more than {MAX_VECTOR} values")
    if not (np.abs(array) <= FLOAT32_MAX).all():  # NaN compares False too
        raise ValueError(f"{name} must be finite and within float32 range")
    return array


def _holds_bool(values: Any) -> bool:
    """A boolean anywhere in ``values`` (a scalar, a bool array, nested lists; without recursion)."""
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, bool | np.bool_) or (isinstance(value, np.ndarray) and value.dtype == np.bool_):
            return True
        if isinstance(value, list | tuple):
            stack.extend(value)
    return False


def as_float32(value: Any) -> np.ndarray:
    """A world output as a C-contiguous little-endian float32 array (tensors are moved to the CPU).

    An array that already is one is returned as it is, checked only for finiteness (the common case:
    a batch of 32 items calls this 64 times, so it avoids the attribute probes a tensor needs)."""
    if not isinstance(value, np.ndarray):
        for method in ("detach", "float", "cpu", "numpy"):
            if callable(getattr(value, method, None)):
                value = getattr(value, method)()
    array = np.ascontiguousarray(value, dtype="<f4")
    if np.count_nonzero(np.isfinite(array)) != array.size:  # ~1 µs less than .all() on small arrays
        raise ValueError("world output is not finite")
    return array


def encode_tensor_field(array: np.ndarray, *, raw: bool) -> dict[str, Any]:
    """``next_observation``'s tensor: base64 of the raw float32 bytes (JSON) or the array itself (msgpack)."""
    return {
        "video_latent": array if raw else base64.b64encode(array.tobytes()).decode("ascii"),
        "shape": list(array.shape),
        "dtype": "float32",
        "encoding": "tensor" if raw else "base64_raw_tensor",
    }


def _started_from(value: Any) -> tuple[Any, Any]:
    """A step's output, and the start state it was made from when that was a fresh context."""
    if isinstance(value, FromStart):
        return value.out, value.start
    return value, None


def _sessions_of(service: weakref.ref[RolloutService]) -> float:
    """The open-sessions gauge as a scrape reads it: those of the newest service (0 once it is gone)."""
    alive = service()
    return 0.0 if alive is None else float(alive.open_sessions())


@dataclass(frozen=True)
class _Planned:
    """A step that passed the rules and waits for the engine."""

    call: WorldCall
    fingerprint: str
    started: float
    base: tuple[int, int]  # (epoch, committed_step_id) the step was checked against
    context_length: int


def _reset_commit(
    state: Any, observation: Any, seeds: np.random.Generator, frames: Any, base: tuple[int, int]
) -> Commit:
    """A reset's commit over ``base`` (what is committed when it lands): a new epoch at step -1."""
    return Commit(base, state, observation, -1, 0, None, base[0] + 1, root=state, seeds=seeds, frames=frames)


class RolloutService:
    """Rollout sessions over one world; every world call goes through one batching engine thread."""

    def __init__(
        self,
        world: WorldModel,
        settings: ServerSettings | None = None,
        *,
        max_batch_items: int = 256,
        clock: Any = time.monotonic,
        store: SessionStore | None = None,
        body_timeout_s: float | None = None,
    ) -> None:
        """``store`` defaults to this process's :class:`RolloutStore`; ``rollserve.scale`` passes one
        whose committed state lives outside the process, shared by every replica. ``body_timeout_s``
        (default: the header deadline, ``settings.header_timeout_s``) bounds how long the routes
        wait for a request body, beyond the time its size accounts for."""
        if settings is None:
            from rollserve.server.settings import ServerSettings

            settings = ServerSettings()
        self.world = world
        self.settings = settings
        self.body_timeout_s = settings.header_timeout_s if body_timeout_s is None else body_timeout_s
        self._started = int(time.time())
        self.max_batch_items = max_batch_items
        # not ``store or ...``: an empty RolloutStore is falsy (``__len__``) and would be replaced
        self.store: SessionStore = (
            store
            if store is not None
            else RolloutStore(settings.max_rollout_sessions, settings.rollout_idle_ttl_s, clock=clock)
        )
        self.engine: BatchingWorker = BatchingWorker(
            partial(run_world_calls, world, keep_starts=True),
            max_batch_size=max_batch_items,
            max_wait_s=settings.max_batch_wait_ms / 1000.0,
            name="rollserve-world",
            on_batch=METRICS.batch_observer("world"),  # per model call, not per request
        )
        self._live_count = getattr(self.store, "live", None)  # a local store's count, safe to scrape
        self._sessions_counted = 0  # the last count of a store a scrape cannot ask (a shared one)
        # counted when /metrics is read: sessions expire while nobody asks, and an idle server's
        # gauge must not keep counting them
        _ACTIVE_SESSIONS.set_function(partial(_sessions_of, weakref.ref(self)))

    # -- discovery and shutdown --------------------------------------------------------------------
    def describe_models(self) -> list[dict[str, Any]]:
        """The world's ``/v1/models`` entry, with the other names a create may give it (``aliases``)."""
        spec = self.world.spec
        return [{**spec.describe(), "aliases": list(spec.aliases), "created": self._started}]

    def close(self) -> None:
        self.engine.close()
        self.world.close()

    # -- session lifecycle ----------------------------------------------------------------------------
    async def create_session(
        self, req: CreateSessionRequest, *, raw_tensors: bool = False
    ) -> CreateSessionResponse:
        if not self.world.spec.serves(req.model):
            served = self.world.spec.name
            raise RolloutError("model_not_found", f"this server serves world {served!r}, not {req.model!r}")
        # only a client-chosen id can be asked for again (a retry); a server-made one needs no print
        asked = _create_print(req) if req.session_id is not None else None
        if req.session_id is not None and (existing := await self._same_session(req.session_id, None, asked)):
            return self._created(existing, raw_tensors)
        render = self._render_spec(req.render)
        sid = await self.store.claim(req.session_id)
        seeds = np.random.default_rng(req.seed)
        seed = req.seed if req.seed is not None else int(seeds.integers(2**31))
        out, obs, frames = await self._initial(WorldInit(seed=seed, render=render))
        now = time.time()
        session = RolloutSession(
            session_id=sid,
            model=self.world.spec.name,
            mode=req.mode,
            created_at=now,
            state=out.state,
            root=out.state,
            observation=obs,
            seeds=seeds,
            render=render,
            jpeg_quality=req.render.jpeg_quality if req.render is not None else 0,
            frames=frames,
            created_by=asked,
        )
        try:
            session = await self.store.insert(session)
        except RolloutError as exc:  # a concurrent create of the same client-chosen id won the race
            if exc.code == "session_exists" and (existing := await self._same_session(sid, None, asked)):
                return self._created(existing, raw_tensors)
            raise
        answer = self._created(session, raw_tensors)  # before an await lets a close free the session
        await self._count_sessions()
        return answer

    async def fork_session(
        self, session_id: str, req: ForkSessionRequest | None = None, *, raw_tensors: bool = False
    ) -> CreateSessionResponse:
        """A new session holding ``session_id``'s committed state, counters and stored last result.

        Idempotent like a create: a retry with the same client-chosen id gets the fork its first try
        made, also when that try finished while the retry waited for the source's lock (or on another
        replica). A refused fork changes nothing in the source, not even its seed sequence."""
        req = req or ForkSessionRequest()
        if made := await self._fork_made(req.session_id, session_id):
            return self._created(made, raw_tensors)
        source = await self.store.open(session_id)
        async with source.lock:
            if made := await self._fork_made(req.session_id, session_id):  # the first try won the lock
                return self._created(made, raw_tensors)
            if source.closed:
                raise closed_error(source)
            try:
                fork = await self._insert_fork(source, req.session_id)
            except RolloutError as exc:  # the id is taken: by this fork, made on another replica?
                if exc.code != "session_exists" or not (
                    made := await self._fork_made(req.session_id, session_id)
                ):
                    raise
                return self._created(made, raw_tensors)
            answer = self._created(fork, raw_tensors)  # before an await lets a close free the fork
        await self._count_sessions()
        return answer

    async def _insert_fork(self, source: RolloutSession, session_id: str | None) -> RolloutSession:
        """The fork, inserted: the store reserves its id and draws its seed sequence from the
        source's as the fork lands (``fork_draw``), once, wherever the committed state lives."""
        fork = RolloutSession(
            session_id=session_id or new_session_id(),
            model=source.model,
            mode=source.mode,
            created_at=time.time(),
            state=source.state,
            root=source.root,
            observation=source.observation,
            seeds=None,  # type: ignore[arg-type]  # the store's draw
            committed_step_id=source.committed_step_id,
            context_length=source.context_length,
            last=source.last,
            forked_from=source.session_id,
            render=source.render,
            jpeg_quality=source.jpeg_quality,
            frames=source.frames,
        )
        return await self.store.insert(fork)

    async def reset_session(
        self, session_id: str, req: ResetSessionRequest | None = None, *, raw_tensors: bool = False
    ) -> ResetSessionResponse:
        """Start a new episode in the session: context cleared, ``committed_step_id`` back to -1."""
        req = req or ResetSessionRequest()
        session = await self.store.open(session_id)
        async with session.lock:
            while True:  # again when a fork on another replica drew from the seed sequence meanwhile
                if session.closed:
                    raise closed_error(session)
                drawn_from = None if req.seed is not None else session.seeds.bit_generator.state
                # drawn from a copy: a failed reset leaves even the seed sequence as it was
                seeds = (
                    np.random.default_rng(req.seed) if req.seed is not None else copy.deepcopy(session.seeds)
                )
                seed = req.seed if req.seed is not None else int(seeds.integers(2**31))
                # as sent (float64): the world checks it against its bounds before it rounds it
                start = np.asarray(req.state, dtype=np.float64) if req.state is not None else None
                init = WorldInit(seed=seed, state=start, render=session.render)
                out, obs, frames = await self._initial(init, session)
                episode = partial(_reset_commit, out.state, obs, seeds, frames)
                if await self._commit_reset(session, episode, drawn_from):
                    break
            self._touch(session)  # idle time counts from the end of the last request
        return ResetSessionResponse(
            session_id=session_id,
            committed_step_id=-1,
            context_length=0,
            observation=_observation(obs, frames, session.jpeg_quality, raw_tensors),
        )

    async def _commit_reset(
        self, session: RolloutSession, episode: Callable[[tuple[int, int]], Commit], drawn_from: Any
    ) -> bool:
        """Commit the reset ``episode`` (made over the base it lands on) over whatever another
        replica committed meanwhile (the reset wins); False, committing nothing, when its seed was
        drawn from a sequence (``drawn_from``, None for a seeded reset) that a fork on another
        replica has drawn from since: it must draw again, as one process would after that fork."""
        while True:
            if session.closed:
                raise closed_error(session)
            if drawn_from is not None and session.seeds.bit_generator.state != drawn_from:
                return False
            base = (session.epoch, session.committed_step_id)
            if await self.store.commit(session, episode(base)):
                return True

    async def close_session(self, session_id: str) -> CloseSessionResponse:
        """Release everything the session holds; closing again is a no-op. Waits for an in-flight step."""
        session = await self.store.open(session_id, include_closed=True)
        async with session.lock:
            session = await self.store.retire(session_id)
        await self._count_sessions()
        return CloseSessionResponse(session_id=session_id, committed_step_id=session.committed_step_id)

    async def get_status(self, session_id: str) -> SessionStatusResponse:
        """The session's counters. Reading them is not use: a monitoring poll must not keep an
        abandoned session alive (holding capacity), so its idle clock is left where it was."""
        session = await self.store.open(session_id, include_closed=True, touch=False)
        return SessionStatusResponse(
            session_id=session_id,
            committed_step_id=session.committed_step_id,
            context_length=session.context_length,
            closed=session.closed,
            closed_reason=session.closed_reason,
            model=session.model,
        )

    # -- steps ---------------------------------------------------------------------------------------
    async def step(
        self, session_id: str, req: RolloutStepRequest, *, raw_tensors: bool = False
    ) -> RolloutStepResponse:
        started = time.perf_counter()
        try:
            session = await self.store.open(session_id)
        except RolloutError as exc:
            committed, context = exc.committed_step_id, exc.context_length
            return self._refused(req.step_id, exc.code, exc.message, committed, context)
        finally:
            await self._count_sessions()  # a lookup may expire idle sessions
        async with session.lock:
            planned = self._plan(session, req, started, raw_tensors)
            if isinstance(planned, RolloutStepResponse):
                return planned
            (outcome,) = await self._run([planned.call])
            self._touch(session)  # idle time counts from the end of the last request
            return await self._finish(session, req, planned, outcome, raw_tensors)

    async def batch_step(self, req: BatchStepRequest, *, raw_tensors: bool = False) -> BatchStepResponse:
        """Many sessions' steps in one request and one engine batch; each item succeeds or fails alone."""
        started = time.perf_counter()
        items = req.items

        def plan(session: RolloutSession, i: int) -> _Planned | RolloutStepResponse:
            return self._plan(session, items[i], started, raw_tensors)

        async def finish(
            session: RolloutSession, i: int, planned: _Planned, outcome: Completed | BaseException
        ) -> RolloutStepResponse:
            return await self._finish(session, items[i], planned, outcome, raw_tensors)

        rows = [(item.session_id, item.step_id) for item in items]
        refused = req._refused or {}  # items that failed validation alone (the routes' stand-ins)
        answers = await self._step_many(rows, refused, plan, finish)
        results = []
        for item, answer in zip(items, answers, strict=True):
            fields = answer.__dict__
            fields = {
                **fields,
                "session_id": item.session_id,
                "status": "ok" if fields["error"] is None else "error",
            }
            results.append(built(BatchStepResult, fields))
        return built(BatchStepResponse, {"object": "batch_step", "results": results})

    async def batch_step_columns(
        self, req: BatchStepColumnsRequest, *, raw_tensors: bool = False
    ) -> BatchStepColumnsResponse:
        """``batch_step`` for N plain contextual steps sent as columns, answered as columns.

        The same locks, rules, engine batch and commits as ``batch_step``: row ``i`` is checked as
        the item ``{step_id, observation: {}, action: {joint_positions: actions[i][:7],
        gripper_position: actions[i][7]}}`` would be and gets its fingerprint, so a row and that
        item replay each other. Only the per-item request and answer models are left out: building
        and encoding them was most of a batch's cost beside the model. A row fails alone.
        """
        started = time.perf_counter()
        actions = req.actions
        values = actions.tolist()  # the rows as the item's JSON numbers (what its print hashes)
        finite = (np.abs(actions) <= FLOAT32_MAX).all(axis=1).tolist()  # NaN compares False too
        refused = {
            i: f"actions[{i}] must be finite and within float32 range"
            for i, ok in enumerate(finite)
            if not ok
        }
        shape = row_shape(self.world.spec)

        def plan(session: RolloutSession, i: int) -> _Planned | RolloutStepResponse:
            if session.render is not None:  # columns carry no frames
                message = "a rendering session's frames do not fit in columns: step it with batch_step items"
                return self._refused(req.step_ids[i], "invalid_request", message, *self._counters(session))
            return self._plan_row(session, req.step_ids[i], values[i], started)

        async def finish(
            session: RolloutSession, i: int, planned: _Planned, outcome: Completed | BaseException
        ) -> tuple[StepRecord, int, int] | RolloutStepResponse:
            step_id = req.step_ids[i]
            if isinstance(outcome, Completed):  # a row has no place for another shape: nothing commits
                out, _ = _started_from(outcome.value)
                if isinstance(out, WorldOutput) and math.prod(np.shape(out.observation)) != math.prod(shape):
                    message = f"world step failed: its observation is not of the spec's shape {list(shape)}"
                    committed, context = planned.base[1], planned.context_length
                    return self._refused(step_id, "inference_error", message, committed, context)

            def again() -> _Planned | RolloutStepResponse:
                return self._plan_row(session, step_id, values[i], planned.started)

            return await self._commit(session, step_id, True, planned, outcome, again)

        rows = list(zip(req.session_ids, req.step_ids, strict=True))
        answers = await self._step_many(rows, refused, plan, finish)
        latency_ms = round((time.perf_counter() - started) * 1000.0, 3)
        return _columns_answer(shape, rows, answers, raw_tensors, latency_ms)

    async def _step_many(
        self,
        rows: list[tuple[str, int]],
        refused: dict[int, str],
        plan: Callable[[RolloutSession, int], _Planned | RolloutStepResponse],
        finish: Callable[[RolloutSession, int, _Planned, Completed | BaseException], Awaitable[Any]],
    ) -> list[Any]:
        """The answer to each ``(session_id, step_id)`` row: a refusal or replay (a
        ``RolloutStepResponse``) from ``plan``, else what ``finish`` made of its engine outcome.
        Sessions are locked in one global order, every planned row runs in one engine call, and a
        row refused before (``refused``: index -> message) or repeated is answered last."""
        if len(rows) > self.max_batch_items:
            raise RolloutError("invalid_request", f"batch_step takes at most {self.max_batch_items} items")
        answers: list[Any] = [None] * len(rows)
        sessions: dict[int, RolloutSession] = {}
        seen: set[str] = set()
        repeated: list[int] = []
        for i, (session_id, step_id) in enumerate(rows):
            if session_id in seen or i in refused:
                seen.add(session_id)  # a refused row still takes its session's one place
                repeated.append(i)
                continue
            seen.add(session_id)
            try:
                sessions[i] = await self.store.open(session_id)
            except RolloutError as exc:
                answers[i] = self._refused(
                    step_id, exc.code, exc.message, exc.committed_step_id, exc.context_length
                )
        held: list[asyncio.Lock] = []
        try:
            for i in sorted(sessions, key=lambda k: sessions[k].session_id):  # one global order: no deadlock
                lock = sessions[i].lock
                await lock.acquire()
                held.append(lock)
            planned: dict[int, _Planned] = {}
            for i, session in sessions.items():
                made = plan(session, i)
                if isinstance(made, RolloutStepResponse):
                    answers[i] = made
                else:
                    planned[i] = made
            outcomes = await self._run([p.call for p in planned.values()]) if planned else []
            for session in sessions.values():
                self._touch(session)
            for (i, made), outcome in zip(planned.items(), outcomes, strict=True):
                answers[i] = await finish(sessions[i], i, made, outcome)
        finally:
            for lock in reversed(held):
                lock.release()
        for i in repeated:  # answered last, so they report the session as this batch left it
            message = refused.get(i, "a session may appear only once per batch_step")
            answers[i] = await self.refused_step(rows[i][0], rows[i][1], "invalid_request", message)
        return answers

    @staticmethod
    def fingerprint(req: RolloutStepRequest) -> str:
        """The request's content hash, computed once (routes do it off the loop for big bodies)."""
        private = req.__pydantic_private__  # read directly: pydantic's __getattr__ costs 2-7 µs
        if private is None or private.get("_fingerprint") is None:
            fingerprint = _fingerprint(req)
            req._fingerprint = fingerprint  # (setting is cheap; reading it back was not)
            return fingerprint
        return private["_fingerprint"]

    def _touch(self, session: RolloutSession) -> None:
        """Restart the session's idle clock after a request (stores without idle expiry skip it)."""
        touch = getattr(self.store, "touch", None)
        if touch is not None:
            touch(session)

    async def committed_step_id(self, session_id: str) -> int | None:
        """The session's committed step (closed or not), or None for an unknown id: what an error
        body reports when the refusal came before the service read the session (a malformed body)
        or from the store (``at_capacity``)."""
        session = await self.store.find(session_id)
        return None if session is None else session.committed_step_id

    async def refused_step(
        self, session_id: str, step_id: int, code: str, message: str
    ) -> RolloutStepResponse:
        """The full error response for a step the transport could not even parse."""
        session = await self.store.find(session_id)
        committed = session.committed_step_id if session else -1
        return self._refused(step_id, code, message, committed, session.context_length if session else 0)

    # -- the rules ------------------------------------------------------------------------------------
    def _plan(
        self, session: RolloutSession, req: RolloutStepRequest, started: float, raw: bool
    ) -> _Planned | RolloutStepResponse:
        """Check a step against the session; either the engine call to make or the answer to give."""
        committed, context = session.committed_step_id, session.context_length
        if session.closed:
            exc = closed_error(session)
            return self._refused(req.step_id, exc.code, exc.message, committed, context)
        try:
            fingerprint = self.fingerprint(req)
        except (ValueError, TypeError) as exc:
            return self._refused(req.step_id, "invalid_request", _short(exc), committed, context)
        if req.use_session_context and req.step_id != committed + 1:
            return self._out_of_turn(session, req.step_id, fingerprint, raw)
        acting = self.world.spec.acts and _empty(req.action)
        try:
            inputs = fold_action_into_observation(req.observation, req.action, state_fallback=not acting)
            action = None if acting else self._action_vector(inputs)
            init = _start_from(inputs)
            if init is not None:
                init = replace(init, render=session.render)
        except (ValueError, TypeError) as exc:
            return self._refused(req.step_id, "invalid_request", _short(exc), committed, context)
        if req.use_session_context:
            state = session.state
            if committed >= 0:
                init = None  # a running context is authoritative; start conditions apply to fresh ones
        else:
            state = session.root  # a scratch context: the episode's start, never the committed state
        call = WorldCall(init=init, step=WorldStep(state, action, inputs))
        return _Planned(call, fingerprint, started, (session.epoch, committed), context)

    def _out_of_turn(
        self, session: RolloutSession, step_id: int, fingerprint: str, raw: bool
    ) -> RolloutStepResponse:
        """A contextual step whose id is not the next one: a duplicate of the last committed step
        gets its stored result (``replayed``), any other id is refused."""
        committed, context = session.committed_step_id, session.context_length
        if step_id > committed:
            message = f"expected step_id {committed + 1}, got {step_id}"
            return self._refused(step_id, "step_out_of_order", message, committed, context)
        last = session.last
        if last is not None and last.step_id == step_id and last.fingerprint == fingerprint:
            return self._replay(session, last, raw)
        message = f"step {step_id} is already committed (committed_step_id={committed})"
        if last is not None and last.step_id == step_id:
            message += "; this request differs from the one committed, so its result is not returned"
        return self._refused(step_id, "step_already_committed", message, committed, context)

    def _plan_row(
        self, session: RolloutSession, step_id: int, action: list[float], started: float
    ) -> _Planned | RolloutStepResponse:
        """``_plan`` for a columns row: the item ``{step_id, observation: {}, action}`` with the
        action's 8 finite values (checked with the columns), planned without building it."""
        committed, context = session.committed_step_id, session.context_length
        if session.closed:
            exc = closed_error(session)
            return self._refused(step_id, exc.code, exc.message, committed, context)
        joints, gripper = action[:7], action[7]
        fingerprint = _plain_print(step_id, True, None, "", joints, gripper)
        if step_id != committed + 1:
            return self._out_of_turn(session, step_id, fingerprint, True)
        inputs = {"prompt": "", JOINT_KEY: np.array(joints), GRIPPER_KEY: np.array([gripper])}
        step = WorldStep(session.state, np.array(action, dtype=np.float32), inputs)
        return _Planned(
            WorldCall(init=None, step=step), fingerprint, started, (session.epoch, committed), context
        )

    async def _finish(
        self,
        session: RolloutSession,
        req: RolloutStepRequest,
        plan: _Planned,
        outcome: Completed | BaseException,
        raw: bool,
    ) -> RolloutStepResponse:
        """The step's answer: its committed (or stateless) result, or why it failed (see ``_commit``)."""

        def again() -> _Planned | RolloutStepResponse:
            return self._plan(session, req, plan.started, raw)

        done = await self._commit(session, req.step_id, req.use_session_context, plan, outcome, again)
        if isinstance(done, RolloutStepResponse):
            return done
        record, committed, context = done
        assert isinstance(outcome, Completed)
        meta = _metadata(
            round((time.perf_counter() - plan.started) * 1000.0, 3),
            1,
            context,
            committed,
            record.uncertainty,
            round(outcome.queue_wait_s * 1000.0, 3),
            outcome.batch_size,
        )
        return _response(req.step_id, _next_observation(record, session.jpeg_quality, raw), meta, None)

    async def _commit(
        self,
        session: RolloutSession,
        step_id: int,
        contextual: bool,
        plan: _Planned,
        outcome: Completed | BaseException,
        again: Callable[[], _Planned | RolloutStepResponse],
    ) -> tuple[StepRecord, int, int] | RolloutStepResponse:
        """Commit a successful contextual step atomically; anything else leaves the session as it was.
        Returns the step's record with the session's ``(committed_step_id, context_length)`` after
        it, or the refusal.

        The commit is the store's compare-and-set: when another writer (a replica racing the same
        step) committed first, this step's result is dropped and the request is checked ``again``
        against what was committed, so it gets the stored result exactly as a duplicate does.
        """
        committed, context = plan.base[1], plan.context_length  # as checked: the session may move meanwhile
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            out, root = _started_from(outcome.value)
            if not isinstance(out, WorldOutput):
                raise TypeError(f"world returned {type(out).__name__}, not a WorldOutput")
            record = StepRecord(
                step_id=step_id,
                fingerprint=plan.fingerprint,
                observation=as_float32(out.observation),
                actions=None if out.action is None else self._chosen_action(out.action),
                reward=_finite(out.reward, "reward"),
                terminated=bool(out.terminated),
                uncertainty=None if out.uncertainty is None else _finite(out.uncertainty, "uncertainty"),
                info=_json_safe(out.info),
                frames=_frames_of(out),
            )
        except EngineClosed:
            message = "the world engine is shut down"
            return self._refused(step_id, "engine_unavailable", message, committed, context)
        except Exception as exc:
            if _start_refused(plan.call, outcome):  # the client's start state: its fault, as on reset
                return self._refused(step_id, "invalid_request", _short(exc), committed, context)
            logger.warning("step %s of session %s failed", step_id, session.session_id, exc_info=exc)
            message = f"world step failed: {type(exc).__name__}: {_short(exc)}"
            return self._refused(step_id, "inference_error", message, committed, context)
        if contextual:
            change = Commit(
                plan.base,
                out.state,
                record.observation,
                step_id,
                context + 1,
                record,
                plan.base[0],
                root=root,  # a first step's own start conditions start the episode (None: they did not)
                frames=record.frames,
            )
            if not await self.store.commit(session, change):
                checked = again()
                if isinstance(checked, RolloutStepResponse):
                    return checked
                message = "the session moved while the step ran; retry"  # a reset raced it
                return self._refused(step_id, "step_out_of_order", message, *self._counters(session))
            committed, context = step_id, context + 1
        return record, committed, context

    def _replay(self, session: RolloutSession, last: StepRecord, raw: bool) -> RolloutStepResponse:
        response = self._refused(
            last.step_id,
            "step_already_committed",
            f"step {last.step_id} is already committed; its stored result is returned",
            session.committed_step_id,
            session.context_length,
        )
        response.next_observation = _next_observation(last, session.jpeg_quality, raw)
        response.model_metadata.uncertainty = last.uncertainty
        response.replayed = True
        return response

    def _action_vector(self, inputs: dict[str, Any]) -> np.ndarray:
        spec = self.world.spec
        joints, gripper = inputs.get(JOINT_KEY), inputs.get(GRIPPER_KEY)
        if (joints is None or gripper is None) and spec.requires_action:
            acting = "" if spec.acts else "; it has no policy to act by itself (serve it with --world-policy)"
            raise ValueError(
                f"world {spec.name!r} needs action.joint_positions (7 values) and action.gripper_position "
                f"(1 value), or an observation.state that starts with them{acting}"
            )
        joints = np.zeros(7) if joints is None else joints
        gripper = np.zeros(1) if gripper is None else gripper
        return np.concatenate([joints, gripper], dtype=np.float32)

    def _chosen_action(self, action: Any) -> np.ndarray:
        """A world-chosen action as the ``[1, action_dim]`` float32 rows the response carries."""
        rows = as_float32(action).reshape(1, -1)
        if rows.shape[1] != self.world.spec.action_dim:
            raise ValueError(
                f"world chose an action of {rows.shape[1]} values, not {self.world.spec.action_dim}"
            )
        return rows

    def _render_spec(self, req: RenderRequest | None) -> RenderSpec | None:
        """The frames a new session asked for, checked against what the world renders."""
        if req is None:
            return None
        spec = self.world.spec
        if not spec.cameras:
            raise RolloutError("invalid_request", f"world {spec.name!r} does not render camera frames")
        cameras = tuple(req.cameras) if req.cameras is not None else spec.cameras
        unknown = [c for c in cameras if c not in spec.cameras]
        if unknown:
            has = f"world {spec.name!r} has {list(spec.cameras)}"
            raise RolloutError("invalid_request", f"render.cameras: unknown camera {unknown[0]!r}; {has}")
        if len(set(cameras)) != len(cameras):
            twice = next(c for i, c in enumerate(cameras) if c in cameras[:i])
            raise RolloutError("invalid_request", f"render.cameras: {twice!r} is named twice")
        fields = req.model_fields_set
        height, width = req.height, req.width
        if spec.frame_size is not None:
            if {"height", "width"} & fields and (height, width) != spec.frame_size:
                size = "x".join(map(str, spec.frame_size))
                raise RolloutError("invalid_request", f"world {spec.name!r} renders {size} frames only")
            height, width = spec.frame_size
        return RenderSpec(cameras=cameras, height=height, width=width)

    # -- engine ---------------------------------------------------------------------------------------
    async def _run(self, calls: list[WorldCall]) -> list[Completed | BaseException]:
        try:
            outcomes = await self.engine.submit_many(calls)
        except EngineClosed as exc:
            return [exc] * len(calls)
        done = [o for o in outcomes if isinstance(o, Completed)]
        if done:
            _QUEUE_WAIT.observe(max(o.queue_wait_s for o in done))
        return outcomes

    async def _initial(
        self, init: WorldInit, session: RolloutSession | None = None
    ) -> tuple[WorldOutput, np.ndarray, Frames | None]:
        """A fresh start state from the world, or ``inference_error`` / ``invalid_request``."""
        committed = session.committed_step_id if session else -1
        (outcome,) = await self._run([WorldCall(init=init)])
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            out = outcome.value
        except EngineClosed:
            code, message = "engine_unavailable", "the world engine is shut down"
        except ValueError as exc:
            if init.state is not None:  # the client's start state was refused by the world
                code, message = "invalid_request", _short(exc)
            else:
                code, message = "inference_error", f"world start failed: {_short(exc)}"
        except Exception as exc:
            logger.warning("world start failed", exc_info=exc)
            code, message = "inference_error", f"world start failed: {type(exc).__name__}: {_short(exc)}"
        else:
            try:
                return out, as_float32(out.observation), _frames_of(out)
            except (
                Exception
            ) as exc:  # the world's own output is bad (e.g. not finite): not the client's fault
                logger.warning("world start returned an unusable observation", exc_info=exc)
                code, message = "inference_error", f"world start failed: {type(exc).__name__}: {_short(exc)}"
        raise RolloutError(code, message, committed_step_id=committed)

    # -- helpers ---------------------------------------------------------------------------------------
    async def _fork_made(self, sid: str | None, source_id: str) -> RolloutSession | None:
        """The open fork of ``source_id`` a retried fork with client-chosen id ``sid`` already made."""
        return None if sid is None else await self._same_session(sid, source_id)

    async def _same_session(
        self, sid: str, forked_from: str | None, created_by: str | None = None
    ) -> RolloutSession | None:
        """The open session a retried create (or fork) with a client-chosen id already made, if any.

        A retry asks for what its first try asked: a fork of the same source, or a create of the same
        request (``created_by``: its print; a seed, render or model name of its own is another
        session's create, refused with ``session_exists``)."""
        existing = await self.store.find(sid)
        if existing is None or existing.closed or existing.forked_from != forked_from:
            return None
        if existing.created_by != created_by:
            return None
        return existing

    def _created(self, session: RolloutSession, raw: bool) -> CreateSessionResponse:
        return CreateSessionResponse(
            session_id=session.session_id,
            mode=session.mode,
            created_at=session.created_at,
            model=session.model,
            committed_step_id=session.committed_step_id,
            context_length=session.context_length,
            observation=_observation(session.observation, session.frames, session.jpeg_quality, raw),
            forked_from=session.forked_from,
        )

    async def _count_sessions(self) -> None:
        """Ask a store the scrape cannot ask (a shared one) for its count, after a change."""
        if self._live_count is None:  # a local store is counted when /metrics is read
            self._sessions_counted = await self.store.count()

    def open_sessions(self) -> int:
        """Open sessions as ``/metrics`` reports them: a local store counts them now (expired ones
        left out); a shared one answers from another process, so its last count is kept."""
        return self._sessions_counted if self._live_count is None else self._live_count()

    @staticmethod
    def _counters(session: RolloutSession) -> tuple[int, int]:
        return session.committed_step_id, session.context_length

    @staticmethod
    def _refused(step_id: int, code: str, message: str, committed: int, context: int) -> RolloutStepResponse:
        error = built(
            ErrorObject,
            {"code": code, "message": message, "step_id": step_id, "committed_step_id": committed},
        )
        return _response(step_id, None, _metadata(0.0, 0, context, committed, None, None, None), error)


def _metadata(
    latency_ms: float,
    steps_generated: int,
    context: int,
    committed: int,
    uncertainty: float | None,
    queue_wait_ms: float | None,
    batch_size: int | None,
) -> SessionMetadata:
    """A step's metadata, built from values the service computed (already of their types)."""
    return built(
        SessionMetadata,
        {
            "latency_ms": latency_ms,
            "steps_generated": steps_generated,
            "context_length": context,
            "committed_step_id": committed,
            "session_memory_bytes": None,
            "uncertainty": uncertainty,
            "queue_wait_ms": queue_wait_ms,
            "batch_size": batch_size,
        },
    )


def _response(
    step_id: int, observation: dict[str, Any] | None, meta: SessionMetadata, error: ErrorObject | None
) -> RolloutStepResponse:
    fields = {
        "step_id": step_id,
        "next_observation": observation,
        "model_metadata": meta,
        "error": error,
        "replayed": False,
    }
    return built(RolloutStepResponse, fields)


def _start_from(inputs: dict[str, Any]) -> WorldInit | None:
    """Start conditions a request may carry for a fresh context: ``seed`` and/or a start state."""
    seed, state = inputs.get("seed"), inputs.get(START_STATE_KEY)
    if seed is None and state is None:
        return None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ValueError("observation.extra.seed must be an integer in [0, 2**63)")
    # flat and checked when folded; as sent (float64): the world checks it before it rounds it
    start = None if state is None else np.asarray(state, dtype=np.float64)
    return WorldInit(seed=seed, state=start)


def _start_refused(call: WorldCall, outcome: Any) -> bool:
    """Whether the world answered a step from a client-chosen start state with ``ValueError``: it
    refused that state (``sim`` and ``video`` start from seeds only), which ``_initial`` reports as
    ``invalid_request`` on a reset, so a fresh-context step must too. Failures while reading a
    world's answer (``outcome`` then is no exception) stay the world's."""
    return isinstance(outcome, ValueError) and call.init is not None and call.init.state is not None


def _create_print(req: CreateSessionRequest) -> str:
    """What a create asks for (its validated body as JSON, a few hundred bytes at most): a create
    that reuses an id is a retry of the one that made the session only if this matches, as a
    duplicate step must match the committed step's print."""
    return req.model_dump_json()


def _frames_of(out: WorldOutput) -> Frames | None:
    """A rendering world's images (uint8 HWC RGB) and state vector, checked before anything commits."""
    if out.images is None and out.vector is None:
        return None
    images = None
    if out.images is not None:
        images = {}
        for name, image in out.images.items():
            image = np.ascontiguousarray(image)
            check_image(image, f"world image {name!r}")
            images[str(name)] = image
    return Frames(vector=None if out.vector is None else as_float32(out.vector), images=images)


def _observation(tensor: np.ndarray, frames: Frames | None, quality: int, raw: bool) -> dict[str, Any]:
    """An observation on the wire: the tensor, and for a rendering session ``state`` and ``images``
    (msgpack: the policy wire's image maps; JSON: ``{"format", "shape", "data"}`` with base64 data)."""
    out = encode_tensor_field(tensor, raw=raw)
    if frames is not None:
        if frames.vector is not None:
            out["state"] = frames.vector.tolist()
        if frames.images is not None:
            encode = encode_image if raw else image_to_json
            out["images"] = {name: encode(image, quality) for name, image in frames.images.items()}
    return out


def _next_observation(record: StepRecord, quality: int, raw: bool) -> dict[str, Any]:
    out = {
        **_observation(record.observation, record.frames, quality, raw),
        "reward": record.reward,
        "terminated": record.terminated,
        "info": record.info,
    }
    if record.actions is not None:  # a world-action model chose the step's action: [1, action_dim]
        out["actions"] = record.actions.tolist()
    return out


def _empty(action: Action) -> bool:
    """An action that names nothing to execute (``Action()``): a world-action model acts by itself."""
    return action.joint_positions is None and action.gripper_position is None


_NOT_CONTENT = frozenset({"session_id"})  # where a step goes, not what it is


def _fingerprint(req: RolloutStepRequest) -> str:
    """What identifies a request's content, so a duplicate can be told from a different step.

    A step whose only data are numbers and a prompt (no images, no ``extra``: what trainers send)
    hashes the msgpack of its fields (exact for floats; a float and a list stay apart), ~10x cheaper
    than the JSON of the whole model; anything else hashes that JSON. A prefix keeps the two apart,
    and which one applies depends only on the content, so equal requests always get equal prints.
    A batch item's ``session_id`` is left out: the print is only ever compared with the record of
    that same session, so a step committed by ``batch_step`` and resent to ``/step`` (or the other
    way round) is the duplicate it is, and gets its stored result back.
    """
    obs, action = req.observation, req.action
    if obs.images is None and not obs.extra and not action.extra:
        return _plain_print(
            req.step_id,
            req.use_session_context,
            obs.state,
            obs.prompt,
            action.joint_positions,
            action.gripper_position,
        )

    def plain(value: Any) -> Any:
        if isinstance(value, np.ndarray | np.generic):
            array = np.asarray(value)
            return [array.dtype.str, list(array.shape), hashlib.sha256(array.tobytes()).hexdigest()]
        return repr(value)

    body = json.dumps(req.model_dump(exclude=_NOT_CONTENT), sort_keys=True, default=plain)
    return hashlib.sha256(body.encode()).hexdigest()


def _plain_print(step_id: int, contextual: bool, state: Any, prompt: str, joints: Any, gripper: Any) -> str:
    """The print of a step made of numbers and a prompt only: the msgpack of its fields."""
    fields = (step_id, contextual, state, prompt, joints, gripper)
    return hashlib.sha256(b"plain:" + msgpack.packb(fields)).hexdigest()


def _finite(value: Any, name: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"world {name} is not finite")
    return number


_PLAIN_SCALARS = (bool, int, str, type(None))


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """The world's info dict as plain JSON values (numpy scalars and small arrays converted).

    A flat dict of plain scalars (what worlds usually return, e.g. ``{"success": False}``) is copied
    as it is: a JSON round trip would give back equal values, at ~10 µs per step."""
    if all(
        type(key) is str
        and (type(value) in _PLAIN_SCALARS or (type(value) is float and math.isfinite(value)))
        for key, value in info.items()
    ):
        return dict(info)

    def plain(value: Any) -> Any:
        if isinstance(value, np.ndarray | np.generic):
            return value.tolist()
        raise TypeError(f"info value of type {type(value).__name__} cannot be sent")

    return json.loads(json.dumps(dict(info), default=plain, allow_nan=False))


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:_MESSAGE_LIMIT]


def row_shape(spec: WorldSpec) -> tuple[int, ...]:
    """One observation's shape in ``batch_step_columns``: the spec's tensor, else its flat vector."""
    return spec.observation_shape or (len(spec.observation_names),)


def _columns_answer(
    shape: tuple[int, ...],
    rows: list[tuple[str, int]],
    answers: list[tuple[StepRecord, int, int] | RolloutStepResponse],
    raw: bool,
    latency_ms: float,
) -> BatchStepColumnsResponse:
    """Each row's result in columns: a failed row holds zeros, ``status`` says which rows did."""
    n = len(rows)
    observations = np.zeros((n, *shape), dtype=np.float32)
    states: np.ndarray | None = None
    rewards, terminated = [0.0] * n, [False] * n
    infos: list[dict[str, Any]] = [{} for _ in range(n)]
    uncertainty: list[float | None] = [None] * n
    status, replayed, committed, contexts, errors, step_ids = [], [], [], [], [], []
    for i, answer in enumerate(answers):
        vector = None
        if isinstance(answer, tuple):
            record, last, context = answer
            step_ids.append(record.step_id)
            observations[i] = record.observation.reshape(shape)
            rewards[i], terminated[i], infos[i] = record.reward, record.terminated, record.info
            uncertainty[i] = record.uncertainty
            vector = None if record.frames is None else record.frames.vector
            status.append("ok")
            replayed.append(False)
            errors.append(None)
        else:
            meta, error, seen = answer.model_metadata, answer.error, answer.next_observation
            assert error is not None  # a refusal, or a replay (``step_already_committed``)
            last, context = meta.committed_step_id, meta.context_length
            step_ids.append(answer.step_id)
            message, again = error.message, answer.replayed
            if again:  # the stored result of a duplicate (raw tensors)
                latent = np.asarray(seen["video_latent"])
                if latent.size == observations[i].size:
                    observations[i] = latent.reshape(shape)
                    rewards[i], terminated[i], infos[i] = seen["reward"], seen["terminated"], seen["info"]
                    uncertainty[i] = meta.uncertainty
                    vector = seen.get("state")
                else:  # committed by an item, with another shape: only an item can carry it
                    again = False
                    message = f"{message}; it does not fit in columns: resend it as a batch_step item"
            status.append("error")
            replayed.append(again)
            errors.append({"code": error.code, "message": message})
        if vector is not None:
            if states is None:
                states = np.zeros((n, len(vector)), dtype=np.float32)
            if len(vector) == states.shape[1]:
                states[i] = vector
        committed.append(last)
        contexts.append(context)
    observation: dict[str, Any] = {
        **encode_tensor_field(observations, raw=raw),
        "reward": rewards,
        "terminated": terminated,
        "info": infos,
    }
    if states is not None:
        observation["state"] = states if raw else states.tolist()
    fields = {
        "object": "batch_step.columns",
        "session_ids": [session_id for session_id, _ in rows],
        "step_ids": step_ids,
        "status": status,
        "replayed": replayed,
        "committed_step_ids": committed,
        "context_lengths": contexts,
        "errors": errors,
        "uncertainty": uncertainty,
        "next_observation": observation,
        "latency_ms": latency_ms,
    }
    return built(BatchStepColumnsResponse, fields)
