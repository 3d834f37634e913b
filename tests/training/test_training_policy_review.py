"""Review tests of `rollserve train policy` and its sim evaluation (mutation module `training_policy`):
the learning-rate schedule, the flow-matching loss, the chunk targets, the optimiser and EMA steps,
the training record, the dataset refusals and the chunk player, each pinned against a reference
computed here, with tiny configs so a test takes well under a second."""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.cli import UsageError
from rollserve.models.checkpoint import default_checkpoint_dir, load_flow_policy
from rollserve.models.flow_net import FlowNetConfig, VelocityNet
from rollserve.models.flow_policy import DEFAULT_RTC
from rollserve.models.policy import Processors
from rollserve.training import policy, policy_eval
from rollserve.training.policy import TrainConfig
from rollserve.training.policy_eval import ChunkActor, evaluate_policy

MIN_STD = 1e-2  # the statistics' floor on a dimension's scale (flow_stats.MIN_STD)


# -- references computed here ----------------------------------------------------------------------


def _ref_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps (step 0 already at ``lr / warmup``), then half a
    cosine from ``lr`` down to 0 at ``steps``, 0 beyond."""
    if step < warmup:
        return lr * (step + 1) / warmup
    span = steps - warmup if steps > warmup else 1
    progress = min(1.0, (step - warmup) / span)
    return lr * (1 + math.cos(math.pi * progress)) / 2


def _ref_chunk_index(episodes: list[int], size: int) -> list[list[int]]:
    """Frame t's chunk: frames t..t+size-1, each capped at the last frame of t's own episode."""
    out = []
    for t, episode in enumerate(episodes):
        last = t
        while last + 1 < len(episodes) and episodes[last + 1] == episode:
            last += 1
        out.append([min(t + k, last) for k in range(size)])
    return out


def _ref_normalised(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x`` in units of its per-dimension spread (the spread floored at 1e-2), and the moments."""
    wide = np.asarray(x, np.float64)
    mean = wide.mean(0).astype(np.float32)
    std = np.maximum(wide.std(0), MIN_STD).astype(np.float32)
    return ((np.asarray(x, np.float32) - mean) / std).astype(np.float32), mean, std


