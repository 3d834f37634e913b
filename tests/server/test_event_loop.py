"""Which event loop `rollserve serve` runs: uvloop where it is installed, asyncio's on request."""

from __future__ import annotations

import importlib.util

import pytest

from rollserve.server.app import create_app
from rollserve.server.running import event_loop_name, uvicorn_config
from rollserve.server.settings import ServerSettings

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "uvloop" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_asyncio_is_used_when_asked_for() -> None:
    assert event_loop_name("asyncio") == "asyncio"


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed (Windows, or a bare install)")
def test_auto_and_uvloop_pick_uvloop_where_it_is_installed() -> None:
    assert event_loop_name("auto") == "uvloop"
    assert event_loop_name("uvloop") == "uvloop"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    assert event_loop_name("auto") == "asyncio"


def test_asking_for_a_missing_uvloop_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    with pytest.raises(ValueError, match="pip install uvloop"):
        event_loop_name("uvloop")


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event loop 'trio'"):
        event_loop_name("trio")


@pytest.mark.parametrize("requested", ["auto", "asyncio"])
def test_uvicorn_runs_the_chosen_loop(requested: str) -> None:
    config = uvicorn_config(create_app(ServerSettings(event_loop=requested)), "127.0.0.1", 0)
    assert config.loop == event_loop_name(requested)
    assert config.loop == ("asyncio" if requested == "asyncio" or not HAS_UVLOOP else "uvloop")
