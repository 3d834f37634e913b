"""The gymnasium client's rules that its first mutation run (`rollout_env` in tools/mutation.py)
found unchecked: the spaces built from a world's ``/v1/models`` entry (bounds, frame sizes,
cameras), the default episode length, the render metadata, the constructor's refusals, who closes
the client, the seeds of unseeded resets and autoresets, episode ends (terminated is not
truncated), the vector env's batched spaces, and the refusals of a session that does not answer
as it should.

Real server with the toy world (ending an episode when the gripper is commanded fully closed) for
what a server can show; a fake client only where no real server answers so (a world entry
without an episode length, a restart refused for another reason than a lost session, a rendering
session answering without frames). Expected values are computed here from the toy world's rule.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
from ending_toy_world import go, serving_ending_toy_world
from toy_rule import moved

from rollserve.client.rollout_client import (
    Observed,
    RolloutClient,
    RolloutRequestError,
)
from rollserve.client.rollout_env import (
    RolloutEnv,
    RolloutVectorEnv,
    pixel_spaces_of,
    render_metadata,
    spaces_of,
)
from rollserve.models.worlds import ToyWorld
from rollserve.server.app import create_app
from rollserve.server.rollout.service import RolloutService
from rollserve.server.running import serving
from rollserve.server.settings import ServerSettings

TOY_EPISODE = 50  # ToyWorld.spec.max_episode_steps, as /v1/models publishes it


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving_ending_toy_world() as served:
        yield served


END = go(1.0)  # gripper fully closed: the episode terminates


def toy_start(seed: int) -> np.ndarray:
    """The toy world's first observation from ``seed`` (its rule, written out here)."""
    rng = np.random.default_rng(seed)
    joints, target = rng.uniform(-0.5, 0.5, 7), rng.uniform(-0.9, 0.9, 7)
    return np.concatenate([joints, [0.0], target]).astype(np.float32)


def drawn_seed(seed: int, draws: int = 1) -> int:
    """The ``draws``-th seed drawn after a reset seeded ``seed`` (gymnasium's ``np_random``)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    return [int(rng.integers(2**31)) for _ in range(draws)][-1]


def assert_near(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def two_env_vector(*args: Any, **kwargs: Any) -> RolloutVectorEnv:
    return RolloutVectorEnv(2, *args, **kwargs)


BOTH = pytest.mark.parametrize("make", [RolloutEnv, two_env_vector], ids=["env", "vector"])


# -- spaces and metadata from a /v1/models entry -------------------------------------------------


def test_a_layout_without_bounds_is_an_unbounded_float32_box() -> None:
    observation, action = spaces_of(
        {"observation": {"shape": [2, 3]}, "action": {"shape": [4], "low": 0.0, "high": [1, 2, 3, 4]}}
    )
    assert observation.shape == (2, 3) and observation.dtype == np.float32
    assert np.all(observation.low == -np.inf) and np.all(observation.high == np.inf)
    assert action.shape == (4,) and action.dtype == np.float32
    np.testing.assert_array_equal(action.low, np.zeros(4, np.float32))  # a scalar bound, broadcast
    np.testing.assert_array_equal(action.high, np.array([1, 2, 3, 4], np.float32))


def test_published_bounds_become_float32_boxes_without_a_precision_warning() -> None:
    """Bounds arrive as JSON floats (float64): they are made float32 before the ``Box`` is, which
    warns when it has to lower a bound's precision itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, action = spaces_of(
            {"observation": {"shape": [1]}, "action": {"shape": [2], "low": [0.1, -0.3], "high": 0.7}}
        )
    np.testing.assert_array_equal(action.low, np.array([0.1, -0.3], np.float32))
    np.testing.assert_array_equal(action.high, np.full(2, 0.7, np.float32))


CAMERA_ENTRY: dict[str, Any] = {
    "id": "w",
    "cameras": ["left", "right"],
    "state": {"shape": [3], "low": [-1, -2, -3], "high": [1, 2, 3]},
    "action": {"shape": [2]},
    "observation": {"shape": [5]},
}


def test_pixel_spaces_default_to_64_by_64_frames_of_every_camera() -> None:
    observation, action = pixel_spaces_of(CAMERA_ENTRY, {})
    assert set(observation["images"].spaces) == {"left", "right"}
    for image in observation["images"].spaces.values():
        assert image.shape == (64, 64, 3) and image.dtype == np.uint8
        assert np.all(image.low == 0) and np.all(image.high == 255)
    state = observation["state"]
    np.testing.assert_array_equal(state.low, [-1, -2, -3])
    np.testing.assert_array_equal(state.high, [1, 2, 3])
    assert action.shape == (2,)