def _ref_dataset(data: dict[str, Any], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised states and chunk targets of the successful episodes' frames."""
    episodes = np.asarray(data["episode_index"])
    keep = np.asarray(data["success"], bool)[episodes] if "success" in data else np.ones(len(episodes), bool)
    states, _, _ = _ref_normalised(data["states"][keep])
    actions, _, _ = _ref_normalised(data["actions"][keep])
    index = np.array(_ref_chunk_index(list(episodes[keep]), size))
    return torch.from_numpy(states), torch.from_numpy(actions[index])


def _ref_loss(net: Any, states: torch.Tensor, chunks: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Flow matching on the straight path: noise, then one tau per row, drawn in that order."""
    noise = torch.randn(chunks.shape, generator=gen)
    tau = torch.rand(chunks.shape[0], generator=gen)
    t = tau.view(-1, 1, 1)
    target = chunks - noise
    return ((net(t * chunks + (1 - t) * noise, states, tau) - target) ** 2).mean()


def _data(episodes: int = 3, length: int = 12, action_dim: int = 3, seed: int = 0) -> dict[str, Any]:
    """A small dataset whose numbers differ per frame (so a wrong row shows), one episode failed."""
    rng = np.random.default_rng(seed)
    frames = episodes * length
    return {
        "states": rng.normal(2.0, 3.0, (frames, 5)).astype(np.float32),
        "actions": rng.normal(-1.0, 0.5, (frames, action_dim)).astype(np.float32),
        "episode_index": np.repeat(np.arange(episodes), length).astype(np.int64),
        "frame_index": np.tile(np.arange(length), episodes).astype(np.int64),
        "success": np.array([True, False, True] + [True] * (episodes - 3)),
        "meta_json": np.array(json.dumps({"action_names": [f"j{i}" for i in range(action_dim)],
                                          "state_names": [f"s{i}" for i in range(5)], "control_hz": 12.5})),
    }  # fmt: skip


# -- the learning-rate schedule and the EMA share --------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.025),  # 0.1 * 1/4: the first step already moves
        (2, 0.075),
        (3, 0.1),  # the warm-up's last step is at the peak
        (4, 0.1),  # the cosine starts at the peak
        (12, 0.05),  # half way through the 16 decay steps
        (20, 0.0),  # the last step
        (24, 0.0),  # past the end it stays at 0 (no second cosine half)
    ],
)
def test_the_learning_rate_warms_up_then_decays_on_a_cosine(step: int, expected: float) -> None:
    config = TrainConfig(steps=20, warmup_steps=4, lr=0.1)
    assert policy._lr_at(step, config) == pytest.approx(expected, abs=1e-12)
    assert _ref_lr(step, 0.1, 4, 20) == pytest.approx(expected, abs=1e-12)


def test_the_learning_rate_decays_at_once_when_the_run_is_no_longer_than_its_warm_up() -> None:
    config = TrainConfig(steps=4, warmup_steps=4, lr=0.2)
    assert [policy._lr_at(s, config) for s in range(6)] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.0])


def test_the_learning_rate_follows_the_schedule_at_every_step() -> None:
    config = TrainConfig(steps=37, warmup_steps=9, lr=3e-3)
    got = [policy._lr_at(s, config) for s in range(40)]
    assert got == pytest.approx([_ref_lr(s, 3e-3, 9, 37) for s in range(40)], abs=1e-15)


@pytest.mark.parametrize(
    ("decay", "steps", "share"), [(0.5, 3, 0.125), (0.9, 1, 0.9), (0.0, 0, 0.0), (0.0, 5, 0.0), (0.3, 0, 1.0)]
)
def test_the_ema_share_of_the_initial_net_is_the_decay_to_the_steps(
    decay: float, steps: int, share: float
) -> None:
    assert policy.ema_init_share(TrainConfig(steps=steps, ema_decay=decay)) == pytest.approx(share)


def test_the_training_defaults_are_the_shipped_checkpoints() -> None:
    """The shipped policy's record says how it was trained: the defaults train the same."""
    shipped = json.loads((default_checkpoint_dir() / "config.json").read_text())["training"]
    assert shipped["train_config"] == {
        "steps": 8000, "batch_size": 256, "lr": 0.001, "weight_decay": 0.0001, "warmup_steps": 500,
        "seed": 0, "chunk_size": 16, "hidden_dim": 256, "depth": 3, "time_embed_dim": 64,
        "num_steps": 10, "state_noise": 0.0, "ema_decay": 0.999,
    }  # fmt: skip
    from dataclasses import asdict

    assert asdict(TrainConfig()) == shipped["train_config"]
    assert (policy.DEFAULT_EPISODES, policy.DEFAULT_ACTION_NOISE) == (200, 0.02)


# -- chunk targets and the dataset -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("episodes", "size"),
    [
        ([0, 0, 0, 1, 1], 4),
        ([0], 3),
        ([3, 3, 5, 7, 7, 7, 7, 2], 3),  # single-frame episodes, ids not in order
        ([0, 0, 0, 0], 1),
        ([1, 1, 1, 0, 0, 0], 5),
    ],
)
def test_chunk_targets_stop_at_the_end_of_their_episode(episodes: list[int], size: int) -> None:
    got = policy.chunk_indices(np.array(episodes, np.int64), size)
    assert got.shape == (len(episodes), size)
    assert got.tolist() == _ref_chunk_index(episodes, size)


def test_the_chunk_dataset_keeps_the_successful_episodes_normalised() -> None:
    data = _data()
    dataset = policy.ChunkDataset.from_arrays(data, 4)
    keep = np.repeat([True, False, True], 12)
    states, state_mean, state_std = _ref_normalised(data["states"][keep])
    actions, action_mean, action_std = _ref_normalised(data["actions"][keep])
    assert dataset.states.dtype == np.float32 and dataset.chunks.dtype == np.float32
    np.testing.assert_allclose(dataset.states, states, rtol=0, atol=1e-6)
    index = np.array(_ref_chunk_index([0] * 12 + [2] * 12, 4))
    assert dataset.chunks.shape == (24, 4, 3)
    np.testing.assert_allclose(dataset.chunks, actions[index], rtol=0, atol=1e-6)
    stats = dataset.stats
    for got, want in ((stats.state_mean, state_mean), (stats.state_std, state_std),
                      (stats.action_mean, action_mean), (stats.action_std, action_std)):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert dataset.meta == {"action_names": ["j0", "j1", "j2"], "state_names": [f"s{i}" for i in range(5)],
                            "control_hz": 12.5}  # fmt: skip


def test_a_dataset_without_success_flags_or_meta_keeps_every_frame() -> None:
    data = _data()
    del data["success"], data["meta_json"]
    dataset = policy.ChunkDataset.from_arrays(data, 2)
    states, _ = _ref_dataset(data, 2)
    assert dataset.meta == {} and dataset.chunks.shape == (36, 2, 3)
    np.testing.assert_allclose(dataset.states, states.numpy(), rtol=0, atol=1e-6)


def test_a_dataset_written_with_other_dtypes_gives_the_same_chunks() -> None:
    """Flags as 0/1 and episode ids as floats (another tool's file) mean what bools and ints do."""
    data = _data()
    loose = dict(data, success=data["success"].astype(np.int64), episode_index=data["episode_index"] * 1.0)
    loose.update(states=data["states"].astype(np.float64), actions=data["actions"].astype(np.float64))
    want, got = policy.ChunkDataset.from_arrays(data, 3), policy.ChunkDataset.from_arrays(loose, 3)
    assert got.states.shape == (24, 5) and got.chunks.dtype == np.float32
    np.testing.assert_array_equal(got.states, want.states)
    np.testing.assert_array_equal(got.chunks, want.chunks)


def test_a_constant_dimension_is_scaled_by_the_floor() -> None:
    data = _data()
    data["states"][:, 1] = 4.0
    data["actions"][:, 0] = 0.25 + np.arange(36) * 1e-4  # a spread of ~1e-3, under the floor
    dataset = policy.ChunkDataset.from_arrays(data, 2)
    assert dataset.stats.state_std[1] == pytest.approx(MIN_STD) and np.all(dataset.states[:, 1] == 0)
    assert dataset.stats.action_std[0] == pytest.approx(MIN_STD)


# -- the loss ----------------------------------------------------------------------------------------


class _RecordingNet:
    """A stand-in velocity field, linear in its inputs, that keeps what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, x: torch.Tensor, states: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        self.calls.append((x, states, tau))
        return 0.5 * x + tau.view(-1, 1, 1) - states.sum(-1).view(-1, 1, 1)


def test_the_flow_loss_regresses_the_straight_path_velocity() -> None:
    gen = torch.Generator().manual_seed(4)
    chunks = torch.randn((5, 3, 2), generator=gen) + 2.0
    states = torch.randn((5, 4), generator=gen)
    net = _RecordingNet()
    loss = policy.flow_matching_loss(net, states, chunks, torch.Generator().manual_seed(11))
    ref_gen = torch.Generator().manual_seed(11)
    noise = torch.randn((5, 3, 2), generator=ref_gen)
    tau = torch.rand(5, generator=ref_gen)
    ((x, seen_states, seen_tau),) = net.calls
    torch.testing.assert_close(seen_tau, tau)
    assert torch.equal(seen_states, states)
    for row in range(5):  # the point on the line from noise (tau 0) to the chunk (tau 1)
        torch.testing.assert_close(x[row], tau[row] * chunks[row] + (1 - tau[row]) * noise[row])
    out = 0.5 * x + tau.view(-1, 1, 1) - states.sum(-1).view(-1, 1, 1)
    expected = sum(float(((out[r] - (chunks[r] - noise[r])) ** 2).sum()) for r in range(5)) / 30
    assert loss.ndim == 0 and loss.item() == pytest.approx(expected, rel=1e-6)


def _tiny_net(state_dim: int = 5, action_dim: int = 3, chunk: int = 4, seed: int = 0) -> VelocityNet:
    torch.manual_seed(seed)
    return VelocityNet(FlowNetConfig(chunk_size=chunk, action_dim=action_dim, state_dim=state_dim,
                                     hidden_dim=8, depth=1, time_embed_dim=4))  # fmt: skip


@pytest.mark.parametrize("seed", [0, 5])
def test_the_saved_nets_loss_is_scored_on_a_fixed_batch(seed: int) -> None:
    data, net = _data(), _tiny_net()
    states, chunks = _ref_dataset(data, 4)
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(24, generator=gen)
    with torch.no_grad():
        expected = _ref_loss(net, states[rows], chunks[rows], gen).item()
    got = policy.fixed_batch_loss(net, data, 4, seed=seed) if seed else policy.fixed_batch_loss(net, data, 4)
    assert type(got) is float and got == pytest.approx(expected, rel=1e-5)
    assert policy.fixed_batch_loss(net, data, 4, seed=seed) == got  # the same every time


def test_the_fixed_batch_holds_at_most_8192_rows() -> None:
    data = policy.synthetic_dataset(episodes=205, length=40, action_dim=2)  # 8200 frames
    net = _tiny_net(state_dim=6, action_dim=2, chunk=2)
    states, chunks = _ref_dataset(data, 2)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randperm(8200, generator=gen)[:8192]
    with torch.no_grad():
        expected = _ref_loss(net, states[rows], chunks[rows], gen).item()
    assert policy.fixed_batch_loss(net, data, 2) == pytest.approx(expected, rel=1e-5)


# -- the optimiser, the EMA and what the trained policy carries -----------------------------------


def _reference_training(
    data: dict[str, Any], config: TrainConfig
) -> tuple[VelocityNet, VelocityNet, list[float]]:
    """The online and EMA nets after ``config.steps`` AdamW steps on the schedule above, and the losses."""
    states, chunks = _ref_dataset(data, config.chunk_size)
    torch.manual_seed(config.seed)
    net = VelocityNet(FlowNetConfig(chunk_size=config.chunk_size, action_dim=chunks.shape[-1],
                                    state_dim=states.shape[-1], hidden_dim=config.hidden_dim,
                                    depth=config.depth, time_embed_dim=config.time_embed_dim))  # fmt: skip
    ema = {name: p.detach().clone() for name, p in net.named_parameters()}
    optimizer = torch.optim.AdamW(net.parameters(), lr=1.0, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    losses = []
    for step in range(config.steps):
        rows = torch.randint(len(states), (config.batch_size,), generator=gen)
        batch = states[rows]
        if config.state_noise:
            batch = batch + config.state_noise * torch.randn(batch.shape, generator=gen)
        optimizer.param_groups[0]["lr"] = _ref_lr(step, config.lr, config.warmup_steps, config.steps)
        loss = _ref_loss(net, batch, chunks[rows], gen)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        for name, p in net.named_parameters():
            ema[name] = config.ema_decay * ema[name] + (1 - config.ema_decay) * p.detach()
        losses.append(loss.item())
    ema_net = VelocityNet(net.config)
    ema_net.load_state_dict(ema, strict=False)
    return net, ema_net, losses


def _assert_same_weights(got: torch.nn.Module, want: torch.nn.Module) -> None:
    for (name, p), q in zip(got.named_parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=2e-6, msg=name)


TRAIN = {"steps": 4, "batch_size": 6, "chunk_size": 4, "hidden_dim": 8, "depth": 1, "time_embed_dim": 4,
         "warmup_steps": 3, "lr": 0.05, "weight_decay": 0.3, "seed": 3}  # fmt: skip


@pytest.mark.parametrize("state_noise", [0.0, 0.4])
def test_training_takes_adamw_steps_on_the_schedule_and_saves_the_ema(state_noise: float) -> None:
    """Four steps (three of warm-up, one of decay) with a strong weight decay and an EMA of 0.6."""
    torch.set_num_threads(1)
    config = TrainConfig(**TRAIN, state_noise=state_noise, ema_decay=0.6)
    seen: list[tuple[int, float]] = []
    trained, losses = policy.train_flow_policy(_data(), config, on_step=lambda s, v: seen.append((s, v)))
    _, ema, ref_losses = _reference_training(_data(), config)
    assert losses == pytest.approx(ref_losses, rel=1e-5) and all(type(v) is float for v in losses)
    assert seen == list(enumerate(losses))
    _assert_same_weights(trained.net, ema)
    assert not any(p.requires_grad for p in trained.net.parameters())  # the average, never trained itself


def test_training_without_an_ema_saves_the_online_net() -> None:
    torch.set_num_threads(1)
    config = TrainConfig(**TRAIN, ema_decay=0.0)
    trained, _ = policy.train_flow_policy(_data(), config)
    online, _, _ = _reference_training(_data(), config)
    _assert_same_weights(trained.net, online)
    assert all(p.requires_grad for p in trained.net.parameters())  # the optimised net itself, no copy


def test_the_trained_policy_carries_the_datasets_names_and_rate() -> None:
    config = TrainConfig(steps=1, batch_size=2, chunk_size=4, hidden_dim=8, depth=1, num_steps=3, seed=9)
    trained, _ = policy.train_flow_policy(_data(), config)
    meta = trained.metadata
    assert meta.action_names == ("j0", "j1", "j2") and meta.fps == 12.5 and meta.chunk_size == 4
    assert trained.state_names == tuple(f"s{i}" for i in range(5)) and meta.state_dim == 5
    assert trained.num_steps == 3 and trained.rtc == DEFAULT_RTC
    state = {"state": np.ones(5, np.float32)}
    own = trained.predict_action_chunk(dict(trained.preprocess(state)))  # its own noise, seeded with 9
    np.testing.assert_array_equal(own, trained.predict_action_chunk({**trained.preprocess(state), "seed": 9}))


def test_a_dataset_without_meta_gets_numbered_names_and_15_hz() -> None:
    data = _data()
    del data["meta_json"]
    trained, _ = policy.train_flow_policy(
        data, TrainConfig(steps=1, batch_size=2, chunk_size=2, hidden_dim=8)
    )
    assert trained.metadata.action_names == ("action_0", "action_1", "action_2")
    assert trained.state_names == tuple(f"state_{i}" for i in range(5)) and trained.metadata.fps == 15.0


# -- the command: the dataset, the record, the report ----------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    policy.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag_defaults_train_the_shipped_checkpoint() -> None:
    args = _parse()
    assert vars(args) == {
        "data": None, "episodes": 200, "data_seed": 0, "action_noise": 0.02, "out": Path("runs/flow_policy"),
        "steps": 8000, "seed": 0, "batch_size": 256, "lr": 0.001, "chunk_size": 16, "hidden_dim": 256,
        "depth": 3, "state_noise": 0.0, "threads": 1, "eval_episodes": 0,
    }  # fmt: skip
    shipped = json.loads((default_checkpoint_dir() / "config.json").read_text())["training"]
    args.data = Path("data/tabletop_200ep_seed0_noise0.02.npz")
    generated = {"episodes": 200, "seed": 0, "action_noise": 0.02}
    assert policy._command_line(args, generated) == shipped["command"]


POLICY_HELP = {
    "--data": "dataset .npz, generated if absent (default data/tabletop_<episodes>ep_seed<s>_noise<n>.npz)",
    "--episodes": "episodes when generating",
    "--data-seed": "seed when generating the dataset",
    "--action-noise": "expert noise when generating",
    "--out": "checkpoint directory",
    "--steps": "optimiser steps (default 8000); the learning rate warms up linearly over the first 500 "
    "(never finishing in a shorter run), then decays to 0; the saved net is an EMA (decay 0.999) that "
    "needs about 3000 steps to forget the untrained initial weights",
    "--seed": "seed of the initial weights, the batches and the training noise, and of the saved policy's "
    "own sampling noise",
    "--batch-size": "frames per optimiser step",
    "--lr": "peak learning rate (AdamW, after the warm-up)",
    "--chunk-size": "actions the policy predicts per call",
    "--hidden-dim": "width of the velocity net",
    "--depth": "residual blocks of the velocity net",
    "--state-noise": "std of Gaussian noise on the normalised training states (robustness to drift; 0: none)",
    "--threads": "torch CPU threads (1 = reproducible)",
    "--eval-episodes": "evaluate in the sim afterwards (0: no)",
}


def test_each_policy_flag_says_what_it_sets() -> None:
    parser = argparse.ArgumentParser()
    policy.add_arguments(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings[0] != "-h"}
    assert helps == POLICY_HELP


@pytest.mark.parametrize(
    ("flag", "text", "value"),
    [
        ("--episodes", "7", 7), ("--data-seed", "0", 0), ("--action-noise", "0", 0.0),
        ("--action-noise", "0.5", 0.5), ("--steps", "3", 3), ("--seed", "0", 0), ("--batch-size", "2", 2),
        ("--lr", "0.25", 0.25), ("--chunk-size", "5", 5), ("--hidden-dim", "9", 9), ("--depth", "0", 0),
        ("--state-noise", "0", 0.0), ("--state-noise", "0.1", 0.1), ("--threads", "2", 2),
        ("--eval-episodes", "0", 0), ("--eval-episodes", "4", 4),
    ],
)  # fmt: skip
def test_the_policy_flags_parse_to_their_types(flag: str, text: str, value: Any) -> None:
    got = getattr(_parse(flag, text), flag[2:].replace("-", "_"))
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("--episodes", "0"), ("--data-seed", "-1"), ("--action-noise", "-0.1"), ("--steps", "0"),
        ("--seed", "-1"), ("--batch-size", "0"), ("--lr", "0"), ("--chunk-size", "0"), ("--hidden-dim", "0"),
        ("--depth", "-1"), ("--state-noise", "-0.5"), ("--threads", "0"), ("--eval-episodes", "-1"),
    ],
)  # fmt: skip
def test_the_policy_flags_refuse_what_they_cannot_use(flag: str, text: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        _parse(flag, text)
    assert f"argument {flag}: " in capsys.readouterr().err


def test_the_file_flags_parse_to_paths(tmp_path: Path) -> None:
    args = _parse("--data", str(tmp_path / "d.npz"), "--out", str(tmp_path / "o"))
    assert args.data == tmp_path / "d.npz" and args.out == tmp_path / "o"
    with pytest.raises(SystemExit):
        _parse("--data", str(tmp_path))  # a folder is no data file


class _Generator:
    """Stands in for the sim's dataset generator: records its calls and writes a placeholder file."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, episodes: int, seed: int, path: Path, **kwargs: Any) -> None:
        self.calls.append((episodes, seed, path, kwargs))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Generator:
    import rollserve.sim.dataset

    fake = _Generator()
    monkeypatch.setattr(rollserve.sim.dataset, "generate_dataset", fake)
    monkeypatch.chdir(tmp_path)
    return fake


@pytest.mark.parametrize(("noise", "name"), [(0.25, "noise0.25"), (0.0, "noise0"), (1e-05, "noise1e-05")])
def test_the_default_dataset_is_named_by_how_it_is_generated(
    noise: float, name: str, generator: _Generator, capsys: Any
) -> None:
    args = argparse.Namespace(data=None, episodes=3, data_seed=5, action_noise=noise)
    path = Path("data") / f"tabletop_3ep_seed5_{name}.npz"
    assert policy._ensure_dataset(args) == path and args.data == path
    assert generator.calls == [(3, 5, path, {"action_noise": noise})]
    assert capsys.readouterr().out == f"generating 3 expert episodes (seed 5) -> {path}\n"
    assert policy._ensure_dataset(args) == path and len(generator.calls) == 1  # there now: used as is


def test_a_given_data_file_is_used_as_is_or_generated_there(generator: _Generator, tmp_path: Path) -> None:
    there = tmp_path / "mine.npz"
    there.write_bytes(b"")
    args = argparse.Namespace(data=there, episodes=3, data_seed=5, action_noise=0.1)
    assert policy._ensure_dataset(args) == there and generator.calls == []
    absent = tmp_path / "new" / "d.npz"
    args = argparse.Namespace(data=absent, episodes=4, data_seed=1, action_noise=0.1)
    assert policy._ensure_dataset(args) == absent
    assert generator.calls == [(4, 1, absent, {"action_noise": 0.1})]


def test_an_unwritable_default_dataset_folder_is_refused_before_generating(
    generator: _Generator, tmp_path: Path
) -> None:
    (tmp_path / "data").write_text("a file where the folder would go")
    args = argparse.Namespace(data=None, episodes=3, data_seed=5, action_noise=0.1)
    with pytest.raises(UsageError, match=r"^argument --data: cannot create data: data is not a directory"):
        policy._ensure_dataset(args)
    assert generator.calls == []


def _refusal(path: Path) -> str:
    with pytest.raises(UsageError) as info:
        policy._load_training_data(path)
    return str(info.value)


def test_unreadable_data_files_are_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.npz"
    text.write_text("not numpy")
    assert _refusal(text).startswith(f"argument --data: cannot read {text}: ")
    torn = tmp_path / "torn.npz"
    torn.write_bytes(b"PK\x03\x04" + b"\0" * 40)  # a zip's signature, nothing after it
    assert _refusal(torn).startswith(f"argument --data: cannot read {torn}: ")
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, states=np.array([{"a": 1}], dtype=object))
    assert _refusal(pickled).startswith(f"argument --data: cannot read {pickled}: ")
    missing = tmp_path / "missing.npz"
    assert _refusal(missing).startswith(f"argument --data: cannot read {missing}: ")


