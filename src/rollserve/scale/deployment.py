"""The Ray Serve deployment: every replica runs the one app (``create_app``) behind Serve's proxy.

A replica loads its own policy and/or world (its own engine thread, so batching works per replica
as in one process). Policy websockets are ASGI connections Serve keeps on the replica that
accepted them for their whole life. Rollout sessions live in the deployment's committed-state
actor (``scale.actor``), so any replica serves any session. :func:`build_app` is the Serve
application builder, used by ``rollserve serve --ray`` and by ``serve deploy`` config files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import ray
from ray import serve

from rollserve.cli import checked, non_negative_float, non_negative_int, positive_float, positive_int
from rollserve.scale.actor import table_actor, table_call
from rollserve.scale.launch import (
    HTTP_OPTIONS_SETTINGS,
    PROXY_OWNED_SETTINGS,
    flag_check,
    proxy_owned_refusal,
)
from rollserve.scale.metrics import merge_reports
from rollserve.scale.store import SharedRolloutStore
from rollserve.server.metrics import METRICS
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits

logger = logging.getLogger(__name__)

APP_NAME = "rollserve"
REPORT_EVERY_S = 2.0


SERVICE_KEYS = (
    "policy", "policy_kwargs", "world", "world_kwargs", "world_policy", "execution_horizon", "openpi_layout",
)  # fmt: skip
DEFAULT_TABLE = "rollserve-committed-state"
# Each setting's check is its CLI flag's (a config file's args must not pass what the flag refuses)
SETTING_CHECKS: dict[str, Callable[[str], Any]] = {
    "max_batch_size": positive_int,
    "max_batch_wait_ms": non_negative_float,
    "inline_below_ms": non_negative_float,
    "max_policy_sessions": positive_int,
    "policy_idle_timeout_s": positive_float,
    "max_connections_per_client": positive_int,
    "max_rollout_sessions": positive_int,
    "rollout_idle_ttl_s": positive_float,
    "max_body_bytes": positive_int,
    "max_json_values": positive_int,
    "refusal_delay_ms": non_negative_float,
    "refusal_delay_max_ms": non_negative_float,
    "refused_connection_lanes": non_negative_int,
    "max_frame_bytes": positive_int,
    "rollout_status_codes": flag_check("--status-codes"),
}
# The Serve deployment's own args: (default, check)
DEPLOYMENT_ARGS: dict[str, tuple[Any, Callable[[str], Any]]] = {
    "replicas": (1, positive_int),
    "replica_cpus": (1.0, non_negative_float),
    "replica_gpus": (0.0, non_negative_float),
}
SETTING_NAMES = {f.name for f in fields(ServerSettings)} - {"limits"} | {"max_frame_bytes"}
NOT_FOR_REPLICAS = ("limits", *PROXY_OWNED_SETTINGS, *HTTP_OPTIONS_SETTINGS)


def check_world(spec: str, world_kwargs: dict[str, Any]) -> None:
    """Refuse a ``world`` (with its ``world_kwargs``) that ``rollserve serve --world`` (with its
    ``--world-arg``) refuses, in its words (``WorldLoadError``), without building it: that is each
    replica's job, on its own devices."""
    from rollserve.models.worlds import world_builder

    world_builder(spec, **world_kwargs)


def check_policies(policy: str | None, policy_kwargs: dict[str, Any], world_policy: str | None) -> None:
    """Refuse a ``policy`` (with its ``policy_kwargs``) or a world's ``world_policy`` that
    ``rollserve serve --policy`` / ``--world-policy`` refuses, in its words (``PolicyLoadError``),
    by the same resolution, without loading it: that is each replica's job, on its own devices."""
    from rollserve.models.loading import policy_builder
    from rollserve.server.launch import world_policy_spec

    if policy:
        policy_builder(str(policy), **policy_kwargs)
    spec = world_policy_spec(world_policy, bool(policy))
    if spec is not None:
        policy_builder(spec)


