"""The measurement engine: everything about timing one row, and nothing about rows.

Given a row's call (and, unless the row is the baseline itself, the cell's 16-bit baseline
call), the engine warms up, times the two in alternation, decides when to stop, times the
row's stages, and returns an immutable :class:`RowMeasurement`. The harness only copies that
into a result row.

Pairing. On a shared machine whose speed swings by 2x for a second at a time (seen on this
project's CI VMs), two times taken seconds apart see different machines. So every row is timed
in alternation with its baseline, one call of each per pair, the order flipped every pair, and
its speedup is the median of the pairs' ratios: both calls of a pair see the same machine.

Stopping. A stopping rule is a small object that looks at the samples so far
(:class:`SamplingState`) and says whether they are enough (nvbench's stopping criteria): a
sample cap, a time budget, a spread target, a confidence-interval target. The engine stops as
soon as any rule is met; the rules are tested on synthetic samples, and the engine itself takes
an injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from kernelbench.statistics import median_interval, rel_halfwidth, stats
from kernelbench.timing import CallTimer, Clock, call_timer

Call = Callable[[], object]


@dataclass(frozen=True)
class SamplingState:
    """What a stopping rule sees: the samples so far (ratios when paired, else times in ms)
    and the seconds the timed calls took."""

    samples: tuple[float, ...]
    elapsed_s: float


class SampleCap:
    """Stop at ``n`` samples."""

    def __init__(self, n: int) -> None:
        self.n = n

    def reached(self, state: SamplingState) -> bool:
        return len(state.samples) >= self.n


class Budget:
    """Stop once the timed calls took ``seconds`` (after at least one sample)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def reached(self, state: SamplingState) -> bool:
        return len(state.samples) >= 1 and state.elapsed_s >= self.seconds


class SpreadTarget:
    """Stop once IQR / median of the samples is at most ``rel`` (over ``min_samples`` or more)."""

    def __init__(self, rel: float, min_samples: int = 5) -> None:
        self.rel, self.min_samples = rel, min_samples

    def reached(self, state: SamplingState) -> bool:
        n = len(state.samples)
        return n >= self.min_samples and stats(state.samples).rel_spread <= self.rel


class IntervalTarget:
    """Stop once the 95% interval of the median is within ``rel`` of it (half-width), judged
    every ``every`` samples from ``min_samples`` on (a bootstrap per sample would cost more
    than a fast call)."""

    def __init__(self, rel: float, min_samples: int = 5, every: int = 5) -> None:
        self.rel, self.min_samples, self.every = rel, min_samples, every

    def reached(self, state: SamplingState) -> bool:
        n = len(state.samples)
        if n < self.min_samples or (n - self.min_samples) % self.every:
            return False
        interval = median_interval(state.samples)
        if interval is None:
            return False
        return rel_halfwidth(stats(state.samples).median_ms, *interval) <= self.rel


class StoppingRules:
    """Any of ``rules`` met ends the sampling; ``floor`` samples are always taken first."""

    def __init__(self, rules: Sequence[object], floor: int = 1) -> None:
        self.rules, self.floor = tuple(rules), floor

    def done(self, state: SamplingState) -> bool:
        if len(state.samples) < self.floor:
            return False
        return any(rule.reached(state) for rule in self.rules)


@dataclass(frozen=True)
class TimerSettings:
    """The stopping rules of one row's sampling, as data (a run's settings are recorded)."""

    budget_s: float = 1.0  # wall time of the timed calls of one row in one round
    warmup_s: float = 0.2  # warm-up calls until this much time has passed
    min_samples: int = 3  # the spread and interval targets need this many samples first
    max_samples: int = 200
    target_rel_spread: float = 0.02  # IQR / median of the samples
    target_ci: float = 0.02  # half-width of the 95% interval of the median, relative

    def rules(self) -> StoppingRules:
        return StoppingRules(
            [
                SampleCap(self.max_samples),
                Budget(self.budget_s),
                SpreadTarget(self.target_rel_spread, max(self.min_samples, 5)),
                IntervalTarget(self.target_ci, max(self.min_samples, 5)),
            ]
        )


@dataclass(frozen=True)
class RowMeasurement:
    """One row's timing in one round. ``baseline_ms[i]`` was taken beside ``row_ms[i]``
    (empty when the row is unpaired: the baseline itself)."""

    row_ms: tuple[float, ...]
    baseline_ms: tuple[float, ...] = ()
    first_call_s: float = 0.0
    stages_ms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    throttled: int = 0

    @property
    def paired(self) -> bool:
        return bool(self.baseline_ms)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(b / r for b, r in zip(self.baseline_ms, self.row_ms, strict=True) if r > 0)


class MeasurementEngine:
    """Times rows on one device with one set of stopping rules (and a cheaper set for stages)."""

    def __init__(
        self,
        device: torch.device | str,
        settings: TimerSettings,
        stage_settings: TimerSettings,
        clock: Clock = time.perf_counter,
        timer: CallTimer | None = None,
    ) -> None:
        self.settings, self.stage_settings = settings, stage_settings
        self.clock = clock
        self.timer = timer or call_timer(device, clock)

    def first_call(self, call: Call) -> tuple[object, float]:
        """The row's first call (its output is checked for accuracy): result and seconds. It
        counts as warm-up, so a 40-second call is not run twice before its first sample."""
        return self.timer.seconds(call)

    def _warm_up(self, call: Call, warmed_s: float, warmup_s: float) -> None:
        start = self.clock() - warmed_s
        while self.clock() - start < warmup_s:
            call()
            self.timer.sync()

    def measure(
        self,
        call: Call,
        first_call_s: float,
        baseline: Call | None = None,
        stages: Mapping[str, Call] | None = None,
        known_stages_ms: Mapping[str, float] | None = None,
    ) -> RowMeasurement:
        """Warm up, then sample ``call`` (alternating with ``baseline`` when given) until the
        stopping rules are met; then time each stage not in ``known_stages_ms``."""
        self._warm_up(call, first_call_s, self.settings.warmup_s)
        rules = self.settings.rules()
        rows: list[float] = []
        bases: list[float] = []
        samples: list[float] = []
        elapsed = 0.0
        while not rules.done(SamplingState(tuple(samples), elapsed)):
            if baseline is None:
                r = self.timer(call)
                samples.append(r)
            else:
                if len(rows) % 2:
                    r, b = self.timer(call), self.timer(baseline)
                else:
                    b, r = self.timer(baseline), self.timer(call)
                bases.append(b)
                samples.append(b / r if r > 0 else 0.0)
                elapsed += b / 1e3
            rows.append(r)
            elapsed += r / 1e3
        stage_ms = dict(known_stages_ms or {})
        for name, fn in (stages or {}).items():
            if name not in stage_ms:
                stage_ms[name] = self.time_alone(fn, self.stage_settings)
        return RowMeasurement(
            tuple(rows),
            tuple(bases),
            first_call_s,
            MappingProxyType(stage_ms),
            self.timer.throttled,
        )

    def time_alone(self, call: Call, settings: TimerSettings) -> float:
        """Median ms of ``call`` timed on its own (stages: never printed as a ratio)."""
        call()
        self.timer.sync()
        self._warm_up(call, 0.0, settings.warmup_s)
        rules = settings.rules()
        samples: list[float] = []
        while not rules.done(SamplingState(tuple(samples), sum(samples) / 1e3)):
            samples.append(self.timer(call))
        return stats(samples).median_ms
