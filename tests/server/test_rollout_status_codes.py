"""Every row of the status-code table in docs/rollout.md, provoked over real HTTP in both modes.

The table is parsed from the doc (one source of truth): each (code, route) row must have a case
here that provokes it, and the server must answer with the row's status in vLLM-Omni mode and in
strict mode, chosen by the server flag and by the per-request header.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from manual_clock import Clock

from rollserve.engine import EngineClosed
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.limits import WireLimits

DOC = Path(__file__).resolve().parents[2] / "docs" / "rollout.md"
HEADER = "X-Rollserve-Status-Codes"
LIMIT = 32 * 1024
BROKEN = 0.625  # a first joint of this makes the world's step raise
BAD_SEED = 13  # this seed makes the world's start raise
TTL = 60.0


def doc_table() -> dict[tuple[str, str], dict[str, int]]:
    """``{(code, route): {"vllm-omni": status, "strict": status}}`` from the doc's table."""
    text = DOC.read_text()
    header = "| code | routes | vLLM-Omni mode (default) | strict mode | when |"
    lines = text[text.index(header) :].splitlines()[2:]
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        codes = re.findall(r"`([a-z_]+)`", cells[0]) or ["none"]
        for code in codes:
            for route in (r.strip() for r in cells[1].split(",")):
                rows[(code, route)] = {"vllm-omni": int(cells[2]), "strict": int(cells[3])}
    return rows


class TestWorld(ToyWorld):
    """The toy world, with a step that fails on ``BROKEN`` and a start that fails on ``BAD_SEED``."""

    def initial_states(self, inits):
        outs = super().initial_states(inits)
        return [
            RuntimeError("no start") if i.seed == BAD_SEED else o for i, o in zip(inits, outs, strict=True)
        ]

    def step_batch(self, steps):
        outs = super().step_batch(steps)
        return [
            RuntimeError("device-side assert") if s.action[0] == np.float32(BROKEN) else o
            for s, o in zip(steps, outs, strict=True)
        ]


def step_body(step_id: int, a: float = 0.1) -> dict:
    return {
        "step_id": step_id,
        "observation": {},
        "action": {"joint_positions": [a] * 7, "gripper_position": 0.5},
    }


