"""`rollserve serve`: load a policy and/or a world, build the app, and serve it with uvicorn.

Prints one line once the server accepts connections, with the real address (also for ``--port 0``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from rollserve.cli import (
    UsageError,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
)
from rollserve.server.policy.openpi_layouts import AUTO, LAYOUT_NAMES
from rollserve.server.running import EVENT_LOOPS, event_loop_name, listening_socket
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits

logger = logging.getLogger("rollserve.serve")

DEFAULT_POLICY = "rollserve.models.checkpoint:load_default"  # served when neither --policy nor --world
DEFAULT_WORLD = "sim"
# policies whose checkpoint names their actions: ``--action-names`` would clash with those names
NAMED_ACTION_POLICIES = (DEFAULT_POLICY, "rollserve.models.checkpoint:load_flow_policy")
# Serve-only flags and their defaults: given another value without --ray, refused, never ignored
RAY_ONLY_FLAGS = (
    ("--replicas", "replicas", 1),
    ("--replica-cpus", "replica_cpus", 1.0),
    ("--replica-gpus", "replica_gpus", 0.0),
    ("--ray-address", "ray_address", None),
)
MIB = 1024 * 1024


def mib_size(text: str) -> float:
    """argparse type: a size in MiB of at least one byte (a size that rounds down to 0 bytes would
    make a server that refuses every request)."""
    mib = positive_float(text)
    if size_bytes(mib) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte ({1 / MIB:.3g} MiB), got {text}")
    return mib


def size_bytes(mib: float) -> int:
    """A ``--max-*-mb`` value in whole bytes, as the server enforces it."""
    return int(mib * MIB)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="SPEC",
        help="policy factory 'module.path:factory', or 'lerobot:PATH' for a LeRobot checkpoint directory "
        "(config.json, model.safetensors, processor configs; pip install 'rollserve[lerobot]')",
    )  # fmt: skip
    parser.add_argument(
        "--action-names", metavar="A,B,...",
        help="comma-separated action names (a LeRobot checkpoint has none; default action_0, action_1, ...)",
    )  # fmt: skip
    parser.add_argument(
        "--policy-arg", metavar="KEY=VALUE", action="append", default=[],
        help="keyword argument for the policy factory (VALUE parsed as JSON when it can be); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--world", metavar="sim|learned|video|SPEC", help="also serve a world model for RL rollouts"
    )
    parser.add_argument(
        "--world-arg", metavar="KEY=VALUE", action="append", default=[],
        help="keyword argument for the world: path=DIR serves a learned or video world you trained "
        "(rollserve train world [--video] --out DIR), others go to a SPEC factory; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--world-policy", metavar="reference|served|SPEC",
        help="let the world act when a step has no action: the reference flow policy, the policy "
        "this server serves (--policy), or a policy factory 'module.path:factory'",
    )  # fmt: skip
    parser.add_argument(
        "--status-codes", choices=("vllm-omni", "strict"), default="vllm-omni",
        help="rollout error statuses: vLLM-Omni's (default) or rollserve's semantic 409/422/404/415/500; "
        "a request may choose with the X-Rollserve-Status-Codes header",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=port_number, default=8000, help="port (0 picks a free one)")
    parser.add_argument(
        "--api-key", default=os.environ.get("ROLLSERVE_API_KEY"),
        help="require this key on every route but /healthz and /health (default: $ROLLSERVE_API_KEY)",
    )  # fmt: skip
    parser.add_argument("--max-batch", type=positive_int, default=8, help="most requests per model call")
    parser.add_argument(
        "--max-wait-ms", type=non_negative_float, default=2.0, help="how long a batch waits to fill up"
    )
    parser.add_argument(
        "--max-sessions", type=positive_int, default=64, help="most concurrent policy sessions"
    )
    parser.add_argument(
        "--inline-below-ms", type=non_negative_float, default=0.25,
        help="run a request on the event loop, not the engine thread, when the engine is idle and the "
        "policy's recent calls took less than this (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--rtc-horizon", type=positive_int, default=None, help="RTC execution horizon (default: the policy's)"
    )
    parser.add_argument(
        "--openpi-layout", choices=(AUTO, *LAYOUT_NAMES), default=AUTO,
        help="observation keys openpi clients send (default: detect per request)",
    )  # fmt: skip
    parser.add_argument("--max-frame-mb", type=mib_size, default=64.0, help="largest accepted frame, in MiB")
    limits = parser.add_argument_group(
        "limits against hostile or sloppy clients (docs/protocol.md, docs/rollout.md)"
    )
    limits.add_argument(
        "--idle-timeout-s", type=positive_float, default=120.0,
        help="close a policy websocket that sent nothing for this long (pings do not count)",
    )  # fmt: skip
    limits.add_argument(
        "--max-connections-per-client",
        type=positive_int,
        default=32,
        help="policy websockets per client address",
    )
    limits.add_argument("--max-body-mb", type=mib_size, default=16.0, help="largest REST body, in MiB")
    limits.add_argument(
        "--max-json-values",
        type=positive_int,
        default=65_536,
        help="most values in one JSON body (msgpack: no limit)",
    )
    limits.add_argument(
        "--rollout-ttl-s", type=positive_float, default=600.0, help="a rollout session idle this long expires"
    )
    limits.add_argument(
        "--max-rollout-sessions", type=positive_int, default=256,
        help="most open rollout sessions (with --ray: of the whole deployment)",
    )  # fmt: skip
    limits.add_argument(
        "--header-timeout-s",
        type=positive_float,
        default=10.0,
        help="request headers must arrive within this (the server closes a connection whose headers are "
        "late at a random point between this and 1.5x it, so connections opened together do not close "
        "together)",
    )
    limits.add_argument(
        "--keep-alive-s",
        type=positive_float,
        default=5.0,
        help="close an idle keep-alive HTTP connection after this (fractions count; under --ray rounded "
        "to whole seconds, at least 1: Serve's proxy takes whole seconds)",
    )
    limits.add_argument(
        "--max-connections",
        type=positive_int,
        default=2048,
        help="open connections; above it new requests get 503",
    )
    limits.add_argument(
        "--refusal-delay-ms", type=non_negative_float, default=1.0,
        help="a refused input that brings a connection's refusal count to k waits min(max, this * 2^(k-1)) "
        "ms before its reply (REST) or its next message is read (websockets); an accepted request "
        "halves the count; 0: off",
    )  # fmt: skip
    limits.add_argument(
        "--refusal-delay-max-ms",
        type=non_negative_float,
        default=100.0,
        help="the most one refusal is delayed, also when below --refusal-delay-ms; 0: off",
    )
    limits.add_argument(
        "--refused-lanes", type=non_negative_int, default=1,
        help="inputs of connections with refusals in a row handled at once, per transport (websockets, "
        "REST); the others wait their turn; 0: no limit",
    )  # fmt: skip
    parser.add_argument(
        "--loop", choices=EVENT_LOOPS, default="auto",
        help="the event loop (auto: uvloop where it is installed, else asyncio's own)",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error"),
        help="how much the server logs (default: info)",
    )  # fmt: skip
    scale = parser.add_argument_group(
        'scale-out on Ray Serve (pip install "rollserve[ray]"; docs/scale-out.md)'
    )
    scale.add_argument(
        "--ray", action="store_true", help="serve replicas of the app behind Ray Serve's proxy"
    )
    scale.add_argument("--replicas", type=positive_int, default=1, help="how many replicas (with --ray)")
    scale.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (e.g. 'auto'); default: start a local one"
    )
    scale.add_argument(
        "--replica-cpus", type=non_negative_float, default=1.0, help="CPUs per replica (with --ray)"
    )
    scale.add_argument(
        "--replica-gpus", type=non_negative_float, default=0.0, help="GPUs per replica (with --ray)"
    )


def parse_policy_args(items: list[str], flag: str = "--policy-arg") -> dict[str, Any]:
    """``["latency_s=0.05", "name=x"]`` -> ``{"latency_s": 0.05, "name": "x"}`` (also ``--world-arg``)."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{flag} must look like KEY=VALUE, got {item!r}")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def policy_kwargs_of(args: argparse.Namespace) -> dict[str, Any]:
    """The policy factory's keyword arguments from the flags (also each Ray replica's)."""
    kwargs = parse_policy_args(args.policy_arg)
    if getattr(args, "action_names", None):
        kwargs["action_names"] = action_names_of(args.action_names)
    return kwargs


