"""The policy client's rules that its first mutation run (`policy_client` in tools/mutation.py)
found unchecked: the client's defaults and how it connects (the API key header, no compression, no
proxy, no websocket size limit, the open timeout, an HTTP refusal's words), what each call puts on
the wire (the session's fields, a reset's and an observation's header and fields), how replies are
matched (stale acks and errors for older requests skipped, errors for the call or for no request
raised), the errors' fields and words (a server error, a refused session, a lost connection, a
frame-limit close, a send cut off at its deadline, no time left), how ``close()`` ends a connection
(the goodbye and the handshake within one close wait; a dropped socket after a reply timeout, for
that connection only), an older server's text refusal, and the close-frame parser the frame-limit
race relies on.

A unit test of the client alone: the server is websockets' own, on 127.0.0.1, and answers as each
test scripts it, recording what it was sent; the send cut off at its deadline needs a server that
stops reading, a stalled proxy in front of a real one (the end-to-end paths against a real rollserve
server are in ``test_policy_client.py`` and the other ``test_policy_client_*`` files).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from chunk_server import serving_chunk_policy
from scripted_policy_server import CHUNK, Answer, ScriptedServer, scripted
from tcp_proxies import StallingProxy
from waiting import wait_until
from websockets.sync.server import ServerConnection, serve

from rollserve.client import PolicyClient, PolicyConnectionError, ServerError, SessionRejected, policy_client
from rollserve.client.policy_client import FrameTooLarge, SendTimeout, _close_frame_at_end, _text_error
from rollserve.wire import (
    ActionChunkMsg,
    CloseMsg,
    ErrorMsg,
    MsgHeader,
    ObservationMsg,
    ResetAck,
    ResetMsg,
    SessionAck,
    SessionOpen,
    WireLimits,
    encode_message,
)
from rollserve.wire.messages import Message

STATE = np.arange(6, dtype=np.float32) / 8  # exact in float32: what arrives can be compared as is
WAIT_S = 10.0  # a bound on waits for the server's side, never a speed check


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


# -- the errors' fields ------------------------------------------------------------------------------
def test_a_server_error_built_without_options_is_not_retryable_and_names_no_request() -> None:
    error = ServerError("bad_shape", "state has 4 values, the policy takes 6")
    assert (error.code, error.message, error.seq_id, error.retryable) == (
        "bad_shape",
        "state has 4 values, the policy takes 6",
        None,
        False,
    )
    assert str(error) == "bad_shape: state has 4 values, the policy takes 6"


def test_an_error_reply_for_the_request_raises_with_all_its_fields() -> None:
    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if not isinstance(msg, ObservationMsg):
            return []  # the goodbye
        error = ErrorMsg(code="overloaded", message="queue full", seq_id=msg.header.seq_id, retryable=True)
        return [encode_message(error)]

    with scripted(answer) as server, PolicyClient(server.url) as client:
        client.open_session()
        with pytest.raises(ServerError) as info:
            client.predict(STATE)
    error = info.value
    assert (error.code, error.message, error.seq_id, error.retryable) == ("overloaded", "queue full", 1, True)
    assert str(error) == "overloaded: queue full"


def test_a_refused_session_carries_the_servers_ack() -> None:
    refusal = SessionAck(accepted=False, reason="state_dim 3 does not match the policy's 6")
    with scripted(lambda msg, ws: [encode_message(refusal)]) as server, PolicyClient(server.url) as client:
        with pytest.raises(SessionRejected) as info:
            client.open_session(state_dim=3)
        assert client.ack is None
    assert info.value.ack == refusal
    assert str(info.value) == "session refused: state_dim 3 does not match the policy's 6"


# -- the client's settings and connection ---------------------------------------------------------------
def test_a_new_client_defaults() -> None:
    first, second = PolicyClient(), PolicyClient()
    assert (first.url, first.timeout, first.open_timeout, first.limits) == (
        "ws://127.0.0.1:8000/v1/policy/ws",
        30.0,
        10.0,
        WireLimits(),
    )
    assert (first.api_key, first.ack, first.session_epoch, first.dropped_replies) == (None, None, 0, 0)
    assert not first.connected
    # a random identity per client: 32 hex digits (a uuid4), never shared
    assert len(first.client_uuid) == 32 and int(first.client_uuid, 16) >= 0
    assert first.client_uuid != second.client_uuid


def test_the_session_open_carries_every_field_and_the_identity(server: ScriptedServer) -> None:
    with PolicyClient(server.url, client_uuid="robot-7") as client:
        client.open_session(
            robot_type="arm",
            action_names=("j1", "j2"),
            camera_names=["wrist"],
            state_dim=2,
            fps=30.0,
            rtc_enabled=False,
            task="wave",
        )
        client.open_session()
    first, second = server.of_type(SessionOpen)
    assert first == SessionOpen(
        client_uuid="robot-7",
        robot_type="arm",
        action_names=["j1", "j2"],
        camera_names=["wrist"],
        state_dim=2,
        fps=30.0,
        rtc_enabled=False,
        task="wave",
    )
    assert second == SessionOpen(client_uuid="robot-7")  # the defaults, and the same identity


def test_the_api_key_goes_in_the_authorization_header_and_compression_is_not_offered(
    server: ScriptedServer,
) -> None:
    PolicyClient(server.url, api_key="s3cret").connect().close()
    PolicyClient(server.url).connect().close()
    keyed, open_ = server.headers
    assert keyed["Authorization"] == "Api-Key s3cret"
    assert "Authorization" not in open_
    assert "Sec-WebSocket-Extensions" not in keyed  # no permessage-deflate: observations are mostly pixels


def test_a_reply_over_a_mebibyte_is_received(server: ScriptedServer) -> None:
    """No websocket size limit of its own (websockets' default is 1 MiB): the client's ``limits``
    decide, and a 1.2 MB chunk is within them."""
    big = np.ones((300, 1024), np.float32)

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, ObservationMsg):
            return [encode_message(ActionChunkMsg(chunk_model=big, chunk_robot=big, header=msg.header))]
        return server.like_a_policy_server(msg, ws)

    server.answer = answer
    with PolicyClient(server.url) as client:
        client.open_session()
        np.testing.assert_array_equal(client.predict(STATE).chunk_robot, big)


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, " (missing or wrong API key?)"), (503, ""), (404, "")],
)
def test_an_http_refusal_names_the_status_and_a_hint_where_there_is_one(status: int, hint: str) -> None:
    def refuse(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(status, "no\n")

    with serve(lambda ws: None, "127.0.0.1", 0, process_request=refuse) as refusing:
        threading.Thread(target=refusing.serve_forever, daemon=True).start()
        url = f"ws://127.0.0.1:{refusing.socket.getsockname()[1]}/v1/policy/ws"
        with pytest.raises(PolicyConnectionError) as info:
            PolicyClient(url).connect()
        refusing.shutdown()
    assert str(info.value) == f"{url} refused the connection: HTTP {status}{hint}"


def test_the_open_timeout_bounds_a_handshake_that_never_comes() -> None:
    """A listener that takes the connection (its backlog) and never answers the handshake."""
    with socket.create_server(("127.0.0.1", 0)) as mute:
        url = f"ws://127.0.0.1:{mute.getsockname()[1]}/v1/policy/ws"
        errors: list[BaseException] = []

        def connect() -> None:
            try:
                PolicyClient(url, open_timeout=0.3).connect()
            except BaseException as exc:
                errors.append(exc)

        opener = threading.Thread(target=connect, daemon=True)
        opener.start()
        opener.join(5.0)  # well under websockets' own 10 s
        assert not opener.is_alive(), "connect() waited past its open_timeout"
    (error,) = errors
    assert isinstance(error, PolicyConnectionError) and str(error).startswith(f"cannot connect to {url}: ")


def test_a_call_given_no_time_sends_nothing_and_keeps_the_connection(server: ScriptedServer) -> None:
    with PolicyClient(server.url) as client:
        client.open_session()
        with pytest.raises(TimeoutError) as info:
            client.infer(ObservationMsg(state=STATE, header=client.next_header()), timeout=0.0)
        assert not isinstance(info.value, PolicyConnectionError)
        assert str(info.value) == f"no time left to send to {server.url} within the timeout"
        assert server.of_type(ObservationMsg) == [] and client.connected
        assert client.predict(STATE).header.seq_id == 2  # the connection still serves


def test_close_forgets_the_session_and_stops_the_watchdog(server: ScriptedServer) -> None:
    def watchdogs() -> int:
        return sum(t.name == "rollserve-send-watchdog" and t.is_alive() for t in threading.enumerate())

    before = watchdogs()
    client = PolicyClient(server.url).connect()
    assert watchdogs() == before + 1
    client.open_session()
    client.close()
    assert (client.connected, client.ack, client.session_epoch) == (False, None, 0)
    wait_until(lambda: watchdogs() == before, timeout=WAIT_S)
    client.close()  # closing again does nothing


def test_after_a_reply_timeout_and_a_reconnect_close_is_graceful_again(server: ScriptedServer) -> None:
    """The reply timeout's "drop the socket" is for that connection only: a new connection's close
    sends its session's goodbye."""
    silent_once = [True]

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, ObservationMsg) and silent_once[0]:
            silent_once[0] = False
            return []
        return server.like_a_policy_server(msg, ws)

    server.answer = answer
    client = PolicyClient(server.url, timeout=0.3).connect()
    client.open_session()
    with pytest.raises(TimeoutError):
        client.predict(STATE)
    client.close()  # dropped: no goodbye
    client.connect()
    client.open_session()
    client.close()
    wait_until(lambda: server.ended == 2, timeout=WAIT_S)
    assert len(server.of_type(CloseMsg)) == 1  # the second connection's