def test_pixel_spaces_take_the_sessions_size_and_cameras_unless_the_world_fixes_the_size() -> None:
    render = {"cameras": ["right"], "height": 24, "width": 40}
    observation, _ = pixel_spaces_of(CAMERA_ENTRY, render)
    assert list(observation["images"].spaces) == ["right"]
    assert observation["images"]["right"].shape == (24, 40, 3)
    fixed, _ = pixel_spaces_of({**CAMERA_ENTRY, "frame_size": [16, 32]}, render)
    assert fixed["images"]["right"].shape == (16, 32, 3)  # (height, width) as the world publishes


def test_pixel_spaces_of_a_world_without_cameras_are_refused() -> None:
    with pytest.raises(ValueError, match="world 'w' does not render camera frames"):
        pixel_spaces_of({**CAMERA_ENTRY, "cameras": []}, {})


def test_render_metadata_names_the_fps_and_the_first_camera_of_the_session() -> None:
    entry = {**CAMERA_ENTRY, "fps": 12}
    assert render_metadata(entry, None, None) == ({"render_modes": []}, None)
    assert render_metadata(entry, {}, None) == ({"render_modes": ["rgb_array"], "render_fps": 12.0}, None)
    assert render_metadata(entry, {}, "rgb_array")[1] == "left"
    assert render_metadata(entry, {"cameras": ["right", "left"]}, "rgb_array")[1] == "right"
    without_fps = render_metadata(CAMERA_ENTRY, {}, "rgb_array")
    assert without_fps == ({"render_modes": ["rgb_array"]}, "left")


# -- constructing and closing ----------------------------------------------------------------------


@BOTH
def test_an_env_needs_a_url_or_a_client_and_says_so_in_these_words(make: Any) -> None:
    with pytest.raises(ValueError, match=r"^give base_url or client$"):
        make()


@BOTH
def test_an_unknown_world_is_refused(url: str, make: Any) -> None:
    with pytest.raises(RolloutRequestError) as refused:
        make(url, model="no-such-world")
    assert refused.value.code == "model_not_found"


def test_a_rendering_env_of_a_world_without_cameras_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="world 'toy' does not render camera frames"):
        RolloutEnv(url, render={})


def test_the_episode_length_defaults_to_the_worlds(url: str) -> None:
    env, venv = RolloutEnv(url), RolloutVectorEnv(2, url)
    try:
        assert env.max_episode_steps == venv.max_episode_steps == TOY_EPISODE
    finally:
        env.close()
        venv.close()


def test_the_vector_envs_spaces_batch_the_worlds(url: str) -> None:
    venv = RolloutVectorEnv(3, url)
    try:
        assert venv.num_envs == 3
        assert venv.single_observation_space.shape == (15,) and venv.single_action_space.shape == (8,)
        assert venv.observation_space.shape == (3, 15) and venv.action_space.shape == (3, 8)
        np.testing.assert_array_equal(venv.action_space.low, np.tile([-1.0] * 7 + [0.0], (3, 1)))
        assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
        assert venv.metadata["render_modes"] == [] and venv.render_mode is None and venv.render() is None
    finally:
        venv.close()


def session_ids(env: RolloutEnv | RolloutVectorEnv) -> list[str | None]:
    if isinstance(env, RolloutEnv):
        return [env.session_id]
    return [session.session_id for session in env._sessions]  # type: ignore[misc]


