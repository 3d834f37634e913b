"""RolloutService rules, called directly: lifecycle, step_id rules, failures that commit nothing,
duplicates that replay, stateless steps, fork, batch_step, TTL and capacity, concurrency."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gc
import weakref
from collections.abc import Sequence

import numpy as np
import pytest

from rollserve.models.world import WorldInit, WorldOutput, WorldStep
from rollserve.models.worlds import ToyWorld
from rollserve.server.rollout.protocol import (
    Action,
    BatchStepItem,
    BatchStepRequest,
    CreateSessionRequest,
    ForkSessionRequest,
    Observation,
    ResetSessionRequest,
    RolloutStepRequest,
)
from rollserve.server.rollout.service import RolloutError, RolloutService
from rollserve.server.settings import ServerSettings

POISON = 0.875  # an action whose first joint is this makes RecordingWorld fail that one item


class _State:
    """A world state object the test can watch for release (numpy arrays are shared too freely)."""

    __slots__ = ("__weakref__", "obs")

    def __init__(self, obs: np.ndarray) -> None:
        self.obs = obs


class BadTensor:
    """Looks like a torch tensor until it is converted: the failure happens after the model ran."""

    def detach(self) -> BadTensor:
        return self

    def cpu(self) -> BadTensor:
        return self

    def numpy(self) -> np.ndarray:
        raise TypeError("cannot encode")


class RecordingWorld(ToyWorld):
    """The toy world, recording every call, with switches to fail the way real models fail. Like the
    seed's engine it accepts a step without an action (the joints then hold at zero)."""

    spec = dataclasses.replace(ToyWorld.spec, requires_action=False)

    def __init__(self) -> None:
        self.init_calls: list[list[WorldInit]] = []
        self.step_calls: list[list[WorldStep]] = []
        self.fail_batches = 0  # the next N step batches raise as a whole
        self.bad_outputs = 0  # the next N step items return an unencodable observation
        self.live: weakref.WeakSet[_State] = weakref.WeakSet()

    def _wrap(self, outs: Sequence[WorldOutput | BaseException]) -> list[WorldOutput | BaseException]:
        wrapped: list[WorldOutput | BaseException] = []
        for out in outs:
            if isinstance(out, WorldOutput):
                state = _State(out.state)
                self.live.add(state)
                out = WorldOutput(state, out.observation, out.reward, out.terminated)
            wrapped.append(out)
        return wrapped

    def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
        self.init_calls.append(list(inits))
        return self._wrap(super().initial_states(inits))

    def step_batch(self, steps: Sequence[WorldStep]) -> list[WorldOutput | BaseException]:
        plain = [WorldStep(s.state.obs, s.action, s.inputs) for s in steps]
        self.step_calls.append(plain)  # recorded without the state objects, which must be freed
        if self.fail_batches:
            self.fail_batches -= 1
            raise RuntimeError("engine dead")
        outs = self._wrap(super().step_batch(plain))
        for i, step in enumerate(steps):
            if step.action[0] == np.float32(POISON):
                outs[i] = RuntimeError("this item broke the model")
            elif self.bad_outputs and isinstance(outs[i], WorldOutput):
                self.bad_outputs -= 1
                out = outs[i]
                outs[i] = WorldOutput(out.state, BadTensor(), out.reward, out.terminated)
        return outs

    @property
    def steps_run(self) -> int:
        return sum(len(c) for c in self.step_calls)


@pytest.fixture
def world() -> RecordingWorld:
    return RecordingWorld()


@pytest.fixture
async def service(world: RecordingWorld):
    svc = RolloutService(world, ServerSettings(max_batch_wait_ms=0.0))
    yield svc
    svc.close()


def step_req(step_id: int, a: float = 0.1, *, context: bool = True, **obs) -> RolloutStepRequest:
    return RolloutStepRequest(
        step_id=step_id,
        observation=Observation(**obs),
        action=Action(joint_positions=[a] * 7, gripper_position=0.5),
        use_session_context=context,
    )


def decode(next_observation: dict) -> np.ndarray:
    raw = base64.b64decode(next_observation["video_latent"])
    return np.frombuffer(raw, dtype=next_observation["dtype"]).reshape(next_observation["shape"])


