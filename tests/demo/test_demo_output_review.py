"""Review tests of what `rollserve demo` leaves behind: the table and JSON line, the progress lines,
the per-request recording, the real-time robot loop, the plot and the video.

Written from docs/demo.md ("Flags", "How it runs", "Reading the table") and the modules' documented
behaviour; expected values are worked out by hand here, not read back from the implementation.
Real parts throughout (rich, matplotlib, imageio, the MuJoCo env, the request path in process); a
clock (`time.perf_counter` of the recording module) and a terminal (rich's `force_terminal`) are the
only stand-ins.
"""

from __future__ import annotations

import io
import json
import math
import threading
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import matplotlib
import numpy as np
import pytest
from rich.console import Console

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rollserve.client.local_engine import LocalChunkSource
from rollserve.demo import plots, progress, recording, report, robot, video
from rollserve.demo.metrics import EpisodeTrace
from rollserve.demo.strategies import STRATEGIES, StrategyEngine, engine_config
from rollserve.models.simple_policies import chunk_policy
from rollserve.sim.env import TabletopPickPlaceEnv
from rollserve.wire.messages import ActionChunkMsg

RED = (220, 30, 30)


def arm(*joints: float, gripper: float = 0.0) -> np.ndarray:
    values = list(joints) + [0.0] * (7 - len(joints)) + [gripper]
    return np.asarray(values, dtype=np.float32)


def trace_of(seed: int, actions: list[np.ndarray | None], ids: list[int | None]) -> EpisodeTrace:
    trace = EpisodeTrace(seed=seed)
    for action, chunk_id in zip(actions, ids, strict=True):
        trace.record(action, chunk_id)
    return trace


# -- report: the table ---------------------------------------------------------------------------------


def row(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "successes": 4,
        "episodes": 5,
        "steps_per_s": 7.4149,
        "stall_ticks": 111,
        "ticks": 429,
        "inference_ms_p50": 5.84,
        "inference_ms_p99": 12.55,
        "round_trip_ms_p50": 212.4,
        "round_trip_ms_p99": 220.6,
        "boundary_jump_rad": 0.03844,
        "within_jump_rad": 0.040912,
        "jump_ratio": 0.9396,
    }
    values.update(overrides)
    return values


def cells(table: Any) -> list[list[str]]:
    columns = [list(column.cells) for column in table.columns]
    return [list(r) for r in zip(*columns, strict=True)]


def test_the_table_has_the_documented_columns_in_order() -> None:
    table = report.results_table({}, {}, "t")
    headers = [column.header for column in table.columns]
    assert headers == [
        "strategy",
        "success",
        "steps/s",
        "stalls",
        "infer ms",
        "round trip ms",
        "jump: boundary",
        "in chunk",
        "ratio",
    ]
    assert [column.justify for column in table.columns] == ["left"] + ["right"] * 8
    assert table.row_count == 0


def test_a_row_formats_each_figure_as_docs_demo_md_shows_it() -> None:
    table = report.results_table({"sync": row()}, {"sync": "synchronous"}, "title")
    # docs/demo.md's table: 4/5, 7.41, 111/429, 5.8 / 12.6, 212 / 221, 0.0384, 0.0409, 0.94
    assert cells(table) == [
        ["synchronous", "4/5", "7.41", "111/429", "5.8 / 12.6", "212 / 221", "0.0384", "0.0409", "0.94"]
    ]


def test_rows_keep_the_order_given_and_an_unlabelled_strategy_shows_its_name() -> None:
    results = {"rtc": row(successes=5), "custom": row(successes=1)}
    table = report.results_table(results, {"rtc": "async + RTC", "sync": "synchronous"}, "t")
    assert [r[0] for r in cells(table)] == ["async + RTC", "custom"]
    assert [r[1] for r in cells(table)] == ["5/5", "1/5"]


def test_nan_and_none_figures_are_a_dash() -> None:
    nan = math.nan
    table = report.results_table(
        {
            "a": row(
                steps_per_s=nan,
                inference_ms_p50=nan,
                inference_ms_p99=None,
                round_trip_ms_p50=None,
                round_trip_ms_p99=nan,
                boundary_jump_rad=nan,
                within_jump_rad=None,
                jump_ratio=nan,
            )
        },
        {},
        "t",
    )
    assert cells(table) == [["a", "4/5", "-", "111/429", "- / -", "- / -", "-", "-", "-"]]


def test_round_trip_has_no_decimals_and_rounds_half_to_even_like_format() -> None:
    table = report.results_table(
        {"a": row(round_trip_ms_p50=211.5, round_trip_ms_p99=0.4, steps_per_s=10.0, jump_ratio=1.005)},
        {},
        "t",
    )
    got = cells(table)[0]
    assert got[5] == "212 / 0"
    assert got[2] == "10.00"
    assert got[8] == f"{1.005:.2f}"


def test_title_and_caption_are_left_justified_and_the_caption_explains_the_columns() -> None:
    table = report.results_table({}, {}, "rollserve demo: 5 episodes")
    assert table.title == "rollserve demo: 5 episodes"
    assert table.title_justify == "left"
    assert table.caption_justify == "left"
    assert table.caption == (
        "stalls: ticks with no action ready / all ticks. ms: p50 / p99; round trip includes the added "
        "delay. jump: mean joint-space step (rad) between consecutive executed actions, at a chunk "
        "boundary vs inside a chunk; ratio = boundary / inside (1 = seamless)."
    )


