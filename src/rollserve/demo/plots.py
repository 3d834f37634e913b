"""The PNG the demo writes: what happens to the actions at chunk boundaries, one row per strategy.

Left: one joint's executed target over the episode (black), every chunk's own plan from the tick
it took over (thin colour), boundaries (dotted) and stalls (red band). Seamless chunks lie on top
of each other; naive asynchronous chunks jump. Right: the joint-space step at every tick, boundary
steps in red.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rollserve.demo.metrics import JOINTS, EpisodeTrace
from rollserve.sim.layout import ACTION_NAMES


def busiest_joint(trace: EpisodeTrace) -> int:
    """The joint whose target moves the most over the episode: the most telling one to plot."""
    executed = [a for a in trace.actions if a is not None]
    if not executed:
        return 0
    actions = np.stack(executed)[:, JOINTS]
    return int(np.argmax(actions.max(axis=0) - actions.min(axis=0)))


def chunk_plans(trace: EpisodeTrace) -> list[tuple[int, np.ndarray]]:
    """``(first tick, planned actions)`` of every chunk that was executed at least once."""
    first_tick: dict[int, int] = {}
    for tick, chunk_id in enumerate(trace.chunk_ids):
        if chunk_id is not None and chunk_id not in first_tick:
            first_tick[chunk_id] = tick
    return [(first_tick[cid], trace.chunks[cid]) for cid in sorted(first_tick) if cid in trace.chunks]


def plot_boundaries(
    traces: Mapping[str, EpisodeTrace], labels: Mapping[str, str], path: str | Path, *, title: str = ""
) -> Path:
    """Write the figure for one episode per strategy; returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(traces)
    joint = busiest_joint(traces[names[0]]) if names else 0
    fig, axes = plt.subplots(
        len(names), 2, figsize=(13, 2.8 * max(len(names), 1)), squeeze=False, width_ratios=(3, 2)
    )
    for row, name in enumerate(names):
        _plot_trajectory(axes[row][0], traces[name], joint, labels.get(name, name))
        _plot_steps(axes[row][1], traces[name])
    axes[-1][0].set_xlabel("control tick")
    axes[-1][1].set_xlabel("control tick")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_trajectory(ax, trace: EpisodeTrace, joint: int, label: str) -> None:  # type: ignore[no-untyped-def]
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:cyan")
    for index, (start, plan) in enumerate(chunk_plans(trace)):
        ticks = np.arange(start, start + len(plan))
        ax.plot(ticks, plan[:, joint], lw=1, alpha=0.7, color=colors[index % len(colors)])
        ax.axvline(start - 0.5, ls=":", lw=0.7, color="grey")
    for tick, action in enumerate(trace.actions):
        if action is None:
            ax.axvspan(tick - 0.5, tick + 0.5, color="red", alpha=0.15, lw=0)
    held = _held_targets(trace)
    ax.plot(np.arange(len(held)), held[:, joint], color="black", lw=1.8, label="executed")
    outcome = "success" if trace.success else "failure"
    ax.set_title(f"{label}: {ACTION_NAMES[joint]} target (rad), seed {trace.seed}, {outcome}", fontsize=9)
    ax.set_xlim(-1, max(len(held), 1))


def _plot_steps(ax, trace: EpisodeTrace) -> None:  # type: ignore[no-untyped-def]
    ticks, sizes, at_boundary = [], [], []
    previous, previous_id = None, None
    for tick, (action, chunk_id) in enumerate(zip(trace.actions, trace.chunk_ids, strict=True)):
        if action is None:
            continue
        if previous is not None:
            ticks.append(tick)
            sizes.append(float(np.linalg.norm(action[JOINTS] - previous[JOINTS])))
            at_boundary.append(chunk_id != previous_id)
        previous, previous_id = action, chunk_id
    colors = ["tab:red" if b else "lightgrey" for b in at_boundary]
    ax.bar(ticks, sizes, color=colors, width=0.9)
    ax.set_title("joint-space step |a_t - a_t-1| (rad); red = chunk boundary", fontsize=9)


def _held_targets(trace: EpisodeTrace) -> np.ndarray:
    """The target the arm actually had on each tick (a stall holds the previous one)."""
    first = next((a for a in trace.actions if a is not None), np.zeros(8, np.float32))
    rows, current = [], first
    for action in trace.actions:
        if action is not None:
            current = action
        rows.append(current)
    return np.stack(rows) if rows else np.zeros((0, 8), np.float32)
