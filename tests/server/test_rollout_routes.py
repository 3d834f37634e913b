"""The rollout REST routes through a real uvicorn server: status codes, JSON and msgpack, bad input.

These run in strict mode (rollserve's semantic statuses); ``test_rollout_status_codes.py`` pins both
modes against the table in docs/rollout.md.
"""

from __future__ import annotations

import base64
import dataclasses

import httpx
import msgpack
import numpy as np
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import packb, unpackb
from rollserve.wire.limits import WireLimits

MSGPACK = "application/msgpack"
LIMIT = 64 * 1024
BROKEN = 0.625  # a first joint of this makes the world raise


class BreakableWorld(ToyWorld):
    def step_batch(self, steps):
        return [
            RuntimeError("CUDA error: device-side assert") if s.action[0] == np.float32(BROKEN) else out
            for s, out in zip(steps, super().step_batch(steps), strict=True)
        ]


def make_server(**overrides):
    settings = ServerSettings(
        max_batch_wait_ms=0.0,
        limits=WireLimits(max_frame_bytes=LIMIT),
        rollout_status_codes="strict",
        **overrides,
    )
    return serving(create_app(settings, rollout=RolloutService(BreakableWorld(), settings)))


@pytest.fixture(scope="module")
def http():
    with make_server() as server, httpx.Client(base_url=server.http_url, timeout=30.0) as client:
        yield client


def body(step_id: int, a: float = 0.1, **extra) -> dict:
    return {
        "step_id": step_id,
        "observation": {"prompt": "reach"},
        "action": {"joint_positions": [a] * 7, "gripper_position": 0.5},
        **extra,
    }


def create(http: httpx.Client, seed: int = 0) -> str:
    resp = http.post("/v1/realtime/sessions", json={"model": "toy", "seed": seed})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def url(sid: str, verb: str) -> str:
    return f"/v1/realtime/sessions/{sid}/{verb}"


def tensor(next_observation: dict) -> np.ndarray:
    data = base64.b64decode(next_observation["video_latent"])
    return np.frombuffer(data, dtype=np.float32).reshape(next_observation["shape"])


def assert_step_error(resp: httpx.Response, status: int, code: str, committed: int) -> dict:
    assert resp.status_code == status, resp.text
    payload = unpackb(resp.content) if resp.headers["content-type"] == MSGPACK else resp.json()
    assert payload["error"]["code"] == code
    assert payload["model_metadata"]["committed_step_id"] == committed
    assert payload["error"]["committed_step_id"] == committed
    assert "Traceback" not in resp.text
    return payload


def test_session_lifecycle_and_status_codes(http: httpx.Client) -> None:
    sid = create(http)
    assert http.get(url(sid, "status")).json() == {
        "session_id": sid,
        "committed_step_id": -1,
        "context_length": 0,
        "closed": False,
        "closed_reason": None,
        "model": "toy",
    }
    ok = http.post(url(sid, "step"), json=body(0))
    assert ok.status_code == 200
    assert ok.json()["error"] is None and ok.json()["model_metadata"]["committed_step_id"] == 0
    dup = assert_step_error(http.post(url(sid, "step"), json=body(0)), 409, "step_already_committed", 0)
    assert dup["replayed"] and dup["next_observation"] == ok.json()["next_observation"]
    assert_step_error(http.post(url(sid, "step"), json=body(5)), 409, "step_out_of_order", 0)
    reset = http.post(url(sid, "reset"), json={"seed": 1})
    assert reset.status_code == 200 and reset.json()["committed_step_id"] == -1
    assert http.post(url(sid, "reset")).status_code == 200  # no body: the vLLM-Omni form
    assert http.post(url(sid, "close")).json() == {"session_id": sid, "closed": True, "committed_step_id": -1}
    assert http.post(url(sid, "close")).status_code == 200  # idempotent
    assert http.get(url(sid, "status")).json()["closed"] is True
    assert_step_error(http.post(url(sid, "step"), json=body(0)), 410, "session_closed", -1)
    assert http.post(url(sid, "reset")).status_code == 410


def test_unknown_session_is_404_with_a_full_step_body(http: httpx.Client) -> None:
    payload = assert_step_error(http.post(url("nope", "step"), json=body(3)), 404, "session_not_found", -1)
    assert payload["step_id"] == 3 and payload["next_observation"] is None
    for verb, method in [
        ("status", http.get),
        ("reset", http.post),
        ("close", http.post),
        ("fork", http.post),
    ]:
        resp = method(url("nope", verb))
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "session_not_found"


def test_model_failure_is_a_500_that_commits_nothing(http: httpx.Client) -> None:
    sid = create(http)
    http.post(url(sid, "step"), json=body(0))
    payload = assert_step_error(http.post(url(sid, "step"), json=body(1, BROKEN)), 500, "inference_error", 0)
    assert payload["model_metadata"]["context_length"] == 1
    assert "CUDA error" in payload["error"]["message"]
    assert http.post(url(sid, "step"), json=body(1)).status_code == 200


