"""Hostile-client soak: every wire surface under a stream of bad input while healthy clients work.

Starts ``rollserve serve --policy P --world W --api-key K`` (127.0.0.1, a free port) as a user would,
then drives, each from its own process so the attackers' CPU never sits in the healthy clients'
interpreter:

* the session websocket (``/v1/policy/ws``), the openpi websocket (``/``) and the REST rollouts,
  each with ``--per-surface`` hostile inputs drawn in turn from every class issue 8 lists (garbage,
  nested-map and value floods, msgpack timestamps and extension types, JPEG bombs inside and outside
  ``images``, 17 images, huge and bool fields, NaN/inf/1e308 numbers, 10,000-item batches, bytes
  keys, oversized messages cut off while streaming, long client strings, ...);
* a few connection-level attackers for the whole run: half-sent HTTP headers (slowloris), each
  opened again as soon as the server's header deadline closes it.

The attackers start in their own processes and build their inputs first; all of them, and the
healthy clients' attack window, then begin at one start line. They send prebuilt bytes over plain
sockets (h11 for HTTP, websockets' sans-I/O protocol for the websockets), so the CPU they take from
the two cores the healthy clients share is little beside the server's: httpx and websockets' sync
client spent 2.1 and ~0.6 ms of it per input (the REST one twice what the server spent refusing it),
these 0.6-0.7 and ~0.4 ms. Each surface's attacker is
closed-loop (send, wait for the answer, send the next) on
``--attack-connections`` connections at once. The server answers a connection that keeps sending
refused input more slowly each time (``--refusal-delay-ms``, up to 100 ms by default), so one
connection gets at most about 10 refusals a second; the attack uses several so the full run still
ends in minutes, and the JSON line reports the input rate the attackers achieved
(``attack_inputs_per_s``, and per surface) next to the p99s, plus the CPU the server and the
attackers spent (on one machine the attackers' own CPU competes with the healthy clients too;
``--attacker-nice 10`` runs the attacker processes at a lower priority, closer to attackers on other
machines: the input rate and the server's CPU per input are reported as before, to compare).

Meanwhile one healthy robot (session protocol, one request every ``--interval-ms``) and one healthy
trainer (rollout steps at the same pace) time every round trip, in interleaved rounds: an idle window
(``--idle-seconds``), then attack windows of ``--attack-window-s`` with the attack paused for
``--pause-s`` between them (the attackers park at a gate; an idle window starts only once every input
sent was answered and the slowloris sockets are closed, and its first ``--settle-s`` are left out),
and a last idle window once the attack is over (``--recovery-seconds``: the server must be back to its
idle p99). A load change on the shared machine then hits the idle and the attack samples alike (one
60 s idle baseline before a 15 minute attack moved the ratio by more than a round of fixes). The one
JSON line printed at the end: ``crashes`` (server exits, ``internal`` errors, healthy requests that
failed), ``traceback_leaks`` (replies quoting code), RSS over the idle baseline (peak and at the end)
against ``rss_bound_mb``, and each healthy client's p99 under attack against idle: ``ratio``, every
attack window's requests against every idle window's, and ``rounds``, each attack window against the
idle windows on either side of it (median, min, max). Bounded in count and attack time
(``--max-seconds``); 127.0.0.1 only.

``--control`` adds a second, identical server (a decoy) and a second, identical set of attackers
aimed at it: their "control" windows take turns with the attack windows (attack, idle, control, idle,
...). In a control window the machine carries the same load (the decoy does the work the attack asks
for, the attackers spend their CPU) but the healthy clients' server serves no hostile input, so the
healthy p99 against idle there (``*_p99_ratio_control``) is what the shared cores alone cost the
healthy clients, measured in the same run as the attack's ratio.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import msgpack
import numpy as np
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_description, percentile

from rollserve.client import PolicyClient
from rollserve.client.rollout_client import RolloutClient
from rollserve.wire import MsgHeader, ObservationMsg, SessionOpen, encode_message, packb
from rollserve.wire.images import IMAGE_KEY

API_KEY = "soak-key"
AUTH = {"Authorization": f"Api-Key {API_KEY}"}
READY = re.compile(r"rollserve serving on http://127\.0\.0\.1:(\d+)")
LEAK_MARKERS = (b"Traceback", b'File "', b"site-packages")
STATE_DIM = 6  # simple_policies:chunk_policy
FRAME_MB = 8  # the server runs with --max-frame-mb and --max-body-mb at this


# -- hostile inputs ----------------------------------------------------------------------------------
def _jpeg(side: int) -> dict[bytes, Any]:
    import simplejpeg

    data = simplejpeg.encode_jpeg(np.zeros((side, side, 3), np.uint8), quality=10, colorspace="RGB")
    return {IMAGE_KEY: True, b"format": "jpeg", b"data": data}


def _empty_maps(count: int) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def _obs(seq: int = 1, **fields: Any) -> bytes:
    fields.setdefault("state", np.zeros(STATE_DIM, np.float32))
    return encode_message(ObservationMsg(header=MsgHeader(seq_id=seq), **fields))


def session_inputs() -> list[tuple[str, Any, int]]:
    """(class, frame, weight) for the session protocol; heavy classes get a small weight."""
    bomb = _jpeg(4096)
    kind = {"type": "observation"}
    zero = np.zeros(STATE_DIM, np.float32)
    return [
        ("garbage", b"\xc1\xc1 not msgpack", 20),
        ("text frame", "hello", 10),
        ("unknown type", packb({"type": "teleport"}), 10),
        ("timestamp", msgpack.packb({**kind, "task": msgpack.Timestamp(1, 0)}), 10),
        ("ext type", msgpack.packb({**kind, "task": msgpack.ExtType(5, b"x")}), 10),
        ("bool delay", packb({**kind, "inference_delay_steps": True}), 10),
        ("nan state", _obs(state=np.full(STATE_DIM, np.nan, np.float32)), 20),
        ("inf prefix", _obs(prefix_model=np.full((4, STATE_DIM), np.inf, np.float32)), 10),
        ("3e38 state", _obs(state=zero + np.float32(3e38)), 10),
        ("delay 2^62", _obs(inference_delay_steps=2**62), 10),
        ("1e5-row prefix", _obs(prefix_model=np.zeros((100_000, STATE_DIM), np.float32)), 2),
        ("long uuid", packb({"type": "session_open", "client_uuid": "u" * 1_000_000}), 2),
        ("long task", packb({**kind, "task": "t" * 100_000}), 5),
        ("empty-map flood 1 MB", _empty_maps(1_000_000), 1),
        ("value flood", packb({**kind, "task": [0] * 60_000}), 2),
        ("17 images", packb({**kind, "images": {f"c{i}": _jpeg(256) for i in range(17)}}), 2),
        ("jpeg bombs in images", packb({**kind, "images": {f"c{i}": bomb for i in range(3)}}), 1),
        ("jpeg bombs elsewhere", packb({**kind, "task": {f"c{i}": bomb for i in range(8)}}), 1),
        ("oversized message", b"\0" * (FRAME_MB * 1024 * 1024 + 1), 1),
    ]


def openpi_inputs() -> list[tuple[str, Any, int]]:
    def frame(**obs: Any) -> bytes:
        return packb(obs)

    zero = np.zeros(STATE_DIM, np.float32)
    return [
        ("garbage", b"\xc1 garbage", 20),
        ("text frame", "text", 10),
        ("no layout", frame(nothing=1), 10),
        ("nan state", frame(state=np.full(STATE_DIM, np.nan)), 20),
        ("1e308 state", frame(state=np.full(STATE_DIM, 1e308)), 20),
        ("inf state", frame(state=np.full(STATE_DIM, np.inf, np.float32)), 10),
        ("wrong dim", frame(state=np.zeros(3, np.float32)), 10),
        ("timestamp", msgpack.packb({"state": msgpack.Timestamp(1, 0)}), 10),
        ("long prompt", frame(state=zero, prompt="p" * 100_000), 5),
        ("bad image", frame(state=zero, images={"c": np.zeros((4, 4), np.uint8)}), 5),
        ("empty-map flood 1 MB", _empty_maps(1_000_000), 1),
        ("jpeg bombs", frame(state=zero, images={"c": _jpeg(4096)}), 1),
        ("oversized message", b"\0" * (FRAME_MB * 1024 * 1024 + 1), 1),
    ]


def rest_inputs() -> list[tuple[str, Any, int]]:
    """(class, (path, content, content type), weight); ``{sid}`` is the attacker's session."""

    def step(step_id: Any = 0, joints: Any = None, **observation: Any) -> dict[str, Any]:
        action = {} if joints is None else {"joint_positions": joints, "gripper_position": 0.5}
        return {"step_id": step_id, "observation": observation, "action": action}

    def as_json(body: Any) -> bytes:
        return json.dumps(body).encode()

    js, mp_ = "application/json", "application/msgpack"
    path = "/v1/realtime/sessions/{sid}/step"
    bomb = _jpeg(4096)
    ok = [0.1] * 7
    many = [{"session_id": "x", "step_id": 0, "observation": {}, "action": {}}] * 10_000
    inf_joints = {
        "observation/joint_position": np.full(7, np.inf),
        "observation/gripper_position": np.zeros(1),
    }
    nan_json = b'{"step_id":0,"observation":{},"action":{"joint_positions":[NaN,0,0,0,0,0,0]}}'
    stamp = msgpack.packb({**step(0, ok), "use_session_context": msgpack.Timestamp(1, 0)})
    flood = as_json(step(0, extra={"embodiment_name": [0] * 200_000}))
    bombs = packb(step(0, ok, images={f"c{i}": bomb for i in range(3)}))
    bomb_extra = packb(step(0, ok, extra={"embodiment_name": {"a": bomb}}))
    bytes_key = packb(step(0, ok, extra={"embodiment_name": {b"k": 1}}))
    columns = "/v1/realtime/batch_step/columns"
    bad_rows = {"session_ids": ["x", "y"], "step_ids": [0, 0], "actions": [[float("nan")] * 8, [True] * 8]}
    long_ids = packb(
        {"session_ids": ["x"], "step_ids": [0] * 100_000, "actions": np.zeros((1, 8), np.float32)}
    )
    return [
        ("malformed json", (path, b'{"step_id": ', js), 20),
        ("bool step_id", (path, as_json(step(True, ok)), js), 10),
        ("NaN joints", (path, nan_json, js), 10),
        ("1e308 action", (path, as_json(step(0, [1e308] * 7)), js), 10),
        ("inf extra joints", (path, packb(step(0, extra=inf_joints)), mp_), 10),
        ("timestamp", (path, stamp, mp_), 10),
        ("bytes key", (path, bytes_key, mp_), 10),
        ("wrong media", (path, b"step_id=0", "application/x-www-form-urlencoded"), 5),
        ("long state", (path, as_json(step(0, state=[0.0] * 5000)), js), 5),
        ("unknown session", ("/v1/realtime/sessions/nope/step", as_json(step(0, ok)), js), 10),
        ("10k-item batch", ("/v1/realtime/batch_step", packb({"items": many}), mp_), 1),
        ("columns: NaN and bool rows", (columns, as_json(bad_rows), js), 5),
        ("columns: 100k step ids", (columns, long_ids, mp_), 1),
        ("json value flood", (path, flood, js), 1),
        ("empty-map flood", (path, _empty_maps(2_000_000), mp_), 1),
        ("jpeg bombs in images", (path, bombs, mp_), 1),
        ("jpeg bombs in extra", (path, bomb_extra, mp_), 1),
        ("oversized body", (path, b"{" + b" " * (FRAME_MB * 1024 * 1024 + 10), js), 1),
    ]