def test_the_largest_message_named_is_of_the_connection_the_server_closed() -> None:
    """A frame-limit refusal names the largest message sent on the connection it closed, not one
    sent on an earlier connection."""
    connections: list[int] = []

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            connections.append(1)
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if isinstance(msg, ObservationMsg):
            if len(connections) == 1:  # the first connection serves even a large observation
                return [
                    encode_message(ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, header=msg.header))
                ]
            ws.close(1009, "")
        return []

    with scripted(answer) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        client.predict(STATE, {"top": np.zeros((64, 64, 3), np.uint8)})
        client.connect()
        client.open_session()
        small = ObservationMsg(state=STATE, header=client.next_header())
        with pytest.raises(FrameTooLarge) as info:
            client.infer(small)
        client.close()
    assert f"the largest sent on this connection: {len(encode_message(small))} bytes" in str(info.value)


# -- what each call sends ------------------------------------------------------------------------------
def test_entering_a_connected_client_keeps_its_connection_and_session(server: ScriptedServer) -> None:
    client = PolicyClient(server.url).connect()
    ack = client.open_session()
    with client as entered:
        assert entered is client and client.ack is ack and client.session_epoch == 1
        assert client.predict(STATE).header.seq_id == 1  # the same session serves it
    assert not client.connected
    assert len(server.headers) == 1  # one connection: entering did not reconnect
    assert len(server.of_type(SessionOpen)) == 1