def test_data_that_training_could_not_use_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, states=np.zeros((2, 3)))
    assert (
        _refusal(path)
        == f"argument --data: {path} is not a demonstration dataset (no actions, episode_index)"
    )
    np.savez(path, actions=np.zeros((2, 3)), episode_index=np.zeros(2))
    assert _refusal(path) == f"argument --data: {path} is not a demonstration dataset (no states)"
    np.savez(path, states=np.zeros((0, 3)), actions=np.zeros((0, 2)), episode_index=np.zeros(0))
    assert _refusal(path) == f"argument --data: {path} holds no frames"
    np.savez(path, states=np.zeros((2, 3)), actions=np.zeros((2, 2)), episode_index=np.zeros(2, np.int64),
             success=np.array([False]))  # fmt: skip
    assert _refusal(path) == f"argument --data: {path} holds no successful episode to clone"


def test_usable_data_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    data = _data()
    np.savez(path, **data)
    loaded = policy._load_training_data(path)
    assert sorted(loaded) == sorted(data)
    for key, value in data.items():
        np.testing.assert_array_equal(loaded[key], value)
    del data["success"]  # no flags: every episode is kept
    np.savez(path, **data)
    assert "success" not in policy._load_training_data(path)


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"num_episodes": 3, "seed": 7, "action_noise": 0.5, "other": 1},
         {"episodes": 3, "seed": 7, "action_noise": 0.5}),
        ({"num_episodes": 3, "seed": 7}, None),
        ({"seed": 7, "action_noise": 0.5}, None),
        ({"num_episodes": 3, "action_noise": 0.5}, None),
        (None, None),
    ],
)  # fmt: skip
def test_the_generation_record_is_read_from_the_file(meta: dict[str, Any] | None, expected: Any) -> None:
    data: dict[str, Any] = {"states": np.zeros((1, 2))}
    if meta is not None:
        data["meta_json"] = np.array(json.dumps(meta))
    assert policy._generated_with(data) == expected


