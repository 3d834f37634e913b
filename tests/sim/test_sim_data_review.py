"""The demonstration file's format (docs/sim.md, "Demonstration data") and the evaluation loop, pinned
against what the documentation promises, worked out apart from the code that writes them.

Most tests record with a shortened env (a few steps, small images) so that each takes a fraction
of a second; the format is the same, only the episodes are shorter.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import math
import os
import re
import sys
import time
import types
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollserve.sim import dataset, evaluate
from rollserve.sim.dataset import (
    Dataset,
    add_arguments,
    generate_dataset,
    load_dataset,
    main,
    write_npz,
)
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.sim.evaluate import EvalResult
from rollserve.sim.expert import ScriptedExpert
from rollserve.sim.layout import ACTION_NAMES, CAMERA_NAMES, CONTROL_HZ, STATE_NAMES

META_KEYS = {
    "format_version", "state_names", "action_names", "camera_names", "image_size", "control_hz",
    "max_episode_steps", "seed", "num_episodes", "action_noise", "success_rate",
}  # fmt: skip
STATE_ONLY_KEYS = {
    "states",
    "actions",
    "episode_index",
    "frame_index",
    "success",
    "episode_seeds",
    "meta_json",
}


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, so the progress bar draws into it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def short_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """generate_dataset records with episodes cut at 4 steps and 16x24 images (fast, same format)."""
    monkeypatch.setattr(
        dataset,
        "TabletopPickPlaceEnv",
        functools.partial(TabletopPickPlaceEnv, max_episode_steps=4, image_size=(16, 24)),
    )


def _seeds(seed: int, n: int) -> list[int]:
    """docs/sim.md: the episode seeds come from numpy's SeedSequence of the dataset seed."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(n, dtype=np.uint32)]


# -- the file as written ------------------------------------------------------------------------------