def _schedule(inputs: list[tuple[str, Any, int]], count: int) -> Iterator[tuple[str, Any]]:
    """``count`` inputs, every class in turn by weight (so short runs still see every class)."""
    wheel = [(name, payload) for name, payload, weight in inputs for _ in range(weight)]
    order = sorted(range(len(wheel)), key=lambda i: (i * 7919) % len(wheel))  # spread heavy ones
    for n in range(count):
        yield wheel[order[n % len(wheel)]]


# -- attackers (separate processes) -----------------------------------------------------------------------
def _leaks(reply: Any) -> bool:
    data = reply.encode() if isinstance(reply, str) else bytes(reply or b"")
    return any(marker in data for marker in LEAK_MARKERS)


def _ws_attack(
    surface: str,
    url: str,
    inputs: list[tuple[str, Any, int]],
    count: int,
    opening: Any,
    out: Any,
    connections: int = 1,
) -> None:
    stats: dict[str, Any] = {
        "surface": surface,
        "connections": connections,
        "sent": 0,
        "leaks": 0,
        "internal": 0,
        "closed_1009": 0,
        "reconnects": 0,
        "classes": {},
    }
    _in_threads(
        stats,
        connections,
        lambda share, part: _ws_connection(url, inputs, count, share, connections, opening, part),
    )
    out.put(stats)


