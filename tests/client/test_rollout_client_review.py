"""The rollout client's rules that its first mutation run (`rollout_client` in tools/mutation.py)
found unchecked: what each call sends, the retry count and backoff, a lost reply that can no longer
be retried, and how a refusal's body becomes a typed error. A unit test of the client alone: the
server is an ``httpx.MockTransport`` that records what it is sent (the end-to-end paths are in
``test_rollout_client.py`` and ``test_rollout_faults.py``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from rollserve.client import rollout_client
from rollserve.client.rollout_client import (
    MSGPACK,
    RolloutClient,
    RolloutRequestError,
    _detail_text,
    _error,
    _is_status,
    _typed_error,
    action_body,
    unpack_reply,
)
from rollserve.wire.codec import packb, unpackb
from rollserve.wire.errors import MALFORMED_FRAME, WireError

OBSERVATION = {  # the JSON body's form: base64 of the float32 bytes, and the shape
    "video_latent": base64.b64encode(np.array([0.5, 1.5], "<f4").tobytes()).decode(),
    "shape": [2],
}
ACTION = np.arange(8, dtype=np.float32) / 10


class _Server:
    """Answers JSON with ``answer(request)``; records each request (method, path, body)."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        return self.answer(request)

    def client(self, **kwargs: Any) -> RolloutClient:
        return RolloutClient("http://world", use_msgpack=False, transport=httpx.MockTransport(self), **kwargs)


def _json(payload: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=payload)


def _session_answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content) if request.content else {}
    return _json({"session_id": body.get("session_id", "s"), "observation": OBSERVATION})


def test_an_error_reads_as_its_code_and_message() -> None:
    error = RolloutRequestError("step_conflict", "step 3 was committed", status=409, committed_step_id=3)
    assert str(error) == "step_conflict: step 3 was committed"


def test_create_session_sends_the_id_and_the_render_request_it_is_given() -> None:
    server = _Server(_session_answer)
    render = {"cameras": ["exterior"], "height": 64, "width": 64}
    sid, tensor = server.client().create_session("m", seed=3, session_id="mine", render=render)
    assert sid == "mine"
    np.testing.assert_array_equal(tensor, [0.5, 1.5])
    assert server.seen == [
        ("POST", "/v1/realtime/sessions", {"model": "m", "seed": 3, "session_id": "mine", "render": render})
    ]


def test_a_reset_without_a_seed_draws_one_in_the_servers_31_bit_range() -> None:
    server = _Server(_session_answer)
    client = server.client()
    for _ in range(64):
        client.reset("s")
    seeds = [body["seed"] for _, _, body in server.seen]
    assert all(type(seed) is int and 0 <= seed < 2**31 for seed in seeds)
    assert max(seeds) >= 2**30  # drawn over the whole range (64 draws below 2**30: odds 2**-64)
    client.reset("s", seed=5)
    assert server.seen[-1] == ("POST", "/v1/realtime/sessions/s/reset", {"seed": 5})


def test_fork_sends_the_new_id_given_or_a_fresh_one() -> None:
    server = _Server(_session_answer)
    client = server.client()
    assert client.fork("s", new_session_id="child") == "child"
    drawn = client.fork("s")
    assert server.seen[0] == ("POST", "/v1/realtime/sessions/s/fork", {"session_id": "child"})
    assert server.seen[1][2] == {"session_id": drawn} and len(drawn) == 32 and int(drawn, 16) >= 0


def test_world_names_what_it_did_not_find() -> None:
    server = _Server(lambda _: _json({"data": [{"id": "p", "kind": "policy"}]}))
    with pytest.raises(RolloutRequestError, match=r"^model_not_found: the server serves no world$"):
        server.client().world()
    with pytest.raises(RolloutRequestError, match=r"^model_not_found: the server serves no world 'w'$"):
        server.client().world("w")


def _step_answer(request: httpx.Request) -> httpx.Response:
    step_id = json.loads(request.content)["step_id"]
    return _json(
        {
            "step_id": step_id,
            "next_observation": {**OBSERVATION, "reward": 1.0},
            "model_metadata": {"committed_step_id": step_id},
        }
    )