def test_a_state_only_file_holds_exactly_the_documented_arrays(tmp_path: Path, short_env: None) -> None:
    path = tmp_path / "deep" / "er" / "demos.npz"
    summary = generate_dataset(3, 11, path, progress=False)
    assert summary.path == path and path.is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == ["demos.npz"]  # no partial left
    with zipfile.ZipFile(path) as z:  # not compressed without images
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    assert set(arrays) == STATE_ONLY_KEYS
    n = 3 * 4  # every episode runs its 4 steps: the expert cannot finish in 4
    assert arrays["states"].shape == (n, 13) and arrays["states"].dtype == np.float32
    assert arrays["actions"].shape == (n, 8) and arrays["actions"].dtype == np.float32
    assert arrays["episode_index"].dtype == np.int64 and arrays["frame_index"].dtype == np.int64
    assert arrays["episode_index"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert arrays["frame_index"].tolist() == [0, 1, 2, 3] * 3
    assert arrays["success"].dtype == bool and arrays["success"].tolist() == [False] * 3
    assert arrays["episode_seeds"].dtype == np.int64 and arrays["episode_seeds"].tolist() == _seeds(11, 3)
    assert arrays["meta_json"].shape == () and arrays["meta_json"].dtype.kind == "U"
    meta = json.loads(str(arrays["meta_json"]))
    assert meta == {
        "format_version": 1,
        "state_names": list(STATE_NAMES),
        "action_names": list(ACTION_NAMES),
        "camera_names": [],
        "image_size": None,
        "control_hz": CONTROL_HZ,
        "max_episode_steps": 4,
        "seed": 11,
        "num_episodes": 3,
        "action_noise": 0.0,
        "success_rate": 0.0,
    }
    assert (summary.num_episodes, summary.num_frames, summary.success_rate) == (3, n, 0.0)
    assert type(summary.success_rate) is float


def test_recording_closes_its_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env (and, with images, its renderer) is closed once the episodes are recorded."""
    made: list[Any] = []

    class Recorded(TabletopPickPlaceEnv):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(max_episode_steps=2, **kwargs)
            self.closes = 0
            made.append(self)

        def close(self) -> None:
            self.closes += 1
            super().close()

    monkeypatch.setattr(dataset, "TabletopPickPlaceEnv", Recorded)
    generate_dataset(1, 0, tmp_path / "c.npz", progress=False)
    assert [env.closes for env in made] == [1]


def test_the_summary_times_the_whole_recording(tmp_path: Path, short_env: None) -> None:
    before = time.perf_counter()
    summary = generate_dataset(1, 0, tmp_path / "t.npz", progress=False)
    after = time.perf_counter()
    assert 0 < summary.seconds <= after - before


def test_frames_are_the_observations_before_the_experts_actions(tmp_path: Path) -> None:
    """Replayed in a fresh env from the stored seed, the stored actions give the stored states, the
    expert chose them, and the episode ends (success) exactly after its last stored frame."""
    summary = generate_dataset(1, 2, tmp_path / "r.npz", progress=False)
    data = load_dataset(summary.path)
    env, expert = TabletopPickPlaceEnv(), ScriptedExpert()
    obs, _ = env.reset(seed=_seeds(2, 1)[0])
    expert.reset(obs)
    n = len(data.states)
    for t in range(n):
        assert np.array_equal(data.states[t], obs["state"]), t
        assert np.array_equal(data.actions[t], expert.act(obs)), t
        obs, _, terminated, truncated, info = env.step(data.actions[t])
        assert (terminated or truncated) == (t == n - 1), t
    env.close()
    assert info["success"] and data.success.tolist() == [True]
    assert data.meta["success_rate"] == 1.0 and summary.success_rate == 1.0
    assert data.meta["max_episode_steps"] == 120 and n < 120


def test_action_noise_moves_the_executed_targets_but_records_the_clean_action(
    tmp_path: Path, short_env: None
) -> None:
    """Replaying with the stored action plus N(0, noise) on the 7 joints (float32, drawn in order
    from the generator seeded [seed, 1]) gives the stored states; the stored action is the expert's."""
    noise, seed = 0.03, 6
    data = load_dataset(
        generate_dataset(2, seed, tmp_path / "n.npz", progress=False, action_noise=noise).path
    )
    assert data.meta["action_noise"] == noise
    rng = np.random.default_rng([seed, 1])
    env, expert = TabletopPickPlaceEnv(max_episode_steps=4), ScriptedExpert()
    for episode, frames in enumerate(data.episode_slices()):
        obs, _ = env.reset(seed=_seeds(seed, 2)[episode])
        expert.reset(obs)
        for t in range(frames.start, frames.stop):
            assert np.array_equal(data.states[t], obs["state"]), t
            assert np.array_equal(data.actions[t], expert.act(obs)), t
            executed = data.actions[t].copy()
            executed[:7] += rng.normal(0.0, noise, size=7).astype(np.float32)
            obs, *_ = env.step(executed)
    env.close()
    clean = load_dataset(generate_dataset(2, seed, tmp_path / "c.npz", progress=False).path)
    assert not np.array_equal(clean.states, data.states)


def test_images_are_compressed_frames_of_both_cameras(tmp_path: Path, short_env: None) -> None:
    path = generate_dataset(2, 4, tmp_path / "i.npz", render_images=True, progress=False).path
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    with np.load(path, allow_pickle=False) as npz:
        assert set(npz.files) == STATE_ONLY_KEYS | {f"images_{c}" for c in CAMERA_NAMES}
    data = load_dataset(path)
    assert data.meta["camera_names"] == list(CAMERA_NAMES) and data.meta["image_size"] == [16, 24]
    assert data.images is not None and sorted(data.images) == sorted(CAMERA_NAMES)
    env = TabletopPickPlaceEnv(render_images=True, image_size=(16, 24), max_episode_steps=4)
    obs, _ = env.reset(seed=_seeds(4, 2)[1])
    second = list(data.episode_slices())[1]
    for name in CAMERA_NAMES:
        frames = data.images[name]
        assert frames.shape == (8, 16, 24, 3) and frames.dtype == np.uint8
        assert np.array_equal(frames[second.start], obs["images"][name])
    env.close()


def test_same_seed_gives_the_same_file_other_seeds_other_layouts(tmp_path: Path, short_env: None) -> None:
    a = load_dataset(generate_dataset(2, 7, tmp_path / "a.npz", progress=False).path)
    b = load_dataset(generate_dataset(2, 7, tmp_path / "b.npz", progress=False).path)
    c = load_dataset(generate_dataset(2, 8, tmp_path / "c.npz", progress=False).path)
    assert np.array_equal(a.states, b.states) and np.array_equal(a.actions, b.actions)
    assert not np.array_equal(a.states[0], c.states[0])


# -- arguments ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_episodes", "seed", "action_noise", "message"),
    [
        (1, True, 0.0, "seed must be a whole number >= 0, got True"),
        (1, np.int64(-1), 0.0, f"seed must be a whole number >= 0, got {np.int64(-1)!r}"),
        (1, 0, True, "action_noise must be a finite number >= 0 (rad), got True"),
        (1, 0, -math.inf, "action_noise must be a finite number >= 0 (rad), got -inf"),
        (1, 0, None, "action_noise must be a finite number >= 0 (rad), got None"),
    ],
)
def test_more_bad_arguments_are_refused_word_for_word(
    tmp_path: Path, num_episodes: Any, seed: Any, action_noise: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        generate_dataset(num_episodes, seed, tmp_path / "x.npz", progress=False, action_noise=action_noise)
    assert list(tmp_path.iterdir()) == []


def test_the_lowest_allowed_values_record(tmp_path: Path, short_env: None) -> None:
    """1 episode, seed 0, noise 0 (an int 0 and numpy scalars too) are the documented lower bounds."""
    meta = load_dataset(generate_dataset(1, 0, tmp_path / "a.npz", progress=False, action_noise=0).path).meta
    assert (meta["num_episodes"], meta["seed"], meta["action_noise"]) == (1, 0, 0.0)
    assert type(meta["action_noise"]) is float
    summary = generate_dataset(
        np.int32(1), 0, tmp_path / "b.npz", progress=False, action_noise=np.float64(0.01)
    )
    assert load_dataset(summary.path).meta["action_noise"] == 0.01


# -- loading ------------------------------------------------------------------------------------------


def _hand_written(path: Path, **extra: np.ndarray) -> None:
    meta = {"seed": 3, "camera_names": ["a_b"]}
    np.savez(
        path,
        states=np.arange(6, dtype=np.float32).reshape(3, 2),
        actions=np.ones((3, 1), np.float32),
        episode_index=np.array([0, 0, 1]),
        frame_index=np.array([0, 1, 0]),
        success=np.array([True, False]),
        meta_json=np.array(json.dumps(meta)),
        **extra,
    )


def test_load_reads_each_array_by_its_name(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    _hand_written(path, images_a_b=np.full((3, 2, 2, 3), 7, np.uint8), not_images_x=np.zeros(1))
    data = load_dataset(str(path))
    assert data.states.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert data.actions.tolist() == [[1], [1], [1]]
    assert data.episode_index.tolist() == [0, 0, 1] and data.frame_index.tolist() == [0, 1, 0]
    assert data.success.tolist() == [True, False] and data.num_episodes == 2
    assert data.meta == {"seed": 3, "camera_names": ["a_b"]}
    assert data.images is not None and list(data.images) == ["a_b"]
    assert np.array_equal(data.images["a_b"], np.full((3, 2, 2, 3), 7, np.uint8))


def test_load_without_images_says_none(tmp_path: Path) -> None:
    path = tmp_path / "h.npz"
    _hand_written(path)
    assert load_dataset(path).images is None


def test_load_refuses_pickled_arrays(tmp_path: Path) -> None:
    """docs/sim.md: readable without pickle; a file that needs it is refused, not unpickled."""
    path = tmp_path / "p.npz"
    np.savez(
        path,
        states=np.zeros((1, 13), np.float32),
        actions=np.zeros((1, 8), np.float32),
        episode_index=np.zeros(1, np.int64),
        frame_index=np.zeros(1, np.int64),
        success=np.array([True]),
        meta_json=np.array([{"seed": 0}], dtype=object),
    )
    with pytest.raises(ValueError, match="allow_pickle"):
        load_dataset(path)


@pytest.mark.parametrize(
    ("episode_index", "episodes", "expected"),
    [
        ([0, 0, 1, 1, 1, 2], 3, [(0, 2), (2, 5), (5, 6)]),
        ([0, 0, 1], 4, [(0, 2), (2, 3), (3, 3), (3, 3)]),  # trailing episodes without frames
        ([1, 1], 2, [(0, 0), (0, 2)]),
    ],
)
def test_episode_slices_are_contiguous_ranges_in_order(
    episode_index: list[int], episodes: int, expected: list[tuple[int, int]]
) -> None:
    data = Dataset(
        states=np.zeros((len(episode_index), 13), np.float32),
        actions=np.zeros((len(episode_index), 8), np.float32),
        episode_index=np.array(episode_index, np.int64),
        frame_index=np.zeros(len(episode_index), np.int64),
        success=np.zeros(episodes, bool),
        meta={},
    )
    slices = list(data.episode_slices())
    assert [(s.start, s.stop, s.step) for s in slices] == [(a, b, None) for a, b in expected]
    assert all(type(s.start) is int and type(s.stop) is int for s in slices)
    assert data.num_episodes == episodes and data.images is None


# -- writing ------------------------------------------------------------------------------------------


def test_write_goes_through_a_partial_file_beside_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "new" / "d.npz"
    seen: list[tuple[str, str, bool]] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append((str(src), str(dst), Path(src).is_file()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    assert write_npz(target, {"x": np.arange(3)}, compress=True) == target
    assert seen == [(str(tmp_path / "new" / "d.npz.partial"), str(target), True)]
    with np.load(target) as npz:
        assert npz["x"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in target.parent.iterdir()) == ["d.npz"]


def test_a_failed_write_keeps_the_previous_file_and_no_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "d.npz"
    write_npz(target, {"x": np.arange(2)}, compress=False)

    def failing_savez(file: Any, **arrays: Any) -> None:
        file.write(b"half a file")
        raise KeyboardInterrupt  # a BaseException: cut short, not only an error

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(KeyboardInterrupt):
        write_npz(target, {"x": np.arange(5)}, compress=False)
    monkeypatch.undo()
    with np.load(target) as npz:
        assert npz["x"].tolist() == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]


def test_a_write_that_fails_before_the_partial_exists_raises_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cleaning up a partial that was never created must not hide why the write failed."""
    failure = OSError(28, "No space left on device")

    def failing_open(*args: Any, **kwargs: Any) -> Any:
        raise failure

    monkeypatch.setattr(dataset, "open", failing_open, raising=False)
    with pytest.raises(OSError) as raised:
        write_npz(tmp_path / "d.npz", {"x": np.zeros(1)}, compress=False)
    assert raised.value is failure
    assert list(tmp_path.iterdir()) == []


def test_a_folder_in_the_way_is_raised_and_leaves_no_partial(tmp_path: Path) -> None:
    (tmp_path / "taken.npz").mkdir()
    with pytest.raises(OSError):
        write_npz(tmp_path / "taken.npz", {"x": np.zeros(1)}, compress=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.npz"]


# -- progress -----------------------------------------------------------------------------------------


def test_the_progress_bar_shows_the_running_success_rate_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    with dataset._progress_bar(4, enabled=True) as advance:
        advance(True)
        advance(False)
        advance(True)
        advance(True)
    text = err.getvalue()
    assert "expert demos" in text and "0/4" in text and "success -" in text  # before the first episode
    assert "4/4" in text and "success 75%" in text
    assert "\x1b[1A" not in text  # the finished bar stays on screen (not transient: no cursor-up erase)


def test_the_progress_bar_draws_its_columns_word_for_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each frame: the label, the bar, done/total, the success rate and the time left, in that order."""
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    with dataset._progress_bar(2, enabled=True) as advance:
        advance(False)
        advance(True)
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f).strip() for f in err.getvalue().split("\r")]
    frames = [f for f in frames if f]
    assert re.fullmatch(r"expert demos ━+ 0/2 success - -:--:--", frames[0]), frames
    assert re.fullmatch(r"expert demos [━╺╸]+ 2/2 success 50% \d+:\d\d:\d\d", frames[-1]), frames


def test_the_progress_bar_is_silent_when_off_or_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    with dataset._progress_bar(2, enabled=False) as advance:
        advance(True)
        advance(True)
    assert err.getvalue() == ""
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    with dataset._progress_bar(2, enabled=True) as advance:
        advance(True)
    assert plain.getvalue() == ""


def test_the_bar_counts_a_recorded_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The expert solves seed 0's first episode (a full-length env here): the bar says 100%."""
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    summary = generate_dataset(1, 0, tmp_path / "s.npz")
    assert summary.success_rate == 1.0
    assert "1/1" in err.getvalue() and "success 100%" in err.getvalue()


def test_recording_draws_the_bar_unless_told_not_to(
    tmp_path: Path, short_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    generate_dataset(2, 0, tmp_path / "q.npz", progress=False)
    assert err.getvalue() == ""
    generate_dataset(2, 0, tmp_path / "p.npz")  # progress is on by default
    assert "2/2" in err.getvalue() and "success 0%" in err.getvalue()


# -- the CLI ------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollserve dataset")
    add_arguments(parser)
    return parser


def test_the_cli_defaults_are_the_documented_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args([])
    assert (args.episodes, args.seed, args.out, args.images, args.action_noise, args.quiet) == (
        200, 0, Path("data/tabletop.npz"), False, 0.0, False,
    )  # fmt: skip
    assert list(tmp_path.iterdir()) == []
    args = _parser().parse_args(
        ["--episodes", "3", "--seed", "4", "--out", "o.npz", "--images", "--action-noise", "0.5", "--quiet"]
    )
    assert (args.episodes, args.seed, args.out, args.images, args.action_noise, args.quiet) == (
        3, 4, Path("o.npz"), True, 0.5, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--episodes", "0"], "--episodes"),
        (["--action-noise", "-0.1"], "--action-noise"),
        (["--out", "."], "--out"),
    ],
)
def test_the_cli_refuses_out_of_range_values(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    flag: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_cli_help_gives_each_option_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split()) + " "
    for words in (
        "number of expert episodes (default 200)",
        "dataset seed; episode seeds derive from it",
        "output .npz path",
        "also record both camera images (slow)",
        "std (rad) of noise on executed joint targets",
        "no progress bar",
    ):
        assert f" {words} " in text, words


def test_main_records_what_it_was_asked_and_says_so(
    tmp_path: Path, short_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "m.npz"
    args = argparse.Namespace(episodes=2, seed=5, out=out, images=True, quiet=True, action_noise=0.25)
    assert main(args) == 0
    line = capsys.readouterr().out
    match = re.fullmatch(
        rf"wrote {re.escape(str(out))}: 2 episodes, 8 frames in (\d+\.\d) s; expert success rate 0\.0%\n",
        line,
    )
    assert match, line
    assert err.getvalue() == ""  # --quiet
    data = load_dataset(out)
    assert (data.meta["seed"], data.meta["action_noise"], data.num_episodes) == (5, 0.25, 2)
    assert data.images is not None
    args = argparse.Namespace(
        episodes=1, seed=0, out=tmp_path / "n.npz", images=False, quiet=False, action_noise=0
    )
    assert main(args) == 0
    assert "1/1" in err.getvalue()
    assert load_dataset(tmp_path / "n.npz").images is None


def test_main_reports_a_failed_write_and_exits_1(
    tmp_path: Path, short_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "d.npz"
    args = argparse.Namespace(episodes=1, seed=0, out=out, images=False, quiet=True, action_noise=0.0)
    assert main(args) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"rollserve dataset: error: cannot write {out}: ")
    assert captured.err.endswith("\n") and len(captured.err.splitlines()) == 1


# -- evaluation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "rate"), [((), 0.0), ((True,), 1.0), ((True, False, True, True), 0.75), ((False,), 0.0)]
)
def test_success_rate_is_the_share_of_successes(successes: tuple[bool, ...], rate: float) -> None:
    result = EvalResult(tuple(range(len(successes))), successes, (1,) * len(successes), 1.0)
    assert result.success_rate == rate and type(result.success_rate) is float


@pytest.mark.parametrize(
    ("steps", "seconds", "rate"), [((10, 20), 3.0, 10.0), ((5,), 0.0, 0.0), ((), 2.0, 0.0)]
)
def test_steps_per_second_is_all_steps_over_the_time(
    steps: tuple[int, ...], seconds: float, rate: float
) -> None:
    result = EvalResult(tuple(range(len(steps))), (False,) * len(steps), steps, seconds)
    assert result.steps_per_second == rate


def test_evaluate_runs_each_seed_in_the_given_env_and_counts_steps() -> None:
    """The actor built from the first observation sees every observation in turn; an episode ends
    when the env truncates it (3 steps here), a hold-still robot never succeeds."""
    env = TabletopPickPlaceEnv(max_episode_steps=3)
    reference = TabletopPickPlaceEnv(max_episode_steps=3)
    seen: list[tuple[int, list[np.ndarray]]] = []

    def start(first: dict[str, Any]) -> evaluate.Actor:
        states: list[np.ndarray] = [first["state"].copy()]
        seen.append((len(seen), states))

        def act(obs: dict[str, Any]) -> np.ndarray:
            states.append(obs["state"].copy())
            return np.concatenate([obs["state"][:7], [0.0]]).astype(np.float32)

        return act

    before = time.perf_counter()
    result = evaluate.evaluate(start, np.array([5, 9]), env=env)
    after = time.perf_counter()
    assert result.seeds == (5, 9) and all(type(s) is int for s in result.seeds)
    assert result.successes == (False, False) and result.episode_steps == (3, 3)
    assert all(type(s) is bool for s in result.successes)
    assert 0 < result.seconds <= after - before
    for (_, states), seed in zip(seen, (5, 9), strict=True):
        obs, _ = reference.reset(seed=seed)
        assert np.array_equal(states[0], obs["state"]) and np.array_equal(states[1], obs["state"])
        assert len(states) == 4  # the first observation, then one per step
    env.close()
    reference.close()


def test_evaluate_counts_a_success_and_its_length() -> None:
    """The expert on seed 2 succeeds; its length is the steps until the env said done, counted here."""
    env, expert = TabletopPickPlaceEnv(), ScriptedExpert()
    obs, _ = env.reset(seed=2)
    expert.reset(obs)
    steps = 0
    while True:
        obs, _, terminated, truncated, info = env.step(expert.act(obs))
        steps += 1
        if terminated or truncated:
            break
    env.close()
    result = evaluate.evaluate_expert([2])
    assert result.successes == (bool(info["success"]),) == (True,)
    assert result.episode_steps == (steps,) and result.seeds == (2,)


def test_evaluate_builds_its_own_env_when_given_none() -> None:
    """Default env: 120 steps at most, so a hold-still robot's episode is 120 steps long."""

    def start(first: dict[str, Any]) -> evaluate.Actor:
        return lambda obs: np.concatenate([obs["state"][:7], [0.0]]).astype(np.float32)

    result = evaluate.evaluate(start, [0])
    assert result.episode_steps == (120,) and result.successes == (False,)


def test_the_expert_command_prints_its_score(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[Any] = []

    def fake(seeds: Any) -> EvalResult:
        asked.append(seeds)
        return EvalResult((0, 1, 2), (True, False, True), (40, 50, 61), 2.0)

    monkeypatch.setattr(evaluate, "evaluate_expert", fake)
    assert evaluate.main(["--episodes", "3"]) == 0
    assert asked == [range(3)]
    assert capsys.readouterr().out == (
        "expert: 2/3 successes over seeds 0..2, mean episode 50.3 steps, 76 steps/s\n"
    )
    assert evaluate.main([]) == 0
    assert asked[-1] == range(100)


def test_the_policy_command_scores_the_shipped_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The torch modules are replaced (this file stays torch-free): what main passes and prints."""
    calls: list[tuple[Any, int]] = []
    shipped = object()
    checkpoint = types.ModuleType("rollserve.models.checkpoint")
    checkpoint.load_default = lambda: shipped  # type: ignore[attr-defined]
    policy_eval = types.ModuleType("rollserve.training.policy_eval")

    def evaluate_policy(policy: Any, episodes: int) -> dict[str, Any]:
        calls.append((policy, episodes))
        return {"successes": 3, "first_seed": 100000, "mean_steps": 61.26}

    policy_eval.evaluate_policy = evaluate_policy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rollserve.models.checkpoint", checkpoint)
    monkeypatch.setitem(sys.modules, "rollserve.training.policy_eval", policy_eval)
    assert evaluate.main(["--policy", "--episodes", "4"]) == 0
    assert calls == [(shipped, 4)]
    assert capsys.readouterr().out == (
        "policy: 3/4 successes over seeds 100000..100003, mean episode 61.3 steps\n"
    )
    assert evaluate.main(["--policy"]) == 0
    assert calls[-1] == (shipped, 100)


def test_the_evaluate_command_help_says_what_each_option_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split()) + " "
    assert text.startswith("usage: python -m rollserve.sim.evaluate ")
    for words in (
        "Re-measure README's figures: the expert over seeds 0.., or the shipped policy over 100000..",
        "seeded episodes (default 100)",
        "score the shipped flow policy (synchronous, 8 actions per chunk, unseen seeds from 100000) "
        "instead of the scripted expert (seeds from 0)",
    ):
        assert f" {words} " in text, words
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(["--episodes", "0"])
    assert exit_.value.code == 2 and "argument --episodes:" in capsys.readouterr().err
