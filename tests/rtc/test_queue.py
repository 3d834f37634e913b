"""ActionQueue: RTC replaces from the delay on, non-RTC appends the unexecuted rest."""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.rtc import ActionQueue, RTCConfig


def _chunk(start: float, length: int = 10, dim: int = 2) -> np.ndarray:
    return (np.arange(length * dim, dtype=np.float32).reshape(length, dim) + start).astype(np.float32)


def test_empty_queue_returns_none() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    assert queue.get() is None
    assert queue.get_left_over() is None and queue.get_processed_left_over() is None
    assert queue.left_overs() == (None, None)
    assert queue.qsize() == 0 and queue.empty() and queue.get_action_index() == 0


@pytest.mark.parametrize("delay", [0, 3, 10, 25, -2])
def test_rtc_merge_replaces_queue_after_clamped_delay(delay: int) -> None:
    queue = ActionQueue(RTCConfig(enabled=True, execution_horizon=5))
    queue.merge(_chunk(0), _chunk(100), 0, 0)
    queue.get(), queue.get()
    model, robot = _chunk(1000), _chunk(2000)
    queue.merge(model, robot, delay, 0)
    clamped = max(0, min(delay, 10))
    assert queue.get_action_index() == 0
    assert queue.qsize() == 10 - clamped
    np.testing.assert_array_equal(queue.get_left_over(), model[clamped:])
    np.testing.assert_array_equal(queue.get_processed_left_over(), robot[clamped:])


def test_get_advances_and_left_over_tracks_both_spaces() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    model, robot = _chunk(0), _chunk(500)
    queue.merge(model, robot, 0, 0)
    for i in range(4):
        np.testing.assert_array_equal(queue.get(), robot[i])
    assert queue.get_action_index() == 4
    np.testing.assert_array_equal(queue.get_left_over(), model[4:])
    np.testing.assert_array_equal(queue.get_processed_left_over(), robot[4:])
    left_model, left_robot = queue.left_overs()  # both at once, from the same index
    np.testing.assert_array_equal(left_model, model[4:])
    np.testing.assert_array_equal(left_robot, robot[4:])
    left_model[0, 0] = -1  # copies: the queue is not written through them
    assert queue.left_overs()[0][0, 0] == model[4, 0]  # type: ignore[index]


def test_non_rtc_merge_appends_after_unexecuted_actions() -> None:
    queue = ActionQueue(RTCConfig(enabled=False))
    first_model, first_robot = _chunk(0, 4), _chunk(50, 4)
    queue.merge(first_model, first_robot, 0, 0)
    queue.get()
    second_model, second_robot = _chunk(10, 3), _chunk(60, 3)
    queue.merge(second_model, second_robot, 5, 0)  # delay is ignored without RTC
    np.testing.assert_array_equal(queue.get_left_over(), np.concatenate([first_model[1:], second_model]))
    np.testing.assert_array_equal(
        queue.get_processed_left_over(), np.concatenate([first_robot[1:], second_robot])
    )
    assert queue.get_action_index() == 0 and queue.qsize() == 6


def test_returned_actions_are_copies() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    queue.merge(_chunk(0), _chunk(0), 0)
    action = queue.get()
    assert action is not None
    action[:] = -1
    assert queue.get_processed_left_over()[0, 0] != -1  # type: ignore[index]


def test_mismatched_chunk_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="lengths differ"):
        ActionQueue(RTCConfig(enabled=True)).merge(_chunk(0, 5), _chunk(0, 4), 0)


def test_clear_forgets_everything() -> None:
    queue = ActionQueue(RTCConfig(enabled=True))
    queue.merge(_chunk(0), _chunk(0), 0)
    queue.get()
    queue.clear()
    assert queue.get() is None and queue.get_left_over() is None and queue.get_action_index() == 0


def test_a_delay_left_to_the_queue_needs_the_index_it_counts_from() -> None:
    queue = ActionQueue(RTCConfig(enabled=True, execution_horizon=4))
    chunk = np.arange(10, dtype=np.float32).reshape(10, 1)
    with pytest.raises(ValueError, match=r"^real_delay=None needs action_index_before_inference$"):
        queue.merge(chunk, chunk, None, None)
