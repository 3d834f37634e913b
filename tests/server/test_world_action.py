"""World-action models over real HTTP: a world with the reference policy acts on an empty Action().

The chosen action is checked independently: the same action sent explicitly to the plain simulator
gives the same next observation, and an episode driven only by empty actions reaches the goal.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from rollserve.cli import main as cli_main
from rollserve.client.rollout_client import RolloutClient, RolloutRequestError
from rollserve.models.checkpoint import load_default
from rollserve.models.sim_world import SimWorld
from rollserve.models.world_action import ActingWorld
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings
from rollserve.sim.layout import MAX_EPISODE_STEPS

SETTINGS = ServerSettings(max_batch_wait_ms=0.0)


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    return load_default()


@pytest.fixture(scope="module")
def acting(policy):
    world = ActingWorld(SimWorld(), policy)
    with serving(create_app(SETTINGS, rollout=RolloutService(world, SETTINGS))) as server:
        yield server.http_url


@pytest.fixture(scope="module")
def plain():
    with serving(create_app(SETTINGS, rollout=RolloutService(SimWorld(), SETTINGS))) as server:
        yield server.http_url


def test_an_empty_action_lets_the_world_act_and_it_applies_the_action_it_returns(acting, plain) -> None:
    with RolloutClient(acting) as world, RolloutClient(plain, use_msgpack=False) as sim:
        assert world.world("sim")["acts"] is True and sim.world("sim")["acts"] is False
        sid, obs = world.create_session("sim", seed=5)
        twin, twin_obs = sim.create_session("sim", seed=5)
        np.testing.assert_array_equal(obs, twin_obs)
        for t in range(12):  # more than one chunk (8 actions are played per chunk)
            got = world.step(sid, t, None)
            assert got.actions is not None and got.actions.shape == (1, 8)
            assert np.all(np.isfinite(got.actions))
            want = sim.step(twin, t, got.actions[0])
            np.testing.assert_array_equal(got.observation, want.observation)
            assert got.reward == want.reward and want.actions is None
        assert world.status(sid)["committed_step_id"] == 11


def test_empty_action_json_body_as_vllm_omni_clients_send_it(acting) -> None:
    with httpx.Client(base_url=acting) as http:
        sid = http.post("/v1/realtime/sessions", json={"model": "sim", "seed": 1}).json()["session_id"]
        step = {"step_id": 0, "observation": {"state": [0.0] * 8, "prompt": "pick"}, "action": {}}
        resp = http.post(f"/v1/realtime/sessions/{sid}/step", json=step)
        assert resp.status_code == 200, resp.text
        nxt = resp.json()["next_observation"]
        assert np.asarray(nxt["actions"]).shape == (1, 8)
        assert nxt["shape"] == [13] and nxt["dtype"] == "float32"


def test_the_chosen_actions_are_deterministic_replayable_and_forkable(acting) -> None:
    with RolloutClient(acting) as world:
        a, _ = world.create_session("sim", seed=9)
        b, _ = world.create_session("sim", seed=9)
        first = [world.step(a, t, None) for t in range(5)]
        again = world.step(a, 4, None)  # the reply was lost: the resend is the stored result
        assert again.replayed
        np.testing.assert_array_equal(again.actions, first[-1].actions)
        np.testing.assert_array_equal(again.observation, first[-1].observation)
        fork = world.fork(a)  # mid-chunk: the fork inherits the rest of the plan
        rest = {sid: [world.step(sid, t, None) for t in range(5, 10)] for sid in (a, fork)}
        twin = [world.step(b, t, None) for t in range(10)]
        for ours, theirs in zip(first + rest[a], twin, strict=True):
            np.testing.assert_array_equal(ours.actions, theirs.actions)
            np.testing.assert_array_equal(ours.observation, theirs.observation)
        for ours, forked in zip(rest[a], rest[fork], strict=True):
            np.testing.assert_array_equal(ours.actions, forked.actions)


def test_an_episode_driven_only_by_empty_actions_reaches_the_goal(acting) -> None:
    with RolloutClient(acting) as world:
        sid, _ = world.create_session("sim", seed=100_000)
        for t in range(MAX_EPISODE_STEPS):
            result = world.step(sid, t, None)
            if result.terminated:
                break
        assert result.terminated, "the reference policy acting inside the world should finish the task"


def test_an_explicit_action_is_applied_as_given(acting, plain) -> None:
    action = np.array([0.1, -0.2, 0.0, -1.8, 0.0, 1.6, 0.7, 0.02], np.float32)
    with RolloutClient(acting) as world, RolloutClient(plain) as sim:
        sid, _ = world.create_session("sim", seed=3)
        twin, _ = sim.create_session("sim", seed=3)
        got, want = world.step(sid, 0, action), sim.step(twin, 0, action)
        assert got.actions is None
        np.testing.assert_array_equal(got.observation, want.observation)
        after = world.step(sid, 1, None)  # the world takes over again from the new state
        assert after.actions is not None


@pytest.mark.parametrize(("mode", "status"), [("vllm-omni", 400), ("strict", 422)])
def test_a_world_without_a_policy_refuses_an_empty_action(plain, mode: str, status: int) -> None:
    with httpx.Client(base_url=plain, headers={"X-Rollserve-Status-Codes": mode}) as http:
        sid = http.post("/v1/realtime/sessions", json={"model": "sim"}).json()["session_id"]
        resp = http.post(
            f"/v1/realtime/sessions/{sid}/step", json={"step_id": 0, "observation": {}, "action": {}}
        )
        assert resp.status_code == status
        error = resp.json()["error"]
        assert error["code"] == "invalid_request" and "--world-policy" in error["message"]
        assert resp.json()["model_metadata"]["committed_step_id"] == -1


class BrokenPolicy:
    """The toy policy's shape, but its model call fails (as a GPU error would)."""

    def __init__(self) -> None:
        from rollserve.models.simple_policies import chunk_policy

        inner = chunk_policy(state_dim=15, action_dim=8, chunk_size=4)
        self.metadata = inner.metadata
        self.make_processors = inner.make_processors

    def predict_action_chunk(self, batch, **kwargs):
        raise RuntimeError("CUDA error: out of memory")