def test_the_table_renders_with_every_figure_on_one_line() -> None:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(
        report.results_table({"rtc": row()}, {"rtc": "async + RTC"}, "my title")
    )
    text = out.getvalue()
    assert text.splitlines()[0].startswith("my title")
    line = next(line for line in text.splitlines() if "async + RTC" in line)
    for figure in ("4/5", "7.41", "111/429", "5.8 / 12.6", "212 / 221", "0.0384", "0.0409", "0.94"):
        assert figure in line


# -- report: the JSON line -----------------------------------------------------------------------------


def test_the_json_line_is_compact_with_nan_as_null_and_floats_rounded_to_five_places() -> None:
    payload = {
        "demo": "rollserve",
        "delay_ms": 200.0,
        "strategies": {"sync": {"steps_per_s": 7.414926, "jump_ratio": math.nan, "ticks": 429}},
        "plot": None,
        "interrupted": True,
    }
    line = report.json_line(payload)
    assert "\n" not in line and " " not in line
    assert line == (
        '{"demo":"rollserve","delay_ms":200.0,"strategies":{"sync":{"steps_per_s":7.41493,'
        '"jump_ratio":null,"ticks":429}},"plot":null,"interrupted":true}'
    )
    assert json.loads(line)["strategies"]["sync"]["jump_ratio"] is None


def test_the_json_line_takes_any_mapping_and_leaves_it_unchanged() -> None:
    from types import MappingProxyType

    inner = {"x": math.nan}
    payload = MappingProxyType({"a": 1.234567891, "b": inner})
    assert report.json_line(payload) == '{"a":1.23457,"b":{"x":null}}'
    assert math.isnan(inner["x"])


# -- recording -----------------------------------------------------------------------------------------


class Inner:
    """A chunk source that answers at once and notes every call (a real one needs a server)."""

    epoch = 7

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def connect(self) -> str:
        self.calls.append("connect")
        return "info"

    def infer(self, request: Any) -> ActionChunkMsg:
        self.calls.append(("infer", request))
        return ActionChunkMsg(inference_ms=float(len(self.calls)) + 0.25)

    def reset(self, episode_id: int) -> None:
        self.calls.append(("reset", episode_id))

    def reconnect(self) -> str:
        self.calls.append("reconnect")
        return "again"

    def close(self) -> None:
        self.calls.append("close")


class Clock:
    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0)


def test_recording_delegates_everything_to_the_inner_source() -> None:
    inner = Inner()
    source = recording.RecordingSource(inner)
    assert source.inner is inner and source.in_flight is None
    assert source.epoch == 7
    inner.epoch = 9
    assert source.epoch == 9
    assert source.connect() == "info"
    source.reset(3)
    assert source.reconnect() == "again"
    source.close()
    assert inner.calls == ["connect", ("reset", 3), "reconnect", "close"]
    assert source.round_trips_ms == [] and source.inference_ms == []


def test_each_reply_records_its_round_trip_in_ms_and_the_server_inference_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = Inner()
    source = recording.RecordingSource(inner)
    monkeypatch.setattr(recording.time, "perf_counter", Clock(10.0, 10.25, 20.0, 20.0125))
    first = source.infer("req-1")
    second = source.infer("req-2")
    assert inner.calls == [("infer", "req-1"), ("infer", "req-2")]
    assert (first.inference_ms, second.inference_ms) == (1.25, 2.25)
    assert source.round_trips_ms == pytest.approx([250.0, 12.5])
    assert source.inference_ms == [1.25, 2.25]


def test_take_returns_what_was_recorded_since_the_last_call_and_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = recording.RecordingSource(Inner())
    monkeypatch.setattr(recording.time, "perf_counter", Clock(0.0, 0.001, 1.0, 1.002, 2.0, 2.003))
    source.infer("a")
    source.infer("b")
    round_trips, inference = source.take()
    assert round_trips == pytest.approx([1.0, 2.0]) and inference == [1.25, 2.25]
    assert source.take() == ([], [])
    source.infer("c")
    assert source.take()[0] == pytest.approx([3.0])
    assert round_trips == pytest.approx([1.0, 2.0])  # a taken list is not cleared afterwards


def test_in_flight_runs_after_the_reply_is_recorded_and_before_it_is_returned() -> None:
    seen: list[Any] = []
    inner = Inner()

    def in_flight() -> None:
        seen.append((len(inner.calls), list(source.inference_ms)))

    source = recording.RecordingSource(inner, in_flight)
    assert source.in_flight is in_flight
    reply = source.infer("r")
    assert seen == [(1, [1.25])] and reply.inference_ms == 1.25


def test_recording_takes_a_lock_around_each_record() -> None:
    source = recording.RecordingSource(Inner())
    assert type(source._lock) is type(threading.Lock())
    with source._lock:
        done = threading.Event()
        thread = threading.Thread(target=lambda: (source.infer("x"), done.set()), daemon=True)
        thread.start()
        assert not done.wait(0.05)  # the record waits for the lock
    assert done.wait(5)
    thread.join(5)


# -- progress --------------------------------------------------------------------------------------------


def piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=300, color_system=None), out


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=120, force_terminal=True, color_system=None), out


