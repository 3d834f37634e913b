"""The shared store's gaps a mutation review found: a replica's view cache (what crosses the wire on
``open``, its LRU bound, views refreshed in place and never served again once closed), refusals that
carry the retired session's counters, a table that restarts empty under a step in flight, and the
table's plain-tuple answers and counters. Real ``SessionTable``s and ``RolloutService`` replicas in
one process (no Ray), as in ``test_shared_store``."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest
from test_shared_store import LocalTable, new_session, replica, single, step_req
from test_shared_store_forks import HookedTable

import rollserve.scale.store as store_module
from rollserve.models.worlds import ToyWorld
from rollserve.scale.store import SharedRolloutStore
from rollserve.scale.table import SessionTable, change_of, to_record
from rollserve.server.rollout.protocol import CreateSessionRequest, ForkSessionRequest
from rollserve.server.rollout.store import Commit, RolloutError, RolloutSession, RolloutStore

# what docs/scale-out.md says a current view is answered with: five counters and the seed sequence
COUNTERS_ONLY = {"epoch", "committed_step_id", "context_length", "closed_reason", "last_used", "seeds"}


class AnsweredTable(HookedTable):
    """A :class:`HookedTable` that also keeps every ``open`` answer, to see what crossed the wire."""

    def __init__(self, table: SessionTable) -> None:
        super().__init__(table)
        self.opened: list[Any] = []

    async def __call__(self, method: str, *args: Any) -> Any:
        answer = await super().__call__(method, *args)
        if method == "open":
            self.opened.append(answer)
        return answer


def _session(sid: str, seed: int = 0) -> RolloutSession:
    return RolloutSession(
        sid, "toy", "m", 0.0, f"{sid}-state", "s0", np.zeros(2), np.random.default_rng(seed)
    )


def _step(base: tuple[int, int], step: int) -> Commit:
    return Commit(base, f"state{step}", np.zeros(2, np.float32), step, step + 1, None, base[0])


def _fields(store: SharedRolloutStore) -> set[str]:
    """The fields of the last ``open`` answer ``store`` got."""
    return set(store._call.opened[-1][1])


# -- what an open sends and gets -------------------------------------------------------------------------
async def test_a_replicas_current_view_gets_counters_only_and_a_stale_one_the_whole_record() -> None:
    """Affinity saves the state's bytes: a view is kept from a replica's first open of a session it
    never served, and while it is current the table answers with the counters alone."""
    table = SessionTable(4, 60.0)
    a, b = SharedRolloutStore(AnsweredTable(table), 4), SharedRolloutStore(AnsweredTable(table), 4)
    await a.insert(_session("x"))
    first = await b.open("x")
    assert "state" in _fields(b) and first.state == "x-state"  # b had no view: the whole record
    again = await b.open("x")
    assert _fields(b) == COUNTERS_ONLY and again is first and again.state == "x-state"
    assert await a.commit(await a.open("x"), _step((0, -1), 0))  # a commits: b's view is stale
    moved = await b.open("x")
    assert "state" in _fields(b) and moved is first
    assert (moved.state, moved.committed_step_id) == ("state0", 0)


async def test_a_view_evicted_while_its_counters_were_asked_is_refreshed_in_place() -> None:
    """The counters alone cannot make a view: one the cache dropped during the round trip is kept
    again and brought up to date, state and all, as the object the caller already holds."""
    table = SessionTable(4, 60.0)
    call = AnsweredTable(table)
    store = SharedRolloutStore(call, 4, max_views=1)
    view = await store.insert(_session("x"))
    other = SharedRolloutStore(LocalTable(table), 4)
    await other.insert(_session("y"))

    async def open_y_meanwhile() -> None:  # the only place in the cache goes to y
        await store.open("y")

    call.hooks["open"] = open_y_meanwhile
    got = await store.open("x")
    assert "open" not in call.hooks and _fields(store) == COUNTERS_ONLY  # x's view was current when asked
    assert got is view and (got.session_id, got.state) == ("x", "x-state")
    await store.open("x")
    assert _fields(store) == COUNTERS_ONLY  # kept again: still the one view in the cache


async def test_the_view_cache_drops_the_least_recently_used_but_never_a_locked_view() -> None:
    table = SessionTable(8, 60.0)
    store = SharedRolloutStore(AnsweredTable(table), 8, max_views=2)
    for sid in ("a", "b", "c"):
        await store.insert(_session(sid))
    await store.open("a")
    assert "state" in _fields(store)  # a, the oldest, was dropped for c
    for sid in ("c", "a"):
        await store.open(sid)
        assert _fields(store) == COUNTERS_ONLY  # two views kept: c and a
    busy = await store.open("c")
    async with busy.lock:  # a request is using c's view
        for sid in ("d", "e"):
            await store.insert(_session(sid))
        await store.open("c")
        assert _fields(store) == COUNTERS_ONLY  # not dropped, though the oldest


async def test_a_replica_keeps_4096_views_by_default() -> None:
    """The cache's bound (memory per replica): the 4,097th view drops the first."""
    record = to_record(_session("x"))

    async def find_only(method: str, *args: Any) -> Any:  # a table that answers ``find`` for any id
        assert method in ("find", "open")
        if method == "find":
            return {**record, "session_id": args[0]}
        calls.append(args[2])  # what the replica sent as its view
        return ("ok", {**record, "session_id": args[0]})

    calls: list[Any] = []
    store = SharedRolloutStore(find_only, 10_000)
    for i in range(4097):
        await store.find(f"s{i}")
    await store.open("s1")
    await store.open("s0")
    assert calls[0] is not None and calls[1] is None  # s1's view was kept, s0's dropped


