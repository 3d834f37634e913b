"""Retries and refusals over real HTTP: a fork retried while the original waits answers like it, a
refused fork changes nothing in its source, error bodies carry the session's real
``committed_step_id``, and closed or expired sessions keep only what ``status`` needs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
from manual_clock import Clock

from rollserve.models.world import RenderSpec, WorldInit, WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.protocol import CreateSessionRequest, ForkSessionRequest
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.store import RolloutError, RolloutSession, RolloutStore
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import WireLimits

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
HEADER = "X-Rollserve-Status-Codes"


MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


class GatedWorld(ToyWorld):
    """Steps wait at ``gate`` (while it is set) inside the world, holding their session's lock."""

    def __init__(self) -> None:
        self.gate: threading.Event | None = None

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        gate = self.gate
        if gate is not None:
            gate.wait(10.0)
        return super().step_batch(steps)


class CameraWorld(ToyWorld):
    """The toy world with two cameras whose images are filled with 7: sessions that render."""

    spec = dataclasses.replace(ToyWorld.spec, cameras=("front", "wrist"))

    def _initial(self, init: WorldInit) -> WorldOutput:
        return _framed(super()._initial(init), init.render)

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        plain = [dataclasses.replace(s, state=s.state[0]) for s in steps]
        outs = super().step_batch(plain)
        return [_framed(out, s.state[1]) for s, out in zip(steps, outs, strict=True)]


def _framed(out: WorldOutput | BaseException, render: RenderSpec | None) -> WorldOutput | BaseException:
    if isinstance(out, BaseException):
        return out
    if render is None:
        return dataclasses.replace(out, state=(out.state, None))
    images = {cam: np.full((render.height, render.width, 3), 7, np.uint8) for cam in render.cameras}
    return dataclasses.replace(out, state=(out.state, render), images=images, vector=out.observation)


