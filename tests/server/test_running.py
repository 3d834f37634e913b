"""The one way the server runs: replies never sit in Nagle's buffer; freed frames are reused."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import subprocess
import sys

import httpx
import pytest

from rollserve.server.app import create_app
from rollserve.server.running import listening_socket, serving


async def test_accepted_connections_get_tcp_nodelay() -> None:
    """asyncio sets TCP_NODELAY only on connections accepted from an IPPROTO_TCP socket."""
    sock = listening_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    assert seen and seen[0] != 0


def test_serving_binds_loopback_on_a_free_port_and_answers() -> None:
    with serving(create_app()) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        assert httpx.get(f"{server.http_url}/healthz").text == "OK\n"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
@pytest.mark.parametrize(("env", "expected"), [({}, "True"), ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "False")])
def test_serve_keeps_freed_memory_unless_the_user_tuned_malloc(env: dict[str, str], expected: str) -> None:
    """Process-wide, so checked in a fresh interpreter; the user's own MALLOC_* settings win."""
    code = "from rollserve.server.running import keep_freed_memory; print(keep_freed_memory())"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected


def test_startup_objects_are_frozen_after_garbage_is_collected() -> None:
    """Garbage cycles alive at startup are collected, not frozen; live objects leave the collector's
    generations (a later full collection walks none of them). In a subprocess: it is process-wide."""
    code = """
import gc, weakref
from rollserve.server.running import freeze_startup_objects
class Node: pass
cycle = Node(); cycle.self = cycle; dead = weakref.ref(cycle); del cycle
kept = [Node() for _ in range(1000)]
gc.disable()  # nothing collects behind the call's back
frozen = freeze_startup_objects()
print(dead() is None, frozen == gc.get_freeze_count() > 1000, sum(gc.get_count()) < 100,
      not any(gc.is_tracked(k) and k in gc.get_objects(2) for k in kept[:3]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"] * 4
