"""Review tests of `rollserve train world [--video]` (mutation module `training`): what the training
record in the checkpoint holds, how the data is drawn and split, seeding, the progress lines, the
image metrics and the refusals, each pinned with tiny configs so a run takes well under a second."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rollserve.cli import UsageError
from rollserve.cli import main as cli_main
from rollserve.models.net_checkpoint import CONFIG_FILE
from rollserve.training import video_world_model, world_model
from rollserve.training.video_world_model import VideoEpisodes
from rollserve.training.world_model import Episode

needs_sim = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the sim extra")
STATE_DIM, ACTION_DIM = 13, 8


def _episode(seed: int, steps: int = 4) -> Episode:
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(steps + 1, STATE_DIM)).astype(np.float32)
    actions = rng.normal(size=(steps, ACTION_DIM)).astype(np.float32)
    return Episode(seed, states, actions, rng.normal(size=steps).astype(np.float32))


def _video_episodes(count: int, steps: int, seed: int, size: int = 16) -> VideoEpisodes:
    rng = np.random.default_rng(seed)
    return VideoEpisodes(
        frames=rng.integers(0, 256, (count, steps + 1, size, size, 3), dtype=np.uint8),
        states=rng.normal(size=(count, steps + 1, STATE_DIM)).astype(np.float32),
        actions=rng.uniform(-0.5, 0.5, size=(count, steps, ACTION_DIM)).astype(np.float32),
        seeds=np.arange(seed, seed + count, dtype=np.int64),
    )


# -- progress cadence --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "parts", "due"),
    [
        (40, 10, [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]),  # every 40 // 10 = 4th step
        (10, 4, [1, 3, 5, 7, 9]),  # every 2nd, the last one too
        (7, 2, [2, 5, 6]),  # every 3rd, and the last (6) though 7 % 3 != 0
        (3, 10, [0, 1, 2]),  # fewer steps than parts: every step
        (1, 10, [0]),
    ],
)
def test_progress_lines_fall_on_every_share_and_the_last_step(total: int, parts: int, due: list[int]) -> None:
    assert [i for i in range(total) if world_model._due(i, total, parts=parts)] == due


def test_progress_lines_default_to_ten_a_phase() -> None:
    assert [i for i in range(20) if world_model._due(i, 20)] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]


# -- the data -----------------------------------------------------------------------------------------


def test_transitions_pair_each_state_with_its_last_change_action_and_successor() -> None:
    eps = [_episode(1, steps=3), _episode(2, steps=2)]
    data = world_model.to_transitions(eps)
    rows = []
    for ep in eps:
        for t in range(len(ep.actions)):
            change = np.zeros(STATE_DIM) if t == 0 else ep.states[t] - ep.states[t - 1]
            rows.append((ep.states[t], change, ep.actions[t], ep.states[t + 1]))
    expected = [np.array([r[k] for r in rows]) for k in range(4)]
    for got, want in zip((data.states, data.changes, data.actions, data.next_states), expected, strict=True):
        assert got.dtype == np.float32 and got.shape == want.shape == (5, want.shape[1])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_constant_quantity_is_left_unscaled() -> None:
    std = torch.tensor([0.0, 5e-7, 1e-6, 0.3])
    np.testing.assert_array_equal(
        world_model._std_floor(std).numpy(), np.array([1.0, 1.0, 1e-6, 0.3], np.float32)
    )
    x = torch.tensor([[1.0, 2.0, 0.0], [1.0, 4.0, 0.0]])
    np.testing.assert_allclose(video_world_model._std(x).numpy(), [1.0, math.sqrt(2.0), 1.0], rtol=1e-6)


@needs_sim
def test_world_episodes_follow_the_seed_sequence_and_record_the_executed_action() -> None:
    eps = world_model.collect(3, 5, (0.0, 0.3), 4)
    seeds = np.random.SeedSequence(5).generate_state(3, dtype=np.uint32)
    assert [ep.seed for ep in eps] == [int(s) for s in seeds]
    from rollserve.sim.env import TabletopPickPlaceEnv

    for ep in eps:
        assert (
            ep.states.shape == (5, STATE_DIM)
            and ep.actions.shape == (4, ACTION_DIM)
            and ep.rewards.shape == (4,)
        )
        env = TabletopPickPlaceEnv(max_episode_steps=4, terminate_on_success=False)
        obs, _ = env.reset(seed=ep.seed)
        np.testing.assert_array_equal(ep.states[0], obs["state"])
        for t, action in enumerate(ep.actions):  # replaying the recorded actions gives the same states
            obs, reward, *_ = env.step(action)
            np.testing.assert_array_equal(ep.states[t + 1], obs["state"])
            assert ep.rewards[t] == reward
        assert np.all(ep.actions >= env.action_space.low) and np.all(ep.actions <= env.action_space.high)
        env.close()
    # episode 0 has no noise, episode 1 the 0.3 rad level: its joint targets leave the expert's
    from rollserve.sim.env import TabletopPickPlaceEnv as Env
    from rollserve.sim.expert import ScriptedExpert

    def expert_first_action(seed: int) -> np.ndarray:
        env, expert = Env(max_episode_steps=4, terminate_on_success=False), ScriptedExpert()
        obs, _ = env.reset(seed=seed)
        expert.reset(obs)
        return expert.act(obs)

    np.testing.assert_array_equal(eps[0].actions[0], expert_first_action(eps[0].seed))
    assert np.abs(eps[1].actions[0][:7] - expert_first_action(eps[1].seed)[:7]).max() > 0.01
    np.testing.assert_array_equal(eps[2].actions[0], expert_first_action(eps[2].seed))  # the cycle restarts


@needs_sim
def test_world_collection_reports_progress_four_times() -> None:
    lines: list[str] = []
    world_model.collect(8, 0, (0.0,), 1, label="probe", log=lines.append)
    assert [line.split(" (")[0] for line in lines] == [
        f"collected {k}/8 probe episodes" for k in (2, 4, 6, 8)
    ]
    assert all(line.endswith(" s)") for line in lines)


# -- fitting ------------------------------------------------------------------------------------------


def _tiny_world_config() -> Any:
    return world_model.task_config(2, 8, 1)


@needs_sim
def test_the_world_fit_is_reproducible_from_its_seed() -> None:
    eps = [_episode(s, steps=6) for s in range(3)]
    nets = [
        world_model.fit(_tiny_world_config(), eps, 5, 4, seed, unroll=2, unroll_iterations=3)
        for seed in (0, 0, 1)
    ]
    a, b, c = (dict(n.state_dict()) for n in nets)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if "mlp" in k)
    assert not nets[0].training  # handed back ready to serve


@needs_sim
def test_the_world_fit_normalises_by_the_data() -> None:
    eps = [_episode(s, steps=6) for s in range(3)]
    net = world_model.fit(_tiny_world_config(), eps, 1, 4, 0)
    data = world_model.to_transitions(eps)
    target = data.next_states - data.states
    np.testing.assert_allclose(net.out_mean.numpy(), target.mean(0), atol=1e-5)
    np.testing.assert_allclose(net.out_std.numpy(), target.std(0, ddof=1), rtol=1e-4)
    feats = net.features(*(torch.as_tensor(x) for x in (data.states, data.changes, data.actions)))
    np.testing.assert_allclose(net.in_mean.numpy(), feats.mean(0).numpy(), atol=1e-5)
    std = feats.std(0).numpy()
    np.testing.assert_allclose(net.in_std.numpy(), np.where(std < 1e-6, 1.0, std), rtol=1e-5)


@needs_sim
def test_the_world_fit_logs_each_phase() -> None:
    eps = [_episode(s, steps=6) for s in range(2)]
    lines: list[str] = []
    world_model.fit(_tiny_world_config(), eps, 4, 4, 0, unroll=2, unroll_iterations=2, log=lines.append)
    heads = [line.split(":")[0] for line in lines]
    assert heads == [f"one-step fit {k}/4" for k in (1, 2, 3, 4)] + ["unrolled fit 1/2", "unrolled fit 2/2"]
    assert all(" mse " in line for line in lines[:4]) and all(" loss " in line for line in lines[4:])


# -- the training record -----------------------------------------------------------------------------


@needs_sim
def test_the_world_checkpoint_records_how_it_was_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w"
    tiny = "--episodes 2 --eval-episodes 1 --steps 3 --ensemble 1 --hidden 8 --depth 1 --iterations 2"
    tiny += " --batch 2 --unroll 2 --unroll-iterations 1 --noise 0.0 0.01 --seed 3"
    assert cli_main(["train", "world", *tiny.split(), "--out", str(out)]) == 0
    training = json.loads((out / CONFIG_FILE).read_text())["training"]
    evaluation = training.pop("evaluation")
    assert isinstance(training.pop("seconds"), float)
    assert training == {
        "episodes": 2,
        "transitions": 6,  # 2 episodes of 3 steps
        "unroll": 2,
        "unroll_iterations": 1,
        "noise_levels": [0.0, 0.01],
        "iterations": 2,
        "batch": 2,
        "seed": 3,
        "threads": 1,
    }
    assert evaluation["episodes"] == 1 and list(evaluation["horizon_steps"]) == ["1"]
    text = capsys.readouterr().out
    assert "collected 6 transitions in " in text and text.endswith(f"wrote {out}\n")
    assert json.loads(text[text.index("{") : text.rindex("}") + 1]) == evaluation
    assert text.endswith(f"\n{json.dumps(evaluation, indent=2)}\nwrote {out}\n")  # two-space indent


def test_the_world_command_draws_held_out_episodes_from_their_own_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def collect(num: int, seed: int, noise: tuple[float, ...], steps: int, **kw: Any) -> list[Episode]:
        calls.append((num, seed, noise, steps, kw["label"]))
        return [_episode(seed + i, steps) for i in range(num)]

    monkeypatch.setattr(world_model, "collect", collect)
    monkeypatch.setattr(world_model, "task_config", lambda e, h, d: _TinyConfig.make(e, h, d))
    monkeypatch.setattr(world_model, "horizon_errors", lambda world, eps: {"episodes": len(eps)})
    tiny = "--episodes 2 --eval-episodes 3 --steps 4 --ensemble 1 --hidden 4 --depth 1 --iterations 1"
    tiny += " --batch 2 --unroll-iterations 0 --noise 0.5 --seed 7"
    assert cli_main(["train", "world", *tiny.split(), "--out", str(tmp_path / "w")]) == 0
    assert calls == [(2, 7, (0.5,), 4, "training"), (3, 10_007, (0.02,), 4, "held-out")]


class _TinyConfig:
    """A learned-world config without the simulator: the command's wiring only."""

    @staticmethod
    def make(ensemble: int, hidden: int, depth: int) -> Any:
        from rollserve.models.learned_world import LearnedWorldConfig, StartDistribution, TaskRule

        return LearnedWorldConfig(
            state_names=tuple(f"s{i}" for i in range(STATE_DIM)),
            hidden=hidden,
            depth=depth,
            ensemble=ensemble,
            control_hz=10.0,
            max_episode_steps=4,
            action_low=(-1.0,) * ACTION_DIM,
            action_high=(1.0,) * ACTION_DIM,
            start=StartDistribution((0.0,) * 7, 0.0, (0.0, 0.1), (0.0, 0.1), (0.2, 0.3), (0.2, 0.3), 0.02),
            rule=TaskRule(0.05, 0.01, 0.02),
        )


