"""The shared committed-state store without Ray: the table's compare-and-set, replicas racing the
same step, and every single-process rule of RolloutService re-run over the shared store.

Replicas here are RolloutService instances in one process, each with its own world and engine,
sharing one SessionTable through a call that copies every argument and answer (as a process
boundary does) and yields to the event loop (as a remote call does)."""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.scale.store import SharedRolloutStore
from rollserve.scale.table import SessionTable, change_of, to_record
from rollserve.server.rollout.protocol import (
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    ForkSessionRequest,
    ResetSessionRequest,
)
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.store import Commit, RolloutError, RolloutSession
from rollserve.server.settings import ServerSettings

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
import test_rollout_service as single

RULES = [
    name
    for name in dir(single)
    if name.startswith("test_")
    and "service" in single.__dict__[name].__code__.co_varnames[: single.__dict__[name].__code__.co_argcount]
    and name != "test_create_with_a_chosen_id_is_idempotent"  # counts the local store's sessions
]
globals().update({f"{name}_shared": getattr(single, name) for name in RULES})
world = single.world
step_req, new_session, decode = single.step_req, single.new_session, single.decode


class LocalTable:
    """Calls a SessionTable as a replica calls the actor: copied values, a yield per call."""

    def __init__(self, table: SessionTable, commit_barrier: asyncio.Barrier | None = None) -> None:
        self.table = table
        self.commit_barrier = commit_barrier
        self.insert_barrier: asyncio.Barrier | None = None
        self.calls: list[str] = []

    async def __call__(self, method: str, *args: Any) -> Any:
        self.calls.append(method)
        if method == "commit" and self.commit_barrier is not None:
            await self.commit_barrier.wait()  # both racers hold a result before either commits
        if method == "insert" and self.insert_barrier is not None:
            await self.insert_barrier.wait()  # both forks drew their seeds before either lands
        await asyncio.sleep(0)
        answer = getattr(self.table, method)(*pickle.loads(pickle.dumps(args)))
        return pickle.loads(pickle.dumps(answer))


def replica(world: ToyWorld, call: LocalTable, capacity: int = 256) -> RolloutService:
    settings = ServerSettings(max_batch_wait_ms=0.0, max_rollout_sessions=capacity)
    return RolloutService(world, settings, store=SharedRolloutStore(call, capacity))


@pytest.fixture
async def service(world):  # the fixture the re-run rules take: one replica over a shared table
    svc = replica(world, LocalTable(SessionTable(256, 600.0)))
    yield svc
    svc.close()


@pytest.fixture
async def pair():
    table = SessionTable(8, 600.0)
    worlds = (single.RecordingWorld(), single.RecordingWorld())
    a, b = (replica(w, LocalTable(table)) for w in worlds)
    yield a, b, table, worlds
    a.close()
    b.close()


# -- the table's compare-and-set ----------------------------------------------------------------------
def _commit(base: tuple[int, int], step: int) -> dict[str, Any]:
    return change_of(Commit(base, f"state{step}", np.zeros(2, np.float32), step, step + 1, None, base[0]))


def test_table_commit_is_a_compare_and_set() -> None:
    table = SessionTable(4, 60.0)
    sid = table.claim("s")[1]
    session = RolloutSession(sid, "toy", "m", 0.0, "s0", "s0", np.zeros(2), np.random.default_rng(0))
    assert table.insert(to_record(session))[0] == "ok"
    this = session.incarnation
    assert table.commit(sid, _commit((0, -1), 0), this)[0] == "ok"
    loser = table.commit(sid, _commit((0, -1), 0), this)  # the same base again: someone committed since
    assert loser[0] == "conflict" and loser[1]["committed_step_id"] == 0 and loser[1]["state"] == "state0"
    assert table.commit(sid, _commit((0, 1), 2), this)[0] == "conflict"  # a base from the future
    assert table.commit(sid, _commit((1, 0), 1), this)[0] == "conflict"  # another epoch (a reset)
    assert table.commit(sid, _commit((0, 0), 1), "earlier")[0] == "conflict"  # an earlier session's id
    assert table.commit(sid, _commit((0, 0), 1), this)[0] == "ok"
    assert (table.commits, table.conflicts) == (2, 4)
    assert table.open(sid, False, (this, 0, 1))[1].keys() == {
        "epoch", "committed_step_id", "context_length", "closed_reason", "last_used", "seeds"
    }  # fmt: skip
    assert table.open(sid, False, (this, 0, 0))[1]["state"] == "state1"  # a stale copy gets the whole record
    assert table.open(sid, False, ("earlier", 0, 1))[1]["incarnation"] == this  # so does another session's
    table.retire(sid)
    assert table.commit(sid, _commit((0, 1), 2), this)[1]["closed_reason"] == "closed"


