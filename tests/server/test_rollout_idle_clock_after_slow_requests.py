"""A session's idle time counts from the *end* of its last request other than ``status``
(docs/rollout.md, Limits), also for a reset that took a while.

A reset that ran for most of the TTL (a slow world's start) used to leave the idle clock where the
request began: a step right after the reset's 200 got ``session_expired``. And a step refused on a
retired session reported ``context_length`` 0, though ``status`` gives the session's real count.
Over the real server, with the service's clock replaced and moved by the world itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import httpx
from manual_clock import Clock

from rollserve.models.world import WorldInit, WorldOutput
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
TTL = 60.0
SLOW_START_S = 0.9 * TTL  # how long a fresh start takes in the world below, by the service's clock


class SlowStartWorld(ToyWorld):
    """The toy world, except that starting a context (create, reset) takes most of the TTL."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.slow = False  # only the resets under test are slow, not the create

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        if self.slow:
            self.clock.now += SLOW_START_S
        return super().initial_states(inits)


@contextlib.contextmanager
def server(clock: Clock, world: ToyWorld) -> Iterator[httpx.Client]:
    config = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=TTL)
    service = RolloutService(world, config, clock=clock)
    with (
        serving(create_app(config, rollout=service)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as http,
    ):
        yield http
    service.close()


def create(http: httpx.Client, sid: str) -> None:
    assert http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": sid}).status_code == 200


def step(http: httpx.Client, sid: str, step_id: int) -> dict:
    body = {"step_id": step_id, "observation": {}, "action": ACTION}
    return http.post(f"{SESSIONS}/{sid}/step", json=body).json()


def test_the_idle_clock_starts_when_a_slow_reset_ends() -> None:
    clock = Clock()
    world = SlowStartWorld(clock)
    with server(clock, world) as http:
        create(http, "s")
        world.slow = True
        assert http.post(f"{SESSIONS}/s/reset", json={"seed": 1}).status_code == 200
        clock.now += 0.5 * TTL  # idle half the TTL since the reset ended (1.4x since it began)
        answer = step(http, "s", 0)
        assert answer["error"] is None, answer["error"]
        clock.now += TTL + 1.0  # and now idle past the TTL since that step: expired
        assert step(http, "s", 1)["error"]["code"] == "session_expired"


def test_a_step_on_a_retired_session_reports_its_context_length() -> None:
    clock = Clock()
    with server(clock, ToyWorld()) as http:
        for sid in ("closed", "expired", "batched"):
            create(http, sid)
            for step_id in range(3):
                assert step(http, sid, step_id)["error"] is None
        assert http.post(f"{SESSIONS}/closed/close").status_code == 200
        clock.now += TTL + 1.0  # every session expires, "closed" stays closed
        for sid, code in (("closed", "session_closed"), ("expired", "session_expired")):
            refused = step(http, sid, 3)
            assert refused["error"]["code"] == code
            metadata = refused["model_metadata"]
            assert (metadata["committed_step_id"], metadata["context_length"]) == (2, 3), sid
        item = {"session_id": "batched", "step_id": 3, "observation": {}, "action": ACTION}
        (result,) = http.post("/v1/realtime/batch_step", json={"items": [item]}).json()["results"]
        assert result["error"]["code"] == "session_expired"
        metadata = result["model_metadata"]
        assert (metadata["committed_step_id"], metadata["context_length"]) == (2, 3)
