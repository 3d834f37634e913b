"""``POST /v1/realtime/batch_step/columns``: the steps of ``batch_step``, sent and answered as columns.

Row ``i`` must behave exactly as the item ``{session_id, step_id, observation: {}, action:
{joint_positions: row[:7], gripper_position: row[7]}}``: the same rule (pinned here by the toy
world's rule, written out in ``toy_rule``), the same exactly-once commit, and the same print, so a
row and that item replay each other whichever came first. A row fails alone, as an item does; a
body wrong as a whole is refused whole. Real server on 127.0.0.1, real HTTP, both body encodings.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator, Sequence

import httpx
import numpy as np
import pytest
from toy_rule import moved

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError, StepCall
from rollserve.client.rollout_env import RolloutVectorEnv
from rollserve.models.world import WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.wire.codec import packb, unpackb

COLUMNS = "/v1/realtime/batch_step/columns"
MSGPACK = "application/msgpack"
STRICT = {"x-rollserve-status-codes": "strict"}
MOST = 6  # the served batch limit (max_batch_items)


class Reporting(ToyWorld):
    """The toy world, reporting more of each step: a state vector (the 8 joint and gripper values),
    an uncertainty (the first action value's magnitude) and an info entry (that value). A step
    whose gripper action is 0.25 answers 14 values instead of 15; and a session may ask for frames
    of its camera (none come: the toy world draws nothing)."""

    spec = dataclasses.replace(ToyWorld.spec, cameras=("front",))

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        outs = super().step_batch(steps)
        return [
            self._more(step, out) if isinstance(out, WorldOutput) else out
            for step, out in zip(steps, outs, strict=True)
        ]

    @staticmethod
    def _more(step: WorldStep, out: WorldOutput) -> WorldOutput:
        first, gripper = (float(v) for v in np.asarray(step.action)[[0, 7]])
        observation = out.observation[:14] if gripper == 0.25 else out.observation
        return dataclasses.replace(
            out,
            observation=observation,
            vector=out.observation[:8],
            uncertainty=abs(first),
            info={"first": first},
        )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = ServerSettings(max_batch_wait_ms=0.0)
    service = RolloutService(Reporting(), settings, max_batch_items=MOST)
    with serving(create_app(settings, rollout=service)) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[RolloutClient]:
    with RolloutClient(url) as rollouts:
        yield rollouts


def sessions(client: RolloutClient, count: int) -> tuple[list[str], list[np.ndarray]]:
    """``count`` new toy sessions (seeds 1, 2, ...) and their start observations."""
    made = [client.create_session("toy", seed=seed) for seed in range(1, count + 1)]
    return [sid for sid, _ in made], [obs for _, obs in made]


def actions(*rows: float) -> np.ndarray:
    """One row per value: the joints to ``value``, the gripper to ``value / 2``."""
    return np.array([[v] * 7 + [v / 2] for v in rows], dtype=np.float32)


def post(http: httpx.Client, body: dict, *, as_msgpack: bool, headers: dict | None = None) -> httpx.Response:
    if as_msgpack:
        sent = {"content-type": MSGPACK, "accept": MSGPACK, **(headers or {})}
        return http.post(COLUMNS, content=packb(body), headers=sent)
    return http.post(COLUMNS, json=body, headers=headers or {})


def answer(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return unpackb(resp.content) if resp.headers["content-type"].startswith(MSGPACK) else resp.json()


def committed(client: RolloutClient, sid: str) -> int:
    return client.status(sid)["committed_step_id"]


def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
    """The toy world clips in float64, ``toy_rule`` in float32: equal to the last float32 bit or so."""
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def reward_of(obs: np.ndarray) -> float:
    return float(-np.linalg.norm(obs[:7] - obs[8:15]))


@pytest.mark.parametrize("as_msgpack", [True, False], ids=["msgpack", "json"])
def test_each_row_steps_its_session_by_the_worlds_rule(
    http: httpx.Client, client: RolloutClient, as_msgpack: bool
) -> None:
    ids, starts = sessions(client, 3)
    first, second = actions(0.2, -0.4, 0.8), actions(0.1, 0.3, -0.2)
    for step, acts in enumerate((first, second)):
        rows = acts if as_msgpack else acts.tolist()
        body = answer(
            post(http, {"session_ids": ids, "step_ids": [step] * 3, "actions": rows}, as_msgpack=as_msgpack)
        )
        assert body["object"] == "batch_step.columns"
        assert body["session_ids"] == ids and body["step_ids"] == [step] * 3
        assert body["status"] == ["ok"] * 3 and body["replayed"] == [False] * 3
        assert body["errors"] == [None] * 3
        assert body["committed_step_ids"] == [step] * 3 and body["context_lengths"] == [step + 1] * 3
    decoded = client.batch_step_columns(ids, [2, 2, 2], actions(0.0, 0.0, 0.0))
    expected = [moved(start, first[i], second[i], actions(0.0)[0]) for i, start in enumerate(starts)]
    assert_near(decoded.observation, np.stack(expected))
    np.testing.assert_allclose(decoded.reward, [reward_of(obs) for obs in expected], rtol=1e-6)
    assert decoded.ok.all() and not decoded.replayed.any() and not decoded.terminated.any()
    assert decoded.committed_step_ids.tolist() == [2, 2, 2]
    assert [committed(client, sid) for sid in ids] == [2, 2, 2]


@pytest.mark.parametrize("as_msgpack", [True, False], ids=["msgpack", "json"])
def test_the_answer_carries_each_rows_observation_in_one_tensor(
    http: httpx.Client, client: RolloutClient, as_msgpack: bool
) -> None:
    ids, starts = sessions(client, 2)
    acts = actions(0.6, -0.4)
    body = answer(
        post(http, {"session_ids": ids, "step_ids": [0, 0], "actions": acts.tolist()}, as_msgpack=as_msgpack)
    )
    assert body["status"] == ["ok", "ok"]
    seen = body["next_observation"]
    assert seen["shape"] == [2, 15] and seen["dtype"] == "float32"
    if as_msgpack:
        assert seen["encoding"] == "tensor"
        tensor = np.asarray(seen["video_latent"])
    else:
        assert seen["encoding"] == "base64_raw_tensor"
        tensor = np.frombuffer(base64.b64decode(seen["video_latent"]), dtype="<f4").reshape(seen["shape"])
    assert_near(tensor, np.stack([moved(s, a) for s, a in zip(starts, acts, strict=True)]))
    assert seen["terminated"] == [False, False]
    assert seen["info"] == [{"first": float(acts[0, 0])}, {"first": float(acts[1, 0])}]
    state = np.asarray(seen["state"], dtype=np.float32)  # msgpack: a tensor; JSON: lists
    assert state.shape == (2, 8)
    np.testing.assert_array_equal(state, tensor[:, :8])
    np.testing.assert_allclose(seen["reward"], [reward_of(obs) for obs in tensor], rtol=1e-6)
    assert body["uncertainty"] == [float(abs(acts[0, 0])), float(abs(acts[1, 0]))]


def test_a_resent_batch_replays_and_rows_and_items_replay_each_other(client: RolloutClient) -> None:
    ids, starts = sessions(client, 2)
    acts = actions(0.3, -0.3)
    done = client.batch_step_columns(ids, [0, 0], acts)
    again = client.batch_step_columns(ids, [0, 0], acts)  # a lost reply, resent: nothing runs twice
    assert again.ok.all() and again.replayed.all()
    np.testing.assert_array_equal(again.observation, done.observation)
    assert again.state is not None and done.state is not None
    np.testing.assert_array_equal(again.state, done.state)
    np.testing.assert_array_equal(again.reward, done.reward)
    assert again.info == done.info == [{"first": float(acts[0, 0])}, {"first": float(acts[1, 0])}]
    assert again.uncertainty == done.uncertainty == [float(abs(acts[0, 0])), float(abs(acts[1, 0]))]
    assert [r.metadata["uncertainty"] for r in again.results()] == done.uncertainty
    assert [r.replayed for r in again.results()] == [True, True]
    assert [r.state.tolist() for r in again.results()] == done.state.tolist()  # type: ignore[union-attr]
    assert [committed(client, sid) for sid in ids] == [0, 0]
    # the same step as an item (batch_step and /step) is the duplicate it is
    items = client.batch_step([StepCall(sid, 0, acts[i]) for i, sid in enumerate(ids)])
    assert all(not isinstance(r, Exception) and r.replayed for r in items)
    np.testing.assert_array_equal(np.stack([r.observation for r in items]), done.observation)  # type: ignore[union-attr]
    assert client.step(ids[0], 0, acts[0]).replayed
    # and a step committed as an item replays as a row
    nxt = actions(0.9, 0.1)
    stepped = [client.step(sid, 1, nxt[i]) for i, sid in enumerate(ids)]
    rows = client.batch_step_columns(ids, [1, 1], nxt)
    assert rows.ok.all() and rows.replayed.all()
    np.testing.assert_array_equal(rows.observation, np.stack([r.observation for r in stepped]))
    assert_near(rows.observation[0], moved(starts[0], acts[0], nxt[0]))
    # a different action under a committed id is refused, not replayed: a zero row
    other = client.batch_step_columns(ids, [1, 1], actions(0.9, 0.2))
    assert other.ok.tolist() == [True, False] and other.replayed.tolist() == [True, False]
    error = other.errors[1]
    assert isinstance(error, RolloutRequestError) and error.code == "step_already_committed"
    assert "differs" in error.message and error.committed_step_id == 1
    assert not other.observation[1].any()
    assert [committed(client, sid) for sid in ids] == [1, 1]


def test_a_row_fails_alone(client: RolloutClient) -> None:
    ids, starts = sessions(client, 4)
    rows = actions(0.2, 0.2, 0.2, 0.2, 0.4, 0.2)
    rows[3, 2] = np.nan
    sent = [ids[0], "no-such-session", ids[1], ids[2], ids[0], ids[3]]
    step_ids = [0, 0, 5, 0, 0, 0]
    out = client.batch_step_columns(sent, step_ids, rows)
    assert out.ok.tolist() == [True, False, False, False, False, True]
    assert out.session_ids == sent and out.step_ids == step_ids
    first = float(np.float32(0.2))
    assert not out.terminated.any() and out.info == [{"first": first}, {}, {}, {}, {}, {"first": first}]
    codes = [None if e is None else e.code for e in out.errors]
    assert codes == [
        None,
        "session_not_found",
        "step_out_of_order",
        "invalid_request",
        "invalid_request",
        None,
    ]
    messages = [None if e is None else e.message for e in out.errors]
    assert messages[3] == "actions[3] must be finite and within float32 range"
    assert "only once per batch_step" in messages[4]
    assert out.errors[4].committed_step_id == 0  # type: ignore[union-attr]  # answered last: after row 0
    assert not out.observation[1:5].any() and out.reward[1:5].tolist() == [0.0] * 4
    assert_near(out.observation[0], moved(starts[0], rows[0]))
    assert_near(out.observation[5], moved(starts[3], rows[5]))
    assert [committed(client, sid) for sid in ids] == [0, -1, -1, 0]


def test_an_observation_of_another_shape_commits_nothing(client: RolloutClient) -> None:
    ids, _ = sessions(client, 2)
    rows = np.array([[0.1] * 7 + [0.25], [0.1] * 7 + [0.5]], dtype=np.float32)  # row 0: 14 values back
    out = client.batch_step_columns(ids, [0, 0], rows)
    assert out.ok.tolist() == [False, True]
    assert out.errors[0] is not None and out.errors[0].code == "inference_error"
    assert "shape [15]" in out.errors[0].message
    assert [committed(client, sid) for sid in ids] == [-1, 0]
    # the same step as an item commits (an item's observation may have any shape) ...
    (item,) = client.batch_step([StepCall(ids[0], 0, rows[0])])
    assert not isinstance(item, Exception) and item.observation.shape == (14,)
    # ... and its duplicate as a row is refused, not replayed: the stored result has no place there
    again = client.batch_step_columns(ids[:1], [0], rows[:1])
    assert again.ok.tolist() == [False] and again.replayed.tolist() == [False]
    assert again.errors[0] is not None and again.errors[0].code == "step_already_committed"
    assert "resend it as a batch_step item" in again.errors[0].message
    (replayed,) = client.batch_step([StepCall(ids[0], 0, rows[0])])
    assert not isinstance(replayed, Exception) and replayed.replayed


def test_a_rendering_session_steps_by_items_only(client: RolloutClient) -> None:
    (plain, _), (rendering, _) = (
        client.create_session("toy", seed=1),
        client.create_session("toy", seed=2, render={"cameras": ["front"], "height": 16, "width": 16}),
    )
    out = client.batch_step_columns([plain, rendering], [0, 0], actions(0.2, 0.2))
    assert out.ok.tolist() == [True, False]
    assert out.errors[1] is not None and out.errors[1].code == "invalid_request"
    assert "rendering session" in out.errors[1].message and "batch_step items" in out.errors[1].message
    assert [committed(client, sid) for sid in (plain, rendering)] == [0, -1]
    (item,) = client.batch_step([StepCall(rendering, 0, actions(0.2)[0])])
    assert not isinstance(item, Exception) and item.committed_step_id == 0


@pytest.mark.parametrize("as_msgpack", [True, False], ids=["msgpack", "json"])
@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"step_ids": [0]}, "one entry per session"),
        ({"actions": [[0.1] * 8]}, "one entry per session"),
        ({"actions": [[0.1] * 7, [0.1] * 7]}, "rows of 8 numbers"),
        ({"actions": [[0.1] * 7 + [True], [0.1] * 8]}, "rows of 8 numbers"),
        ({"actions": [["0.1"] * 8, [0.1] * 8]}, "rows of 8 numbers"),
        ({"step_ids": [True, 0]}, "step_ids.0"),
        ({"step_ids": [-1, 0]}, "step_ids.0"),
        ({"session_ids": ["a b", "c"]}, "session_ids.0"),
        ({"session_ids": [], "step_ids": [], "actions": []}, "session_ids"),
        ({"session_ids": [f"s{i}" for i in range(MOST + 1)]}, f"at most {MOST} items"),
    ],
    ids=[
        "short step_ids",
        "short actions",
        "7 values",
        "a bool",
        "strings",
        "bool step_id",
        "negative step_id",
        "bad session id",
        "empty",
        "too many rows",
    ],
)
def test_a_body_wrong_as_a_whole_is_refused_whole(
    http: httpx.Client, client: RolloutClient, change: dict, words: str, as_msgpack: bool
) -> None:
    ids, _ = sessions(client, 2)
    body = {"session_ids": ids, "step_ids": [0, 0], "actions": [[0.1] * 8] * 2, **change}
    resp = post(http, body, as_msgpack=as_msgpack, headers=STRICT)
    assert resp.status_code == 422, resp.text
    error = (unpackb(resp.content) if as_msgpack else resp.json())["error"]
    assert error["code"] == "invalid_request" and words in error["message"]
    assert [committed(client, sid) for sid in ids] == [-1, -1]
    vllm = post(http, body, as_msgpack=False)  # vLLM-Omni's codes, the default: 400
    assert vllm.status_code == 400 and vllm.json()["error"]["reason"] == "invalid_request"


@pytest.mark.parametrize("column", ["step_ids", "actions"])
def test_a_long_column_is_refused_before_its_rows_are_validated(
    http: httpx.Client, client: RolloutClient, column: str
) -> None:
    ids, _ = sessions(client, 2)
    long = {"step_ids": [0] * 100_000, "actions": [[0.0] * 8] * 10_000}[column]  # (a tensor is one value)
    body = {"session_ids": ids, "step_ids": [0, 0], "actions": np.zeros((2, 8), np.float32), column: long}
    resp = post(http, body, as_msgpack=True, headers=STRICT)
    assert resp.status_code == 422
    assert unpackb(resp.content)["error"]["message"] == f"batch_step takes at most {MOST} items"
    assert [committed(client, sid) for sid in ids] == [-1, -1]


def test_integers_stand_for_floats_as_in_items(http: httpx.Client, client: RolloutClient) -> None:
    ids, starts = sessions(client, 1)
    body = answer(
        post(
            http,
            {"session_ids": ids, "step_ids": [0], "actions": [[1, 0, 0, 0, 0, 0, 0, 1]]},
            as_msgpack=False,
        )
    )
    assert body["status"] == ["ok"]
    item = client.step(ids[0], 0, np.array([1, 0, 0, 0, 0, 0, 0, 1], dtype=np.float32))
    assert item.replayed  # the same print as the item with 1.0 and 0.0
    assert_near(item.observation, moved(starts[0], np.array([1.0] + [0.0] * 6 + [1.0])))


def test_the_vector_env_steps_by_columns(url: str) -> None:
    seen: list[str] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request.url.path)
            return super().handle_request(request)

    venv = RolloutVectorEnv(3, client=RolloutClient(url, transport=Recording()))
    try:
        start, _ = venv.reset(seed=7)
        acts = actions(0.1, 0.2, 0.3)
        obs, rewards, terminated, truncated, _ = venv.step(acts)
        expected = np.stack([moved(start[i], acts[i]) for i in range(3)])
        assert_near(obs, expected)
        np.testing.assert_allclose(rewards, [reward_of(o) for o in expected], rtol=1e-6)
        assert not terminated.any() and not truncated.any()
    finally:
        venv.close()
    assert seen.count(COLUMNS) == 1 and "/v1/realtime/batch_step" not in seen