def test_a_reset_sends_its_episode_and_the_current_epoch_and_moves_the_epoch_on(
    server: ScriptedServer,
) -> None:
    with PolicyClient(server.url) as client:
        client.open_session()  # epoch 1
        first = client.reset()
        assert (first.header.seq_id, first.session_epoch, client.session_epoch) == (1, 2, 2)
        second = client.reset(episode_id=7)
        assert (second.header.seq_id, second.session_epoch, client.session_epoch) == (2, 3, 3)
        chunk = client.predict(STATE, episode_id=7)
        assert chunk.header.session_epoch == 3  # observations go out under the epoch the reset set
    resets = [m.header for m in server.of_type(ResetMsg)]
    assert [(h.seq_id, h.episode_id, h.session_epoch) for h in resets] == [(1, 0, 1), (2, 7, 2)]


def test_a_reset_skips_a_stale_ack_and_raises_an_error_meant_for_it() -> None:
    """A late ack of an earlier reset (its seq_id) is not this reset's answer; an error carrying this
    reset's seq_id is."""

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if not isinstance(msg, ResetMsg):
            return []  # the goodbye
        seq = msg.header.seq_id
        if seq == 1:  # a late ack of an older reset first, then this one's
            stale = ResetAck(header=MsgHeader(seq_id=seq + 40), session_epoch=9)
            return [encode_message(stale), encode_message(ResetAck(header=msg.header, session_epoch=2))]
        return [encode_message(ErrorMsg(code="inference_error", message="processors failed", seq_id=seq))]

    with scripted(answer) as server, PolicyClient(server.url) as client:
        client.open_session()
        assert client.reset().session_epoch == 2
        assert client.session_epoch == 2 and client.dropped_replies == 1
        with pytest.raises(ServerError) as info:
            client.reset(episode_id=3)
        assert (info.value.code, info.value.seq_id) == ("inference_error", 2)
        assert client.session_epoch == 2  # unchanged by the failed reset


def test_predict_sends_every_field_it_is_given(server: ScriptedServer) -> None:
    prefix_model = np.full((3, 6), 0.25, np.float32)
    prefix_robot = np.full((3, 6), -0.5, np.float32)
    image = np.full((16, 16, 3), 128, np.uint8)
    with PolicyClient(server.url) as client:
        client.open_session()
        client.predict(
            [0.5, 0.25, 0.125, 0.0, -0.5, 1.0],  # a list of Python floats: sent as float32
            {"wrist": image},
            task="stack the cups",
            inference_delay_steps=3,
            prefix_model=prefix_model,
            prefix_robot=prefix_robot,
            episode_id=5,
            jpeg_quality=80,
        )
    (obs,) = server.of_type(ObservationMsg)
    assert obs.state.dtype == np.float32
    np.testing.assert_array_equal(obs.state, np.array([0.5, 0.25, 0.125, 0.0, -0.5, 1.0], np.float32))
    assert (obs.task, obs.inference_delay_steps, obs.jpeg_quality) == ("stack the cups", 3, 80)
    np.testing.assert_array_equal(obs.prefix_model, prefix_model)
    np.testing.assert_array_equal(obs.prefix_robot, prefix_robot)
    assert set(obs.images) == {"wrist"} and obs.images["wrist"].shape == (16, 16, 3)
    assert (obs.header.seq_id, obs.header.episode_id, obs.header.session_epoch) == (1, 5, 1)


def test_predict_and_next_header_defaults(server: ScriptedServer) -> None:
    with PolicyClient(server.url) as client:
        client.open_session()
        before = time.monotonic_ns()
        client.predict(STATE)
        header = client.next_header()
        after = time.monotonic_ns()
    (obs,) = server.of_type(ObservationMsg)
    assert (obs.task, obs.inference_delay_steps, obs.jpeg_quality, obs.images) == ("", 0, 0, {})
    assert obs.prefix_model is None and obs.prefix_robot is None
    assert obs.header.episode_id == 0 and header.episode_id == 0
    assert header.seq_id == 2 and header.session_epoch == 1
    # each header is stamped with the client's monotonic clock when it is made
    assert before <= obs.header.client_mono_ns <= header.client_mono_ns <= after


def test_errors_for_older_requests_are_skipped_and_errors_for_none_are_raised() -> None:
    """An error naming an older request is a late reply (skipped, counted); one naming no request
    is about the connection, so it is the current call's answer."""

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if not isinstance(msg, ObservationMsg):
            return []
        seq = msg.header.seq_id
        if seq == 1:
            late = ErrorMsg(code="overloaded", message="queue full", seq_id=seq + 40, retryable=True)
            chunk = ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, header=msg.header)
            return [encode_message(late), encode_message(chunk)]
        return [encode_message(ErrorMsg(code="malformed_frame", message="cannot read that frame"))]

    with scripted(answer) as server, PolicyClient(server.url) as client:
        client.open_session()
        assert client.predict(STATE).header.seq_id == 1
        assert client.dropped_replies == 1
        with pytest.raises(ServerError) as info:
            client.predict(STATE)
        assert (info.value.code, info.value.seq_id) == ("malformed_frame", None)


class _JumpingClock:
    """The policy client's clock (``time``), put forward by ``jump`` seconds once ``jumped()``."""

    def __init__(self, jump: float, jumped: Callable[[], bool]) -> None:
        self._jump, self._jumped = jump, jumped

    def monotonic(self) -> float:
        return time.monotonic() + (self._jump if self._jumped() else 0.0)

    def monotonic_ns(self) -> int:
        return time.monotonic_ns() + (int(self._jump * 1e9) if self._jumped() else 0)


