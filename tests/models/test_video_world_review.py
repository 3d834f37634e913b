"""What the video world's mutation run found untested: the spec it publishes, the action box it
clips to, the all-at-once check of a batch, the messages of its refusals, closing and reopening its
renderer, and the small conversions around the network.

Each test builds its own world (``fresh``): a world shared by the module is built once, during the
first test that asks for it, and a slip in ``VideoWorld.__init__`` would be checked by that test
alone. States come from one shared start (rendering a start frame takes a second or two); a
``VideoState`` belongs to no world, so any world can step it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rollserve.models.video_world import (
    VideoState,
    VideoWorld,
    VideoWorldConfig,
    VideoWorldNet,
    _coords,
    default_checkpoint_dir,
    frames_to_uint8,
    load_default,
    load_video_world_net,
    uint8_to_frames,
)
from rollserve.models.world import RenderSpec, WorldInit, WorldOutput, WorldStep

SHIPPED = json.loads((default_checkpoint_dir() / "config.json").read_text())
"""The shipped checkpoint's config, read here as plain JSON: the truth the spec must publish."""


def fresh(**changes: object) -> VideoWorld:
    """A new world on the shipped weights, its config changed by ``changes`` (none: loaded the way
    ``rollserve serve --world video`` loads it)."""
    if not changes:
        return load_default()
    net = load_video_world_net(default_checkpoint_dir())
    changed = VideoWorldNet(dataclasses.replace(net.config, **changes))
    changed.load_state_dict(net.state_dict())
    return VideoWorld(changed.eval())


@pytest.fixture(scope="module")
def starts() -> Iterator[list[VideoState]]:
    world = load_default()
    outs = world.initial_states([WorldInit(seed=seed) for seed in (11, 12, 13)])
    world.close()
    yield [out.state for out in outs]


def hold(state: VideoState) -> np.ndarray:
    """The action that keeps the arm where it is (its measured joints, the gripper half open)."""
    return np.r_[state.vector[:7], 0.5].astype(np.float32)


def net_step(world: VideoWorld, state: VideoState, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The network's own step for one row, with the clamps ``predict`` applies, no clipping."""
    with torch.inference_mode():
        z, v = world.net.step(
            torch.tensor(state.latent[None]),
            torch.tensor(state.vector[None]),
            torch.as_tensor(np.asarray(action, np.float32)[None]),
        )
    return z.nan_to_num().clamp(-50, 50)[0].numpy(), v.nan_to_num().clamp(-4, 4)[0].numpy()


def test_the_spec_publishes_the_checkpoints_own_facts() -> None:
    spec = fresh().spec
    side = SHIPPED["image_size"] // 8
    assert spec.name == "video" and spec.aliases == ("video_world",)
    assert spec.action_names == tuple(SHIPPED["action_names"])
    assert spec.action_low == pytest.approx(SHIPPED["action_low"])
    assert spec.action_high == pytest.approx(SHIPPED["action_high"])
    assert spec.fps == SHIPPED["control_hz"] == 10.0
    assert spec.max_episode_steps == SHIPPED["max_episode_steps"] == 120
    assert spec.cameras == ("exterior",) and spec.frame_size == (64, 64)
    assert spec.observation_shape == (1, SHIPPED["latent_channels"], side, side)
    assert spec.state_names == tuple(SHIPPED["state_names"])
    assert spec.description == (
        "learned video world model of the tabletop task: 64x64 exterior frames, latent [16, 8, 8]"
    )


def test_a_checkpoint_with_other_names_rate_and_length_publishes_those() -> None:
    names = tuple(f"a{i}" for i in range(8))
    spec = fresh(action_names=names, control_hz=5.0, max_episode_steps=77).spec
    assert (spec.action_names, spec.fps, spec.max_episode_steps) == (names, 5.0, 77)


def test_served_convolutions_keep_channels_last_weights() -> None:
    convs = [m for m in fresh().net.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.ConvTranspose2d)]
    assert len(convs) == 9
    assert all(conv.weight.is_contiguous(memory_format=torch.channels_last) for conv in convs)
    # a 3x3 kernel over several channels is not also plain C-contiguous: the layout really changed
    assert sum(not conv.weight.is_contiguous() for conv in convs) >= 6