async def new_session(service: RolloutService, seed: int = 0) -> str:
    return (await service.create_session(CreateSessionRequest(model="toy", seed=seed))).session_id


# -- lifecycle ------------------------------------------------------------------------------------------
async def test_create_session_returns_id_mode_and_initial_observation(service) -> None:
    resp = await service.create_session(CreateSessionRequest(model="toy", seed=3))
    assert resp.session_id
    assert resp.mode == "world_model_env"
    assert resp.created_at > 0
    assert decode(resp.observation).shape == (15,)


async def test_status_after_create(service) -> None:
    sid = await new_session(service)
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length, status.closed) == (-1, 0, False)


async def test_unknown_model_is_refused(service) -> None:
    with pytest.raises(RolloutError) as err:
        await service.create_session(CreateSessionRequest(model="dreamzero"))
    assert err.value.code == "model_not_found"


async def test_close_marks_closed_and_releases_every_context(service, world) -> None:
    sid = await new_session(service)
    assert (await service.step(sid, step_req(0))).error is None
    assert (await service.step(sid, step_req(5, context=False))).error is None  # scratch context
    await service.close_session(sid)
    status = await service.get_status(sid)
    assert status.closed and status.closed_reason == "closed"
    assert status.committed_step_id == 0
    await new_session(service, seed=1)  # the engine thread moves on from the closed session's items
    gc.collect()
    assert len(world.live) == 1  # only the new session's start state is still referenced


async def test_close_is_idempotent_and_closed_session_refuses_steps(service) -> None:
    sid = await new_session(service)
    await service.close_session(sid)
    again = await service.close_session(sid)
    assert again.closed
    resp = await service.step(sid, step_req(0))
    assert resp.error is not None and resp.error.code == "session_closed"
    with pytest.raises(RolloutError) as err:
        await service.reset_session(sid)
    assert err.value.code == "session_closed"


async def test_reset_clears_committed_step_and_restarts_the_episode(service, world) -> None:
    sid = await new_session(service, seed=7)
    first = await service.step(sid, step_req(0))
    await service.step(sid, step_req(1))
    reset = await service.reset_session(sid, ResetSessionRequest(seed=7))
    assert reset.committed_step_id == -1
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (-1, 0)
    again = await service.step(sid, step_req(0))  # step 0 is valid again and starts from the new root
    np.testing.assert_array_equal(decode(again.next_observation), decode(first.next_observation))


async def test_reset_without_seed_draws_the_next_seed_reproducibly(service) -> None:
    a = await service.create_session(CreateSessionRequest(model="toy", seed=11))
    b = await service.create_session(CreateSessionRequest(model="toy", seed=11))
    ra = await service.reset_session(a.session_id)
    rb = await service.reset_session(b.session_id)
    np.testing.assert_array_equal(decode(ra.observation), decode(rb.observation))
    assert not np.array_equal(decode(ra.observation), decode(a.observation))


async def test_unknown_session(service) -> None:
    resp = await service.step("no-such-session", step_req(0))
    assert resp.error is not None and resp.error.code == "session_not_found"
    assert resp.model_metadata.committed_step_id == -1
    for call in (service.get_status, service.reset_session, service.close_session, service.fork_session):
        with pytest.raises(RolloutError) as err:
            await call("no-such-session")
        assert err.value.code == "session_not_found"


# -- steps ------------------------------------------------------------------------------------------------
async def test_successful_step_commits(service) -> None:
    sid = await new_session(service)
    resp = await service.step(sid, RolloutStepRequest(
        step_id=0, observation=Observation(state=[0.1, 0.2]), action=Action(joint_positions=[0.0] * 7)
    ))  # fmt: skip
    assert resp.error is None
    assert resp.step_id == 0
    assert resp.model_metadata.committed_step_id == 0
    assert resp.model_metadata.steps_generated == 1
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (0, 1)


async def test_steps_advance_monotonically(service) -> None:
    sid = await new_session(service)
    for i in range(3):
        resp = await service.step(sid, step_req(i, state=[float(i)]))
        assert resp.error is None
        assert resp.model_metadata.committed_step_id == i
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (2, 3)


