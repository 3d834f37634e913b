"""The Serve application builder refuses what a Serve config's ``args`` cannot mean, with the
setting's name, before any replica starts: settings Serve's proxy owns (the CLI refuses their
flags under ``--ray``), limits the CLI's flags would refuse, unknown keys, and an app that serves
nothing. Skipped where Ray is not installed; builds only, starts no Ray."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from ray import serve

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
