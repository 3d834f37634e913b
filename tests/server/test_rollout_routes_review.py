"""The rollout routes' transport, pinned where the mutation run of ``server/rollout/routes.py`` found
nothing that would fail (docs/testing.md, ``rollout_routes``).

The route handlers and ``answer`` are closures of ``build_rollout_router``: mutmut checks their
slips against the tests that built a server, so every test here builds its own (``server``) on
127.0.0.1 and an ephemeral port. The expected numbers and messages are written out by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import msgpack
import numpy as np
import pytest

from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.metrics import METRICS
from rollserve.server.penalty import RefusalPenalty, RefusalStreak
from rollserve.server.rollout import routes
from rollserve.server.rollout.batch_peek import declared_items
from rollserve.server.rollout.protocol import SessionStatusResponse
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import packb, unpackb
from rollserve.wire.limits import WireLimits

MSGPACK = "application/msgpack"
SESSIONS = "/v1/realtime/sessions"
BATCH = "/v1/realtime/batch_step"
ACTION = {"joint_positions": [0.1] * 7, "gripper_position": 0.5}
NOT_FINITE = "Value error, must be finite and within float32 range"


@contextlib.contextmanager
def server(
    world: ToyWorld | None = None, service: dict | None = None, **settings: object
) -> Iterator[httpx.Client]:
    """A fresh server over the toy world and a client of it (default status codes unless asked)."""
    config = ServerSettings(max_batch_wait_ms=0.0, **settings)  # type: ignore[arg-type]
    rollout = RolloutService(world or ToyWorld(), config, **(service or {}))
    with (
        serving(create_app(config, rollout=rollout)) as running,
        httpx.Client(base_url=running.http_url, timeout=30.0) as client,
    ):
        yield client


def create(http: httpx.Client, sid: str | None = None) -> str:
    body = {"model": "toy", "seed": 1} | ({"session_id": sid} if sid else {})
    resp = http.post(SESSIONS, json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["session_id"]


def step_body(step_id: object = 0, **observation: object) -> dict:
    return {"step_id": step_id, "observation": {"prompt": "reach", **observation}, "action": ACTION}


# --- batch_peek: the count of a msgpack batch, read from its first bytes ---------------------------


def test_a_fixmap_of_fifteen_keys_is_peeked() -> None:
    body = {"items": [0, 0]} | {f"k{i}": 0 for i in range(14)}
    data = msgpack.packb(body)
    assert data[0] == 0x8F  # the largest fixmap
    assert declared_items(data) == 2


def test_a_counted_header_needs_no_byte_after_it() -> None:
    # the array header is the last thing in the bytes: its count is still read
    assert declared_items(b"\x81\xa5items\xdc\x01\x01") == 257
    assert declared_items(b"\x81\xa5items\xdd\x01\x00\x00\x01") == 2**24 + 1
    assert declared_items(b"\x81\xa5items\xdd\x00\x00\x01\x01") == 257


@pytest.mark.parametrize(
    "data",
    [
        b"\x90\xa5items\xdc\x01\x01",  # an empty array (0x90) is no map, whatever follows it
        msgpack.packb({"items": ""}),  # an empty string (0xa0) is no array
    ],
)
def test_what_is_no_map_of_an_array_is_not_peeked(data: bytes) -> None:
    assert declared_items(data) is None


# --- the server's wire limits reach validation ------------------------------------------------------


def test_images_are_checked_against_the_servers_own_limits() -> None:
    """A server with a smaller image side refuses a 64x64 wire image: in a step, and in a batch
    whose other item failed validation (its items are then validated one by one)."""
    wide = np.zeros((64, 64, 3), np.uint8)
    headers = {"content-type": MSGPACK, "accept": "application/json"}
    with server(limits=WireLimits(max_image_side=32)) as http:
        sid = create(http)
        resp = http.post(
            f"{SESSIONS}/{sid}/step", content=packb(step_body(images={"wrist": wide})), headers=headers
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_request"
        assert "observation.images" in resp.json()["error"]["message"]
        other = create(http)
        items = [
            {"session_id": other, **step_body(), "action": {"joint_positions": [float("nan")] * 7}},
            {"session_id": sid, **step_body(images={"wrist": wide})},
        ]
        resp = http.post(BATCH, content=packb({"items": items}), headers=headers)
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["status"] for r in results] == ["error", "error"]
        assert [r["error"]["code"] for r in results] == ["invalid_request", "invalid_request"]
        assert "observation.images" in results[1]["error"]["message"]
        assert http.get(f"{SESSIONS}/{sid}/status").json()["committed_step_id"] == -1


# --- a refusal streak: the server's delay settings, and which codes count ---------------------------


def test_the_clients_own_refusals_are_delayed_by_the_servers_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Delays of 20 ms doubling to at most 50 ms, 3 lanes: the five codes that are the client's
    fault count (20, 40, 50, 50, 50 ms), a conflict does not (it halves the count: 5 -> 2). A
    request after a refusal is handled in the shared lane, one after an accepted request is not."""
    delays: list[tuple[float, int]] = []
    lanes: list[str] = []
    refused, lane = RefusalPenalty.refused, RefusalPenalty.lane

    def recording(self: RefusalPenalty, streak: RefusalStreak) -> float:
        delay = refused(self, streak)
        delays.append((delay, self.lanes))
        return delay

    def recording_lane(self: RefusalPenalty, streak: RefusalStreak | None) -> object:
        taken = lane(self, streak)
        lanes.append(type(taken).__name__)
        return taken

    monkeypatch.setattr(RefusalPenalty, "refused", recording)
    monkeypatch.setattr(RefusalPenalty, "lane", recording_lane)
    with server(
        refusal_delay_ms=20.0, refusal_delay_max_ms=50.0, refused_connection_lanes=3, max_body_bytes=1024
    ) as http:
        sid = create(http)
        assert http.post(f"{SESSIONS}/{sid}/step", json=step_body(0)).status_code == 200
        faults = [
            (http.post(f"{SESSIONS}/{sid}/step", content=b"{"), "invalid_request"),
            (http.post(f"{SESSIONS}/{sid}/step", content=b"x" * 2048), "payload_too_large"),
            (
                http.post(f"{SESSIONS}/{sid}/step", content=b"<a/>", headers={"content-type": "text/xml"}),
                "unsupported_media_type",
            ),
            (http.get(f"{SESSIONS}/nobody/status"), "session_not_found"),
            (http.post(SESSIONS, json={"model": "nothing-served"}), "model_not_found"),
        ]
        assert [resp.json()["error"].get("reason", resp.json()["error"]["code"]) for resp, _ in faults] == [
            code for _, code in faults
        ]
        assert delays == [(0.02, 3), (0.04, 3), (0.05, 3), (0.05, 3), (0.05, 3)]
        conflict = http.post(f"{SESSIONS}/{sid}/step", json=step_body(0))  # a duplicate: not a fault
        assert conflict.json()["error"]["code"] == "step_already_committed"
        assert len(delays) == 5
        http.post(f"{SESSIONS}/{sid}/step", content=b"{")  # count 5 // 2 + 1 = 3: 80 ms, capped at 50
        http.post(f"{SESSIONS}/{sid}/reset", json={"seed": 1})  # accepted: 3 // 2 = 1
        http.post(f"{SESSIONS}/{sid}/step", content=b"{")  # count 2: 40 ms
        assert delays[5:] == [(0.05, 3), (0.04, 3)]
        straight = "nullcontext"
        assert lanes == [straight] * 3 + ["_Lane"] * 5 + [straight, "_Lane", straight]