def checked_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (ServerSettings fields by name) with the CLI's checks applied. Refused: unknown
    names, and those a replica never applies under Serve (the proxy's) given a non-default value."""
    unknown = sorted(set(settings) - SETTING_NAMES)
    if unknown:
        keys = ", ".join((*SERVICE_KEYS, "table_name", *DEPLOYMENT_ARGS))
        raise ValueError(f"unknown args {', '.join(unknown)}: not {keys}, nor a ServerSettings field")
    defaults = ServerSettings()
    owned = [n for n in PROXY_OWNED_SETTINGS if n in settings and settings[n] != getattr(defaults, n)]
    if owned:
        raise ValueError(proxy_owned_refusal(owned, "Ray Serve"))
    http = [n for n in HTTP_OPTIONS_SETTINGS if n in settings and settings[n] != getattr(defaults, n)]
    if http:
        raise ValueError(
            f"{', '.join(http)} cannot apply as an application's args: Ray Serve's proxy takes them "
            "from the config's http_options (docs/scale-out.md)"
        )
    return {n: checked(n, SETTING_CHECKS[n], v) if n in SETTING_CHECKS else v for n, v in settings.items()}


@dataclass(frozen=True)
class ReplicaConfig:
    """What each replica serves, as plain values (a Serve config file gives them as ``args``).

    ``settings`` holds :class:`ServerSettings` fields by name (``max_frame_bytes`` for the wire
    limit). ``max_policy_sessions`` counts per replica (a robot's websocket stays on one);
    ``max_rollout_sessions`` per deployment (the shared table enforces it).
    """

    policy: str | None = None
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    world: str | None = None
    world_kwargs: dict[str, Any] = field(default_factory=dict)
    world_policy: str | None = None
    execution_horizon: int | None = None
    openpi_layout: str = "auto"
    table_name: str = DEFAULT_TABLE
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse once, in the builder, what every replica would otherwise ignore or die on."""
        if not (self.policy or self.world):
            raise ValueError("the app serves nothing: give policy or world (or both)")
        # in one process's order: the policy, the policy a world acts with (only with a world), the world
        check_policies(self.policy, self.policy_kwargs, self.world_policy if self.world else None)
        if not isinstance(self.world_kwargs, dict):
            raise ValueError("world_kwargs must be a map of the world's arguments (as --world-arg KEY=VALUE)")
        if self.world_kwargs and not self.world:
            raise ValueError("world_kwargs needs world (as --world-arg needs --world)")
        if self.world:
            check_world(str(self.world), self.world_kwargs)
        checked("openpi_layout", flag_check("--openpi-layout"), self.openpi_layout)
        if self.execution_horizon is not None:  # as --rtc-horizon: every replica would refuse 0
            checked("execution_horizon", positive_int, self.execution_horizon)
        checked_settings(self.settings)

    def server_settings(self) -> ServerSettings:
        values = checked_settings(self.settings)
        limits = WireLimits(max_frame_bytes=int(values.pop("max_frame_bytes", WireLimits().max_frame_bytes)))
        return ServerSettings(**values, limits=limits)

    @staticmethod
    def settings_of(settings: ServerSettings) -> dict[str, Any]:
        """The fields a replica needs from the CLI's settings (the connection settings are the proxy's:
        the CLI refuses their flags itself, or gives them to the proxy)."""
        values = {
            f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in NOT_FOR_REPLICAS
        }
        return {**values, "max_frame_bytes": settings.limits.max_frame_bytes}


class _Deployment:
    """``create_app``'s view of the whole deployment (``/metrics``, ``/v1/models``), and what keeps
    the table on this deploy's ``limits`` (capacity, idle TTL)."""

    def __init__(self, replica_id: str, actor: Any, has_rollout: bool, limits: tuple[int, float]) -> None:
        self.replica_id, self.actor, self.has_rollout = replica_id, actor, has_rollout
        self.limits = limits
        self.configured: str | None = None  # the actor start this replica last configured

    async def metrics(self) -> tuple[bytes, str]:
        await self.report()  # this one, fresh
        reports = await self.actor.replicas.remote()
        stats = await self.actor.call.remote("stats") if self.has_rollout else {}
        return merge_reports(reports, stats), "text/plain; version=0.0.4; charset=utf-8"

    async def describe(self) -> dict[str, Any]:
        reports = await self.actor.replicas.remote()
        facts: dict[str, Any] = {
            "kind": "ray-serve",
            "replicas": sorted(reports),
            "served_by": self.replica_id,
        }
        if self.has_rollout:
            facts["rollout_sessions"] = await self.actor.call.remote("stats")
        return facts

    async def report(self) -> None:
        """Send this replica's metrics; give the actor this deploy's limits when it has not had them:
        on the replica's start (a redeploy's new limits) and after Ray restarted it (with the
        arguments of the deploy that created it). Only then, so an old replica still running in a
        rolling update does not undo a newer deploy's limits every report."""
        started = await self.actor.report.remote(self.replica_id, METRICS.render()[0])
        if started != self.configured:
            self.configured = await self.actor.configure.remote(*self.limits)

    async def report_forever(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # the actor restarting must not kill the replica
                await self.report()
            await asyncio.sleep(REPORT_EVERY_S)


@serve.ingress()
class RollserveReplica:
    """One replica: its services, the shared rollout store, and the app built from them."""

    async def __init__(self, config: dict[str, Any]) -> None:
        from rollserve.server.launch import load_services

        cfg = ReplicaConfig(**config)
        settings = cfg.server_settings()
        capacity, ttl = settings.max_rollout_sessions, settings.rollout_idle_ttl_s
        actor = table_actor(cfg.table_name, capacity, ttl)
        store = SharedRolloutStore(table_call(actor), capacity) if cfg.world else None
        self.policy, self.rollout = load_services(
            cfg.policy, cfg.world, settings, policy_kwargs=cfg.policy_kwargs,
            execution_horizon=cfg.execution_horizon, openpi_layout=cfg.openpi_layout,
            world_policy=cfg.world_policy, store=store, world_kwargs=cfg.world_kwargs,
        )  # fmt: skip
        replica_id = serve.get_replica_context().replica_id.unique_id
        self.view = _Deployment(replica_id, actor, self.rollout is not None, (capacity, ttl))
        await self.view.report()  # the table takes this deploy's limits before a request comes
        self._reporter = asyncio.get_running_loop().create_task(self.view.report_forever())
        self.settings = settings
        logger.info("replica %s up (pid %d)", replica_id, os.getpid())

    def __serve_build_asgi_app__(self) -> Any:
        from rollserve.server.app import create_app

        return create_app(self.settings, policy=self.policy, rollout=self.rollout, deployment=self.view)


def build_app(args: dict[str, Any]) -> Any:
    """The Serve application builder (``import_path: rollserve.scale.deployment:build_app``).

    ``args``: ``policy``, ``policy_kwargs``, ``world``, ``world_kwargs``, ``world_policy``,
    ``execution_horizon``, ``openpi_layout``, ``table_name``; ``replicas`` (default 1), ``replica_cpus`` (1),
    ``replica_gpus`` (0); any other key is a :class:`ServerSettings` field (or ``max_frame_bytes``).
    """
    args = dict(args)
    replicas, cpus, gpus = (checked(k, check, args.pop(k, d)) for k, (d, check) in DEPLOYMENT_ARGS.items())
    named = {k: args.pop(k) for k in (*SERVICE_KEYS, "table_name") if k in args}
    config = asdict(ReplicaConfig(**named, settings=args))  # a bad arg fails here, not in every replica
    ReplicaConfig(**config).server_settings()  # and so do settings that do not make a ServerSettings
    deployment = serve.deployment(
        RollserveReplica,
        name="RollserveReplica",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
        # a robot's websocket is one request for its whole life: never let Serve's default of 5 cap it
        max_ongoing_requests=max(1000, 4 * int(args.get("max_policy_sessions", 64))),
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
    )
    return deployment.bind(config)


def remove_table(table_name: str) -> None:
    """Kill the deployment's committed-state actor (its sessions are gone with it)."""
    from rollserve.scale.actor import NAMESPACE

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(table_name, namespace=NAMESPACE))
