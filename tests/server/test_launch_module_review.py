"""`rollserve serve` from its flags to the app it serves (``server/launch.py``), run in this process.

``main`` runs as the CLI runs it; only uvicorn's foreground run is replaced by a recorder, which
serves the app main built on the socket main bound (uvicorn on a thread), announces it with main's
own callback, and runs the test's checks against it. The expected values are the documented ones:
the defaults in README.md ("Serving", "Security"), docs/protocol.md and docs/rollout.md ("Limits")
and docs/scale-out.md, in bytes and seconds as the server enforces them.
"""

from __future__ import annotations

import argparse
import io
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

from rollserve.cli import UsageError
from rollserve.cli import main as cli_main
from rollserve.models.simple_policies import ChunkPolicy
from rollserve.server import app as app_module
from rollserve.server import launch, running
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits

CHUNK = "rollserve.models.simple_policies:chunk_policy"  # 'chunk-policy', chunk 20 x 6, horizon 10
MIB = 1_048_576


@dataclass
class Launched:
    """What one ``rollserve serve`` run built, as the recorder saw it."""

    code: int
    out: str
    err: str
    settings: ServerSettings | None = None
    policy: Any = None
    rollout: Any = None
    bound: tuple[str, int] | None = None  # the address main asked to listen on
    log_level: str | None = None
    served: Any = None  # what the probe returned while the server ran
    flushed: str | None = None  # what of the startup line a reader of a pipe had seen
    basic_config: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _uvicorn_on(app: Any, sock: socket.socket) -> Iterator[None]:
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(running.uvicorn_config(app, host, port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:  # uvicorn sets it once it accepts; a failed start ends the thread
        assert thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive()


class _Pipe(io.StringIO):
    """stdout as a pipe to another process: only what was flushed has reached the reader."""

    flushed = ""

    def flush(self) -> None:
        self.flushed = self.getvalue()


def _announce(on_started: Callable[[], None]) -> str:
    """Run main's startup callback with stdout a pipe; what reached the reader, also printed here."""
    pipe, stdout = _Pipe(), sys.stdout
    sys.stdout = pipe
    try:
        on_started()
    finally:
        sys.stdout = stdout
    print(pipe.getvalue(), end="")
    return pipe.flushed


def _launch(
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    probe: Callable[[str], Any] | None = None,
) -> Launched:
    """``rollserve serve ARGV`` in this process. The port main asks for is recorded and an ephemeral
    one bound instead (``--port`` defaults to 8000, which this machine may be using)."""
    seen: dict[str, Any] = {}
    real_socket = launch.listening_socket
    real_create_app = app_module.create_app

    def listen(host: str, port: int) -> socket.socket:
        seen["bound"] = (host, port)
        return real_socket(host, 0)

    def create_app(settings: ServerSettings, *, policy: Any = None, rollout: Any = None) -> Any:
        seen.update(settings=settings, policy=policy, rollout=rollout)
        return real_create_app(settings, policy=policy, rollout=rollout)

    def run_foreground(
        app: Any, sock: socket.socket, log_level: str = "?", on_started: Callable[[], None] | None = None
    ) -> None:
        seen["log_level"] = log_level
        assert on_started is not None
        if probe is None:
            sock.close()
            seen["flushed"] = _announce(on_started)
            return
        with _uvicorn_on(app, sock):
            seen["flushed"] = _announce(on_started)
            host, port = sock.getsockname()[:2]
            seen["served"] = probe(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")

    basic_config: dict[str, Any] = {}
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: basic_config.update(kw))
    monkeypatch.setattr(launch, "listening_socket", listen)
    monkeypatch.setattr(app_module, "create_app", create_app)
    monkeypatch.setattr(running, "run_foreground", run_foreground)
    try:
        code = cli_main(["serve", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    launched = Launched(code, captured.out, captured.err, basic_config=basic_config, **seen)
    if probe is None:  # served apps close their services as uvicorn shuts them down
        for service in (launched.policy, launched.rollout):
            if service is not None:
                service.close()
    return launched


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLSERVE_API_KEY", raising=False)


def _refused(launched: Launched, message: str) -> None:
    """Exit 2 with exactly one line on stderr, ``rollserve serve: error: MESSAGE``, nothing served."""
    assert launched.code == 2, launched.err
    assert launched.err == f"rollserve serve: error: {message}\n"
    assert launched.settings is None


# -- the documented defaults ------------------------------------------------------------------------


def test_the_documented_defaults(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    launched = _launch(["--world", "toy"], monkeypatch, capsys)
    assert launched.code == 0, launched.err
    assert launched.bound == ("127.0.0.1", 8000)  # README: binds to 127.0.0.1 unless --host
    assert launched.settings == ServerSettings(
        host="127.0.0.1",
        port=8000,
        api_key=None,
        max_batch_size=8,  # docs/performance.md: "Defaults: --max-batch 8 --max-wait-ms 2"
        max_batch_wait_ms=2.0,
        inline_below_ms=0.25,  # docs/protocol.md, README
        max_policy_sessions=64,  # docs/protocol.md, Limits: Connections
        policy_idle_timeout_s=120.0,
        max_connections_per_client=32,
        max_connections=2048,
        limits=WireLimits(max_frame_bytes=64 * MIB),
        max_rollout_sessions=256,  # docs/rollout.md, Limits
        rollout_idle_ttl_s=600.0,
        rollout_status_codes="vllm-omni",  # docs/rollout.md: vLLM-Omni's codes unless --status-codes strict
        max_body_bytes=16 * MIB,
        max_json_values=65_536,
        header_timeout_s=10.0,
        keep_alive_timeout_s=5.0,  # docs/protocol.md, HTTP
        refusal_delay_ms=1.0,  # 1 ms doubling, at most 100 ms, one lane
        refusal_delay_max_ms=100.0,
        refused_connection_lanes=1,
        event_loop="asyncio",  # --loop auto: uvloop is not installed here
    )
    assert launched.log_level == "info"
    assert launched.basic_config == {
        "level": "INFO",
        "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
    }


def test_the_default_wire_limits_are_the_documented_ones() -> None:
    """docs/protocol.md, Limits: 64 MiB frames, 16 Mi elements per tensor, 8 dims, strings 1 MiB,
    100k items per map; serve changes only the frame limit."""
    limits = WireLimits(max_frame_bytes=64 * MIB)
    assert (limits.max_tensor_elements, limits.max_tensor_dims) == (16 * MIB, 8)
    assert (limits.max_string_bytes, limits.max_container_items) == (MIB, 100_000)


def test_each_flag_reaches_its_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--world", "toy", "--host", "localhost", "--port", "0", "--api-key", "k-1",
        "--max-batch", "3", "--max-wait-ms", "4.5", "--max-sessions", "5", "--inline-below-ms", "0.5",
        "--status-codes", "strict", "--max-rollout-sessions", "7", "--max-frame-mb", "2",
        "--idle-timeout-s", "9.5", "--max-connections-per-client", "11", "--max-body-mb", "0.5",
        "--max-json-values", "13", "--rollout-ttl-s", "14.5", "--header-timeout-s", "3.5",
        "--keep-alive-s", "2.5", "--max-connections", "17", "--refusal-delay-ms", "1.5",
        "--refusal-delay-max-ms", "19", "--refused-lanes", "2", "--loop", "asyncio", "--log-level", "warning",
    ]  # fmt: skip
    launched = _launch(argv, monkeypatch, capsys)
    assert launched.code == 0, launched.err
    assert launched.bound == ("localhost", 0)
    assert launched.settings == ServerSettings(
        host="localhost",
        port=0,
        api_key="k-1",
        max_batch_size=3,
        max_batch_wait_ms=4.5,
        inline_below_ms=0.5,
        max_policy_sessions=5,
        policy_idle_timeout_s=9.5,
        max_connections_per_client=11,
        max_connections=17,
        limits=WireLimits(max_frame_bytes=2 * MIB),
        max_rollout_sessions=7,
        rollout_idle_ttl_s=14.5,
        rollout_status_codes="strict",
        max_body_bytes=MIB // 2,
        max_json_values=13,
        header_timeout_s=3.5,
        keep_alive_timeout_s=2.5,
        refusal_delay_ms=1.5,
        refusal_delay_max_ms=19.0,
        refused_connection_lanes=2,
        event_loop="asyncio",
    )
    assert launched.log_level == "warning"
    assert launched.basic_config["level"] == "WARNING"


def test_the_ray_only_flags_at_their_defaults_are_accepted_without_ray(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/scale-out.md: at other than their defaults they are refused; at them, accepted."""
    argv = ["--world", "toy", "--replicas", "1", "--replica-cpus", "1", "--replica-gpus", "0"]
    assert _launch(argv, monkeypatch, capsys).code == 0


# -- what is served, and the startup line -----------------------------------------------------------


def _models(base: str) -> list[tuple[str, str]]:
    data = httpx.get(base + "/v1/models", timeout=30).json()["data"]
    return [(model["kind"], model["id"]) for model in data]


def test_no_policy_and_no_world_serves_the_built_in_policy_and_the_sim_world(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(["--port", "0"], monkeypatch, capsys, probe=_models)
    assert launched.code == 0, launched.err
    assert launched.policy.spec == "rollserve.models.checkpoint:load_default"
    assert launched.rollout.world.spec.name == "sim"
    kinds = [kind for kind, _ in launched.served]
    assert kinds == ["policy", "world"] and ("world", "sim") in launched.served


def test_the_startup_line_names_the_address_the_policy_and_the_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--policy", CHUNK, "--world", "toy", "--port", "0", "--rtc-horizon", "4", "--max-batch", "3",
        "--api-key", "k", "--loop", "asyncio",
    ]  # fmt: skip
    launched = _launch(argv, monkeypatch, capsys, probe=lambda base: httpx.get(base + "/healthz").text)
    assert launched.served == "OK\n"
    (line,) = launched.out.splitlines()
    port = int(re.fullmatch(r"rollserve serving on http://127\.0\.0\.1:(\d+) \| .*", line).group(1))  # type: ignore[union-attr]
    assert launched.flushed == launched.out  # at once: a supervisor reading a pipe sees it while it serves
    assert line == (
        f"rollserve serving on http://127.0.0.1:{port} | policy 'chunk-policy' (chunk 20 x 6, rtc horizon "
        f"4, batch <= 3) at ws ws://127.0.0.1:{port}/v1/policy/ws and openpi ws ws://127.0.0.1:{port}/ | "
        "rollouts at /v1/realtime/sessions | api key required | asyncio event loop"
    )


def test_an_ipv6_address_is_bracketed_in_the_startup_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(
        ["--world", "toy", "--host", "::1", "--port", "0"],
        monkeypatch,
        capsys,
        probe=lambda base: (base, httpx.get(base + "/healthz").status_code),
    )
    base, status = launched.served
    assert status == 200
    assert (
        launched.out == f"rollserve serving on {base} | "
        "rollouts at /v1/realtime/sessions | no api key | asyncio event loop\n"
    )
    assert base.startswith("http://[::1]:")


def test_a_world_that_acts_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(
        ["--world", "learned", "--world-policy", "reference", "--port", "0"], monkeypatch, capsys
    )
    assert launched.code == 0, launched.err
    assert launched.out.split(" | ")[1:] == [
        "rollouts at /v1/realtime/sessions (acts by itself when a step has no action)",
        "no api key",
        "asyncio event loop\n",
    ]


def test_an_empty_api_key_requires_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(["--world", "toy", "--port", "0", "--api-key", ""], monkeypatch, capsys)
    assert launched.settings.api_key is None  # type: ignore[union-attr]
    assert " | no api key | " in launched.out


def test_the_key_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROLLSERVE_API_KEY", "from-env")
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    assert parser.parse_args([]).api_key == "from-env"


def test_rtc_horizon_and_layout_reach_the_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--policy", CHUNK, "--port", "0", "--rtc-horizon", "7", "--openpi-layout", "droid"]
    launched = _launch(argv, monkeypatch, capsys)
    assert launched.code == 0, launched.err
    assert launched.rollout is None
    assert launched.policy.request_path.execution_horizon == 7
    assert launched.policy.openpi_layout == "droid"
    default = _launch(["--policy", CHUNK, "--port", "0"], monkeypatch, capsys)
    assert default.policy.request_path.execution_horizon == 10  # the policy's own
    assert default.policy.openpi_layout == "auto"  # docs/protocol.md: detect per request


# -- refusals: exit 2, one line, before anything is served -------------------------------------------


NO_UVLOOP = "the uvloop event loop is not installed (pip install uvloop), or use --loop asyncio"
RAY_ONLY = [("--replicas", "2"), ("--replica-cpus", "2"), ("--replica-gpus", "1"), ("--ray-address", "auto")]


@pytest.mark.parametrize(("flag", "value"), RAY_ONLY)
def test_a_ray_only_flag_without_ray(
    flag: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(["--world", "toy", flag, value], monkeypatch, capsys)
    _refused(launched, f"argument {flag}: only with --ray (without it one process serves)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy-arg", "oops"], "--policy-arg must look like KEY=VALUE, got 'oops'"),
        (["--policy-arg", "=3"], "--policy-arg must look like KEY=VALUE, got '=3'"),
        (["--policy-arg", "1a=3"], "--policy-arg must look like KEY=VALUE, got '1a=3'"),
        (["--world", "toy", "--world-arg", "path"], "--world-arg must look like KEY=VALUE, got 'path'"),
        (["--policy", CHUNK, "--world-policy", "reference"], "argument --world-policy: needs --world"),
        (["--policy", CHUNK, "--world-arg", "path=x"], "argument --world-arg: needs --world"),
        (["--world", "toy", "--loop", "uvloop"], NO_UVLOOP),
        (["--world", "sim", "--world-policy", "served"], "--world-policy served needs --policy SPEC"),
    ],
)  # fmt: skip
def test_refusals_in_their_words(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(_launch([*argv, "--port", "0"], monkeypatch, capsys), message)


@pytest.mark.parametrize(
    "policy",
    [
        [],
        ["--policy", "rollserve.models.checkpoint:load_default"],
        ["--policy", "rollserve.models.checkpoint:load_flow_policy"],
    ],
)
def test_action_names_for_a_checkpoint_that_names_its_actions(
    policy: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/policy.md: a flow-policy checkpoint names its actions, so --action-names is refused with
    either spec; plain ``serve`` serves the built-in one."""
    launched = _launch([*policy, "--action-names", "a,b"], monkeypatch, capsys)
    spec = policy[1] if policy else "rollserve.models.checkpoint:load_default"
    _refused(
        launched,
        f"argument --action-names: {spec} names its actions from its checkpoint; --action-names is for "
        "checkpoints without names (lerobot:PATH) and factories taking action_names",
    )


def test_a_taken_port(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = cli_main(["serve", "--world", "toy", "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        err
        == f"rollserve serve: error: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use\n"
    )


def test_a_failed_load_closes_the_socket_and_the_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A world that fails to load after the policy did: the policy is closed again, and so is the
    socket main had bound, so the port is free the moment ``serve`` exits."""
    closed: list[ChunkPolicy] = []
    monkeypatch.setattr(ChunkPolicy, "close", lambda self: closed.append(self), raising=False)
    sockets: list[socket.socket] = []
    real_socket = running.listening_socket

    def listen(host: str, port: int) -> socket.socket:
        sockets.append(real_socket(host, port))
        return sockets[-1]

    monkeypatch.setattr(launch, "listening_socket", listen)
    code = cli_main(["serve", "--policy", CHUNK, "--world", "nosuchmod:f", "--port", "0"])
    assert code == 2
    assert capsys.readouterr().err.startswith("rollserve serve: error: world spec 'nosuchmod:f'")
    assert len(closed) == 1
    (sock,) = sockets
    assert sock.fileno() == -1


def test_a_world_acting_with_the_served_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shaped = ["--policy-arg", "state_dim=15", "--policy-arg", "action_dim=8", "--policy-arg", "chunk_size=8"]
    argv = ["--policy", CHUNK, *shaped, "--world", "toy", "--world-policy", "served", "--port", "0"]
    launched = _launch(argv, monkeypatch, capsys)
    assert launched.code == 0, launched.err
    assert launched.rollout.world.policy is launched.policy.policy
    assert launched.policy.metadata.chunk_size == 8


# -- the helpers, one rule each ------------------------------------------------------------------------


def test_policy_args_are_json_when_they_can_be() -> None:
    parsed = launch.parse_policy_args(["n=3", 'text="3"', "a=b=c", "empty=", "word=x", "on=true"])
    assert parsed == {"n": 3, "text": "3", "a": "b=c", "empty": "", "word": "x", "on": True}


@pytest.mark.parametrize("item", ["oops", "=3", "1a=3", "a-b=3"])
def test_policy_args_need_a_key_that_is_a_name(item: str) -> None:
    with pytest.raises(ValueError) as info:
        launch.parse_policy_args([item])
    assert str(info.value) == f"--policy-arg must look like KEY=VALUE, got {item!r}"
    with pytest.raises(ValueError) as info:
        launch.parse_policy_args([item], "--world-arg")
    assert str(info.value) == f"--world-arg must look like KEY=VALUE, got {item!r}"


def test_sizes_in_mib_become_whole_bytes() -> None:
    assert launch.size_bytes(1.5) == 1_572_864
    assert launch.size_bytes(64.0) == 67_108_864
    assert launch.size_bytes(1 / MIB) == 1
    assert launch.size_bytes(1.9 / MIB) == 1  # rounded down, as the server counts bytes


def test_a_size_of_exactly_one_byte_is_accepted_and_less_is_refused() -> None:
    assert launch.mib_size(repr(1 / MIB)) == 1 / MIB
    with pytest.raises(argparse.ArgumentTypeError) as info:
        launch.mib_size("9.5e-07")
    assert str(info.value) == "must be at least 1 byte (9.54e-07 MiB), got 9.5e-07"
    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0, got 0"):
        launch.mib_size("0")


def test_action_names_are_names() -> None:
    assert launch.action_names_of("a") == ["a"]
    assert launch.action_names_of(" a ,b") == ["a", "b"]
    with pytest.raises(UsageError) as info:
        launch.action_names_of(",")
    assert str(info.value) == "argument --action-names: no names in ','"


@pytest.mark.parametrize(
    ("ray", "address", "checked"),
    [(False, None, True), (False, "auto", True), (True, None, True), (True, "auto", False)],
)  # fmt: skip
def test_the_world_extra_is_checked_unless_joining_a_cluster(
    ray: bool, address: str | None, checked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/scale-out.md: joining a cluster (--ray-address) the sim/video extra is not checked here."""
    from rollserve.models import worlds

    seen: list[str] = []
    monkeypatch.setattr(worlds, "check_world_dependencies", seen.append)
    launch.check_world("sim", argparse.Namespace(ray=ray, ray_address=address))
    launch.check_world(None, argparse.Namespace(ray=False, ray_address=None))
    assert seen == (["sim"] if checked else [])


def test_world_policy_specs() -> None:
    assert launch.world_policy_spec(None, True) is None
    assert launch.world_policy_spec("", True) is None
    assert launch.world_policy_spec("served", True) is None
    assert launch.world_policy_spec("reference", False) == "rollserve.models.checkpoint:load_default"
    assert launch.world_policy_spec("my.pkg:make", False) == "my.pkg:make"
    with pytest.raises(ValueError) as info:
        launch.world_policy_spec("served", False)
    assert str(info.value) == "--world-policy served needs --policy SPEC"


def test_load_services_hands_the_store_and_the_world_args_on() -> None:
    from rollserve.server.rollout.store import RolloutStore

    settings = ServerSettings()
    store = RolloutStore(3, 60.0)
    policy, rollout = launch.load_services(
        None, "toy", settings, policy_kwargs={}, execution_horizon=None, openpi_layout="auto", store=store
    )
    try:
        assert policy is None
        assert rollout.store is store
        assert rollout.settings is settings
    finally:
        rollout.close()


@pytest.mark.parametrize(
    ("name", "own"), [("rollserve.models.worlds", True), ("numpy", False), (None, False)]
)
def test_a_build_without_world_serving(name: str | None, own: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollserve module missing is this build's limit, said in words; another module missing is
    re-raised as it is."""

    def missing(module: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(launch.importlib, "import_module", missing)
    if own:
        with pytest.raises(ValueError) as info:
            launch._load_rollout("toy", ServerSettings())
        assert str(info.value) == "world serving is not available in this build of rollserve"
    else:
        with pytest.raises(ModuleNotFoundError):
            launch._load_rollout("toy", ServerSettings())


# -- --help: what each flag says, read against the docs ------------------------------------------------

# flag: (metavar, choices, help). Read against README and docs/*.md; ``--refusal-delay-ms`` said "an
# accepted request resets it" while the server halves the count (docs/protocol.md, docs/rollout.md).
HELP: dict[str, tuple[str | None, tuple[str, ...] | None, str | None]] = {
    "--policy": (
        "SPEC",
        None,
        "policy factory 'module.path:factory', or 'lerobot:PATH' for a LeRobot checkpoint directory "
        "(config.json, model.safetensors, processor configs; pip install 'rollserve[lerobot]')",
    ),
    "--action-names": (
        "A,B,...",
        None,
        "comma-separated action names (a LeRobot checkpoint has none; default action_0, action_1, ...)",
    ),
    "--policy-arg": (
        "KEY=VALUE",
        None,
        "keyword argument for the policy factory (VALUE parsed as JSON when it can be); repeatable",
    ),
    "--world": ("sim|learned|video|SPEC", None, "also serve a world model for RL rollouts"),
    "--world-arg": (
        "KEY=VALUE",
        None,
        "keyword argument for the world: path=DIR serves a learned or video world you trained "
        "(rollserve train world [--video] --out DIR), others go to a SPEC factory; repeatable",
    ),
    "--world-policy": (
        "reference|served|SPEC",
        None,
        "let the world act when a step has no action: the reference flow policy, the policy this server "
        "serves (--policy), or a policy factory 'module.path:factory'",
    ),
    "--status-codes": (
        None,
        ("vllm-omni", "strict"),
        "rollout error statuses: vLLM-Omni's (default) or rollserve's semantic 409/422/404/415/500; a "
        "request may choose with the X-Rollserve-Status-Codes header",
    ),
    "--host": (None, None, "bind address (default: loopback only)"),
    "--port": (None, None, "port (0 picks a free one)"),
    "--api-key": (
        None,
        None,
        "require this key on every route but /healthz and /health (default: $ROLLSERVE_API_KEY)",
    ),
    "--max-batch": (None, None, "most requests per model call"),
    "--max-wait-ms": (None, None, "how long a batch waits to fill up"),
    "--max-sessions": (None, None, "most concurrent policy sessions"),
    "--inline-below-ms": (
        None,
        None,
        "run a request on the event loop, not the engine thread, when the engine is idle and the "
        "policy's recent calls took less than this (0: never)",
    ),
    "--rtc-horizon": (None, None, "RTC execution horizon (default: the policy's)"),
    "--openpi-layout": (
        None,
        ("auto", "droid", "aloha", "libero"),
        "observation keys openpi clients send (default: detect per request)",
    ),
    "--max-frame-mb": (None, None, "largest accepted frame, in MiB"),
    "--idle-timeout-s": (
        None,
        None,
        "close a policy websocket that sent nothing for this long (pings do not count)",
    ),
    "--max-connections-per-client": (None, None, "policy websockets per client address"),
    "--max-body-mb": (None, None, "largest REST body, in MiB"),
    "--max-json-values": (None, None, "most values in one JSON body (msgpack: no limit)"),
    "--rollout-ttl-s": (None, None, "a rollout session idle this long expires"),
    "--max-rollout-sessions": (
        None,
        None,
        "most open rollout sessions (with --ray: of the whole deployment)",
    ),
    "--header-timeout-s": (
        None,
        None,
        "request headers must arrive within this (the server closes a connection whose headers are "
        "late at a random point between this and 1.5x it, so connections opened together do not "
        "close together)",
    ),
    "--keep-alive-s": (
        None,
        None,
        "close an idle keep-alive HTTP connection after this (fractions count; under --ray rounded to "
        "whole seconds, at least 1: Serve's proxy takes whole seconds)",
    ),
    "--max-connections": (None, None, "open connections; above it new requests get 503"),
    "--refusal-delay-ms": (
        None,
        None,
        "a refused input that brings a connection's refusal count to k waits min(max, this * "
        "2^(k-1)) ms before its reply (REST) or its next message is read (websockets); an accepted "
        "request halves the count; 0: off",
    ),
    "--refusal-delay-max-ms": (
        None,
        None,
        "the most one refusal is delayed, also when below --refusal-delay-ms; 0: off",
    ),
    "--refused-lanes": (
        None,
        None,
        "inputs of connections with refusals in a row handled at once, per transport (websockets, "
        "REST); the others wait their turn; 0: no limit",
    ),
    "--loop": (
        None,
        ("auto", "uvloop", "asyncio"),
        "the event loop (auto: uvloop where it is installed, else asyncio's own)",
    ),
    "--log-level": (None, ("debug", "info", "warning", "error"), "how much the server logs (default: info)"),
    "--ray": (None, None, "serve replicas of the app behind Ray Serve's proxy"),
    "--replicas": (None, None, "how many replicas (with --ray)"),
    "--ray-address": (None, None, "join this Ray cluster (e.g. 'auto'); default: start a local one"),
    "--replica-cpus": (None, None, "CPUs per replica (with --ray)"),
    "--replica-gpus": (None, None, "GPUs per replica (with --ray)"),
}
GROUPS = {
    "limits against hostile or sloppy clients (docs/protocol.md, docs/rollout.md)": [
        "--idle-timeout-s", "--max-connections-per-client", "--max-body-mb", "--max-json-values",
        "--rollout-ttl-s", "--max-rollout-sessions", "--header-timeout-s", "--keep-alive-s",
        "--max-connections", "--refusal-delay-ms", "--refusal-delay-max-ms", "--refused-lanes",
    ],
    'scale-out on Ray Serve (pip install "rollserve[ray]"; docs/scale-out.md)': [
        "--ray", "--replicas", "--ray-address", "--replica-cpus", "--replica-gpus",
    ],
}  # fmt: skip


def test_each_flag_says_what_it_does() -> None:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    flags = {
        action.option_strings[0]: (
            action.metavar,
            tuple(action.choices) if action.choices else None,
            action.help,
        )
        for action in parser._actions
        if action.dest != "help"
    }
    assert flags == HELP
    assert [action.option_strings for action in parser._actions[1:]] == [[flag] for flag in HELP]
    groups = {
        group.title: [action.option_strings[0] for action in group._group_actions]
        for group in parser._action_groups
        if group.title not in ("positional arguments", "options")
    }
    assert groups == GROUPS


def test_the_policy_and_world_args_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    args = parser.parse_args(["--policy-arg", "a=1", "--policy-arg", "b=2", "--world-arg", "c=3"])
    assert (args.policy_arg, args.world_arg) == (["a=1", "b=2"], ["c=3"])
    fresh = parser.parse_args([])
    assert (fresh.policy_arg, fresh.world_arg, fresh.ray) == ([], [], False)
    assert parser.parse_args(["--ray"]).ray is True


def test_ray_gets_the_flags_and_the_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ray`` hands the parsed flags and the same settings to the Serve launcher, whose exit status
    is serve's; nothing binds here (Serve's proxy owns the port)."""
    from rollserve.scale import launch as scale_launch

    handed: list[tuple[argparse.Namespace, ServerSettings]] = []
    monkeypatch.setattr(
        scale_launch, "serve_on_ray", lambda args, settings: handed.append((args, settings)) or 7
    )
    monkeypatch.setattr(
        launch, "listening_socket", lambda host, port: pytest.fail("bound a socket under --ray")
    )
    argv = ["serve", "--ray", "--replicas", "3", "--world", "toy", "--max-batch", "5", "--port", "0"]
    assert cli_main(argv) == 7
    ((args, settings),) = handed
    assert (args.ray, args.replicas, args.world, args.policy) == (True, 3, "toy", None)
    assert settings == ServerSettings(port=0, max_batch_size=5, event_loop="asyncio")


def test_world_args_reach_the_world(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = _launch(["--world", "toy", "--world-arg", "path=x", "--port", "0"], monkeypatch, capsys)
    assert launched.code == 2
    assert launched.err == (
        "rollserve serve: error: world 'toy' takes no argument 'path' (--world-arg); it takes none\n"
    )


def test_a_module_missing_while_the_world_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollserve.models import worlds

    def build(spec: str, **kwargs: Any) -> None:
        raise ModuleNotFoundError("No module named 'mujoco'", name="mujoco")

    monkeypatch.setattr(worlds, "load_world", build)
    with pytest.raises(ValueError) as info:
        launch._load_rollout("sim", ServerSettings())
    assert str(info.value) == (
        "world 'sim' needs the module 'mujoco', not installed here: pip install \"rollserve[all]\""
    )