def action_names_of(text: str) -> list[str]:
    """``"x, y,,z"`` -> ``["x", "y", "z"]``: a factory gets names, never the string's characters."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError(f"argument --action-names: no names in {text!r}")
    return names


def check_flag_combinations(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen others would silently ignore or fail on late, as usage errors
    before anything loads."""
    if not args.ray:
        for flag, dest, default in RAY_ONLY_FLAGS:
            if getattr(args, dest) != default:
                raise UsageError(f"argument {flag}: only with --ray (without it one process serves)")
    for flag, given in (("--world-policy", args.world_policy), ("--world-arg", args.world_arg)):
        if given and not args.world:
            raise UsageError(f"argument {flag}: needs --world")
    if args.action_names and args.policy in NAMED_ACTION_POLICIES:
        raise UsageError(
            f"argument --action-names: {args.policy} names its actions from its checkpoint; "
            "--action-names is for checkpoints without names (lerobot:PATH) and factories taking action_names"
        )


def check_world(spec: str | None, args: argparse.Namespace) -> None:
    """A built-in world whose optional dependencies are missing is a usage error naming the extra
    to install, found before serving. Skipped when joining a Ray cluster: its replicas may run on
    machines with another install than this one."""
    if spec and not (args.ray and args.ray_address):
        from rollserve.models.worlds import check_world_dependencies

        check_world_dependencies(spec)


