"""Frames are chosen once, when a session is created (docs/rollout.md: a fork and every reset keep
the choice). A ``render`` in a reset or fork body was silently ignored (200, no frames); it is now
``invalid_request`` and changes nothing. Other unknown keys stay ignored, as vLLM-Omni ignores them.
"""

from __future__ import annotations

import httpx

SESSIONS = "/v1/realtime/sessions"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
RENDER = {"cameras": ["exterior"], "height": 64, "width": 64}
MESSAGE = "body: Value error, render is chosen when a session is created; a reset or fork keeps the session's"


def _session_at_step_0(http: httpx.Client, sid: str) -> None:
    assert http.post(SESSIONS, json={"model": "toy", "seed": 0, "session_id": sid}).status_code == 200
    step = http.post(f"{SESSIONS}/{sid}/step", json={"step_id": 0, "observation": {}, "action": ACTION})
    assert step.json()["error"] is None


def _counters(http: httpx.Client, sid: str) -> tuple[int, int]:
    status = http.get(f"{SESSIONS}/{sid}/status").json()
    return status["committed_step_id"], status["context_length"]


def test_a_reset_asking_for_frames_is_refused_and_changes_nothing(http: httpx.Client) -> None:
    _session_at_step_0(http, "r")
    refused = http.post(f"{SESSIONS}/r/reset", json={"seed": 2, "render": RENDER})
    assert refused.status_code == 400
    assert (refused.json()["error"]["reason"], refused.json()["error"]["message"]) == (
        "invalid_request",
        MESSAGE,
    )
    assert _counters(http, "r") == (0, 1)  # the episode goes on
    assert http.post(f"{SESSIONS}/r/reset", json={"seed": 2, "unknown": 1}).status_code == 200


def test_a_fork_asking_for_frames_is_refused_and_makes_no_session(http: httpx.Client) -> None:
    _session_at_step_0(http, "f")
    refused = http.post(f"{SESSIONS}/f/fork", json={"session_id": "f2", "render": RENDER})
    assert refused.status_code == 400
    assert (refused.json()["error"]["reason"], refused.json()["error"]["message"]) == (
        "invalid_request",
        MESSAGE,
    )
    assert http.get(f"{SESSIONS}/f2/status").status_code == 404
    assert http.post(f"{SESSIONS}/f/fork", json={"session_id": "f2"}).status_code == 200
