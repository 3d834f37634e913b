"""Headless rendering of the scene's cameras; created only when images are asked for (it is slow)."""

from __future__ import annotations

import os

import mujoco
import numpy as np

from rollserve.sim.layout import CAMERA_NAMES, DEFAULT_IMAGE_SIZE


class CameraRig:
    """Renders every named camera of a model into uint8 HWC RGB arrays, through one GL context.

    The context is unbound after each render, so the env may be stepped from whichever thread
    (one at a time): EGL contexts are bound per thread and cannot be current in two.
    """

    def __init__(
        self,
        model: mujoco.MjModel,
        image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
        camera_names: tuple[str, ...] = CAMERA_NAMES,
    ) -> None:
        height, width = image_size
        self.camera_names = camera_names
        self._renderer = mujoco.Renderer(model, height=height, width=width)
        _release_current_context()

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        images = {}
        try:
            for name in self.camera_names:
                self._renderer.update_scene(data, camera=name)
                images[name] = self._renderer.render()
        finally:
            _release_current_context()
        return images

    def close(self) -> None:
        self._renderer.close()


def _release_current_context() -> None:
    """Unbind this thread's EGL context, if any (other backends are left as they are)."""
    if os.environ.get("MUJOCO_GL", "").lower() != "egl":
        return
    from mujoco import egl
    from mujoco.egl import egl_ext

    if egl.EGL_DISPLAY is not None:
        egl_ext.eglMakeCurrent(
            egl.EGL_DISPLAY, egl_ext.EGL_NO_SURFACE, egl_ext.EGL_NO_SURFACE, egl_ext.EGL_NO_CONTEXT
        )