def test_actions_outside_the_box_step_like_the_nearest_action_inside(starts: list[VideoState]) -> None:
    world = fresh()
    low, high = np.asarray(SHIPPED["action_low"], np.float32), np.asarray(SHIPPED["action_high"], np.float32)
    below_above = np.where(np.arange(8) % 2 == 0, low - 1.0, high + 1.0).astype(np.float32)
    above_below = np.where(np.arange(8) % 2 == 0, high + 1.0, low - 1.0).astype(np.float32)
    outs = world.step_batch([WorldStep(starts[0], below_above), WorldStep(starts[1], above_below)])
    for out, state, action in zip(outs, starts[:2], (below_above, above_below), strict=True):
        z, v = net_step(world, state, np.clip(action, low, high))  # one row: equal to float rounding
        np.testing.assert_allclose(out.observation[0], z, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(out.vector, v, rtol=1e-5, atol=1e-5)
        assert not np.allclose(out.vector, net_step(world, state, action)[1], atol=1e-3)  # clipping mattered


def test_a_world_without_an_action_box_steps_any_finite_action_as_given(starts: list[VideoState]) -> None:
    world = fresh(action_low=(), action_high=())
    assert world.spec.action_low is None and world.spec.action_high is None
    action = np.full(8, 5.0, np.float32)  # far outside the shipped box
    (out,) = world.step_batch([WorldStep(starts[0], action)])
    assert isinstance(out, WorldOutput)
    z, v = net_step(world, starts[0], action)
    np.testing.assert_array_equal(out.observation[0], z)
    np.testing.assert_array_equal(out.vector, v)


def test_a_well_formed_batch_is_checked_in_one_go(
    starts: list[VideoState], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docstring's promise: one conversion for the batch, no per-item check unless one is bad."""
    checked: list[WorldStep] = []
    per_item = VideoWorld._problem

    def counted(self: VideoWorld, step: WorldStep) -> BaseException | None:
        checked.append(step)
        return per_item(self, step)

    monkeypatch.setattr(VideoWorld, "_problem", counted)
    world = fresh()
    outs = world.step_batch([WorldStep(s, hold(s)) for s in starts])
    assert all(isinstance(out, WorldOutput) for out in outs) and checked == []
    world.step_batch([WorldStep(starts[0], hold(starts[0])), WorldStep(starts[1], None)])
    assert len(checked) == 2


def test_a_foreign_state_fails_alone_even_when_every_action_is_good(starts: list[VideoState]) -> None:
    world = fresh()
    good = hold(starts[0])
    outs = world.step_batch([WorldStep(starts[0], good), WorldStep("not a state", good)])
    assert isinstance(outs[0], WorldOutput)
    assert isinstance(outs[1], TypeError) and str(outs[1]) == "not a video-world state: str"
    only_foreign = world.step_batch([WorldStep(1.5, good), WorldStep(None, good)])
    assert [str(out) for out in only_foreign] == [
        "not a video-world state: float",
        "not a video-world state: NoneType",
    ]


def test_non_finite_actions_fail_alone_and_say_what_is_wanted(starts: list[VideoState]) -> None:
    world = fresh()
    nan, inf = hold(starts[1]), hold(starts[2])
    nan[3], inf[7] = np.nan, np.inf
    outs = world.step_batch(
        [WorldStep(starts[0], hold(starts[0])), WorldStep(starts[1], nan), WorldStep(starts[2], inf)]
    )
    (alone,) = world.step_batch([WorldStep(starts[0], hold(starts[0]))])
    np.testing.assert_array_equal(outs[0].observation, alone.observation)
    for bad in outs[1:]:
        assert isinstance(bad, ValueError) and str(bad) == "the video world takes 8 finite action values"


def test_python_lists_with_a_missing_value_fail_alone_and_full_lists_step_as_float32(
    starts: list[VideoState],
) -> None:
    """Actions as JSON gives them: plain lists. A gap (None) is an invalid action, not a crash of
    the batch, and a full list steps exactly like the same numbers as a float32 array."""
    world = fresh()
    gap: list[float | None] = [float(x) for x in hold(starts[1])]
    gap[2] = None
    as_list = [float(x) for x in hold(starts[0])]
    outs = world.step_batch([WorldStep(starts[0], as_list), WorldStep(starts[1], gap)])
    assert isinstance(outs[1], ValueError)
    (as_array,) = world.step_batch([WorldStep(starts[0], hold(starts[0]))])
    np.testing.assert_array_equal(outs[0].observation, as_array.observation)
    np.testing.assert_array_equal(outs[0].vector, as_array.vector)


def test_a_step_that_reaches_the_goal_ends_the_episode(starts: list[VideoState]) -> None:
    """The cube put down on the target and the arm held still: the predicted state still meets the
    task's rule (4 cm, at rest), so the step is terminated and says so."""
    world = fresh()
    vector = starts[0].vector.copy()
    vector[8:10], vector[10] = vector[11:13], SHIPPED["rule"]["cube_rest_z"]
    done = VideoState.of(starts[0].latent, vector)
    outs = world.step_batch([WorldStep(done, hold(done)), WorldStep(starts[1], hold(starts[1]))])
    cube, target = outs[0].vector[8:10], outs[0].vector[11:13]
    assert np.linalg.norm(cube - target) < SHIPPED["rule"]["success_radius"]
    assert outs[0].terminated is True and outs[0].info == {"success": True}
    assert outs[1].terminated is False and outs[1].info == {"success": False}


def test_start_refusals_say_why() -> None:
    world = fresh()
    outs = world.initial_states(
        [WorldInit(state=np.zeros(13, np.float32)), WorldInit(seed=0, render=RenderSpec(("wrist",), 64, 64))]
    )
    assert str(outs[0]) == "the video world starts from a seed (its start frame is rendered)"
    assert str(outs[1]) == "the video world renders only 'exterior' at 64x64"


def test_close_before_any_start_and_a_start_after_close() -> None:
    world = fresh()
    world.close()  # nothing was rendered yet: nothing to close
    (first,) = world.initial_states([WorldInit(seed=4)])
    world.close()
    world.close()
    (again,) = world.initial_states([WorldInit(seed=4)])  # a new renderer, the same start
    np.testing.assert_array_equal(first.observation, again.observation)
    world.close()


def test_a_state_made_without_saying_does_not_render(starts: list[VideoState]) -> None:
    assert VideoState.of(starts[0].latent, starts[0].vector).render is False


def test_every_byte_value_survives_the_trip_to_the_network_and_back() -> None:
    image = np.arange(256, dtype=np.uint8).repeat(3).reshape(1, 16, 16, 3)
    frames = uint8_to_frames(image)
    assert frames.dtype == np.float32 and frames.shape == (1, 3, 16, 16)
    assert frames.min() == 0.0 and frames.max() == 1.0
    np.testing.assert_array_equal(frames_to_uint8(frames), image)


def test_the_position_grid_follows_the_inputs_dtype() -> None:
    grid = _coords(2, 8, torch.zeros(1, dtype=torch.float64))
    assert grid.dtype == torch.float64 and grid.shape == (2, 2, 8, 8)
    np.testing.assert_allclose(grid[0, 0, :, 0].numpy(), np.linspace(-1.0, 1.0, 8), rtol=0, atol=1e-15)


def test_a_config_read_back_from_json_equals_the_one_written() -> None:
    config = load_video_world_net(default_checkpoint_dir()).config
    again = VideoWorldConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and hash(again.start) == hash(config.start)
    assert type(again.start.cube_x) is tuple and type(again.action_low) is tuple
