"""Headless rendering of the scene's cameras; created only when images are asked for (it is slow)."""

from __future__ import annotations

import mujoco
import numpy as np

from rollserve.sim.layout import CAMERA_NAMES, DEFAULT_IMAGE_SIZE


class CameraRig:
    """Renders every named camera of a model into uint8 HWC RGB arrays, through one GL context."""

    def __init__(
        self,
        model: mujoco.MjModel,
        image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE,
        camera_names: tuple[str, ...] = CAMERA_NAMES,
    ) -> None:
        height, width = image_size
        self.camera_names = camera_names
        self._renderer = mujoco.Renderer(model, height=height, width=width)

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        images = {}
        for name in self.camera_names:
            self._renderer.update_scene(data, camera=name)
            images[name] = self._renderer.render()
        return images

    def close(self) -> None:
        self._renderer.close()
