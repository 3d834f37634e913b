"""The shipped video world against the simulator it was trained on, through the served world.

Other tests check the world against its own network (batching, layouts, bounds), which a slip in the
network's arithmetic would pass. Here the truth is MuJoCo: the scripted expert drives the simulator
for 10 steps from two held-out seeds, the served world steps with the same actions, and its decoded
frames and predicted state must stay close to the simulator's. The bounds leave a margin of a few
dB and a few times the error measured on 2026-12-02 (reconstruction 29.6-29.8 dB, frames 24.3-29.7
dB, 7-9.6 dB better than a frozen first frame after 10 steps; joints within 0.039 rad, the cube
within 10.4 mm); the training report in ``config.json`` gives the same picture over 8 episodes.
"""

from __future__ import annotations

import numpy as np
import pytest

from rollserve.models.video_world import VideoWorld
from rollserve.models.world import RenderSpec, WorldInit, WorldOutput, WorldStep
from rollserve.models.worlds import load_world
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.expert import ScriptedExpert

STEPS = 10


def psnr_db(image: np.ndarray, truth: np.ndarray) -> float:
    """PSNR of two uint8 images, written out here rather than taken from the training code."""
    mse = np.mean((image.astype(np.float64) / 255.0 - truth.astype(np.float64) / 255.0) ** 2)
    return float(10.0 * np.log10(1.0 / mse))


@pytest.mark.parametrize("seed", [7, 8])
def test_the_served_video_world_follows_the_simulator_for_ten_expert_steps(seed: int) -> None:
    world = load_world("video")
    assert isinstance(world, VideoWorld)
    cfg = world.config
    env = TabletopPickPlaceEnv(image_size=(cfg.image_size, cfg.image_size), terminate_on_success=False)
    try:
        expert = ScriptedExpert()
        obs, _ = env.reset(seed=seed)
        expert.reset(obs)
        first = env.render_cameras()[cfg.camera]
        render = RenderSpec((cfg.camera,), cfg.image_size, cfg.image_size)
        (out,) = world.initial_states([WorldInit(seed=seed, render=render)])
        assert isinstance(out, WorldOutput) and out.images is not None
        assert psnr_db(out.images[cfg.camera], first) >= 27.0  # the start frame, encoded and decoded
        for _ in range(STEPS):
            action = expert.act(obs).copy()
            obs, *_ = env.step(action)
            (out,) = world.step_batch([WorldStep(out.state, action, {})])
            assert isinstance(out, WorldOutput) and out.images is not None
            truth = env.render_cameras()[cfg.camera]
            assert psnr_db(out.images[cfg.camera], truth) >= 22.0
            assert np.abs(out.vector[:7] - obs["state"][:7]).max() <= 0.08  # joints, rad
            assert np.linalg.norm(out.vector[8:11] - obs["state"][8:11]) <= 0.03  # the cube, m
        # after 10 steps the arm has moved: the imagined frame beats the frozen first one clearly
        assert psnr_db(out.images[cfg.camera], truth) >= psnr_db(first, truth) + 4.0
    finally:
        env.close()
        world.close()
