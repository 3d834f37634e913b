"""A robot installs `rollserve` without extras: the client, wire and RTC layers import without torch or
the server stack (checked in a fresh interpreter where those packages cannot be imported at all)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import rollserve

SERVER_STACK = ("torch", "fastapi", "uvicorn", "pydantic", "starlette", "prometheus_client", "rich")
# simplejpeg is the optional `jpeg` extra: imported lazily, only when a JPEG is sent or received.
HEAVY = (*SERVER_STACK, "simplejpeg")
LIGHT_PACKAGES = ("client", "wire", "rtc")

SCRIPT = textwrap.dedent(
    f"""
    import importlib.abc, sys

    HEAVY = {HEAVY!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError(f"{{name}} is not installed on this robot")

    sys.meta_path.insert(0, Block())
    import numpy as np
    import rollserve.client, rollserve.wire, rollserve.rtc
    from rollserve.client import PolicyClient, RemoteInferenceEngine, LocalInferenceEngine, EngineConfig
    from rollserve.wire import decode_observation, encode_observation, ObservationMsg
    from rollserve.rtc import ActionQueue, RTCConfig

    msg = ObservationMsg(state=np.zeros(3, np.float32))
    assert decode_observation(encode_observation(msg)).state.dtype == np.float32
    RemoteInferenceEngine("ws://127.0.0.1:1/v1/policy/ws")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    print("LOADED", loaded)
    """
)


def test_client_wire_rtc_import_without_torch_or_server_stack() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout


def _imported_modules(package: str) -> list[tuple[str, str]]:
    """(file, module) for every absolute import anywhere in a package, inside functions too."""
    root = Path(rollserve.__file__).parent
    found = []
    for path in (root / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path.name, node.module))
    return found


def test_light_packages_do_not_import_heavy_modules_anywhere() -> None:
    """Also lazily: no import of a heavy package inside any function of the light layers."""
    offenders = [
        f"{file}: {module}"
        for package in LIGHT_PACKAGES
        for file, module in _imported_modules(package)
        if module.split(".")[0] in SERVER_STACK
    ]
    assert offenders == []


def test_light_packages_do_not_import_the_server_package() -> None:
    """Layering: the robot side shares the request path (``rollserve.engine``), never ``server/``."""
    offenders = [
        f"{file}: {module}"
        for package in LIGHT_PACKAGES
        for file, module in _imported_modules(package)
        if module == "rollserve.server" or module.startswith("rollserve.server.")
    ]
    assert offenders == []
