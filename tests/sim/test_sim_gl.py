"""The headless GL choice: Mesa's software rasteriser renders in-thread unless the user says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import os, rollserve.sim; print(os.environ.get('LP_NUM_THREADS'), os.environ.get('MUJOCO_GL'))"


@pytest.mark.parametrize(("given", "expected"), [(None, "0"), ("3", "3")])
def test_llvmpipe_threads_default_to_none_and_a_users_setting_wins(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LP_NUM_THREADS", "MUJOCO_GL")}
    if given is not None:
        env["LP_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    threads, backend = out.stdout.split()
    assert threads == expected and backend in ("egl", "osmesa")