async def test_next_observation_is_base64_float32_with_shape(service) -> None:
    sid = await new_session(service)
    resp = await service.step(sid, RolloutStepRequest(step_id=0, observation=Observation(), action=Action()))
    obs = resp.next_observation
    assert obs is not None
    assert obs["dtype"] == "float32" and obs["encoding"] == "base64_raw_tensor"
    assert obs["shape"] == [15]
    assert decode(obs).dtype == np.float32
    assert isinstance(obs["reward"], float) and obs["terminated"] is False


async def test_duplicate_of_last_step_replays_without_running_the_model(service, world) -> None:
    sid = await new_session(service)
    first = await service.step(sid, step_req(0))
    assert first.error is None
    dup = await service.step(sid, step_req(0))
    assert dup.error is not None and dup.error.code == "step_already_committed"
    assert dup.model_metadata.committed_step_id == 0
    assert dup.model_metadata.context_length == 1
    assert dup.replayed
    assert dup.next_observation == first.next_observation
    assert world.steps_run == 1


async def test_duplicate_with_other_content_or_older_step_gets_no_result(service, world) -> None:
    sid = await new_session(service)
    await service.step(sid, step_req(0))
    await service.step(sid, step_req(1))
    changed = await service.step(sid, step_req(1, a=0.3))
    older = await service.step(sid, step_req(0))
    for resp in (changed, older):
        assert resp.error is not None and resp.error.code == "step_already_committed"
        assert resp.next_observation is None and not resp.replayed
        assert resp.model_metadata.committed_step_id == 1
    assert world.steps_run == 2


async def test_out_of_order_step_does_not_run_or_advance(service, world) -> None:
    sid = await new_session(service)
    resp = await service.step(sid, step_req(2))
    assert resp.error is not None and resp.error.code == "step_out_of_order"
    assert (resp.model_metadata.committed_step_id, resp.model_metadata.context_length) == (-1, 0)
    assert world.step_calls == []


async def test_stateless_step_runs_on_a_scratch_context_and_commits_nothing(service, world) -> None:
    sid = await new_session(service)
    await service.step(sid, step_req(0, a=0.9))
    await service.step(sid, step_req(1, a=0.9))
    resp = await service.step(sid, step_req(7, context=False))
    assert resp.error is None
    assert resp.model_metadata.committed_step_id == 1
    assert resp.model_metadata.context_length == 2
    assert len(world.step_calls) == 3
    scratch = world.step_calls[-1][0]
    fresh = await service.create_session(CreateSessionRequest(model="toy", seed=0))
    np.testing.assert_array_equal(scratch.state, decode(fresh.observation))  # the episode start
    status = await service.get_status(sid)
    assert (status.committed_step_id, status.context_length) == (1, 2)


async def test_stateless_step_can_be_conditioned_on_a_start_state(service) -> None:
    sid = await new_session(service)
    start = [0.0] * 7 + [0.0] + [0.5] * 7
    resp = await service.step(sid, step_req(0, context=False, extra={"observation/state": start}))
    assert resp.error is None
    np.testing.assert_allclose(decode(resp.next_observation)[:7], 0.05)  # halfway to the 0.1 command


# -- failures commit nothing -------------------------------------------------------------------------------
async def test_failed_step_does_not_advance(service, world) -> None:
    sid = await new_session(service)
    world.fail_batches = 1
    resp = await service.step(sid, step_req(0))
    assert resp.error is not None and resp.error.code == "inference_error"
    assert resp.model_metadata.committed_step_id == -1
    assert "engine dead" in resp.error.message and "Traceback" not in resp.error.message
    assert (await service.get_status(sid)).committed_step_id == -1


async def test_encoding_failure_after_the_model_ran_does_not_advance(service, world) -> None:
    sid = await new_session(service)
    world.bad_outputs = 1
    resp = await service.step(sid, step_req(0))
    assert resp.error is not None and resp.error.code == "inference_error"
    assert world.steps_run == 1  # the model did run
    assert (await service.get_status(sid)).committed_step_id == -1