# -- refusals ------------------------------------------------------------------------------------------


def _args(**kw: Any) -> argparse.Namespace:
    base = {
        "unroll_iterations": 1,
        "unroll": 3,
        "steps": 10,
        "out": None,
        "image_size": None,
        "evaluate_only": False,
    }
    return argparse.Namespace(**{**base, **kw})


def test_the_world_unroll_must_stay_below_the_episode(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        world_model._check_arguments(_args(unroll=10, steps=10, out=tmp_path))
    assert str(err.value) == (
        "argument --unroll: must be below --steps (10) for the multi-step phase (or --unroll-iterations 0)"
    )
    assert world_model._check_arguments(_args(unroll=9, steps=10, out=tmp_path / "a")) == tmp_path / "a"
    assert world_model._check_arguments(
        _args(unroll=10, steps=10, unroll_iterations=0, out=tmp_path / "b")
    ) == (tmp_path / "b")


def test_the_world_out_defaults_to_the_shipped_checkpoint() -> None:
    from rollserve.models.learned_world import default_checkpoint_dir

    assert world_model._check_arguments(_args()) == default_checkpoint_dir()


@pytest.mark.parametrize("size", [8, 12, 264, 60])
def test_the_video_frame_size_refusal_says_why(size: int) -> None:
    with pytest.raises(UsageError) as err:
        video_world_model._check_arguments(_args(image_size=size, unroll=1))
    assert str(err.value) == (
        "argument --image-size: must be a multiple of 8 (the latent is 1/8) from 16 (SSIM's 11x11 window)"
        f" to 256 (the offscreen framebuffer), got {size}"
    )


@pytest.mark.parametrize("size", [None, 16, 24, 256])
def test_the_video_frame_sizes_kept(size: int | None) -> None:
    video_world_model._check_arguments(_args(image_size=size, unroll=10, steps=10))


def test_the_video_unroll_refusal_says_why() -> None:
    with pytest.raises(UsageError) as err:
        video_world_model._check_arguments(_args(unroll=11, steps=10))
    assert str(err.value) == "argument --unroll: must be at most --steps (10), got 11"
    video_world_model._check_arguments(_args(unroll=11, steps=10, evaluate_only=True))  # not trained


def test_evaluating_a_folder_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        video_world_model._checkpoint_to_evaluate(tmp_path)
    assert str(err.value) == f"argument --out: no video world checkpoint in {tmp_path} (no {CONFIG_FILE})"


def test_evaluating_a_broken_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_text("{}")
    with pytest.raises(UsageError) as err:
        video_world_model._checkpoint_to_evaluate(tmp_path)
    assert str(err.value).startswith(f"argument --out: cannot load the checkpoint in {tmp_path}: ")


# -- image metrics -----------------------------------------------------------------------------------


def test_psnr_is_ten_log_of_the_inverse_mse() -> None:
    true = np.zeros((2, 3, 4, 4))
    pred = true.copy()
    pred[0] += 0.1  # mse 0.01: 20 dB
    np.testing.assert_allclose(video_world_model.psnr(pred, true), [20.0, 100.0])  # equal: the 1e-10 floor


def test_ssim_of_flat_frames_is_the_luminance_term() -> None:
    a, b = 0.2, 0.6
    x, y = np.full((1, 3, 16, 16), a), np.full((1, 3, 16, 16), b)
    c1 = 0.01**2
    np.testing.assert_allclose(video_world_model.ssim(x, y), [(2 * a * b + c1) / (a * a + b * b + c1)])
    np.testing.assert_allclose(video_world_model.ssim(x, x), [1.0])


def test_ssim_weighs_the_window_centre_most() -> None:
    """A speck at a window's centre lowers SSIM more than one at its edge (the Gaussian, sigma 1.5)."""
    base = np.full((1, 1, 11, 11), 0.5)
    centre, edge = base.copy(), base.copy()
    centre[0, 0, 5, 5] = 1.0
    edge[0, 0, 5, 0] = 1.0
    coords = np.arange(11) - 5
    g = np.exp(-(coords**2) / (2 * 1.5**2))
    g /= g.sum()
    w = np.outer(g, g)

    def one_window(img: np.ndarray) -> float:
        x, y = img[0, 0], base[0, 0]
        mx, my = (w * x).sum(), (w * y).sum()
        vx, vy, cxy = (w * x * x).sum() - mx**2, (w * y * y).sum() - my**2, (w * x * y).sum() - mx * my
        c1, c2 = 0.01**2, 0.03**2
        return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))

    np.testing.assert_allclose(video_world_model.ssim(centre, base), [one_window(centre)], rtol=1e-9)
    np.testing.assert_allclose(video_world_model.ssim(edge, base), [one_window(edge)], rtol=1e-9)