@contextlib.contextmanager
def server(
    world: Any, clock: Callable[[], float] = time.monotonic, **settings: Any
) -> Iterator[tuple[httpx.Client, RolloutService]]:
    """A real server over ``world``, a client for it and the service behind it."""
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    service = RolloutService(world, config, clock=clock)
    with (
        serving(create_app(config, rollout=service)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as client,
    ):
        yield client, service


def create(http: httpx.Client, sid: str, seed: int = 0, **extra: Any) -> dict:
    resp = http.post(SESSIONS, json={"model": "toy", "seed": seed, "session_id": sid, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def step(http: httpx.Client, sid: str, step_id: int) -> dict:
    resp = http.post(f"{SESSIONS}/{sid}/step", json={"step_id": step_id, "observation": {}, "action": ACTION})
    assert resp.status_code == 200, resp.text
    return resp.json()


def latent(observation: dict) -> np.ndarray:
    data = base64.b64decode(observation["video_latent"])
    return np.frombuffer(data, dtype="<f4").reshape(observation["shape"])


def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def waiters(session: RolloutSession) -> int:
    """Requests queued on the session's lock (read from the test thread; a deque's len is atomic)."""
    return len(session.lock._waiters or ())


# -- bug: a fork retried while the original waits for the source's lock -----------------------------------
def test_a_fork_retried_while_the_original_waits_answers_like_the_original() -> None:
    world = GatedWorld()
    with server(world) as (http, service):
        create(http, "src")
        gate = world.gate = threading.Event()
        stepped: list[dict] = []
        holder = threading.Thread(target=lambda: stepped.append(step(http, "src", 0)))
        holder.start()  # step 0 holds the source's lock inside the world
        source = service.store.peek("src")
        until(lambda: source.lock.locked())
        answers: list[httpx.Response] = []

        def fork() -> None:
            answers.append(http.post(f"{SESSIONS}/src/fork", json={"session_id": "child"}))

        forks = [threading.Thread(target=fork) for _ in range(2)]  # the original and its retry
        for thread in forks:
            thread.start()
        until(lambda: waiters(source) == 2)  # both passed the check for a made fork, both queued
        world.gate = None
        gate.set()
        for thread in [holder, *forks]:
            thread.join(10.0)
        assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
        first, retry = (r.json() for r in answers)
        assert first == retry  # the same session: same created_at, same observation
        assert (first["session_id"], first["forked_from"]) == ("child", "src")
        assert (first["committed_step_id"], first["context_length"]) == (0, 1)
        np.testing.assert_array_equal(latent(first["observation"]), latent(stepped[0]["next_observation"]))
        assert len(service.store) == 2
        assert http.post(f"{SESSIONS}/src/close").status_code == 200
        late = http.post(f"{SESSIONS}/src/fork", json={"session_id": "child"})  # a retry after the close
        assert (late.status_code, late.json()) == (200, first)
        other = http.post(f"{SESSIONS}/src/fork", json={"session_id": "child-2"})
        assert (other.status_code, other.json()["error"]["reason"]) == (410, "session_closed")


def test_a_fork_retried_behind_a_close_of_its_source_answers_like_the_original() -> None:
    """The first try, a close of the source, then the retry, all queued behind a step: the retry
    finds the source closed, but its fork made, and answers with that fork (not 410)."""
    world = GatedWorld()
    with server(world) as (http, service):
        create(http, "src")
        gate = world.gate = threading.Event()
        holder = threading.Thread(target=lambda: step(http, "src", 0))
        holder.start()
        source = service.store.peek("src")
        until(lambda: source.lock.locked())
        answers: dict[str, httpx.Response] = {}

        def send(name: str, path: str, body: dict[str, Any] | None) -> threading.Thread:
            def post() -> None:  # msgpack both ways: the answers carry raw tensors
                content = msgpack.packb(body) if body is not None else None
                answers[name] = http.post(f"{SESSIONS}/src/{path}", content=content, headers=MSGPACK)

            thread = threading.Thread(target=post)
            thread.start()
            return thread

        threads = []
        for queued, (name, path, body) in enumerate(
            [
                ("first", "fork", {"session_id": "child"}),
                ("close", "close", None),
                ("retry", "fork", {"session_id": "child"}),
            ],
            start=1,
        ):
            threads.append(send(name, path, body))
            until(lambda queued=queued: waiters(source) == queued)  # in this order on the lock
        world.gate = None
        gate.set()
        for thread in [holder, *threads]:
            thread.join(10.0)
        assert [answers[n].status_code for n in ("first", "close", "retry")] == [200, 200, 200]
        first, retry = (msgpack.unpackb(answers[n].content) for n in ("first", "retry"))
        assert retry == first and b"__ndarray__" in first["observation"]["video_latent"]  # a raw tensor


class ForkedElsewhereStore(RolloutStore):
    """A store where another replica inserts the same fork just before this process inserts its own."""

    def __init__(self) -> None:
        super().__init__(16, 600.0)
        self.rival: RolloutSession | None = None

    async def insert(self, session: RolloutSession) -> RolloutSession:
        if self.rival is not None:
            rival, self.rival = self.rival, None
            self.add(rival)
        return await super().insert(session)


async def test_a_fork_that_another_replica_made_meanwhile_is_answered_not_refused() -> None:
    store = ForkedElsewhereStore()
    service = RolloutService(ToyWorld(), ServerSettings(max_batch_wait_ms=0.0), store=store)
    try:
        created = await service.create_session(
            CreateSessionRequest(model="toy", seed=0, session_id="src"), raw_tensors=True
        )
        source = store.peek("src")
        store.rival = dataclasses.replace(  # a fork carries no create's print
            source,
            session_id="child",
            forked_from="src",
            created_at=123.0,
            created_by=None,
            lock=asyncio.Lock(),
        )
        fork = await service.fork_session("src", ForkSessionRequest(session_id="child"), raw_tensors=True)
        assert (fork.session_id, fork.forked_from, fork.created_at) == ("child", "src", 123.0)
        assert fork.observation == created.observation  # rendered for msgpack, like the create
        store.rival = dataclasses.replace(source, session_id="other", lock=asyncio.Lock())
        with pytest.raises(RolloutError) as err:  # a plain session that took the id is no fork
            await service.fork_session("src", ForkSessionRequest(session_id="other"))
        assert (err.value.code, err.value.committed_step_id) == ("session_exists", -1)
    finally:
        service.close()


# -- bug: a refused fork drew from its source's seed sequence ----------------------------------------------
def reset_start(seed: int) -> np.ndarray:
    """What the first unseeded reset of a session created with ``seed`` starts from."""
    drawn = int(np.random.default_rng(seed).integers(2**31))
    return ToyWorld()._initial(WorldInit(seed=drawn)).observation


def test_a_refused_fork_leaves_the_sources_next_reset_as_it_was() -> None:
    with server(ToyWorld(), max_rollout_sessions=2) as (http, _):
        create(http, "a", seed=0)
        create(http, "taken", seed=1)
        taken = http.post(f"{SESSIONS}/a/fork", json={"session_id": "taken"})
        assert (taken.status_code, taken.json()["error"]["reason"]) == (400, "session_exists")
        full = http.post(f"{SESSIONS}/a/fork", json={"session_id": "b"})
        assert (full.status_code, full.json()["error"]["reason"]) == (503, "at_capacity")
        full = http.post(f"{SESSIONS}/a/fork")
        assert (full.status_code, full.json()["error"]["reason"]) == (503, "at_capacity")
        reset = http.post(f"{SESSIONS}/a/reset")
        assert reset.status_code == 200, reset.text
        np.testing.assert_array_equal(latent(reset.json()["observation"]), reset_start(0))


# -- bug: errors of non-step routes said committed_step_id -1 for a session at step 2 ----------------------
BODY_LIMIT = 4096  # bytes of a request body: the create and step bodies here are far smaller
REFUSALS = {
    "malformed reset": ("post", "a/reset", {"json": {"seed": -1}}, "invalid_request"),
    "reset body not a map": ("post", "a/reset", {"json": [1]}, "invalid_request"),
    "malformed fork": ("post", "a/fork", {"json": {"session_id": "bad id!"}}, "invalid_request"),
    "fork onto a taken id": ("post", "a/fork", {"json": {"session_id": "other"}}, "session_exists"),
    "fork at capacity": ("post", "a/fork", {"json": {"session_id": "c"}}, "at_capacity"),
    # close and status ignore a body, but read it within the limit (BODY_LIMIT below)
    "close body over the limit": ("post", "a/close", {"content": b" " * 5000}, "payload_too_large"),
    "status body over the limit": ("get", "a/status", {"content": b" " * 5000}, "payload_too_large"),
    "reset of an unread media type": (
        "post",
        "a/reset",
        {"content": b"x", "headers": {"content-type": "text/csv"}},
        "unsupported_media_type",
    ),
}


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_errors_on_an_existing_session_carry_its_committed_step_id(mode: str) -> None:
    limits = WireLimits(max_frame_bytes=BODY_LIMIT)
    with server(ToyWorld(), max_rollout_sessions=2, limits=limits) as (http, _):
        http.headers[HEADER] = mode
        create(http, "a")
        create(http, "other")
        for t in range(3):
            step(http, "a", t)
        for name, (method, path, kwargs, code) in REFUSALS.items():
            resp = http.request(method.upper(), f"{SESSIONS}/{path}", **kwargs)
            error = resp.json()["error"]
            assert (error.get("reason") or error["code"], error["committed_step_id"]) == (code, 2), name
        status = http.get(f"{SESSIONS}/a/status").json()
        assert (status["committed_step_id"], status["context_length"]) == (2, 3)
        http.post(f"{SESSIONS}/a/close")
        refused = http.post(f"{SESSIONS}/a/reset", json={"seed": -1}).json()["error"]
        assert refused["committed_step_id"] == 2  # a closed session still knows where it stopped
        unknown = http.post(f"{SESSIONS}/nobody/reset", json={"seed": -1}).json()["error"]
        assert unknown["committed_step_id"] == -1


async def test_the_committed_step_id_an_error_body_reports() -> None:
    service = RolloutService(ToyWorld(), ServerSettings(max_batch_wait_ms=0.0))
    try:
        assert await service.committed_step_id("nobody") is None  # the route then answers -1
        await service.create_session(CreateSessionRequest(model="toy", seed=0, session_id="a"))
        assert await service.committed_step_id("a") == -1  # created, nothing stepped yet
    finally:
        service.close()


# -- bug: closed and expired sessions kept their observation and camera frames ------------------------------
RENDER = {"cameras": ["front", "wrist"], "height": 16, "width": 16}
FRAME_BYTES = 2 * 16 * 16 * 3  # both cameras' uint8 images
TENSOR_BYTES = 15 * 4  # a toy observation or state, float32


def held_bytes(session: RolloutSession) -> int:
    """Bytes of the distinct arrays a session still references (observation, frames, stored last
    result, state and root); an array shared by two of them counts once."""
    found: dict[int, np.ndarray] = {}

    def walk(value: Any) -> None:
        if isinstance(value, np.ndarray):
            found[id(value)] = value
        elif isinstance(value, tuple | list):
            for part in value:
                walk(part)
        elif isinstance(value, dict):
            walk(list(value.values()))
        elif dataclasses.is_dataclass(value) and not isinstance(value, RenderSpec):
            walk([getattr(value, f.name) for f in dataclasses.fields(value)])

    walk([session.observation, session.frames, session.last, session.state, session.root])
    return sum(a.nbytes for a in found.values())


def test_closed_and_expired_sessions_keep_only_what_status_needs() -> None:
    clock = Clock()
    with server(CameraWorld(), clock=clock, rollout_idle_ttl_s=60.0) as (http, service):
        for sid in ("closed", "expired"):
            create(http, sid, render=RENDER)
            step(http, sid, 0)
            step(http, sid, 1)
        store = service.store
        tombs = {sid: store.peek(sid) for sid in ("closed", "expired")}
        # the frames and the observation (the stored last result's too), the committed state, the root
        assert [held_bytes(s) for s in tombs.values()] == [FRAME_BYTES + 3 * TENSOR_BYTES] * 2
        closed = http.post(f"{SESSIONS}/closed/close").json()
        assert (closed["closed"], closed["committed_step_id"]) == (True, 1)
        clock.now += 61.0
        for sid, reason in (("closed", "closed"), ("expired", "expired")):
            status = http.get(f"{SESSIONS}/{sid}/status")
            assert status.status_code == 200, status.text
            body = status.json()
            assert (body["committed_step_id"], body["context_length"]) == (1, 2)
            assert (body["closed"], body["closed_reason"], body["model"]) == (True, reason, "toy")
        for tomb in tombs.values():
            assert store.peek(tomb.session_id) is tomb
            assert held_bytes(tomb) == 0
            assert (tomb.observation, tomb.frames, tomb.last, tomb.seeds, tomb.render) == (None,) * 5
        again = http.post(f"{SESSIONS}/closed/close").json()
        assert (again["closed"], again["committed_step_id"]) == (True, 1)
        gone = http.post(f"{SESSIONS}/expired/step", json={"step_id": 2, "observation": {}, "action": ACTION})
        assert (gone.json()["error"]["code"], gone.json()["error"]["committed_step_id"]) == (
            "session_expired",
            1,
        )