@BOTH
def test_an_env_closes_the_client_it_made_and_not_one_it_was_given(
    url: str, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[RolloutClient] = []
    real_close = RolloutClient.close

    def close(client: RolloutClient) -> None:
        closed.append(client)
        real_close(client)

    monkeypatch.setattr(RolloutClient, "close", close)
    owning = make(url)
    owning.reset(seed=0)
    owned = session_ids(owning)
    owning.close()
    assert closed == [owning.client]
    with RolloutClient(url) as client:
        env = make(client=client)
        env.reset(seed=0)
        given = session_ids(env)
        env.close()
        assert closed == [owning.client]
        statuses = [client.status(s)["closed_reason"] for s in owned + given]  # type: ignore[arg-type]
        assert statuses == ["closed"] * len(statuses)


# -- seeds -----------------------------------------------------------------------------------------


def test_unseeded_resets_draw_their_seeds_from_the_last_seeded_reset(url: str) -> None:
    env = RolloutEnv(url)
    try:
        np.testing.assert_array_equal(env.reset(seed=5)[0], toy_start(5))
        np.testing.assert_array_equal(env.reset()[0], toy_start(drawn_seed(5)))
        np.testing.assert_array_equal(env.reset()[0], toy_start(drawn_seed(5, draws=2)))
        np.testing.assert_array_equal(env.reset(seed=9)[0], toy_start(9))
        np.testing.assert_array_equal(env.reset()[0], toy_start(drawn_seed(9)))
    finally:
        env.close()


def test_a_vector_reset_reseeds_each_sub_envs_generator(url: str) -> None:
    """A second seeded ``reset`` reseeds every sub-env: its autoresets and unseeded resets draw from
    the new seed, not from the generator of the first."""
    venv = RolloutVectorEnv(2, url, max_episode_steps=1)
    try:
        venv.reset(seed=10)
        obs, _ = venv.reset(seed=20)
        assert venv.np_random_seed == 20  # gymnasium's VectorEnv records an int seed
        np.testing.assert_array_equal(obs, [toy_start(20), toy_start(21)])
        _, _, _, truncated, _ = venv.step(np.stack([go(0.2)] * 2))
        assert truncated.tolist() == [True, True]
        obs, rewards, terminated, truncated, info = venv.step(np.stack([go(0.3)] * 2))  # autoreset
        np.testing.assert_array_equal(obs, [toy_start(drawn_seed(20)), toy_start(drawn_seed(21))])
        assert not rewards.any() and not terminated.any() and not truncated.any() and info == {}
        obs, _ = venv.reset(seed=[None, 7])  # sub-env 0 draws its generator's next seed
        np.testing.assert_array_equal(obs, [toy_start(drawn_seed(20, draws=2)), toy_start(7)])
        assert venv.np_random_seed == 20  # a list seeds the sub-envs only
    finally:
        venv.close()


def test_an_unseeded_vector_reset_draws_from_each_sub_envs_generator(url: str) -> None:
    venv = RolloutVectorEnv(2, url)
    try:
        obs, _ = venv.reset()  # never seeded: seeds from OS entropy
        assert venv.observation_space.contains(obs)
        venv.reset(seed=30)
        obs, _ = venv.reset()
        np.testing.assert_array_equal(obs, [toy_start(drawn_seed(30)), toy_start(drawn_seed(31))])
    finally:
        venv.close()


def test_a_reset_after_an_episode_end_steps_on_the_next_step(url: str) -> None:
    """A ``reset`` replaces the ended episodes: the next ``step`` applies its actions (no autoreset)."""
    venv = RolloutVectorEnv(2, url, max_episode_steps=1)
    try:
        venv.reset(seed=1)
        venv.step(np.stack([go(0.2)] * 2))  # both episodes end
        start, _ = venv.reset(seed=3)
        obs, _, _, truncated, _ = venv.step(np.stack([go(0.4), go(-0.4)]))
        assert_near(obs[0], moved(start[0], go(0.4)))
        assert_near(obs[1], moved(start[1], go(-0.4)))
        assert truncated.tolist() == [True, True]
    finally:
        venv.close()


# -- episode ends ------------------------------------------------------------------------------------


def reward_of(obs: np.ndarray) -> float:
    """The toy world's reward: minus the distance of the joints to the target."""
    return float(-np.linalg.norm(obs[:7].astype(np.float64) - obs[8:15]))


def test_an_episode_that_terminates_on_its_last_step_is_not_truncated(url: str) -> None:
    env = RolloutEnv(url, max_episode_steps=2)
    try:
        start, _ = env.reset(seed=2)
        obs, reward, terminated, truncated, info = env.step(go(0.3))
        assert (terminated, truncated) == (False, False)
        assert reward == pytest.approx(reward_of(obs), rel=1e-5)
        obs, reward, terminated, truncated, info = env.step(END)
        assert_near(obs, moved(start, go(0.3), END))
        assert (terminated, truncated, info) == (True, False, {})
        assert reward == pytest.approx(reward_of(obs), rel=1e-5)
    finally:
        env.close()


def test_vector_sub_envs_end_terminated_or_truncated_then_autoreset(url: str) -> None:
    venv = RolloutVectorEnv(3, url, max_episode_steps=1)
    try:
        start, _ = venv.reset(seed=4)
        actions = np.stack([END, go(0.2), go(-0.2)])
        obs, rewards, terminated, truncated, info = venv.step(actions)
        assert terminated.tolist() == [True, False, False]
        assert truncated.tolist() == [False, True, True]
        assert obs.dtype == np.float32 and info == {}
        assert rewards.dtype == np.float64 and terminated.dtype == truncated.dtype == np.bool_
        for i in range(3):
            assert_near(obs[i], moved(start[i], actions[i]))
            assert rewards[i] == pytest.approx(reward_of(obs[i]), rel=1e-5)
        obs, rewards, terminated, truncated, _ = venv.step(actions)  # all autoreset
        expected = [toy_start(drawn_seed(4 + i)) for i in range(3)]
        np.testing.assert_array_equal(obs, expected)
        assert not rewards.any() and not terminated.any() and not truncated.any()
    finally:
        venv.close()


def test_closing_an_env_twice_closes_its_session_once(url: str) -> None:
    with RolloutClient(url) as client:
        env = RolloutEnv(client=client)
        env.reset(seed=0)
        sid = env.session_id
        env.close()
        assert env.session_id is None
        env.close()  # nothing left to close (a wrapper and its env may both close it)
        assert client.status(sid)["closed_reason"] == "closed"  # type: ignore[arg-type]


# -- what a server (or a proxy in front of it) may answer ------------------------------------------


class Answering(RolloutClient):
    """A real client of the real server, but the named calls answer as set here instead: a
    refusal to raise, or a world entry / opened session altered as another server would send it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.refusals: dict[str, RolloutRequestError] = {}
        self.drop_entry_keys: tuple[str, ...] = ()
        self.strip_images = False

    def world(self, model: str | None = None) -> dict[str, Any]:
        entry = super().world(model)
        return {k: v for k, v in entry.items() if k not in self.drop_entry_keys}

    def restart(self, session_id: str, *, seed: int | None = None) -> Observed:
        if "restart" in self.refusals:
            raise self.refusals["restart"]
        return super().restart(session_id, seed=seed)

    def close_session(self, session_id: str) -> None:
        if "close_session" in self.refusals:
            raise self.refusals["close_session"]
        super().close_session(session_id)

    def open_session(self, model: str, **kwargs: Any) -> tuple[str, Observed]:
        if "open_session" in self.refusals:
            raise self.refusals.pop("open_session")  # once
        sid, observed = super().open_session(model, **kwargs)
        if self.strip_images:
            observed = Observed(observed.tensor, observed.state, None)
        return sid, observed


def test_a_world_entry_without_an_episode_length_gives_200_steps(url: str) -> None:
    """A vLLM-Omni server's entry publishes no ``max_episode_steps``."""
    with Answering(url) as client:
        client.drop_entry_keys = ("max_episode_steps",)
        env, venv = RolloutEnv(client=client), RolloutVectorEnv(2, client=client)
        assert env.max_episode_steps == venv.max_episode_steps == 200
        assert RolloutEnv(client=client, max_episode_steps=7).max_episode_steps == 7


def test_a_reset_refused_for_another_reason_than_a_lost_session_raises(url: str) -> None:
    with Answering(url) as client:
        env = RolloutEnv(client=client)
        env.reset(seed=0)
        sid = env.session_id
        client.refusals["restart"] = RolloutRequestError("rate_limited", "slow down")
        with pytest.raises(RolloutRequestError) as refused:
            env.reset(seed=1)
        assert refused.value.code == "rate_limited"
        assert env.session_id == sid  # the session is kept: it was not lost
        del client.refusals["restart"]
        np.testing.assert_array_equal(env.reset(seed=1)[0], toy_start(1))
        assert env.session_id == sid
        env.close()


def test_a_reset_of_a_lost_session_opens_a_new_one(url: str) -> None:
    with Answering(url) as client:
        env = RolloutEnv(client=client)
        env.reset(seed=0)
        sid = env.session_id
        client.refusals["restart"] = RolloutRequestError("session_not_found", "server restarted")
        np.testing.assert_array_equal(env.reset(seed=2)[0], toy_start(2))
        assert env.session_id not in (None, sid)
        env.close()


def test_a_lost_session_whose_replacement_failed_to_open_is_opened_by_the_next_reset(url: str) -> None:
    """The server lost the session and refused the new one once (say, at its session limit): the
    next reset opens one, it does not try to restart the lost one again."""
    with Answering(url) as client:
        env = RolloutEnv(client=client)
        env.reset(seed=0)
        client.refusals["restart"] = RolloutRequestError("session_not_found", "server restarted")
        client.refusals["open_session"] = RolloutRequestError("too_many_sessions", "at the limit")
        with pytest.raises(RolloutRequestError, match="at the limit"):
            env.reset(seed=1)
        assert env.session_id is None
        del client.refusals["restart"]
        np.testing.assert_array_equal(env.reset(seed=2)[0], toy_start(2))
        assert env.session_id is not None
        env.close()


@BOTH
def test_a_close_refused_for_another_reason_than_a_lost_session_raises(url: str, make: Any) -> None:
    with Answering(url) as client:
        env = make(client=client)
        env.reset(seed=0)
        client.refusals["close_session"] = RolloutRequestError("unauthorized", "bad key")
        with pytest.raises(RolloutRequestError, match="bad key"):
            env.close()
        client.refusals["close_session"] = RolloutRequestError("session_expired", "idle")
        env.close() if isinstance(env, RolloutEnv) else env.close_extras()  # gone: nothing to close


def test_a_rendering_session_that_answers_without_frames_is_a_bad_response(video_url: str) -> None:
    with Answering(video_url) as client:
        client.strip_images = True
        env = RolloutEnv(client=client, render={})
        with pytest.raises(RolloutRequestError) as bad:
            env.reset(seed=0)
        assert bad.value.code == "bad_response"
        assert bad.value.message == "a rendering session answered without state or images"


@pytest.fixture(scope="module")
def video_url() -> Iterator[str]:
    from rollserve.models.worlds import load_world

    settings = ServerSettings(max_batch_wait_ms=0.0)
    with serving(create_app(settings, rollout=RolloutService(load_world("video"), settings))) as server:
        yield server.http_url


@BOTH
def test_render_before_reset_asks_for_a_reset(video_url: str, make: Any) -> None:
    env = make(video_url, render={}, render_mode="rgb_array")
    try:
        assert env.render_mode == "rgb_array"
        with pytest.raises(gym.error.ResetNeeded, match=r"^call reset\(\) before render\(\)$"):
            env.render()
    finally:
        env.close()


def test_an_api_key_given_to_the_env_reaches_the_server() -> None:
    settings = ServerSettings(max_batch_wait_ms=0.0, api_key="sesame")
    with serving(create_app(settings, rollout=RolloutService(ToyWorld(), settings))) as server:
        with pytest.raises(RolloutRequestError):
            RolloutEnv(server.http_url)
        for env in (
            RolloutEnv(server.http_url, api_key="sesame"),
            RolloutVectorEnv(2, server.http_url, api_key="sesame"),
        ):
            np.testing.assert_array_equal(env.reset(seed=3)[0].reshape(-1, 15)[0], toy_start(3))
            env.close()


# -- a lost reply one step before the episode's last -------------------------------------------------

RETRIES = 1  # a lost call is 2 lost replies: the first try and the retry


class LoseReplies(httpx.HTTPTransport):
    """Forwards every request (the server does the work); the next ``drops`` replies to a path
    ending in ``suffix`` are lost (the client sees a read error)."""

    def __init__(self, suffix: str) -> None:
        super().__init__()
        self.suffix, self.drops = suffix, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith(self.suffix) and self.drops > 0:
            self.drops -= 1
            response.read()
            response.close()
            raise httpx.ReadError("reply lost", request=request)
        return response


def losing_client(url: str, suffix: str) -> tuple[RolloutClient, LoseReplies]:
    transport = LoseReplies(suffix)
    return RolloutClient(url, transport=transport, max_retries=RETRIES, backoff_s=0.001), transport


def test_a_lost_step_before_the_last_is_settled_and_the_new_action_ends_the_episode(url: str) -> None:
    client, transport = losing_client(url, "/step")
    env = RolloutEnv(client=client, max_episode_steps=3)
    try:
        start, _ = env.reset(seed=11)
        env.step(go(0.1))
        transport.drops = RETRIES + 1
        with pytest.raises(httpx.TransportError):
            env.step(go(0.2))  # applied by the server: step 2 of 3
        obs, _, terminated, truncated, info = env.step(go(0.3))  # settles it, then the last step
        assert_near(obs, moved(start, go(0.1), go(0.2), go(0.3)))
        assert (terminated, truncated, info) == (False, True, {})
        assert client.status(env.session_id)["committed_step_id"] == 2  # type: ignore[arg-type]
    finally:
        env.close()
        client.close()


def test_a_lost_vector_step_before_the_last_is_settled_and_the_new_actions_end_the_episodes(url: str) -> None:
    client, transport = losing_client(url, "/batch_step/columns")
    venv = RolloutVectorEnv(2, client=client, max_episode_steps=3)
    try:
        start, _ = venv.reset(seed=12)
        venv.step(np.stack([go(0.1), go(-0.1)]))
        transport.drops = RETRIES + 1
        with pytest.raises(httpx.TransportError):
            venv.step(np.stack([go(0.2), go(-0.2)]))
        obs, _, terminated, truncated, info = venv.step(np.stack([go(0.3), go(-0.3)]))
        for i, sign in enumerate((1, -1)):
            assert_near(obs[i], moved(start[i], *(go(sign * v) for v in (0.1, 0.2, 0.3))))
        assert truncated.tolist() == [True, True] and not terminated.any() and info == {}
    finally:
        venv.close()
        client.close()


def test_a_vector_action_of_the_wrong_size_is_refused_as_no_droid_action(url: str) -> None:
    venv = RolloutVectorEnv(2, url)
    try:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match="a DROID action has 8 values"):
            venv.step(np.zeros((2, 4), np.float32))
        statuses = [venv.client.status(s)["committed_step_id"] for s in session_ids(venv)]  # type: ignore[arg-type]
        assert statuses == [-1, -1]  # nothing reached the server
    finally:
        venv.close()