def world_policy_spec(spec: str | None, serves_policy: bool) -> str | None:
    """The policy spec ``--world-policy`` names (``reference``: the shipped one), or None for none and
    for ``served`` (the served policy itself), which needs ``--policy``. A Serve deployment checks
    ``--world-policy`` with it before its replicas start."""
    if not spec:
        return None
    if spec == "served":
        if not serves_policy:
            raise ValueError("--world-policy served needs --policy SPEC")
        return None
    from rollserve.models.world_action import REFERENCE_POLICY

    return REFERENCE_POLICY if spec == "reference" else spec


def _world_policy(spec: str | None, served: Any) -> Any:
    """The policy a world acts with (``--world-policy``), or None."""
    policy_spec = world_policy_spec(spec, served is not None)
    if policy_spec is None:
        return served.policy if spec == "served" else None
    from rollserve.models.loading import load_policy

    return load_policy(policy_spec)


def _load_rollout(
    world_spec: str,
    settings: ServerSettings,
    world_policy: Any = None,
    store: Any = None,
    world_kwargs: dict[str, Any] | None = None,
) -> Any:
    try:
        worlds = importlib.import_module("rollserve.models.worlds")
        service_module = importlib.import_module("rollserve.server.rollout.service")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("rollserve"):
            raise ValueError("world serving is not available in this build of rollserve") from exc
        raise
    try:
        world = worlds.load_world(world_spec, **(world_kwargs or {}))
    except ModuleNotFoundError as exc:  # an optional dependency the checks before could not foresee
        raise ValueError(
            f"world {world_spec!r} needs the module {exc.name!r}, not installed here: "
            'pip install "rollserve[all]"'
        ) from exc
    if world_policy is not None:
        from rollserve.models.world_action import ActingWorld

        world = ActingWorld(world, world_policy)
    return service_module.RolloutService(world, settings, store=store)


