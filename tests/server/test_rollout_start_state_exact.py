"""A client's start state is checked against the published bounds as the client sent it, before it
is rounded to float32.

The rule (docs/rollout.md): every value ``v`` of the start state must satisfy ``low <= v <= high``
exactly, ``low``/``high`` being the numbers ``/v1/models`` publishes and ``v`` the number in the
request (float64 from JSON). Rounding first let a value just past a bound round onto it and pass
(``1 + 2**-52`` for the toy's bound 1.0), and compared with bounds rounded to float32, which moves
a bound that float32 cannot hold: 0.7 becomes 0.699999988..., so 0.7 itself, at the bound, was
refused, and 0.1 becomes 0.100000001..., so a value just past 0.1 passed. That float32 rounding
itself (the bound of the float32 ``observation_space`` a gymnasium client holds) is at the bound too,
and nothing between it and the published number is.

The values are computed here from their definitions (``1 + 2**-52`` is the float64 after 1.0), not
read from the code under test.
"""

from __future__ import annotations

import base64
import dataclasses

import httpx
import numpy as np
import pytest

from rollserve.models.world import WorldSpec
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
ABOVE_ONE = 1.0 + 2.0**-52  # the float64 after 1.0
BELOW_MINUS_ONE = -1.0 - 2.0**-52  # the float64 before -1.0
JUST_INSIDE_ONE = 1.0 - 2.0**-53  # the float64 before 1.0: rounds to float32 1.0


def test_the_neighbours_are_the_float64_neighbours_of_the_bounds() -> None:
    assert np.nextafter(1.0, 2.0) == ABOVE_ONE and np.nextafter(-1.0, -2.0) == BELOW_MINUS_ONE
    assert np.nextafter(1.0, 0.0) == JUST_INSIDE_ONE
    assert np.nextafter(0.1, 1.0) == 0.1 + 2.0**-56  # the float64 after 0.1 (its ulp is 2**-56)
    assert np.float32(ABOVE_ONE) == np.float32(BELOW_MINUS_ONE) * -1 == np.float32(JUST_INSIDE_ONE) == 1.0


def spec(low: float, high: float) -> WorldSpec:
    return WorldSpec(
        name="w", observation_names=("x", "y"), observation_low=(low, low), observation_high=(high, high)
    )


@pytest.mark.parametrize(
    ("low", "high", "value", "said"),
    [
        (
            -1.0,
            1.0,
            ABOVE_ONE,
            "start state value 1.0000000000000002 at index 1 (y) is above observation_high 1.0",
        ),
        (
            -1.0,
            1.0,
            BELOW_MINUS_ONE,
            "start state value -1.0000000000000002 at index 1 (y) is below observation_low -1.0",
        ),
        # float32(0.1) = 0.100000001490116...: a bound rounded to it let the float64 after 0.1 in
        (
            -1.0,
            0.1,
            0.1 + 2.0**-56,
            "start state value 0.10000000000000002 at index 1 (y) is above observation_high 0.1",
        ),
        (
            -0.1,
            1.0,
            -0.1 - 2.0**-56,
            "start state value -0.10000000000000002 at index 1 (y) is below observation_low -0.1",
        ),
    ],
)
def test_a_value_past_a_bound_as_sent_is_refused(low: float, high: float, value: float, said: str) -> None:
    assert value not in (low, high) and not low <= value <= high  # outside, in exact arithmetic
    with pytest.raises(ValueError) as refused:
        spec(low, high).check_start_state(np.array([0.0, value], dtype=np.float64))
    assert str(refused.value) == said


@pytest.mark.parametrize(
    ("low", "high", "value"),
    [
        (-1.0, 1.0, 1.0),
        (-1.0, 1.0, -1.0),
        (-1.0, 1.0, JUST_INSIDE_ONE),
        (-1.0, 0.7, 0.7),  # float32(0.7) = 0.699999988...: a bound rounded to it refused 0.7 itself
        (-0.7, 1.0, -0.7),
        (-1.0, 0.7, float(np.float32(0.7))),  # the float32 below 0.7 a client may send back
    ],
)
def test_a_value_at_or_inside_the_bounds_as_sent_is_accepted(low: float, high: float, value: float) -> None:
    assert low <= value <= high
    spec(low, high).check_start_state(np.array([0.0, value], dtype=np.float64))