# --- batches are counted before their items are validated ---------------------------------------------


def test_a_json_batch_is_counted_before_its_items_are_validated() -> None:
    with server(service={"max_batch_items": 2}) as http:
        sid = create(http)
        resp = http.post(BATCH, json={"items": [{}, {}, {}]})  # no session_id: would fail whole
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "batch_step takes at most 2 items"
        resp = http.post(BATCH, json={"items": [{"session_id": sid, **step_body(0)}, {}]})
        assert resp.status_code == 400  # two items: counted in, refused whole for the nameless one
        assert resp.json()["error"]["message"] == (
            "items.1.step_id: Field required; items.1.observation: Field required; "
            "items.1.action: Field required; items.1.session_id: Field required"
        )


@pytest.mark.parametrize("column", ["session_ids", "step_ids", "actions"])
def test_each_column_is_counted_before_the_body_is_validated(column: str) -> None:
    body = {"session_ids": ["a"], "step_ids": [0], "actions": [[0.0] * 8]}
    body[column] = body[column] * 3  # the columns differ in length: validation would say so
    with server(service={"max_batch_items": 2}) as http:
        resp = http.post(f"{BATCH}/columns", json=body)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "batch_step takes at most 2 items"
        body[column] = body[column][:2]
        resp = http.post(f"{BATCH}/columns", json=body)
        assert resp.json()["error"]["message"] == (
            "body: Value error, session_ids, step_ids and actions must have one entry per session"
        )


# --- what each route takes ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [SESSIONS, f"{SESSIONS}/SID/step", BATCH, f"{BATCH}/columns"])
@pytest.mark.parametrize("body", [b"", b"  \r\n "], ids=["empty", "blank"])
def test_a_route_that_takes_a_body_refuses_none(path: str, body: bytes) -> None:
    with server() as http:
        resp = http.post(path.replace("SID", create(http)), content=body)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "the request needs a body"


@pytest.mark.parametrize("verb", ["reset", "fork", "close", "status"])
def test_a_session_route_without_a_body_is_answered(verb: str) -> None:
    with server() as http:
        sid = create(http)
        resp = http.request("GET" if verb == "status" else "POST", f"{SESSIONS}/{sid}/{verb}", content=b" ")
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["forked_from"] == sid if verb == "fork" else answer["session_id"] == sid