async def test_the_session_count_is_asked_on_the_first_call_then_at_most_once_a_second(monkeypatch) -> None:
    """It feeds a gauge only: between asks the replica answers the count it got last."""
    now = [0.0]
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    table = SessionTable(8, 600.0)
    call = LocalTable(table)
    store = SharedRolloutStore(call, 8)
    await store.insert(_session("x"))
    assert await store.count() == 1 and call.calls.count("count") == 1  # a clock at 0: asked anyway
    await store.insert(_session("y"))
    now[0] = 0.9
    assert await store.count() == 1 and call.calls.count("count") == 1  # within the second: kept
    now[0] = 1.0
    assert await store.count() == 2 and call.calls.count("count") == 2  # a second on: asked again


def test_the_store_carries_the_deployments_capacity() -> None:
    """``SessionStore.capacity``: the deployment's limit, which the table enforces."""
    assert SharedRolloutStore(LocalTable(SessionTable(7, 60.0)), 7).capacity == 7


# -- a closed session's view ------------------------------------------------------------------------------
@pytest.mark.parametrize("seen_by", ["refused_open", "status_read", "own_close"])
async def test_a_closed_view_stays_closed_and_a_new_session_with_the_id_gets_its_own(seen_by: str) -> None:
    """A request queued on a session's view must see it closed once this replica learns it is, as
    in one process; a later session with the id (the table restarted empty) is another view."""
    table = SessionTable(4, 60.0)
    a, b = SharedRolloutStore(LocalTable(table), 4), SharedRolloutStore(LocalTable(table), 4)
    view = await a.insert(_session("x"))
    if seen_by == "own_close":
        assert await a.retire("x") is view
    else:
        await b.retire("x")
        if seen_by == "refused_open":
            with pytest.raises(RolloutError) as err:
                await a.open("x")
            assert err.value.code == "session_closed"
        else:
            assert await a.open("x", include_closed=True) is view
    assert view.closed_reason == "closed"
    a._call.table = b._call.table = SessionTable(4, 60.0)  # the actor restarted empty
    again = await b.insert(_session("x", seed=1))
    got = await a.open("x")
    assert got is not view and got.incarnation == again.incarnation and not got.closed
    assert view.closed_reason == "closed"


async def test_open_refuses_a_closed_session_unless_asked_for_it_as_the_local_store_does() -> None:
    local = RolloutStore(4, 60.0)
    await local.insert(_session("x"))
    await local.retire("x")
    with pytest.raises(RolloutError) as want:
        await local.open("x")
    shared = SharedRolloutStore(LocalTable(SessionTable(4, 60.0)), 4)
    await shared.insert(_session("x"))
    await shared.retire("x")
    with pytest.raises(RolloutError) as got:
        await shared.open("x")
    assert (got.value.code, got.value.message) == (want.value.code, want.value.message)
    assert (await shared.open("x", include_closed=True)).closed_reason == "closed"


async def test_find_refreshes_the_replicas_view_in_place() -> None:
    """The view's lock is the one this replica's requests wait on: it stays the one object."""
    table = SessionTable(4, 60.0)
    a = SharedRolloutStore(LocalTable(table), 4)
    view = await a.insert(_session("x"))
    assert table.commit("x", change_of(_step((0, -1), 0)), view.incarnation)[0] == "ok"  # another replica
    found = await a.find("x")
    assert found is view and (view.state, view.committed_step_id) == ("state0", 0)


