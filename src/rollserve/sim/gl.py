"""Pick a headless OpenGL backend for MuJoCo before it is first imported.

MuJoCo reads ``MUJOCO_GL`` once, at import. A user's setting always wins; otherwise EGL (GPU or
Mesa's software EGL, no display needed), else OSMesa when only that library is installed. If EGL
is present but cannot create a context on some machine, set ``MUJOCO_GL=osmesa`` yourself.
"""

from __future__ import annotations

import ctypes.util
import os
import sys


def choose_gl_backend() -> str:
    """Set ``MUJOCO_GL`` (and the matching ``PYOPENGL_PLATFORM``) if unset; return the backend used.

    Also ``LP_NUM_THREADS=0`` unless set: Mesa's software rasteriser (llvmpipe, EGL without a GPU)
    then renders in the calling thread. Its helper threads cost more than they save on frames this
    small, most of all on a busy machine (a 64x64 frame: ~40 ms in-thread against ~110 ms with the
    threads on the 2 shared cores, docs/performance.md). GPU drivers ignore it.
    """
    os.environ.setdefault("LP_NUM_THREADS", "0")
    chosen = os.environ.get("MUJOCO_GL")
    if chosen:
        return chosen
    if "mujoco" in sys.modules:  # too late to choose: MuJoCo keeps what it found at import
        return ""
    backend = "egl" if ctypes.util.find_library("EGL") or not ctypes.util.find_library("OSMesa") else "osmesa"
    os.environ["MUJOCO_GL"] = backend
    os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend
