"""The Serve application builder refuses what a Serve config's ``args`` cannot mean, with the
setting's name, before any replica starts: settings Serve's proxy owns (the CLI refuses their
flags under ``--ray``), limits the CLI's flags would refuse, unknown keys, a world, status-code
mode or openpi layout ``rollserve serve`` would refuse, and an app that serves nothing. Skipped
where Ray is not installed; builds only, starts no Ray."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

pytest.importorskip("ray.serve")

from ray import serve

from rollserve.cli import UsageError
from rollserve.models.worlds import WorldLoadError
from rollserve.scale.deployment import build_app


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"header_timeout_s": 1}, "header_timeout_s cannot apply with Ray Serve"),
        ({"max_connections": 5}, "max_connections cannot apply with Ray Serve"),
        ({"event_loop": "uvloop"}, "event_loop cannot apply with Ray Serve"),
        ({"max_header_bytes": 1024}, "max_header_bytes cannot apply with Ray Serve"),
        ({"host": "0.0.0.0"}, "host"),
        ({"port": 1}, "port"),
        ({"keep_alive_timeout_s": 2}, "keep_alive_timeout_s"),
        ({"max_rollout_sessions": 0}, "max_rollout_sessions"),
        ({"rollout_idle_ttl_s": -5}, "rollout_idle_ttl_s"),
        ({"max_batch_wait_ms": "soon"}, "max_batch_wait_ms"),
        ({"max_frame_bytes": 0}, "max_frame_bytes"),
        ({"replicas": 0}, "replicas"),
        ({"replica_gpus": -1}, "replica_gpus"),
        ({"max_rolout_sessions": 10}, "max_rolout_sessions"),
    ],
)
def test_a_bad_arg_is_refused_by_name(args: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build_app({"world": "toy", **args})


def test_proxy_owned_settings_read_as_the_cli_says_them() -> None:
    with pytest.raises(ValueError) as err:
        build_app({"world": "toy", "max_connections": 5, "header_timeout_s": 1})
    assert str(err.value) == (
        "header_timeout_s, max_connections cannot apply with Ray Serve: Ray Serve's proxy owns the "
        "HTTP connections (docs/scale-out.md, Limits)"
    )


def test_an_app_serving_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="policy or world"):
        build_app({})


def test_defaults_of_proxy_owned_settings_and_valid_limits_build() -> None:
    args = {"world": "toy", "header_timeout_s": 10.0, "event_loop": "auto", "max_rollout_sessions": 1}
    assert isinstance(build_app({**args, "rollout_idle_ttl_s": 0.5, "replicas": 2}), serve.Application)


def test_the_clis_settings_build_whatever_its_connection_flags() -> None:
    from rollserve.scale.deployment import ReplicaConfig
    from rollserve.server.settings import ServerSettings

    # the CLI resolves the event loop and gives host, port and keep-alive to the proxy itself
    settings = ServerSettings(host="0.0.0.0", port=9000, keep_alive_timeout_s=2.0, event_loop="asyncio")
    assert isinstance(build_app({"world": "toy", **ReplicaConfig.settings_of(settings)}), serve.Application)


# -- what `rollserve serve` refuses by value: the world, the status-code mode, the openpi layout ---------
@pytest.mark.parametrize(
    ("world", "message"),
    [
        ("nope", "unknown world 'nope': use sim, learned, video, toy or module.path:factory"),
        ("no_such_module:make", "world spec 'no_such_module:make': no module named 'no_such_module'"),
        (
            "rollserve.models.worlds:nope",
            "world spec 'rollserve.models.worlds:nope': 'rollserve.models.worlds' has no attribute 'nope'",
        ),
        (
            "rollserve.models.worlds:DROID_ACTION_NAMES",
            "world spec 'rollserve.models.worlds:DROID_ACTION_NAMES': 'DROID_ACTION_NAMES' is not a factory",
        ),
    ],
)
def test_a_world_the_cli_refuses_is_refused_in_its_words(world: str, message: str) -> None:
    with pytest.raises(WorldLoadError) as err:
        build_app({"world": world})
    assert str(err.value) == message


def test_a_world_is_resolved_but_never_built_by_the_builder(monkeypatch) -> None:
    def boom(*_: object) -> None:
        raise AssertionError("the builder built a world: that is each replica's job, on its devices")

    for module in ("sim_world", "learned_world", "video_world"):  # the built-ins' loaders
        stub = types.ModuleType(f"rollserve.models.{module}")
        stub.SimWorld = stub.load_default = boom  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, stub.__name__, stub)
    monkeypatch.setattr("rollserve.models.worlds.expensive", boom, raising=False)
    for world in ("sim", "learned", "video", "toy", "rollserve.models.worlds:expensive"):
        assert isinstance(build_app({"world": world}), serve.Application)


def test_world_kwargs_are_checked_as_the_clis_world_args_are() -> None:
    with pytest.raises(WorldLoadError) as err:
        build_app({"world": "toy", "world_kwargs": {"path": "x"}})
    assert str(err.value) == "world 'toy' takes no argument 'path' (--world-arg); it takes none"
    with pytest.raises(ValueError, match=r"^world_kwargs needs world \(as --world-arg needs --world\)$"):
        build_app({"policy": "rollserve.models.checkpoint:load_default", "world_kwargs": {"path": "x"}})
    with pytest.raises(ValueError, match=r"^world_kwargs must be a map"):
        build_app({"world": "learned", "world_kwargs": "path=x"})
    built = build_app({"world": "learned", "world_kwargs": {"path": "/nowhere"}})  # read by each replica
    assert isinstance(built, serve.Application)


def test_a_status_code_mode_the_cli_refuses_is_refused_by_name() -> None:
    with pytest.raises(UsageError) as err:
        build_app({"world": "toy", "rollout_status_codes": "semantic"})
    assert str(err.value) == (
        "argument rollout_status_codes: invalid choice: 'semantic' (choose from 'vllm-omni', 'strict')"
    )
    assert isinstance(build_app({"world": "toy", "rollout_status_codes": "strict"}), serve.Application)


def test_an_openpi_layout_the_cli_refuses_is_refused_by_name() -> None:
    with pytest.raises(UsageError) as err:
        build_app({"policy": "rollserve.models.checkpoint:load_default", "openpi_layout": "bridge"})
    assert str(err.value) == (
        "argument openpi_layout: invalid choice: 'bridge' (choose from 'auto', 'droid', 'aloha', 'libero')"
    )
    assert isinstance(build_app({"world": "toy", "openpi_layout": "aloha"}), serve.Application)


@pytest.mark.parametrize("horizon", [0, -3, "ten"])
def test_an_execution_horizon_the_cli_refuses_is_refused_by_name(horizon: object) -> None:
    with pytest.raises(UsageError) as err:
        build_app({"world": "toy", "execution_horizon": horizon})
    assert str(err.value).startswith("argument execution_horizon: ")
    assert isinstance(build_app({"world": "toy", "execution_horizon": 1}), serve.Application)


def _serve_error(*argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from rollserve.cli import main; sys.exit(main())",
         "serve", "--port", "0", *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_serve_ray_refuses_an_unknown_world_as_one_process_does_before_starting_ray() -> None:
    alone = _serve_error("--world", "nope")
    assert (
        alone
        == "rollserve serve: error: unknown world 'nope': use sim, learned, video, toy or module.path:factory"
    )
    assert _serve_error("--ray", "--world", "nope") == alone


def test_serve_ray_refuses_a_world_arg_the_world_does_not_take_as_one_process_does() -> None:
    alone = _serve_error("--world", "toy", "--world-arg", "path=x")
    refusal = "world 'toy' takes no argument 'path' (--world-arg); it takes none"
    assert alone == f"rollserve serve: error: {refusal}"
    assert _serve_error("--ray", "--world", "toy", "--world-arg", "path=x") == alone


# -- the policy and the policy a world acts with, resolved as `rollserve serve` resolves them ----------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"policy": "nope"}, "policy spec 'nope' must look like 'package.module:factory'"),
        (
            {"policy": "no_such_module:make"},
            "policy spec 'no_such_module:make': no module named 'no_such_module'",
        ),
        (
            {"policy": "rollserve.models.checkpoint:nope"},
            "policy spec 'rollserve.models.checkpoint:nope': 'rollserve.models.checkpoint' has no "
            "attribute 'nope'",
        ),
        (
            {"policy": "rollserve.models.world_action:REFERENCE_POLICY"},
            "policy spec 'rollserve.models.world_action:REFERENCE_POLICY': 'REFERENCE_POLICY' is neither a "
            "factory nor a policy",
        ),
        ({"policy": "lerobot:"}, "policy spec 'lerobot:' needs a checkpoint directory: 'lerobot:PATH'"),
        (
            {"world": "toy", "world_policy": "no_such_module:make"},
            "policy spec 'no_such_module:make': no module named 'no_such_module'",
        ),
        ({"world": "toy", "world_policy": "served"}, "--world-policy served needs --policy SPEC"),
    ],
)
def test_a_policy_the_cli_refuses_is_refused_in_its_words(args: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_app(args)
    assert str(err.value) == message


def test_a_policy_is_resolved_but_never_loaded_by_the_builder(monkeypatch) -> None:
    def boom(**_: object) -> None:
        raise AssertionError("the builder loaded a policy: that is each replica's job, on its devices")

    monkeypatch.setattr("rollserve.models.checkpoint.load_default", boom)  # the reference policy too
    for args in (
        {"policy": "rollserve.models.checkpoint:load_default", "policy_kwargs": {"device": "cpu"}},
        {"world": "toy", "world_policy": "reference"},
        {"world": "toy", "world_policy": "rollserve.models.checkpoint:load_default"},
        {"policy": "rollserve.models.checkpoint:load_default", "world": "toy", "world_policy": "served"},
        {"policy": "lerobot:/a/checkpoint/on/the/replicas/nodes"},
    ):
        assert isinstance(build_app(args), serve.Application)


def test_serve_ray_refuses_a_bad_policy_as_one_process_does_before_starting_ray() -> None:
    alone = _serve_error("--policy", "no_such_module:make")
    assert (
        alone == "rollserve serve: error: policy spec 'no_such_module:make': no module named 'no_such_module'"
    )
    assert _serve_error("--ray", "--policy", "no_such_module:make") == alone