class Cases:
    """One function per (code, route) row; each returns the response that row describes."""

    def __init__(self, http: httpx.Client, service: RolloutService, clock: Clock) -> None:
        self.http, self.service, self.clock = http, service, clock
        self.counter = 0

    def sid(self) -> str:
        self.counter += 1
        return f"s{self.counter}-{np.random.default_rng().integers(1 << 40)}"

    def create(self) -> str:
        resp = self.http.post(
            "/v1/realtime/sessions", json={"model": "toy", "seed": 1, "session_id": self.sid()}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()["session_id"]

    def post(self, sid: str, verb: str, **kw) -> httpx.Response:
        return self.http.post(f"/v1/realtime/sessions/{sid}/{verb}", **kw)

    def committed(self, steps: int = 1) -> str:
        sid = self.create()
        for i in range(steps):
            assert self.post(sid, "step", json=step_body(i)).status_code == 200
        return sid

    def closed(self) -> str:
        sid = self.committed()
        assert self.post(sid, "close").status_code == 200
        return sid

    def expired(self) -> str:
        sid = self.committed()
        self.clock.now += TTL * 2
        return sid

    def table(self) -> dict[tuple[str, str], Callable[[], httpx.Response]]:
        ghost = "ghost-session"
        form = {"content": b"a=1", "headers": {"content-type": "application/x-www-form-urlencoded"}}
        huge = {"observation": {"extra": {"blob": "x" * LIMIT * 2}}}
        oversized = {"content": b"x" * LIMIT * 2, "headers": {"content-type": "application/json"}}
        return {
            ("invalid_request", "step"): lambda: self.post(
                self.create(), "step", json={"step_id": "zero", "observation": {}, "action": {}}
            ),
            ("invalid_request", "create"): lambda: self.http.post(
                "/v1/realtime/sessions", json={"model": "toy", "seed": -1}
            ),
            ("invalid_request", "reset"): lambda: self.post(self.create(), "reset", json={"seed": -1}),
            ("invalid_request", "fork"): lambda: self.post(self.create(), "fork", json={"session_id": 5}),
            ("invalid_request", "batch_step"): lambda: self.http.post(
                "/v1/realtime/batch_step", json={"items": "not a list"}
            ),
            ("invalid_request", "batch_step/columns"): lambda: self.http.post(
                "/v1/realtime/batch_step/columns", json=["not", "a", "map"]
            ),
            ("step_already_committed", "step"): lambda: self.post(
                self.committed(2), "step", json=step_body(0)
            ),
            ("step_out_of_order", "step"): lambda: self.post(self.create(), "step", json=step_body(3)),
            ("session_exists", "create"): lambda: self.http.post(
                "/v1/realtime/sessions", json={"model": "toy", "session_id": self.closed()}
            ),
            ("session_exists", "fork"): lambda: self.post(
                self.create(), "fork", json={"session_id": self.create()}
            ),
            ("session_not_found", "step"): lambda: self.post(ghost, "step", json=step_body(0)),
            ("session_not_found", "reset"): lambda: self.post(ghost, "reset"),
            ("session_not_found", "close"): lambda: self.post(ghost, "close"),
            ("session_not_found", "status"): lambda: self.http.get(f"/v1/realtime/sessions/{ghost}/status"),
            ("session_not_found", "fork"): lambda: self.post(ghost, "fork"),
            ("model_not_found", "create"): lambda: self.http.post(
                "/v1/realtime/sessions", json={"model": "dreamzero"}
            ),
            ("session_closed", "step"): lambda: self.post(self.closed(), "step", json=step_body(1)),
            ("session_closed", "reset"): lambda: self.post(self.closed(), "reset"),
            ("session_closed", "fork"): lambda: self.post(self.closed(), "fork"),
            ("session_expired", "step"): lambda: self.post(self.expired(), "step", json=step_body(1)),
            ("session_expired", "reset"): lambda: self.post(self.expired(), "reset"),
            ("session_expired", "fork"): lambda: self.post(self.expired(), "fork"),
            ("payload_too_large", "step"): lambda: self.post(
                self.create(), "step", json={**step_body(0), **huge}
            ),
            ("payload_too_large", "create"): lambda: self.http.post(
                "/v1/realtime/sessions", json={"model": "toy", "pad": "x" * LIMIT * 2}
            ),
            ("payload_too_large", "reset"): lambda: self.post(
                self.create(), "reset", json={"seed": 0, "pad": "x" * LIMIT * 2}
            ),
            ("payload_too_large", "fork"): lambda: self.post(
                self.create(), "fork", json={"session_id": "f", "pad": "x" * LIMIT * 2}
            ),
            ("payload_too_large", "close"): lambda: self.post(self.create(), "close", **oversized),
            ("payload_too_large", "status"): lambda: self.http.request(
                "GET", f"/v1/realtime/sessions/{self.create()}/status", **oversized
            ),
            ("payload_too_large", "batch_step"): lambda: self.http.post(
                "/v1/realtime/batch_step", json={"items": [], "pad": "x" * LIMIT * 2}
            ),
            ("payload_too_large", "batch_step/columns"): lambda: self.http.post(
                "/v1/realtime/batch_step/columns", json={"session_ids": [], "pad": "x" * LIMIT * 2}
            ),
            ("unsupported_media_type", "step"): lambda: self.post(self.create(), "step", **form),
            ("unsupported_media_type", "reset"): lambda: self.post(self.create(), "reset", **form),
            ("unsupported_media_type", "fork"): lambda: self.post(self.create(), "fork", **form),
            ("unsupported_media_type", "create"): lambda: self.http.post("/v1/realtime/sessions", **form),
            ("unsupported_media_type", "batch_step"): lambda: self.http.post(
                "/v1/realtime/batch_step", **form
            ),
            ("unsupported_media_type", "batch_step/columns"): lambda: self.http.post(
                "/v1/realtime/batch_step/columns", **form
            ),
            ("request_timeout", "step"): lambda: self.stalled(
                f"/v1/realtime/sessions/{self.committed()}/step"
            ),
            ("request_timeout", "create"): lambda: self.stalled("/v1/realtime/sessions"),
            ("request_timeout", "reset"): lambda: self.stalled(
                f"/v1/realtime/sessions/{self.create()}/reset"
            ),
            ("request_timeout", "close"): lambda: self.stalled(
                f"/v1/realtime/sessions/{self.create()}/close"
            ),
            ("request_timeout", "status"): lambda: self.stalled(
                f"/v1/realtime/sessions/{self.create()}/status", method="GET"
            ),
            ("request_timeout", "fork"): lambda: self.stalled(f"/v1/realtime/sessions/{self.create()}/fork"),
            ("request_timeout", "batch_step"): lambda: self.stalled("/v1/realtime/batch_step"),
            ("request_timeout", "batch_step/columns"): lambda: self.stalled(
                "/v1/realtime/batch_step/columns"
            ),
            ("inference_error", "step"): lambda: self.post(
                self.committed(), "step", json=step_body(1, BROKEN)
            ),
            ("inference_error", "create"): lambda: self.http.post(
                "/v1/realtime/sessions", json={"model": "toy", "seed": BAD_SEED}
            ),
            ("inference_error", "reset"): lambda: self.post(self.create(), "reset", json={"seed": BAD_SEED}),
            ("internal_error", "step"): lambda: self.broken(
                "step", lambda: self.post(ghost, "step", json=step_body(0))
            ),
            ("internal_error", "status"): lambda: self.broken(
                "get_status", lambda: self.http.get(f"/v1/realtime/sessions/{ghost}/status")
            ),
            ("at_capacity", "create"): lambda: self.full(
                lambda: self.http.post("/v1/realtime/sessions", json={"model": "toy"})
            ),
            ("at_capacity", "fork"): lambda: self.full(partial(self.post, self.create(), "fork")),
            ("engine_unavailable", "step"): lambda: self.stopped(
                partial(self.post, self.create(), "step", json=step_body(0))
            ),
            ("engine_unavailable", "create"): lambda: self.stopped(
                lambda: self.http.post("/v1/realtime/sessions", json={"model": "toy"})
            ),
            ("engine_unavailable", "health"): lambda: self.engine_closed(lambda: self.http.get("/health")),
            ("rollout_not_served", "create"): lambda: self.no_world(
                lambda http: http.post("/v1/realtime/sessions", json={"model": "toy"})
            ),
            ("rollout_not_served", "step"): lambda: self.no_world(
                lambda http: http.post("/v1/realtime/sessions/s1/step", json=step_body(0))
            ),
            ("rollout_not_served", "status"): lambda: self.no_world(
                lambda http: http.get("/v1/realtime/sessions/s1/status")
            ),
            ("rollout_not_served", "batch_step"): lambda: self.no_world(
                lambda http: http.post("/v1/realtime/batch_step", json={"items": []})
            ),
            ("none", "health"): lambda: self.http.get("/health"),
        }

    def no_world(self, send: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        """The request sent to a second server, with the same default mode, that serves no world."""
        settings = ServerSettings(rollout_status_codes=self.service.settings.rollout_status_codes)
        with (
            serving(create_app(settings)) as running,
            httpx.Client(base_url=running.http_url, headers=self.http.headers) as http,
        ):
            return send(http)

    def engine_closed(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        """The engine as ``close()`` leaves it, seen by the health probe; the real one is put back."""
        engine = self.service.engine
        self.service.engine = SimpleNamespace(closed=True)
        try:
            return send()
        finally:
            self.service.engine = engine

    def stalled(self, path: str, method: str = "POST") -> httpx.Response:
        """Half a body and then nothing, under a short body deadline (httpx only sends whole
        bodies, so on a raw socket); the answer, read until the server closes the connection."""
        deadline, self.service.body_timeout_s = self.service.body_timeout_s, 0.2
        mode = self.http.headers.get(HEADER)
        lines = [
            f"{method} {path} HTTP/1.1",
            "Host: x",
            "Content-Type: application/json",
            "Content-Length: 100",
        ]
        lines += [f"{HEADER}: {mode}"] if mode else []
        url = self.http.base_url
        try:
            with socket.create_connection((url.host, url.port)) as sock:
                sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b'{"step_id"')
                sock.settimeout(30.0)
                raw = b""
                while chunk := sock.recv(65536):
                    raw += chunk
        finally:
            self.service.body_timeout_s = deadline
        top, _, body = raw.partition(b"\r\n\r\n")
        status_line, *fields = top.decode("latin-1").split("\r\n")
        headers = [tuple(field.split(": ", 1)) for field in fields]
        return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)

    # -- faults injected into the live service, undone right after the request ----------------------
    def broken(self, method: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        def boom(*args, **kwargs):
            raise RuntimeError("a bug")

        setattr(self.service, method, boom)
        try:
            return send()
        finally:
            delattr(self.service, method)

    def full(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        store = self.service.store
        capacity, store.capacity = store.capacity, 0
        try:
            return send()
        finally:
            store.capacity = capacity

    def stopped(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        async def closed(calls):
            raise EngineClosed("shut down")

        self.service.engine.submit_many = closed
        try:
            return send()
        finally:
            del self.service.engine.submit_many


@pytest.fixture(scope="module", params=["vllm-omni", "strict"])
def server(request) -> Iterator[tuple[httpx.Client, RolloutService, Clock, str]]:
    clock = Clock()
    settings = ServerSettings(
        max_batch_wait_ms=0.0,
        limits=WireLimits(max_frame_bytes=LIMIT),
        rollout_idle_ttl_s=TTL,
        rollout_status_codes=request.param,
    )
    service = RolloutService(TestWorld(), settings, clock=clock)
    with (
        serving(create_app(settings, rollout=service)) as running,
        httpx.Client(base_url=running.http_url) as http,
    ):
        yield http, service, clock, request.param


def test_the_doc_table_lists_every_error_code_the_server_knows() -> None:
    from rollserve.server.rollout.status_codes import STRICT

    codes = {code for code, _ in doc_table()}
    assert codes == set(STRICT) | {"none"}


@pytest.mark.parametrize("header", [None, "vllm-omni", "strict"])
def test_every_row_of_the_doc_table_holds(server, header: str | None) -> None:
    http, service, clock, default = server
    mode = header or default
    if header:
        http.headers[HEADER] = header
    try:
        cases = Cases(http, service, clock).table()
        rows = doc_table()
        assert set(cases) == set(rows), "every row of the doc table needs a case here, and only those"
        for (code, route), statuses in rows.items():
            resp = cases[(code, route)]()
            want = statuses[mode]
            assert resp.status_code == want, (
                f"{code} on {route} in {mode} mode: {resp.status_code} {resp.text}"
            )
            assert "Traceback" not in resp.text
            check_body(resp.json(), code, route, want, mode)
    finally:
        http.headers.pop(HEADER, None)


def check_body(payload: dict, code: str, route: str, status: int, mode: str) -> None:
    if code == "none":
        assert payload == {"status": "healthy"}
        return
    error = payload["error"]
    if route == "step" and code != "rollout_not_served":  # the full step body in both modes
        assert error["code"] == code
        assert error["committed_step_id"] == payload["model_metadata"]["committed_step_id"]
        return
    if mode == "strict":
        assert error["code"] == code and "committed_step_id" in error
        assert "detail" not in payload
    else:  # vLLM's error body, FastAPI's detail, rollserve's fields inside
        assert error["code"] == status and error["reason"] == code
        assert error["message"] == payload["detail"] and error["param"] is None
        assert error["type"] and "committed_step_id" in error


def test_a_replayed_duplicate_keeps_everything_rollserve_adds_in_the_body(server) -> None:
    http, _, _, default = server
    sid = f"dup-{default}"
    http.post("/v1/realtime/sessions", json={"model": "toy", "seed": 2, "session_id": sid})
    first = http.post(f"/v1/realtime/sessions/{sid}/step", json=step_body(0))
    again = http.post(f"/v1/realtime/sessions/{sid}/step", json=step_body(0))
    assert first.status_code == 200
    assert again.status_code == {"strict": 409}.get(default, 400)
    body = again.json()
    assert body["replayed"] is True and body["error"]["code"] == "step_already_committed"
    assert body["next_observation"] == first.json()["next_observation"]
    assert body["model_metadata"]["committed_step_id"] == 0


def test_committed_step_id_is_on_every_response(server) -> None:
    http, _, _, _ = server
    sid = f"every-{np.random.default_rng().integers(1 << 40)}"
    created = http.post("/v1/realtime/sessions", json={"model": "toy", "session_id": sid}).json()
    stepped = http.post(f"/v1/realtime/sessions/{sid}/step", json=step_body(0)).json()
    status = http.get(f"/v1/realtime/sessions/{sid}/status").json()
    closed = http.post(f"/v1/realtime/sessions/{sid}/close").json()
    assert [created["committed_step_id"], stepped["model_metadata"]["committed_step_id"]] == [-1, 0]
    assert [status["committed_step_id"], closed["committed_step_id"]] == [0, 0]