def test_a_step_sends_its_observation_and_context_flag() -> None:
    server = _Server(_step_answer)
    result = server.client().step("s", 4, ACTION, observation={"prompt": "push"}, use_session_context=False)
    assert result.step_id == 4 and result.committed_step_id == 4
    method, path, body = server.seen[0]
    assert (method, path) == ("POST", "/v1/realtime/sessions/s/step")
    assert body["observation"] == {"prompt": "push"} and body["use_session_context"] is False
    assert body["action"] == action_body(ACTION)


def test_an_action_is_eight_floats_whatever_its_shape_or_dtype() -> None:
    body = action_body(np.arange(8, dtype=np.int64).reshape(1, 8))  # a policy's [1, 8] output
    assert body == {"joint_positions": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "gripper_position": 7.0}
    assert all(type(v) is float for v in [*body["joint_positions"], body["gripper_position"]])


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def test_a_step_is_tried_max_retries_plus_one_times_with_doubling_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(rollout_client.time, "sleep", pauses.append)
    server = _Server(_unreachable)
    client = server.client(max_retries=3, backoff_s=0.01, max_backoff_s=0.03)
    with pytest.raises(httpx.ConnectError):
        client.step("s", 1, ACTION, use_session_context=False)  # no status check between attempts
    assert len(server.seen) == 4 and client.retries == 3
    assert pauses == [0.01, 0.02, 0.03]  # doubling, capped


def test_a_lost_reply_whose_step_the_session_has_passed_cannot_be_retried() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/status"):
            return _json({"committed_step_id": 7})
        raise httpx.ReadTimeout("lost", request=request)

    client = _Server(answer).client(backoff_s=0.0)
    with pytest.raises(RolloutRequestError) as refused:
        client.step("s", 4, ACTION)
    error = refused.value
    assert (error.code, error.committed_step_id) == ("step_conflict", 7)
    assert error.message == "step 4 cannot be retried: the session is at committed_step_id 7"


def test_a_5xx_whose_body_is_not_a_servers_answer_is_retried_like_a_lost_reply() -> None:
    answers = iter([_json([1, 2], status=503), _json({"data": []})])
    server = _Server(lambda _: next(answers))
    client = server.client(backoff_s=0.0)
    assert client.models() == []
    assert len(server.seen) == 2 and client.retries == 1


def test_unpack_reply_names_what_was_wrong() -> None:
    for content, kind in ((b"\xc1", "FormatError"), (b"\x93\x01", "ValueError")):
        with pytest.raises(WireError) as refused:
            unpack_reply(content)
        assert refused.value.code == MALFORMED_FRAME
        assert str(refused.value) == f"{MALFORMED_FRAME}: not a valid msgpack reply ({kind})"


@pytest.mark.parametrize(
    ("payload", "typed"),
    [
        ({"error": {"code": "step_conflict"}}, True),  # strict mode, step bodies
        ({"error": {"code": "http_error"}}, False),  # the client's own stand-in for a page
        ({"error": {"code": 409, "reason": "step_conflict"}}, True),  # vLLM-Omni mode
        ({"error": {"code": 409, "reason": ""}}, False),
        ({"error": {"code": 409}}, False),
        ({"error": {"code": True, "reason": "x"}}, False),  # a bool is no status
        ({"error": "text"}, False),
        ([{"error": {"code": "x"}}], False),  # not a body of ours at all
    ],
)
def test_a_typed_error_body_is_told_from_a_proxys(payload: Any, typed: bool) -> None:
    assert _typed_error(payload) is typed


@pytest.mark.parametrize(("value", "status"), [(409, True), (True, False), ("409", False), (None, False)])
def test_a_status_is_an_int_and_never_a_bool(value: Any, status: bool) -> None:
    assert _is_status(value) is status


def test_a_refusal_without_a_typed_code_is_named_by_its_status() -> None:
    assert _error(500, {"error": {"code": 500, "reason": 5, "message": "m"}}).code == "http_500"
    assert _error(409, {"error": {"code": 409, "reason": "step_conflict"}}).code == "step_conflict"
    detail = _error(422, {"detail": [{"loc": ["body", "step_id"], "msg": "bad"}]})
    assert (detail.code, detail.message, detail.status) == ("http_422", "body.step_id: bad", 422)