def test_a_deadline_passed_while_skipping_late_replies_times_out_and_close_drops_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call whose deadline passes while it skips late replies raises TimeoutError (naming the
    server), and counts as a reply timeout: ``close()`` then drops the socket, with no goodbye and no
    close handshake, as after a timeout with nothing received. The clock jumps past the deadline as
    the late reply is skipped, so that the wait ends at its deadline check, not in a receive."""

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if not isinstance(msg, ObservationMsg):
            return []
        late = ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, header=MsgHeader(seq_id=0))
        return [encode_message(late)]  # and never this request's chunk

    with scripted(answer) as server:
        client = PolicyClient(server.url, timeout=5.0).connect()
        client.open_session()
        monkeypatch.setattr(policy_client, "time", _JumpingClock(60.0, lambda: client.dropped_replies > 0))
        with pytest.raises(TimeoutError) as info:
            client.predict(STATE)
        assert str(info.value) == f"no reply from {server.url} within the timeout"
        assert client.dropped_replies == 1
        client.close()
        wait_until(lambda: server.ended == 1, timeout=WAIT_S)
    assert server.of_type(CloseMsg) == []  # dropped: the session's goodbye was not sent


# -- a lost connection, in words ---------------------------------------------------------------------
def _closing_on_observations(code: int, reason: str) -> Answer:
    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            return [encode_message(SessionAck(accepted=True, session_epoch=1))]
        if isinstance(msg, ObservationMsg):
            ws.close(code, reason)
        return []

    return answer


def test_a_frame_limit_close_without_a_reason_says_so_in_full() -> None:
    with scripted(_closing_on_observations(1009, "")) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        obs = ObservationMsg(state=STATE, header=client.next_header())
        size = len(encode_message(obs))
        with pytest.raises(FrameTooLarge) as info:
            client.infer(obs)
        client.close()
    assert str(info.value) == (
        f"frame_too_large: {server.url} refused a message as over its frame limit (--max-frame-mb; the"
        f" largest sent on this connection: {size} bytes) and closed the connection (1009: no reason"
        " given); send smaller observations (fewer or smaller images, jpeg_quality) or raise the limit"
    )


def test_the_close_code_websockets_parsed_is_the_one_used() -> None:
    """The close frame websockets parsed decides; the bytes the socket saw are only a fallback, and a
    reason whose bytes end like a short close frame with a code a server may send (``88 02 04 20``:
    1056) would read as that frame there."""
    reason = "over the limit \u02c8\x02\x04 "  # U+02C8 is the bytes CB 88
    assert _close_frame_at_end(
        b"\x88" + bytes([2 + len(reason.encode())]) + b"\x03\xf1" + reason.encode()
    ) == (
        1056,
        "",
    )  # what the fallback alone would make of it
    with scripted(_closing_on_observations(1009, reason)) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        with pytest.raises(FrameTooLarge) as info:
            client.predict(STATE)
        client.close()
    assert f"(1009: {reason})" in str(info.value)


def test_a_connection_closed_for_another_reason_is_a_lost_connection_naming_the_url() -> None:
    with scripted(_closing_on_observations(1011, "the policy crashed")) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        with pytest.raises(PolicyConnectionError) as info:
            client.predict(STATE)
        client.close()
    assert not isinstance(info.value, ServerError)
    message = str(info.value)
    assert message.startswith(f"connection to {server.url} lost: "), message
    assert "1011" in message and "the policy crashed" in message, message


# -- receiving -----------------------------------------------------------------------------------------
def test_a_reply_over_the_clients_own_limits_is_an_undecodable_reply_error(server: ScriptedServer) -> None:
    """The client decodes with its own ``limits``: a 4x6 chunk (24 elements) over a limit of 10 is
    returned as an error message by ``receive`` and raised by a call."""
    with PolicyClient(server.url, limits=WireLimits(max_tensor_elements=10)) as client:
        client.open_session()
        client.send_observation(ObservationMsg(state=STATE, header=client.next_header()))
        assert client.receive() == ErrorMsg(
            code="too_many_elements", message="undecodable reply: 24 elements exceeds the limit of 10"
        )
        with pytest.raises(ServerError) as info:
            client.predict(STATE)
        assert (info.value.code, info.value.seq_id) == ("too_many_elements", None)


def test_receive_without_a_timeout_waits_the_clients_timeout(server: ScriptedServer) -> None:
    """Nothing comes (no request was sent): ``receive()`` gives up after the client's 0.2 s."""
    client = PolicyClient(server.url, timeout=0.2).connect()
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            client.receive()
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=receive, daemon=True)
    waiter.start()
    waiter.join(WAIT_S)
    assert not waiter.is_alive(), "receive() waited past the client's timeout"
    (error,) = errors
    assert isinstance(error, TimeoutError) and not isinstance(error, PolicyConnectionError), repr(error)
    assert client.connected  # nothing broke: only no message yet
    client.close()


def test_calls_on_a_client_that_is_not_connected_say_so() -> None:
    client = PolicyClient("ws://127.0.0.1:9/v1/policy/ws")  # never connected: nothing is tried
    for call in (
        client.receive,
        client.reset,
        client.open_session,
        lambda: client.predict(STATE),
        lambda: client.send_observation(ObservationMsg(state=STATE)),
    ):
        with pytest.raises(PolicyConnectionError) as info:
            call()
        assert str(info.value) == "not connected"


# -- an older server's text refusal --------------------------------------------------------------------
def test_text_frames_read_as_errors() -> None:
    """``"unavailable: <message>"`` is an older server's refusal at its connection limit (retryable);
    the message is what follows the first ``": "``; any text is cut to 500 characters."""
    assert _text_error("unavailable: busy: 2 connections from one address") == ErrorMsg(
        code="unavailable", message="busy: 2 connections from one address", retryable=True
    )
    assert _text_error("unavailable: " + "m" * 600) == ErrorMsg(
        code="unavailable", message="m" * 500, retryable=True
    )
    assert _text_error("x" * 600) == ErrorMsg(code="malformed_frame", message="x" * 500)
    assert _text_error("unavailable") == ErrorMsg(code="malformed_frame", message="unavailable")


