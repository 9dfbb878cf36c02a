"""Progress of a sweep on the terminal: the row being timed, and an ETA from estimated cost.

Counting rows gives a useless ETA: most rows of a sweep are skipped in no time while one
measured row takes seconds. Each row here has an estimated cost in seconds (0 for a row that
cannot run here; a row's time budget, plus its calls when their length is known from an
earlier row of the same backend and method); the bar advances by the cost of each finished row,
and the ETA is the remaining cost scaled by how long the finished cost really took.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

#: Calls a measured row makes besides its timed budget (warm-up, accuracy check, stages).
EXTRA_CALLS = 4


class CostModel:
    """Estimated seconds of each (backend, method) row on a cell of ``flops`` operations."""

    def __init__(self, budget_s: float, paired: bool) -> None:
        self.row_s = budget_s
        self.paired = paired
        self.rate: dict[tuple[str, str], float] = {}  # flops per second seen in this run

    def record(self, pair: tuple[str, str], flops: float, median_ms: float | None) -> None:
        if median_ms:
            self.rate[pair] = flops / (median_ms / 1e3)

    def cost(self, pair: tuple[str, str], flops: float, runs_here: bool) -> float:
        if not runs_here:
            return 0.0
        call = flops / self.rate[pair] if pair in self.rate else 0.0
        return self.row_s + EXTRA_CALLS * call * (2 if self.paired else 1)


class _EtaColumn(ProgressColumn):
    """Remaining estimated cost, scaled by the seconds the finished cost took."""

    def __init__(self, started: float, clock: Callable[[], float]) -> None:
        super().__init__()
        self.started, self.clock = started, clock

    def render(self, task: Task) -> Text:
        done, total = task.completed, task.total or 0.0
        elapsed = self.clock() - self.started
        if done <= 0 or elapsed <= 0:
            return Text("ETA -:--", style="progress.remaining")
        left = max(0.0, total - done) * elapsed / done
        minutes, seconds = divmod(int(left + 0.5), 60)
        hours, minutes = divmod(minutes, 60)
        text = f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
        return Text(f"ETA {text}", style="progress.remaining")


def sweep_progress(console, clock: Callable[[], float] = time.monotonic) -> Progress:
    """A rich progress display for :class:`CostModel` units: the bar, rows done, the ETA."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[rows]} rows"),
        _EtaColumn(clock(), clock),
        console=console,
    )
