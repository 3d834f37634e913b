"""How every way of starting the server sets uvicorn up and runs it, which the first mutation run of
``server/running.py`` (`running` in tools/mutation.py) found unchecked: each setting the app's
``ServerSettings`` hands uvicorn (and the defaults for an app without settings), the event-loop
choice in every case, the h11 fallback without httptools, when glibc's malloc thresholds are set,
and the server thread ``start_in_thread`` starts, reports and stops.

Unit tests of one layer where the rule is a decision (the installed packages and the C library
are replaced); the thread tests start the real uvicorn on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from rollserve.server import running
from rollserve.server.app import create_app
from rollserve.server.http_guard import GuardedHttpToolsProtocol
from rollserve.server.running import event_loop_name, keep_freed_memory, start_in_thread, uvicorn_config
from rollserve.server.settings import ServerSettings
from rollserve.server.ws_protocol import SteadyReadWebSocketProtocol
from rollserve.wire import WireLimits


def _app_with(settings: ServerSettings) -> Any:
    return types.SimpleNamespace(state=types.SimpleNamespace(settings=settings))


def test_uvicorn_gets_every_setting_of_the_app() -> None:
    settings = ServerSettings(
        max_connections=77, keep_alive_timeout_s=2.5, header_timeout_s=3.0, max_header_bytes=4096,
        limits=WireLimits(max_frame_bytes=123_456), event_loop="asyncio",
    )  # fmt: skip
    config = uvicorn_config(_app_with(settings), "127.0.0.2", 8123, "info")
    assert (config.host, config.port, config.log_level) == ("127.0.0.2", 8123, "info")
    assert (config.loop, config.ws, config.ws_max_size, config.ws_per_message_deflate) == (
        "asyncio",
        SteadyReadWebSocketProtocol,
        123_456,
        False,
    )
    assert (config.timeout_keep_alive, config.limit_concurrency) == (2.5, 77)
    assert (config.lifespan, config.access_log) == ("on", False)
    assert issubclass(config.http, GuardedHttpToolsProtocol)  # type: ignore[arg-type]
    assert (config.http.header_timeout_s, config.http.max_header_bytes) == (3.0, 4096)  # type: ignore[union-attr]


def test_an_app_without_settings_gets_the_defaults_and_warnings_only() -> None:
    config = uvicorn_config(object(), "127.0.0.1", 0)
    defaults = ServerSettings()
    assert config.log_level == "warning"
    assert (config.limit_concurrency, config.ws_max_size) == (
        defaults.max_connections,
        defaults.limits.max_frame_bytes,
    )
    assert config.timeout_keep_alive == defaults.keep_alive_timeout_s


@pytest.fixture
def uvloop_installed(monkeypatch: pytest.MonkeyPatch) -> Any:
    def installed(yes: bool) -> None:
        real = running.importlib.util.find_spec
        found = object()
        monkeypatch.setattr(
            running.importlib.util,
            "find_spec",
            lambda name: (found if yes else None) if name == "uvloop" else real(name),
        )

    return installed


def test_auto_is_uvloop_where_installed_else_asyncio(uvloop_installed: Any) -> None:
    uvloop_installed(True)
    assert (event_loop_name("auto"), event_loop_name("uvloop"), event_loop_name("asyncio")) == (
        "uvloop",
        "uvloop",
        "asyncio",
    )
    uvloop_installed(False)
    assert (event_loop_name("auto"), event_loop_name("asyncio")) == ("asyncio", "asyncio")


def test_uvloop_asked_for_but_missing_is_refused_in_full_words(uvloop_installed: Any) -> None:
    uvloop_installed(False)
    words = "the uvloop event loop is not installed (pip install uvloop), or use --loop asyncio"
    with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
        event_loop_name("uvloop")


def test_an_unknown_event_loop_is_refused_naming_the_choices() -> None:
    words = "unknown event loop 'trio'; choose one of auto, uvloop, asyncio"
    with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
        event_loop_name("trio")


def test_without_httptools_the_server_falls_back_to_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rollserve.server.http_guard", None)  # its import raises ImportError
    assert uvicorn_config(object(), "127.0.0.1", 0).http == "h11"


class FakeLibc:
    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(name: str = "glibc", answer: int = 1, **env: str) -> FakeLibc:
        fake = FakeLibc(answer)
        monkeypatch.setattr(running.platform, "libc_ver", lambda: (name, "2.36"))
        monkeypatch.setattr(running.ctypes, "CDLL", lambda path: fake if path is None else None)
        for key in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return fake

    return make


def test_glibc_keeps_128_mib_of_freed_memory_and_maps_only_blocks_over_32_mib(libc: Any) -> None:
    fake = libc()
    assert keep_freed_memory() is True
    # M_MMAP_THRESHOLD is -3 and M_TRIM_THRESHOLD -1 in glibc's malloc.h
    assert fake.calls == [(-3, 32 * 1024 * 1024), (-1, 128 * 1024 * 1024)]


def test_a_refused_threshold_is_reported(libc: Any) -> None:
    libc(answer=0)
    assert keep_freed_memory() is False


@pytest.mark.parametrize(
    ("name", "env"),
    [
        ("musl", {}),
        ("glibc", {"MALLOC_TRIM_THRESHOLD_": "1"}),
        ("glibc", {"MALLOC_MMAP_THRESHOLD_": "1"}),
        ("glibc", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}),
    ],
)
def test_malloc_is_left_alone_off_glibc_or_when_the_user_tuned_it(
    libc: Any, name: str, env: dict[str, str]
) -> None:
    fake = libc(name, **env)
    assert keep_freed_memory() is False
    assert fake.calls == []


def test_other_glibc_tunables_do_not_count_as_tuning_malloc(libc: Any) -> None:
    fake = libc(GLIBC_TUNABLES="glibc.pthread.rseq=0")
    assert keep_freed_memory() is True
    assert len(fake.calls) == 2


def test_the_server_thread_is_a_named_daemon_on_the_bound_port_and_stops() -> None:
    server = start_in_thread(create_app())
    try:
        assert (server.thread.name, server.thread.daemon) == ("rollserve-uvicorn", True)
        assert server.host == "127.0.0.1"
        assert server.port >= 1024  # a free port the system picked (port 0), not a fixed one
        assert (server.server.config.host, server.server.config.port) == ("127.0.0.1", server.port)
        assert httpx.get(server.http_url + "/healthz").status_code == 200
    finally:
        server.stop()
    assert not server.thread.is_alive()  # stopped, not left running past the join
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=5):
        pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn exits it
def test_a_server_that_fails_to_start_is_reported_with_its_address() -> None:
    @asynccontextmanager
    async def broken(app: FastAPI) -> Any:
        raise RuntimeError("no model")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError, match=r"^uvicorn failed to start on 127\.0\.0\.1:\d+$"):
        start_in_thread(FastAPI(lifespan=broken), timeout=30.0)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_that_outlasts_its_start_deadline_is_told_to_exit() -> None:
    release = threading.Event()

    @asynccontextmanager
    async def slow(app: FastAPI) -> Any:
        while not release.is_set():  # a startup that waits for the test (a model still loading)
            await asyncio.sleep(0.01)
        yield

    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match=r"^uvicorn failed to start on 127\.0\.0\.1:\d+$"):
        start_in_thread(FastAPI(lifespan=slow), timeout=0.2)  # the startup cannot finish before it
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "rollserve-uvicorn"]
    release.set()
    deadline = time.monotonic() + 20.0
    while thread.is_alive():  # told to exit, it stops once its startup is done instead of serving on
        assert time.monotonic() < deadline, "the server thread kept running after a failed start"
        time.sleep(0.01)


@pytest.fixture
def uvicorn_log_levels() -> Iterator[None]:
    """uvicorn sets its loggers' level from the config: put them back for the tests after this one."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)  # setLevel, which also clears logging's level cache


