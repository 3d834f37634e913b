"""`rollserve serve` flags a reviewer found mishandled: ``--action-names`` reached factory policies as
the raw string (names ``['x', ',', 'y', ...]``), and ``--keep-alive-s`` was rounded to whole
seconds, at least 1."""

from __future__ import annotations

import argparse

import httpx
import pytest

from rollserve.cli import UsageError
from rollserve.server.app import create_app
from rollserve.server.launch import add_arguments, load_services, policy_kwargs_of
from rollserve.server.running import serving, uvicorn_config
from rollserve.server.settings import ServerSettings

SPEC = "rollserve.models.simple_policies:chunk_policy"  # 6 actions unless told otherwise


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_action_names_are_split_on_commas_and_stripped() -> None:
    args = _args("--policy", SPEC, "--action-names", "x, y,z,,u ,v,w", "--policy-arg", "seed=3")
    assert policy_kwargs_of(args) == {"seed": 3, "action_names": ["x", "y", "z", "u", "v", "w"]}


def test_a_factory_policy_serves_the_names_given() -> None:
    args = _args("--policy", SPEC, "--action-names", "x,y,z,u,v,w")
    settings = ServerSettings(max_batch_wait_ms=0.0)
    policy, _ = load_services(
        SPEC,
        None,
        settings,
        policy_kwargs=policy_kwargs_of(args),
        execution_horizon=None,
        openpi_layout="auto",
    )
    with serving(create_app(settings, policy=policy)) as server:
        models = httpx.get(server.http_url + "/v1/models").json()["data"]
    assert [model["metadata"]["action_names"] for model in models] == [["x", "y", "z", "u", "v", "w"]]


def test_action_names_without_a_name_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="argument --action-names: no names in ' , '"):
        policy_kwargs_of(_args("--policy", SPEC, "--action-names", " , "))


@pytest.mark.parametrize("seconds", [0.25, 1.5, 7.0])
def test_the_keep_alive_is_what_the_flag_says(seconds: float) -> None:
    args = _args("--keep-alive-s", str(seconds))
    app = create_app(ServerSettings(keep_alive_timeout_s=args.keep_alive_s))
    assert uvicorn_config(app, "127.0.0.1", 0).timeout_keep_alive == seconds