async def test_failure_after_success_keeps_the_last_committed_step(service, world) -> None:
    sid = await new_session(service)
    await service.step(sid, step_req(0))
    world.fail_batches = 1
    resp = await service.step(sid, step_req(1))
    assert resp.error is not None
    assert (resp.model_metadata.committed_step_id, resp.model_metadata.context_length) == (0, 1)


@pytest.mark.parametrize("failure", ["model", "encoding"])
async def test_retry_after_failure_equals_a_first_try(service, world, failure: str) -> None:
    flaky, clean = await new_session(service, seed=5), await new_session(service, seed=5)
    actions = [0.3, -0.2, 0.6]
    for i, a in enumerate(actions):
        if i == 1:
            if failure == "model":
                world.fail_batches = 1
            else:
                world.bad_outputs = 1
            assert (await service.step(flaky, step_req(i, a))).error.code == "inference_error"
        got = await service.step(flaky, step_req(i, a))
        want = await service.step(clean, step_req(i, a))
        assert got.error is None
        assert got.next_observation == want.next_observation


async def test_wrong_action_length_is_an_invalid_request(service, world) -> None:
    sid = await new_session(service)
    bad = RolloutStepRequest(step_id=0, observation=Observation(), action=Action(joint_positions=[1.0, 2.0]))
    resp = await service.step(sid, bad)
    assert resp.error is not None and resp.error.code == "invalid_request"
    assert "joint_positions must have 7 values" in resp.error.message
    assert world.step_calls == []


async def test_world_that_needs_an_action_says_so() -> None:
    svc = RolloutService(ToyWorld(), ServerSettings(max_batch_wait_ms=0.0))
    try:
        sid = await new_session(svc)
        resp = await svc.step(sid, RolloutStepRequest(step_id=0, observation=Observation(), action=Action()))
        assert resp.error is not None and resp.error.code == "invalid_request"
        moved = await svc.step(sid, step_req(0))  # the same step with joints and gripper goes through
        assert moved.error is None and moved.step_id == 0
    finally:
        svc.close()


@pytest.mark.parametrize("shape", [(1, 3, 8, 8), (2, 4, 4)])
async def test_next_observation_keeps_the_world_output_shape(shape: tuple[int, ...]) -> None:
    class ShapedWorld(ToyWorld):
        def step_batch(self, steps):
            return [WorldOutput(s.state, np.ones(shape, dtype=np.float64)) for s in steps]

    svc = RolloutService(ShapedWorld(), ServerSettings(max_batch_wait_ms=0.0))
    try:
        resp = await svc.step(await new_session(svc), step_req(0))
        assert resp.next_observation["shape"] == list(shape)
        np.testing.assert_array_equal(decode(resp.next_observation), np.ones(shape, dtype=np.float32))
    finally:
        svc.close()


# -- fork --------------------------------------------------------------------------------------------------
async def test_fork_starts_from_the_committed_state(service) -> None:
    sid = await new_session(service, seed=2)
    for i in range(2):
        await service.step(sid, step_req(i, 0.4))
    fork = await service.fork_session(sid)
    assert fork.forked_from == sid and fork.session_id != sid
    assert fork.committed_step_id == 1
    a = await service.step(sid, step_req(2, -0.5))
    b = await service.step(fork.session_id, step_req(2, -0.5))
    assert a.next_observation == b.next_observation
    await service.step(fork.session_id, step_req(3, 0.9))  # branches move independently
    assert (await service.get_status(sid)).committed_step_id == 2
    dup = await service.step(fork.session_id, step_req(3, 0.9))
    assert dup.replayed


async def test_fork_with_a_chosen_id_is_idempotent(service) -> None:
    sid = await new_session(service)
    first = await service.fork_session(sid, ForkSessionRequest(session_id="branch-1"))
    again = await service.fork_session(sid, ForkSessionRequest(session_id="branch-1"))
    assert first.session_id == again.session_id == "branch-1"
    other = await new_session(service, seed=9)
    with pytest.raises(RolloutError) as err:
        await service.fork_session(other, ForkSessionRequest(session_id="branch-1"))
    assert err.value.code == "session_exists"