def load_services(
    policy_spec: str | None,
    world_spec: str | None,
    settings: ServerSettings,
    *,
    policy_kwargs: dict[str, Any],
    execution_horizon: int | None,
    openpi_layout: str,
    world_policy: str | None = None,
    store: Any = None,
    world_kwargs: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The policy and/or rollout service one server (or one Ray replica) serves. A bad spec raises
    ``ValueError`` with anything already loaded closed again; ``store`` is the rollout store and
    ``world_kwargs`` the world's arguments (``--world-arg``)."""
    policy = rollout = None
    try:
        if policy_spec:
            from rollserve.server.policy.service import PolicyService

            policy = PolicyService.from_spec(
                policy_spec, settings, policy_kwargs=policy_kwargs,
                execution_horizon=execution_horizon, openpi_layout=openpi_layout,
            )  # fmt: skip
        if world_spec:
            world_acts_with = _world_policy(world_policy, policy)
            rollout = _load_rollout(world_spec, settings, world_acts_with, store, world_kwargs)
    except ValueError:
        if policy is not None:
            policy.close()
        raise
    return policy, rollout


def _describe(policy: Any, rollout: Any, settings: ServerSettings, url: str) -> str:
    parts = [f"rollserve serving on {url}"]
    if policy is not None:
        meta = policy.metadata
        parts.append(
            f"policy {meta.name!r} (chunk {meta.chunk_size} x {meta.action_dim}, rtc horizon "
            f"{policy.request_path.execution_horizon}, batch <= {policy.worker.max_batch_size}) "
            f"at ws {url.replace('http', 'ws', 1)}/v1/policy/ws and openpi ws {url.replace('http', 'ws', 1)}/"
        )
    if rollout is not None:
        acts = " (acts by itself when a step has no action)" if rollout.world.spec.acts else ""
        parts.append(f"rollouts at /v1/realtime/sessions{acts}")
    parts.append("api key required" if settings.api_key else "no api key")
    parts.append(f"{settings.event_loop} event loop")
    return " | ".join(parts)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.policy and not args.world:  # a newcomer's first command: serve both built-ins
        args.policy, args.world = DEFAULT_POLICY, DEFAULT_WORLD
    try:
        loop = event_loop_name(args.loop)  # resolved once; a missing uvloop is a clear error, before loading
        policy_kwargs = policy_kwargs_of(args)  # bad --policy-arg or --action-names: before the socket
        world_kwargs = parse_policy_args(args.world_arg, "--world-arg")
        check_flag_combinations(args)
        check_world(args.world, args)
    except ValueError as exc:
        print(f"rollserve serve: error: {exc}", file=sys.stderr)
        return 2
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        max_batch_size=args.max_batch,
        max_batch_wait_ms=args.max_wait_ms,
        inline_below_ms=args.inline_below_ms,
        max_policy_sessions=args.max_sessions,
        rollout_status_codes=args.status_codes,
        max_rollout_sessions=args.max_rollout_sessions,
        limits=WireLimits(max_frame_bytes=size_bytes(args.max_frame_mb)),
        policy_idle_timeout_s=args.idle_timeout_s,
        max_connections_per_client=args.max_connections_per_client,
        max_body_bytes=size_bytes(args.max_body_mb),
        max_json_values=args.max_json_values,
        rollout_idle_ttl_s=args.rollout_ttl_s,
        header_timeout_s=args.header_timeout_s,
        keep_alive_timeout_s=args.keep_alive_s,
        max_connections=args.max_connections,
        refusal_delay_ms=args.refusal_delay_ms,
        refusal_delay_max_ms=args.refusal_delay_max_ms,
        refused_connection_lanes=args.refused_lanes,
        event_loop=loop,
    )
    if args.ray:
        from rollserve.scale.launch import serve_on_ray

        return serve_on_ray(args, settings)
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as exc:
        print(f"rollserve serve: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    try:
        policy, rollout = load_services(
            args.policy, args.world, settings, policy_kwargs=policy_kwargs,
            execution_horizon=args.rtc_horizon, openpi_layout=args.openpi_layout,
            world_policy=args.world_policy, world_kwargs=world_kwargs,
        )  # fmt: skip
    except ValueError as exc:  # PolicyLoadError and bad arguments: a clear message, no traceback
        print(f"rollserve serve: error: {exc}", file=sys.stderr)
        sock.close()
        return 2

    from rollserve.server.app import create_app
    from rollserve.server.running import run_foreground

    app = create_app(settings, policy=policy, rollout=rollout)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    line = _describe(policy, rollout, settings, url)
    run_foreground(app, sock, log_level=args.log_level, on_started=lambda: print(line, flush=True))
    return 0