# -- replicas racing ----------------------------------------------------------------------------------
async def test_two_replicas_racing_the_same_step_commit_once(pair) -> None:
    a, b, table, worlds = pair
    a.store._call.commit_barrier = b.store._call.commit_barrier = asyncio.Barrier(2)
    sid = await new_session(a)
    ra, rb = await asyncio.gather(a.step(sid, step_req(0)), b.step(sid, step_req(0)))
    assert worlds[0].steps_run == worlds[1].steps_run == 1  # both ran the model...
    assert table.commits == 1 and table.conflicts == 1  # ...one commit landed
    winner, loser = (ra, rb) if ra.error is None else (rb, ra)
    assert winner.error is None and not winner.replayed
    assert loser.replayed and loser.error.code == "step_already_committed"  # as a duplicate does
    assert loser.next_observation == winner.next_observation
    assert (await a.get_status(sid)).context_length == (await b.get_status(sid)).context_length == 1


async def test_racing_steps_with_different_content_one_wins_the_other_gets_no_result(pair) -> None:
    a, b, table, _ = pair
    a.store._call.commit_barrier = b.store._call.commit_barrier = asyncio.Barrier(2)
    sid = await new_session(a)
    ra, rb = await asyncio.gather(a.step(sid, step_req(0, 0.1)), b.step(sid, step_req(0, 0.3)))
    assert sorted([ra.error is None, rb.error is None]) == [False, True]
    loser = ra if ra.error else rb
    assert loser.error.code == "step_already_committed" and not loser.replayed
    assert loser.next_observation is None and table.commits == 1


async def test_any_replica_continues_a_session_and_affinity_only_saves_bytes(pair) -> None:
    a, b, _, _ = pair
    sid = await new_session(a, seed=3)
    alone = replica(ToyWorld(), LocalTable(SessionTable(8, 600.0)))
    try:
        ref = await new_session(alone, seed=3)
        for t in range(6):
            server = (a, b, b, a, a, b)[t]
            got, want = (
                await server.step(sid, step_req(t, 0.1 * t)),
                await alone.step(ref, step_req(t, 0.1 * t)),
            )
            assert got.error is None and got.next_observation == want.next_observation
        calls = a.store._call.calls
        before = len(calls)
        await a.step(sid, step_req(6))  # a's copy is current: the open answers with counters only
        assert calls[before:] == ["open", "commit"]
    finally:
        alone.close()


async def test_duplicate_on_the_other_replica_replays_the_stored_result(pair) -> None:
    a, b, _, worlds = pair
    sid = await new_session(a)
    first = await a.step(sid, step_req(0))
    again = await b.step(sid, step_req(0))
    assert again.replayed and again.next_observation == first.next_observation
    assert worlds[1].steps_run == 0


async def test_reset_racing_a_step_wins_and_the_step_commits_nothing(pair) -> None:
    a, b, _, _ = pair
    sid = await new_session(a, seed=1)
    await a.step(sid, step_req(0))
    a.store._call.commit_barrier = asyncio.Barrier(2)

    async def late_reset() -> None:
        await b.reset_session(sid, ResetSessionRequest(seed=5))
        await a.store._call.commit_barrier.wait()  # let the step's commit go after the reset

    step, _ = await asyncio.gather(a.step(sid, step_req(1)), late_reset())
    assert step.error is not None and step.error.code == "step_out_of_order"
    status = await a.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (-1, 0)


