"""The rollout session store: capacity, idle expiry (never of a busy session), tombstones, ids."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from manual_clock import Clock

from rollserve.server.rollout.store import (
    Commit,
    Frames,
    RolloutError,
    RolloutSession,
    RolloutStore,
    StepRecord,
)


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
    clock = Clock(0.0)
    store = RolloutStore(capacity=1, idle_ttl_s=10.0, clock=clock)
    a = session(store)
    a.committed_step_id = 4
    clock.now = 10.5
    assert code_of(store.get, a.session_id) == "session_expired"
    tomb = store.get(a.session_id, include_closed=True)
    assert tomb.closed_reason == "expired" and tomb.committed_step_id == 4 and tomb.state is None
    session(store)  # the slot is free again


async def test_a_busy_session_does_not_expire() -> None:
    clock = Clock(0.0)
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


def test_refusals_name_the_session_and_the_capacity() -> None:
    store = RolloutStore(capacity=1, idle_ttl_s=10.0)
    session(store, "a")
    with pytest.raises(RolloutError) as err:
        store.reserve("a")
    assert (
        str(err.value) == "session_exists: session 'a' already exists" and err.value.committed_step_id == -1
    )
    with pytest.raises(RolloutError) as err:
        store.reserve("b")
    assert err.value.message == "the server holds its maximum of 1 rollout sessions; close some"
    for call in (store.get, store.close):
        with pytest.raises(RolloutError) as err:
            call("zz")
        assert (err.value.code, err.value.message) == ("session_not_found", "session 'zz' does not exist")
    with pytest.raises(ValueError) as bad:
        RolloutStore(capacity=0, idle_ttl_s=10.0)
    assert str(bad.value) == "capacity must be >= 1"


def test_expiry_is_strictly_after_the_ttl_and_frees_a_slot_at_capacity() -> None:
    clock = Clock(0.0)
    store = RolloutStore(capacity=1, idle_ttl_s=10.0, clock=clock)
    a = session(store, "a")
    a.committed_step_id = 2
    clock.now = 10.0  # idle exactly the TTL: still alive, and the look-up restarts its idle clock
    assert store.get("a") is a
    clock.now = 19.5
    assert store.get("a") is a
    clock.now = 29.25
    assert store.sweep() == []  # idle 9.75 s
    clock.now = 29.75  # expired, but only 0.5 s after the last sweep: the reserve's own sweep is forced
    sid = store.reserve(None)  # a full store evicts an expired session first
    assert sid != "a" and len(sid) == 32
    with pytest.raises(RolloutError) as err:
        store.get("a")
    assert (err.value.code, err.value.message, err.value.committed_step_id) == (
        "session_expired",
        "session 'a' is expired",
        2,
    )
    assert store.get("a", include_closed=True).closed_reason == "expired"


def test_unforced_sweeps_run_at_most_every_quarter_ttl() -> None:
    clock = Clock(0.0)
    store = RolloutStore(capacity=4, idle_ttl_s=10.0, clock=clock)
    a, b = session(store, "a"), session(store, "b")
    clock.now = 0.5
    store.touch(b)
    clock.now = 10.25
    assert store.sweep() == ["a"]
    clock.now = 10.75  # b is idle 10.25 s now, but the last sweep was only 0.5 s ago
    assert store.sweep() == []
    assert not b.closed
    clock.now = 12.5  # 2.25 s after: still too soon
    assert store.sweep() == []
    clock.now = 12.75  # 2.5 s (a quarter TTL) after the last sweep
    assert store.sweep() == ["b"]
    assert a.closed_reason == b.closed_reason == "expired"


def test_a_closed_session_is_not_touched_and_does_not_commit() -> None:
    clock = Clock(0.0)
    store = RolloutStore(capacity=2, idle_ttl_s=10.0, clock=clock)
    a = session(store, "a")
    store.close("a")
    clock.now = 5.0
    store.touch(a)
    assert a.last_used == 0.0
    change = Commit((0, -1), "T", np.ones(1, np.float32), 0, 1, None, 0)
    assert asyncio.run(store.commit(a, change)) is False
    assert a.committed_step_id == -1


def test_a_commit_lands_only_on_the_state_it_was_planned_against() -> None:
    store = RolloutStore(capacity=2, idle_ttl_s=10.0)
    a = session(store, "a")
    seeds = a.seeds
    step = Commit((0, -1), "T1", np.ones(1, np.float32), 0, 1, None, 0)
    assert asyncio.run(store.commit(a, step)) is True
    assert (a.state, a.root, a.committed_step_id, a.context_length, a.epoch) == ("T1", "S", 0, 1, 0)
    assert a.seeds is seeds  # a step keeps the episode start and seeds
    assert asyncio.run(store.commit(a, step)) is False  # planned against (0, -1): stale now
    new_seeds = np.random.default_rng(1)
    reset = Commit((0, 0), "R", np.zeros(1, np.float32), -1, 0, None, 1, root="R", seeds=new_seeds)
    assert asyncio.run(store.commit(a, reset)) is True
    assert (a.state, a.root, a.committed_step_id, a.epoch) == ("R", "R", -1, 1) and a.seeds is new_seeds
    stale = Commit((0, -1), "T2", np.ones(1, np.float32), 0, 1, None, 0)  # same step id, older epoch
    assert asyncio.run(store.commit(a, stale)) is False


def test_the_default_tombstone_bound_is_4096() -> None:
    store = RolloutStore(capacity=1, idle_ttl_s=10.0)
    ids = [store.close(session(store).session_id).session_id for _ in range(4097)]
    assert store.peek(ids[0]) is None and store.peek(ids[1]) is not None


def test_a_session_cannot_be_added_twice() -> None:
    store = RolloutStore(capacity=4, idle_ttl_s=10.0)
    a = session(store, "a")
    twin = RolloutSession("a", "toy", "world_model_env", 0.0, "T", "T", np.zeros(1, np.float32), a.seeds)
    with pytest.raises(RolloutError) as err:
        store.add(twin)
    assert err.value.code == "session_exists" and store.get("a") is a


def test_a_lookup_between_sweeps_still_expires_an_idle_session() -> None:
    clock = Clock(0.0)
    store = RolloutStore(capacity=4, idle_ttl_s=10.0, clock=clock)
    a = session(store, "a")
    a.committed_step_id = 1
    clock.now = 9.0
    assert store.sweep() == []
    clock.now = 10.5  # expired; the last sweep was 1.5 s ago, so the look-up checks this session itself
    with pytest.raises(RolloutError) as err:
        store.get("a")
    assert (err.value.code, err.value.committed_step_id) == ("session_expired", 1)
    assert len(store) == 0 and a.closed_reason == "expired" and a.state is None


def held_bytes(s: RolloutSession) -> int:
    """Bytes of the distinct arrays a session references through its observation, frames and last."""
    last = s.last
    arrays = [s.observation, last and last.observation]
    for frames in (s.frames, last and last.frames):
        if frames is not None:
            arrays += [frames.vector, *(frames.images or {}).values()]
    return sum(a.nbytes for a in {id(a): a for a in arrays if isinstance(a, np.ndarray)}.values())


def test_a_tombstone_keeps_only_what_status_needs() -> None:
    clock = Clock(0.0)
    store = RolloutStore(capacity=4, idle_ttl_s=10.0, clock=clock)
    images = {"front": np.zeros((64, 64, 3), np.uint8), "wrist": np.zeros((64, 64, 3), np.uint8)}
    frames = Frames(vector=np.zeros(13, np.float32), images=images)
    last = StepRecord(3, "print", np.zeros(1024, np.float32), 0.0, False, None, {}, frames=frames)
    for sid in ("closed", "expired"):
        s = session(store, sid)
        s.observation, s.frames, s.last, s.render = np.zeros(1024, np.float32), frames, last, "spec"
        s.committed_step_id, s.context_length, s.forked_from = 3, 4, "parent"
        assert held_bytes(s) == 4096 + 4096 + 13 * 4 + 2 * 64 * 64 * 3  # 32,820 bytes
    store.close("closed")
    clock.now = 10.5
    store.sweep(force=True)
    for sid, reason in (("closed", "closed"), ("expired", "expired")):
        tomb = store.get(sid, include_closed=True)
        kept = (tomb.session_id, tomb.model, tomb.committed_step_id, tomb.context_length, tomb.closed_reason)
        assert kept == (sid, "toy", 3, 4, reason)
        assert held_bytes(tomb) == 0
        freed = (tomb.state, tomb.root, tomb.observation, tomb.frames, tomb.last, tomb.seeds, tomb.render)
        assert freed == (None,) * 7