def test_an_older_servers_text_refusal_raises_a_retryable_unavailable() -> None:
    def answer(msg: Message, ws: ServerConnection) -> list[str]:
        return ["unavailable: 1 connections from one address is the limit"]

    with scripted(answer) as server, PolicyClient(server.url) as client, pytest.raises(ServerError) as info:
        client.open_session()
    assert (info.value.code, info.value.message, info.value.retryable) == (
        "unavailable",
        "1 connections from one address is the limit",
        True,
    )


# -- the close-frame parser ------------------------------------------------------------------------------
def _close_frame(code: int, reason: bytes = b"") -> bytes:
    payload = struct.pack("!H", code) + reason
    return b"\x88" + bytes([len(payload)]) + payload


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_close_frame(1009), (1009, "")),  # the shortest: a code and no reason
        (b"\x82\x01x" + _close_frame(1009), (1009, "")),  # after a data frame
        (_close_frame(1009, b"x"), (1009, "x")),  # an odd distance from the end
        (_close_frame(1000, b"a\x02bc"), (1000, "a\x02bc")),  # a reason byte that equals a length
        (_close_frame(1009, "\u02c8abc".encode()), (1009, "\u02c8abc")),  # and one that is 0x88
        (
            _close_frame(1009, "\u02c8\x02ok".encode()),
            (1009, "\u02c8\x02ok"),
        ),  # ends like 88 02 6f 6b: no code
        (_close_frame(4999, b"x\x88\x02\x13\x88"), (4999, "x\ufffd\x02\x13\ufffd")),  # 0x1388: one past 4999
        (b"\x88\x02\x03\xe7", None),  # 999: below any code a server sends
        (b"\x88\x02\x03\xe8", (1000, "")),  # the lowest
        (b"junk" + _close_frame(1009, b"r" * 123), (1009, "r" * 123)),  # the longest: 125 bytes of payload
        (_close_frame(1009, b"\xff\xfe"), (1009, "\ufffd\ufffd")),  # a reason that is not UTF-8
        (b"\x82\x02ab", None),  # a data frame, no close
        (b"", None),
        (b"\x04\x03\xf1\x00\x88", None),  # no frame, unless read wrapping round from the end
        (b"\x88\x7e" + bytes(126), None),  # 126 is no close frame's length (at most 125)
        (b"\x88\x7e\x03\xe8" + bytes(124), None),  # nor with a code a server may send
        (b"\x88\x05\x03\xe8", None),  # a length byte that is not what follows
    ],
)
def test_the_close_frame_at_the_end_of_the_received_bytes(
    data: bytes, expected: tuple[int, str] | None
) -> None:
    assert _close_frame_at_end(data) == expected


def test_a_goodbye_names_the_sessions_epoch(server: ScriptedServer) -> None:
    client = PolicyClient(server.url).connect()
    client.open_session()
    client.reset()
    client.close()
    wait_until(lambda: len(server.of_type(CloseMsg)) == 1, timeout=WAIT_S)
    assert server.of_type(CloseMsg)[0].header.session_epoch == 2


def test_a_graceful_close_waits_for_the_servers_close_frame(server: ScriptedServer) -> None:
    """The goodbye and the handshake share one close wait: the handshake keeps what the goodbye left
    of it (here nearly all of it), enough for the server's close frame to come back."""
    client = PolicyClient(server.url, timeout=5.0).connect()
    client.open_session()
    ws = client._ws
    assert ws is not None
    client.close()
    wait_until(lambda: len(server.of_type(CloseMsg)) == 1, timeout=WAIT_S)
    assert ws.close_code == 1000  # the server's answer was received: not 1006, a socket dropped before it


def test_closing_a_connection_the_server_already_closed_is_quiet() -> None:
    """The server went away (close 1001) while the client held its session and had not read since:
    ``close()`` tries the goodbye, which cannot go, and returns without an error."""
    gone = threading.Event()

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        assert isinstance(msg, SessionOpen)
        ws.send(encode_message(SessionAck(accepted=True, session_epoch=1)))
        ws.close(1001, "server shutting down")
        gone.set()
        return []

    with scripted(answer) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        assert gone.wait(WAIT_S)
        ws = client._ws
        assert ws is not None
        wait_until(lambda: ws.close_code is not None, timeout=WAIT_S)  # its reader saw the close
        client.close()
    assert not client.connected and client.ack is None


def test_a_send_cut_off_at_its_deadline_says_what_happened_in_full() -> None:
    """Against a server that stopped reading (a stalled proxy in front of a real one), a send that
    outlives the call's timeout is cut off: the error names the size, the timeout and the shutdown."""
    with serving_chunk_policy() as running:
        proxy = StallingProxy((running.host, running.port))
        try:
            url = f"ws://127.0.0.1:{proxy.port}/v1/policy/ws"
            client = PolicyClient(url).connect()
            client.open_session(state_dim=6)
            proxy.stall()
            rows = (2 * _wmem_max() + (1 << 20)) // (1024 * 3) + 1  # more than the socket buffers hold
            obs = ObservationMsg(
                state=np.zeros(6, np.float32),
                images={"top": np.zeros((rows, 1024, 3), np.uint8)},
                header=client.next_header(),
            )
            size = len(encode_message(obs))
            with pytest.raises(SendTimeout) as info:
                client.infer(obs, timeout=0.5)
            client.close()
        finally:
            proxy.close()
    assert str(info.value) == (
        f"connection to {url} lost: sending {size} bytes took longer than the timeout (0.5 s), so the"
        " server stopped reading; the connection was shut down"
    )


