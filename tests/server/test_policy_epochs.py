"""A client uuid's session epoch never goes backwards while its session is open (clients drop
replies by epoch), and what is remembered about closed uuids stays bounded."""

from __future__ import annotations

from rollserve.server.policy import sessions as sessions_module
from rollserve.server.policy.sessions import PolicySessionStore

MEMORY = 10_000  # closed uuids remembered (sessions._EPOCH_MEMORY), pinned here on purpose


def _churn(store: PolicySessionStore, count: int) -> None:
    """``count`` other clients that connect once and leave (e.g. openpi connections)."""
    for _ in range(count):
        store.close(store.open().session_id)


def test_the_memory_bound_is_the_documented_one() -> None:
    assert sessions_module._EPOCH_MEMORY == MEMORY


def test_an_open_sessions_epoch_survives_any_number_of_other_clients() -> None:
    store = PolicySessionStore(max_sessions=4)
    live = store.open("robot-1")
    for _ in range(3):
        store.reset(live)
    assert live.epoch == 3
    _churn(store, MEMORY + 5)
    assert store.open("robot-1").epoch == 4


def test_a_reset_session_reopened_after_churn_goes_up() -> None:
    """Opened, churned past the bound (its uuid was then the oldest entry), reset, churned again."""
    store = PolicySessionStore(max_sessions=4)
    live = store.open("robot-1")
    _churn(store, MEMORY)
    assert store.reset(live) == 1
    _churn(store, MEMORY)
    assert store.open("robot-1").epoch == 2


def test_a_closed_uuid_is_remembered_until_the_bound_of_later_closed_ones() -> None:
    store = PolicySessionStore(max_sessions=4)
    first = store.open("robot-1")
    store.reset(first)
    store.close(first.session_id)
    _churn(store, MEMORY - 1)
    again = store.open("robot-1")
    assert again.epoch == 2
    store.close(again.session_id)
    _churn(store, MEMORY)  # now the oldest closed uuid: forgotten, memory stays bounded
    assert len(store._epochs) == MEMORY
    assert store.open("robot-1").epoch == 0
