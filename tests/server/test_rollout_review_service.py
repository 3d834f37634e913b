"""Reviewers' findings on the rollout service, each over the real server where a client would see it:
per-batch world metrics, the open-sessions gauge of an idle server, the episode start a step 0 chose,
the world's aliases in ``/v1/models``, and a create that reuses an id with another body.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
from manual_clock import Clock
from prometheus_client.parser import text_string_to_metric_families

from rollserve.client.rollout_client import decode_observation
from rollserve.models.world import WorldInit, WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.metrics import METRICS
from rollserve.server.rollout.protocol import (
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    RolloutStepRequest,
)
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.store import RolloutStore
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import unpackb
from rollserve.wire.limits import WireLimits

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
TTL = 60.0
BAD_SEED = 13  # a start the world fails
BROKEN = 0.625  # a first joint the world's step fails on


class CountingWorld(ToyWorld):
    """The toy world, recording each model call's size; steps wait at ``gate`` while it is set, and a
    start with ``BAD_SEED`` and a step with a first joint of ``BROKEN`` fail."""

    spec = dataclasses.replace(ToyWorld.spec, aliases=("toy-v2",))

    def __init__(self) -> None:
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.init_calls: list[int] = []
        self.step_calls: list[int] = []

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        self.init_calls.append(len(inits))
        outs = super().initial_states(inits)
        failed = RuntimeError("no start")
        return [failed if i.seed == BAD_SEED else o for i, o in zip(inits, outs, strict=True)]

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        self.step_calls.append(len(steps))
        self.entered.set()
        gate = self.gate
        if gate is not None:
            gate.wait(10.0)
        outs = super().step_batch(steps)
        failed = RuntimeError("device-side assert")
        return [failed if s.action[0] == np.float32(BROKEN) else o for s, o in zip(steps, outs, strict=True)]


@contextlib.contextmanager
def server(
    world: Any, clock: Callable[[], float] = time.monotonic, **settings: Any
) -> Iterator[tuple[httpx.Client, RolloutService]]:
    config = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=TTL, **settings)
    service = RolloutService(world, config, clock=clock)
    with (
        serving(create_app(config, rollout=service)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as http,
    ):
        yield http, service


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


def create(http: httpx.Client, sid: str, seed: int = 0, **extra: Any) -> dict:
    return ok(http.post(SESSIONS, json={"model": "toy", "seed": seed, "session_id": sid, **extra}))


def step_body(step_id: int, *, context: bool = True, **extra: Any) -> dict:
    return {
        "step_id": step_id,
        "observation": {"extra": extra},
        "action": ACTION,
        "use_session_context": context,
    }


def step(http: httpx.Client, sid: str, step_id: int, *, context: bool = True, **extra: Any) -> dict:
    body = ok(http.post(f"{SESSIONS}/{sid}/step", json=step_body(step_id, context=context, **extra)))
    assert body["error"] is None, body
    return body


def latent(observation: dict) -> np.ndarray:
    data = base64.b64decode(observation["video_latent"])
    return np.frombuffer(data, dtype="<f4").reshape(observation["shape"])


def scrape(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, by name and labels."""
    text = ok_text(http.get("/metrics"))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def ok_text(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.text


WORLD = (("kind", "world"),)
ROLLOUT = (("kind", "rollout"),)


def open_sessions(http: httpx.Client) -> float:
    return scrape(http)[("rollserve_active_sessions", ROLLOUT)]


def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# -- finding 1: the body deadline (routes) defaults to the header deadline ------------------------------
def test_the_body_deadline_defaults_to_the_header_deadline() -> None:
    service = RolloutService(ToyWorld(), ServerSettings(header_timeout_s=3.5))
    chosen = RolloutService(ToyWorld(), ServerSettings(header_timeout_s=3.5), body_timeout_s=0.5)
    try:
        assert (service.body_timeout_s, chosen.body_timeout_s) == (3.5, 0.5)
    finally:
        service.close()
        chosen.close()


# -- finding 2: world inference time and batch size were recorded once per request ----------------------
def test_concurrent_steps_batched_into_one_world_call_are_recorded_once() -> None:
    n = 5
    world = CountingWorld()
    with server(world) as (http, service):
        sids = [create(http, f"m{i}", seed=i)["session_id"] for i in range(n + 1)]
        before = scrape(http)
        world.step_calls.clear()
        world.gate = threading.Event()
        answers: list[dict] = []

        def send(sid: str) -> None:
            with httpx.Client(base_url=http.base_url, timeout=30.0) as own:  # one client per thread
                answers.append(step(own, sid, 0))

        first = threading.Thread(target=send, args=(sids[0],))
        first.start()
        assert world.entered.wait(10.0)  # the engine is busy with the first step
        rest = [threading.Thread(target=send, args=(sid,)) for sid in sids[1:]]
        for thread in rest:
            thread.start()
        until(lambda: service.engine.queue_depth == n)  # all queued behind it: one batch of n next
        world.gate.set()
        for thread in [first, *rest]:
            thread.join(30.0)
        after = scrape(http)
    assert len(answers) == n + 1
    assert world.step_calls == [1, n]  # the world's own count of its calls

    def grew(name: str) -> float:
        return after[(name, WORLD)] - before[(name, WORLD)]

    assert grew("rollserve_batch_size_count") == 2  # one per world call, not one per request
    assert grew("rollserve_batch_size_sum") == 1 + n
    assert grew("rollserve_inference_seconds_count") == 2
    assert sorted(a["model_metadata"]["batch_size"] for a in answers) == [1] + [n] * n


# -- finding 3: the open-sessions gauge kept counting expired sessions --------------------------------------
def test_the_gauge_drops_expired_sessions_with_no_request_but_the_scrape() -> None:
    clock = Clock()
    with server(CountingWorld(), clock=clock) as (http, _):
        for i in range(3):
            create(http, f"g{i}", seed=i)
        assert open_sessions(http) == 3
        clock.now += TTL / 2
        step(http, "g0", 0)  # g0 was used: its idle clock starts again
        clock.now += TTL / 2 + 1  # g1 and g2 idle for TTL + 1, g0 for TTL / 2 + 1
        assert open_sessions(http) == 1
        status = ok(http.get(f"{SESSIONS}/g1/status"))
        assert (status["closed"], status["closed_reason"]) == (True, "expired")
        clock.now += TTL  # g0 idle for TTL * 1.5 + 1 now
        assert open_sessions(http) == 0
        create(http, "g3")
        assert open_sessions(http) == 1


def test_the_gauge_counts_a_session_idle_for_exactly_its_ttl() -> None:
    clock = Clock()
    with server(CountingWorld(), clock=clock) as (http, _):
        create(http, "e0")
        clock.now += TTL  # not longer than the TTL: still open (the store's rule)
        assert open_sessions(http) == 1
        clock.now += 0.5
        assert open_sessions(http) == 0


class RemoteStore:
    """A store that holds its sessions elsewhere (as ``rollserve.scale`` does): the service can only
    ``await`` its count, so a scrape reports the last count the service asked for."""

    def __init__(self, inner: RolloutStore) -> None:
        self.inner, self.capacity = inner, inner.capacity
        self.counts = 0

    async def claim(self, session_id):  # type: ignore[no-untyped-def]
        return await self.inner.claim(session_id)

    async def insert(self, session):  # type: ignore[no-untyped-def]
        return await self.inner.insert(session)

    async def open(self, session_id, *, include_closed=False):  # type: ignore[no-untyped-def]
        return await self.inner.open(session_id, include_closed=include_closed)

    async def find(self, session_id):  # type: ignore[no-untyped-def]
        return await self.inner.find(session_id)

    async def commit(self, session, change):  # type: ignore[no-untyped-def]
        return await self.inner.commit(session, change)

    async def retire(self, session_id):  # type: ignore[no-untyped-def]
        return await self.inner.retire(session_id)

    async def count(self) -> int:
        self.counts += 1
        return await self.inner.count()


async def test_a_store_the_scrape_cannot_ask_reports_its_last_count() -> None:
    clock = Clock()
    store = RemoteStore(RolloutStore(8, TTL, clock=clock))
    service = RolloutService(CountingWorld(), ServerSettings(max_batch_wait_ms=0.0), store=store)
    gauge = METRICS.registry.get_sample_value
    labels = {"kind": "rollout"}
    try:
        assert gauge("rollserve_active_sessions", labels) == 0
        for i in range(2):
            await service.create_session(CreateSessionRequest(model="toy", seed=i, session_id=f"r{i}"))
        assert (store.counts, gauge("rollserve_active_sessions", labels)) == (2, 2)
        clock.now += TTL + 1
        assert gauge("rollserve_active_sessions", labels) == 2  # nobody asked the store since
        await service.close_session("r0")
        assert (store.counts, gauge("rollserve_active_sessions", labels)) == (3, 0)  # both expired
    finally:
        service.close()


def test_a_gone_service_counts_no_sessions() -> None:
    service = RolloutService(CountingWorld(), ServerSettings(max_batch_wait_ms=0.0))
    asyncio.run(service.create_session(CreateSessionRequest(model="toy", seed=0)))
    assert METRICS.registry.get_sample_value("rollserve_active_sessions", {"kind": "rollout"}) == 1
    service.close()
    del service
    gc.collect()
    assert METRICS.registry.get_sample_value("rollserve_active_sessions", {"kind": "rollout"}) == 0


# -- finding 4: a stateless step ignored the start a step 0 chose ------------------------------------------
def test_a_stateless_step_starts_where_a_seeded_step_0_started_the_episode() -> None:
    with server(CountingWorld()) as (http, _):
        create(http, "ref5", seed=5)
        create(http, "ref0", seed=0)
        from5 = latent(step(http, "ref5", 0)["next_observation"])
        from0 = latent(step(http, "ref0", 0)["next_observation"])
        assert not np.array_equal(from5, from0)  # the two starts differ, so the checks below tell

        create(http, "s", seed=0)
        scratch = latent(step(http, "s", 7, context=False, seed=5)["next_observation"])
        np.testing.assert_array_equal(scratch, from5)  # a stateless step's own seed ...
        plain = latent(step(http, "s", 7, context=False)["next_observation"])
        np.testing.assert_array_equal(plain, from0)  # ... does not move the episode's start
        first = latent(step(http, "s", 0, seed=5)["next_observation"])
        np.testing.assert_array_equal(first, from5)
        after = latent(step(http, "s", 99, context=False)["next_observation"])
        np.testing.assert_array_equal(after, from5)

        ok(http.post(f"{SESSIONS}/s/fork", json={"session_id": "s-fork"}))
        forked = latent(step(http, "s-fork", 99, context=False)["next_observation"])
        np.testing.assert_array_equal(forked, from5)  # a fork keeps its source's start

        step(http, "s", 1, seed=0)  # a running context ignores start conditions: the start stays
        np.testing.assert_array_equal(latent(step(http, "s", 9, context=False)["next_observation"]), from5)

        ok(http.post(f"{SESSIONS}/s/reset", json={"seed": 0}))  # a reset starts a new episode
        np.testing.assert_array_equal(latent(step(http, "s", 9, context=False)["next_observation"]), from0)


def test_a_step_0_without_start_conditions_keeps_the_creates_start() -> None:
    with server(CountingWorld()) as (http, _):
        create(http, "ref", seed=3)
        from3 = latent(step(http, "ref", 0)["next_observation"])
        create(http, "p", seed=3)
        step(http, "p", 0)
        np.testing.assert_array_equal(latent(step(http, "p", 5, context=False)["next_observation"]), from3)


async def test_one_batch_keeps_one_start_call_and_one_step_call_whatever_starts_fresh() -> None:
    """A batch mixing a step from a fresh context, a plain step, a fresh start that fails, a step from
    a fresh context that fails and a create: one ``initial_states`` call (the four starts) and one
    ``step_batch`` call (the three steps whose start did not fail)."""
    world = CountingWorld()
    service = RolloutService(world, ServerSettings(max_batch_wait_ms=0.0))
    try:
        for s in (0, 1, 2, 3):
            await service.create_session(CreateSessionRequest(model="toy", seed=s, session_id=f"b{s}"))
        ref = await service.create_session(CreateSessionRequest(model="toy", seed=5))
        world.init_calls.clear()
        world.step_calls.clear()
        world.gate = threading.Event()
        blocker = asyncio.ensure_future(service.step(ref.session_id, request(0)))
        while not world.entered.is_set():
            await asyncio.sleep(0.005)
        items = [
            BatchStepItem(session_id="b0", **request(0, seed=5).model_dump()),
            BatchStepItem(session_id="b1", **request(0).model_dump()),
            BatchStepItem(session_id="b2", **request(0, seed=BAD_SEED).model_dump()),
            BatchStepItem(session_id="b3", **request(0, BROKEN, seed=5).model_dump()),
        ]
        batch = asyncio.ensure_future(service.batch_step(BatchStepRequest(items=items)))
        created = asyncio.ensure_future(service.create_session(CreateSessionRequest(model="toy", seed=7)))
        while service.engine.queue_depth < 5:
            await asyncio.sleep(0.005)
        world.gate.set()
        first = await blocker
        answers = (await batch).results
        await created
        assert world.init_calls == [4] and world.step_calls == [1, 3]
        codes = [a.error.code if a.error else "ok" for a in answers]
        assert codes == ["ok", "ok", "inference_error", "inference_error"]
        assert answers[2].error.message == "world step failed: RuntimeError: no start"
        assert answers[3].error.message == "world step failed: RuntimeError: device-side assert"
        committed = [(await service.get_status(f"b{s}")).committed_step_id for s in (0, 1, 2, 3)]
        assert committed == [0, 0, -1, -1]
        stateless = [
            (await service.step(f"b{s}", request(9, context=False))).next_observation for s in (0, 2)
        ]
        assert stateless[0]["video_latent"] == first.next_observation["video_latent"]  # b0's start: seed 5
        assert stateless[1]["video_latent"] != stateless[0]["video_latent"]  # b2 kept its create's start
        assert answers[0].next_observation["video_latent"] == first.next_observation["video_latent"]
    finally:
        service.close()


def request(step_id: int, joint: float = 0.1, *, context: bool = True, **extra: Any) -> RolloutStepRequest:
    body = step_body(step_id, context=context, **extra)
    body["action"] = {**ACTION, "joint_positions": [joint] * 7}
    return RolloutStepRequest.model_validate(body)


# -- finding 5: the world's aliases were not published -----------------------------------------------------
def test_models_lists_the_worlds_aliases() -> None:
    with server(CountingWorld()) as (http, _):
        (entry,) = ok(http.get("/v1/models"))["data"]
        assert (entry["id"], entry["aliases"], entry["kind"]) == ("toy", ["toy-v2"], "world")
        assert create(http, "by-alias", model="toy-v2")["model"] == "toy"


# -- finding 6: a create reusing an id with another body was answered as a retry -----------------------------
@pytest.mark.parametrize(
    "other",
    [
        {"seed": 8},
        {"seed": None},
        {"model": "toy-v2"},
        {"render": {"cameras": ["front"]}},
    ],
    ids=["seed", "no seed", "alias", "render"],
)
def test_a_create_with_another_body_under_a_taken_id_is_session_exists(other: dict) -> None:
    world = CountingWorld()
    world.spec = dataclasses.replace(CountingWorld.spec, cameras=("front",))
    with server(world) as (http, _):
        body = {"model": "toy", "seed": 7, "session_id": "c"}
        first = ok(http.post(SESSIONS, json=body))
        for t in range(3):
            step(http, "c", t)
        taken = http.post(SESSIONS, json={**body, **other})
        error = taken.json()["error"]
        assert (taken.status_code, error["reason"], error["committed_step_id"]) == (400, "session_exists", 2)
        again = ok(http.post(SESSIONS, json=body))  # the same body is still the retry it is
        assert (again["session_id"], again["created_at"], again["committed_step_id"]) == (
            "c",
            first["created_at"],
            2,
        )


def test_an_identical_create_gets_the_first_answer_on_either_wire() -> None:
    with server(CountingWorld()) as (http, _):
        body = {"model": "toy", "session_id": "u"}  # unseeded: the server draws the seed once
        first = ok(http.post(SESSIONS, json=body))
        assert ok(http.post(SESSIONS, json=body)) == first
        packed = http.post(SESSIONS, content=msgpack.packb(body), headers=MSGPACK)
        assert packed.status_code == 200
        again = unpackb(packed.content, WireLimits())
        assert (again["session_id"], again["created_at"]) == ("u", first["created_at"])
        tensor = decode_observation(again["observation"]).tensor
        np.testing.assert_array_equal(tensor, latent(first["observation"]))