def test_without_a_terminal_one_line_per_finished_episode() -> None:
    console, out = piped()
    live = progress.LiveProgress(console=console)
    assert live.console is console and live.live is False and live.quiet is False
    with live:
        live.begin_strategy("synchronous", 2)
        live.tick(trace_of(3, [arm(0.1), None], [1, None]))
        live.end_episode(
            EpisodeTrace(
                seed=3, actions=[arm(), None, None, arm()], chunk_ids=[1, None, None, 2], success=True
            )
        )
        live.end_episode(EpisodeTrace(seed=4, actions=[None, arm()], chunk_ids=[None, 1]))
        live.begin_strategy("async + RTC", 1)
        live.end_episode(EpisodeTrace(seed=3, actions=[arm()], chunk_ids=[1]))
    assert out.getvalue().splitlines() == [
        "synchronous: episode 1 (seed 3) success after 4 ticks, 2 stalls",
        "synchronous: episode 2 (seed 4) failure after 2 ticks, 1 stalls",
        "async + RTC: episode 1 (seed 3) failure after 1 ticks, 0 stalls",
    ]


def test_quiet_shows_nothing_even_on_a_terminal() -> None:
    for make in (piped, terminal):
        console, out = make()
        live = progress.LiveProgress(quiet=True, console=console)
        assert live.quiet is True and live.live is False
        with live:
            live.begin_strategy("sync", 1)
            live.tick(EpisodeTrace(seed=0, actions=[None], chunk_ids=[None]))
            live.end_episode(EpisodeTrace(seed=0, actions=[None], chunk_ids=[None], success=True))
        assert out.getvalue() == ""


def test_the_default_console_is_stderr() -> None:
    live = progress.LiveProgress()
    assert live.console.stderr is True
    assert live._progress.live.console is live.console


def render(live: progress.LiveProgress) -> str:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(live._progress.get_renderable())
    return out.getvalue()


def test_on_a_terminal_a_bar_per_strategy_with_its_label_count_and_status() -> None:
    console, out = terminal()
    live = progress.LiveProgress(console=console)
    assert live.live is True
    assert not live._progress.disable
    live.begin_strategy("sync", 3)
    text = render(live)
    assert text.startswith("sync           ")  # the label padded to 14 characters, then a space
    assert "0/3 connecting" in text
    live.end_episode(EpisodeTrace(seed=0, actions=[arm(), None], chunk_ids=[1, None], success=True))
    live.tick(
        EpisodeTrace(seed=1, actions=[arm(), None, None, arm(), None], chunk_ids=[1, None, None, 1, None])
    )
    text = render(live)
    assert "1/3 episode 2: tick   5, stalls 4, successes 1" in text
    live.end_episode(EpisodeTrace(seed=1, actions=[None] * 12, chunk_ids=[None] * 12))
    text = render(live)
    assert "2/3 successes 1/2, stalls 13" in text
    assert out.getvalue() == ""  # nothing printed per episode on a terminal
    task = live._progress.tasks[0]
    assert task.total == 3 and task.completed == 2 and task.fields["label"] == "sync"


def test_the_bar_is_24_wide_and_the_elapsed_time_is_shown() -> None:
    console, _ = terminal()
    live = progress.LiveProgress(console=console)
    live.begin_strategy("a", 2)
    live.end_episode(EpisodeTrace(seed=0, actions=[], chunk_ids=[]))
    text = render(live).splitlines()[0]
    bar = text[15 : 15 + 24]
    assert bar == "━" * 12 + " " * 12  # half done; the rest is blank without colours
    assert text[15 + 24] == " " and text[15 + 24 + 1 :].startswith("1/2 ")
    assert text.rstrip().endswith("0:00:00")


def test_a_new_strategy_starts_its_counts_afresh_and_adds_a_bar() -> None:
    console, _ = terminal()
    live = progress.LiveProgress(console=console)
    live.begin_strategy("first", 1)
    live.end_episode(EpisodeTrace(seed=0, actions=[None, None], chunk_ids=[None, None], success=True))
    live.begin_strategy("second", 2)
    live.tick(EpisodeTrace(seed=0, actions=[None], chunk_ids=[None]))
    lines = render(live).splitlines()
    assert len(lines) == 2
    assert "1/1 successes 1/1, stalls 2" in lines[0]
    assert lines[1].startswith("second") and "0/2 episode 1: tick   1, stalls 1, successes 0" in lines[1]


def test_tick_and_end_before_any_strategy_do_nothing_visible() -> None:
    console, out = terminal()
    live = progress.LiveProgress(console=console)
    live.tick(EpisodeTrace(seed=0))
    live.end_episode(EpisodeTrace(seed=0))
    assert live._progress.tasks == [] and out.getvalue() == ""


def test_enter_starts_the_live_display_and_exit_stops_it() -> None:
    console, _ = terminal()
    live = progress.LiveProgress(console=console)
    with live as entered:
        assert entered is live
        assert live._progress.live.is_started
    assert not live._progress.live.is_started


# -- video -----------------------------------------------------------------------------------------------


def test_video_path_keeps_a_gif_and_makes_anything_else_a_gif_without_an_encoder() -> None:
    has_encoder = __import__("importlib").util.find_spec("imageio_ffmpeg") is not None
    assert video.mp4_available() is has_encoder
    assert video.video_path("out/a.gif") == Path("out/a.gif")
    assert video.video_path(Path("out/a.GIF")) == Path("out/a.GIF")
    assert video.video_path("out/a.webm") == Path("out/a.gif")
    assert video.video_path("out/a") == Path("out/a.gif")
    assert video.video_path("out/a.mp4") == (Path("out/a.mp4") if has_encoder else Path("out/a.gif"))
    assert video.video_path("out/a.MP4") == (Path("out/a.MP4") if has_encoder else Path("out/a.gif"))


