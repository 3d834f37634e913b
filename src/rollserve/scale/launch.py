"""``rollserve serve --ray``: start (or join) Ray, deploy N replicas of the app on Serve, wait for Ctrl-C.

Serve's proxy owns the HTTP port; every replica serves the same routes behind it. Prints one line,
like the single-process server, once every replica is up.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from rollserve.server.launch import add_arguments, parse_policy_args, policy_kwargs_of
from rollserve.server.settings import ServerSettings


def free_port(host: str) -> int:
    """A port free right now (Serve's proxy cannot be asked for port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def app_args(args: argparse.Namespace, settings: ServerSettings) -> dict[str, Any]:
    """The application builder's ``args`` for these command-line flags (as a config file gives them)."""
    from rollserve.scale.deployment import ReplicaConfig

    return {
        "policy": args.policy,
        "policy_kwargs": policy_kwargs_of(args),
        "world": args.world,
        "world_kwargs": parse_policy_args(getattr(args, "world_arg", []), "--world-arg"),
        "world_policy": getattr(args, "world_policy", None),
        "execution_horizon": args.rtc_horizon,
        "openpi_layout": args.openpi_layout,
        "replicas": args.replicas,
        "replica_cpus": args.replica_cpus,
        "replica_gpus": args.replica_gpus,
        **ReplicaConfig.settings_of(settings),
    }


# Flags Serve's proxy, not rollserve, answers for under --ray: its uvicorn owns the connections, so
# rollserve's header deadline, connection cap and event-loop choice are not there to apply.
PROXY_OWNED_FLAGS = {
    "header_timeout_s": "--header-timeout-s",
    "max_connections": "--max-connections",
    "loop": "--loop",
}
# The ServerSettings fields behind them, and the header-size cap (no flag): a Serve config's ``args``
# giving one a value other than its default is refused as the flags are.
PROXY_OWNED_SETTINGS = ("header_timeout_s", "max_connections", "event_loop", "max_header_bytes")
# What the proxy takes from a Serve config's ``http_options`` (the CLI passes them there itself).
HTTP_OPTIONS_SETTINGS = ("host", "port", "keep_alive_timeout_s")


def proxy_owned_refusal(names: list[str], where: str) -> str:
    """Why ``names`` are refused: one wording for the CLI's flags and a Serve config's args."""
    return (
        f"{', '.join(names)} cannot apply with {where}: Ray Serve's proxy owns the HTTP connections "
        "(docs/scale-out.md, Limits)"
    )


def flags_without_effect(args: argparse.Namespace) -> list[str]:
    """The proxy-owned flags given a value other than their default: refused, not silently ignored."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    return [
        flag for dest, flag in PROXY_OWNED_FLAGS.items() if getattr(args, dest) != defaults.get_default(dest)
    ]


def flag_check(flag: str) -> Callable[[str], str]:
    """The check ``rollserve serve`` makes of ``flag``'s value (its ``choices``), as a type for
    ``cli.checked``: a Serve config's ``args`` are refused what the flag is refused, in its words."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)

    def check(text: str) -> str:
        try:
            parser.parse_args([f"{flag}={text}"])  # one token: a value starting with "-" is a value
        except argparse.ArgumentError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    return check


def serve_on_ray(args: argparse.Namespace, settings: ServerSettings) -> int:
    ignored = flags_without_effect(args)
    if ignored:
        print(f"rollserve serve: error: {proxy_owned_refusal(ignored, '--ray')}", file=sys.stderr)
        return 2
    try:
        import ray
        from ray import serve
    except ModuleNotFoundError:
        print('rollserve serve: error: --ray needs Ray Serve: pip install "rollserve[ray]"', file=sys.stderr)
        return 2
    from rollserve.scale.deployment import APP_NAME, DEFAULT_TABLE, build_app, remove_table

    if args.replicas < 1:
        print("rollserve serve: error: --replicas must be >= 1", file=sys.stderr)
        return 2
    try:
        application = build_app(app_args(args, settings))
    except (TypeError, ValueError) as exc:
        print(f"rollserve serve: error: {exc}", file=sys.stderr)
        return 2
    local = args.ray_address is None
    if local:  # logical CPUs: enough for every replica whatever the machine's core count
        cpus = max(os.cpu_count() or 1, int(args.replicas * args.replica_cpus + 0.999))
        ray.init(num_cpus=cpus, include_dashboard=False, namespace="rollserve")
    else:
        ray.init(address=args.ray_address, namespace="rollserve")
    port = args.port or free_port(args.host)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # the proxy's own idle keep-alive (Ray's default is 90 s); the other connection limits are Ray's
        keep_alive = max(1, round(settings.keep_alive_timeout_s))
        serve.start(http_options={"host": args.host, "port": port, "keep_alive_timeout_s": keep_alive})
        try:
            serve.run(application, name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # Serve gave up on the replicas (a bad spec, no resources)
            print(f"rollserve serve: error: the replicas did not start: {exc}", file=sys.stderr)
            return 2
        url = f"http://[{args.host}]:{port}" if ":" in args.host else f"http://{args.host}:{port}"
        served = " and ".join(x for x in (args.policy and "policy", args.world and "rollouts") if x)
        where = "a local Ray" if local else f"Ray at {args.ray_address}"
        key = "api key required" if settings.api_key else "no api key"
        replicas = f"{args.replicas} replica(s) on Ray Serve ({where})"
        print(f"rollserve serving on {url} | {replicas} | {served} | {key}", flush=True)
        stop.wait()
    finally:
        try:
            serve.delete(APP_NAME)
            remove_table(DEFAULT_TABLE)
            if local:
                serve.shutdown()
        finally:
            ray.shutdown()
    return 0