async def test_create_with_a_chosen_id_is_idempotent(service) -> None:
    req = CreateSessionRequest(model="toy", seed=1, session_id="trainer-0")
    first, again = await asyncio.gather(service.create_session(req), service.create_session(req))
    assert first.session_id == again.session_id == "trainer-0"
    assert len(service.store) == 1


# -- batch_step --------------------------------------------------------------------------------------------
async def test_batch_step_is_one_model_call_with_per_item_errors(service, world) -> None:
    sids = [await new_session(service, seed=i) for i in range(6)]
    await service.step(sids[4], step_req(0))
    items = [BatchStepItem(session_id=s, **step_req(0, 0.2 * i).model_dump()) for i, s in enumerate(sids[:3])]
    items += [
        BatchStepItem(session_id=sids[3], **step_req(0, POISON).model_dump()),  # fails inside the model
        BatchStepItem(session_id=sids[4], **step_req(3).model_dump()),  # out of order
        BatchStepItem(session_id="ghost", **step_req(0).model_dump()),  # unknown
        BatchStepItem(
            session_id=sids[5], step_id=0, observation=Observation(), action=Action(joint_positions=[1.0])
        ),
    ]
    calls_before = len(world.step_calls)
    resp = await service.batch_step(BatchStepRequest(items=items))
    assert len(world.step_calls) == calls_before + 1
    assert len(world.step_calls[-1]) == 4
    codes = [r.error.code if r.error else "ok" for r in resp.results]
    assert codes == [
        "ok",
        "ok",
        "ok",
        "inference_error",
        "step_out_of_order",
        "session_not_found",
        "invalid_request",
    ]
    assert [r.status for r in resp.results] == ["ok"] * 3 + ["error"] * 4
    assert [r.session_id for r in resp.results] == [i.session_id for i in items]
    for i, sid in enumerate(sids[:3]):  # same result as a single step would have given
        twin = await new_session(service, seed=i)
        single = await service.step(twin, step_req(0, 0.2 * i))
        assert resp.results[i].next_observation == single.next_observation
        assert (await service.get_status(sid)).committed_step_id == 0
    assert (await service.get_status(sids[3])).committed_step_id == -1


async def test_batch_step_refuses_a_session_twice_and_replays_duplicates(service) -> None:
    sid = await new_session(service)
    item = BatchStepItem(session_id=sid, **step_req(0).model_dump())
    resp = await service.batch_step(BatchStepRequest(items=[item, item]))
    assert [r.status for r in resp.results] == ["ok", "error"]
    assert resp.results[1].error.code == "invalid_request"
    assert resp.results[1].model_metadata.committed_step_id == 0
    with pytest.raises(RolloutError) as err:
        await service.batch_step(BatchStepRequest(items=[item] * (service.max_batch_items + 1)))
    assert err.value.code == "invalid_request"
    retry = await service.batch_step(BatchStepRequest(items=[item]))
    assert retry.results[0].replayed
    assert retry.results[0].next_observation == resp.results[0].next_observation


# -- capacity, idle TTL, concurrency -----------------------------------------------------------------------
async def test_capacity_and_idle_expiry() -> None:
    now = [0.0]
    settings = ServerSettings(max_rollout_sessions=2, rollout_idle_ttl_s=10.0, max_batch_wait_ms=0.0)
    svc = RolloutService(ToyWorld(), settings, clock=lambda: now[0])
    try:
        a, b = await new_session(svc), await new_session(svc)
        with pytest.raises(RolloutError) as err:
            await new_session(svc)
        assert err.value.code == "at_capacity"
        await svc.step(a, step_req(0))
        now[0] = 8.0
        await svc.get_status(b)  # status does not keep a session alive...
        await svc.step(b, step_req(0))  # ...a step does
        now[0] = 12.0
        c = await new_session(svc)  # a expired (idle 12 s > 10 s) and made room
        resp = await svc.step(a, step_req(1))
        assert resp.error.code == "session_expired"
        assert resp.model_metadata.committed_step_id == 0
        status = await svc.get_status(a)
        assert status.closed and status.closed_reason == "expired"
        assert (await svc.step(b, step_req(1))).error is None
        assert (await svc.step(c, step_req(0))).error is None
    finally:
        svc.close()