def test_the_command_line_spells_out_every_option_but_the_runs_own() -> None:
    args = argparse.Namespace(
        command="train", data=Path("my demos/d.npz"), episodes=7, data_seed=1, action_noise=0.5,
        out=Path("o"), steps=3, func=print, eval_episodes=2, lr=0.01, threads=1,
    )  # fmt: skip
    generated = {"episodes": 20, "seed": 4, "action_noise": 0.0}
    assert policy._command_line(args, generated) == (
        "rollserve train policy --data 'my demos/d.npz' --episodes 20 --data-seed 4 --action-noise 0.0 "
        "--steps 3 --lr 0.01 --threads 1"
    )
    assert policy._command_line(args, None) == (
        "rollserve train policy --data 'my demos/d.npz' --steps 3 --lr 0.01 --threads 1"
    )


class _Clock:
    """``time.perf_counter`` for the policy module: still, until the training moves it on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_the_command_records_how_it_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """120 steps (so the mean of the last 100 leaves some out), a dataset without a generation record."""
    data_path = tmp_path / "demo.npz"
    np.savez(data_path, **_data())
    clock, real, trained = _Clock(), policy.train_flow_policy, []

    def spy(data: dict[str, Any], config: TrainConfig, **kw: Any) -> Any:
        trained.append(real(data, config, **kw))
        clock.now += 12.3456
        return trained[-1]

    monkeypatch.setattr(policy, "train_flow_policy", spy)
    monkeypatch.setattr(policy, "time", clock)
    args = _parse("--data", str(data_path), "--out", str(tmp_path / "ck"), "--steps", "120", "--batch-size",
                  "4", "--lr", "0.01", "--seed", "3", "--chunk-size", "4", "--hidden-dim", "8", "--depth",
                  "0", "--state-noise", "0.25", "--threads", "2")  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert policy.main(args) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    (_, losses), = trained  # fmt: skip
    info = load_flow_policy(tmp_path / "ck").info
    assert info["train_config"] == {
        "steps": 120, "batch_size": 4, "lr": 0.01, "weight_decay": 0.0001, "warmup_steps": 500, "seed": 3,
        "chunk_size": 4, "hidden_dim": 8, "depth": 0, "time_embed_dim": 64, "num_steps": 10,
        "state_noise": 0.25, "ema_decay": 0.999,
    }  # fmt: skip
    assert info["dataset"] == {"file": "demo.npz", "frames": 36, "episodes": 3, "generated_with": None}
    assert info["final_loss_avg100"] == pytest.approx(sum(losses[20:]) / 100, rel=1e-9)
    saved = load_flow_policy(tmp_path / "ck").net
    states, chunks = _ref_dataset(_data(), 4)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randperm(24, generator=gen)
    with torch.no_grad():
        expected = _ref_loss(saved, states[rows], chunks[rows], gen).item()
    assert info["final_loss_saved_net"] == pytest.approx(expected, rel=1e-5)
    assert info["train_seconds"] == 12.3 and info["threads"] == 2
    assert (info["torch"], info["python"]) == (torch.__version__, platform.python_version())
    assert shlex.split(info["command"])[:5] == ["rollserve", "train", "policy", "--data", str(data_path)]
    assert "evaluation" not in info
    out = capsys.readouterr().out
    mean_last = float(np.mean(losses[100:]))  # the progress shows the mean since its last update
    assert f"120/120 loss {mean_last:.4f} 120000000000 steps/s" in out  # a still clock: 120 / 1e-9 s
    assert "trained 120 steps in 12 s: training loss (online net, mean of the last 100 steps) " in out
    assert out.endswith(f"checkpoint -> {tmp_path / 'ck'}\n")


def test_the_progress_shows_the_rate_and_the_mean_loss_since_its_last_update(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Ticking:
        """Two seconds a call: training starts at the first call, the updates come at steps 50 and 60."""

        def __init__(self) -> None:
            self.now = 0.0

        def perf_counter(self) -> float:
            self.now += 2.0
            return self.now

    monkeypatch.setattr(policy, "time", Ticking())
    config = TrainConfig(steps=60, batch_size=2, chunk_size=2, hidden_dim=8, depth=0, warmup_steps=5)
    _, losses = policy._train_with_progress(_data(), config)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("train policy ━") and line.endswith(" 0:00:00")  # the bar, then the time left
    assert f" 60/60 loss {np.mean(losses[50:]):.4f} 15 steps/s" in line  # 60 steps / (4 s of 2 calls)


def test_the_progress_starts_with_no_loss_and_no_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a terminal shows before the first update (at step 50): the task's first fields."""
    from rich.progress import Progress

    added: list[tuple[Any, ...]] = []
    real = Progress.add_task

    def add_task(self: Progress, description: str, **kwargs: Any) -> Any:
        added.append((description, kwargs))
        return real(self, description, **kwargs)

    monkeypatch.setattr(Progress, "add_task", add_task)
    config = TrainConfig(steps=3, batch_size=2, chunk_size=2, hidden_dim=8, depth=0)
    policy._train_with_progress(_data(), config)
    ((description, kwargs),) = added
    assert description == "train" and kwargs["total"] == 3 and kwargs["rate"] == 0.0
    assert math.isnan(kwargs["loss"]) and sorted(kwargs) == ["loss", "rate", "total"]