@pytest.fixture(scope="module")
def two_snapshots() -> list[bytes]:
    env = TabletopPickPlaceEnv()
    try:
        env.reset(seed=5)
        first = env.get_snapshot().to_bytes()
        env.step(np.asarray([0.3, 0.2, -0.2, -1.8, 0.1, 1.9, 0.6, 0.04], np.float32))
        second = env.get_snapshot().to_bytes()
    finally:
        env.close()
    return [first, second]


def views_of(snapshot: bytes) -> np.ndarray:
    env = TabletopPickPlaceEnv(image_size=(192, 192))
    try:
        env.reset(seed=11)
        env.set_snapshot(snapshot)
        views = env.render_cameras()
        return np.concatenate([views["exterior"], views["wrist"]], axis=1)
    finally:
        env.close()


def test_frames_are_exterior_then_wrist_at_192_and_a_stall_has_a_6_px_red_border(
    two_snapshots: list[bytes],
) -> None:
    frames = video.render_frames(two_snapshots, [False, True])
    assert len(frames) == 2
    assert frames[0].shape == (192, 384, 3)
    np.testing.assert_array_equal(frames[0], views_of(two_snapshots[0]))
    plain = views_of(two_snapshots[1])
    stalled = frames[1]
    red = np.zeros((192, 384), bool)
    red[:6], red[-6:], red[:, :6], red[:, -6:] = True, True, True, True
    assert (stalled[red] == RED).all()
    np.testing.assert_array_equal(stalled[~red], plain[~red])
    assert not (plain[red] == RED).all()


def test_render_frames_refuses_snapshots_and_stalls_of_different_lengths(two_snapshots: list[bytes]) -> None:
    with pytest.raises(ValueError):
        video.render_frames(two_snapshots, [False])
    assert video.render_frames([], []) == []


def test_write_video_writes_a_looping_gif_at_the_demo_fps_in_a_new_folder(
    tmp_path: Path, two_snapshots: list[bytes]
) -> None:
    requested = tmp_path / "new" / "deeper" / "episode.gif"
    written = video.write_video(two_snapshots, [True, False], requested, 10.0)
    assert written == requested and written.exists()
    frames = iio.imread(written, index=None)
    assert frames.shape[:3] == (2, 192, 384)
    meta = iio.immeta(written, index=0)
    assert meta["duration"] == 100  # 1000 / fps ms per frame
    assert meta["loop"] == 0
    assert tuple(frames[0][0, 0][:3]) == pytest.approx(RED, abs=12)  # the stalled first frame


def test_write_video_without_an_encoder_writes_a_gif_beside_the_requested_mp4(
    tmp_path: Path, two_snapshots: list[bytes]
) -> None:
    if video.mp4_available():
        pytest.skip("imageio-ffmpeg is installed: the MP4 is written")
    written = video.write_video(two_snapshots[:1], [False], tmp_path / "ep.mp4", 4.0)
    assert written == tmp_path / "ep.gif" and written.exists()
    assert not (tmp_path / "ep.mp4").exists()
    assert iio.immeta(written, index=0)["duration"] == 250


# -- robot -----------------------------------------------------------------------------------------------


def test_hold_action_keeps_the_seven_joints_with_the_gripper_open() -> None:
    state = np.arange(1.0, 14.0)  # 13 values: joints, gripper, cube...
    action = robot.hold_action({"state": state})
    assert action.dtype == np.float32 and action.shape == (8,)
    np.testing.assert_array_equal(action, np.asarray([1, 2, 3, 4, 5, 6, 7, 0], np.float32))
    assert robot.hold_action({"state": [0.5] * 7})[7] == 0.0


