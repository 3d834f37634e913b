"""Hostile and sloppy rollout clients over a real server (issue 8): non-finite numbers, bool step ids,
extension types, bytes keys, oversized batches and JSON documents, images, a step longer than the TTL.
Requests ask for rollserve's strict status codes; the error code in the body is what is pinned."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import httpx
import msgpack
import numpy as np
import pytest
import simplejpeg

from rollserve.models.world import WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.rollout.status_codes import MODE_HEADER, STRICT
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import packb, unpackb
from rollserve.wire.images import IMAGE_KEY

MSGPACK = "application/msgpack"
STRICT_MODE = {MODE_HEADER: "strict"}


class SlowWorld(ToyWorld):
    """Each step takes ``delay_s`` (a big model on a busy GPU)."""

    delay_s = 0.0

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        time.sleep(self.delay_s)
        return super().step_batch(steps)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with (
        serving(app) as server,
        httpx.Client(base_url=server.http_url, timeout=30.0, headers=STRICT_MODE) as client,
    ):
        yield client


def _create(http: httpx.Client) -> str:
    resp = http.post("/v1/realtime/sessions", json={"model": "toy", "seed": 1})
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def _step(step_id: object, joints: object = None, **observation: object) -> dict:
    return {
        "step_id": step_id,
        "observation": {"prompt": "reach", **observation},
        "action": {} if joints is None else {"joint_positions": joints, "gripper_position": 0.5},
    }


def _post(http: httpx.Client, path: str, body: object, *, as_msgpack: bool = False) -> httpx.Response:
    if as_msgpack:
        content = body if isinstance(body, bytes) else packb(body)
        return http.post(
            path, content=content, headers={"content-type": MSGPACK, "accept": "application/json"}
        )
    return http.post(path, json=body) if not isinstance(body, bytes) else http.post(path, content=body)


def _refused(resp: httpx.Response, code: str) -> dict:
    assert resp.status_code == STRICT[code], resp.text
    payload = resp.json()
    assert payload["error"]["code"] == code, payload
    assert "Traceback" not in resp.text and 'File "' not in resp.text
    return payload


def _committed(http: httpx.Client, sid: str) -> int:
    return http.get(f"/v1/realtime/sessions/{sid}/status").json()["committed_step_id"]


INF = float("inf")
NON_FINITE_STEPS = {
    "inf joint": (_step(0, [INF] + [0.0] * 6), True),
    "1e308 joint (inf as float32)": (_step(0, [1e308] + [0.0] * 6), False),
    "nan state": (_step(0, state=[float("nan")] * 8), True),
    "inf joints in extra": (_step(0, extra={"observation/joint_position": [INF] * 7,
                                            "observation/gripper_position": [0.0]}), True),
    "1e308 joints in extra": (_step(0, extra={"observation/joint_position": np.full(7, 1e308),
                                              "observation/gripper_position": np.zeros(1)}), True),
    "bool step_id": (_step(True, [0.1] * 7), False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(NON_FINITE_STEPS))
def test_non_finite_inputs_and_bool_step_ids_commit_nothing(http: httpx.Client, name: str) -> None:
    body, as_msgpack = NON_FINITE_STEPS[name]
    sid = _create(http)
    _refused(_post(http, f"/v1/realtime/sessions/{sid}/step", body, as_msgpack=as_msgpack), "invalid_request")
    assert _committed(http, sid) == -1
    ok = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, [0.1] * 7))
    assert ok.status_code == 200 and _committed(http, sid) == 0


def test_a_msgpack_timestamp_is_refused(http: httpx.Client) -> None:
    sid = _create(http)
    body = msgpack.packb({**_step(0, [0.1] * 7), "use_session_context": msgpack.Timestamp(1, 0)})
    _refused(_post(http, f"/v1/realtime/sessions/{sid}/step", body, as_msgpack=True), "invalid_request")


def test_a_bytes_key_inside_extra_fails_only_its_own_item(http: httpx.Client) -> None:
    sids = [_create(http), _create(http)]
    bad = _step(0, [0.1] * 7, extra={"embodiment_name": {b"raw": 1}})
    resp = _post(http, f"/v1/realtime/sessions/{sids[0]}/step", bad, as_msgpack=True)
    _refused(resp, "invalid_request")
    items = [{**bad, "session_id": sids[0]}, {**_step(0, [0.1] * 7), "session_id": sids[1]}]
    resp = _post(http, "/v1/realtime/batch_step", {"items": items}, as_msgpack=True)
    # Refused at validation (the whole body) or per item; never a 500, and the good session may step.
    assert resp.status_code < 500, resp.text
    assert "Traceback" not in resp.text
    assert http.post(f"/v1/realtime/sessions/{sids[1]}/step", json=_step(0 if resp.status_code != 200
                     else 1, [0.1] * 7)).status_code == 200  # fmt: skip


def test_an_oversized_batch_is_refused_before_its_items_are_validated(http: httpx.Client) -> None:
    items = [{"session_id": "x", "step_id": "not an int", "observation": {}, "action": {}}] * 10_000
    payload = _refused(
        _post(http, "/v1/realtime/batch_step", {"items": items}, as_msgpack=True), "invalid_request"
    )
    assert "at most 256 items" in payload["error"]["message"]


def test_an_oversized_msgpack_batch_is_counted_before_it_is_unpacked(http: httpx.Client) -> None:
    # every item holds a Timestamp, which unpacking refuses: the count must answer first
    items = [{"session_id": "x", "step_id": msgpack.Timestamp(1, 0)}] * 300
    payload = _refused(
        _post(http, "/v1/realtime/batch_step", msgpack.packb({"items": items}), as_msgpack=True),
        "invalid_request",
    )
    assert payload["error"]["message"] == "batch_step takes at most 256 items"
    fewer = msgpack.packb({"items": items[:256]})  # within the count: the decoder refuses it
    payload = _refused(_post(http, "/v1/realtime/batch_step", fewer, as_msgpack=True), "invalid_request")
    assert "timestamp" in payload["error"]["message"]


def test_json_bodies_are_budgeted_before_parsing(http: httpx.Client) -> None:
    sid = _create(http)
    body = _step(0, [0.1] * 7, extra={"embodiment_name": [0] * 70_000})
    _refused(_post(http, f"/v1/realtime/sessions/{sid}/step", body), "payload_too_large")
    long_state = _step(0, state=[0.0] * 2000)
    _refused(_post(http, f"/v1/realtime/sessions/{sid}/step", long_state), "invalid_request")
    nested = _step(0, [0.1] * 7, extra={"embodiment_name": [[0] * 1000] * 10})
    _refused(_post(http, f"/v1/realtime/sessions/{sid}/step", nested, as_msgpack=True), "invalid_request")
    assert _committed(http, sid) == -1


def _jpeg_map(side: int) -> dict:
    data = simplejpeg.encode_jpeg(np.zeros((side, side, 3), np.uint8), quality=10, colorspace="RGB")
    return {IMAGE_KEY: True, b"format": "jpeg", b"data": data}


def test_images_are_counted_and_budgeted_where_they_belong(http: httpx.Client) -> None:
    sid = _create(http)
    path = f"/v1/realtime/sessions/{sid}/step"
    too_many = _step(0, [0.1] * 7, images={f"c{i}": _jpeg_map(64) for i in range(17)})
    _refused(_post(http, path, too_many, as_msgpack=True), "invalid_request")
    bombs = _step(0, [0.1] * 7, images={f"c{i}": _jpeg_map(4096) for i in range(3)})
    _refused(_post(http, path, bombs, as_msgpack=True), "invalid_request")
    elsewhere = _step(0, [0.1] * 7, extra={"embodiment_name": _jpeg_map(4096)})  # refused, not decoded
    _refused(_post(http, path, elsewhere, as_msgpack=True), "invalid_request")
    fine = _step(0, [0.1] * 7, images={"wrist": _jpeg_map(64)})
    resp = _post(http, path, fine, as_msgpack=True)
    assert resp.status_code == 200, resp.text


def test_a_step_longer_than_the_ttl_leaves_a_live_session() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_idle_ttl_s=0.4)
    world = SlowWorld()
    app = create_app(settings, rollout=RolloutService(world, settings))
    with (
        serving(app) as server,
        httpx.Client(base_url=server.http_url, timeout=30.0, headers=STRICT_MODE) as http,
    ):
        sid = _create(http)
        world.delay_s = 0.6
        assert http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, [0.1] * 7)).status_code == 200
        world.delay_s = 0.0
        resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(1, [0.1] * 7))
        assert resp.status_code == 200, resp.text  # it was busy, never idle
        time.sleep(0.6)
        resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(2, [0.1] * 7))
        assert resp.json()["error"]["code"] == "session_expired"


def test_msgpack_bodies_above_the_body_limit_are_refused() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0, max_body_bytes=256 * 1024)
    app = create_app(settings, rollout=RolloutService(ToyWorld(), settings))
    with (
        serving(app) as server,
        httpx.Client(base_url=server.http_url, timeout=30.0, headers=STRICT_MODE) as http,
    ):
        sid = _create(http)
        empty_maps = b"\xdd" + (300_000).to_bytes(4, "big") + b"\x80" * 300_000
        resp = _post(http, f"/v1/realtime/sessions/{sid}/step", empty_maps, as_msgpack=True)
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "payload_too_large"
        under = b"\xdd" + (200_000).to_bytes(4, "big") + b"\x80" * 200_000
        resp = _post(http, f"/v1/realtime/sessions/{sid}/step", under, as_msgpack=True)
        assert resp.json()["error"]["code"] in ("payload_too_large", "invalid_request")
        assert unpackb(packb({"ok": 1}))["ok"] == 1
        assert http.post(f"/v1/realtime/sessions/{sid}/step", json=_step(0, [0.1] * 7)).status_code == 200