async def test_concurrent_sessions_match_sequential_runs(world) -> None:
    svc = RolloutService(world, ServerSettings(max_batch_wait_ms=2.0))
    try:
        sids = [await new_session(svc, seed=i) for i in range(16)]

        async def rollout(sid: str, k: int) -> list[dict]:
            return [(await svc.step(sid, step_req(t, np.sin(k + t)))).next_observation for t in range(6)]

        together = await asyncio.gather(*(rollout(s, k) for k, s in enumerate(sids)))
        assert max(len(c) for c in world.step_calls) > 1  # steps of different sessions did batch
        for k in range(16):
            alone = await rollout(await new_session(svc, seed=k), k)
            assert together[k] == alone
    finally:
        svc.close()


async def test_concurrent_duplicates_run_the_model_once(service, world) -> None:
    sid = await new_session(service)
    answers = await asyncio.gather(*(service.step(sid, step_req(0)) for _ in range(6)))
    assert world.steps_run == 1
    assert sum(a.error is None for a in answers) == 1
    assert all(a.replayed for a in answers if a.error is not None)
    assert len({str(a.next_observation) for a in answers}) == 1


def test_describe_models_publishes_layouts(world) -> None:
    svc = RolloutService(world)
    try:
        (entry,) = svc.describe_models()
    finally:
        svc.close()
    assert entry["id"] == "toy" and entry["object"] == "model" and entry["kind"] == "world"
    assert entry["observation"]["shape"] == [15]
    assert entry["action"]["shape"] == [8] and len(entry["action"]["low"]) == 8


async def test_a_worlds_own_non_finite_start_is_a_model_error_not_the_clients() -> None:
    """Regression: a start state the world accepted but answered with NaN became ``invalid_request``."""

    class NanStart(RecordingWorld):
        nan = False

        def initial_states(self, inits: Sequence[WorldInit]) -> list[WorldOutput | BaseException]:
            outs = super().initial_states(inits)
            if not self.nan:
                return outs
            return [WorldOutput(o.state, np.full_like(o.observation, np.nan), 0.0, False) for o in outs]

    world = NanStart()
    svc = RolloutService(world, ServerSettings(max_batch_wait_ms=0.0))
    try:
        sid = await new_session(svc)
        assert (await svc.step(sid, step_req(0))).error is None
        world.nan = True
        start = [0.0] * 7 + [0.0] + [0.5] * 7
        with pytest.raises(RolloutError) as err:
            await svc.reset_session(sid, ResetSessionRequest(seed=1, state=start))
        assert err.value.code == "inference_error"
        assert err.value.message == "world start failed: ValueError: world output is not finite"
        assert (await svc.get_status(sid)).committed_step_id == 0  # the failed reset changed nothing
    finally:
        svc.close()


async def test_start_conditions_apply_only_to_a_fresh_context(service, world) -> None:
    """Regression guard: start conditions re-applied after the first step restarted the world while
    ``committed_step_id`` advanced. The toy world moves the joints halfway to the command."""
    sid = await new_session(service)
    start_at = lambda joints: {"observation/state": [joints] * 7 + [0.0] + [0.5] * 7}  # noqa: E731
    first = await service.step(sid, step_req(0, 0.1, extra=start_at(0.0)))
    np.testing.assert_allclose(decode(first.next_observation)[:7], 0.05)  # (0 + 0.1) / 2
    inits = len(world.init_calls)
    second = await service.step(sid, step_req(1, 0.1, extra=start_at(0.9)))
    # continues from 0.05 -> 0.075; a re-applied start would give (0.9 + 0.1) / 2 = 0.5
    np.testing.assert_allclose(decode(second.next_observation)[:7], 0.075)
    assert len(world.init_calls) == inits and second.model_metadata.committed_step_id == 1
    await service.reset_session(sid)
    fresh = await service.step(sid, step_req(0, 0.1, extra=start_at(0.9)))
    np.testing.assert_allclose(decode(fresh.next_observation)[:7], 0.5)  # a fresh context: applied