def test_fastapis_detail_reads_as_one_line() -> None:
    assert _detail_text(None) == ""
    assert _detail_text("not found") == "not found"
    items = [{"loc": ["body", "step_id"], "msg": "bad"}, {"msg": "no place"}, "plain"]
    assert _detail_text(items) == "body.step_id: bad; no place; plain"


def test_an_item_without_a_message_reads_as_itself() -> None:
    assert _detail_text([{"loc": ["body"]}]) == "{'loc': ['body']}"


def test_the_client_sends_its_key_to_the_base_url_without_a_doubled_slash() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _json({"data": []})

    keyed = RolloutClient(
        "http://world/", api_key="k", use_msgpack=False, transport=httpx.MockTransport(answer)
    )
    keyed.models()
    RolloutClient("http://world", use_msgpack=False, transport=httpx.MockTransport(answer)).models()
    RolloutClient("http://world/X/", use_msgpack=False, transport=httpx.MockTransport(answer)).models()
    assert [str(r.url) for r in seen] == ["http://world/v1/models"] * 2 + ["http://world/X/v1/models"]
    assert seen[0].headers["authorization"] == "Bearer k" and "authorization" not in seen[1].headers


def test_the_clients_defaults_are_msgpack_eight_retries_and_a_short_backoff() -> None:
    client = RolloutClient("http://world")
    assert client.use_msgpack is True and client.max_retries == 8
    assert (client.backoff_s, client.max_backoff_s) == (0.02, 1.0)
    assert client._timeout == httpx.Timeout(30.0).as_dict()


def _stepped(next_observation: dict[str, Any], status: int = 200, **payload: Any) -> Any:
    answer = {"step_id": 2, "next_observation": next_observation, "model_metadata": {"committed_step_id": 2}}
    server = _Server(lambda _: _json({**answer, **payload}, status=status))
    return server.client(max_retries=0).step("s", 2, ACTION)


def test_a_step_result_carries_reward_end_info_and_metadata() -> None:
    result = _stepped({**OBSERVATION, "reward": 2.5, "terminated": True, "info": {"success": True}})
    assert (result.reward, result.terminated, result.info) == (2.5, True, {"success": True})
    assert result.metadata == {"committed_step_id": 2} and result.replayed is False
    bare = _stepped(OBSERVATION)  # a world that reports no reward, end or info
    assert (bare.reward, bare.terminated, bare.info) == (0.0, False, {})
    assert type(bare.reward) is float and type(bare.terminated) is bool


def test_a_400_is_a_refusal_even_with_a_step_answers_body() -> None:
    with pytest.raises(RolloutRequestError) as refused:
        _stepped(OBSERVATION, status=400)
    assert (refused.value.code, refused.value.status) == ("http_400", 400)
    assert _stepped(OBSERVATION, status=400, replayed=True).replayed  # a replay answers as a step


def test_actions_as_columns_must_be_n_by_8() -> None:
    client = _Server(_unreachable).client()
    for shape in [(8,), (3, 7), (2, 8, 1)]:
        with pytest.raises(
            ValueError, match=r"^actions must be \(N, 8\): 7 joint positions, then the gripper; got "
        ):
            client.batch_step_columns(["s"], [1], np.zeros(shape))


COLUMNS = {  # a JSON columns answer: row 0 refused, row 1 committed now, row 2 replayed
    "session_ids": ["a", "b", "c"],
    "step_ids": [4, 5, 6],
    "status": ["error", "ok", "error"],
    "replayed": [False, False, True],
    "committed_step_ids": [3, 5, 6],
    "errors": [
        {"code": "step_conflict", "message": "at 3"},
        None,
        {"code": "step_conflict", "message": "replay"},
    ],
    "uncertainty": [None, 0.25, 0.5],
    "latency_ms": 7.5,
    "next_observation": {
        "video_latent": base64.b64encode(np.arange(6, dtype="<f4").tobytes()).decode(),
        "shape": [3, 2],
        "reward": [0, 1, 2],  # whole numbers, as a JSON encoder may write them: float64 all the same
        "terminated": [False, True, False],
        "info": [{}, {"success": True}, {}],
        "state": [[0, 1], [2, 3], [4, 5]],
    },
}