def test_unknown_model_is_404_and_create_with_chosen_id_is_idempotent(http: httpx.Client) -> None:
    bad_seed = http.post("/v1/realtime/sessions", json={"model": "toy", "seed": -1})
    assert bad_seed.status_code == 422 and bad_seed.json()["error"]["code"] == "invalid_request"
    resp = http.post("/v1/realtime/sessions", json={"model": "dreamzero"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    first = http.post("/v1/realtime/sessions", json={"model": "toy", "session_id": "routes-fixed"})
    again = http.post("/v1/realtime/sessions", json={"model": "toy", "session_id": "routes-fixed"})
    assert first.json()["session_id"] == again.json()["session_id"] == "routes-fixed"


@pytest.mark.parametrize("extra", [{}, {"observation": {"extra": {"seed": 7}}}], ids=["plain", "with extra"])
def test_a_step_resent_through_the_other_route_is_replayed(http: httpx.Client, extra: dict) -> None:
    """A trainer that lost a batch reply may retry one item alone, or the other way round."""
    sid = create(http)
    step0, step1 = body(0) | extra, body(1) | extra
    first = http.post("/v1/realtime/batch_step", json={"items": [{"session_id": sid, **step0}]})
    assert first.json()["results"][0]["status"] == "ok"
    again = http.post(url(sid, "step"), json=step0)
    assert again.json()["replayed"] and again.json()["error"]["code"] == "step_already_committed"
    assert again.json()["next_observation"] == first.json()["results"][0]["next_observation"]
    alone = http.post(url(sid, "step"), json=step1)
    assert alone.status_code == 200 and alone.json()["error"] is None
    batched = http.post("/v1/realtime/batch_step", json={"items": [{"session_id": sid, **step1}]})
    (result,) = batched.json()["results"]
    assert result["replayed"] and result["next_observation"] == alone.json()["next_observation"]
    other = body(1, 0.7) | extra  # same step id, other content: still a conflict, not a replay
    refused = http.post(url(sid, "step"), json=other).json()
    assert refused["error"]["code"] == "step_already_committed" and not refused["replayed"]


def test_fork_and_batch_step(http: httpx.Client) -> None:
    sid = create(http, seed=4)
    http.post(url(sid, "step"), json=body(0, 0.3))
    fork = http.post(url(sid, "fork"))
    assert fork.status_code == 200
    fid = fork.json()["session_id"]
    assert fork.json()["forked_from"] == sid and fork.json()["committed_step_id"] == 0
    items = [
        {"session_id": sid, **body(1, -0.2)},
        {"session_id": fid, **body(1, -0.2)},
        {"session_id": "ghost", **body(0)},
        {"session_id": create(http), **body(0, BROKEN)},
    ]
    resp = http.post("/v1/realtime/batch_step", json={"items": items})
    assert resp.status_code == 200
    results = resp.json()["results"]
    assert [r["status"] for r in results] == ["ok", "ok", "error", "error"]
    assert [r["error"] and r["error"]["code"] for r in results] == [
        None,
        None,
        "session_not_found",
        "inference_error",
    ]
    assert results[0]["next_observation"] == results[1]["next_observation"]
    assert http.post("/v1/realtime/batch_step", json={"items": []}).status_code == 422


def test_msgpack_bodies_and_content_negotiation(http: httpx.Client) -> None:
    headers = {"content-type": MSGPACK, "accept": MSGPACK}
    created = http.post("/v1/realtime/sessions", content=packb({"model": "toy", "seed": 2}), headers=headers)
    assert created.headers["content-type"] == MSGPACK
    sid = unpackb(created.content)["session_id"]
    step = {
        **body(0),
        "observation": {"images": {"wrist": np.zeros((4, 4, 3), np.uint8)}, "state": np.zeros(3, np.float32)},
        "action": {"joint_positions": np.full(7, 0.1, np.float32), "gripper_position": 0.5},
    }
    packed = http.post(url(sid, "step"), content=packb(step), headers=headers)
    assert packed.status_code == 200
    reply = unpackb(packed.content)
    latent = reply["next_observation"]["video_latent"]
    assert isinstance(latent, np.ndarray) and latent.dtype == np.float32
    twin = create(http, seed=2)
    as_json = http.post(url(twin, "step"), json=body(0)).json()
    np.testing.assert_array_equal(latent, tensor(as_json["next_observation"]))
    # msgpack in, JSON out (Accept wins), and JSON in, msgpack out
    dup = http.post(
        url(sid, "step"), content=packb(step), headers={"content-type": MSGPACK, "accept": "application/json"}
    )
    assert dup.status_code == 409 and dup.json()["replayed"]
    status = http.get(url(sid, "status"), headers={"accept": MSGPACK})
    assert unpackb(status.content)["committed_step_id"] == 0
    # a plain msgpack client (no numpy) can read a reply too
    assert msgpack.unpackb(packed.content)["step_id"] == 0


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"{not json", {"content-type": "application/json"}, 422, "invalid_request"),
        (b"\xc1\xff\x00", {"content-type": MSGPACK}, 422, "invalid_request"),
        (b"[1, 2]", {"content-type": "application/json"}, 422, "invalid_request"),
        (b'{"step_id": 0}', {"content-type": "application/json"}, 422, "invalid_request"),
        (b'{"step_id": "zero", "observation": {}, "action": {}}', {}, 422, "invalid_request"),
        (b"step_id=0", {"content-type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        (b"", {}, 422, "invalid_request"),
        (
            b'{"step_id": 0, "observation": {}, "action": {"joint_positions": [NaN]}}',
            {},
            422,
            "invalid_request",
        ),
    ],
)
def test_bad_bodies_get_typed_errors_and_the_server_keeps_serving(
    http, content, headers, status, code
) -> None:
    sid = create(http)
    http.post(url(sid, "step"), json=body(0))
    resp = http.post(url(sid, "step"), content=content, headers=headers)
    payload = assert_step_error(resp, status, code, 0)
    assert payload["model_metadata"]["context_length"] == 1
    assert "Traceback" not in resp.text and "pydantic" not in resp.text
    assert http.post(url(sid, "step"), json=body(1)).status_code == 200


def test_wrong_action_length_is_422_before_the_model(http: httpx.Client) -> None:
    sid = create(http)
    bad = {**body(0), "action": {"joint_positions": [0.0] * 6, "gripper_position": 0.5}}
    payload = assert_step_error(http.post(url(sid, "step"), json=bad), 422, "invalid_request", -1)
    assert "7 values" in payload["error"]["message"]


@pytest.mark.parametrize("framing", ["json", "msgpack", "chunked"])
def test_bodies_over_the_frame_limit_are_413(http: httpx.Client, framing: str) -> None:
    sid = create(http)
    huge = {**body(0), "observation": {"extra": {"blob": "x" * (LIMIT * 2)}}}
    if framing == "json":
        resp = http.post(url(sid, "step"), json=huge)
    elif framing == "msgpack":
        resp = http.post(url(sid, "step"), content=packb(huge), headers={"content-type": MSGPACK})
    else:
        resp = http.post(url(sid, "step"), content=iter([b"{" + b" " * LIMIT] * 2))
    assert resp.status_code == 413
    payload = unpackb(resp.content) if resp.headers["content-type"] == MSGPACK else resp.json()
    assert payload["error"]["code"] == "payload_too_large"
    assert http.post(url(sid, "step"), json=body(0)).status_code == 200


def test_capacity_is_503() -> None:
    with make_server(max_rollout_sessions=1) as server, httpx.Client(base_url=server.http_url) as client:
        create(client)
        resp = client.post("/v1/realtime/sessions", json={"model": "toy"})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "at_capacity"


def test_metrics_count_rollout_requests_and_errors(http: httpx.Client) -> None:
    sid = create(http)
    http.post(url(sid, "step"), json=body(0))
    http.post(url(sid, "step"), json=body(0))
    text = http.get("/metrics").text
    assert 'rollserve_requests_total{route="step"}' in text
    assert 'rollserve_errors_total{code="step_already_committed",route="step"}' in text
    assert 'rollserve_batch_size_count{kind="world"}' in text


def test_models_endpoint_publishes_the_world_layout(http: httpx.Client) -> None:
    (entry,) = http.get("/v1/models").json()["data"]
    assert entry["id"] == "toy" and entry["kind"] == "world" and entry["object"] == "model"
    assert entry["action"]["names"][-1] == "gripper" and entry["action"]["shape"] == [8]
    assert entry["observation"]["shape"] == [15]


def test_api_key_guards_the_rollout_routes() -> None:
    with make_server(api_key="s3cret") as server, httpx.Client(base_url=server.http_url) as client:
        assert client.post("/v1/realtime/sessions", json={"model": "toy"}).status_code == 401
        ok = client.post(
            "/v1/realtime/sessions", json={"model": "toy"}, headers={"authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200


def test_unserialisable_world_info_is_an_inference_error() -> None:
    class ChattyWorld(ToyWorld):
        def step_batch(self, steps):
            return [dataclasses.replace(o, info={"obj": object()}) for o in super().step_batch(steps)]

    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes="strict")
    app = create_app(settings, rollout=RolloutService(ChattyWorld(), settings))
    with serving(app) as server, httpx.Client(base_url=server.http_url) as client:
        sid = create(client)
        assert_step_error(client.post(url(sid, "step"), json=body(0)), 500, "inference_error", -1)
