"""The committed-state actor across deploys: it outlives a deployment (named, detached), so a
redeploy finds it running with its sessions, and must still get the new deploy's capacity and
TTL, also after Ray restarts it with its first deploy's arguments. Skipped where Ray is not
installed; starts its own small local Ray."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from rollserve.scale.actor import table_actor  # noqa: E402
from rollserve.scale.deployment import _Deployment  # noqa: E402
from rollserve.scale.table import to_record  # noqa: E402
from rollserve.server.rollout.store import RolloutSession  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, namespace="rollserve-table-tests", log_to_driver=False)
    yield
    ray.shutdown()


async def _replica_start(name: str, capacity: int, idle_ttl_s: float) -> tuple[object, _Deployment]:
    """What a starting replica does with the table: get (or create) it, then its first report."""
    actor = table_actor(name, capacity, idle_ttl_s)
    view = _Deployment(f"replica-{capacity}", actor, True, (capacity, idle_ttl_s))
    await view.report()
    return actor, view


async def _insert(actor, *ids: str) -> list[str]:
    answers = []
    for sid in ids:
        session = RolloutSession(sid, "toy", "m", 0.0, "s0", "s0", np.zeros(2), np.random.default_rng(0))
        answers.append((await actor.call.remote("insert", to_record(session)))[0])
    return answers


async def _once_restarted(actor, before: str) -> None:
    """Wait for Ray to have restarted the actor (a kill takes effect a little later)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if await actor.report.remote("probe", b"") != before:
                return
        except ray.exceptions.RayError:
            pass  # between the kill and the restart
        assert time.monotonic() < deadline, "the actor did not come back"
        time.sleep(0.2)


async def test_a_redeploy_gets_the_running_table_with_its_own_capacity_and_ttl(local_ray) -> None:
    first, old = await _replica_start("redeployed", 2, 600.0)
    try:
        assert await _insert(first, "a", "b", "c") == ["ok", "ok", "error"]  # at capacity 2
        again, _ = await _replica_start("redeployed", 100, 0.5)  # the next deploy's replica
        assert await _insert(again, "c") == ["ok"]  # the same table: a and b are still there
        await old.report()  # an old replica, still up in a rolling update, keeps reporting...
        assert (await again.call.remote("stats"))["capacity"] == 100  # ...and undoes nothing
        time.sleep(1.0)
        assert await again.call.remote("count") == 0  # idle past the new TTL
    finally:
        ray.kill(first, no_restart=True)


async def test_a_restarted_table_gets_the_latest_deploys_limits_back(local_ray) -> None:
    await _replica_start("restarted", 2, 600.0)  # the first deploy created it
    actor, view = await _replica_start("restarted", 100, 600.0)
    try:
        ray.kill(actor, no_restart=False)  # Ray restarts it with its creation arguments: capacity 2
        await _once_restarted(actor, view.configured)
        assert (await actor.call.remote("stats"))["capacity"] == 2
        await view.report()  # the replica's next report sees the restart and configures it
        assert (await actor.call.remote("stats"))["capacity"] == 100
    finally:
        ray.kill(actor, no_restart=True)
