"""What sends a message's decoding off the event loop, for every transport (websockets, REST).

Parsing holds the event loop (and the GIL) for its whole run, so anything that may take long is
decoded on a worker thread: a msgpack part above ``OFFLOAD_BYTES``, or a JPEG to decompress (found
by its image map's ``format`` string, without parsing). Small messages stay on the loop: the
thread hand-off would cost them more than their decoding.
"""

from __future__ import annotations

OFFLOAD_BYTES = 64 * 1024
JPEG_TAG = b"\xa4jpeg"  # the msgpack string "jpeg": an image map's format
