"""A create whose client-chosen id is taken reports the committed step of the session that holds it.

Every rollout error body carries ``committed_step_id``: -1 only when the session does not exist
(docs/rollout.md, Rules). A create refused with ``session_exists`` names an existing session (a
fork, or a closed one), so it must report that session's step, in both status-code modes and in
both body encodings, while a create retried after a lost reply still gets its session back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import msgpack
import numpy as np
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.store import RolloutError, RolloutSession, RolloutStore
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
# the session_exists row of docs/rollout.md's status-code table
SESSION_EXISTS_STATUS = {"vllm-omni": 400, "strict": 409}


@contextlib.contextmanager
def server(mode: str) -> Iterator[httpx.Client]:
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes=mode)
    with (
        serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as http,
    ):
        yield http


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


def steps(http: httpx.Client, sid: str, step_ids: range) -> None:
    for t in step_ids:
        step = {"step_id": t, "observation": {}, "action": ACTION}
        body = ok(http.post(f"{SESSIONS}/{sid}/step", json=step))
        assert body["model_metadata"]["committed_step_id"] == t


def refusal(resp: httpx.Response) -> tuple[int, str, int]:
    """(status, typed code, committed_step_id) of a non-step error body in either mode."""
    packed = resp.headers["content-type"].startswith(MSGPACK["accept"])
    body = msgpack.unpackb(resp.content) if packed else resp.json()
    error = body["error"]
    code = error["reason"] if isinstance(error["code"], int) else error["code"]
    return resp.status_code, code, error["committed_step_id"]


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_create_onto_a_taken_id_reports_that_sessions_committed_step(mode: str) -> None:
    status = SESSION_EXISTS_STATUS[mode]
    with server(mode) as http:
        ok(http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": "a"}))
        steps(http, "a", range(3))  # a: committed 2
        ok(http.post(f"{SESSIONS}/a/fork", json={"session_id": "f"}))  # f: a fork at a's step 2
        steps(http, "f", range(3, 5))  # f: committed 4

        # a live fork holds the id: a plain create is not a retry of it
        taken = http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": "f"})
        assert refusal(taken) == (status, "session_exists", 4)
        packed = msgpack.packb({"model": "toy", "session_id": "f"})
        taken = http.post(SESSIONS, content=packed, headers=MSGPACK)
        assert refusal(taken) == (status, "session_exists", 4)

        # a closed session keeps its id (and its tombstone its step)
        ok(http.post(f"{SESSIONS}/a/close"))
        taken = http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": "a"})
        assert refusal(taken) == (status, "session_exists", 2)

        # an id nobody holds is no conflict: the new session starts at -1
        fresh = ok(http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": "new"}))
        assert fresh["committed_step_id"] == -1


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_create_retried_after_a_lost_reply_still_gets_its_session(mode: str) -> None:
    with server(mode) as http:
        body = {"model": "toy", "seed": 7, "session_id": "r"}
        first = ok(http.post(SESSIONS, json=body))
        again = ok(http.post(SESSIONS, json=body))  # the first reply was lost
        assert again == first
        assert (again["session_id"], again["committed_step_id"]) == ("r", -1)


def test_the_store_refuses_a_taken_id_with_the_holders_committed_step() -> None:
    store = RolloutStore(capacity=4, idle_ttl_s=10.0)
    held = RolloutSession("a", "toy", "world_model_env", 0.0, "S", "S", np.zeros(1, np.float32), None)
    held.committed_step_id = 5
    store.add(held)
    for attempt in (lambda: store.reserve("a"), lambda: store.add(held)):
        with pytest.raises(RolloutError) as err:
            attempt()
        assert (err.value.code, err.value.committed_step_id) == ("session_exists", 5)
    store.close("a")
    with pytest.raises(RolloutError) as err:
        store.reserve("a")
    assert (err.value.code, err.value.committed_step_id) == ("session_exists", 5)  # the tombstone's
    assert store.reserve("b") == "b"
