"""The rollout session store: capacity, idle expiry (never of a busy session), tombstones, ids."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.server.rollout.store import RolloutError, RolloutSession, RolloutStore


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def session(store: RolloutStore, sid: str | None = None) -> RolloutSession:
    s = RolloutSession(
        session_id=store.reserve(sid),
        model="toy",
        mode="world_model_env",
        created_at=0.0,
        state="S",
        root="S",
        observation=np.zeros(1, np.float32),
        seeds=np.random.default_rng(0),
    )
    return store.add(s)


def code_of(call, *args, **kwargs) -> str:
    with pytest.raises(RolloutError) as err:
        call(*args, **kwargs)
    return err.value.code


def test_capacity_refuses_new_sessions_but_never_evicts_live_ones() -> None:
    store = RolloutStore(capacity=2, idle_ttl_s=60.0)
    a, b = session(store), session(store)
    assert code_of(store.reserve, None) == "at_capacity"
    assert store.get(a.session_id) is a and store.get(b.session_id) is b


def test_idle_sessions_expire_and_leave_a_tombstone() -> None:
    clock = Clock()
    store = RolloutStore(capacity=1, idle_ttl_s=10.0, clock=clock)
    a = session(store)
    a.committed_step_id = 4
    clock.now = 10.5
    assert code_of(store.get, a.session_id) == "session_expired"
    tomb = store.get(a.session_id, include_closed=True)
    assert tomb.closed_reason == "expired" and tomb.committed_step_id == 4 and tomb.state is None
    session(store)  # the slot is free again


async def test_a_busy_session_does_not_expire() -> None:
    clock = Clock()
    store = RolloutStore(capacity=2, idle_ttl_s=10.0, clock=clock)
    a = session(store)
    async with a.lock:  # a step is waiting on the model
        clock.now = 100.0
        assert store.sweep(force=True) == []
    assert store.sweep(force=True) == [a.session_id]


def test_close_is_idempotent_and_keeps_status() -> None:
    store = RolloutStore(capacity=4, idle_ttl_s=10.0)
    a = session(store)
    store.close(a.session_id)
    assert store.close(a.session_id).closed_reason == "closed"
    assert len(store) == 0
    assert code_of(store.get, a.session_id) == "session_closed"
    assert code_of(store.close, "never-was") == "session_not_found"


def test_ids_are_unique_and_chosen_ids_cannot_be_reused() -> None:
    store = RolloutStore(capacity=8, idle_ttl_s=10.0)
    ids = {session(store).session_id for _ in range(5)}
    assert len(ids) == 5
    session(store, "mine")
    assert code_of(store.reserve, "mine") == "session_exists"
    store.close("mine")
    assert code_of(store.reserve, "mine") == "session_exists"


def test_tombstones_are_bounded() -> None:
    store = RolloutStore(capacity=4, idle_ttl_s=10.0, max_tombstones=3)
    ids = [session(store).session_id for _ in range(4)]
    for sid in ids:
        store.close(sid)
    assert store.peek(ids[0]) is None
    assert all(store.peek(sid) is not None for sid in ids[1:])
