"""Size limits for everything that comes off the network, checked before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WireLimits:
    """Upper bounds on one frame and on what it may ask the decoder to build."""

    max_frame_bytes: int = 64 * 1024 * 1024
    max_tensor_elements: int = 16 * 1024 * 1024
    max_tensor_dims: int = 8
    max_image_side: int = 4096
    max_image_pixels: int = 4096 * 4096
    max_images: int = 16
    max_string_bytes: int = 1024 * 1024
    max_container_items: int = 100_000


DEFAULT_LIMITS = WireLimits()