def engine_for(name: str, policy: Any = None, *, fps: float = 200.0, sync_steps: int = 8) -> StrategyEngine:
    if policy is None:
        policy = chunk_policy(state_dim=13, action_dim=8, chunk_size=16, execution_horizon=10)
    source = LocalChunkSource(policy, execution_horizon=6)
    config = engine_config(STRATEGIES[name], fps=fps, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(source, config, STRATEGIES[name], sync_steps=sync_steps)
    engine.connect()
    return engine


def test_start_episode_waits_for_the_first_chunk_with_the_new_observation() -> None:
    engine = engine_for("rtc")
    engine.start()
    try:
        env = TabletopPickPlaceEnv()
        observation, _ = env.reset(seed=2)
        taken = robot.start_episode(engine, observation, 10.0)
        assert 0.0 < taken < 10.0
        assert engine.ready_actions() > 0
        env.close()
    finally:
        engine.stop()


class Never:
    """A chunk source that never answers within the test (the server unreachable)."""

    epoch = 0

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def connect(self) -> Any:
        return LocalChunkSource(
            chunk_policy(state_dim=13, action_dim=8, chunk_size=16, execution_horizon=10), execution_horizon=6
        ).connect()

    def infer(self, request: Any) -> ActionChunkMsg:
        self.calls += 1
        self.release.wait(10)
        raise ConnectionError("gone")

    def reset(self, episode_id: int) -> None:
        pass

    def reconnect(self) -> Any:
        return self.connect()

    def close(self) -> None:
        self.release.set()


def test_start_episode_gives_up_with_the_documented_words_after_its_timeout() -> None:
    engine, source = waiting_engine()
    try:
        env = TabletopPickPlaceEnv()
        observation, _ = env.reset(seed=0)
        with pytest.raises(TimeoutError, match=r"^no first chunk within 0 s \(is the server reachable\?\)$"):
            robot.start_episode(engine, observation, 0.3)
        env.close()
    finally:
        source.release.set()
        engine.stop()


@pytest.mark.parametrize("name", ["sync", "rtc"])
def test_a_realtime_episode_ticks_on_the_clock_and_records_every_tick(name: str) -> None:
    engine = engine_for(name)
    engine.start()
    env = TabletopPickPlaceEnv(max_episode_steps=6)
    ticked: list[int] = []
    try:
        trace = robot.run_realtime_episode(
            engine, env, 4, fps=50.0, record_snapshots=True, on_tick=lambda t: ticked.append(t.ticks)
        )
    finally:
        engine.stop()
        env.close()
    assert trace.seed == 4
    assert trace.ticks == 6 and ticked == [1, 2, 3, 4, 5, 6]
    assert len(trace.snapshots) == 6 and all(isinstance(s, bytes) for s in trace.snapshots)
    assert trace.first_chunk_s > 0.0
    # the last tick lasts its whole period too (to float rounding: the clock's sums land a hair under)
    assert trace.seconds >= 6 / 50.0 - 1e-9
    assert trace.seconds < 5.0
    assert trace.success is False
    assert trace.actions[0] is not None  # the first chunk was there before the first tick
    executed_ids = {cid for cid in trace.chunk_ids if cid is not None}
    assert executed_ids and executed_ids <= set(trace.chunks)


def test_snapshots_are_the_state_before_each_tick_and_off_by_default() -> None:
    engine = engine_for("async")
    engine.start()
    env = TabletopPickPlaceEnv(max_episode_steps=3)
    try:
        trace = robot.run_realtime_episode(engine, env, 8, fps=100.0, record_snapshots=True)
        plain = robot.run_realtime_episode(engine, env, 8, fps=100.0)
    finally:
        engine.stop()
        env.close()
    assert plain.snapshots == [] and plain.ticks == 3
    fresh = TabletopPickPlaceEnv()
    try:
        fresh.reset(seed=8)
        assert trace.snapshots[0] == fresh.get_snapshot().to_bytes()
    finally:
        fresh.close()


def test_a_synchronous_episode_of_one_action_per_chunk_steps_the_env_every_tick() -> None:
    """One action per chunk: the robot stalls while it asks again, and the env steps every tick anyway."""
    engine = engine_for("sync", fps=400.0, sync_steps=1)
    engine.start()
    env = TabletopPickPlaceEnv(max_episode_steps=5)
    try:
        trace = robot.run_realtime_episode(engine, env, 1, fps=400.0)
    finally:
        engine.stop()
        env.close()
    assert trace.ticks == 5  # every tick stepped the env, stalled or not


# -- plots -----------------------------------------------------------------------------------------------


def test_busiest_joint_is_the_arm_joint_with_the_widest_range_ignoring_stalls_and_gripper() -> None:
    trace = trace_of(
        0,
        [arm(0.0, 0.0, 0.5, gripper=9.0), None, arm(0.3, 0.0, 0.4, gripper=-9.0), arm(0.1, 0.0, 0.45)],
        [1, None, 1, 2],
    )
    assert plots.busiest_joint(trace) == 0  # joint 0 moves 0.3, joint 2 moves 0.1; the gripper is left out
    trace = trace_of(0, [arm(0, 0, 0, 0, 0, 0, -1.0), arm(0, 0, 0, 0, 0, 0, 1.0)], [1, 1])
    assert plots.busiest_joint(trace) == 6
    assert isinstance(plots.busiest_joint(trace), int)


def test_busiest_joint_of_a_trace_without_actions_is_the_first() -> None:
    assert plots.busiest_joint(EpisodeTrace(seed=0)) == 0
    assert plots.busiest_joint(trace_of(0, [None, None], [None, None])) == 0


def test_chunk_plans_start_at_the_tick_each_chunk_was_first_executed() -> None:
    trace = trace_of(0, [None, arm(), arm(), None, arm(), arm()], [None, 5, 5, None, 3, 7])
    plan5, plan3 = np.full((4, 8), 5.0, np.float32), np.full((4, 8), 3.0, np.float32)
    trace.chunks = {5: plan5, 3: plan3, 9: np.zeros((4, 8), np.float32)}  # 7 was never kept, 9 never run
    plans = plots.chunk_plans(trace)
    assert [start for start, _ in plans] == [4, 1]  # by chunk id: 3 then 5
    assert plans[0][1] is plan3 and plans[1][1] is plan5
    assert plots.chunk_plans(EpisodeTrace(seed=0)) == []


def test_held_targets_hold_through_stalls_and_start_from_the_first_action() -> None:
    a, b = arm(0.1), arm(0.2)
    held = plots._held_targets(trace_of(0, [None, a, None, None, b], [None, 1, None, None, 2]))
    np.testing.assert_array_equal(held, np.stack([a, a, a, a, b]))
    assert plots._held_targets(EpisodeTrace(seed=0)).shape == (0, 8)
    none = plots._held_targets(trace_of(0, [None, None], [None, None]))
    np.testing.assert_array_equal(none, np.zeros((2, 8), np.float32))


def test_the_step_plot_has_a_bar_per_step_between_executed_actions_red_at_boundaries() -> None:
    trace = trace_of(
        0,
        [arm(0.0), arm(0.3, 0.4), None, arm(0.3, 0.4, gripper=5.0), arm(0.0, 0.0, 1.0)],
        [1, 1, None, 2, 2],
    )
    fig, ax = plt.subplots()
    try:
        plots._plot_steps(ax, trace)
        bars = ax.patches
        assert [bar.get_x() + bar.get_width() / 2 for bar in bars] == pytest.approx([1, 3, 4])
        assert [bar.get_width() for bar in bars] == pytest.approx([0.9] * 3)
        assert [bar.get_height() for bar in bars] == pytest.approx([0.5, 0.0, math.sqrt(0.09 + 0.16 + 1.0)])
        red = matplotlib.colors.to_rgba("tab:red")
        grey = matplotlib.colors.to_rgba("lightgrey")
        assert [bar.get_facecolor() for bar in bars] == [grey, red, grey]
        assert ax.get_title() == "joint-space step |a_t - a_t-1| (rad); red = chunk boundary"
    finally:
        plt.close(fig)


def test_the_trajectory_plot_shows_plans_boundaries_stalls_and_the_held_target() -> None:
    trace = trace_of(3, [arm(0.1), arm(0.2), None, arm(0.9), None], [1, 1, None, 2, None])
    trace.chunks = {1: np.full((3, 8), 0.5, np.float32), 2: np.full((2, 8), 0.7, np.float32)}
    trace.success = True
    fig, ax = plt.subplots()
    try:
        plots._plot_trajectory(ax, trace, 0, "async + RTC")
        lines = ax.get_lines()
        # chunk 1's plan from tick 0, its boundary at -0.5, chunk 2's from tick 3 at 2.5, then executed
        plan1, boundary1, plan2, boundary2, executed = lines
        np.testing.assert_array_equal(plan1.get_xdata(), [0, 1, 2])
        np.testing.assert_allclose(plan1.get_ydata(), [0.5] * 3)
        np.testing.assert_array_equal(plan2.get_xdata(), [3, 4])
        assert list(boundary1.get_xdata()) == [-0.5, -0.5] and list(boundary2.get_xdata()) == [2.5, 2.5]
        assert boundary1.get_linestyle() == ":" and boundary1.get_color() == "grey"
        assert boundary1.get_linewidth() == pytest.approx(0.7)
        assert plan1.get_color() == "tab:blue" and plan2.get_color() == "tab:orange"
        assert plan1.get_linewidth() == pytest.approx(1.0) and plan1.get_alpha() == pytest.approx(0.7)
        np.testing.assert_array_equal(executed.get_xdata(), [0, 1, 2, 3, 4])
        np.testing.assert_allclose(executed.get_ydata(), [0.1, 0.2, 0.2, 0.9, 0.9], rtol=1e-6)
        assert executed.get_color() == "black" and executed.get_label() == "executed"
        assert executed.get_linewidth() == pytest.approx(1.8)
        spans = [p for p in ax.patches]
        assert len(spans) == 2  # ticks 2 and 4 stalled
        xs = sorted(float(v) for p in spans for v in (p.get_x(), p.get_x() + p.get_width()))
        assert xs == pytest.approx([1.5, 2.5, 3.5, 4.5])
        assert spans[0].get_facecolor()[:3] == pytest.approx(matplotlib.colors.to_rgb("red"))
        assert spans[0].get_alpha() == pytest.approx(0.15)
        assert ax.get_title() == "async + RTC: joint_0 target (rad), seed 3, success".replace(
            "joint_0", plots.ACTION_NAMES[0]
        )
        assert ax.get_xlim() == (-1.0, 5.0)
    finally:
        plt.close(fig)


def test_plan_colours_cycle_through_six_and_a_failure_is_titled_so() -> None:
    n = 7
    trace = trace_of(1, [arm(float(i)) for i in range(n)], list(range(n)))
    trace.chunks = {i: np.full((1, 8), float(i), np.float32) for i in range(n)}
    fig, ax = plt.subplots()
    try:
        plots._plot_trajectory(ax, trace, 1, "x")
        plan_lines = ax.get_lines()[0 : 2 * n : 2]
        colours = [line.get_color() for line in plan_lines]
        assert colours == [
            "tab:blue",
            "tab:orange",
            "tab:green",
            "tab:purple",
            "tab:brown",
            "tab:cyan",
            "tab:blue",
        ]
        assert ax.get_title().endswith(f"{plots.ACTION_NAMES[1]} target (rad), seed 1, failure")
        assert ax.get_title().startswith("x: ")
    finally:
        plt.close(fig)


def test_an_empty_trace_plots_with_an_xlim_of_at_least_one_tick() -> None:
    fig, ax = plt.subplots()
    try:
        plots._plot_trajectory(ax, EpisodeTrace(seed=0), 0, "x")
        assert ax.get_xlim() == (-1.0, 1.0)
    finally:
        plt.close(fig)


def test_plot_boundaries_writes_one_row_per_strategy_at_110_dpi(tmp_path: Path) -> None:
    trace = trace_of(0, [arm(0.1), arm(0.2, 0.5), arm(0.3, 0.1)], [1, 1, 2])
    trace.chunks = {1: np.full((2, 8), 0.1, np.float32), 2: np.full((2, 8), 0.3, np.float32)}
    target = tmp_path / "new" / "boundaries.png"
    written = plots.plot_boundaries({"sync": trace, "rtc": trace}, {"rtc": "async + RTC"}, str(target))
    assert written == target and isinstance(written, Path)
    image = iio.imread(written)
    assert image.shape[:2] == (round(2 * 2.8 * 110), 13 * 110)  # 13 x 2.8 in per row at 110 dpi
    assert plt.get_fignums() == []  # the figure is closed
    one = plots.plot_boundaries({"sync": trace}, {}, tmp_path / "one.png", title="T")
    assert iio.imread(one).shape[:2] == (round(2.8 * 110), 13 * 110)


def capture_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Keep the figure `plot_boundaries` draws (closing it still happens, the file is still written)."""
    figures: list[Any] = []
    original = matplotlib.figure.Figure.savefig

    def savefig(fig: Any, *args: Any, **kwargs: Any) -> Any:
        figures.append((fig, kwargs))
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return figures


def test_plot_boundaries_titles_rows_labels_axes_and_plots_the_first_strategys_busiest_joint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = capture_figures(monkeypatch)
    first = trace_of(0, [arm(0.0, 0.0, 0.0), arm(0.0, 0.0, 0.6)], [1, 1])  # joint 2 is busiest
    second = trace_of(1, [arm(0.9), arm(0.0)], [1, 1])  # joint 0 here: not used
    plots.plot_boundaries({"a": first, "b": second}, {"b": "B"}, tmp_path / "p.png", title="the title")
    ((fig, kwargs),) = figures
    assert kwargs == {"dpi": 110}
    assert fig._suptitle.get_text() == "the title"
    axes = fig.axes
    assert len(axes) == 4
    assert axes[0].get_title().startswith(f"a: {plots.ACTION_NAMES[2]} target")
    assert axes[2].get_title().startswith(f"B: {plots.ACTION_NAMES[2]} target")
    assert axes[1].get_title().startswith("joint-space step")
    assert [ax.get_xlabel() for ax in axes] == ["", "", "control tick", "control tick"]
    left, right = axes[0].get_position().width, axes[1].get_position().width
    assert left / right == pytest.approx(1.5, rel=0.15)  # width ratios 3 : 2
    assert tuple(fig.get_size_inches()) == pytest.approx((13, 5.6))


def test_plot_boundaries_without_a_title_has_no_suptitle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = capture_figures(monkeypatch)
    plots.plot_boundaries({"a": trace_of(0, [arm()], [1])}, {}, tmp_path / "p.png")
    ((fig, _),) = figures
    assert fig._suptitle is None


# -- after the first mutation run ----------------------------------------------------------------------


def test_plot_boundaries_creates_every_missing_folder_of_its_path(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c" / "boundaries.png"
    written = plots.plot_boundaries({"sync": trace_of(0, [arm()], [1])}, {}, target)
    assert written == target and target.is_file()


def test_a_fresh_progress_counts_from_zero_even_before_any_strategy() -> None:
    console, out = piped()
    live = progress.LiveProgress(console=console)
    live.end_episode(EpisodeTrace(seed=2, actions=[None], chunk_ids=[None]))
    assert out.getvalue() == ": episode 1 (seed 2) failure after 1 ticks, 1 stalls\n"
    assert (live._episode, live._successes, live._stalls) == (1, 0, 1)


def test_with_imageio_ffmpeg_installed_an_mp4_stays_an_mp4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mp4_available` only asks whether the package can be found: an empty package on the path
    stands for it (imageio-ffmpeg, 190 MB, stays out of the test venv: pyproject.toml)."""
    (tmp_path / "imageio_ffmpeg").mkdir()
    (tmp_path / "imageio_ffmpeg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert video.mp4_available() is True
    assert video.video_path("out/a.mp4") == Path("out/a.mp4")
    assert video.video_path("out/a.MP4") == Path("out/a.MP4")
    assert video.video_path("out/a.gif") == Path("out/a.gif")
    assert video.video_path("out/a.webm") == Path("out/a.gif")
    assert video.video_path("out/a") == Path("out/a.gif")


def test_the_gif_frame_delay_is_1000_over_fps_ms_in_whole_centiseconds(
    tmp_path: Path, two_snapshots: list[bytes]
) -> None:
    # 1000 / fps = 109.9 ms: a GIF stores whole centiseconds (truncated), so 100 ms per frame
    written = video.write_video(two_snapshots, [False, True], tmp_path / "v.gif", 1000.0 / 109.9)
    assert iio.immeta(written, index=0)["duration"] == 100


def test_stall_bands_have_no_edge_and_both_titles_are_small() -> None:
    trace = trace_of(0, [arm(0.1), None, arm(0.2)], [1, None, 1])
    trace.chunks = {1: np.zeros((3, 8), np.float32)}
    fig, (left, right) = plt.subplots(1, 2)
    try:
        plots._plot_trajectory(left, trace, 0, "x")
        plots._plot_steps(right, trace)
        (band,) = left.patches
        assert band.get_linewidth() == 0
        assert left.title.get_fontsize() == 9 and right.title.get_fontsize() == 9
    finally:
        plt.close(fig)


def test_the_step_plot_refuses_a_trace_whose_ids_do_not_match_its_actions() -> None:
    trace = EpisodeTrace(seed=0, actions=[arm(), arm()], chunk_ids=[1])
    fig, ax = plt.subplots()
    try:
        with pytest.raises(ValueError):
            plots._plot_steps(ax, trace)
    finally:
        plt.close(fig)


class FakeTime:
    """The robot module's clock: `perf_counter` reads it, `sleep` advances it (and yields briefly
    for real, so the engine's thread can answer)."""

    def __init__(self, real_pause: float) -> None:
        import time as real

        self.now = 1000.0
        self.sleeps: list[float] = []
        self._real = real
        self._pause = real_pause

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self._pause:
            self._real.sleep(self._pause)


@pytest.mark.parametrize("fps", [10.0, 4.0])
def test_on_the_clock_each_tick_waits_for_its_period_and_the_episode_lasts_ticks_over_fps(
    fps: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeTime(real_pause=0.002)
    monkeypatch.setattr(robot, "time", clock)
    engine = engine_for("rtc")
    engine.start()
    env = TabletopPickPlaceEnv(max_episode_steps=4)
    try:
        trace = robot.run_realtime_episode(engine, env, 0, fps=fps)
    finally:
        engine.stop()
        env.close()
    waiting = [s for s in clock.sleeps if s == 0.002]
    ticking = clock.sleeps[len(waiting) :]
    assert clock.sleeps[: len(waiting)] == waiting  # the first-chunk wait polls every 2 ms
    assert trace.first_chunk_s == pytest.approx(0.002 * len(waiting))
    assert ticking == pytest.approx([1.0 / fps] * 3)  # ticks 1..3 start on the clock; the 4th ends it
    assert trace.seconds == pytest.approx(4.0 / fps)  # the last tick lasts its whole period too


def test_without_a_timeout_the_first_chunk_is_awaited_60_s(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(real_pause=0.0)
    monkeypatch.setattr(robot, "time", clock)
    engine, source = waiting_engine()
    env = TabletopPickPlaceEnv(max_episode_steps=4)
    try:
        with pytest.raises(TimeoutError, match=r"^no first chunk within 60 s \(is the server reachable\?\)$"):
            robot.run_realtime_episode(engine, env, 0, fps=10.0)
    finally:
        source.release.set()
        engine.stop()
        env.close()
    assert 60.0 < clock.now - 1000.0 <= 60.0 + 0.003


def test_an_episode_that_succeeds_ends_on_that_tick_as_a_success() -> None:
    from rollserve.sim.task import TaskConfig

    engine = engine_for("async")
    engine.start()
    # a 10 m success radius: the cube at rest counts as put down on the target from the first step
    env = TabletopPickPlaceEnv(task=TaskConfig(success_radius=10.0), max_episode_steps=50)
    try:
        trace = robot.run_realtime_episode(engine, env, 3, fps=100.0)
    finally:
        engine.stop()
        env.close()
    assert trace.success is True and trace.ticks == 1


def test_every_request_during_the_episode_carries_the_newest_observation() -> None:
    policy = chunk_policy(state_dim=13, action_dim=8, chunk_size=16, execution_horizon=10, record_calls=True)
    engine = engine_for("sync", policy, fps=50.0, sync_steps=2)
    engine.start()
    env = TabletopPickPlaceEnv(max_episode_steps=8)
    try:
        trace = robot.run_realtime_episode(engine, env, 6, fps=50.0)
    finally:
        engine.stop()
        env.close()
    states = [np.asarray(call["state"]).reshape(-1) for call in policy.calls]
    assert len(states) >= 2  # the synchronous robot asked again after its 2 actions
    assert not np.array_equal(states[0], states[-1])  # a later request saw the arm moved
    assert trace.executed > 2


def waiting_engine() -> tuple[StrategyEngine, Never]:
    """An async engine at 10 Hz whose source never answers (until ``source.release`` is set)."""
    source = Never()
    config = engine_config(STRATEGIES["async"], fps=10.0, refill_margin=4, execution_horizon=6)
    engine = StrategyEngine(source, config, STRATEGIES["async"])
    engine.connect()
    engine.start()
    return engine, source


def test_while_waiting_the_observation_is_posted_again_every_quarter_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeTime(real_pause=0.0)
    monkeypatch.setattr(robot, "time", clock)
    engine, source = waiting_engine()
    observation = {"state": np.zeros(13, np.float32)}
    before = engine._obs_version
    try:
        with pytest.raises(TimeoutError):
            robot.start_episode(engine, observation, 0.9)
    finally:
        source.release.set()
        engine.stop()
    # posted before and after the reset, then again after 0.25, 0.5 and 0.75 s of waiting
    assert engine._obs_version - before == 5
    assert engine._observation is observation


def test_the_observation_is_posted_after_the_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(real_pause=0.0)
    monkeypatch.setattr(robot, "time", clock)
    engine, source = waiting_engine()
    observation = {"state": np.ones(13, np.float32)}
    try:
        with pytest.raises(TimeoutError):
            robot.start_episode(engine, observation, 0.2)  # gives up before any repost
    finally:
        source.release.set()
        engine.stop()
    assert engine._observation is observation