# -- the video world ------------------------------------------------------------------------------


def _video_config(size: int = 16) -> Any:
    from rollserve.models.video_world import VideoWorldConfig

    base = _TinyConfig.make(1, 1, 1)
    return VideoWorldConfig(
        state_names=base.state_names,
        image_size=size,
        latent_channels=2,
        width=4,
        dynamics_width=4,
        control_hz=base.control_hz,
        max_episode_steps=base.max_episode_steps,
        action_low=base.action_low,
        action_high=base.action_high,
        start=base.start,
        rule=base.rule,
    )


def _fit_video(seed: int, log: Any = print, **kw: Any) -> Any:
    settings = {"ae_iterations": 2, "dyn_iterations": 2, "decoder_iterations": 2, "batch": 2, "unroll": 2}
    return video_world_model.fit(
        _video_config(), _video_episodes(2, 3, 0), seed=seed, log=log, **{**settings, **kw}
    )


def test_the_video_fit_is_reproducible_from_its_seed() -> None:
    a, b, c = (dict(_fit_video(seed).state_dict()) for seed in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_the_video_fit_normalises_by_the_data() -> None:
    data = _video_episodes(2, 3, 0)
    net = _fit_video(0)
    assert not net.training
    states = data.states.reshape(-1, STATE_DIM)
    np.testing.assert_allclose(net.state_mean.numpy(), states.mean(0), atol=1e-5)
    np.testing.assert_allclose(net.state_std.numpy(), states.std(0, ddof=1), rtol=1e-4)
    actions = data.actions.reshape(-1, ACTION_DIM)
    np.testing.assert_allclose(net.action_mean.numpy(), actions.mean(0), atol=1e-5)
    np.testing.assert_allclose(net.action_std.numpy(), actions.std(0, ddof=1), rtol=1e-4)
    deltas = (data.states[:, 1:] - data.states[:, :-1]).reshape(-1, STATE_DIM)
    np.testing.assert_allclose(net.delta_mean.numpy(), deltas.mean(0), atol=1e-5)
    np.testing.assert_allclose(net.delta_std.numpy(), deltas.std(0, ddof=1), rtol=1e-4)


def test_the_video_fit_logs_every_hundredth_iteration() -> None:
    lines: list[str] = []
    _fit_video(0, log=lines.append, ae_iterations=200, dyn_iterations=100, decoder_iterations=100, batch=1)
    heads = [line.split(":")[0] for line in lines]
    assert heads == ["autoencoder 100/200", "autoencoder 200/200", "dynamics 100/100", "decoder 100/100"]
    assert " mse " in lines[0] and ", state " in lines[2] and lines[2].startswith("dynamics 100/100: latent ")


def test_the_video_report_has_the_horizons_an_episode_reaches() -> None:
    net = _fit_video(0)
    for steps, horizons in ((9, ["1"]), (10, ["1", "10"])):
        report = video_world_model.horizon_errors(net, _video_episodes(2, steps, 1))
        assert report["episodes"] == 2 and list(report["horizon_steps"]) == horizons
    data = _video_episodes(2, 10, 1)
    frames, states = video_world_model.imagine(net, data.frames[:, 0], data.states[:, 0], data.actions)
    true = data.frames[:, 10].transpose(0, 3, 1, 2) / 255.0
    row = video_world_model.horizon_errors(net, data)["horizon_steps"]["10"]
    pred = frames[:, 9]
    mse = ((pred - true) ** 2).mean(axis=(1, 2, 3))
    assert row["psnr_db"] == pytest.approx(float(np.mean(10 * np.log10(1 / mse))), rel=1e-5)
    held = data.frames[:, 0].transpose(0, 3, 1, 2) / 255.0
    mse_held = ((held - true) ** 2).mean(axis=(1, 2, 3))
    assert row["psnr_db_first_frame_baseline"] == pytest.approx(
        float(np.mean(10 * np.log10(1 / mse_held))), rel=1e-5
    )
    cube = np.linalg.norm(states[:, 9, 8:11] - data.states[:, 10, 8:11], axis=1).mean()
    assert row["cube_pos_err_m"] == pytest.approx(float(cube), rel=1e-5)
    joint = math.sqrt(((states[:, 9, :7] - data.states[:, 10, :7]) ** 2).mean())
    assert row["joint_rmse_rad"] == pytest.approx(joint, rel=1e-5)


def test_the_video_checkpoint_records_how_it_was_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Any, ...]] = []

    def collect(
        num: int, seed: int, noise: tuple[float, ...], steps: int, size: int, **kw: Any
    ) -> VideoEpisodes:
        calls.append((num, seed, noise, steps, size))
        return _video_episodes(num, steps, seed, size)

    monkeypatch.setattr(video_world_model, "collect", collect)
    monkeypatch.setattr(video_world_model, "task_config", lambda lc, w, dw, size: _video_config(size))
    out = tmp_path / "v"
    tiny = "--episodes 2 --eval-episodes 1 --steps 2 --unroll 2 --ae-iterations 1 --dyn-iterations 1"
    tiny += " --decoder-iterations 1 --batch 2 --image-size 16 --noise 0.1 0.2 --seed 4 --threads 1"
    assert cli_main(["train", "world", "--video", *tiny.split(), "--out", str(out)]) == 0
    assert calls == [(1, 10_004, (0.02,), 2, 16), (2, 4, (0.1, 0.2), 2, 16)]  # held-out first
    stored = json.loads((out / CONFIG_FILE).read_text())
    training = stored["training"]
    evaluation = training.pop("evaluation")
    assert isinstance(training.pop("seconds"), float) and isinstance(training.pop("render_seconds"), float)
    assert training == {
        "episodes": 2,
        "steps": 2,
        "noise_levels": [0.1, 0.2],
        "ae_iterations": 1,
        "dyn_iterations": 1,
        "decoder_iterations": 1,
        "batch": 2,
        "unroll": 2,
        "seed": 4,
        "threads": 1,
    }
    assert evaluation["episodes"] == 1 and list(evaluation["horizon_steps"]) == ["1"]
    text = capsys.readouterr().out
    assert "rendered 6 frames in " in text and text.endswith(f"wrote {out}\n")  # 2 episodes of 3 frames
    assert json.loads(text[text.index("{") : text.rindex("}") + 1]) == evaluation
    assert text.endswith(f"\n{json.dumps(evaluation, indent=2)}\nwrote {out}\n")  # two-space indent


