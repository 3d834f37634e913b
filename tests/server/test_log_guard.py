"""The log-volume guard's rules at their edges (a unit test of ``server/log_guard.py`` on a replaced
clock): the default burst and window, what counts as the same message (logger and format string,
its first 200 characters), a window that ends only once it has fully passed, the exact words of the
suppressed-lines note, the reset when too many distinct messages are tracked, and the handlers
``guard_log_volume`` guards (each once). The end-to-end flood is in ``test_connection_guards.py``."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from rollserve.server import log_guard
from rollserve.server.log_guard import RateLimitFilter, guard_log_volume


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(log_guard.time, "monotonic", clock)
    return clock


def _record(msg: str = "accept failed: %s", name: str = "rollserve.test.guard") -> logging.LogRecord:
    return logging.getLogger(name).makeRecord(name, logging.ERROR, __file__, 1, msg, ("EMFILE",), None)


def _passed(limiter: RateLimitFilter, count: int, **record: str) -> int:
    return sum(limiter.filter(_record(**record)) for _ in range(count))


def test_by_default_ten_of_a_message_pass_per_minute(clock: Clock) -> None:
    limiter = RateLimitFilter()
    assert limiter.max_keys == 1024  # distinct messages tracked before the count starts over
    first = _record()
    assert limiter.filter(first)
    assert first.getMessage() == "accept failed: EMFILE"  # a message's first line is left as it is
    assert _passed(limiter, 24) == 9
    assert limiter.dropped == 15
    clock.now += 60.0  # exactly a minute later: still the same window
    assert _passed(limiter, 1) == 0
    clock.now += 0.001
    assert _passed(limiter, 12) == 10


def test_exactly_the_burst_passes(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=3, window_s=5.0)
    assert [limiter.filter(_record()) for _ in range(5)] == [True, True, True, False, False]
    assert limiter.dropped == 2


def test_a_window_ends_only_once_it_has_fully_passed(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=1, window_s=2.0)
    assert limiter.filter(_record())
    clock.now += 2.0
    assert not limiter.filter(_record())
    clock.now += 0.5  # 2.5 s after the window opened
    assert limiter.filter(_record())
    clock.now += 1.0  # the new window opened 1 s ago
    assert not limiter.filter(_record())


def test_the_first_line_of_a_new_window_says_how_many_were_suppressed(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=2, window_s=1.0)
    assert _passed(limiter, 9) == 2
    clock.now += 1.5
    summary = _record()
    assert limiter.filter(summary)
    assert summary.getMessage() == "accept failed: EMFILE [7 similar messages suppressed]"
    assert limiter.dropped == 7
    # the count starts over: the next window with nothing dropped says nothing
    assert _passed(limiter, 1) == 1
    clock.now += 1.5
    quiet = _record()
    assert limiter.filter(quiet)
    assert quiet.getMessage() == "accept failed: EMFILE"


def test_a_message_is_its_logger_and_format_string_cut_at_200_characters(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=1, window_s=60.0)
    assert limiter.filter(_record(name="rollserve.a"))
    assert limiter.filter(_record(name="rollserve.b"))  # another logger: another message
    assert limiter.filter(_record(msg="accept failed again: %s", name="rollserve.a"))
    head = "x" * 199
    assert limiter.filter(_record(msg=head + "a1"))
    assert not limiter.filter(_record(msg=head + "a2"))  # the same first 200 characters
    assert limiter.filter(_record(msg=head + "b1"))  # the 200th differs
    assert limiter.dropped == 1


def test_too_many_distinct_messages_start_the_count_over(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=1, window_s=60.0, max_keys=2)
    assert limiter.filter(_record(msg="a"))
    assert not limiter.filter(_record(msg="a"))
    assert limiter.filter(_record(msg="b"))  # two tracked: the most allowed
    assert not limiter.filter(_record(msg="a"))  # "a" still counted
    assert limiter.filter(_record(msg="c"))  # a third: every count is forgotten
    assert limiter.filter(_record(msg="a"))
    assert not limiter.filter(_record(msg="c"))  # "c" is counted from its first line on


def test_a_known_message_in_a_new_window_does_not_start_the_count_over(clock: Clock) -> None:
    limiter = RateLimitFilter(burst=1, window_s=1.0, max_keys=2)
    assert limiter.filter(_record(msg="a"))
    clock.now += 0.9
    assert limiter.filter(_record(msg="b"))
    clock.now += 0.6  # "a"'s window is over, "b"'s is not
    assert limiter.filter(_record(msg="a"))  # a known message: "b" stays counted
    assert not limiter.filter(_record(msg="a"))
    assert not limiter.filter(_record(msg="b"))


@pytest.fixture
def handlers() -> Iterator[dict[str, logging.Handler]]:
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "rollserve")
    added = {name: logging.NullHandler() for name in names}
    for name, handler in added.items():
        logging.getLogger(name).addHandler(handler)
    try:
        yield added
    finally:
        for name, handler in added.items():
            logging.getLogger(name).removeHandler(handler)
        for name in names:  # and off pytest's own handlers, which would rate-limit later tests' logs
            for handler in logging.getLogger(name).handlers:
                handler.removeFilter(log_guard._FILTER)


def test_the_guard_filters_the_handlers_of_the_servers_loggers_once(
    handlers: dict[str, logging.Handler],
) -> None:
    guard = guard_log_volume()
    assert guard is log_guard._FILTER
    assert guard_log_volume() is guard
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio"):
        assert handlers[name].filters == [guard], name
    assert handlers["rollserve"].filters == []  # propagates to the root's handler, filtered there
    assert (guard.burst, guard.window_s, guard.max_keys) == (10, 60.0, 1024)