@pytest.mark.parametrize("verb", ["close", "status"])
def test_close_and_status_never_read_their_body(verb: str) -> None:
    """Not even a body that would fail every model: ``{"session_id": 5}`` or a bad msgpack byte."""
    with server() as http:
        sid = create(http)
        method = "GET" if verb == "status" else "POST"
        for body, media in [(b'{"session_id": 5, "seed": "x"}', "application/json"), (b"\xc1", MSGPACK)]:
            resp = http.request(
                method, f"{SESSIONS}/{sid}/{verb}", content=body, headers={"content-type": media}
            )
            assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", SESSIONS),
        ("GET", f"{SESSIONS}/s/step"),
        ("GET", f"{SESSIONS}/s/reset"),
        ("GET", f"{SESSIONS}/s/close"),
        ("POST", f"{SESSIONS}/s/status"),
        ("GET", f"{SESSIONS}/s/fork"),
        ("GET", BATCH),
        ("GET", f"{BATCH}/columns"),
    ],
)
def test_each_route_takes_its_one_method(method: str, path: str) -> None:
    with server() as http:
        assert http.request(method, path).status_code == 405  # FastAPI's answer: no route takes it


ROUTE_CALLS = [
    ("create", "POST", SESSIONS, {"model": "toy", "seed": 1}),
    ("step", "POST", f"{SESSIONS}/SID/step", step_body(0)),
    ("reset", "POST", f"{SESSIONS}/SID/reset", {"seed": 2}),
    ("fork", "POST", f"{SESSIONS}/SID/fork", {}),
    ("status", "GET", f"{SESSIONS}/SID/status", None),
    ("close", "POST", f"{SESSIONS}/SID/close", None),
    ("batch_step", "POST", BATCH, {"items": [{"session_id": "SID", **step_body(0)}]}),
    (
        "batch_step_columns",
        "POST",
        f"{BATCH}/columns",
        {"session_ids": ["SID"], "step_ids": [0], "actions": [[0.1] * 8]},
    ),
]


def requests_counted(route: str) -> float:
    return METRICS.registry.get_sample_value("rollserve_requests_total", {"route": route}) or 0.0


def errors_counted(route: str, code: str) -> float:
    value = METRICS.registry.get_sample_value("rollserve_errors_total", {"route": route, "code": code})
    return value or 0.0


@pytest.mark.parametrize(("route", "method", "path", "body"), ROUTE_CALLS, ids=[c[0] for c in ROUTE_CALLS])
def test_each_route_answers_and_is_counted_under_its_name(
    route: str, method: str, path: str, body: dict | None
) -> None:
    with server() as http:
        sid = create(http)
        before = requests_counted(route)
        payload = None if body is None else packb(_with_session(body, sid))
        headers = {"content-type": MSGPACK} if payload is not None else {"accept": MSGPACK}
        resp = http.request(method, path.replace("SID", sid), content=payload, headers=headers)
        assert resp.status_code == 200, resp.content
        assert resp.headers["content-type"] == MSGPACK
        answer = unpackb(resp.content)
        assert requests_counted(route) == before + 1
        latents = {
            "create": lambda: answer["observation"]["video_latent"],
            "reset": lambda: answer["observation"]["video_latent"],
            "fork": lambda: answer["observation"]["video_latent"],
            "step": lambda: answer["next_observation"]["video_latent"],
            "batch_step": lambda: answer["results"][0]["next_observation"]["video_latent"],
            "batch_step_columns": lambda: answer["next_observation"]["video_latent"],
        }
        if route in latents:  # msgpack answers carry the tensor itself, not its base64
            latent = latents[route]()
            assert isinstance(latent, np.ndarray) and latent.dtype == np.float32
        else:
            assert answer["session_id"] == sid and answer["committed_step_id"] == -1


def _with_session(body: dict, sid: str) -> dict:
    if "items" in body:
        return {"items": [item | {"session_id": sid} for item in body["items"]]}
    if "session_ids" in body:
        return body | {"session_ids": [sid]}
    return body


# --- error answers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("accept", ["application/json", MSGPACK])
def test_a_step_refused_for_its_body_echoes_its_step_id_and_the_sessions_counters(accept: str) -> None:
    with server() as http:
        sid = create(http)
        assert http.post(f"{SESSIONS}/{sid}/step", json=step_body(0)).status_code == 200
        bad = step_body(1) | {"action": {"joint_positions": [float("nan")] * 7}}
        resp = http.post(
            f"{SESSIONS}/{sid}/step", content=packb(bad), headers={"content-type": MSGPACK, "accept": accept}
        )
        assert resp.status_code == 400
        answer = unpackb(resp.content) if accept == MSGPACK else resp.json()
        assert answer["step_id"] == 1 and answer["error"]["step_id"] == 1
        assert answer["error"]["code"] == "invalid_request"
        shown = [f"action.joint_positions.{i}: {NOT_FINITE}" for i in range(5)]
        assert answer["error"]["message"] == "; ".join(shown) + " (and 2 more)"  # 7 errors, 5 shown
        assert answer["model_metadata"]["committed_step_id"] == answer["error"]["committed_step_id"] == 0
        assert answer["model_metadata"]["context_length"] == 1
        assert answer["next_observation"] is None and answer["replayed"] is False


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_refused_reset_answers_the_error_body_with_the_sessions_committed_step(mode: str) -> None:
    """Not the step body (that is a step's): vLLM's error body, or rollserve's in strict mode."""
    message = "seed: Input should be greater than or equal to 0"
    with server(rollout_status_codes=mode) as http:
        sid = create(http)
        http.post(f"{SESSIONS}/{sid}/step", json=step_body(0))
        http.post(f"{SESSIONS}/{sid}/step", json=step_body(1))
        resp = http.post(f"{SESSIONS}/{sid}/reset", json={"seed": -1})
        missing = http.post(f"{SESSIONS}/gone/reset", json={"seed": -1})
    for answer, committed in [(resp, 1), (missing, -1)]:
        if mode == "strict":
            assert answer.status_code == 422
            assert answer.json() == {
                "error": {
                    "code": "invalid_request",
                    "message": message,
                    "step_id": None,
                    "committed_step_id": committed,
                }
            }
        else:
            assert answer.status_code == 400
            assert answer.json() == {
                "detail": message,
                "error": {
                    "message": message,
                    "type": "Bad Request",
                    "param": None,
                    "code": 400,
                    "reason": "invalid_request",
                    "committed_step_id": committed,
                },
            }


