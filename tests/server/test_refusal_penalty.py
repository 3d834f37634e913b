"""A connection that keeps sending refused input is slowed down; nobody else is (issue 8, soak).

Checked against real servers (uvicorn on 127.0.0.1, real websockets and HTTP): after a refusal,
that connection's next frame is read (websockets), or its next refusal answered (REST), only after
the delay, while another connection of the same address is answered at once; an accepted request
halves the count; ``refusal_delay_ms=0`` turns it off. Times are lower bounds or orderings only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from websockets.sync.client import ClientConnection, connect

from rollserve.models.simple_policies import ChunkPolicy
from rollserve.models.worlds import ToyWorld
from rollserve.server import penalty
from rollserve.server.app import create_app
from rollserve.server.penalty import RefusalPenalty, RefusalStreak
from rollserve.server.policy.routes import _Refusals
from rollserve.server.policy.service import PolicyService
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import RunningServer, serving
from rollserve.server.settings import ServerSettings
from rollserve.wire import (
    ActionChunkMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    SessionOpen,
    decode_message,
    encode_message,
)

DELAY_S = 1.5  # long enough that "answered during the hold" is an ordering, not a speed check
STATE = np.linspace(-1, 1, 6, dtype=np.float32)
GARBAGE = b"\xc1\xc1 not msgpack"


def test_the_delay_doubles_per_refusal_up_to_the_cap_and_an_accepted_input_halves_the_count() -> None:
    penalty, streak = RefusalPenalty(base_ms=10.0, max_ms=50.0), RefusalStreak()
    assert [penalty.refused(streak) for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    penalty.served(streak)  # 5 -> 2: the next refusal is the third, not the first
    assert streak.count == 2 and penalty.refused(streak) == 0.04
    slip = RefusalStreak()
    penalty.refused(slip)
    penalty.served(slip)  # one slip is forgiven by one good input
    assert slip.count == 0 and penalty.refused(slip) == 0.01
    off = RefusalPenalty(base_ms=0.0, max_ms=50.0)
    assert [off.refused(streak) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert RefusalPenalty(base_ms=1.0, max_ms=100.0).refused(RefusalStreak()) == 0.001
    long = RefusalStreak()
    long.count = 10_000  # no overflow after a very long streak
    assert RefusalPenalty(1.0, 100.0).refused(long) == 0.1


def test_valid_inputs_slipped_in_among_refused_ones_do_not_lift_the_delay() -> None:
    """The soak's session attacker: one valid frame after every 15 refused ones. With a reset its
    delays restarted at the base each time; halved, they stay at the cap after the first round."""
    penalty, streak = RefusalPenalty(base_ms=1.0, max_ms=100.0), RefusalStreak()
    rounds = []
    for _ in range(4):
        rounds.append([penalty.refused(streak) for _ in range(15)])
        penalty.served(streak)
    assert rounds[0][:8] == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.1]
    assert all(delay == 0.1 for delays in rounds[1:] for delay in delays)
    # the cost to such a client per round: 15 refusals at 0.1 s, against 0.927 s with a reset
    # (1 + 2 + ... + 64 ms, then eight at the 100 ms cap)
    assert sum(rounds[-1]) == pytest.approx(1.5)


def test_the_lane_follows_the_last_input_not_the_count() -> None:
    penalty, streak = RefusalPenalty(1.0, 100.0, lanes=1), RefusalStreak()
    straight = penalty.lane(None)
    for _ in range(5):
        penalty.refused(streak)
    assert penalty.lane(streak) is not straight  # after a refusal: the shared lane
    penalty.served(streak)
    assert streak.count == 2 and penalty.lane(streak) is straight  # after an accepted one: straight


def test_only_the_clients_own_mistakes_count() -> None:
    async def judge(code: str | None, retryable: bool = False) -> int:
        refusals = _Refusals(RefusalPenalty(10.0, 50.0))
        refusals.judge("bad_field")
        refusals.judge(code, retryable)
        return refusals.streak.count

    run = asyncio.run
    assert run(judge("malformed_frame")) == 2
    assert run(judge("too_many_objects")) == 2
    assert run(judge(None)) == 0  # an accepted request resets
    for not_the_clients in ("inference_error", "unavailable", "stale_epoch", "unknown_session"):
        assert run(judge(not_the_clients)) == 1, not_the_clients
    assert run(judge("bad_field", retryable=True)) == 1


@contextlib.contextmanager
def _policy_server(**settings: Any) -> Iterator[RunningServer]:
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)
    with serving(create_app(config, policy=PolicyService(ChunkPolicy(), config))) as server:
        yield server


@contextlib.contextmanager
def _session(server: RunningServer) -> Iterator[ClientConnection]:
    with connect(server.ws_url + "/v1/policy/ws", max_size=None, compression=None) as ws:
        ws.send(encode_message(SessionOpen(state_dim=6)))
        assert decode_message(ws.recv(timeout=10)).accepted
        yield ws


def _observation(seq_id: int) -> bytes:
    return encode_message(ObservationMsg(header=MsgHeader(seq_id=seq_id), state=STATE))


def test_a_refused_session_connection_waits_while_another_is_served_at_once() -> None:
    settings = {"refusal_delay_ms": DELAY_S * 1000, "refusal_delay_max_ms": 4 * DELAY_S * 1000}
    with (
        _policy_server(**settings) as server,
        _session(server) as attacker,
        _session(server) as robot,
    ):
        attacker.send(GARBAGE)
        assert isinstance(decode_message(attacker.recv(timeout=10)), ErrorMsg)  # answered at once
        held = time.monotonic()
        attacker.send(GARBAGE)  # not read before the delay is over
        robot.send(_observation(1))
        assert isinstance(decode_message(robot.recv(timeout=10)), ActionChunkMsg)
        robot_done = time.monotonic()
        assert isinstance(decode_message(attacker.recv(timeout=30)), ErrorMsg)
        attacker_done = time.monotonic()
        assert robot_done < attacker_done
        assert attacker_done - held >= DELAY_S * 0.9
        for seq_id in range(2, 6):  # the robot, which sends nothing wrong, never waits
            robot.send(_observation(seq_id))
            assert isinstance(decode_message(robot.recv(timeout=10)), ActionChunkMsg)


def test_one_slip_is_forgiven_by_one_accepted_request() -> None:
    settings = {"refusal_delay_ms": DELAY_S * 1000, "refusal_delay_max_ms": 8 * DELAY_S * 1000}
    with _policy_server(**settings) as server, _session(server) as ws:
        ws.send(GARBAGE)
        ws.recv(timeout=10)
        ws.send(_observation(1))  # read after one delay, accepted: the streak is over
        assert isinstance(decode_message(ws.recv(timeout=30)), ActionChunkMsg)
        ws.send(GARBAGE)
        ws.recv(timeout=10)  # the first refusal of a new streak: one delay again, not two
        started = time.monotonic()
        ws.send(_observation(2))
        assert isinstance(decode_message(ws.recv(timeout=30)), ActionChunkMsg)
        assert time.monotonic() - started >= DELAY_S * 0.9


def test_an_accepted_request_halves_the_count_of_a_real_connection() -> None:
    """Three refusals (count 3), an accepted observation (count 1), garbage again (count 2): the
    next frame is read after two base delays, where a reset count would have waited one."""
    base_s = 0.25
    settings = {"refusal_delay_ms": base_s * 1000, "refusal_delay_max_ms": 16 * base_s * 1000}
    with _policy_server(**settings) as server, _session(server) as ws:
        for _ in range(3):
            ws.send(GARBAGE)
            assert isinstance(decode_message(ws.recv(timeout=30)), ErrorMsg)
        ws.send(_observation(1))
        assert isinstance(decode_message(ws.recv(timeout=30)), ActionChunkMsg)
        ws.send(GARBAGE)
        assert isinstance(decode_message(ws.recv(timeout=30)), ErrorMsg)
        started = time.monotonic()
        ws.send(_observation(2))
        assert isinstance(decode_message(ws.recv(timeout=30)), ActionChunkMsg)
        assert time.monotonic() - started >= 2 * base_s * 0.9


def test_openpi_connections_are_slowed_down_the_same_way() -> None:
    settings = {"refusal_delay_ms": DELAY_S * 1000, "refusal_delay_max_ms": 4 * DELAY_S * 1000}
    with (
        _policy_server(**settings) as server,
        connect(server.ws_url, max_size=None, compression=None) as attacker,
    ):
        msgpack_numpy.unpackb(attacker.recv(timeout=10))
        attacker.send(msgpack_numpy.packb({"state": np.full(6, np.nan, np.float32)}))
        assert attacker.recv(timeout=10).startswith("bad_field")
        held = time.monotonic()
        attacker.send(GARBAGE)
        assert attacker.recv(timeout=30).startswith("malformed_frame")
        assert time.monotonic() - held >= DELAY_S * 0.9


@pytest.fixture(scope="module")
def rollout_server() -> Iterator[RunningServer]:
    settings = ServerSettings(
        max_batch_wait_ms=0.0, refusal_delay_ms=DELAY_S * 1000, refusal_delay_max_ms=4 * DELAY_S * 1000
    )
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        yield server


def _create(http: httpx.Client) -> str:
    resp = http.post("/v1/realtime/sessions", json={"model": "toy", "seed": 1})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def _good_step(step_id: int) -> dict[str, Any]:
    action = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
    return {"step_id": step_id, "observation": {"prompt": "reach"}, "action": action}


def test_a_refused_rest_connection_waits_while_another_is_served_at_once(
    rollout_server: RunningServer,
) -> None:
    url = rollout_server.http_url
    with (
        httpx.Client(base_url=url, timeout=30.0) as attacker,
        httpx.Client(base_url=url, timeout=30.0) as trainer,
    ):
        sid, own = _create(trainer), _create(attacker)
        bad = {"content": b'{"step_id": ', "headers": {"content-type": "application/json"}}
        first = time.monotonic()
        assert attacker.post(f"/v1/realtime/sessions/{own}/step", **bad).status_code == 400
        assert time.monotonic() - first >= DELAY_S * 0.9  # the first refusal already waits
        done: dict[str, float] = {}

        def refused_again() -> None:
            resp = attacker.post(f"/v1/realtime/sessions/{own}/step", **bad)
            assert resp.status_code == 400
            done["attacker"] = time.monotonic()

        thread = threading.Thread(target=refused_again)
        held = time.monotonic()
        thread.start()
        time.sleep(0.05)
        assert trainer.post(f"/v1/realtime/sessions/{sid}/step", json=_good_step(0)).status_code == 200
        done["trainer"] = time.monotonic()
        thread.join(60)
        assert done["trainer"] < done["attacker"]
        assert done["attacker"] - held >= 2 * DELAY_S * 0.9  # the second in a row: twice as long
        for step_id in range(1, 4):  # the trainer, which sends nothing wrong, never waits
            started = time.monotonic()
            assert (
                trainer.post(f"/v1/realtime/sessions/{sid}/step", json=_good_step(step_id)).status_code == 200
            )
            assert time.monotonic() - started < DELAY_S * 10  # (a generous bound: only no delay)


class _SlowWorld(ToyWorld):
    """Each step takes ``DELAY_S`` (a big model on a busy GPU)."""

    def step_batch(self, steps: Any) -> Any:
        time.sleep(DELAY_S)
        return super().step_batch(steps)


def _lane_race() -> tuple[float, dict[str, float]]:
    """A streak connection's slow good step holds the lane; meanwhile another streak connection
    sends a cheap bad request and a healthy one asks for a status. Returns the start and when
    each was answered."""
    settings = ServerSettings(max_batch_wait_ms=0.0, refusal_delay_ms=1.0, refused_connection_lanes=1)
    app = create_app(settings, rollout=RolloutService(_SlowWorld(), settings))
    bad = {"content": b'{"step_id": ', "headers": {"content-type": "application/json"}}
    with serving(app) as server, contextlib.ExitStack() as stack:
        first, second, healthy = (
            stack.enter_context(httpx.Client(base_url=server.http_url, timeout=30.0)) for _ in range(3)
        )
        sid = _create(first)
        for client in (first, second):  # each starts a refusal streak
            assert client.post(f"/v1/realtime/sessions/{sid}/step", **bad).status_code == 400
        done: dict[str, float] = {}

        def in_lane(name: str, client: httpx.Client, **request: Any) -> None:
            resp = client.post(f"/v1/realtime/sessions/{sid}/step", **request)
            assert resp.status_code == (200 if name == "first" else 400), resp.text
            done[name] = time.monotonic()

        slow = threading.Thread(target=in_lane, args=("first", first), kwargs={"json": _good_step(0)})
        started = time.monotonic()
        slow.start()  # a good step, but from a connection with a streak: it holds the lane DELAY_S
        time.sleep(0.3)
        waiting = threading.Thread(target=in_lane, args=("second", second), kwargs=bad)
        waiting.start()  # a cheap refusal, but it waits for the lane
        time.sleep(0.1)
        assert healthy.get(f"/v1/realtime/sessions/{sid}/status").status_code == 200
        done["healthy"] = time.monotonic()
        slow.join(60)
        waiting.join(60)
    return started, done


def test_connections_with_a_refusal_streak_take_turns_in_one_lane_and_healthy_ones_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(penalty, "LANE_WAIT_S", 30.0)  # here nobody gives up waiting for the lane
    started, done = _lane_race()
    assert done["healthy"] < done["first"]  # a connection without a streak never waits
    assert done["second"] - started >= DELAY_S * 0.9  # the second waited for the first's turn


def test_nobody_waits_for_the_lane_longer_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(penalty, "LANE_WAIT_S", 0.2)  # the first holds it for 1.5 s
    _, done = _lane_race()
    assert done["second"] < done["first"]


def test_the_lane_is_for_streaks_only_and_can_be_turned_off() -> None:
    streak = RefusalStreak()
    on, off = RefusalPenalty(1.0, 100.0, lanes=1), RefusalPenalty(1.0, 100.0, lanes=0)
    assert on.lane(streak) is on.lane(None) is off.lane(streak)  # straight through: no streak
    streak.count, streak.refused_last = 3, True
    assert off.lane(streak) is on.lane(None)  # lanes=0: no lane at all
    assert RefusalPenalty(0.0, 100.0, lanes=1).lane(streak) is on.lane(None)  # the delay is off

    async def two_at_once() -> list[str]:
        order: list[str] = []

        async def use(name: str) -> None:
            async with on.lane(streak):
                order.append(f"{name} in")
                await asyncio.sleep(0.05)
                order.append(f"{name} out")

        await asyncio.gather(use("a"), use("b"))
        return order

    assert asyncio.run(two_at_once()) == ["a in", "a out", "b in", "b out"]


def test_a_short_rest_delay_is_waited_out_too() -> None:
    """``hold`` (REST: before the refusal goes out) waits however short the delay is; the REST test
    above only sees delays of 1.5 s and more."""
    penalty, streak = RefusalPenalty(base_ms=50.0, max_ms=100.0), RefusalStreak()

    async def held_for() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await penalty.hold(streak)
        return loop.time() - started

    assert asyncio.run(held_for()) >= 0.05 * 0.9  # the first refusal's delay: base_ms
    assert streak.count == 1 and streak.refused_last


def test_the_lane_is_given_back_on_the_way_out_and_only_by_whoever_took_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An input that took the lane frees it when done; one that gave up waiting for it (and went
    ahead outside) frees nothing, so the lane still lets one input through at a time after that."""
    one_lane, streak = RefusalPenalty(1.0, 100.0), RefusalStreak()  # one lane is the default
    streak.count, streak.refused_last = 1, True
    order: list[str] = []

    async def use(name: str, busy_s: float) -> None:
        async with one_lane.lane(streak):
            order.append(f"{name} in")
            await asyncio.sleep(busy_s)
            order.append(f"{name} out")

    async def scenario() -> None:
        monkeypatch.setattr(penalty, "LANE_WAIT_S", 0.05)
        await asyncio.gather(use("slow", 1.0), use("impatient", 0.0))  # gives up after 0.05 s
        monkeypatch.setattr(penalty, "LANE_WAIT_S", 30.0)
        async with asyncio.timeout(10.0):  # a lane never given back would keep these waiting 30 s
            await use("next", 0.0)
            await asyncio.gather(use("a", 0.05), use("b", 0.05))

    asyncio.run(scenario())
    assert order[:4] == ["slow in", "impatient in", "impatient out", "slow out"]
    assert order[4:] == ["next in", "next out", "a in", "a out", "b in", "b out"]