def test_only_the_float32_rounding_of_a_bound_counts_as_the_bound_not_what_lies_between() -> None:
    """float32(0.1) = 0.100000001490116...: past 0.1 exactly, but it is the bound of the float32
    ``observation_space`` a gymnasium client holds, and it rounds to the same float32 start as 0.1."""
    bound32 = float(np.float32(0.1))
    assert bound32 == 0.100000001490116119384765625  # float32(0.1), exactly
    past = np.nextafter(bound32, 1.0)  # the float64 after it: rounds to float32(0.1) too
    assert np.float32(past) == np.float32(0.1)
    with pytest.raises(ValueError, match=r"is above observation_high 0\.1$"):
        spec(-1.0, 0.1).check_start_state(np.array([0.0, past]))
    with pytest.raises(ValueError, match=r"is below observation_low -0\.1$"):
        spec(-0.1, 1.0).check_start_state(np.array([0.0, -past]))
    spec(-0.1, 0.1).check_start_state(np.array([-bound32, bound32]))  # both at their bounds


def _state(last: float) -> list[float]:
    """A toy start state (15 values, bounds +-1) whose last value (``target_6``) is ``last``."""
    return [0.0] * 14 + [last]


def _create(http: httpx.Client) -> str:
    resp = http.post(SESSIONS, json={"model": "toy", "seed": 3})
    assert resp.status_code == 200, resp.text
    return str(resp.json()["session_id"])


def _status(http: httpx.Client, sid: str) -> int:
    return int(http.get(f"{SESSIONS}/{sid}/status").json()["committed_step_id"])


def _observation(obs: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(obs["video_latent"]), dtype=np.float32)


@pytest.mark.parametrize(
    ("last", "said"),
    [
        (
            ABOVE_ONE,
            "start state value 1.0000000000000002 at index 14 (target_6) is above observation_high 1.0",
        ),
        (
            BELOW_MINUS_ONE,
            "start state value -1.0000000000000002 at index 14 (target_6) is below observation_low -1.0",
        ),
    ],
)
@pytest.mark.parametrize("where", ["reset", "step 0"])
def test_the_server_refuses_a_start_past_a_bound_that_float32_would_round_onto_it(
    http: httpx.Client, last: float, said: str, where: str
) -> None:
    sid = _create(http)
    if where == "reset":
        resp = http.post(f"{SESSIONS}/{sid}/reset", json={"state": _state(last)})
        error = resp.json()["error"]
        message, code = error["message"], error["reason"]
    else:
        body = {"step_id": 0, "observation": {"extra": {"observation/state": _state(last)}}, "action": ACTION}
        resp = http.post(f"{SESSIONS}/{sid}/step", json=body)
        message, code = resp.json()["error"]["message"], resp.json()["error"]["code"]
    assert resp.status_code == 400, resp.text  # invalid_request in vLLM-Omni mode (the default)
    assert (code, message) == ("invalid_request", said)
    assert _status(http, sid) == -1


@pytest.mark.parametrize("last", [1.0, -1.0, JUST_INSIDE_ONE])
def test_the_server_starts_from_a_start_at_or_inside_the_bounds_as_sent(
    http: httpx.Client, last: float
) -> None:
    sid = _create(http)
    resp = http.post(f"{SESSIONS}/{sid}/reset", json={"state": _state(last)})
    assert resp.status_code == 200, resp.text
    first = _observation(resp.json()["observation"])
    assert first.tolist() == np.float32(_state(last)).tolist()  # the float32 rounding of what was sent
    assert -1.0 <= first[14] <= 1.0


class _TenthWorld(ToyWorld):
    """The toy world with a bound float32 cannot hold: ``target_6`` within [-0.1, 0.1]."""

    spec = dataclasses.replace(
        ToyWorld.spec, observation_low=(-1.0,) * 14 + (-0.1,), observation_high=(1.0,) * 14 + (0.1,)
    )


def test_the_server_starts_from_the_float32_bound_a_gym_space_holds() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, rollout=RolloutService(_TenthWorld(), settings))
    with serving(app) as server, httpx.Client(base_url=server.http_url, timeout=30) as http:
        high = http.get("/v1/models").json()["data"][0]["observation"]["high"][14]
        assert high == 0.1  # published as the world states it
        space_high = float(np.float32(high))  # what RolloutEnv's float32 observation_space holds
        sid = _create(http)
        started = http.post(f"{SESSIONS}/{sid}/reset", json={"state": _state(space_high)})
        assert started.status_code == 200, started.text
        assert _observation(started.json()["observation"])[14] == np.float32(0.1)
        between = http.post(f"{SESSIONS}/{sid}/reset", json={"state": _state(0.1 + 2.0**-56)})
        assert between.status_code == 400
        assert between.json()["error"]["message"].endswith("is above observation_high 0.1")