async def test_a_commit_over_a_view_a_status_read_found_closed_loses() -> None:
    """A step in flight while its session closed elsewhere, and a status read on its replica saw it:
    the step's commit lands nothing (a closed view holds no seed sequence to compare)."""
    table = SessionTable(4, 60.0)
    a, b = SharedRolloutStore(LocalTable(table), 4), SharedRolloutStore(LocalTable(table), 4)
    view = await a.insert(_session("x"))
    await b.retire("x")
    assert (await a.open("x", include_closed=True)).closed and view.seeds is None
    assert not await a.commit(view, _step((0, -1), 0))
    assert table.find("x")["committed_step_id"] == -1


# -- refusals and time-outs through the replicas -------------------------------------------------------------
async def test_a_step_on_a_session_closed_elsewhere_reports_its_counters_as_one_process_does() -> None:
    table = SessionTable(4, 60.0)
    a, b = replica(ToyWorld(), LocalTable(table)), replica(ToyWorld(), LocalTable(table))
    alone = replica(ToyWorld(), LocalTable(SessionTable(4, 60.0)))
    try:
        for svc, closer in ((a, b), (alone, alone)):
            await svc.create_session(CreateSessionRequest(model="toy", seed=1, session_id="x"))
            for t in range(2):
                await svc.step("x", step_req(t))
            await closer.close_session("x")
        got, want = await a.step("x", step_req(2)), await alone.step("x", step_req(2))
        assert got.error.code == want.error.code == "session_closed"
        assert got.error.message == want.error.message == "session 'x' is closed"
        assert got.error.committed_step_id == want.error.committed_step_id == 1
        assert got.model_metadata.context_length == want.model_metadata.context_length == 2
    finally:
        for svc in (a, b, alone):
            svc.close()


async def test_concurrent_steps_on_a_replica_of_a_session_closed_elsewhere_are_each_refused() -> None:
    """Both opens hold the replica's view when the table refuses them; the second finds it dropped."""
    table = SessionTable(4, 60.0)
    a, b = replica(ToyWorld(), LocalTable(table)), replica(ToyWorld(), LocalTable(table))
    try:
        sid = await new_session(a)
        await b.close_session(sid)
        first, second = await asyncio.gather(a.step(sid, step_req(0)), a.step(sid, step_req(0)))
        assert first.error.code == second.error.code == "session_closed"
    finally:
        a.close()
        b.close()


async def test_a_step_past_the_ttl_answers_expired_and_so_does_the_step_queued_behind_it() -> None:
    """docs/scale-out.md: the table cannot see a step in flight, so a step running past the idle TTL
    lets its session expire; its commit loses and it answers ``session_expired``. Here another
    request on its replica learns of the expiry first, and one more waits on the session's lock."""
    now = [0.0]
    table = SessionTable(4, 10.0, clock=lambda: now[0])
    world = single.RecordingWorld()
    a = replica(world, HookedTable(table), 4)
    queued: list[asyncio.Task] = []
    try:
        sid = await new_session(a)

        async def expire_meanwhile() -> None:  # the step ran; before its commit goes:
            queued.append(asyncio.create_task(a.step(sid, step_req(1))))
            for _ in range(20):
                await asyncio.sleep(0)  # the next step opened the session and waits for its lock
            now[0] = 11.0
            late = await a.step(sid, step_req(0))
            assert late.error.code == "session_expired"

        a.store._call.hooks["commit"] = expire_meanwhile
        slow = await a.step(sid, step_req(0))
        assert "commit" not in a.store._call.hooks  # the hook ran
        assert slow.error.code == "session_expired" and slow.next_observation is None
        behind = await queued[0]
        assert behind.error.code == "session_expired" and world.steps_run == 1
    finally:
        a.close()


async def test_a_table_restarted_empty_under_a_step_answers_session_not_found() -> None:
    """The failure model: the actor restarts empty, so the step in flight commits nothing."""
    table = SessionTable(4, 60.0)
    a = replica(ToyWorld(), HookedTable(table))
    try:
        sid = await new_session(a)

        async def restart() -> None:
            a.store._call.table = SessionTable(4, 60.0)

        a.store._call.hooks["commit"] = restart
        try:
            code = (await a.step(sid, step_req(0))).error.code
        except RolloutError as exc:
            code = exc.code
        assert code == "session_not_found" and "commit" not in a.store._call.hooks
    finally:
        a.close()


