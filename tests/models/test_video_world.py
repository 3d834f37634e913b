"""The shipped video world model, loaded the way ``rollserve serve --world video`` loads it.

Its latent is the encoder's output for the simulator's start frame (computed here independently);
it is functional (a step never changes its input, the same input gives the same output, a bad item
fails alone), batching is one model call whose rows equal single steps, and the decoded frames and
state are what a client sees.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rollserve.models.video_world import (
    FORMAT,
    VideoState,
    VideoWorld,
    _coords,
    decoded_to_images,
    default_checkpoint_dir,
    frames_to_uint8,
    load_video_world_net,
    uint8_to_frames,
)
from rollserve.models.world import RenderSpec, WorldInit, WorldStep
from rollserve.models.worlds import load_world
from rollserve.sim.env import TabletopPickPlaceEnv


@pytest.fixture(scope="module")
def world() -> VideoWorld:
    world = load_world("video")
    assert isinstance(world, VideoWorld)
    yield world
    world.close()


def test_checkpoint_is_small_safetensors_with_its_training_record() -> None:
    path = default_checkpoint_dir()
    assert (path / "model.safetensors").stat().st_size < 20 * 1024 * 1024
    config = json.loads((path / "config.json").read_text())
    assert config["format"] == FORMAT and config["image_size"] >= 64
    report = config["training"]["evaluation"]["horizon_steps"]
    assert {"1", "10", "40"} <= set(report)


def test_start_latent_is_the_encoding_of_the_simulators_start_frame(world: VideoWorld) -> None:
    cfg = world.config
    (out,) = world.initial_states([WorldInit(seed=5)])
    env = TabletopPickPlaceEnv(image_size=(cfg.image_size, cfg.image_size))
    obs, _ = env.reset(seed=5)
    frame = env.render_cameras()[cfg.camera]
    env.close()
    with torch.inference_mode():
        latent = world.net.encode(torch.as_tensor(uint8_to_frames(frame[None]))).numpy()
    assert out.observation.shape == (1, *cfg.latent_shape) and out.observation.dtype == np.float32
    np.testing.assert_allclose(out.observation, latent, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out.vector, obs["state"])
    assert out.images is None  # frames are decoded only for sessions that render


def start(world: VideoWorld, seed: int, render: bool = True) -> VideoState:
    spec = RenderSpec((world.config.camera,), world.config.image_size, world.config.image_size)
    (out,) = world.initial_states([WorldInit(seed=seed, render=spec if render else None)])
    return out.state


def test_steps_are_functional_and_batching_matches_single_steps(world: VideoWorld) -> None:
    states = [start(world, seed) for seed in range(3)]
    actions = [np.r_[s.vector[:7] + 0.1 * (k + 1), 0.5].astype(np.float32) for k, s in enumerate(states)]
    before = [(s.latent.copy(), s.vector.copy()) for s in states]
    batched = world.step_batch([WorldStep(s, a) for s, a in zip(states, actions, strict=True)])
    singles = [world.step_batch([WorldStep(s, a)])[0] for s, a in zip(states, actions, strict=True)]
    again = world.step_batch([WorldStep(states[0], actions[0])])[0]
    for s, (latent, vector) in zip(states, before, strict=True):  # inputs untouched
        np.testing.assert_array_equal(s.latent, latent)
        np.testing.assert_array_equal(s.vector, vector)
        assert not s.latent.flags.writeable
    np.testing.assert_array_equal(again.observation, singles[0].observation)
    for b, one in zip(batched, singles, strict=True):
        np.testing.assert_allclose(b.observation, one.observation, atol=1e-4)
        np.testing.assert_allclose(b.vector, one.vector, atol=1e-4)
        image = b.images[world.config.camera]
        assert image.dtype == np.uint8 and image.shape == (64, 64, 3)
        assert not np.array_equal(b.observation[0], states[0].latent)  # the latent moved


def test_a_bad_item_fails_alone(world: VideoWorld) -> None:
    good = start(world, 1, render=False)
    outs = world.step_batch(
        [
            WorldStep(good, np.zeros(8, np.float32)),
            WorldStep("not a state", np.zeros(8, np.float32)),
            WorldStep(good, np.full(8, np.nan, np.float32)),
        ]
    )
    assert outs[0].images is None and outs[0].observation.shape[0] == 1
    assert isinstance(outs[1], TypeError) and isinstance(outs[2], ValueError)


def test_wrong_render_requests_and_start_states_are_refused(world: VideoWorld) -> None:
    outs = world.initial_states(
        [
            WorldInit(seed=0, render=RenderSpec(("wrist",), 64, 64)),
            WorldInit(seed=0, render=RenderSpec(("exterior",), 32, 32)),
            WorldInit(state=np.zeros(13, np.float32)),
        ]
    )
    assert all(isinstance(o, ValueError) for o in outs)


def test_actions_far_outside_the_data_keep_the_rollout_finite(world: VideoWorld) -> None:
    state = start(world, 2)
    low, high = np.asarray(world.spec.action_low), np.asarray(world.spec.action_high)
    rng = np.random.default_rng(0)
    for _ in range(30):  # random joint targets over the whole range: nothing like the expert's data
        (out,) = world.step_batch([WorldStep(state, rng.uniform(low, high).astype(np.float32))])
        state = out.state
        assert np.all(np.isfinite(out.observation)) and np.all(np.isfinite(out.vector))


def test_step_batch_equals_the_model_step_with_clipping_bounds_and_the_task_rule(world: VideoWorld) -> None:
    """Every output field, computed here from ``net.step`` (the training path), exactly."""
    states = [start(world, seed, render=seed % 2 == 0) for seed in range(4)]
    high = np.asarray(world.spec.action_high, np.float32)
    actions = [np.r_[s.vector[:7] + 0.05 * k, 0.3].astype(np.float32) for k, s in enumerate(states)]
    actions[1] = high + 1.0  # clipped to the action box
    actions[2] = list(map(float, actions[2]))  # a plain list converts like an array
    outs = world.step_batch([WorldStep(s, a) for s, a in zip(states, actions, strict=True)])
    low = np.asarray(world.spec.action_low, np.float32)
    clipped = np.clip(np.array(actions, np.float32), low, high)
    with torch.inference_mode():
        z, v = world.net.step(
            torch.as_tensor(np.stack([s.latent for s in states])),
            torch.as_tensor(np.stack([s.vector for s in states])),
            torch.as_tensor(clipped),
        )
        z = torch.nan_to_num(z).clamp(-50.0, 50.0)
        v = torch.nan_to_num(v).clamp(-4.0, 4.0)
        frames = world.net.decode(z[::2], v[::2]).numpy()
    rule = world.config.rule
    success = rule.success(v.numpy())
    reward = rule.reward(v.numpy(), success)
    for row, out in enumerate(outs):
        np.testing.assert_array_equal(out.observation, z.numpy()[row][None])
        np.testing.assert_array_equal(out.vector, v.numpy()[row])
        np.testing.assert_array_equal(out.state.latent, z.numpy()[row])
        assert not out.state.latent.flags.writeable and not out.state.vector.flags.writeable
        assert out.state.latent.base is None  # its own copy, not a view keeping the batch alive
        assert out.reward == float(reward[row]) and type(out.reward) is float
        assert out.terminated is bool(success[row]) and out.info == {"success": bool(success[row])}
        assert out.state.render is (row % 2 == 0)
        if row % 2 == 0:
            expected = (np.clip(frames[row // 2], 0, 1) * 255 + 0.5).astype(np.uint8).transpose(1, 2, 0)
            np.testing.assert_array_equal(out.images[world.config.camera], expected)
        else:
            assert out.images is None


def test_a_batch_checked_at_once_equals_one_checked_item_by_item(world: VideoWorld) -> None:
    """A bad item sends the batch through the per-item checks; the good items' answers don't change."""
    states = [start(world, seed, render=False) for seed in range(3)]
    actions = [np.r_[s.vector[:7] + 0.1, 0.5].astype(np.float32) for s in states]
    at_once = world.step_batch([WorldStep(s, a) for s, a in zip(states, actions, strict=True)])
    bad = [WorldStep(states[0], None), WorldStep(states[1], np.zeros(7, np.float32))]
    mixed = world.step_batch(
        [bad[0], *(WorldStep(s, a) for s, a in zip(states, actions, strict=True)), bad[1]]
    )
    assert isinstance(mixed[0], ValueError) and isinstance(mixed[-1], ValueError)
    for one, other in zip(at_once, mixed[1:-1], strict=True):
        np.testing.assert_array_equal(one.observation, other.observation)
        np.testing.assert_array_equal(one.vector, other.vector)
        assert (one.reward, one.terminated, one.info) == (other.reward, other.terminated, other.info)


def test_images_from_the_decoder_in_torch_equal_the_numpy_conversion() -> None:
    gen = torch.Generator().manual_seed(3)
    decoded = torch.rand(5, 3, 64, 64, generator=gen) * 1.4 - 0.2  # values outside [0, 1] too
    decoded[0, 0, 0, :4] = torch.tensor([0.0, 1.0, 0.5 / 255.0, 254.5 / 255.0])  # rounding edges
    expected = frames_to_uint8(decoded.numpy().copy())
    got = decoded_to_images(decoded)
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("render", [(True, True, True), (False, True, False)])
def test_frames_of_a_batch_equal_the_decoders_frames_of_the_rendering_rows(
    world: VideoWorld, render: tuple[bool, ...]
) -> None:
    states = [start(world, seed, render=r) for seed, r in enumerate(render)]
    actions = [np.r_[s.vector[:7] + 0.1, 0.5].astype(np.float32) for s in states]
    outs = world.step_batch([WorldStep(s, a) for s, a in zip(states, actions, strict=True)])
    rows = [i for i, r in enumerate(render) if r]
    with torch.inference_mode():
        z, v = world.net.step(
            torch.as_tensor(np.stack([s.latent for s in states])),
            torch.as_tensor(np.stack([s.vector for s in states])),
            torch.as_tensor(
                np.clip(np.array(actions), world.spec.action_low, world.spec.action_high).astype(np.float32)
            ),
        )
        z, v = torch.nan_to_num(z).clamp(-50.0, 50.0), torch.nan_to_num(v).clamp(-4.0, 4.0)
        drawn = frames_to_uint8(world.net.decode(z[rows], v[rows]).numpy())
    for k, row in enumerate(rows):
        np.testing.assert_array_equal(outs[row].images[world.config.camera], drawn[k])
    assert all(outs[i].images is None for i, r in enumerate(render) if not r)


def test_served_linear_weights_are_stored_transposed_with_the_same_values(world: VideoWorld) -> None:
    """The served net keeps its Linear weights as transposes of row-major arrays (a faster sgemm
    path); its outputs equal the same net's with the weights laid out as trained, to float rounding
    (bit for bit at 16 rows and more on this machine; MKL sums small batches in another order)."""
    linears = [m for m in world.net.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    plain = load_video_world_net(default_checkpoint_dir()).to(memory_format=torch.channels_last)
    assert all(m.weight.is_contiguous() for m in plain.modules() if isinstance(m, torch.nn.Linear))
    for name, param in plain.named_parameters():
        assert torch.equal(param, world.net.get_parameter(name))
    states = [start(world, seed, render=False) for seed in range(6)]
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 6, 32):
        picked = [states[i % len(states)] for i in range(rows)]
        latent = torch.as_tensor(np.stack([s.latent for s in picked]))
        vector = torch.as_tensor(np.stack([s.vector for s in picked]))
        action = vector[:, :8] + 0.1 * torch.randn(rows, 8, generator=gen)
        with torch.inference_mode():
            served, trained = world.net.step(latent, vector, action), plain.step(latent, vector, action)
            frames = world.net.decode(*served), plain.decode(*trained)
        for got, expected in zip((*served, frames[0]), (*trained, frames[1]), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_the_cached_position_grid_serves_training_after_inference() -> None:
    """The CoordConv grid is made once; one made during a served step still works under autograd
    (an inference-mode tensor would refuse to be saved for backward)."""
    net = load_video_world_net(default_checkpoint_dir())
    cfg = net.config
    latent = torch.zeros(2, *cfg.latent_shape)
    state, action = torch.zeros(2, cfg.state_dim), torch.zeros(2, cfg.action_dim)
    with torch.inference_mode():
        net.step(latent, state, action)
    latent.requires_grad_(True)
    next_latent, next_state = net.step(latent, state, action)
    (next_latent.sum() + net.decode(next_latent, next_state).sum()).backward()
    assert latent.grad is not None and torch.isfinite(latent.grad).all()
    axis = torch.linspace(-1.0, 1.0, net.config.latent_side)
    expected = torch.stack(torch.meshgrid(axis, axis, indexing="ij"))
    assert torch.equal(_coords(3, net.config.latent_side, latent)[2], expected)


def test_a_state_is_its_own_read_only_float32_c_ordered_copy() -> None:
    """A session's state must not change when the arrays it was made from do, and must be what
    the batch stacks without conversion: float32, C order, read-only."""
    latent = np.asfortranarray(np.arange(16 * 8 * 8, dtype=np.float64).reshape(16, 8, 8) / 7.0)
    vector = np.linspace(-1.0, 1.0, 13)  # float64
    state = VideoState.of(latent, vector)
    for made, source in ((state.latent, latent), (state.vector, vector)):
        assert made.dtype == np.float32 and made.flags.c_contiguous and not made.flags.writeable
        assert not np.shares_memory(made, source)
        np.testing.assert_array_equal(made, source.astype(np.float32))
    latent[0, 0, 0] = vector[0] = 99.0
    assert state.latent[0, 0, 0] == 0.0 and state.vector[0] == -1.0
