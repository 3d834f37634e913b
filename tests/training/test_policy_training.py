"""Policy training: chunk targets, loss goes down, the CLI writes a loadable checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from rollserve.models.checkpoint import load_flow_policy
from rollserve.training import policy as training
from rollserve.training.policy import TrainConfig, chunk_indices, synthetic_dataset, train_flow_policy


def test_chunk_targets_repeat_the_last_action_of_each_episode() -> None:
    episodes = np.array([0, 0, 0, 1, 1])
    np.testing.assert_array_equal(
        chunk_indices(episodes, 4), [[0, 1, 2, 2], [1, 2, 2, 2], [2, 2, 2, 2], [3, 4, 4, 4], [4, 4, 4, 4]]
    )


def test_training_reduces_the_loss() -> None:
    torch.set_num_threads(1)
    data = synthetic_dataset(episodes=6, length=30, action_dim=4)
    config = TrainConfig(steps=150, batch_size=32, chunk_size=8, hidden_dim=32, depth=1, warmup_steps=10)
    policy, losses = train_flow_policy(data, config)
    assert np.mean(losses[-20:]) < 0.7 * np.mean(losses[:20])
    assert policy.metadata.chunk_size == 8 and policy.metadata.action_names == ("a0", "a1", "a2", "a3")


def test_cli_trains_and_writes_a_checkpoint(tmp_path: Path) -> None:
    data_path = tmp_path / "demo.npz"
    np.savez(data_path, **synthetic_dataset(episodes=3, length=20, action_dim=8))
    parser = argparse.ArgumentParser()
    training.add_arguments(parser)
    args = parser.parse_args(
        ["--data", str(data_path), "--out", str(tmp_path / "ckpt"), "--steps", "5", "--hidden-dim", "16"]
    )
    assert training.main(args) == 0
    policy = load_flow_policy(tmp_path / "ckpt")
    assert policy.info["train_config"]["steps"] == 5
    assert policy.info["command"].startswith("rollserve train policy --data ")
    chunk = policy.predict_action_chunk({"state": np.zeros(policy.metadata.state_dim, np.float32)})
    assert chunk.shape == (16, 8)