async def test_fork_close_capacity_and_ttl_hold_across_replicas() -> None:
    now = [0.0]
    table = SessionTable(3, 10.0, clock=lambda: now[0])
    a, b = replica(ToyWorld(), LocalTable(table), 3), replica(ToyWorld(), LocalTable(table), 3)
    try:
        s1, s2 = await new_session(a), await new_session(b)
        await a.step(s1, step_req(0))
        fork = await b.fork_session(s1, ForkSessionRequest())  # b never served s1
        assert fork.committed_step_id == 0
        with pytest.raises(RolloutError) as err:  # capacity is the deployment's, not a replica's
            await new_session(a)
        assert err.value.code == "at_capacity"
        await b.close_session(s2)
        assert (await a.step(s2, step_req(0))).error.code == "session_closed"
        forked = fork.session_id
        assert (await a.step(forked, step_req(1))).next_observation == (
            await b.step(s1, step_req(1))
        ).next_observation  # the fork holds the committed state
        now[0] = 20.0  # both idle past the TTL, whichever replica last touched them
        assert (await b.step(s1, step_req(2))).error.code == "session_expired"
        assert (await a.get_status(forked)).closed_reason == "expired"
        await new_session(b)  # expired sessions free their slots
    finally:
        a.close()
        b.close()


async def test_batch_step_is_one_model_call_per_replica_for_its_items(pair) -> None:
    a, b, _, worlds = pair
    sids = [await new_session(a, seed=k) for k in range(4)]
    first = BatchStepRequest(items=[BatchStepItem(session_id=s, **dict(step_req(0))) for s in sids[:2]])
    second = BatchStepRequest(items=[BatchStepItem(session_id=s, **dict(step_req(0))) for s in sids[2:]])
    ra, rb = await asyncio.gather(a.batch_step(first), b.batch_step(second))
    assert all(r.status == "ok" for r in ra.results + rb.results)
    assert [len(c) for c in worlds[0].step_calls] == [2] and [len(c) for c in worlds[1].step_calls] == [2]


# -- forks draw from the source's seed sequence, wherever they run ------------------------------------------
def seed_draws(seed: int) -> np.random.Generator:
    """The seed sequence of a session created with ``seed``: each unseeded reset draws
    ``integers(2**31)`` from it, each fork ``integers(2**63)`` to seed the fork's own sequence."""
    return np.random.default_rng(seed)


def fork_reset_seed(draws: np.random.Generator) -> int:
    """The seed of the first unseeded reset of the fork whose draw comes next from ``draws``."""
    return int(np.random.default_rng(draws.integers(2**63)).integers(2**31))


def last_seed(world: single.RecordingWorld) -> int:
    return world.init_calls[-1][0].seed


async def test_forks_of_one_source_on_either_replica_draw_what_one_process_draws(pair) -> None:
    a, b, _, worlds = pair
    sid = await new_session(a, seed=3)
    draws = seed_draws(3)
    for forker, resetter in ((a, b), (b, a), (b, b), (a, a)):
        fork = await forker.fork_session(sid)
        await resetter.reset_session(fork.session_id)
        assert last_seed(worlds[(a, b).index(resetter)]) == fork_reset_seed(draws)


async def test_a_reset_after_a_fork_on_the_other_replica_draws_the_next_seed(pair) -> None:
    a, b, _, worlds = pair
    sid = await new_session(a, seed=4)
    draws = seed_draws(4)
    first, second = await a.fork_session(sid), await b.fork_session(sid)
    await a.reset_session(sid)  # a's copy of the source is current by its counters, but b's fork drew
    want_first, want_second = fork_reset_seed(draws), fork_reset_seed(draws)
    assert last_seed(worlds[0]) == int(draws.integers(2**31))
    await b.reset_session(first.session_id)
    await b.reset_session(second.session_id)
    assert [call[0].seed for call in worlds[1].init_calls[-2:]] == [want_first, want_second]


async def test_racing_forks_on_two_replicas_get_different_seeds(pair) -> None:
    a, b, _, worlds = pair
    sid = await new_session(a, seed=5)
    a.store._call.insert_barrier = b.store._call.insert_barrier = asyncio.Barrier(2)
    forks = await asyncio.gather(a.fork_session(sid), b.fork_session(sid))
    a.store._call.insert_barrier = b.store._call.insert_barrier = None
    seeds = []
    for fork in forks:
        await a.reset_session(fork.session_id)
        seeds.append(last_seed(worlds[0]))
    draws = seed_draws(5)
    assert sorted(seeds) == sorted(fork_reset_seed(draws) for _ in forks)  # landed in either order
    await a.reset_session(sid)
    assert last_seed(worlds[0]) == int(draws.integers(2**31))  # the source moved past both draws


