"""`rollserve train policy`'s checkpoint: written before the evaluation, evaluation with small
chunks, the saved (EMA) net's own loss, and the dataset provenance read from the file itself."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.cli import main as cli_main
from rollserve.models.checkpoint import load_flow_policy
from rollserve.training import policy_eval
from rollserve.training.policy import synthetic_dataset

needs_sim = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the sim extra")
TINY = ["--steps", "20", "--hidden-dim", "16", "--depth", "1", "--batch-size", "16"]


@pytest.fixture(scope="module")
def sim_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three scripted-expert episodes without noise, in a folder whose name needs shell quoting."""
    from rollserve.sim.dataset import generate_dataset

    path = tmp_path_factory.mktemp("data") / "my demos" / "d3.npz"
    path.parent.mkdir()
    generate_dataset(3, 0, path, progress=False, action_noise=0.0)
    return path


@pytest.fixture
def synthetic_data(tmp_path: Path) -> Path:
    path = tmp_path / "synthetic.npz"
    np.savez(path, **synthetic_dataset(episodes=3, length=20, action_dim=8))
    return path


def _train(data: Path, out: Path, *extra: str) -> dict[str, Any]:
    assert cli_main(["train", "policy", "--data", str(data), "--out", str(out), *extra]) == 0
    return json.loads((out / "config.json").read_text())["training"]


# -- the checkpoint is written before the evaluation; small chunks evaluate ------------------------


@needs_sim
def test_chunks_shorter_than_8_evaluate_and_keep_their_checkpoint(sim_data: Path, tmp_path: Path) -> None:
    info = _train(sim_data, tmp_path / "ck4", *TINY, "--chunk-size", "4", "--eval-episodes", "1")
    assert load_flow_policy(tmp_path / "ck4").metadata.chunk_size == 4
    evaluation = info["evaluation"]
    assert evaluation["episodes"] == 1 and evaluation["execute_steps"] == 4  # the whole chunk
    assert evaluation["inference_delay"] == 0


def test_a_failing_evaluation_leaves_the_trained_checkpoint(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> dict[str, Any]:
        raise RuntimeError("the sim broke")

    monkeypatch.setattr(policy_eval, "evaluate_policy", broken)
    with pytest.raises(RuntimeError, match="the sim broke"):
        cli_main(["train", "policy", "--data", str(synthetic_data), "--out", str(tmp_path / "ck"), *TINY,
                  "--eval-episodes", "1"])  # fmt: skip
    policy = load_flow_policy(tmp_path / "ck")
    assert policy.info["train_config"]["steps"] == 20 and "evaluation" not in policy.info


def test_default_chunks_evaluate_as_before_and_the_record_ends_with_it(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake(policy: object, **kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return {"episodes": kwargs["episodes"], "successes": 1, "success_rate": 1.0}

    monkeypatch.setattr(policy_eval, "evaluate_policy", fake)
    info = _train(synthetic_data, tmp_path / "ck", *TINY, "--eval-episodes", "3")
    assert calls == [{"episodes": 3, "execute_steps": 8}]
    assert list(info) == [
        "command", "train_config", "dataset", "final_loss_avg100", "final_loss_saved_net",
        "train_seconds", "threads", "torch", "python", "evaluation",
    ]  # fmt: skip
    assert info["evaluation"] == {"episodes": 3, "successes": 1, "success_rate": 1.0}


# -- the saved (EMA) net's loss is reported next to the online net's -----------------------------------


def _mean_loss(net: torch.nn.Module, data: dict[str, Any], chunk_size: int, draws: int = 200) -> float:
    """The flow-matching loss over every frame, averaged over many noise draws (not the code's batch)."""
    from rollserve.training.policy import ChunkDataset, flow_matching_loss

    dataset = ChunkDataset.from_arrays(data, chunk_size)
    states, chunks = torch.from_numpy(dataset.states), torch.from_numpy(dataset.chunks)
    generator = torch.Generator().manual_seed(99)
    with torch.no_grad():
        losses = [flow_matching_loss(net, states, chunks, generator).item() for _ in range(draws)]
    return float(np.mean(losses))


def test_the_saved_nets_loss_is_reported_apart_from_the_training_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stored ``final_loss_saved_net`` is the checkpoint's net's loss (measured here over every
    frame and 200 noise draws), and the printed line names which net each number belongs to."""
    data_path = tmp_path / "synthetic.npz"
    np.savez(data_path, **synthetic_dataset(episodes=6, length=40, action_dim=8))
    info = _train(data_path, tmp_path / "ck", "--steps", "50", "--hidden-dim", "16", "--depth", "1",
                  "--batch-size", "32")  # fmt: skip
    out = capsys.readouterr().out
    independent = _mean_loss(load_flow_policy(tmp_path / "ck").net, dict(np.load(data_path)), 16)
    assert info["final_loss_saved_net"] == pytest.approx(independent, rel=0.05)
    assert "training loss (online net, mean of the last 50 steps)" in out
    assert f"saved EMA net loss (fixed batch) {info['final_loss_saved_net']:.4f}" in out
    assert "still weighs the untrained initial net 95%" in out  # 0.999 ** 50 = 0.951


def test_the_ema_note_stops_once_the_initial_weights_weigh_under_5_percent(capsys) -> None:
    from types import SimpleNamespace

    from rollserve.training.policy import TrainConfig, _report, ema_init_share

    assert ema_init_share(TrainConfig(steps=3000)) == pytest.approx(0.0497, abs=1e-4)  # 0.999 ** 3000
    assert ema_init_share(TrainConfig(steps=2990)) == pytest.approx(0.0502, abs=1e-4)
    assert ema_init_share(TrainConfig()) < 1e-3  # the shipped 8000 steps
    policy = SimpleNamespace(info={"final_loss_avg100": 0.1, "final_loss_saved_net": 0.2})
    _report(policy, TrainConfig(steps=2990), 1.0)
    assert "note: the saved EMA net still weighs the untrained initial net 5%" in capsys.readouterr().out
    _report(policy, TrainConfig(steps=3000), 1.0)
    assert "note:" not in capsys.readouterr().out


# -- provenance: the dataset file's own record, the command shell-quoted --------------------------------


@needs_sim
def test_an_existing_data_file_is_recorded_as_it_was_generated(sim_data: Path, tmp_path: Path) -> None:
    info = _train(sim_data, tmp_path / "prov", "--steps", "2", "--hidden-dim", "8", "--depth", "1")
    assert info["dataset"]["generated_with"] == {"episodes": 3, "seed": 0, "action_noise": 0.0}
    argv = shlex.split(info["command"])
    assert argv[:5] == ["rollserve", "train", "policy", "--data", str(sim_data)]  # one token, space and all
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert (flags["--episodes"], flags["--data-seed"], flags["--action-noise"]) == ("3", "0", "0.0")


def test_a_file_without_a_generation_record_records_none(synthetic_data: Path, tmp_path: Path) -> None:
    info = _train(synthetic_data, tmp_path / "ck", "--steps", "2", "--hidden-dim", "8", "--depth", "1")
    assert info["dataset"]["generated_with"] is None
    argv = shlex.split(info["command"])
    assert not {"--episodes", "--data-seed", "--action-noise"} & set(argv)