def test_a_columns_answer_becomes_typed_columns_and_rows() -> None:
    server = _Server(lambda _: _json(COLUMNS))
    actions = np.full((3, 8), 0.1)  # float64: sent as the float32 values the server steps with
    answer = server.client().batch_step_columns(["a", "b", "c"], [4, 5, 6], actions)
    assert server.seen[0][2]["actions"] == actions.astype(np.float32).tolist()
    assert (answer.session_ids, answer.step_ids, answer.latency_ms) == (["a", "b", "c"], [4, 5, 6], 7.5)
    assert answer.ok.tolist() == [False, True, True] and answer.replayed.tolist() == [False, False, True]
    assert answer.reward.dtype == np.float64 and answer.reward.tolist() == [0.0, 1.0, 2.0]
    assert answer.terminated.dtype == bool and answer.committed_step_ids.dtype == np.int64
    assert answer.ok.dtype == answer.replayed.dtype == bool
    assert answer.state is not None and answer.state.dtype == np.float32
    np.testing.assert_array_equal(answer.state, [[0, 1], [2, 3], [4, 5]])
    np.testing.assert_array_equal(answer.observation, np.arange(6).reshape(3, 2))
    assert answer.uncertainty == [None, 0.25, 0.5] and answer.info[1] == {"success": True}
    refused = answer.errors[0]
    assert refused is not None and answer.errors[1:] == [None, None]  # a replayed row is a result
    assert (refused.code, refused.message, refused.committed_step_id) == ("step_conflict", "at 3", 3)
    rows = answer.results()
    assert rows[0] is refused
    ok, again = rows[1], rows[2]
    assert not isinstance(ok, RolloutRequestError) and not isinstance(again, RolloutRequestError)
    assert (ok.step_id, ok.reward, ok.terminated) == (5, 1.0, True)
    assert (ok.committed_step_id, ok.replayed) == (5, False)
    assert ok.info == {"success": True} and ok.metadata == {
        "committed_step_id": 5,
        "uncertainty": 0.25,
        "latency_ms": 7.5,
    }
    assert (again.step_id, again.terminated, again.replayed, again.committed_step_id) == (6, False, True, 6)
    np.testing.assert_array_equal(again.state, [4, 5])


def test_columns_without_state_or_uncertainty_give_rows_without_them() -> None:
    nxt = {k: v for k, v in COLUMNS["next_observation"].items() if k != "state"}
    server = _Server(lambda _: _json({**COLUMNS, "next_observation": nxt, "uncertainty": []}))
    answer = server.client().batch_step_columns(["a", "b", "c"], [4, 5, 6], np.zeros((3, 8)))
    assert answer.state is None
    ok = answer.results()[1]
    assert not isinstance(ok, RolloutRequestError)
    assert ok.state is None and ok.metadata["uncertainty"] is None


def test_a_columns_answer_of_the_wrong_length_is_refused() -> None:
    server = _Server(lambda _: _json({**COLUMNS, "committed_step_ids": [3, 5]}))
    with pytest.raises(ValueError):  # zip(strict=True): a row without its committed step id
        server.client().batch_step_columns(["a", "b", "c"], [4, 5, 6], np.zeros((3, 8)))