def test_a_failed_policy_call_commits_nothing() -> None:
    service = RolloutService(ActingWorld(ToyWorld(), BrokenPolicy(), execute=4), SETTINGS)
    with serving(create_app(SETTINGS, rollout=service)) as server, RolloutClient(server.http_url) as client:
        sid, _ = client.create_session("toy", seed=0)
        with pytest.raises(RolloutRequestError) as err:
            client.step(sid, 0, None)
        assert err.value.code == "inference_error" and "out of memory" in err.value.message
        status = client.status(sid)
        assert (status["committed_step_id"], status["context_length"]) == (-1, 0)
        moved = client.step(sid, 0, np.zeros(8, np.float32))  # an explicit action still steps
        assert moved.committed_step_id == 0


def test_mismatched_policy_is_refused_at_startup(policy) -> None:
    with pytest.raises(ValueError, match="13-value state"):
        ActingWorld(ToyWorld(), policy)


def test_world_policy_specs(policy) -> None:
    from rollserve.models.flow_policy import FlowMatchingPolicy
    from rollserve.server.launch import _world_policy

    assert _world_policy(None, None) is None
    assert isinstance(_world_policy("reference", None), FlowMatchingPolicy)
    assert isinstance(_world_policy("rollserve.models.checkpoint:load_default", None), FlowMatchingPolicy)
    with pytest.raises(ValueError, match="needs --policy"):
        _world_policy("served", None)


def test_serve_a_world_acting_with_the_served_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rollserve serve --policy ... --world sim --world-policy served`: one policy, two uses."""
    assert cli_main(["serve", "--world", "sim", "--world-policy", "served", "--port", "0"]) == 2
    assert "--world-policy served needs --policy" in capsys.readouterr().err
    command = [
        *(sys.executable, "-m", "rollserve.cli", "serve", "--port", "0"),
        *(
            "--policy",
            "rollserve.models.checkpoint:load_default",
            "--world",
            "sim",
            "--world-policy",
            "served",
        ),
    ]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        line = lines.get(timeout=90)
        assert "acts by itself" in line
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]
        with RolloutClient(f"http://127.0.0.1:{port}") as client:
            sid, _ = client.create_session("sim", seed=2)
            assert client.step(sid, 0, None).actions.shape == (1, 8)  # type: ignore[union-attr]
            assert [m["kind"] for m in client.models()] == ["policy", "world"]
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_batch_step_plans_each_acting_session_with_its_own_policy_call() -> None:
    from rollserve.client.rollout_client import StepCall
    from rollserve.models.simple_policies import chunk_policy

    policy = chunk_policy(state_dim=15, action_dim=8, chunk_size=4)
    service = RolloutService(ActingWorld(ToyWorld(), policy, execute=4), SETTINGS)
    with serving(create_app(SETTINGS, rollout=service)) as server, RolloutClient(server.http_url) as client:
        sids = [client.create_session("toy", seed=i)[0] for i in range(4)]
        calls = [StepCall(sid, 0, None) for sid in sids] + [StepCall("ghost", 0, None)]
        results = client.batch_step(calls)
        assert policy.batch_sizes == [1, 1, 1, 1]  # one call per session: a batch never changes a plan
        assert all(r.actions is not None and r.actions.shape == (1, 8) for r in results[:4])  # type: ignore[union-attr]
        assert isinstance(results[4], RolloutRequestError) and results[4].code == "session_not_found"
        client.batch_step([StepCall(sid, 1, None) for sid in sids])
        assert policy.batch_sizes == [1, 1, 1, 1]  # the next three actions come from the stored plans


def test_the_learned_world_acts_too(policy) -> None:
    from rollserve.models.worlds import load_world

    acting = RolloutService(ActingWorld(load_world("learned"), policy), SETTINGS)
    plain = RolloutService(load_world("learned"), SETTINGS)
    with (
        serving(create_app(SETTINGS, rollout=acting)) as a,
        serving(create_app(SETTINGS, rollout=plain)) as p,
        RolloutClient(a.http_url) as world,
        RolloutClient(p.http_url) as model,
    ):
        sid, _ = world.create_session("learned", seed=4)
        twin, _ = model.create_session("learned", seed=4)
        for t in range(3):
            got = world.step(sid, t, None)
            want = model.step(twin, t, got.actions[0])  # type: ignore[index]
            np.testing.assert_array_equal(got.observation, want.observation)
