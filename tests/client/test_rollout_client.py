"""RolloutClient against a real server: sessions, steps, replays after lost replies, batch_step, errors."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from rollserve.client.rollout_client import RolloutClient, RolloutRequestError, StepCall
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

ACTION = np.array([0.2] * 7 + [0.5], dtype=np.float32)


@pytest.fixture(scope="module", params=["vllm-omni", "strict"])
def mode(request) -> str:
    """Every client behaviour must hold under both status-code modes of the server."""
    return request.param


@pytest.fixture(scope="module")
def url(mode: str):
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes=mode)
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        yield server.http_url


class LoseNextReply(httpx.BaseTransport):
    """Delivers the request, then drops the reply once (the server did the work; the client never hears)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.armed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if self.armed and request.url.path.endswith("/step"):
            self.armed = False
            response.read()
            response.close()
            raise httpx.ReadError("connection reset while reading the reply", request=request)
        return response


@pytest.mark.parametrize("use_msgpack", [True, False])
def test_step_reset_fork_close(url: str, use_msgpack: bool) -> None:
    with RolloutClient(url, use_msgpack=use_msgpack) as client:
        assert client.world()["id"] == "toy"
        sid, obs0 = client.create_session("toy", seed=3)
        assert obs0.shape == (15,) and obs0.dtype == np.float32
        first = client.step(sid, 0, ACTION)
        assert first.committed_step_id == 0 and not first.replayed
        np.testing.assert_allclose(first.observation[:7], obs0[:7] + 0.5 * (0.2 - obs0[:7]), rtol=1e-6)
        branch = client.fork(sid)
        a, b = client.step(sid, 1, ACTION), client.step(branch, 1, ACTION)
        np.testing.assert_array_equal(a.observation, b.observation)
        np.testing.assert_array_equal(client.reset(sid, seed=3), obs0)
        assert client.status(sid)["committed_step_id"] == -1
        client.close_session(sid)
        client.close_session(sid)
        assert client.status(sid)["closed"]


def test_a_lost_reply_is_recovered_without_applying_the_step_twice(url: str) -> None:
    lossy = LoseNextReply()
    with RolloutClient(url, transport=lossy, backoff_s=0.0) as client, RolloutClient(url) as clean:
        sid, _ = client.create_session("toy", seed=8)
        twin, _ = clean.create_session("toy", seed=8)
        client.step(sid, 0, ACTION)
        lossy.armed = True
        got = client.step(sid, 1, -ACTION)
        assert got.replayed and client.retries == 1
        clean.step(twin, 0, ACTION)
        want = clean.step(twin, 1, -ACTION)
        np.testing.assert_array_equal(got.observation, want.observation)
        status = client.status(sid)
        assert (status["committed_step_id"], status["context_length"]) == (1, 2)


def test_refusals_raise_typed_errors(url: str, mode: str) -> None:
    with RolloutClient(url) as client:
        sid, _ = client.create_session("toy")
        with pytest.raises(RolloutRequestError) as err:
            client.step(sid, 4, ACTION)
        assert err.value.code == "step_out_of_order" and err.value.status == {"strict": 409}.get(mode, 400)
        assert err.value.committed_step_id == -1
        with pytest.raises(RolloutRequestError) as err:
            client.create_session("nope")
        assert err.value.code == "model_not_found" and err.value.status == {"strict": 404}.get(mode, 400)
        with pytest.raises(RolloutRequestError) as err:
            client.status("ghost")
        assert (err.value.code, err.value.status) == ("session_not_found", 404)
        assert err.value.committed_step_id == -1
        client.close_session(sid)
        with pytest.raises(RolloutRequestError) as err:
            client.reset(sid)
        assert (err.value.code, err.value.status) == ("session_closed", 410)
        with pytest.raises(ValueError, match="8 values"):
            client.step(sid, 0, [0.0] * 7)


class FailingWorld(ToyWorld):
    def step_batch(self, steps):
        return [RuntimeError("out of memory") for _ in steps]


def test_a_failed_step_raises_inference_error_in_both_modes(mode: str) -> None:
    """vLLM-Omni mode answers it with 200 and the error in band; the client still raises."""
    settings = ServerSettings(max_batch_wait_ms=0.0, rollout_status_codes=mode)
    app = create_app(settings, rollout=RolloutService(FailingWorld(), settings))
    with serving(app) as server, RolloutClient(server.http_url) as client:
        sid, _ = client.create_session("toy")
        with pytest.raises(RolloutRequestError) as err:
            client.step(sid, 0, ACTION)
        assert err.value.code == "inference_error" and err.value.status == {"strict": 500}.get(mode, 200)
        assert err.value.committed_step_id == -1 and client.status(sid)["committed_step_id"] == -1


def test_batch_step_returns_per_item_results(url: str) -> None:
    with RolloutClient(url) as client:
        sids = [client.create_session("toy", seed=i)[0] for i in range(3)]
        calls = [StepCall(s, 0, ACTION) for s in sids] + [StepCall("ghost", 0, ACTION)]
        results = client.batch_step(calls)
        assert [type(r).__name__ for r in results] == ["StepResult"] * 3 + ["RolloutRequestError"]
        again = client.batch_step(calls[:3])  # a resent batch replays what it committed
        assert all(r.replayed for r in again)
        for r, s in zip(again, results, strict=False):
            np.testing.assert_array_equal(r.observation, s.observation)


def test_client_modules_import_without_torch_or_the_server_stack() -> None:
    code = (
        "import sys\n"
        "import rollserve.client.rollout_client, rollserve.client.rollout_env\n"
        "bad = [m for m in ('torch', 'fastapi', 'uvicorn', 'pydantic', 'mujoco') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