def _session(sid: str, seed: int, forked_from: str | None = None) -> RolloutSession:
    return RolloutSession(
        sid, "toy", "m", 0.0, "s0", "s0", np.zeros(2), np.random.default_rng(seed), forked_from=forked_from
    )


def test_the_table_draws_a_forks_seeds_from_the_source_only_when_the_fork_lands() -> None:
    table = SessionTable(3, 60.0)
    source = _session("src", 3)
    table.insert(to_record(source))
    table.insert(to_record(_session("taken", 1)))
    untouched = seed_draws(3).bit_generator.state

    def source_seeds() -> dict:
        return table.find("src")["seeds"].bit_generator.state

    taken = table.insert(to_record(_session("taken", 0, "src")), source.incarnation)
    assert taken[:2] == ("error", "session_exists") and source_seeds() == untouched
    earlier = table.insert(to_record(_session("f", 0, "src")), "an earlier session with the id")
    assert earlier[:2] == ("error", "session_closed") and source_seeds() == untouched
    landed = table.insert(to_record(_session("f", 0, "src")), source.incarnation)
    draws = seed_draws(3)
    fork_seeds = np.random.default_rng(draws.integers(2**63))
    assert landed[0] == "ok" and landed[1][1]["seeds"].bit_generator.state == fork_seeds.bit_generator.state
    assert table.find("f")["seeds"].bit_generator.state == fork_seeds.bit_generator.state
    assert source_seeds() == draws.bit_generator.state
    full = table.insert(to_record(_session("g", 0, "src")), source.incarnation)
    assert full[:2] == ("error", "at_capacity") and source_seeds() == draws.bit_generator.state
    table.retire("taken")
    table.retire("src")
    closed = table.insert(to_record(_session("g", 0, "src")), source.incarnation)
    assert closed[:2] == ("error", "session_closed") and table.find("g") is None


# -- a client-chosen id used again: a replica's view of the earlier session must never serve it ------
def _evict_tombstones(table: SessionTable) -> None:
    """Other sessions come and go until every earlier tombstone is evicted (4,096 are kept)."""
    for i in range(4097):
        session = RolloutSession(f"o{i}", "toy", "m", 0.0, None, None, np.zeros(2), np.random.default_rng(0))
        table.insert(to_record(session))
        table.retire(f"o{i}")


async def _gone_and_made_again(gone: str, a: RolloutService, b: RolloutService, table: SessionTable) -> None:
    """``x`` ends behind ``a``'s back (the table actor restarts empty, or it is closed on ``b`` and its
    tombstone evicted); the client then creates ``x`` again on ``b``."""
    if gone == "table_restarted":
        a.store._call.table = b.store._call.table = SessionTable(8, 600.0)
    else:
        await b.close_session("x")
        _evict_tombstones(table)
    await b.create_session(CreateSessionRequest(model="toy", seed=7, session_id="x"))


@pytest.mark.parametrize("gone", ["table_restarted", "tombstone_evicted"])
async def test_a_stale_view_never_serves_a_new_session_with_the_same_id(gone: str) -> None:
    table = SessionTable(8, 600.0)
    a, b = replica(ToyWorld(), LocalTable(table)), replica(ToyWorld(), LocalTable(table))
    alone = replica(ToyWorld(), LocalTable(SessionTable(8, 600.0)))  # one process: the reference
    try:
        await a.create_session(CreateSessionRequest(model="toy", seed=1, session_id="x"))
        for t in range(3):
            await a.step("x", step_req(t, 0.9))  # a's view: the first x at (epoch 0, step 2)
        await _gone_and_made_again(gone, a, b, table)
        await alone.create_session(CreateSessionRequest(model="toy", seed=7, session_id="x"))
        for t in range(3):  # the new x reaches the same counters as a's stale view
            await b.step("x", step_req(t, 0.1))
            await alone.step("x", step_req(t, 0.1))
        retry, want_retry = await a.step("x", step_req(2, 0.1)), await alone.step("x", step_req(2, 0.1))
        assert retry.replayed and want_retry.replayed  # the retry replays the new x's stored result
        assert retry.next_observation == want_retry.next_observation
        got, want = await a.step("x", step_req(3, 0.1)), await alone.step("x", step_req(3, 0.1))
        assert got.error is None and got.next_observation == want.next_observation
    finally:
        for svc in (a, b, alone):
            svc.close()


