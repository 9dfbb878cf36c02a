"""Progress of a sweep on the terminal: the row being timed, and an ETA from estimated cost.

Counting rows gives a useless ETA: most rows of a sweep are skipped in no time while one
measured row takes seconds. Each row here has an estimated cost in seconds (:class:`CostModel`:
0 for a row that cannot run here); the bar advances by the cost of each finished row, and the
ETA is the remaining cost scaled by how long the finished cost really took (which covers what
the model leaves out: building runners, the accuracy checks).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

from kernelbench.run.plan import CallEstimator


class CostModel:
    """Estimated seconds of each (backend, method) row on a cell of ``flops`` operations at
    ``tokens`` tokens, following the engine: a row samples until its budget is spent, and at
    least once (so ``max(budget, call)``, the budget counting its share of the baseline calls);
    in the first round its first call (checked for accuracy, counted as warm-up) and its stages
    (each timed alone, at least once) add about one call more. A call's length comes from the
    same row at the same token count earlier in this run (throughput at one token is far below
    that at 2048), else it is unknown and the row costs its budget. A row whose call exceeds
    ``max_call_s(pair)`` is skipped by the harness, so it costs nothing."""

    def __init__(
        self, budget_s: float, max_call_s: Callable[[tuple[str, str]], float] | None = None
    ) -> None:
        self.row_s = budget_s
        self.max_call_s = max_call_s
        self.calls = CallEstimator()  # the harness's per-token-count throughput table

    def record(
        self,
        pair: tuple[str, str],
        flops: float,
        tokens: int,
        d_model: int,
        median_ms: float | None,
    ) -> None:
        if median_ms:
            self.calls.record(pair, flops, median_ms / 1e3, d_model, tokens)

    def cost(
        self, pair: tuple[str, str], flops: float, tokens: int, runs_here: bool, first_round: bool
    ) -> float:
        if not runs_here:
            return 0.0
        est = self.calls.estimate(pair, flops, tokens)
        call = est[0] if est is not None else 0.0
        if self.max_call_s is not None and call > self.max_call_s(pair):
            return 0.0
        return max(self.row_s, call) + (call if first_round else 0.0)


class _EtaColumn(ProgressColumn):
    """Remaining estimated cost, scaled by the seconds the finished cost took, as estimated
    when the bar last moved and counting down since: rows come back a cell at a time, and a
    rate taken while a long cell runs (time passing, nothing finished) made the ETA grow."""

    def __init__(self, started: float, clock: Callable[[], float]) -> None:
        super().__init__()
        self.started, self.clock = started, clock
        self._seen: tuple[float, float | None] | None = None  # (completed, total) estimated
        self._eta_s, self._eta_at = 0.0, 0.0

    def render(self, task: Task) -> Text:
        done, total = task.completed, task.total or 0.0
        now = self.clock()
        if done <= 0 or now <= self.started:
            return Text("ETA -:--", style="progress.remaining")
        if self._seen != (done, task.total):
            self._seen = (done, task.total)
            self._eta_s = max(0.0, total - done) * (now - self.started) / done
            self._eta_at = now
        left = max(0.0, self._eta_s - (now - self._eta_at))
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