def test_the_foreground_server_is_set_up_in_order_and_announced_once_it_answers(
    monkeypatch: pytest.MonkeyPatch, uvicorn_log_levels: None
) -> None:
    """The CLI path (``rollserve serve``) in-process: its process-wide steps are recorded instead of
    taken (they would change this test process), the server is stopped from the announcement."""
    servers: list[uvicorn.Server] = []
    steps: list[object] = []

    class Recorded(uvicorn.Server):
        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(running.uvicorn, "Server", Recorded)
    monkeypatch.setattr(running, "keep_freed_memory", lambda: steps.append("keep freed memory"))
    monkeypatch.setattr(running, "guard_log_volume", lambda: steps.append(("guard logs", len(servers))))
    monkeypatch.setattr(running, "freeze_startup_objects", lambda: steps.append(("freeze", len(servers))))
    sock = running.listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]

    def announced() -> None:
        me = threading.current_thread()
        assert (me.name, me.daemon) == ("rollserve-announce", True)  # a daemon: it never holds up an exit
        steps.append(("announced", httpx.get(f"http://127.0.0.1:{port}/healthz").status_code))
        servers[0].should_exit = True

    thread = threading.Thread(target=running.run_foreground, args=(create_app(), sock, "error", announced))
    thread.start()
    thread.join(30.0)
    assert not thread.is_alive()
    # memory first; the log guard once uvicorn configured its handlers; the freeze last, then the announcement
    assert steps == ["keep freed memory", ("guard logs", 1), ("freeze", 1), ("announced", 200)]
    config = servers[0].config
    assert (config.host, config.port, config.log_level) == ("127.0.0.1", port, "error")
