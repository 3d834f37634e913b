"""``--refusal-delay-max-ms`` is a hard cap (a reviewer's finding): it used to be raised to
``--refusal-delay-ms`` when below it, so ``--refusal-delay-ms 40 --refusal-delay-max-ms 10`` (or 0,
documented as "off") still delayed every refusal by 40 ms and more."""

from __future__ import annotations

from rollserve.server.penalty import RefusalPenalty, RefusalStreak


def test_a_max_below_the_base_caps_every_delay_the_first_too() -> None:
    penalty, streak = RefusalPenalty(base_ms=40.0, max_ms=10.0), RefusalStreak()
    # min(10 ms, 40 ms * 2**(k-1)) for k = 1, 2, 3: 10 ms each
    assert [penalty.refused(streak) for _ in range(3)] == [0.01, 0.01, 0.01]


def test_a_max_of_zero_turns_the_delay_and_the_lane_off() -> None:
    penalty, streak = RefusalPenalty(base_ms=40.0, max_ms=0.0, lanes=1), RefusalStreak()
    assert [penalty.refused(streak) for _ in range(3)] == [0.0, 0.0, 0.0]
    streak.count, streak.refused_last = 3, True  # a streak, as if the delay were on: still no lane
    assert penalty.lane(streak) is RefusalPenalty(1.0, 100.0).lane(None)


def test_a_max_above_the_base_still_lets_the_delay_double() -> None:
    penalty, streak = RefusalPenalty(base_ms=40.0, max_ms=100.0), RefusalStreak()
    # 40, 80, then min(100, 160) = 100 ms
    assert [penalty.refused(streak) for _ in range(3)] == [0.04, 0.08, 0.1]