def _wmem_max() -> int:
    """The most a socket's send buffer grows to (Linux); 4 MiB, Linux's default, elsewhere."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return 4 * 1024 * 1024


def test_the_close_handshake_gets_what_the_goodbye_left_of_the_close_wait(server: ScriptedServer) -> None:
    """One close wait, ``min(timeout, 1 s)``, for the goodbye and the handshake together: with a
    0.2 s timeout the handshake may wait what is left of 0.2 s, never websockets' 10 s or a full 1 s."""
    client = PolicyClient(server.url, timeout=0.2).connect()
    client.open_session()
    ws = client._ws
    assert ws is not None
    client.close()
    assert 0.0 <= ws.close_timeout <= 0.2


def test_a_close_right_after_connecting_completes_the_handshake(server: ScriptedServer) -> None:
    """Nothing was received yet, but nothing timed out either: the connection is closed with the
    handshake (the server's close frame comes back), not dropped."""
    client = PolicyClient(server.url, timeout=5.0).connect()
    ws = client._ws
    assert ws is not None
    client.close()
    assert ws.close_code == 1000


def test_the_client_connects_directly_whatever_the_proxy_variables_say(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxy variables (websockets >= 15 honours them) point nowhere here, and no deprecation warning
    (websockets >= 17 asks for ``legacy=True`` to connect without a context manager) is raised."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: nothing listens
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = PolicyClient(server.url).connect()
        client.open_session()
        assert client.predict(STATE).header.seq_id == 1
        client.close()


def test_a_send_on_a_connection_the_server_closed_says_why_it_was_lost() -> None:
    """The server closed (1011) after the session opened; the next call's send meets the closed
    connection, and the error carries websockets' account of the close."""

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        if isinstance(msg, SessionOpen):
            ws.send(encode_message(SessionAck(accepted=True, session_epoch=1)))
            ws.close(1011, "the policy crashed")
        return []

    with scripted(answer) as server:
        client = PolicyClient(server.url).connect()
        client.open_session()
        ws = client._ws
        assert ws is not None
        wait_until(lambda: ws.close_code is not None, timeout=WAIT_S)  # the close is in before the send
        with pytest.raises(PolicyConnectionError) as info:
            client.predict(STATE)
        client.close()
    message = str(info.value)
    assert message.startswith(f"connection to {server.url} lost: "), message
    assert "1011" in message and "the policy crashed" in message, message


def test_a_client_left_open_does_not_keep_the_process_alive(server: ScriptedServer) -> None:
    """A script that connects and exits without ``close()`` still exits: the client's threads are
    daemons (a bounded wait: a thread that kept it alive would hang it for good)."""
    script = (
        "from rollserve.client import PolicyClient\n"
        f"client = PolicyClient({server.url!r}).connect()\n"
        "client.open_session()\n"
        "print('connected', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "connected\n", done.stderr


def test_a_client_given_no_time_sends_nothing(server: ScriptedServer) -> None:
    """``timeout=0``: a pipelined send (bounded by the client's timeout) is refused before anything
    goes out, and the connection is not broken by it."""
    client = PolicyClient(server.url, timeout=0.0).connect()
    with pytest.raises(TimeoutError) as info:
        client.send_observation(ObservationMsg(state=STATE, header=client.next_header()))
    assert not isinstance(info.value, PolicyConnectionError)
    assert str(info.value) == f"no time left to send to {server.url} within the timeout"
    assert client.connected and server.received == []
    client.close()


def test_every_late_reply_skipped_is_counted(server: ScriptedServer) -> None:
    """``dropped_replies`` counts each late reply skipped, over calls: two before the first chunk, one
    before the second."""
    late = 2

    def answer(msg: Message, ws: ServerConnection) -> list[bytes]:
        nonlocal late
        replies = server.like_a_policy_server(msg, ws)
        if isinstance(msg, ObservationMsg):
            old = ActionChunkMsg(chunk_model=CHUNK, chunk_robot=CHUNK, header=MsgHeader(seq_id=0))
            replies = [encode_message(old)] * late + replies
            late = 1
        return replies

    server.answer = answer
    with PolicyClient(server.url) as client:
        client.open_session()
        assert client.predict(STATE).header.seq_id == 1
        assert client.dropped_replies == 2
        assert client.predict(STATE).header.seq_id == 2
        assert client.dropped_replies == 3


def test_a_reconnected_client_closes_its_new_connection_with_the_handshake(server: ScriptedServer) -> None:
    """``close()`` leaves nothing behind for the next connection: one closed before it received
    anything (nothing timed out on it) still gets the close handshake, not a dropped socket."""
    client = PolicyClient(server.url, timeout=5.0).connect()
    client.open_session()
    client.connect()  # closes the first connection, gracefully
    ws = client._ws
    assert ws is not None
    client.close()
    assert ws.close_code == 1000  # the server's close frame came back: not 1006, a dropped socket


def test_a_connections_threads_are_daemons(server: ScriptedServer) -> None:
    """In process, what ``test_a_client_left_open_does_not_keep_the_process_alive`` shows end to end
    (in a subprocess, which a mutation run cannot see into): a connection's threads (the send
    watchdog's, websockets' reader) are daemons, so one left open does not hold up the exit. Connected
    from the test's own thread, not a daemon: a thread left to inherit that would not be one either."""
    assert not threading.current_thread().daemon
    before = set(threading.enumerate())
    client = PolicyClient(server.url).connect()
    try:
        started = [t for t in threading.enumerate() if t not in before]
        assert "rollserve-send-watchdog" in [t.name for t in started]
        assert all(t.daemon for t in started), [(t.name, t.daemon) for t in started]
    finally:
        client.close()  # a thread that is no daemon would hold up the test run's exit


def test_a_frame_limit_close_before_anything_was_sent_names_no_bytes() -> None:
    """The largest message sent is counted per connection from nothing: a server that closes with 1009
    before the client sent it anything (a misbehaving one) is reported as refusing 0 bytes."""
    with serve(lambda ws: ws.close(1009, "too big"), "127.0.0.1", 0) as closing:
        threading.Thread(target=closing.serve_forever, daemon=True).start()
        client = PolicyClient(f"ws://127.0.0.1:{closing.socket.getsockname()[1]}/v1/policy/ws").connect()
        with pytest.raises(FrameTooLarge) as info:
            client.receive()
        client.close()
        closing.shutdown()
    assert "(--max-frame-mb; the largest sent on this connection: 0 bytes)" in str(info.value)


# -- the send watchdog alone -------------------------------------------------------------------------
class _UnreadConnection:
    """Stands for a connection whose server stopped reading (a unit test of the send watchdog alone):
    a send blocks until the socket is shut down, then fails as a shut-down socket's send does."""

    def __init__(self, shutdown_error: OSError | None = None) -> None:
        self.socket = self
        self.shut = threading.Event()
        self._shutdown_error = shutdown_error  # a socket the peer already reset refuses a shutdown

    def shutdown(self, how: int) -> None:
        self.shut.set()
        if self._shutdown_error is not None:
            raise self._shutdown_error

    def send(self, data: bytes) -> None:
        if not self.shut.wait(WAIT_S):
            raise AssertionError("the send was never cut off")
        raise BrokenPipeError("the socket was shut down")


def _send_in_thread(watchdog: Any, limit: float) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def send() -> None:
        try:
            watchdog.send(b"observation", limit)
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender, errors


def test_a_send_begun_before_the_watchdogs_thread_first_ran_is_still_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog's thread is started as the connection opens, and may not have run yet when the
    first send comes: that send must not trip over what the thread has not yet written, and is
    still cut off at its deadline once the thread runs (held here until the send is under way)."""
    held: list[threading.Thread] = []

    class HeldThread(threading.Thread):
        def start(self) -> None:
            held.append(self)

    monkeypatch.setattr(policy_client, "threading", SimpleNamespace(Thread=HeldThread, Event=threading.Event))
    connection = _UnreadConnection()
    watchdog = policy_client._SendWatchdog(connection)  # type: ignore[arg-type]
    sender, errors = _send_in_thread(watchdog, 0.2)
    wait_until(lambda: watchdog._deadline is not None or bool(errors), timeout=WAIT_S)
    (thread,) = held
    threading.Thread.start(thread)
    sender.join(WAIT_S)
    assert [type(e) for e in errors] == [BrokenPipeError], errors  # cut off by the shutdown
    assert watchdog.fired and connection.shut.is_set()


class _WatchdogRacedBySend(policy_client._SendWatchdog):
    """A watchdog whose thread, right after its first read of the send deadline, is overtaken by a
    send that begins then: the send sees the thread's old bookkeeping, the thread the old deadline
    (the race ``_run`` reads the deadline again for)."""

    def __init__(self, connection: _UnreadConnection, limit: float) -> None:
        self._value: float | None = None
        self._limit = limit
        self._raced = False
        self.errors: list[BaseException] = []
        super().__init__(connection)  # type: ignore[arg-type]

    @property  # type: ignore[override]
    def _deadline(self) -> float | None:
        value = self._value
        if not self._raced and threading.current_thread().name == "rollserve-send-watchdog":
            self._raced = True
            _, self.errors = _send_in_thread(self, self._limit)
            wait_until(lambda: self._value is not None or bool(self.errors), timeout=WAIT_S)
        return value

    @_deadline.setter
    def _deadline(self, value: float | None) -> None:
        self._value = value


def test_a_send_begun_as_the_watchdog_reads_its_deadline_is_still_cut_off() -> None:
    connection = _UnreadConnection()
    watchdog = _WatchdogRacedBySend(connection, 0.2)
    assert connection.shut.wait(WAIT_S), "the send that overtook the watchdog's read was never cut off"
    wait_until(lambda: bool(watchdog.errors), timeout=WAIT_S)
    assert [type(e) for e in watchdog.errors] == [BrokenPipeError], watchdog.errors
    assert watchdog.fired
    watchdog.stop()


def test_a_shutdown_that_fails_ends_the_watchdog_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket the watchdog shuts down may already be gone (the server reset the connection as the
    deadline passed): the send is still failed, and the watchdog's thread ends without an error."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    before = set(threading.enumerate())
    connection = _UnreadConnection(shutdown_error=OSError(errno.ENOTCONN, "not connected"))
    watchdog = policy_client._SendWatchdog(connection)  # type: ignore[arg-type]
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "rollserve-send-watchdog"]
    with pytest.raises(BrokenPipeError):
        watchdog.send(b"observation", 0.1)
    thread.join(WAIT_S)
    assert not thread.is_alive() and watchdog.fired
    assert raised == []


# -- the recording socket alone ------------------------------------------------------------------------
class _ReceivedBytes:
    """Stands for a connected socket (a unit test of the recording socket alone): each ``recv`` hands
    out the next of ``reads``."""

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        return self._reads.pop(0)


def test_the_recording_socket_keeps_the_close_frame_that_ended_what_it_received() -> None:
    """The fallback when websockets lost a close frame it had not parsed: the socket finds it at the
    end of the bytes received, short reads included, and finds nothing (no error) before anything
    came. The reason ends in the bytes ``88 06 0c 30``, a close frame (3120) if 4 more bytes followed."""
    reason = "\u02c8\x06\x0c0"
    frame = _close_frame(1009, reason.encode())
    sock = policy_client._RecordingSocket(_ReceivedBytes([b"\x82\x01x", frame]))  # type: ignore[arg-type]
    assert sock.close_frame() is None
    assert sock.recv(4096) == b"\x82\x01x"
    assert sock.recv(4096) == frame
    assert sock.close_frame() == (1009, reason)


_REFUSAL = "m" * 100  # a 104-byte close frame: longer than the 66 bytes a peek's flags (2 | 64) would ask


@contextlib.contextmanager
def _connected_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair of plain sockets: the client's end and the server's."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


def _read_to_the_end(sock: Any) -> bytes:
    received = b""
    while data := sock.recv(4096):
        received += data
    return received


def test_the_unread_count_is_what_the_socket_holds() -> None:
    """The peek asks the socket how much it holds (a guess stands in only where it cannot be asked)."""
    with _connected_pair() as (ours, theirs):
        assert policy_client._unread_count(ours) == 0
        theirs.sendall(bytes(300))  # over a byte's worth: the count's bytes in order
        wait_until(lambda: policy_client._unread_count(ours) == 300, timeout=WAIT_S)
        ours.recv(100)
        assert policy_client._unread_count(ours) == 200


def test_a_shut_down_recording_socket_copies_the_unread_bytes_and_leaves_them_to_read() -> None:
    """The close frame the socket still holds is found, and websockets' reader still reads every byte:
    the peek copies them, it does not take them."""
    sent = b"\x82\x01x" + _close_frame(1009, _REFUSAL.encode())
    with _connected_pair() as (ours, theirs):
        theirs.sendall(sent)
        theirs.close()  # the server closed after its close frame
        recording = policy_client._RecordingSocket(ours)
        recording.shutdown(socket.SHUT_WR)
        assert recording.close_frame() == (1009, _REFUSAL)  # from the peek alone: nothing read yet
        assert _read_to_the_end(recording) == sent


def test_a_recording_socket_on_descriptor_0_peeks_too() -> None:
    """A program started with its standard input closed gets descriptor 0 for its first socket, a valid
    one: only a closed socket (-1) holds nothing to peek at."""
    try:
        saved: int | None = os.dup(0)  # this process's standard input, put back at the end
    except OSError:
        saved = None
    try:
        with _connected_pair() as (ours, theirs):
            os.dup2(ours.fileno(), 0)
            with socket.socket(ours.family, ours.type, fileno=0) as on_0:
                theirs.sendall(_close_frame(1009, b"too big"))
                recording = policy_client._RecordingSocket(on_0)
                recording.close()
                assert recording.close_frame() == (1009, "too big")
    finally:
        if saved is not None:
            os.dup2(saved, 0)
            os.close(saved)


def test_a_recording_socket_where_a_peek_could_block_does_not_peek(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a non-blocking flag (Windows) the socket is not peeked at, and closes as any other."""
    monkeypatch.delattr(socket, "MSG_DONTWAIT")
    with _connected_pair() as (ours, theirs):
        theirs.sendall(_close_frame(1009, b"too big"))
        recording = policy_client._RecordingSocket(ours)
        recording.close()
        assert ours.fileno() == -1
        assert recording.close_frame() is None


class _WrappingSocket(socket.socket):
    """A socket of another type than the plain one, as TLS's (a subclass that decrypts what it reads)."""


def test_a_wrapped_socket_is_not_peeked_at() -> None:
    """Under a wrapper the bytes on the wire are not the websocket stream (TLS records): a close frame
    among them is not the server's."""
    with _connected_pair() as (ours, theirs):
        wrapped = _WrappingSocket(ours.family, ours.type, fileno=ours.detach())
        theirs.sendall(_close_frame(1009, b"too big"))
        recording = policy_client._RecordingSocket(wrapped)
        recording.close()
        assert wrapped.fileno() == -1
        assert recording.close_frame() is None


def test_a_peek_that_finds_the_bytes_taken_meanwhile_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """websockets' reader may take the bytes between the count and the peek, and the peek then finds
    none (it may not wait): the socket still closes, and no close frame is made up."""
    count_unread = policy_client._unread_count
    taken: list[bytes] = []

    def count_then_read(sock: socket.socket) -> int:
        count = count_unread(sock)
        taken.append(sock.recv(count))  # the reader's read
        return count

    monkeypatch.setattr(policy_client, "_unread_count", count_then_read)
    frame = _close_frame(1009, b"too big")
    with _connected_pair() as (ours, theirs):
        ours.setblocking(False)  # a read that would wait fails at once instead (the peek may not wait)
        theirs.sendall(frame)
        wait_until(lambda: count_unread(ours) == len(frame), timeout=WAIT_S)
        recording = policy_client._RecordingSocket(ours)
        recording.close()
        assert taken == [frame]
        assert ours.fileno() == -1
        assert recording.close_frame() is None


def test_a_socket_closed_as_it_is_peeked_at_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """websockets' reader closes the socket as the connection ends, which may come between the check
    that it is open and the count: the close that peeks goes on quietly."""
    count_unread = policy_client._unread_count

    def close_then_count(sock: socket.socket) -> int:
        sock.close()  # the reader's close
        return count_unread(sock)

    monkeypatch.setattr(policy_client, "_unread_count", close_then_count)
    with _connected_pair() as (ours, theirs):
        theirs.sendall(_close_frame(1009, b"too big"))
        recording = policy_client._RecordingSocket(ours)
        recording.close()
        assert ours.fileno() == -1
        assert recording.close_frame() is None
