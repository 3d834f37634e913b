"""The Ray actor that holds the deployment's committed rollout state, and how replicas reach it.

One named, detached actor per deployment: named so every replica (and a restarted one) finds it,
detached so it outlives the replica that happened to create it. It runs one call at a time, which
is what makes the table's compare-and-set atomic. It also keeps each replica's last metrics
report, so any replica can answer ``/metrics`` for the whole deployment.

Why an actor, not Ray's object store or a database: a commit must compare and set in one step,
and the object store has immutable objects and no compare-and-set (an actor would still have to
hold the latest reference); a database (Redis, Postgres) gives durability but adds a service to
run and ~0.2-1 ms per round trip, the same as the actor's. docs/scale-out.md has the trade-offs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import ray

from rollserve.scale.table import SessionTable

NAMESPACE = "rollserve"
TABLE_METHODS = frozenset({"claim", "insert", "open", "find", "commit", "retire", "count", "stats"})
REPORT_MAX_AGE_S = 30.0  # a replica silent this long is gone (killed, scaled down)


@ray.remote(num_cpus=0, max_restarts=-1)
class CommittedStateActor:
    """:class:`SessionTable` behind one actor; a restart starts it empty (see the failure model)."""

    def __init__(self, capacity: int, idle_ttl_s: float) -> None:
        self.table = SessionTable(capacity, idle_ttl_s)
        self.reports: dict[str, tuple[float, bytes]] = {}
        self.started = uuid.uuid4().hex  # new on every (re)start: how replicas see a restart

    def configure(self, capacity: int, idle_ttl_s: float) -> str:
        """A deploy's limits; returns :attr:`started`. Ray restarts the actor with the arguments it
        was first created with (an earlier deploy's), so replicas configure it again after a restart."""
        self.table.configure(capacity, idle_ttl_s)
        return self.started

    def call(self, method: str, *args: Any) -> Any:
        if method not in TABLE_METHODS:
            raise ValueError(f"no table method {method!r}")
        return getattr(self.table, method)(*args)

    def report(self, replica: str, metrics_text: bytes) -> str:
        """Keep a replica's metrics; returns :attr:`started`, so the replica sees a restart."""
        self.reports[replica] = (time.monotonic(), metrics_text)
        return self.started

    def replicas(self) -> dict[str, bytes]:
        """The live replicas' latest metrics (exposition text), by replica id."""
        now = time.monotonic()
        self.reports = {r: v for r, v in self.reports.items() if now - v[0] < REPORT_MAX_AGE_S}
        return {r: text for r, (_, text) in self.reports.items()}


def table_actor(name: str, capacity: int, idle_ttl_s: float) -> Any:
    """The deployment's actor, created by whichever replica asks first. It is detached, so it outlives
    ``serve.delete``: a redeploy finds it running, its sessions kept, with the limits it was created
    with, which is why each replica also ``configure``s it with its own."""
    return CommittedStateActor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(capacity, idle_ttl_s)


def table_call(actor: Any) -> Any:
    """The ``TableCall`` a :class:`~rollserve.scale.store.SharedRolloutStore` uses: one actor round trip."""

    async def call(method: str, *args: Any) -> Any:
        return await actor.call.remote(method, *args)

    return call