def _in_threads(stats: dict[str, Any], connections: int, work: Any) -> None:
    """Run ``work(share, part)`` for shares 0..connections-1, each on its own thread (its own
    connection) counting into its own ``part``; then add the parts' counts into ``stats``."""
    started = time.monotonic()
    parts: list[dict[str, Any]] = [{"classes": {}, "statuses": {}} for _ in range(connections)]
    threads = [threading.Thread(target=work, args=(i, parts[i]), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                into = stats.setdefault(key, {})
                for name, n in value.items():
                    into[name] = into.get(name, 0) + n
            else:
                stats[key] = stats.get(key, 0) + value
    if not stats.get("statuses"):
        stats.pop("statuses", None)
    stats["seconds"] = round(time.monotonic() - started, 1)
    stats["inputs_per_s"] = round(stats["sent"] / max(stats["seconds"], 1e-9), 1)
    stats["cpu_s"] = round(time.process_time(), 1)  # this attacker process's own CPU, all threads
    stats["nice"] = os.nice(0)  # the priority it ran at (--attacker-nice)


class Gate:
    """The soak's hand on its attacker processes, for interleaved rounds: ``go`` is set during attack
    windows and cleared in the pauses between them, ``halt`` ends the attack, and ``in_flight`` counts
    inputs sent and not yet answered, so an idle window starts only once nothing hostile is left in
    the server."""

    def __init__(self, context: Any) -> None:
        self.go, self.halt, self.in_flight = context.Event(), context.Event(), context.Value("i", 0)

    def enter(self) -> bool:
        """Wait for an attack window and count one input in flight; False once the attack is over.
        Counted before ``go`` is read, so a pause that sees nothing in flight sees everything sent."""
        while not self.halt.is_set():
            self._add(1)
            if self.go.is_set():
                return True
            self._add(-1)
            self.go.wait(0.5)
        return False

    def leave(self) -> None:
        self._add(-1)

    def idle(self) -> bool:
        return self.in_flight.value == 0

    def _add(self, n: int) -> None:
        with self.in_flight.get_lock():
            self.in_flight.value += n


_GATE: list[Gate | None] = [None]  # set in each attacker process; None: always sending


def _at_start_line(start: Any) -> None:
    """Wait until every attacker has started and built its inputs (``start``: a barrier shared with
    the soak), so all of them, and the healthy clients' attack window, begin together."""
    if start is not None:
        start.wait()


def _my_share(
    inputs: list[tuple[str, Any, int]], count: int, share: int, of: int
) -> Iterator[tuple[str, Any]]:
    """Connection ``share`` of ``of`` sends every ``of``-th input of the one schedule, during attack
    windows only, until the attack is halted."""
    gate = _GATE[0]
    for n, item in enumerate(_schedule(inputs, count)):
        if n % of != share:
            continue
        if gate is None:
            yield item
            continue
        if not gate.enter():
            return
        try:
            yield item  # the caller sends it and reads the answer before asking for the next
        finally:
            gate.leave()


class RawWebsocket:
    """A websocket client for the attackers: websockets' own sans-I/O protocol over a blocking socket,
    all in the calling thread. websockets' sync client hands every message to and from a reader
    thread of its own, 12 connections (24 threads) per attacker process. The frames on the wire are
    the same; ``send``, ``recv`` and ``close`` are the sync client's, as the attack uses them."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        uri = parse_uri(url)
        self.protocol = ClientProtocol(uri, max_size=None)
        self.events: collections.deque[Any] = collections.deque()
        self.sock = socket.create_connection((uri.host, uri.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = self.protocol.connect()
        request.headers.update(AUTH)
        self.protocol.send_request(request)
        self._flush()
        self.opened = False  # the handshake's response came
        while self.protocol.handshake_exc is None and not self.opened:
            self._receive()
        if self.protocol.handshake_exc is not None:
            self.close()
            raise self.protocol.handshake_exc

    def send(self, message: bytes | str) -> None:
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        else:
            self.protocol.send_binary(message)
        self._flush()

    def recv(self, timeout: float) -> bytes | str:
        """The next whole message; ``ConnectionClosed`` (with the server's close code) once closed."""
        self.sock.settimeout(timeout)
        parts: list[bytes] = []
        text = False
        while True:
            while self.events:
                frame = self.events.popleft()
                if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                    text = text or frame.opcode is Opcode.TEXT
                    parts.append(frame.data)
                    if frame.fin:
                        return b"".join(parts).decode() if text else b"".join(parts)
            if self.protocol.state is State.CLOSED:  # after a close frame, once the server hung up
                raise self.protocol.close_exc
            self._receive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        for event in self.protocol.events_received():
            if hasattr(event, "opcode"):  # frames; the handshake's response is checked in __init__
                self.events.append(event)
            else:
                self.opened = True
        self._flush()  # pongs and the closing handshake's answer

    def _flush(self) -> None:
        for chunk in self.protocol.data_to_send():
            if chunk:
                self.sock.sendall(chunk)
            else:
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_WR)


def _ws_connection(
    url: str, inputs: list[tuple[str, Any, int]], count: int, share: int, of: int, opening: Any, stats: Any
) -> None:
    """One closed-loop attacker connection: send, wait for the answer, send the next."""
    stats.update(sent=0, leaks=0, internal=0, closed_1009=0, reconnects=0)
    ws = None
    for name, frame in _my_share(inputs, count, share, of):
        stats["classes"][name] = stats["classes"].get(name, 0) + 1
        counted = False  # an input sent again on a reopened connection counts once
        for _ in range(2):  # a refused connection (1009, the idle deadline) is reopened once
            try:
                if ws is None:
                    ws = RawWebsocket(url, timeout_s=30)
                    first = opening(ws)
                    if _leaks(first):
                        stats["leaks"] += 1
                ws.send(frame)
                stats["sent"] += not counted
                counted = True
                reply = ws.recv(timeout=60)
                stats["leaks"] += _leaks(reply)
                stats["internal"] += b"internal server error" in (
                    reply.encode() if isinstance(reply, str) else reply
                )
                break
            except (ConnectionClosed, InvalidHandshake, TimeoutError, OSError) as exc:
                rcvd = getattr(exc, "rcvd", None)
                if rcvd is not None and rcvd.code == 1009:
                    stats["closed_1009"] += 1
                    ws = None
                    break  # the expected answer to an oversized message
                stats["reconnects"] += 1
                with contextlib.suppress(Exception):
                    ws.close()  # type: ignore[union-attr]
                ws = None
    with contextlib.suppress(Exception):
        ws.close()  # type: ignore[union-attr]


def _open_session(ws: Any) -> Any:
    ws.send(encode_message(SessionOpen(state_dim=STATE_DIM)))
    return ws.recv(timeout=30)


def _openpi_metadata(ws: Any) -> Any:
    return ws.recv(timeout=30)


def attack_session(
    base_ws: str, count: int, out: Any, connections: int = 1, gate: Gate | None = None, start: Any = None
) -> None:
    _GATE[0] = gate
    url, inputs = f"{base_ws}/v1/policy/ws", session_inputs()
    _at_start_line(start)
    _ws_attack("session_ws", url, inputs, count, _open_session, out, connections)


def attack_openpi(
    base_ws: str, count: int, out: Any, connections: int = 1, gate: Gate | None = None, start: Any = None
) -> None:
    _GATE[0] = gate
    inputs = openpi_inputs()
    _at_start_line(start)
    _ws_attack("openpi_ws", f"{base_ws}/", inputs, count, _openpi_metadata, out, connections)


class RawPost:
    """One hostile REST input as h11 events built once per connection: the request head and body."""

    def __init__(self, target: str, media: str, body: bytes) -> None:
        headers = [("Host", "127.0.0.1"), *AUTH.items(), ("Content-Type", media)]
        self.head = h11.Request(
            method="POST", target=target, headers=[*headers, ("Content-Length", str(len(body)))]
        )
        self.body = h11.Data(data=body)


class RawHttp:
    """A keep-alive HTTP/1.1 connection for the REST attackers: each input is sent as prebuilt h11
    events and its answer read with h11, over a plain socket. httpx spent ~2 ms of the attacker's CPU
    per input (its request and response objects, on 12 threads of one process): more than the server
    spent refusing it, taken from the healthy clients on the same two cores, where an attacker on
    another machine takes none. The server sees the same bytes either way."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.conn = h11.Connection(h11.CLIENT)
        self.connects = 0

    def exchange(self, post: RawPost) -> tuple[int, bytes]:
        """Send ``post`` and read its whole answer: (status, body). A kept-alive connection that
        fails is tried once more on a new one, as httpx does: the server closes connections idle
        for its keep-alive timeout (5 s), and the soak pauses its attack for longer between windows.
        A connection the server will close after this answer is opened again for the next input."""
        reused = self.sock is not None and self.conn.our_state is h11.IDLE
        try:
            return self._exchange(post)
        except (OSError, h11.ProtocolError):
            self.close()
            if not reused:
                raise
        return self._exchange(post)

    def _exchange(self, post: RawPost) -> tuple[int, bytes]:
        if self.sock is None or self.conn.our_state is not h11.IDLE:
            self._connect()
        assert self.sock is not None
        chunks = [self.conn.send(post.head), *self.conn.send_with_data_passthrough(post.body)]
        chunks.append(self.conn.send(h11.EndOfMessage()))
        if len(post.body.data) < 65536:
            self.sock.sendall(b"".join(chunks))  # one segment: nothing waits on Nagle
        else:
            for chunk in chunks:
                self.sock.sendall(chunk)
        status, parts = 0, []
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection before answering")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        else:
            self.close()
        return status, b"".join(parts)

    def _connect(self) -> None:
        self.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = h11.Connection(h11.CLIENT)
        self.connects += 1

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock = None


def attack_rest(
    base_http: str,
    count: int,
    model: str,
    out: Any,
    connections: int = 1,
    gate: Gate | None = None,
    start: Any = None,
) -> None:
    _GATE[0] = gate
    stats: dict[str, Any] = {
        "surface": "rest",
        "connections": connections,
        "sent": 0,
        "leaks": 0,
        "internal": 0,
        "statuses": {},
        "classes": {},
    }
    inputs = rest_inputs()
    _at_start_line(start)

    port = int(base_http.rsplit(":", 1)[1])
    inputs_by_class = [(name, payload) for name, payload, _ in inputs]

    def connection(share: int, stats: dict[str, Any]) -> None:
        stats.update(sent=0, leaks=0, internal=0, reconnects=0)
        with httpx.Client(base_url=base_http, headers=AUTH, timeout=60.0) as http:
            sid = http.post("/v1/realtime/sessions", json={"model": model, "seed": 0}).json()["session_id"]
        requests = {
            name: RawPost(path.format(sid=sid), media, content)
            for name, (path, content, media) in inputs_by_class
        }
        http_conn = RawHttp(port)
        try:
            for name, _ in _my_share(inputs, count, share, connections):
                stats["classes"][name] = stats["classes"].get(name, 0) + 1
                try:
                    status, body = http_conn.exchange(requests[name])
                except (OSError, h11.ProtocolError):
                    stats["internal"] += 1
                    http_conn.close()
                    continue
                stats["sent"] += 1
                key = str(status)
                stats["statuses"][key] = stats["statuses"].get(key, 0) + 1
                stats["leaks"] += _leaks(body)
                stats["internal"] += status >= 500 or b"internal_error" in body
        finally:
            stats["reconnects"] = http_conn.connects - 1
            http_conn.close()

    _in_threads(stats, connections, connection)
    out.put(stats)


# -- connection-level attackers (threads: they only hold sockets) ----------------------------------
SLOWLORIS_HEADER = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "


def _half_header(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(SLOWLORIS_HEADER)
    return sock


def hold_slowloris(
    port: int,
    count: int,
    stop: Any,
    pause: Any,
    parked: Any,
    ramp_s: float = 2.0,
) -> dict[str, int]:
    """``count`` connections holding half a header through every attack window: each one the server
    closes (its header deadline) is opened again at once, as a slowloris attacker does. While
    ``pause`` is set (the idle windows) all of them are closed from this side and ``parked`` is set;
    a window opens them over ``ramp_s`` (the server's header deadline), as spread as the deadlines
    keep them in a continuous attack (all at once, every window, would add a burst the continuous
    attack has only at its start). Returns how many were opened, how many of them the server closed
    and how many the pauses closed (those still open at the end are checked)."""
    socks: list[socket.socket] = []
    opened = closed = paused_closed = 0
    while not stop.wait(0.1):
        if pause.is_set():
            for sock in socks:
                sock.close()
            paused_closed, socks = paused_closed + len(socks), []
            parked.set()
            continue
        parked.clear()
        if len(socks) < count:
            more = min(count - len(socks), math.ceil(count * 0.1 / max(ramp_s, 0.1)))  # per 0.1 s tick
            socks += [_half_header(port) for _ in range(more)]
            opened += more
        readable, _, _ = select.select(socks, [], [], 0)
        for sock in readable:  # the server's close (or anything else it sent) ends this one
            with contextlib.suppress(OSError):
                sock.recv(4096)
            sock.close()
            closed += 1
            socks[socks.index(sock)] = _half_header(port)
            opened += 1
    for sock in socks:
        sock.settimeout(0.5)
        with contextlib.suppress(TimeoutError, OSError):
            closed += sock.recv(1) == b""
        sock.close()
    return {
        "slowloris": count,
        "slowloris_opened": opened,
        "slowloris_closed_by_server": closed,
        "slowloris_closed_at_pauses": paused_closed,
    }


def slowloris_process(out: Any, *args: Any) -> None:
    """:func:`hold_slowloris` in a process of its own (its events the soak's), so that reopening ~100
    sockets a second and polling 200 never takes the healthy clients' interpreter (its GIL)."""
    out.put(hold_slowloris(*args))


# -- healthy clients ------------------------------------------------------------------------------------
Sample = tuple[float, float]  # (when the request started, time.perf_counter(); its round trip in ms)


class Healthy:
    """One robot and one trainer, each on its own thread, timing every round trip."""

    def __init__(self, port: int, model: str, interval_s: float) -> None:
        self.port, self.model, self.interval_s = port, model, interval_s
        self.robot_ms: list[Sample] = []
        self.trainer_ms: list[Sample] = []
        self.failures = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def run_for(self, seconds: float) -> tuple[list[Sample], list[Sample]]:
        self.start()
        time.sleep(seconds)
        return self.stop()

    def start(self) -> None:
        self.robot_ms, self.trainer_ms = [], []
        self._stop.clear()
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._robot, self._trainer)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> tuple[list[Sample], list[Sample]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        return list(self.robot_ms), list(self.trainer_ms)

    def _robot(self) -> None:
        state = np.linspace(-1, 1, STATE_DIM, dtype=np.float32)
        with PolicyClient(f"ws://127.0.0.1:{self.port}/v1/policy/ws", api_key=API_KEY) as client:
            client.open_session(state_dim=STATE_DIM)
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    client.predict(state)
                    self.robot_ms.append((started, (time.perf_counter() - started) * 1000.0))
                except Exception:
                    self.failures += 1
                    client.open_session(state_dim=STATE_DIM)
                self._stop.wait(self.interval_s)

    def _trainer(self) -> None:
        with RolloutClient(f"http://127.0.0.1:{self.port}", api_key=API_KEY) as client:
            sid, _ = client.create_session(self.model, seed=1)
            step = 0
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    result = client.step(sid, step, np.full(8, 0.05, np.float32))
                    self.trainer_ms.append((started, (time.perf_counter() - started) * 1000.0))
                    step += 1
                    if result.terminated or step >= 40:
                        client.reset(sid, seed=step)
                        step = 0
                except Exception:
                    self.failures += 1
                self._stop.wait(self.interval_s)


# -- the server ------------------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


@contextlib.contextmanager
def server(
    policy: str, world: str, log_path: Path, extra: list[str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    command = [
        sys.executable,
        "-m",
        "rollserve.cli",
        "serve",
        "--policy",
        policy,
        "--world",
        world,
        "--api-key",
        API_KEY,
        "--port",
        "0",
        "--max-frame-mb",
        str(FRAME_MB),
        "--max-body-mb",
        str(FRAME_MB),
        "--header-timeout-s",
        "2",
        "--idle-timeout-s",
        "10",
        "--max-connections-per-client",
        "64",
        "--log-level",
        "warning",
        *(extra or []),
    ]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        try:
            match = READY.search(lines.get(timeout=120))
            assert match, "server did not announce itself"
            yield proc, int(match.group(1))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def errors_answered(port: int) -> int:
    """How many requests the server at ``port`` answered with an error (its ``/metrics``)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=AUTH, timeout=10).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("rollserve_errors_total")
    )


def _p99(values: list[float]) -> float:
    return round(percentile(values, 99), 2)


def _ratio(attack: list[float], idle: list[float]) -> float:
    return round(percentile(attack, 99) / percentile(idle, 99), 2) if attack and idle else float("nan")


Window = tuple[str, float, float]  # ("idle" or "attack", start, end), time.perf_counter()


def _within(samples: list[Sample], windows: list[Window]) -> list[float]:
    return [ms for when, ms in samples if any(start <= when < end for _, start, end in windows)]


def p99_report(samples: list[Sample], windows: list[Window], min_round: int = 50) -> dict[str, Any]:
    """One healthy client's p99 under attack against idle, from interleaved windows: ``pooled`` is
    every attack window's requests against every idle window's; each round's ratio takes its attack
    window against the idle windows on either side of it (so a change of the machine's load during
    the run hits both sides of each ratio alike; only rounds with ``min_round`` requests under attack);
    ``after`` is the last idle window (recovery)."""
    idle = [w for w in windows if w[0] == "idle"]
    attack = [w for w in windows if w[0] == "attack"]
    idle_ms, attack_ms = _within(samples, idle), _within(samples, attack)
    rounds: list[float] = []
    for i, window in enumerate(windows):
        if window[0] != "attack":
            continue
        neighbours = [w for w in windows[max(0, i - 1) : i + 2] if w[0] == "idle"]
        under, calm = _within(samples, [window]), _within(samples, neighbours)
        if len(under) >= min_round and calm:
            rounds.append(_ratio(under, calm))
    return {
        "idle_ms": _p99(idle_ms),
        "attack_ms": _p99(attack_ms),
        "after_ms": _p99(_within(samples, idle[-1:])),
        "ratio": _ratio(attack_ms, idle_ms),
        "rounds": {
            "count": len(rounds),
            "median": round(percentile(rounds, 50), 2),
            "min": min(rounds, default=float("nan")),
            "max": max(rounds, default=float("nan")),
            "values": rounds,
        },
        "requests": {"idle": len(idle_ms), "attack": len(attack_ms)},
    }


def _wait_until(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Attack:
    """One server's attackers: the three surfaces' processes behind one :class:`Gate`, and the
    slowloris sockets, run window by window."""

    def __init__(self, context: Any, port: int, args: argparse.Namespace) -> None:
        self.port, self.per_surface = port, args.per_surface
        self.gate, self.out = Gate(context), context.Queue()
        # the attackers' interpreters start and build their inputs (JPEG bombs, 8 MB frames: ~0.75 s of
        # CPU each) before the start line, then wait at the gate for the first attack window
        self.start_line = context.Barrier(4)
        ws_base, http_base = f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}"
        common = (args.per_surface, self.out, args.attack_connections, self.gate, self.start_line)
        self.workers = {
            "session_ws": context.Process(target=attack_session, args=(ws_base, *common)),
            "openpi_ws": context.Process(target=attack_openpi, args=(ws_base, *common)),
            "rest": context.Process(target=attack_rest, args=(http_base, common[0], args.world, *common[1:])),
        }
        self.nice = args.attacker_nice
        self.slowloris: dict[str, int] = {}
        self.slow_stop, self.slow_out = context.Event(), context.Queue()
        self.slow_pause, self.slow_parked = context.Event(), context.Event()
        self.slow_pause.set()  # the slowloris connections open with the first attack window
        slow_args = (port, args.slowloris, self.slow_stop, self.slow_pause, self.slow_parked)
        self.slow_process = context.Process(
            target=slowloris_process, args=(self.slow_out, *slow_args, args.slowloris_ramp_s)
        )
        self.stats: list[dict[str, Any]] = []
        self.killed: list[str] = []
        self.timed_out: list[str] = []
        self.errors: int | None = None
        self.alive = True

    def start(self) -> None:
        for worker in [*self.workers.values(), self.slow_process]:
            worker.start()
            # before the attacker starts its threads (they inherit it): it builds its inputs first
            niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            os.setpriority(os.PRIO_PROCESS, worker.pid, niceness)

    def at_start_line(self) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):  # an attacker that died is reported
            self.start_line.wait(timeout=120)

    def attacking(self) -> bool:
        return not self.gate.halt.is_set() and any(w.is_alive() for w in self.workers.values())

    def run_window(self, closes: float) -> None:
        """Attack until ``closes``, then pause: the window ends once every input sent in it was
        answered and the slowloris sockets are closed."""
        self.slow_pause.clear()
        self.gate.go.set()
        while time.perf_counter() < closes and any(w.is_alive() for w in self.workers.values()):
            time.sleep(0.05)
        self.gate.go.clear()
        self.slow_pause.set()
        slow_done = lambda: self.slow_parked.is_set() or not self.slow_process.is_alive()  # noqa: E731
        _wait_until(lambda: self.gate.idle() and slow_done(), 90.0)

    def finish(self) -> None:
        self.gate.halt.set()  # the parked attackers see it and report
        for worker in self.workers.values():
            worker.join(90.0)  # parked or finished: they only report now
        self.killed = [name for name, worker in self.workers.items() if worker.is_alive()]
        for name in self.killed:
            self.workers[name].terminate()
            self.workers[name].join()

    def collect(self) -> None:
        while True:
            try:
                self.stats.append(self.out.get(timeout=1.0))
            except queue.Empty:
                break
        self.slow_stop.set()
        with contextlib.suppress(queue.Empty):
            self.slowloris.update(self.slow_out.get(timeout=30))
        self.slow_process.join(10)
        if self.slow_process.is_alive():
            self.slow_process.terminate()
        reported = {s["surface"]: s for s in self.stats}
        self.timed_out = [
            name
            for name in self.workers
            if name in self.killed
            or name not in reported
            or sum(reported[name]["classes"].values()) < self.per_surface
        ]

    def check(self, healthy_server_alive: bool) -> None:
        """Is this server still up and answering its health check? Its error count, from /metrics."""
        try:
            up = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=10).status_code == 200
            self.errors = errors_answered(self.port) if up else None
        except httpx.HTTPError:
            up = False
        self.alive = up and healthy_server_alive

    def crashes(self) -> int:
        return (0 if self.alive else 1) + sum(s["internal"] for s in self.stats) + len(self.timed_out)

    def leaks(self) -> int:
        return sum(s["leaks"] for s in self.stats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-surface", type=int, default=100_000, help="hostile inputs per surface")
    parser.add_argument("--policy", default="rollserve.models.simple_policies:chunk_policy")
    parser.add_argument("--world", default="sim", help="sim (default), toy (fast), learned")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="healthy clients' request period")
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="the first idle window, before any attack"
    )
    parser.add_argument(
        "--attack-window-s", type=float, default=40.0,
        help="length of each attack window; the attack is paused between windows (--pause-s)",
    )  # fmt: skip
    parser.add_argument(
        "--pause-s", type=float, default=8.0,
        help="idle window between attack windows (below the server's 10 s idle timeout, so the "
        "attackers' connections stay open through it)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-s", type=float, default=1.0,
        help="left out at the start of each idle window (the server closing the slowloris sockets)",
    )  # fmt: skip
    parser.add_argument(
        "--recovery-seconds", type=float, default=20.0, help="the last idle window, after the attack"
    )
    parser.add_argument(
        "--min-round-requests", type=int, default=50,
        help="requests a healthy client needs in an attack window for that round's own ratio",
    )  # fmt: skip
    parser.add_argument(
        "--max-seconds", type=float, default=3600.0, help="stop the attack after this much attack time"
    )
    parser.add_argument("--slowloris", type=int, default=200, help="connections holding half a header")
    parser.add_argument(
        "--slowloris-ramp-s", type=float, default=2.0,
        help="each attack window opens the slowloris connections over this (the server's header deadline)",
    )  # fmt: skip
    parser.add_argument("--rss-bound-mb", type=float, default=600.0, help="allowed peak RSS over idle")
    parser.add_argument(
        "--attack-connections", type=int, default=12,
        help="closed-loop attacker connections per surface (each sends, waits for the answer, sends "
        "the next; the server slows down connections that keep sending refused input)",
    )  # fmt: skip
    parser.add_argument(
        "--attacker-nice", type=int, default=0, metavar="N",
        help="run the attacker processes this much nicer than the soak (e.g. 10): on one machine their "
        "own CPU competes with the server and the healthy clients, which a remote attacker's does not",
    )  # fmt: skip
    parser.add_argument(
        "--samples-out", type=Path, default=None, metavar="FILE",
        help="also write every healthy request (start, ms) and the windows to FILE (JSON), to study",
    )  # fmt: skip
    parser.add_argument(
        "--control", action="store_true",
        help="send the attack to a second, identical server, not the healthy clients' one: what the "
        "machine's load alone does to their p99 (see the module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--server-arg", action="append", default=[], metavar="FLAG=VALUE",
        help="extra 'rollserve serve' flag, e.g. --server-arg=--refusal-delay-ms=0 (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    extra = [part for flag in args.server_arg for part in flag.split("=", 1)]

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        proc, port = servers.enter_context(server(args.policy, args.world, Path(tmp) / "serve.log", extra))
        healthy = Healthy(port, args.world, args.interval_ms / 1000.0)
        healthy.run_for(2.0)  # warm-up
        baseline = rss_mb(proc.pid)
        peak = [baseline]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.05):
                with contextlib.suppress(OSError):
                    peak.append(rss_mb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        context = mp.get_context("spawn")
        # "attack" windows go to the healthy clients' server; with --control, "control" windows, in
        # turn with them, to an identical decoy (what the same load costs with nothing hostile served)
        attacks = {"attack": Attack(context, port, args)}
        if args.control:
            decoy = servers.enter_context(server(args.policy, args.world, Path(tmp) / "decoy.log", extra))
            attacks["control"] = Attack(context, decoy[1], args)
        for attack in attacks.values():
            attack.start()
        for attack in attacks.values():
            attack.at_start_line()

        healthy.start()  # from here to the end of recovery, every request timestamped
        windows: list[Window] = []
        first = time.perf_counter()
        idle_cpu = cpu_s(proc.pid)
        time.sleep(args.idle_seconds)
        windows.append(("idle", first, time.perf_counter()))
        # the server's CPU for the healthy clients alone, per second: what the attack windows' CPU
        # holds besides the attack (the healthy clients keep the same pace through them)
        healthy_cpu_per_s = (cpu_s(proc.pid) - idle_cpu) / (time.perf_counter() - first)
        attack_seconds = server_cpu = 0.0
        turn = 0
        while live := [kind for kind, attack in attacks.items() if attack.attacking()]:
            kind = live[turn % len(live)]
            turn += 1
            opened, cpu_before = time.perf_counter(), cpu_s(proc.pid)
            closes = opened + min(args.attack_window_s, args.max_seconds - attack_seconds)
            attacks[kind].run_window(closes)
            closed = time.perf_counter()
            windows.append((kind, opened, closed))
            if kind == "attack":
                attack_seconds += closed - opened
                if proc.poll() is None:
                    server_cpu += cpu_s(proc.pid) - cpu_before
            if attack_seconds >= args.max_seconds or proc.poll() is not None:
                break
            if any(attack.attacking() for attack in attacks.values()):
                time.sleep(args.settle_s + args.pause_s)
                windows.append(("idle", closed + args.settle_s, time.perf_counter()))
        for attack in attacks.values():
            attack.finish()
        recovery = time.perf_counter() + args.settle_s
        time.sleep(args.settle_s + (args.recovery_seconds if proc.poll() is None else 0.0))
        windows.append(("idle", recovery, time.perf_counter()))
        robot, trainer = healthy.stop()
        for attack in attacks.values():
            attack.collect()
        stop.set()
        sampler.join()
        alive = proc.poll() is None
        for attack in attacks.values():
            attack.check(alive)
        time.sleep(1.0)
        end_rss = rss_mb(proc.pid) if alive else float("nan")
        log_lines = sum(1 for log in Path(tmp).glob("*.log") for _ in log.open())

    main_attack = attacks["attack"]
    stats = main_attack.stats
    sent = sum(s["sent"] for s in stats)
    # each server's own health check (the healthy clients' server's is "attack"'s) and errors
    crashes = healthy.failures + sum(attack.crashes() for attack in attacks.values())
    if args.samples_out is not None:
        args.samples_out.write_text(json.dumps({"windows": windows, "robot": robot, "trainer": trainer}))
    robot_report = p99_report(robot, windows, args.min_round_requests)
    trainer_report = p99_report(trainer, windows, args.min_round_requests)
    result = {
        "benchmark": "hostile_soak",
        "machine": machine_description(),
        "world": args.world,
        "per_surface": args.per_surface,
        "hostile_inputs_sent": sent,
        "attack_connections_per_surface": args.attack_connections,
        "attacker_nice": args.attacker_nice,
        "control": args.control,
        "attack_inputs_per_s": round(sent / max(attack_seconds, 1e-9), 1),  # attack windows only
        "server_args": extra,
        "crashes": crashes,
        "server_alive": alive,
        "internal_errors": sum(s["internal"] for s in stats),
        "healthy_failures": healthy.failures,
        "surfaces_timed_out": main_attack.timed_out,
        "traceback_leaks": sum(attack.leaks() for attack in attacks.values()),
        "rss_baseline_mb": round(baseline, 1),
        "rss_peak_over_baseline_mb": round(max(peak) - baseline, 1),
        "rss_end_over_baseline_mb": round(end_rss - baseline, 1),
        "rss_bound_mb": args.rss_bound_mb,
        "rss_ok": max(peak) - baseline <= args.rss_bound_mb,
        "robot_p99_ratio": robot_report["ratio"],
        "trainer_p99_ratio": trainer_report["ratio"],
        "robot_p99": robot_report,
        "trainer_p99": trainer_report,
        "windows": {
            **{kind: sum(1 for k, _, _ in windows if k == kind) for kind in ("attack", "control", "idle")},
            "attack_window_s": args.attack_window_s,
            "pause_s": args.pause_s,
            "settle_s": args.settle_s,
        },
        "server_log_lines": log_lines,
        "errors_answered": main_attack.errors,
        "attack_seconds": round(attack_seconds, 1),
        "server_cpu_s_during_attack": round(server_cpu, 1),
        "server_cpu_ms_per_input": round(1000.0 * server_cpu / max(sent, 1), 2),  # healthy clients' too
        "server_cpu_ms_per_input_net": round(
            1000.0 * (server_cpu - healthy_cpu_per_s * attack_seconds) / max(sent, 1), 2
        ),  # less the healthy clients' share, at its idle rate
        "server_healthy_cpu_per_s": round(healthy_cpu_per_s, 3),
        "attackers_cpu_s": round(sum(s["cpu_s"] for s in stats), 1),
        "total_seconds": round(time.monotonic() - started, 1),
        **main_attack.slowloris,
        "surfaces": stats,
    }
    if args.control:
        control = attacks["control"]
        as_attack = [
            ("attack" if k == "control" else "other" if k == "attack" else k, a, b) for k, a, b in windows
        ]
        robot_control = p99_report(robot, as_attack, args.min_round_requests)
        trainer_control = p99_report(trainer, as_attack, args.min_round_requests)
        result |= {
            "robot_p99_ratio_control": robot_control["ratio"],
            "trainer_p99_ratio_control": trainer_control["ratio"],
            "control_p99": {"robot": robot_control, "trainer": trainer_control},
            "control_decoy": {
                "hostile_inputs_sent": sum(s["sent"] for s in control.stats),
                "errors_answered": control.errors,
                "surfaces_timed_out": control.timed_out,
                **control.slowloris,
                "surfaces": control.stats,
            },
        }
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