async def test_a_step_planned_on_an_earlier_session_with_the_id_commits_nothing_into_the_new_one() -> None:
    table = SessionTable(8, 600.0)
    a, b = replica(ToyWorld(), LocalTable(table)), replica(ToyWorld(), LocalTable(table))
    alone = replica(ToyWorld(), LocalTable(SessionTable(8, 600.0)))
    a.store._call.commit_barrier = asyncio.Barrier(2)
    try:
        await a.create_session(CreateSessionRequest(model="toy", seed=1, session_id="x"))
        for t in range(3):
            await b.step("x", step_req(t, 0.9))

        async def made_again_meanwhile() -> None:
            while a.store._call.calls[-1:] != ["commit"]:  # a's step 3 ran and waits to commit
                await asyncio.sleep(0.001)
            await _gone_and_made_again("tombstone_evicted", a, b, table)
            for t in range(3):
                await b.step("x", step_req(t, 0.1))
            await a.store._call.commit_barrier.wait()

        stale, _ = await asyncio.gather(a.step("x", step_req(3, 0.9)), made_again_meanwhile())
        assert stale.error is not None and stale.error.code == "step_out_of_order"
        assert (await b.get_status("x")).committed_step_id == 2  # the new x did not move
        await alone.create_session(CreateSessionRequest(model="toy", seed=7, session_id="x"))
        for t in range(3):
            await alone.step("x", step_req(t, 0.1))
        got, want = await b.step("x", step_req(3, 0.1)), await alone.step("x", step_req(3, 0.1))
        assert got.error is None and got.next_observation == want.next_observation
    finally:
        for svc in (a, b, alone):
            svc.close()


# -- a redeploy's limits ------------------------------------------------------------------------------
def _fill(table: SessionTable, *ids: str) -> list[str]:
    """Insert a session per id; each answer's first element ("ok" or "error")."""
    answers = []
    for sid in ids:
        session = RolloutSession(sid, "toy", "m", 0.0, "s0", "s0", np.zeros(2), np.random.default_rng(0))
        answers.append(table.insert(to_record(session))[0])
    return answers


def test_a_new_deploys_capacity_and_ttl_hold_on_the_running_table() -> None:
    now = [0.0]
    table = SessionTable(2, 600.0, clock=lambda: now[0])
    assert _fill(table, "a", "b", "c") == ["ok", "ok", "error"]
    table.configure(100, 5.0)  # a redeploy: the table and its sessions stay, the limits are the new ones
    assert _fill(table, "c") == ["ok"] and table.stats()["capacity"] == 100
    now[0] = 6.0
    assert table.count() == 0  # idle past the new TTL


async def test_a_status_read_on_any_replica_does_not_keep_a_session_alive() -> None:
    """As in one process: a monitoring poll is not use, so an abandoned session still expires."""
    now = [0.0]
    table = SessionTable(3, 10.0, clock=lambda: now[0])
    a, b = replica(ToyWorld(), LocalTable(table), 3), replica(ToyWorld(), LocalTable(table), 3)
    try:
        sid = await new_session(a)
        await a.step(sid, step_req(0))  # the last use: at t=0
        for t in (4.0, 8.0):  # polled on both replicas, inside the TTL
            now[0] = t
            assert (await a.get_status(sid)).closed_reason is None
            assert (await b.get_status(sid)).closed_reason is None
        now[0] = 10.5  # 10.5 s after the step, 2.5 s after the last poll
        assert (await b.get_status(sid)).closed_reason == "expired"
        assert (await a.step(sid, step_req(1))).error.code == "session_expired"
    finally:
        a.close()
        b.close()