@pytest.mark.parametrize(
    ("server_mode", "header", "status"),
    [
        ("vllm-omni", None, 400),
        ("vllm-omni", "strict", 422),
        ("strict", None, 422),
        ("strict", "VLLM-Omni", 400),
    ],
)
def test_the_mode_header_picks_the_status_of_one_request(
    server_mode: str, header: str | None, status: int
) -> None:
    headers = {} if header is None else {"x-rollserve-status-codes": header}
    with server(rollout_status_codes=server_mode) as http:
        resp = http.post(SESSIONS, json={"model": "toy", "seed": "one"}, headers=headers)
        assert resp.status_code == status
        sid = create(http)
        resp = http.post(f"{SESSIONS}/{sid}/step", json=step_body(5), headers=headers)
        assert resp.status_code == (400 if status == 400 else 409)
        assert resp.json()["error"]["code"] == "step_out_of_order"


class FailingWorld(ToyWorld):
    """Its steps fail with a first joint of 0.625, its start with seed 13."""

    def initial_states(self, inits):  # type: ignore[no-untyped-def]
        outputs = super().initial_states(inits)
        return [RuntimeError("no start") if i.seed == 13 else o for i, o in zip(inits, outputs, strict=True)]

    def step_batch(self, steps):  # type: ignore[no-untyped-def]
        outputs = super().step_batch(steps)
        return [
            RuntimeError("device lost") if s.action[0] == np.float32(0.625) else o
            for s, o in zip(steps, outputs, strict=True)
        ]


@pytest.mark.parametrize(("mode", "status"), [("vllm-omni", 200), ("strict", 500)])
def test_a_failed_world_step_is_answered_in_band_or_as_500_and_counted(mode: str, status: int) -> None:
    with server(FailingWorld(), rollout_status_codes=mode) as http:
        sid = create(http)
        before = errors_counted("step", "inference_error")
        broken = step_body(0) | {"action": {"joint_positions": [0.625] * 7, "gripper_position": 0.5}}
        resp = http.post(f"{SESSIONS}/{sid}/step", json=broken)
        assert resp.status_code == status
        assert resp.json()["error"]["code"] == "inference_error"
        assert errors_counted("step", "inference_error") == before + 1
        ok_before = errors_counted("step", "inference_error")
        assert http.post(f"{SESSIONS}/{sid}/step", json=step_body(0)).status_code == 200
        assert errors_counted("step", "inference_error") == ok_before


class BrokenService(RolloutService):
    """A bug in the service: status raises, and so does the look-up of a session's committed step."""

    async def get_status(self, session_id: str):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug with a secret in it")

    async def committed_step_id(self, session_id: str) -> int | None:
        raise RuntimeError("the store is down")


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_bug_is_an_internal_error_without_its_text(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes=mode)
    service = BrokenService(ToyWorld(), settings)
    with (
        serving(create_app(settings, rollout=service)) as running,
        httpx.Client(base_url=running.http_url) as http,
    ):
        sid = create(http)
        before = errors_counted("status", "internal_error")
        resp = http.get(f"{SESSIONS}/{sid}/status")
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["message"] == "internal server error" and "secret" not in resp.text
        assert error["committed_step_id"] == -1  # the look-up failed too: the error stays typed
        assert errors_counted("status", "internal_error") == before + 1
        logged = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
        assert ("ERROR", "rollout route status failed", True) in logged
        assert ("ERROR", f"looking up session {sid} for an error body failed", True) in logged


class ServiceBuildingABadModel(RolloutService):
    """A bug in the service that pydantic catches: a model built from the server's own wrong data."""

    async def get_status(self, session_id: str):  # type: ignore[no-untyped-def]
        return SessionStatusResponse.model_validate({"session_id": session_id, "status": 7})