def _collect_tiny_video_episodes(
    num: int, seed: int, noise: Any, steps: int, size: int, **kw: Any
) -> VideoEpisodes:
    """``video_world_model.collect`` without the simulator: made-up episodes of the asked shape."""
    return _video_episodes(num, steps, seed, size)


def test_the_video_frame_size_defaults_to_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []

    def stop(num: int, seed: int, noise: Any, steps: int, size: int, **kw: Any) -> VideoEpisodes:
        sizes.append(size)
        raise KeyboardInterrupt

    monkeypatch.setattr(video_world_model, "collect", stop)
    with pytest.raises(KeyboardInterrupt):
        cli_main(["train", "world", "--video", "--out", str(tmp_path / "v")])
    assert sizes == [64]


def test_the_episode_cache_is_named_by_what_was_rendered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(video_world_model, "collect", _collect_tiny_video_episodes)
    args = argparse.Namespace(data=tmp_path / "cache.npz", steps=3, image_size=16)
    video_world_model._episodes(args, "eval", 2, 10_004, (0.0, 0.02))
    assert [p.name for p in tmp_path.iterdir()] == ["cache-eval-2x3-seed10004-16px-noise0.0_0.02.npz"]


# -- second batch: what the first mutation run left alive ------------------------------------------


class _FlushRecorder:
    """A stdout that records its writes and flushes (capsys does not tell a flush apart)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def write(self, text: str) -> int:
        self.events.append(f"write:{text}")
        return len(text)

    def flush(self) -> None:
        self.events.append("flush")


@pytest.mark.parametrize("module", [world_model, video_world_model])
def test_progress_lines_are_flushed_at_once(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run's progress reaches a pipe (a CI log, `tee`) as it happens, not at exit."""
    out = _FlushRecorder()
    monkeypatch.setattr("sys.stdout", out)
    module._log("step 1")
    assert out.events[-1] == "flush" and "write:step 1" in out.events


