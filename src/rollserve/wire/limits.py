"""Size limits for everything that comes off the network, checked before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WireLimits:
    """Upper bounds on one frame and on what it may ask the decoder to build.

    Per container limits alone let a frame of nested empty maps cost ~140x its size in Python
    objects, so the decoder also keeps a budget per *document*: at most ``max_objects`` values,
    and at most ``container_floor + frame_bytes // bytes_per_container`` maps and lists (a map or
    list costs ~64 bytes of memory, so this keeps containers near 4x the frame's size), and never
    more than ``max_containers``: each one costs a Python call while unpacking (about a microsecond,
    holding the GIL), so without that cap an 8 MB frame of empty maps ran 500,000 of them (0.6-1.5 s
    of CPU on a loaded 2-core VM) before its refusal. A real message has tens, a 256-item batch a
    few thousand.
    """

    max_frame_bytes: int = 64 * 1024 * 1024
    max_tensor_elements: int = 16 * 1024 * 1024
    max_tensor_dims: int = 8
    max_image_side: int = 4096
    max_image_pixels: int = 4096 * 4096
    max_images: int = 16
    max_total_image_pixels: int = 2 * 4096 * 4096  # all images of one message together
    max_string_bytes: int = 1024 * 1024
    max_container_items: int = 100_000
    max_objects: int = 1_000_000  # values per document (map entries count twice: key and value)
    container_floor: int = 1024
    bytes_per_container: int = 16
    max_containers: int = 65_536  # maps and lists per document, whatever its size
    max_name_chars: int = 256  # client_uuid, robot_type, session ids, each action or camera name
    max_names: int = 64  # action_names, camera_names
    max_task_chars: int = 4096  # task prompts

    def container_budget(self, frame_bytes: int) -> int:
        """How many maps and lists a frame of ``frame_bytes`` may hold."""
        return min(self.max_containers, self.container_floor + frame_bytes // self.bytes_per_container)


DEFAULT_LIMITS = WireLimits()
