"""Bounded log volume: a flood of the same error must not fill the disk.

A hostile client (or a lowered file-descriptor limit under a connection flood) can make the same
line, often with a traceback, repeat tens of thousands of times a second. ``RateLimitFilter`` lets
each distinct message (logger + format string) through ``burst`` times per ``window_s``, drops
the rest, and tells how many were dropped on the next line it lets through.
"""

from __future__ import annotations

import logging
import threading
import time

_GUARDED_LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio")


class RateLimitFilter(logging.Filter):
    """At most ``burst`` records per distinct message per ``window_s``; counts what it drops."""

    def __init__(self, burst: int = 10, window_s: float = 60.0, max_keys: int = 1024) -> None:
        super().__init__()
        self.burst, self.window_s, self.max_keys = burst, window_s, max_keys
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [window start, count, dropped]
        self._lock = threading.Lock()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None or now - entry[0] > self.window_s:
                if entry is None and len(self._seen) >= self.max_keys:
                    self._seen.clear()  # many distinct messages: start over rather than grow
                dropped = int(entry[2]) if entry else 0
                self._seen[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} similar messages suppressed]"
                return True
            entry[1] += 1
            if entry[1] <= self.burst:
                return True
            entry[2] += 1
            self.dropped += 1
            return False


_FILTER = RateLimitFilter()


def guard_log_volume() -> RateLimitFilter:
    """Attach the one process-wide filter to every handler of the loggers a server writes to.

    Call it after logging is configured (uvicorn configures its handlers when its Config is made).
    """
    for name in _GUARDED_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    return _FILTER