def _stepped_clock(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """The module's clock reads 1000 s once (the command's start), then 1001.23456 s for good: the
    whole command takes 1.23456 s, each phase inside it none."""
    import types

    readings = iter([1000.0])
    monkeypatch.setattr(
        module, "time", types.SimpleNamespace(perf_counter=lambda: next(readings, 1001.23456))
    )


def _record_at_report(monkeypatch: pytest.MonkeyPatch, module: Any, out: Path) -> list[dict[str, Any]]:
    """The training record the checkpoint holds when the report starts (saved before it)."""
    seen: list[dict[str, Any]] = []
    real = module.horizon_errors

    def report(*args: Any) -> Any:
        seen.append(json.loads((out / CONFIG_FILE).read_text())["training"])
        return real(*args)

    monkeypatch.setattr(module, "horizon_errors", report)
    return seen


@needs_sim
def test_the_world_command_reports_elapsed_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stepped_clock(monkeypatch, world_model)
    out = tmp_path / "w"
    at_report = _record_at_report(monkeypatch, world_model, out)
    tiny = "--episodes 1 --eval-episodes 1 --steps 3 --ensemble 1 --hidden 4 --depth 1 --iterations 1"
    tiny += " --batch 2 --unroll 2 --unroll-iterations 1"
    assert cli_main(["train", "world", *tiny.split(), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for line in (
        "collected 1/1 training episodes (0 s)",
        "collected 1/1 held-out episodes (0 s)",
        "collected 3 transitions in 1 s",
    ):
        assert f"{line}\n" in text, text
    assert re.search(r"^one-step fit 1/1: mse \d+\.\d{5} \(0 s\)$", text, re.MULTILINE), text
    assert re.search(r"^unrolled fit 1/1: loss \d+\.\d{5} \(0 s\)$", text, re.MULTILINE), text
    assert at_report[0]["seconds"] == 1.2 and "evaluation" not in at_report[0]
    assert json.loads((out / CONFIG_FILE).read_text())["training"]["seconds"] == 1.2


def test_the_video_command_reports_elapsed_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stepped_clock(monkeypatch, video_world_model)
    monkeypatch.setattr(video_world_model, "collect", _collect_tiny_video_episodes)
    monkeypatch.setattr(video_world_model, "task_config", lambda lc, w, dw, size: _video_config(size))
    out = tmp_path / "v"
    at_report = _record_at_report(monkeypatch, video_world_model, out)
    tiny = "--episodes 1 --eval-episodes 1 --steps 2 --unroll 1 --ae-iterations 100 --dyn-iterations 100"
    tiny += " --decoder-iterations 100 --batch 1 --image-size 16"
    assert cli_main(["train", "world", "--video", *tiny.split(), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rendered 3 frames in 1 s\n" in text
    assert re.search(r"^autoencoder 100/100: mse \d+\.\d{5} \(0 s\)$", text, re.MULTILINE), text
    assert re.search(r"^dynamics 100/100: latent \d+\.\d{4}, state \d+\.\d{3} \(0 s\)$", text, re.MULTILINE)
    assert re.search(r"^decoder 100/100: mse \d+\.\d{5} \(0 s\)$", text, re.MULTILINE), text
    training = json.loads((out / CONFIG_FILE).read_text())["training"]
    assert training["seconds"] == training["render_seconds"] == 1.2
    assert (
        at_report[0]["seconds"] == at_report[0]["render_seconds"] == 1.2 and "evaluation" not in at_report[0]
    )


@needs_sim
def test_world_noise_is_drawn_from_its_own_stream_every_step() -> None:
    """The shipped checkpoint is reproduced only if the noise is the same draw: a generator seeded
    ``[seed, 7]``, seven normals a step (a zero level draws too), cast to float32 and clipped."""
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.expert import ScriptedExpert

    steps, sigma = 3, 0.3
    eps = world_model.collect(2, 9, (0.0, sigma), steps)
    rng = np.random.default_rng([9, 7])
    for _ in range(steps):
        rng.normal(0.0, 0.0, size=7)  # episode 0, level 0
    env = TabletopPickPlaceEnv(max_episode_steps=steps, terminate_on_success=False)
    expert = ScriptedExpert()
    obs, _ = env.reset(seed=eps[1].seed)
    expert.reset(obs)
    for t in range(steps):
        action = expert.act(obs).copy()
        action[:7] += rng.normal(0.0, sigma, size=7).astype(np.float32)
        action = np.clip(action, env.action_space.low, env.action_space.high)
        np.testing.assert_array_equal(eps[1].actions[t], action)
        obs, *_ = env.step(action)
    env.close()


@needs_sim
def test_video_episodes_render_each_step_and_draw_their_own_noise() -> None:
    from rollserve.sim.env import TabletopPickPlaceEnv
    from rollserve.sim.expert import ScriptedExpert
    from rollserve.sim.rendering import CameraRig

    steps, sigma, size = 2, 0.2, 16
    lines: list[str] = []
    data = video_world_model.collect(2, 3, (0.0, sigma), steps, size, log=lines.append)
    seeds = np.random.SeedSequence(3).generate_state(2, dtype=np.uint32)
    np.testing.assert_array_equal(data.seeds, seeds.astype(np.int64))
    assert data.seeds.dtype == np.int64 and data.states.dtype == data.actions.dtype == np.float32
    assert data.frames.shape == (2, steps + 1, size, size, 3) and data.frames.dtype == np.uint8
    assert [line.split(" (")[0] for line in lines] == ["rendered 2/2 episodes"]
    rng = np.random.default_rng([3, 11])
    env = TabletopPickPlaceEnv(max_episode_steps=steps, terminate_on_success=False)
    rig = CameraRig(env.model, (size, size), ("exterior",))
    expert = ScriptedExpert()
    for i, level in enumerate((0.0, sigma)):
        obs, _ = env.reset(seed=int(seeds[i]))
        expert.reset(obs)
        np.testing.assert_array_equal(data.frames[i, 0], rig.render(env.data)["exterior"])
        np.testing.assert_array_equal(data.states[i, 0], obs["state"])
        for t in range(steps):
            action = expert.act(obs).copy()
            action[:7] += rng.normal(0.0, level, size=7).astype(np.float32)
            action = np.clip(action, env.action_space.low, env.action_space.high)
            np.testing.assert_array_equal(data.actions[i, t], action)
            obs, *_ = env.step(action)
            np.testing.assert_array_equal(data.frames[i, t + 1], rig.render(env.data)["exterior"])
            np.testing.assert_array_equal(data.states[i, t + 1], obs["state"])
    rig.close()
    env.close()


@needs_sim
def test_video_collection_reports_every_eighth_episode_and_the_last() -> None:
    lines: list[str] = []
    video_world_model.collect(9, 0, (0.0,), 1, 16, log=lines.append)
    assert [line.split(" (")[0] for line in lines] == ["rendered 8/9 episodes", "rendered 9/9 episodes"]


@needs_sim
def test_the_episode_cache_is_compressed(tmp_path: Path) -> None:
    """Rendered frames compress well: the cache of a 48-episode run is tens of MB, not hundreds."""
    data = VideoEpisodes(
        frames=np.zeros((2, 5, 64, 64, 3), np.uint8),
        states=np.zeros((2, 5, STATE_DIM), np.float32),
        actions=np.zeros((2, 4, ACTION_DIM), np.float32),
        seeds=np.array([0, 1], np.int64),
    )
    data.save(tmp_path / "c.npz")
    assert (tmp_path / "c.npz").stat().st_size < data.frames.nbytes // 10


def test_the_episode_cache_loads_no_pickles(tmp_path: Path) -> None:
    """A cache file is data: one holding pickled objects is refused, not unpickled."""
    path = tmp_path / "c.npz"
    frames = np.zeros((1, 2, 16, 16, 3), np.uint8)
    np.savez(path, frames=frames, states=np.array([{"x": 1}], dtype=object), actions=frames, seeds=frames)
    with pytest.raises(ValueError, match="allow_pickle"):
        VideoEpisodes.load(path)


def _adamw_first_step(
    before: torch.Tensor, grad: torch.Tensor, lr: float, weight_decay: float
) -> torch.Tensor:
    """AdamW's first step from zero moments: the bias-corrected ratio m/sqrt(v) is g/|g|."""
    return before * (1 - lr * weight_decay) - lr * grad / (grad.abs() + 1e-8)


def _logged(lines: list[str], head: str) -> float:
    (line,) = (line for line in lines if line.startswith(head))
    return float(line.split(": ")[1].split()[1])


@needs_sim
def test_the_world_one_step_loss_is_the_normalised_change_error() -> None:
    """The first phase regresses each member's normalised state change on its own bootstrap batch,
    with AdamW at 2e-3: the logged loss and the weights after one step, from a reference here."""
    from rollserve.models.learned_world import WorldNet

    config, eps = _tiny_world_config(), [_episode(s, steps=6) for s in range(3)]
    lines: list[str] = []
    trained = world_model.fit(config, eps, 1, 4, 2, log=lines.append)
    torch.manual_seed(2)
    ref = WorldNet(config)
    data = world_model.to_transitions(eps)
    s, c, a, n = (torch.as_tensor(x) for x in (data.states, data.changes, data.actions, data.next_states))
    feats = ref.features(s, c, a)
    feat_std = feats.std(0)
    feat_std = torch.where(feat_std < 1e-6, 1.0, feat_std)
    change = n - s
    change_std = change.std(0)
    change_std = torch.where(change_std < 1e-6, 1.0, change_std)
    idx = torch.randint(len(s), (2, 4), generator=torch.Generator().manual_seed(2))
    pred = ref.mlp((feats[idx] - feats.mean(0)) / feat_std)
    loss = torch.mean((pred - (change[idx] - change.mean(0)) / change_std) ** 2)
    assert _logged(lines, "one-step fit 1/1") == pytest.approx(loss.item(), abs=6e-6)
    loss.backward()
    for (name, p), q in zip(ref.mlp.named_parameters(), trained.mlp.parameters(), strict=True):
        expected = _adamw_first_step(p.detach(), p.grad, 2e-3, 1e-5)
        clear = p.grad.abs() > 1e-6  # a sign at rounding level may go either way
        diff = (q.detach() - expected)[clear].abs().max().item()
        assert diff < 1e-7 and clear.float().mean() > 0.5, (name, diff)


@needs_sim
def test_the_world_unrolled_loss_is_the_rolled_out_state_error() -> None:
    """The second phase rolls each member ``unroll`` steps on its own predictions from a random
    start (its last change taken from the data) and scores the states in units of the change's
    spread, AdamW at 3e-4: the logged loss and the weights after one step, from a reference here."""
    config, eps = _tiny_world_config(), [_episode(s, steps=6) for s in range(3)]
    lines: list[str] = []
    trained = world_model.fit(config, eps, 1, 4, 2, unroll=3, unroll_iterations=1, log=lines.append)
    ref = world_model.fit(config, eps, 1, 4, 2)  # the same net after the first phase
    ref.mlp.zero_grad(set_to_none=True)  # the first phase's gradients are left on it
    gen = torch.Generator().manual_seed(2)
    torch.randint(15, (2, 4), generator=gen)  # the first phase's one batch (15 transitions)
    ep = torch.randint(3, (2, 4), generator=gen)
    t0 = torch.randint(6 - 3, (2, 4), generator=gen)
    states = torch.as_tensor(np.stack([e.states for e in eps]))
    actions = torch.as_tensor(np.stack([e.actions for e in eps]))
    state = states[ep, t0]
    before = states[ep, (t0 - 1).clamp(min=0)]
    change = torch.where((t0 > 0)[..., None], state - before, torch.zeros(()))  # none at a start
    scale = torch.where(ref.out_std < 1e-6, 1.0, ref.out_std)
    total = torch.zeros(())
    for k in range(3):
        x = (ref.features(state, change, actions[ep, t0 + k]) - ref.in_mean) / ref.in_std
        change = ref.mlp(x) * ref.out_std + ref.out_mean
        state = state + change
        total = total + ((state - states[ep, t0 + k + 1]) / scale).pow(2).mean()
    assert _logged(lines, "unrolled fit 1/1") == pytest.approx(total.item() / 3, rel=1e-5)
    (total / 3).backward()
    for (name, p), q in zip(ref.mlp.named_parameters(), trained.mlp.parameters(), strict=True):
        expected = _adamw_first_step(p.detach(), p.grad, 3e-4, 1e-5)
        clear = p.grad.abs() > 1e-6  # a sign at rounding level may go either way
        diff = (q.detach() - expected)[clear].abs().max().item()
        assert diff < 1e-7 and clear.float().mean() > 0.5, (name, diff)


def _video_fit_phases(ae: int, dyn: int, dec: int) -> Any:
    return _fit_video(3, ae_iterations=ae, dyn_iterations=dyn, decoder_iterations=dec, batch=3, unroll=2)


def _assert_one_adamw_step(
    before: Any, after: Any, trained: set[str], lr: float, weight_decay: float
) -> None:
    """The named parameters took one AdamW step along ``before``'s gradients; the others stayed."""
    moved = dict(after.named_parameters())
    checked = total = 0
    for name, p in before.named_parameters():
        if name.split(".")[0] not in trained:
            assert torch.equal(moved[name], p), name
            continue
        assert p.grad is not None, name
        expected = _adamw_first_step(p.detach(), p.grad, lr, weight_decay)
        clear = p.grad.abs() > 1e-6  # a sign at rounding level may go either way
        diff = (moved[name].detach() - expected)[clear].abs()
        assert diff.numel() == 0 or diff.max().item() < 1e-7, (name, diff.max().item())
        checked, total = checked + int(clear.sum()), total + p.numel()
    assert checked > total / 4  # most entries take a clear step


def _frames(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2).float() / 255.0


DECODER = {"decoder", "decoder_state"}
DYNAMICS = {"condition", "dyn_in", "dyn_body", "latent_summary", "state_head"}


def test_the_video_autoencoder_phase_reconstructs_single_frames() -> None:
    """Phase 1: every part of the net, AdamW at 2e-3, on the frame reconstruction error."""
    from rollserve.models.video_world import VideoWorldNet

    data = _video_episodes(2, 3, 0)
    trained = _video_fit_phases(1, 0, 0)
    torch.manual_seed(3)
    ref = VideoWorldNet(_video_config())
    for name, value in trained.named_buffers():  # the data's statistics, checked on their own above
        ref.get_buffer(name).copy_(value)
    gen = torch.Generator().manual_seed(3)
    ep, t = torch.randint(2, (3,), generator=gen), torch.randint(4, (3,), generator=gen)
    x = _frames(torch.as_tensor(data.frames)[ep, t])
    torch.mean((ref.decode(ref.encode(x), torch.as_tensor(data.states)[ep, t]) - x) ** 2).backward()
    names = {name.split(".")[0] for name, p in ref.named_parameters() if p.grad is not None}
    assert {"encoder", "decoder", "decoder_state"} <= names
    _assert_one_adamw_step(ref, trained, names, 2e-3, 1e-5)


def test_the_video_dynamics_phase_unrolls_latents_and_states() -> None:
    """Phase 2: the dynamics and state head (the autoencoder frozen), AdamW at 1e-3, on the latent
    error in units of the latents' spread plus 1/100 of the state error in units of the changes'."""
    data = _video_episodes(2, 3, 0)
    trained = _video_fit_phases(1, 1, 0)
    ref = _video_fit_phases(1, 0, 0)
    ref.zero_grad(set_to_none=True)
    frames, states, actions = (torch.as_tensor(x) for x in (data.frames, data.states, data.actions))
    gen = torch.Generator().manual_seed(3)
    torch.randint(2, (3,), generator=gen), torch.randint(4, (3,), generator=gen)  # phase 1
    ep, t0 = torch.randint(2, (3,), generator=gen), torch.randint(3 - 2 + 1, (3,), generator=gen)
    with torch.no_grad():
        latents = torch.stack([ref.encode(_frames(frames[i])) for i in range(2)])
    deltas = (states[:, 1:] - states[:, :-1]).reshape(-1, STATE_DIM)
    delta_scale = deltas.std(0)
    delta_scale = torch.where(delta_scale < 1e-6, 1.0, delta_scale)
    z, s = latents[ep, t0], states[ep, t0]
    latent_err = state_err = torch.zeros(())
    for k in range(2):
        z, s = ref.step(z, s, actions[ep, t0 + k])
        latent_err = latent_err + torch.mean(((z - latents[ep, t0 + k + 1]) / latents.std()) ** 2)
        state_err = state_err + torch.mean(((s - states[ep, t0 + k + 1]) / delta_scale) ** 2)
    ((latent_err + state_err / 100) / 2).backward()
    _assert_one_adamw_step(ref, trained, DYNAMICS, 1e-3, 1e-5)


def test_the_video_decoder_phase_draws_the_dynamics_own_latents() -> None:
    """Phase 3: the decoder only (AdamW at 5e-4, its default weight decay), on frames drawn from
    latents the frozen dynamics rolled 1 to ``unroll`` steps, never past an episode's end."""
    data = _video_episodes(2, 3, 0)
    trained = _video_fit_phases(1, 1, 1)
    ref = _video_fit_phases(1, 1, 0)
    ref.zero_grad(set_to_none=True)
    frames, states, actions = (torch.as_tensor(x) for x in (data.frames, data.states, data.actions))
    gen = torch.Generator().manual_seed(3)
    torch.randint(2, (3,), generator=gen), torch.randint(4, (3,), generator=gen)  # phase 1
    torch.randint(2, (3,), generator=gen), torch.randint(2, (3,), generator=gen)  # phase 2
    ep, t0 = torch.randint(2, (3,), generator=gen), torch.randint(3, (3,), generator=gen)
    k = min(int(torch.randint(1, 3, (1,), generator=gen).item()), 3 - int(t0.max()))
    with torch.no_grad():
        z = ref.encode(_frames(frames[ep, t0]))
        s = states[ep, t0]
        for j in range(k):
            z, s = ref.step(z, s, actions[ep, t0 + j])
    target = _frames(frames[ep, t0 + k])
    torch.mean((ref.decode(z, s) - target) ** 2).backward()
    _assert_one_adamw_step(ref, trained, DECODER, 5e-4, 1e-2)


class _ScriptedWorld:
    """A world whose every prediction is the simulator's next state plus a known error."""

    def __init__(self, eps: list[Episode], state_error: list[np.ndarray], reward_error: list[float]) -> None:
        self.eps, self.state_error, self.reward_error = eps, state_error, reward_error

    def initial_states(self, inits: list[Any]) -> list[Any]:
        assert [init.seed for init in inits] == [ep.seed for ep in self.eps]
        return [argparse.Namespace(state=(i, 0)) for i in range(len(inits))]

    def step_batch(self, steps: list[Any]) -> list[Any]:
        outs = []
        for i, step in enumerate(steps):
            ep, (j, t) = self.eps[i], step.state
            assert j == i
            np.testing.assert_array_equal(step.action, ep.actions[t])
            observation = ep.states[t + 1] + (t + 1) * self.state_error[i]  # the error grows
            outs.append(
                argparse.Namespace(
                    state=(i, t + 1), observation=observation, reward=ep.rewards[t] + self.reward_error[i]
                )
            )
        return outs


def test_the_world_report_scores_each_horizon_against_the_simulator() -> None:
    eps = [_episode(0, steps=10), _episode(1, steps=12)]  # the shorter one bounds the horizons
    first, second = np.zeros(STATE_DIM), np.zeros(STATE_DIM)
    first[:7], first[7], first[8:11] = 0.1, -0.2, (0.3, 0.4, 0.0)  # cube off by 0.5 m a step
    second[10] = 0.1
    world = _ScriptedWorld(eps, [first, second], [10.0, -0.5])  # the first one's success is wrong
    report = world_model.horizon_errors(world, eps)  # type: ignore[arg-type]
    assert report["episodes"] == 2 and list(report["horizon_steps"]) == ["1", "5", "10"]
    for h, row in report["horizon_steps"].items():
        k = int(h)
        assert row == pytest.approx(
            {
                "joint_rmse_rad": (0.1 * k + 0.0) / 2,
                "gripper_abs": (0.2 * k + 0.0) / 2,
                "cube_pos_err_m": (0.5 * k + 0.1 * k) / 2,
                "cube_pos_err_m_p90": 0.1 * k + 0.9 * (0.5 * k - 0.1 * k),
                "reward_abs_err": (10.0 + 0.5) / 2,
                "success_agreement": 0.5,
            },
            rel=1e-5,
        ), h


def test_the_video_command_runs_its_renderer_single_threaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mesa's rasteriser threads are off unless the user set them; torch gets ``--threads``."""
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    seen: list[tuple[str | None, int]] = []

    def stop(*args: Any, **kw: Any) -> None:
        import os

        seen.append((os.environ.get("LP_NUM_THREADS"), torch.get_num_threads()))
        raise KeyboardInterrupt

    threads = torch.get_num_threads()
    monkeypatch.setattr(video_world_model, "collect", stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            cli_main(["train", "world", "--video", "--threads", "2", "--out", str(tmp_path / "v")])
        monkeypatch.setenv("LP_NUM_THREADS", "3")
        with pytest.raises(KeyboardInterrupt):
            cli_main(["train", "world", "--video", "--out", str(tmp_path / "v")])
    finally:
        torch.set_num_threads(threads)
    assert seen == [("0", 2), ("3", 1)]


def test_the_world_command_sets_torch_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def stop(*args: Any, **kw: Any) -> None:
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    threads = torch.get_num_threads()
    monkeypatch.setattr(world_model, "collect", stop)
    try:
        for flag in (["--threads", "2"], []):
            with pytest.raises(KeyboardInterrupt):
                cli_main(["train", "world", *flag, "--out", str(tmp_path / "w")])
    finally:
        torch.set_num_threads(threads)
    assert seen == [2, 1]


def test_evaluate_only_reports_a_checkpoint_at_its_own_frame_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollserve.models.video_world import save_video_world

    out = save_video_world(_fit_video(0), tmp_path / "v")
    calls: list[tuple[Any, ...]] = []

    def collect(
        num: int, seed: int, noise: tuple[float, ...], steps: int, size: int, **kw: Any
    ) -> VideoEpisodes:
        calls.append((num, seed, noise, steps, size))
        return _video_episodes(num, steps, seed, size)

    monkeypatch.setattr(video_world_model, "collect", collect)
    argv = ["train", "world", "--video", "--evaluate-only", "--out", str(out), "--eval-episodes", "2"]
    assert cli_main([*argv, "--steps", "1", "--seed", "5", "--unroll", "9"]) == 0  # --unroll: not trained
    assert calls == [(2, 10_005, (0.02,), 1, 16)]
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 2 and list(report["horizon_steps"]) == ["1"]
    with pytest.raises(UsageError) as err:
        video_world_model._evaluate_only(
            argparse.Namespace(out=out, image_size=24, eval_episodes=1, seed=0, steps=1, data=None)
        )
    assert str(err.value) == (
        f"argument --image-size: the checkpoint at {out} takes 16px frames, got 24"
        " (leave it out with --evaluate-only)"
    )
    assert len(calls) == 1  # refused before rendering


def _episode_with_a_fixed_target(seed: int, steps: int = 6) -> Episode:
    """Like the task's: the target (the last two states) never moves; other states vary by little."""
    ep = _episode(seed, steps)
    states = ep.states * 0.01
    states[:, 11:] = (0.25, -0.1)
    return Episode(ep.seed, states, ep.actions, ep.rewards)


@needs_sim
def test_the_world_fit_predicts_no_change_for_what_never_changes() -> None:
    eps = [_episode_with_a_fixed_target(s) for s in range(3)]
    net = world_model.fit(_tiny_world_config(), eps, 2, 4, 0)
    data = world_model.to_transitions(eps)
    spread = (data.next_states - data.states).std(0, ddof=1)
    assert spread[:11].max() < 0.05  # the other changes vary by little, not by nothing
    np.testing.assert_allclose(net.out_std.numpy(), np.append(spread[:11], [0.0, 0.0]), rtol=1e-4)
    np.testing.assert_array_equal(net.out_mean.numpy()[11:], [0.0, 0.0])
    in_std = net.in_std.numpy()
    np.testing.assert_array_equal(in_std[[11, 12, 24, 25]], [1.0] * 4)  # the target, and its change
    assert np.all(in_std[:11] < 0.05)
    # a prediction of the target is its state: the net's change there is exactly 0
    s, c, a = (torch.as_tensor(x) for x in (data.states, data.changes, data.actions))
    with torch.no_grad():
        change = net.denormalise(net(s, c, a))
    np.testing.assert_array_equal(change[..., 11:].numpy(), 0.0)


def test_the_video_fit_predicts_no_change_for_what_never_changes() -> None:
    data = _video_episodes(2, 3, 0)
    data.states[..., :11] *= 0.01
    data.states[..., 11:] = (0.25, -0.1)
    net = video_world_model.fit(
        _video_config(),
        data,
        ae_iterations=1,
        dyn_iterations=1,
        decoder_iterations=0,
        batch=2,
        unroll=1,
        seed=0,
    )
    deltas = (data.states[:, 1:] - data.states[:, :-1]).reshape(-1, STATE_DIM)
    spread = deltas.std(0, ddof=1)
    np.testing.assert_allclose(net.delta_std.numpy(), np.append(spread[:11], [0.0, 0.0]), rtol=1e-4)
    np.testing.assert_array_equal(net.state_std.numpy()[11:], [1.0, 1.0])
    assert np.all(net.state_std.numpy()[:11] < 0.05)


@pytest.mark.parametrize("module", [world_model, video_world_model])
def test_an_unwritable_default_checkpoint_folder_is_refused_as_out(
    module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed package's checkpoint folder may be a file or read-only: the refusal names ``--out``."""
    taken = tmp_path / "taken"
    taken.write_text("a file")
    monkeypatch.setattr(module, "default_checkpoint_dir", lambda: taken)
    monkeypatch.setattr(module, "collect", lambda *a, **k: pytest.fail("collected before checking --out"))
    video = ["--video"] if module is video_world_model else []
    threads = torch.get_num_threads()
    try:
        with pytest.raises(UsageError) as err:
            module.main(cli_args(["train", "world", *video]))
    finally:
        torch.set_num_threads(threads)
    assert str(err.value) == f"argument --out: {taken} exists and is not a directory"


def cli_args(argv: list[str]) -> argparse.Namespace:
    """The namespace the command line parses ``argv`` into (without running the command)."""
    parser = argparse.ArgumentParser()
    module = video_world_model if "--video" in argv else world_model
    module.add_arguments(parser)
    return parser.parse_args([a for a in argv[2:] if a != "--video"])


@needs_sim
def test_the_world_fit_takes_float64_episodes_as_float32() -> None:
    """Episodes loaded from elsewhere may be float64: both phases train on them as on float32."""
    eps = [_episode(s, steps=6) for s in range(3)]
    wide = [
        Episode(e.seed, e.states.astype(np.float64), e.actions.astype(np.float64), e.rewards) for e in eps
    ]
    a, b = (
        world_model.fit(_tiny_world_config(), x, 2, 4, 0, unroll=2, unroll_iterations=2).state_dict()
        for x in (eps, wide)
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


def _shipped(name: str) -> dict[str, Any]:
    path = Path(world_model.__file__).resolve().parents[1] / "checkpoints" / name / CONFIG_FILE
    return json.loads(path.read_text())


@needs_sim
def test_the_world_command_defaults_reproduce_the_shipped_checkpoint() -> None:
    """`rollserve train world` with no flags trains what ships: its record says how it was made."""
    shipped = _shipped("world_model")
    record = shipped.pop("training")
    args = cli_args(["train", "world"])
    assert (args.episodes, args.unroll, args.unroll_iterations, args.iterations, args.seed) == (
        record["episodes"],
        record["unroll"],
        record["unroll_iterations"],
        record["iterations"],
        record["seed"],
    )
    assert args.noise == record["noise_levels"] and args.steps == record["transitions"] // record["episodes"]
    assert args.eval_episodes == record["evaluation"]["episodes"]
    assert (args.ensemble, args.hidden, args.depth) == (
        shipped["ensemble"],
        shipped["hidden"],
        shipped["depth"],
    )
    assert args.out is None and args.threads == 1
    config = world_model.task_config(args.ensemble, args.hidden, args.depth).to_dict()
    config = json.loads(json.dumps(config))  # tuples as the JSON file's lists
    config.pop("training")
    assert config == {k: shipped[k] for k in config} and len(config) >= 11


@needs_sim
def test_the_video_command_defaults_reproduce_the_shipped_checkpoint() -> None:
    shipped = _shipped("video_world")
    record = shipped.pop("training")
    args = cli_args(["train", "world", "--video"])
    for name in (
        "episodes",
        "steps",
        "ae_iterations",
        "dyn_iterations",
        "decoder_iterations",
        "batch",
        "unroll",
        "seed",
        "threads",
    ):
        assert getattr(args, name) == record[name], name
    assert args.noise == record["noise_levels"] and args.eval_episodes == record["evaluation"]["episodes"]
    assert args.image_size is None and shipped["image_size"] == video_world_model.DEFAULT_IMAGE_SIZE
    assert (args.latent_channels, args.width, args.dynamics_width) == (
        shipped["latent_channels"],
        shipped["width"],
        shipped["dynamics_width"],
    )
    assert args.data is None and args.out is None and args.evaluate_only is False
    config = video_world_model.task_config(
        args.latent_channels, args.width, args.dynamics_width, video_world_model.DEFAULT_IMAGE_SIZE
    ).to_dict()
    config = json.loads(json.dumps(config))  # tuples as the JSON file's lists
    config.pop("training")
    assert config == {k: shipped[k] for k in config} and len(config) >= 11


WORLD_HELP = {
    "--episodes": "training episodes to collect",
    "--eval-episodes": "held-out episodes for the error report",
    "--steps": "control steps per episode",
    "--noise": "action noise (rad)",
    "--ensemble": "networks in the ensemble",
    "--hidden": "hidden units per layer",
    "--depth": "hidden layers",
    "--iterations": "one-step training iterations",
    "--batch": "transitions per batch",
    "--unroll": "steps of the multi-step phase (below --steps)",
    "--unroll-iterations": "0 skips the multi-step phase",
    "--seed": "training seed",
    "--threads": "torch CPU threads",
    "--out": "checkpoint directory (default: the shipped one)",
}
VIDEO_HELP = {
    "--episodes": "training episodes to render",
    "--eval-episodes": "held-out episodes for the report",
    "--steps": "control steps per episode",
    "--noise": "action noise (rad)",
    "--image-size": (
        "frame size: a multiple of 8 from 16 to 256 (default 64; with --evaluate-only, the checkpoint's)"
    ),
    "--latent-channels": "channels of the latent",
    "--width": "encoder/decoder channels",
    "--dynamics-width": "latent dynamics channels",
    "--ae-iterations": "autoencoder phase iterations",
    "--dyn-iterations": "dynamics phase iterations",
    "--decoder-iterations": "decoder fine-tuning iterations (0 skips it)",
    "--batch": "samples (episode, time) per batch",
    "--unroll": "at most --steps",
    "--seed": "training seed",
    "--threads": "torch CPU threads",
    "--data": "cache of rendered episodes (.npz)",
    "--out": "checkpoint dir (default: the shipped one)",
    "--evaluate-only": "report the checkpoint at --out",
}


@pytest.mark.parametrize(("module", "expected"), [(world_model, WORLD_HELP), (video_world_model, VIDEO_HELP)])
def test_each_training_flag_says_what_it_sets(module: Any, expected: dict[str, str]) -> None:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings[0] != "-h"}
    assert helps == expected
    nargs = {a.option_strings[0]: a.nargs for a in parser._actions if a.nargs is not None}
    assert nargs == {
        "-h": 0,
        "--noise": "+",
        **({"--evaluate-only": 0} if module is video_world_model else {}),
    }


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["train", "world", "--depth", "0"], "depth"),
        (["train", "world", "--unroll-iterations", "0"], "unroll_iterations"),
        (["train", "world", "--seed", "0"], "seed"),
        (["train", "world", "--noise", "0"], "noise"),
        (["train", "world", "--video", "--decoder-iterations", "0"], "decoder_iterations"),
        (["train", "world", "--video", "--seed", "0"], "seed"),
        (["train", "world", "--video", "--noise", "0"], "noise"),
    ],
)
def test_the_flags_that_may_be_zero(argv: list[str], flag: str) -> None:
    assert getattr(cli_args(argv), flag) in (0, [0.0])


@pytest.mark.parametrize("video", [False, True])
@pytest.mark.parametrize(
    "flag",
    ["--episodes", "--eval-episodes", "--steps", "--batch", "--unroll", "--threads"],
)
def test_the_counts_that_may_not_be_zero(video: bool, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "world", *(["--video"] if video else []), flag, "0"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    assert exit_info.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "kind"),
    [("--data", "c.npz", Path), ("--out", "o", Path), ("--image-size", "32", int), ("--noise", "0.5", float)],
)
def test_the_video_flags_parse_to_their_types(flag: str, value: str, kind: type, tmp_path: Path) -> None:
    text = str(tmp_path / value) if kind is Path else value
    parsed = getattr(cli_args(["train", "world", "--video", flag, text]), flag[2:].replace("-", "_"))
    got = parsed[0] if isinstance(parsed, list) else parsed
    assert type(got) is kind or isinstance(got, kind)