def test_a_one_env_rendering_vector_env_batches_its_frames(video_url: str) -> None:
    venv = RolloutVectorEnv(1, video_url, render={})
    try:
        obs, _ = venv.reset(seed=0)
        assert venv.observation_space.contains(obs)
        assert obs["images"]["exterior"].shape == (1, 64, 64, 3) and obs["state"].shape[0] == 1
        action = np.r_[obs["state"][0, :7], 0.5].astype(np.float32)[None]
        obs, *_ = venv.step(action)
        assert venv.observation_space.contains(obs)
    finally:
        venv.close()


@BOTH
def test_a_step_before_reset_asks_for_a_reset(url: str, make: Any) -> None:
    env = make(url)
    try:
        actions = np.zeros(env.action_space.shape, np.float32)
        with pytest.raises(AssertionError, match=r"^reset\(\) before step\(\)$"):
            env.step(actions)
        env.reset(seed=0)
        env.close()  # its sessions are closed: a step needs a reset again
        with pytest.raises(AssertionError, match=r"^reset\(\) before step\(\)$"):
            env.step(actions)
    finally:
        env.close()


def test_a_vector_step_takes_a_one_step_action_chunk(url: str) -> None:
    """A policy's one-step action chunk, ``(N, 1, 8)``, steps as the ``(N, 8)`` actions do."""
    venv = RolloutVectorEnv(2, url)
    try:
        start, _ = venv.reset(seed=13)
        actions = np.stack([go(0.3), go(-0.6)])
        obs, *_ = venv.step(actions[:, None, :])
        for i in range(2):
            assert_near(obs[i], moved(start[i], actions[i]))
    finally:
        venv.close()


@BOTH
def test_a_malformed_action_is_refused_and_the_next_valid_step_goes_through(url: str, make: Any) -> None:
    """It was left pending, so every later step resent it and failed on it until a reset."""
    env = make(url)
    try:
        env.reset(seed=0)
        wrong = np.zeros(4, np.float32) if isinstance(env, RolloutEnv) else np.zeros((2, 4), np.float32)
        right = go(0.1) if isinstance(env, RolloutEnv) else np.stack([go(0.1), go(0.1)])
        for _ in range(2):
            with pytest.raises(
                ValueError, match=r"^a DROID action has 8 values \(7 joints \+ gripper\), got 4$"
            ):
                env.step(wrong)
        _, _, terminated, truncated, info = env.step(right)
        assert not np.any(terminated) and not np.any(truncated) and info == {}
        ids = [env.session_id] if isinstance(env, RolloutEnv) else session_ids(env)
        assert [env.client.status(s)["committed_step_id"] for s in ids] == [0] * len(ids)  # type: ignore[arg-type]
    finally:
        env.close()