@pytest.mark.parametrize(("mode", "code"), [("vllm-omni", 500), ("strict", "internal_error")])
def test_a_validation_error_of_the_servers_own_making_is_an_internal_error(mode: str, code: object) -> None:
    """Only the request's own validation is the client's fault (``invalid_request``); a model the
    service fails to build is a bug, answered 500 without pydantic's text (which names its fields)."""
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes=mode)
    service = ServiceBuildingABadModel(ToyWorld(), settings)
    with (
        serving(create_app(settings, rollout=service)) as running,
        httpx.Client(base_url=running.http_url) as http,
    ):
        sid = create(http)
        resp = http.get(f"{SESSIONS}/{sid}/status")
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert (error["code"], error["message"]) == (code, "internal server error")
        assert "validation" not in resp.text.lower() and "status" not in error["message"]


@pytest.mark.parametrize(("bad", "more"), [(1, ""), (5, ""), (6, " (and 1 more)")])
def test_a_refusal_names_five_errors_and_counts_the_rest(bad: int, more: str) -> None:
    joints = [1e39] * bad + [0.0] * (7 - bad)  # finite as float64, not as float32
    with server() as http:
        sid = create(http)
        resp = http.post(
            f"{SESSIONS}/{sid}/step", json=step_body(0) | {"action": {"joint_positions": joints}}
        )
        shown = [f"action.joint_positions.{i}: {NOT_FINITE}" for i in range(min(bad, 5))]
        assert resp.json()["error"]["message"] == "; ".join(shown) + more


def test_a_body_that_is_not_a_map_is_named_as_the_body() -> None:
    with server() as http:
        resp = http.post(SESSIONS, content=b"[]")
        assert resp.json()["error"]["message"] == "the body must be a JSON object or msgpack map"
        resp = http.post(SESSIONS, json={"seed": 1})
        assert resp.json()["error"]["message"] == "model: Field required"
        resp = http.post(
            f"{BATCH}/columns", json={"session_ids": ["a"], "step_ids": [0], "actions": [[0] * 8] * 2}
        )
        assert resp.json()["error"]["message"] == (
            "body: Value error, session_ids, step_ids and actions must have one entry per session"
        )


# --- reading a body: its size, its type -------------------------------------------------------------------


def padded(body: bytes, size: int) -> bytes:
    """``body`` (a JSON object) padded with spaces to exactly ``size`` bytes."""
    return body[:-1] + b" " * (size - len(body)) + body[-1:]


def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_refused() -> None:
    create_body = b'{"model": "toy", "seed": 1}'
    with server(max_body_bytes=1024) as http:
        assert http.post(SESSIONS, content=padded(create_body, 1024)).status_code == 200
        resp = http.post(SESSIONS, content=padded(create_body, 1025))
        assert resp.status_code == 413
        assert resp.json()["error"]["message"] == "the body exceeds the limit of 1024 bytes"
        chunked = http.post(SESSIONS, content=iter([padded(create_body, 1024)]))  # no declared length
        assert chunked.status_code == 200, chunked.text
        resp = http.post(SESSIONS, content=iter([padded(create_body, 1025)]))
        assert resp.status_code == 413
        message = resp.json()["error"]["message"]
        head, _, tail = message.partition("+ bytes exceeds the limit of ")
        assert head.startswith("the body of ") and 1024 < int(head.removeprefix("the body of ")) <= 1025
        assert tail == "1024"


def test_the_frame_limit_bounds_a_body_when_it_is_the_smaller() -> None:
    create_body = b'{"model": "toy", "seed": 1}'
    with server(limits=WireLimits(max_frame_bytes=512), max_body_bytes=1024) as http:
        assert http.post(SESSIONS, content=padded(create_body, 512)).status_code == 200
        resp = http.post(SESSIONS, content=padded(create_body, 513))
        assert resp.json()["error"]["message"] == "the body exceeds the limit of 512 bytes"


@pytest.mark.parametrize(
    "media",
    [
        None,
        "",
        "application/json",
        "Application/JSON; charset=utf-8",
        "text/plain",
        "application/vnd.rollout+json",
    ],
)
def test_a_json_body_is_read_under_every_json_type(media: str | None) -> None:
    with server() as http:
        request = http.build_request("POST", SESSIONS, content=b'{"model": "toy", "seed": 3}')
        if media is None:
            assert "content-type" not in request.headers  # httpx names no type for raw bytes
        else:
            request.headers["content-type"] = media
        resp = http.send(request)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/json"