async def test_a_fork_planned_on_an_earlier_session_with_the_id_is_refused() -> None:
    """The replica sends the source's incarnation with the fork: copying a later session with the id
    would give the fork a state its client never saw."""
    table = SessionTable(4, 60.0)
    a, b = replica(ToyWorld(), HookedTable(table)), replica(ToyWorld(), LocalTable(table))
    try:
        await a.create_session(CreateSessionRequest(model="toy", seed=1, session_id="x"))
        made: list[Any] = []

        async def made_again() -> None:  # a opened x; before the fork lands x is another session
            a.store._call.table = b.store._call.table = SessionTable(4, 60.0)
            await b.create_session(CreateSessionRequest(model="toy", seed=2, session_id="x"))
            made.append(b.store._call.table.find("x")["seeds"].bit_generator.state)

        a.store._call.hooks["insert"] = made_again
        with pytest.raises(RolloutError) as err:
            await a.fork_session("x", ForkSessionRequest(session_id="f"))
        assert err.value.code == "session_closed"
        now = b.store._call.table
        assert now.find("f") is None and now.find("x")["seeds"].bit_generator.state == made[0]  # no draw
    finally:
        a.close()
        b.close()


async def test_a_replayed_duplicate_on_any_replica_keeps_the_session_alive() -> None:
    """Any request is use, as in one process, also one that commits nothing."""
    now = [0.0]
    table = SessionTable(4, 10.0, clock=lambda: now[0])
    a, b = replica(ToyWorld(), LocalTable(table), 4), replica(ToyWorld(), LocalTable(table), 4)
    try:
        sid = await new_session(a)
        await a.step(sid, step_req(0))
        now[0] = 8.0
        assert (await b.step(sid, step_req(0))).replayed
        now[0] = 15.0  # 15 s after the step, 7 s after the duplicate
        assert (await a.step(sid, step_req(1))).error is None
    finally:
        a.close()
        b.close()


# -- the table's answers ------------------------------------------------------------------------------------
def test_the_table_answers_an_unknown_id_with_a_refusal_tuple_never_an_exception() -> None:
    """Answers cross a process boundary as plain tuples; the local store's refusal is the reference."""
    with pytest.raises(RolloutError) as want:
        RolloutStore(4, 60.0).close("nope")
    refusal = ("error", "session_not_found", want.value.message, -1, 0)
    table = SessionTable(4, 60.0)
    assert table.retire("nope") == refusal
    assert table.commit("nope", change_of(_step((0, -1), 0)), "any") == refusal


def test_a_commit_to_a_closed_session_is_a_counted_conflict_with_its_tombstone() -> None:
    table = SessionTable(4, 60.0)
    session = _session("x")
    table.insert(to_record(session))
    table.insert(to_record(_session("y")))
    assert table.commit("x", change_of(_step((0, -1), 0)), session.incarnation)[0] == "ok"
    table.retire("x")
    lost = table.commit("x", change_of(_step((0, 0), 1)), session.incarnation)
    assert lost[0] == "conflict" and (lost[1]["closed_reason"], lost[1]["committed_step_id"]) == ("closed", 0)
    assert table.commit("x", change_of(_step((0, 0), 1)), session.incarnation)[0] == "conflict"
    assert table.stats() == {"sessions": 1, "capacity": 4, "commits": 1, "conflicts": 2}


def test_a_fork_of_an_earlier_session_with_the_id_is_refused_at_the_step_it_copied() -> None:
    table = SessionTable(4, 60.0)
    table.insert(to_record(_session("src")))
    fork = RolloutSession(
        "f",
        "toy",
        "m",
        0.0,
        "s",
        "s0",
        np.zeros(2),
        np.random.default_rng(0),
        committed_step_id=2,
        forked_from="src",
    )
    assert table.insert(to_record(fork), "an earlier src") == (
        "error", "session_closed", "session 'src' is closed", 2, 0
    )  # fmt: skip


def test_a_table_open_touches_unless_told_not_to() -> None:
    now = [0.0]
    table = SessionTable(4, 10.0, clock=lambda: now[0])
    table.insert(to_record(_session("x")))
    now[0] = 8.0
    assert table.open("x", False, None)[0] == "ok"  # use, by default
    now[0] = 15.0
    assert table.count() == 1