def _recording_transport(use_msgpack: bool, seen: list[httpx.Request]) -> httpx.MockTransport:
    """Answers every request with a session's body in the client's codec, and keeps the request."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if not use_msgpack:
            return _json({"session_id": "s", "observation": OBSERVATION, "data": []})
        latent = np.array([0.5, 1.5], np.float32)
        body = packb({"session_id": "s", "observation": {"video_latent": latent, "shape": [2]}, "data": []})
        return httpx.Response(200, content=body, headers={"content-type": MSGPACK})

    return httpx.MockTransport(answer)


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_each_request_asks_for_the_clients_codec_and_carries_its_timeout(use_msgpack: bool) -> None:
    seen: list[httpx.Request] = []
    client = RolloutClient(
        "http://world",
        use_msgpack=use_msgpack,
        timeout_s=2.5,
        transport=_recording_transport(use_msgpack, seen),
    )
    client.models()  # no body
    client.create_session("m", seed=1, session_id="s")  # a body
    codec = MSGPACK if use_msgpack else "application/json"
    assert [r.headers.get("accept") for r in seen] == [codec, codec]
    assert [r.headers.get("content-type") for r in seen] == [None, codec]
    assert [r.extensions.get("timeout") for r in seen] == [httpx.Timeout(2.5).as_dict()] * 2
    sent = unpackb(seen[1].content) if use_msgpack else json.loads(seen[1].content)
    assert sent == {"model": "m", "seed": 1, "session_id": "s"}


def test_msgpack_columns_carry_the_actions_as_one_float32_tensor() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=packb(COLUMNS), headers={"content-type": MSGPACK})

    client = RolloutClient("http://world", transport=httpx.MockTransport(answer), max_retries=0)
    answer_columns = client.batch_step_columns(["a", "b", "c"], [4, 5, 6], np.arange(24.0).reshape(3, 8))
    assert answer_columns.step_ids == [4, 5, 6]
    actions = unpackb(seen[0].content)["actions"]  # one tensor on the wire, not 3 lists of 8 floats
    assert isinstance(actions, np.ndarray) and actions.dtype == np.float32 and actions.shape == (3, 8)
    np.testing.assert_array_equal(actions, np.arange(24).reshape(3, 8))


def test_an_observation_without_a_state_decodes_to_none_and_a_tensor_to_float32() -> None:
    observed = rollout_client.decode_observation(OBSERVATION)
    assert observed.state is None and observed.images is None
    packed = unpack_reply(packb({"video_latent": np.array([[0.25, -2.0]], np.float64), "shape": [1, 2]}))
    tensor = rollout_client.decode_tensor_field(packed)
    assert tensor.dtype == np.float32 and tensor.flags.writeable
    np.testing.assert_array_equal(tensor, [[0.25, -2.0]])


def test_a_refusal_whose_body_is_no_json_reads_as_http_error_with_the_pages_start() -> None:
    page = "<html>not found: " + "x" * 300  # a proxy's page, not the server's body
    server = _Server(lambda _: httpx.Response(404, text=page))
    with pytest.raises(RolloutRequestError) as refused:
        server.client(max_retries=0).status("s")
    assert (refused.value.code, refused.value.status) == ("http_error", 404)
    assert str(refused.value) == "http_error: " + page[:200]


@pytest.mark.parametrize(("status", "page"), [(502, b""), (500, b"upstream died")])
def test_a_proxy_failure_that_outlasts_the_retries_names_its_status_and_request(
    status: int, page: bytes
) -> None:
    attempts: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        return httpx.Response(status, content=page)  # no content type: a bare page

    client = RolloutClient(
        "http://world", use_msgpack=False, max_retries=1, backoff_s=0.0, transport=httpx.MockTransport(answer)
    )
    with pytest.raises(httpx.RemoteProtocolError, match=rf"^upstream answered {status}$") as failed:
        client.status("s")
    assert len(attempts) == 2 and failed.value.request is attempts[-1]


def test_a_batch_answered_with_another_number_of_results_is_a_bad_response() -> None:
    one = {"step_id": 1, "next_observation": OBSERVATION, "model_metadata": {"committed_step_id": 1}}
    server = _Server(lambda _: _json({"object": "batch_step", "results": [one]}))
    calls = [rollout_client.StepCall("a", 1, ACTION), rollout_client.StepCall("b", 1, ACTION)]
    with pytest.raises(RolloutRequestError) as refused:
        server.client(max_retries=0).batch_step(calls)
    assert str(refused.value) == "bad_response: the server answered 1 results for 2 items"
    columns = _Server(lambda _: _json(COLUMNS))  # 3 rows, consistent among themselves
    with pytest.raises(RolloutRequestError) as refused:
        columns.client(max_retries=0).batch_step_columns(["a", "b"], [4, 5], np.zeros((2, 8)))
    assert str(refused.value) == "bad_response: the server answered 3 results for 2 items"
    assert len(server.client().batch_step(calls[:1])) == 1  # the count that matches is read