@pytest.mark.parametrize("media", [MSGPACK, "application/x-msgpack", "Application/MsgPack; v=1"])
def test_a_msgpack_body_is_read_under_either_type(media: str) -> None:
    with server() as http:
        resp = http.post(
            SESSIONS, content=packb({"model": "toy", "seed": 3}), headers={"content-type": media}
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == MSGPACK  # no Accept but */*: the answer follows the body


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_another_media_type_is_refused_by_name(mode: str) -> None:
    with server(rollout_status_codes=mode) as http:
        resp = http.post(SESSIONS, content=b"<model/>", headers={"content-type": "Text/XML; charset=utf-8"})
        assert resp.status_code == (400 if mode == "vllm-omni" else 415)
        error = resp.json()["error"]
        assert error["message"] == "send application/json or application/msgpack, not 'text/xml'"


def test_a_json_body_is_budgeted_by_its_separators() -> None:
    """``{"model": "toy", "seed": 1, "pad": [{}]}``: 2 commas, 3 colons, 1 bracket, 2 braces, plus
    one: 9 values. 9 are allowed at 9, refused at 8."""
    body = b'{"model": "toy", "seed": 1, "pad": [{}]}'
    with server(max_json_values=9) as http:
        assert http.post(SESSIONS, content=body).status_code == 200
    with server(max_json_values=8) as http:
        resp = http.post(SESSIONS, content=body)
        assert resp.status_code == 413
        assert resp.json()["error"]["message"] == (
            "a JSON body may hold at most 8 values; send tensors as application/msgpack"
        )


def test_json_nested_past_the_parsers_depth_is_invalid_not_a_bug() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with server(max_json_values=1_000_000) as http:
        resp = http.post(SESSIONS, content=b'{"model": ' + deep + b"}")
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == "the body is not valid JSON"


def test_a_msgpack_body_is_checked_against_the_servers_object_budget() -> None:
    headers = {"content-type": MSGPACK, "accept": "application/json"}
    with server(limits=WireLimits(max_objects=10)) as http:
        resp = http.post(SESSIONS, content=packb({"model": "toy", "pad": list(range(50))}), headers=headers)
        assert resp.status_code == 413
        assert resp.json()["error"]["message"].startswith(
            "msgpack body rejected (too_many_objects): more than 10"
        )
        resp = http.post(SESSIONS, content=b"\xc1", headers=headers)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == (
            "msgpack body rejected (malformed_frame): not a valid msgpack frame (FormatError)"
        )


# --- which codec answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "body_type", "answer_type"),
    [
        (None, MSGPACK, MSGPACK),  # no Accept: the answer follows the body
        (None, "application/x-msgpack", MSGPACK),
        (None, "application/json", "application/json"),
        ("*/*", MSGPACK, MSGPACK),
        ("text/html, */*;q=0.1", MSGPACK, MSGPACK),
        ("application/json", MSGPACK, "application/json"),  # Accept wins
        ("Application/X-MsgPack", "application/json", MSGPACK),
        ("application/msgpack", "application/json", MSGPACK),
        ("text/html", "application/json", "application/json"),
    ],
)
def test_the_answer_takes_the_codec_accept_asks_for_else_the_bodys(
    accept: str | None, body_type: str, answer_type: str
) -> None:
    content = packb({"model": "toy"}) if "msgpack" in body_type else b'{"model": "toy"}'
    with server() as http:
        request = http.build_request("POST", SESSIONS, content=content, headers={"content-type": body_type})
        if accept is None:
            del request.headers["accept"]
        else:
            request.headers["accept"] = accept
        resp = http.send(request)
        assert resp.status_code == 200
        assert resp.headers["content-type"] == answer_type
        answer = unpackb(resp.content) if answer_type == MSGPACK else resp.json()
        assert answer["committed_step_id"] == -1


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_msgpack_errors_keep_their_status(mode: str) -> None:
    headers = {"accept": MSGPACK}
    with server(rollout_status_codes=mode) as http:
        step = http.post(
            f"{SESSIONS}/nobody/step",
            content=packb(step_body(4)),
            headers=headers | {"content-type": MSGPACK},
        )
        assert (step.status_code, step.headers["content-type"]) == (404, MSGPACK)
        answer = unpackb(step.content)
        assert answer["error"]["code"] == "session_not_found" and answer["step_id"] == 4
        status = http.get(f"{SESSIONS}/nobody/status", headers=headers)
        assert (status.status_code, status.headers["content-type"]) == (404, MSGPACK)
        error = unpackb(status.content)["error"]
        assert error.get("reason", error["code"]) == "session_not_found"


# --- where a body is parsed, and what is counted before it is -------------------------------------------


