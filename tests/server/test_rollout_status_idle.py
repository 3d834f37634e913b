"""A ``GET status`` is not use, so it does not restart a session's idle clock; a reset is.

A monitoring poll used to keep an abandoned session open forever (and its capacity held): every
status read touched the session. Over the real server, with the service's clock replaced: the TTL
counts from the end of the last create or step, whatever was read meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from manual_clock import Clock

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
TTL = 60.0


@contextlib.contextmanager
def server(clock: Clock, max_sessions: int = 8) -> Iterator[httpx.Client]:
    config = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=TTL, max_rollout_sessions=max_sessions)
    service = RolloutService(ToyWorld(), config, clock=clock)
    with (
        serving(create_app(config, rollout=service)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as http,
    ):
        yield http
    service.close()


def create(http: httpx.Client, sid: str) -> httpx.Response:
    return http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": sid})


def status(http: httpx.Client, sid: str) -> dict:
    resp = http.get(f"{SESSIONS}/{sid}/status")
    assert resp.status_code == 200, resp.text
    return resp.json()


def step(http: httpx.Client, sid: str, step_id: int) -> dict:
    body = {"step_id": step_id, "observation": {}, "action": ACTION}
    return http.post(f"{SESSIONS}/{sid}/step", json=body).json()


def test_status_polls_do_not_keep_an_abandoned_session_alive() -> None:
    clock = Clock()
    with server(clock) as http:
        assert create(http, "polled").status_code == 200
        for _ in range(2):  # a poll every TTL / 2: idle TTL / 2, then exactly the TTL (still open)
            clock.now += TTL / 2
            assert status(http, "polled")["closed"] is False
        clock.now += TTL / 2  # idle TTL * 1.5 since the create
        answer = status(http, "polled")
        assert (answer["closed"], answer["closed_reason"]) == (True, "expired")
        refused = step(http, "polled", 0)
        assert refused["error"]["code"] == "session_expired"


def test_a_session_read_by_status_expires_exactly_a_ttl_after_its_last_step() -> None:
    clock = Clock()
    with server(clock) as http:
        assert create(http, "s").status_code == 200
        assert step(http, "s", 0)["error"] is None  # the step ends at 1000: the idle clock starts here
        clock.now += TTL  # idle exactly the TTL: still open (the store's rule), and the read
        assert status(http, "s")["closed"] is False  # ...must not restart the clock
        clock.now += 0.5
        assert status(http, "s")["closed_reason"] == "expired"


def test_a_polled_abandoned_session_frees_its_capacity() -> None:
    clock = Clock()
    with server(clock, max_sessions=1) as http:
        assert create(http, "abandoned").status_code == 200
        clock.now += TTL / 2
        status(http, "abandoned")
        clock.now += TTL / 2 + 1  # idle TTL + 1 since its create, read TTL / 2 + 1 ago
        assert create(http, "next").status_code == 200  # the abandoned one expired and made room
        assert status(http, "abandoned")["closed_reason"] == "expired"


def test_a_step_still_restarts_the_idle_clock() -> None:
    clock = Clock()
    with server(clock) as http:
        assert create(http, "used").status_code == 200
        clock.now += TTL / 2
        assert step(http, "used", 0)["error"] is None
        clock.now += TTL / 2 + 1  # idle TTL / 2 + 1 since the step
        assert status(http, "used")["closed"] is False
        assert step(http, "used", 1)["error"] is None


def test_a_reset_is_use_and_restarts_the_idle_clock() -> None:
    clock = Clock()
    with server(clock) as http:
        assert create(http, "r").status_code == 200
        clock.now += TTL * 0.9
        assert http.post(f"{SESSIONS}/r/reset", json={}).status_code == 200
        clock.now += TTL * 0.9  # 1.8 TTL since the create, 0.9 since the reset: still open
        assert step(http, "r", 0)["error"] is None
