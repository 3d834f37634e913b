"""Live progress on stderr while the robot runs: one bar per strategy, updated every control tick.

Quiet (``--quiet``) shows nothing; when stderr is not a terminal, one line per finished episode.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from rollserve.demo.metrics import EpisodeTrace


class LiveProgress:
    def __init__(self, *, quiet: bool = False, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.quiet = quiet
        self.live = not quiet and self.console.is_terminal
        self._progress = Progress(
            TextColumn("{task.fields[label]:<14}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.live,
        )
        self._task: TaskID | None = None
        self._label = ""
        self._episode = 0
        self._successes = 0
        self._stalls = 0

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def begin_strategy(self, label: str, episodes: int) -> None:
        self._label, self._episode, self._successes, self._stalls = label, 0, 0, 0
        self._task = self._progress.add_task("", total=episodes, label=label, status="connecting")

    def tick(self, trace: EpisodeTrace) -> None:
        if self._task is not None and self.live:
            status = (
                f"episode {self._episode + 1}: tick {trace.ticks:3d}, stalls {self._stalls + trace.stalls}, "
                f"successes {self._successes}"
            )
            self._progress.update(self._task, status=status)

    def end_episode(self, trace: EpisodeTrace) -> None:
        self._episode += 1
        self._successes += trace.success
        self._stalls += trace.stalls
        status = f"successes {self._successes}/{self._episode}, stalls {self._stalls}"
        if self._task is not None:
            self._progress.update(self._task, advance=1, status=status)
        if not self.live and not self.quiet:
            outcome = "success" if trace.success else "failure"
            self.console.print(
                f"{self._label}: episode {self._episode} (seed {trace.seed}) {outcome} after "
                f"{trace.ticks} ticks, {trace.stalls} stalls"
            )