def test_bodies_over_64_kib_or_with_a_jpeg_are_parsed_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/rollout.md: "Bodies above 64 KiB (or with a JPEG) are parsed, validated and
    fingerprinted on a worker thread; smaller ones stay on the event loop"."""
    on_loop: list[bool] = []
    decode = routes._decode

    def recording(*args: object) -> object:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return decode(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(routes, "_decode", recording)
    create_body = b'{"model": "toy", "seed": 1}'
    jpeg_named = packb({"model": "toy", "note": "jpeg"})
    assert b"\xa4jpeg" in jpeg_named
    with server() as http:
        assert http.post(SESSIONS, content=padded(create_body, 64 * 1024)).status_code == 200
        assert http.post(SESSIONS, content=padded(create_body, 64 * 1024 + 1)).status_code == 200
        assert http.post(SESSIONS, content=jpeg_named, headers={"content-type": MSGPACK}).status_code == 200
        plain = packb({"model": "toy", "note": "png"})
        assert http.post(SESSIONS, content=plain, headers={"content-type": MSGPACK}).status_code == 200
        as_json = b'{"model": "toy", "note": "\xa4jpeg"}'  # the tag's bytes, but not msgpack
        assert http.post(SESSIONS, content=as_json).status_code == 400
    assert on_loop == [True, False, False, True, True]


def test_a_big_body_is_answered_as_a_small_one() -> None:
    with server(service={"max_batch_items": 2}) as http:
        sid = create(http)
        pad = "x" * (70 * 1024)
        resp = http.post(f"{SESSIONS}/{sid}/step", json=step_body(0, extra={"pad": pad}))
        assert resp.status_code == 200, resp.text
        assert resp.json()["model_metadata"]["committed_step_id"] == 0
        items = [{"session_id": sid, **step_body(1, extra={"pad": pad})}] + [{}] * 2
        resp = http.post(BATCH, json={"items": items})
        assert resp.json()["error"]["message"] == "batch_step takes at most 2 items"
        resp = http.post(f"{SESSIONS}/{sid}/step", json=step_body(0, extra={"pad": pad}))
        assert resp.json()["error"]["code"] == "step_already_committed" and resp.json()["replayed"]


def test_a_msgpack_batch_is_counted_from_its_header_before_it_is_unpacked() -> None:
    items = [{"session_id": "x", "step_id": msgpack.Timestamp(1, 0)}] * 3  # unpacking refuses these
    headers = {"content-type": MSGPACK, "accept": "application/json"}
    with server(service={"max_batch_items": 2}) as http:
        resp = http.post(BATCH, content=msgpack.packb({"items": items}), headers=headers)
        assert resp.json()["error"]["message"] == "batch_step takes at most 2 items"
        resp = http.post(BATCH, content=msgpack.packb({"items": items[:2]}), headers=headers)
        assert "timestamp" in resp.json()["error"]["message"]
        # only batch_step is peeked: a create that opens with an "items" list is no batch
        create_body = msgpack.packb({"items": [1, 2, 3], "model": "toy"})
        assert http.post(SESSIONS, content=create_body, headers=headers).status_code == 200


# --- a body that stops arriving ---------------------------------------------------------------------------


def stalled(http: httpx.Client, path: str, sent: bytes) -> tuple[int, dict[str, str], dict]:
    """Declare 1000 bytes, send ``sent``, then nothing: what the server answers before it closes."""
    url = httpx.URL(str(http.base_url))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with socket.create_connection((url.host, url.port)) as sock:
        sock.sendall(head.encode() + sent)
        sock.settimeout(30.0)  # bounds a failure only
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    top, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_stalled_body_is_a_408_and_its_connection_is_closed(mode: str) -> None:
    with server(service={"body_timeout_s": 0.2}, rollout_status_codes=mode) as http:
        sid = create(http)
        assert http.post(f"{SESSIONS}/{sid}/step", json=step_body(0)).status_code == 200
        before = errors_counted("step", "request_timeout")
        status, headers, body = stalled(http, f"{SESSIONS}/{sid}/step", b'{"step_id": 1')
        assert (status, headers["connection"]) == (408, "close")
        assert body["error"]["code"] == "request_timeout" and body["error"]["step_id"] == -1
        assert (
            body["error"]["message"]
            == "the body did not arrive within 0.2 s (+1 s per 256 KiB): 13 bytes came"
        )
        assert body["model_metadata"]["committed_step_id"] == 0
        assert errors_counted("step", "request_timeout") == before + 1
        status, headers, body = stalled(http, f"{SESSIONS}/{sid}/reset", b"{")
        assert (status, headers["connection"]) == (408, "close")
        error = body["error"]
        assert error.get("reason", error["code"]) == "request_timeout" and error["committed_step_id"] == 0
        resp = http.post(f"{SESSIONS}/{sid}/step", json=step_body(0) | {"observation": {}})  # another print
        assert "connection" not in resp.headers or resp.headers["connection"] != "close"
        assert resp.json()["error"]["code"] == "step_already_committed"


@pytest.mark.parametrize("mode", ["vllm-omni", "strict"])
def test_a_world_that_cannot_start_is_a_500_on_create_and_reset(mode: str) -> None:
    """Only a step answers ``inference_error`` in band (vLLM-Omni mode); a create or reset is a 500."""
    with server(FailingWorld(), rollout_status_codes=mode) as http:
        resp = http.post(SESSIONS, json={"model": "toy", "seed": 13})
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error.get("reason", error["code"]) == "inference_error"
        sid = create(http)
        resp = http.post(f"{SESSIONS}/{sid}/reset", json={"seed": 13})
        assert resp.status_code == 500
        assert resp.json()["error"]["committed_step_id"] == -1


def test_each_body_reaches_the_service() -> None:
    with server() as http:
        created = http.post(SESSIONS, json={"model": "toy", "seed": 5, "session_id": "chosen"}).json()
        assert created["session_id"] == "chosen"
        other = create(http)
        reset = http.post(f"{SESSIONS}/{other}/reset", json={"seed": 5}).json()
        assert reset["observation"] == created["observation"]  # the seed was read
        fork = http.post(f"{SESSIONS}/chosen/fork", json={"session_id": "forked"}).json()
        assert (fork["session_id"], fork["forked_from"]) == ("forked", "chosen")
        step = http.post(f"{SESSIONS}/forked/step", json=step_body(0)).json()
        assert step["error"] is None and step["model_metadata"]["committed_step_id"] == 0
        assert http.get(f"{SESSIONS}/chosen/status").json()["committed_step_id"] == -1
        closed = http.post(f"{SESSIONS}/forked/close").json()
        assert closed == {"session_id": "forked", "closed": True, "committed_step_id": 0}


def test_only_a_batch_is_validated_item_by_item() -> None:
    """A step body that fails validation is refused whole, even when it carries an ``items`` list
    that would make a valid batch."""
    with server() as http:
        sid = create(http)
        body = {"step_id": "zero", "items": [{"session_id": sid, **step_body(0)}]}
        resp = http.post(f"{SESSIONS}/{sid}/step", json=body)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == (
            "step_id: Input should be a valid integer; observation: Field required; action: Field required"
        )


# --- _read's deadline and size cap, on a request whose body arrives in parts -----------------------------


class PartedRequest:
    """What ``routes._read`` reads of a request: headers, and a body in ``parts``, the client
    pausing ``pause_s`` after the first."""

    def __init__(self, parts: list[bytes], *, declared: bool, pause_s: float = 0.0) -> None:
        self.headers = {"content-type": "application/json"}
        if declared:
            self.headers["content-length"] = str(sum(map(len, parts)))
        self.parts, self.pause_s = parts, pause_s

    async def stream(self) -> AsyncIterator[bytes]:
        for i, part in enumerate(self.parts):
            if i == 1 and self.pause_s:
                await asyncio.sleep(self.pause_s)  # the client's pause (simulated), not a barrier
            yield part


async def test_a_declared_length_buys_its_time_before_the_first_byte() -> None:
    """A declared 2 MiB body may take 8 s past the deadline from the start: a pause of 0.3 s after
    its first byte is fine, though 0.05 s + 1 byte's share is long gone."""
    big = b" " * (8 * routes.BODY_MIN_RATE)
    request = PartedRequest([b" ", big, b"{}"], declared=True, pause_s=0.3)
    data, media = await routes._read(request, WireLimits(), 0.05, optional=False)  # type: ignore[arg-type]
    assert (len(data), media) == (len(big) + 3, "application/json")


async def test_a_chunked_body_is_measured_across_its_parts() -> None:
    limits = WireLimits(max_frame_bytes=1024)
    request = PartedRequest([b"{" + b" " * 599, b" " * 600, b"}"], declared=False)
    with pytest.raises(routes.RolloutError) as err:
        await routes._read(request, limits, 5.0, optional=False)  # type: ignore[arg-type]
    assert err.value.code == "payload_too_large"
    assert err.value.message == "the body of 1200+ bytes exceeds the limit of 1024"
    exact = PartedRequest([b"{" + b" " * 599, b" " * 423, b"}"], declared=False)
    data, _ = await routes._read(exact, limits, 5.0, optional=False)  # type: ignore[arg-type]
    assert len(data) == 1024


@pytest.mark.parametrize(("parts", "came"), [([b"", b"{}"], 0), ([b"{", b"}"], 1)])
async def test_a_chunked_body_pausing_after_its_first_part_runs_out_of_time(
    parts: list[bytes], came: int
) -> None:
    """A chunked body gets no allowance before its first byte, and its deadline moves on with each
    part by 1 s per 256 KiB received: one byte buys 4 us, so a 0.3 s pause after an empty or a
    one-byte first part overruns a 0.05 s deadline."""
    request = PartedRequest(parts, declared=False, pause_s=0.3)
    with pytest.raises(routes.RolloutError) as err:
        await routes._read(request, WireLimits(), 0.05, optional=False)  # type: ignore[arg-type]
    assert err.value.code == "request_timeout"
    assert err.value.message == f"the body did not arrive within 0.05 s (+1 s per 256 KiB): {came} bytes came"


async def test_a_chunked_bodys_first_part_buys_time_for_the_rest() -> None:
    """256 KiB received move a 0.5 s deadline to 1.5 s from the start: a 1 s pause then is fine
    (the deadline is not 0.5 s earlier, nor 0.5 s less the allowance)."""
    first = b"{" + b" " * (routes.BODY_MIN_RATE - 1)
    request = PartedRequest([first, b"}"], declared=False, pause_s=1.0)
    data, media = await routes._read(request, WireLimits(), 0.5, optional=False)  # type: ignore[arg-type]
    assert (len(data), media) == (routes.BODY_MIN_RATE + 1, "application/json")


@pytest.mark.parametrize(("mode", "status"), [("vllm-omni", 400), ("strict", 422)])
def test_a_body_that_is_not_a_map_is_the_clients_invalid_request(mode: str, status: int) -> None:
    """A JSON array, or a msgpack one, is the client's ``invalid_request``, whichever codec it came in."""
    with server(rollout_status_codes=mode) as http:
        for content, media in [(b"[]", "application/json"), (packb([1, 2]), MSGPACK)]:
            resp = http.post(
                SESSIONS, content=content, headers={"content-type": media, "accept": "application/json"}
            )
            assert resp.status_code == status, resp.text
            error = resp.json()["error"]
            assert error.get("reason", error["code"]) == "invalid_request"
            assert error["message"] == "the body must be a JSON object or msgpack map"
