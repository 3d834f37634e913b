"""Forks and resets racing on two replicas of the shared store (no Ray): a fork takes its source as
the table holds it when the fork lands, a reset cannot put back a seed sequence a fork drew from,
and the table reserves a fork's id once. Replicas are RolloutService instances over one
SessionTable, as in ``test_shared_store``; a hook runs the other replica's request at the exact
point of the race (before a given table call goes), so no timing is involved."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from test_shared_store import (
    LocalTable,
    fork_reset_seed,
    last_seed,
    new_session,
    replica,
    seed_draws,
    single,
    step_req,
)

import rollserve.scale.table as table_module
import rollserve.server.rollout.service as service_module
import rollserve.server.rollout.store as store_module
from rollserve.scale.store import SharedRolloutStore
from rollserve.scale.table import SessionTable, change_of, to_record
from rollserve.server.rollout.protocol import ResetSessionRequest
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.store import Commit, RolloutSession
from rollserve.server.settings import ServerSettings

Hook = Callable[[], Awaitable[None]]


class HookedTable(LocalTable):
    """A :class:`LocalTable` that runs ``hooks[method]`` once, before that call reaches the table."""

    def __init__(self, table: SessionTable) -> None:
        super().__init__(table)
        self.hooks: dict[str, Hook] = {}

    async def __call__(self, method: str, *args: Any) -> Any:
        hook = self.hooks.pop(method, None)
        if hook is not None:
            await hook()
        return await super().__call__(method, *args)


@pytest.fixture
async def pair():
    table = SessionTable(8, 600.0)
    worlds = (single.RecordingWorld(), single.RecordingWorld())
    a, b = (replica(w, HookedTable(table)) for w in worlds)
    yield a, b, table, worlds
    a.close()
    b.close()


def _session(sid: str, seed: int, forked_from: str | None = None) -> RolloutSession:
    return RolloutSession(
        sid, "toy", "m", 0.0, "s0", "s0", np.zeros(2), np.random.default_rng(seed), forked_from=forked_from
    )


def _reset_change(epoch: int, seed: int) -> dict[str, Any]:
    seeds = np.random.default_rng(seed)
    return change_of(Commit((epoch, -1), "r", np.zeros(2), -1, 0, None, epoch + 1, root="r", seeds=seeds))


# -- a fork copies the source's latest committed state --------------------------------------------------
async def test_a_fork_takes_a_step_another_replica_committed_after_its_open(pair) -> None:
    a, b, _, _ = pair
    sid = await new_session(a, seed=2)
    await a.step(sid, step_req(0, 0.2))

    async def b_steps_the_source() -> None:  # a opened the source at step 0; b commits step 1 now
        assert (await b.step(sid, step_req(1, 0.4))).error is None

    a.store._call.hooks["insert"] = b_steps_the_source
    fork = await a.fork_session(sid)
    assert "insert" not in a.store._call.hooks  # the hook ran: the race happened
    # one process: the fork is the source's committed state when it is made, after step 1
    assert (fork.committed_step_id, fork.context_length) == (1, 2)
    source = await b.get_status(sid)
    assert (source.committed_step_id, source.context_length) == (1, 2)
    got, want = await a.step(fork.session_id, step_req(2, 0.6)), await b.step(sid, step_req(2, 0.6))
    assert got.error is None and want.error is None
    assert got.next_observation == want.next_observation  # the same state, stepped the same way


# -- a reset's seed sequence never lands over a fork's draw ---------------------------------------------
def test_the_table_refuses_a_reset_drawn_from_a_sequence_a_fork_drew_from_since() -> None:
    table = SessionTable(4, 60.0)
    source = _session("src", 3)
    table.insert(to_record(source))
    read = table.find("src")["seeds"].bit_generator.state  # what a replica's reset draws from
    assert table.insert(to_record(_session("f", 0, "src")), source.incarnation)[0] == "ok"
    drawn = seed_draws(3)
    drawn.integers(2**63)  # the fork's draw
    lost = table.commit("src", _reset_change(0, 9), source.incarnation, read)
    assert lost[0] == "conflict" and lost[1]["seeds"].bit_generator.state == drawn.bit_generator.state
    assert table.find("src")["epoch"] == 0  # nothing landed
    landed = table.commit("src", _reset_change(0, 9), source.incarnation, drawn.bit_generator.state)
    assert landed[0] == "ok" and table.find("src")["epoch"] == 1
    step = change_of(Commit((1, -1), "s", np.zeros(2), 0, 1, None, 1))  # no seeds: no sequence compared
    assert table.commit("src", step, source.incarnation)[0] == "ok"
    assert (table.commits, table.conflicts) == (2, 1)


async def test_a_replicas_reset_commit_loses_to_a_fork_landed_on_another_replica() -> None:
    table = SessionTable(4, 60.0)
    a, b = SharedRolloutStore(LocalTable(table), 4), SharedRolloutStore(LocalTable(table), 4)
    source = await a.insert(_session("src", 3))
    view = await a.open("src")  # the reset's read: counters and seed sequence
    await b.open("src")
    await b.insert(_session("f", 0, "src"))  # the table draws from the source's sequence
    change = Commit((0, -1), "r", np.zeros(2), -1, 0, None, 1, root="r", seeds=np.random.default_rng(9))
    assert not await a.commit(view, change)
    drawn = seed_draws(3)
    drawn.integers(2**63)
    assert view is source and view.epoch == 0  # refreshed in place, the reset not applied
    assert view.seeds.bit_generator.state == drawn.bit_generator.state  # the fork's draw is kept


# -- one reservation of a fork's id in the table ----------------------------------------------------------
def test_the_table_reserves_a_forks_id_once(monkeypatch: pytest.MonkeyPatch) -> None:
    table = SessionTable(4, 60.0)
    source = _session("src", 3)
    table.insert(to_record(source))
    reserved: list[str | None] = []
    reserve = table.sessions.reserve

    def counted(session_id: str | None) -> str:
        reserved.append(session_id)
        return reserve(session_id)

    monkeypatch.setattr(table.sessions, "reserve", counted)
    assert table.insert(to_record(_session("f", 0, "src")), source.incarnation)[0] == "ok"
    assert reserved == ["f"]


async def test_a_reset_racing_a_fork_on_another_replica_draws_after_the_fork(pair) -> None:
    a, b, _, worlds = pair
    sid = await new_session(a, seed=4)
    forks = []

    async def b_forks() -> None:  # a's reset drew its seed and started its episode; b forks now
        forks.append(await b.fork_session(sid))

    a.store._call.hooks["commit"] = b_forks
    await a.reset_session(sid)
    assert len(forks) == 1  # the hook ran: the race happened
    second = await b.fork_session(sid)
    draws = seed_draws(4)  # one process: the fork, then the reset (it committed last), then a fork
    want_first = fork_reset_seed(draws)
    want_reset = int(draws.integers(2**31))
    want_second = fork_reset_seed(draws)
    assert last_seed(worlds[0]) == want_reset  # the reset drew again, after the fork's draw
    await b.reset_session(forks[0].session_id)
    await b.reset_session(second.session_id)
    assert [call[0].seed for call in worlds[1].init_calls[-2:]] == [want_first, want_second]


async def test_a_seeded_reset_racing_a_fork_wins_with_one_world_start(pair) -> None:
    """A seeded reset draws nothing from the sequence, so a fork's draw meanwhile does not make it
    start its episode again: it lands over the fork, as in one process."""
    a, b, _, worlds = pair
    sid = await new_session(a, seed=4)
    forks = []

    async def b_forks() -> None:
        forks.append(await b.fork_session(sid))

    a.store._call.hooks["commit"] = b_forks
    starts = len(worlds[0].init_calls)
    await a.reset_session(sid, ResetSessionRequest(seed=77))
    assert len(forks) == 1  # the hook ran: the race happened
    assert [call[0].seed for call in worlds[0].init_calls[starts:]] == [77]


def _count_fork_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``fork_draw`` call, in whichever module calls it."""
    drawn: list[int] = []
    real = store_module.fork_draw

    def counted(seeds: np.random.Generator) -> tuple[np.random.Generator, np.random.Generator]:
        drawn.append(1)
        return real(seeds)

    for module in (table_module, service_module, store_module):
        if hasattr(module, "fork_draw"):
            monkeypatch.setattr(module, "fork_draw", counted)
    return drawn


async def test_a_fork_is_drawn_and_reserved_once_by_the_table(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _, _, _ = pair
    sid = await new_session(a, seed=4)
    drawn = _count_fork_draws(monkeypatch)
    calls = a.store._call.calls
    before = len(calls)
    await a.fork_session(sid)
    assert len(drawn) == 1  # the table's draw only
    assert calls[before:] == ["open", "insert"]  # no claim: the insert reserves the id


async def test_one_process_draws_a_fork_once(monkeypatch: pytest.MonkeyPatch) -> None:
    alone = RolloutService(single.RecordingWorld(), ServerSettings(max_batch_wait_ms=0.0))
    try:
        sid = await new_session(alone, seed=4)
        drawn = _count_fork_draws(monkeypatch)
        fork = await alone.fork_session(sid)
        assert len(drawn) == 1
        await alone.reset_session(fork.session_id)
        assert alone.world.init_calls[-1][0].seed == fork_reset_seed(seed_draws(4))
    finally:
        alone.close()