def test_the_report_names_both_losses_and_warns_of_the_initial_weights(capsys: Any) -> None:
    trained = SimpleNamespace(info={"final_loss_avg100": 0.12344, "final_loss_saved_net": 0.98765})
    policy._report(trained, TrainConfig(steps=40), 7.6)
    assert capsys.readouterr().out == (
        "trained 40 steps in 8 s: training loss (online net, mean of the last 40 steps) 0.1234, saved EMA "
        "net loss (fixed batch) 0.9877\nnote: the saved EMA net still weighs the untrained initial net 96%; "
        "it needs about 3000 steps (--steps) to leave it behind\n"
    )  # 0.999 ** 40 = 0.961
    policy._report(trained, TrainConfig(steps=1, ema_decay=0.05), 0.2)  # a share of exactly 5 %: no note
    assert capsys.readouterr().out == (
        "trained 1 steps in 0 s: training loss (online net, mean of the last 1 steps) 0.1234, saved EMA "
        "net loss (fixed batch) 0.9877\n"
    )
    policy._report(trained, TrainConfig(steps=150, ema_decay=0.5), 1.0)
    assert "mean of the last 100 steps" in capsys.readouterr().out


@pytest.mark.parametrize(("chunk", "execute"), [(4, 4), (8, 8), (16, 8)])
def test_the_evaluation_executes_chunks_up_to_8_and_is_recorded(
    chunk: int, execute: int, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    calls = []

    def fake(scored: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((scored, kwargs))
        return {"episodes": 3, "successes": 1, "success_rate": 1 / 3}

    monkeypatch.setattr(policy_eval, "evaluate_policy", fake)
    trained = SimpleNamespace(metadata=SimpleNamespace(chunk_size=chunk), info={})
    policy._evaluate(trained, 3)
    assert calls == [(trained, {"episodes": 3, "execute_steps": execute})]
    assert trained.info == {"evaluation": {"episodes": 3, "successes": 1, "success_rate": 1 / 3}}
    assert capsys.readouterr().out == "success 1/3 = 33%\n"


def test_one_evaluation_episode_is_enough_to_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = {"episodes": 1, "successes": 0, "success_rate": 0.0}
    monkeypatch.setattr(policy_eval, "evaluate_policy", lambda p, **kw: dict(record))
    data_path = tmp_path / "demo.npz"
    np.savez(data_path, **_data())
    tiny = ["--steps", "1", "--hidden-dim", "8", "--depth", "0", "--batch-size", "2", "--chunk-size", "2"]
    args = _parse("--data", str(data_path), "--out", str(tmp_path / "ck"), *tiny, "--eval-episodes", "1")
    assert policy.main(args) == 0
    info = load_flow_policy(tmp_path / "ck").info
    assert info["evaluation"] == {"episodes": 1, "successes": 0, "success_rate": 0.0}
    assert info["dataset"]["episodes"] == 3


def test_a_dataset_without_success_flags_records_no_episode_count(tmp_path: Path) -> None:
    data = _data()
    del data["success"], data["meta_json"]
    np.savez(tmp_path / "plain.npz", **data)
    tiny = ["--steps", "1", "--hidden-dim", "8", "--depth", "0", "--batch-size", "2", "--chunk-size", "2"]
    assert (
        policy.main(_parse("--data", str(tmp_path / "plain.npz"), "--out", str(tmp_path / "ck"), *tiny)) == 0
    )
    record = load_flow_policy(tmp_path / "ck").info["dataset"]
    assert record == {"file": "plain.npz", "frames": 36, "episodes": None, "generated_with": None}


# -- the synthetic dataset ---------------------------------------------------------------------------


def test_the_synthetic_dataset_is_smooth_oscillations_whose_phase_is_in_the_state() -> None:
    data = policy.synthetic_dataset(episodes=30, length=25, action_dim=5, seed=2)
    states, actions = data["states"], data["actions"]
    assert (
        states.dtype == actions.dtype == np.float32 and states.shape == (750, 6) and actions.shape == (750, 5)
    )
    assert data["episode_index"].tolist() == [e for e in range(30) for _ in range(25)]
    assert data["frame_index"].tolist() == list(range(25)) * 30
    assert data["episode_index"].dtype == data["frame_index"].dtype == np.int64
    assert data["success"].dtype == bool and data["success"].tolist() == [True] * 30
    assert json.loads(str(data["meta_json"])) == {
        "action_names": ["a0", "a1", "a2", "a3", "a4"], "state_names": None, "control_hz": 10.0,
    }  # fmt: skip
    phases = []
    for episode in range(30):
        x = actions[episode * 25 : (episode + 1) * 25].astype(np.float64)
        s = states[episode * 25 : (episode + 1) * 25].astype(np.float64)
        # a sinusoid of 0.2 rad a step: x[t+1] + x[t-1] = 2 cos(0.2) x[t]
        np.testing.assert_allclose(x[2:] + x[:-2], 2 * math.cos(0.2) * x[1:-1], atol=1e-5)
        amp = np.hypot(x[0], (x[1] - x[0] * math.cos(0.2)) / math.sin(0.2))
        phase = np.arctan2(x[0] / amp, (x[1] - x[0] * math.cos(0.2)) / math.sin(0.2) / amp) % (2 * math.pi)
        assert np.all((amp >= 0.5) & (amp <= 1.5))
        phases.extend(phase)
        angle = 0.2 * np.arange(25)[:, None] + phase[None, :2]
        np.testing.assert_allclose(s[:, :2], np.cos(angle), atol=1e-5)
        np.testing.assert_allclose(s[:, 2:4], np.sin(angle), atol=1e-5)
        np.testing.assert_allclose(s[:, 4:], np.broadcast_to(amp[:2], (25, 2)), atol=1e-5)
    # amplitudes and phases spread over their ranges
    assert min(phases) < 0.5 and max(phases) > 2 * math.pi - 0.5
    assert np.mean(np.array(phases) > math.pi) == pytest.approx(0.5, abs=0.1)


def test_the_synthetic_dataset_follows_its_seed_and_defaults() -> None:
    a, b = policy.synthetic_dataset(seed=1), policy.synthetic_dataset(seed=1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(policy.synthetic_dataset(seed=2)["actions"], a["actions"])
    assert a["actions"].shape == (800, 8) and a["states"].shape == (800, 6) and len(a["success"]) == 20
    np.testing.assert_array_equal(
        policy.synthetic_dataset()["actions"], policy.synthetic_dataset(seed=0)["actions"]
    )
    amps = np.abs(a["actions"]).max(0)
    assert np.all(amps > 1.0) and np.all(amps <= 1.5)  # 20 draws from [0.5, 1.5] reach above 1


# -- the chunk player --------------------------------------------------------------------------------


class _StubPolicy:
    """Chunk k is rows ``100 k + i`` (the gripper, last, at minus three times that), robot space is
    model space + 0.5; the calls are recorded."""

    def __init__(self, chunk_size: int = 6) -> None:
        self.metadata = SimpleNamespace(chunk_size=chunk_size)
        self.calls: list[dict[str, Any]] = []

    def make_processors(self) -> Processors:
        return Processors(pre=lambda obs: {"state": np.asarray(obs["state"]) * 2},
                          post=lambda chunk: chunk + 0.5)  # fmt: skip

    def chunk(self, k: int) -> np.ndarray:
        rows = 100.0 * k + np.arange(self.metadata.chunk_size, dtype=np.float64)
        return np.stack([rows] * 7 + [-3 * rows], axis=1)

    def predict_action_chunk(
        self, batch: dict[str, Any], *, inference_delay: int = 0, prev_chunk_left_over: Any = None
    ) -> np.ndarray:
        prefix = None if prev_chunk_left_over is None else np.array(prev_chunk_left_over)
        self.calls.append({"seed": batch["seed"], "state": float(batch["state"][0]),
                           "delay": inference_delay, "prefix": prefix})  # fmt: skip
        return self.chunk(len(self.calls) - 1)


def _play(actor: ChunkActor, steps: int) -> list[np.ndarray]:
    return [actor({"state": np.array([float(t)])}) for t in range(steps)]


def _jumps(actions: list[np.ndarray], switches: list[int]) -> tuple[list[float], list[float]]:
    """Arm-joint distances (the 7 first dims) at the listed switch steps and at every other step."""
    at, between = [], []
    for t in range(1, len(actions)):
        (at if t in switches else between).append(float(np.linalg.norm(actions[t][:7] - actions[t - 1][:7])))
    return at, between


@pytest.mark.parametrize("rtc", [False, True])
def test_synchronous_play_executes_each_chunks_head(rtc: bool) -> None:
    stub = _StubPolicy()
    actor = ChunkActor(stub, 4, execute_steps=3, rtc=rtc)
    actions = _play(actor, 7)
    c = [stub.chunk(k) + 0.5 for k in range(3)]
    expected = [c[0][0], c[0][1], c[0][2], c[1][0], c[1][1], c[1][2], c[2][0]]
    np.testing.assert_array_equal(np.array(actions), np.array(expected))
    assert [(call["seed"], call["state"], call["delay"]) for call in stub.calls] == [
        (4000, 0.0, 0), (4001, 6.0, 0), (4002, 12.0, 0)
    ]  # fmt: skip
    prefixes = [call["prefix"] for call in stub.calls]
    assert prefixes[0] is None
    if rtc:  # what is left of the old chunk, in model space
        np.testing.assert_array_equal(prefixes[1], stub.chunk(0)[3:])
        np.testing.assert_array_equal(prefixes[2], stub.chunk(1)[3:])
    else:
        assert prefixes[1:] == [None, None]
    at, between = _jumps(expected, [3, 6])
    assert actor.switch_jumps == pytest.approx(at) and actor.step_sizes == pytest.approx(between)
    assert actor.chunks == 3 and len(at) == 2 and len(between) == 4


@pytest.mark.parametrize("rtc", [False, True])
def test_delayed_play_keeps_the_old_chunk_while_the_new_one_is_inferred(rtc: bool) -> None:
    stub = _StubPolicy()
    actor = ChunkActor(stub, 2, execute_steps=3, inference_delay=1, rtc=rtc)
    actions = _play(actor, 11)
    c = [stub.chunk(k) + 0.5 for k in range(4)]
    expected = [c[0][0], c[0][1], c[0][2], c[0][3]] + [c[k][i] for k in (1, 2) for i in (1, 2, 3)] + [c[3][1]]
    np.testing.assert_array_equal(np.array(actions), np.array(expected))
    assert [(call["seed"], call["state"], call["delay"]) for call in stub.calls] == [
        (2000, 0.0, 0), (2001, 6.0, 1), (2002, 12.0, 1), (2003, 18.0, 1)
    ]  # fmt: skip
    if rtc:
        for k in (1, 2, 3):  # inferred after three actions of the chunk before: rows 3.. are left
            np.testing.assert_array_equal(stub.calls[k]["prefix"], stub.chunk(k - 1)[3:])
    else:
        assert [call["prefix"] for call in stub.calls] == [None] * 4
    at, between = _jumps(expected, [4, 7, 10])
    assert actor.switch_jumps == pytest.approx(at) and actor.step_sizes == pytest.approx(between)


@pytest.mark.parametrize("delay", [0, 1])
def test_the_player_tells_the_queue_the_delay_it_played(delay: int, caplog: pytest.LogCaptureFixture) -> None:
    """The player knows each chunk's delay, so it gives no index to check it by: a check against an
    index of 0 would log a mismatch at every switch (the queue logs hints that differ from what ran)."""
    with caplog.at_level(logging.DEBUG, logger="rollserve.rtc.queue"):
        _play(ChunkActor(_StubPolicy(), 0, execute_steps=3, inference_delay=delay, rtc=True), 11)
    assert [r.getMessage() for r in caplog.records if r.name == "rollserve.rtc.queue"] == []


def test_the_longest_delay_the_chunk_allows_still_plays() -> None:
    stub = _StubPolicy(chunk_size=4)
    actor = ChunkActor(stub, 0, execute_steps=2, inference_delay=2)
    c = [stub.chunk(k) + 0.5 for k in range(3)]
    expected = [c[0][0], c[0][1], c[0][2], c[0][3], c[1][2], c[1][3], c[2][2]]
    np.testing.assert_array_equal(np.array(_play(actor, 7)), np.array(expected))
    at, between = _jumps(expected, [4, 6])  # the next inference starts as a chunk takes over: a switch
    assert actor.switch_jumps == pytest.approx(at) and actor.step_sizes == pytest.approx(between)


@pytest.mark.parametrize(
    ("chunk", "execute", "delay", "ok"),
    [
        (6, 3, 3, True), (6, 3, 4, False), (6, 3, -1, False), (6, 3, 0, True), (6, 4, 2, True),
        (6, 4, 3, False), (6, 2, 2, True), (6, 2, 3, False), (16, 8, 8, True), (16, 8, 9, False),
    ],
)  # fmt: skip
def test_the_delay_must_leave_room_in_the_chunk(chunk: int, execute: int, delay: int, ok: bool) -> None:
    stub = _StubPolicy(chunk_size=chunk)
    if ok:
        actor = ChunkActor(stub, 0, execute_steps=execute, inference_delay=delay)
        assert (actor.execute_steps, actor.delay, actor.rtc) == (execute, delay, False)
        return
    message = r"^need 0 <= delay <= min\(execute_steps, chunk_size - execute_steps\)$"
    with pytest.raises(ValueError, match=message):
        ChunkActor(stub, 0, execute_steps=execute, inference_delay=delay)


def test_a_fresh_actor_defaults_to_synchronous_chunks_of_8() -> None:
    stub = _StubPolicy(chunk_size=16)
    actor = ChunkActor(stub, 1)
    assert (actor.execute_steps, actor.delay, actor.rtc) == (8, 0, False)
    assert (actor.chunks, actor.switch_jumps, actor.step_sizes, actor.last_action) == (0, [], [], None)
    actions = _play(actor, 9)
    np.testing.assert_array_equal(actions[7], stub.chunk(0)[7] + 0.5)
    np.testing.assert_array_equal(actions[8], stub.chunk(1)[0] + 0.5)


class _FakeEvaluation:
    """Stands in for the sim's scoring loop: plays each actor three steps and returns set results."""

    def __init__(self, successes: list[bool], steps: list[int], seconds: float) -> None:
        self.result = (successes, steps, seconds)
        self.seeds: list[int] = []

    def __call__(self, start_episode: Any, seeds: Any) -> Any:
        from rollserve.sim.evaluate import EvalResult

        self.seeds = list(seeds)
        for _ in self.seeds:
            actor = start_episode({"state": np.zeros(1)})
            _play(actor, 3)
        successes, steps, seconds = self.result
        return EvalResult(tuple(self.seeds), tuple(successes), tuple(steps), seconds)


def test_the_evaluation_reports_success_and_jumps_per_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    import rollserve.sim.evaluate

    fake = _FakeEvaluation([True, False, True], [4, 5, 9], 1.26)
    monkeypatch.setattr(rollserve.sim.evaluate, "evaluate", fake)
    stub = _StubPolicy(chunk_size=4)
    result = evaluate_policy(stub, episodes=3, first_seed=7, execute_steps=2, inference_delay=1, rtc=True)
    assert fake.seeds == [7, 8, 9]
    assert [call["seed"] for call in stub.calls] == [7000, 7001, 8000, 8001, 9000, 9001]
    for k in (0, 2, 4):  # each episode's second chunk is guided by what is left of its first (RTC)
        first, second = stub.calls[k], stub.calls[k + 1]
        assert first["prefix"] is None and (first["delay"], second["delay"]) == (0, 1)
        np.testing.assert_array_equal(second["prefix"], stub.chunk(k)[2:])
    # each episode: rows 0, 1 of its first chunk, then row 2 while the next is inferred (no switch yet)
    c0 = [stub.chunk(k) + 0.5 for k in (0, 1)]
    step = float(np.linalg.norm(c0[0][1][:7] - c0[0][0][:7]))
    assert result == {
        "episodes": 3, "successes": 2, "success_rate": pytest.approx(2 / 3), "first_seed": 7,
        "execute_steps": 2, "inference_delay": 1, "rtc": True, "mean_steps": 6.0,
        "mean_switch_jump_rad": 0.0, "mean_step_rad": pytest.approx(step), "failed_seeds": [8],
        "seconds": 1.3,
    }  # fmt: skip


def test_the_evaluation_averages_the_jumps_over_every_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    import rollserve.sim.evaluate

    class Longer(_FakeEvaluation):
        def __call__(self, start_episode: Any, seeds: Any) -> Any:
            self.seeds = list(seeds)
            for n in (3, 5):  # the first episode switches once, the second twice
                _play(start_episode({"state": np.zeros(1)}), n)
            from rollserve.sim.evaluate import EvalResult

            return EvalResult(tuple(self.seeds), (True, True), (3, 5), 0.0)

    monkeypatch.setattr(rollserve.sim.evaluate, "evaluate", Longer([], [], 0.0))
    stub = _StubPolicy(chunk_size=4)
    result = evaluate_policy(stub, episodes=2, first_seed=0, execute_steps=2)
    # each switch jumps from row 1 of chunk k to row 0 of chunk k + 1: 99 on each of the 7 arm joints
    assert result["mean_switch_jump_rad"] == pytest.approx(99 * math.sqrt(7))
    assert result["mean_step_rad"] == pytest.approx(math.sqrt(7))
    assert result["successes"] == 2 and result["failed_seeds"] == [] and result["seconds"] == 0.0


def test_the_evaluation_defaults_and_an_empty_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import rollserve.sim.evaluate

    fake = _FakeEvaluation([], [], 0.0)
    monkeypatch.setattr(rollserve.sim.evaluate, "evaluate", fake)
    result = evaluate_policy(_StubPolicy(chunk_size=16), episodes=0)
    assert fake.seeds == []
    assert result == {
        "episodes": 0, "successes": 0, "success_rate": 0.0, "first_seed": 100_000, "execute_steps": 8,
        "inference_delay": 0, "rtc": False, "mean_steps": 0.0, "mean_switch_jump_rad": 0.0,
        "mean_step_rad": 0.0, "failed_seeds": [], "seconds": 0.0,
    }  # fmt: skip
    fake = _FakeEvaluation([True] * 50, [1] * 50, 0.0)
    monkeypatch.setattr(rollserve.sim.evaluate, "evaluate", fake)
    assert evaluate_policy(_StubPolicy(chunk_size=16))["episodes"] == 50
    assert fake.seeds == list(range(100_000, 100_050))
