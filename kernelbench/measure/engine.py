"""The measurement engine: everything about timing the rows of one cell, and nothing about rows.

Given the calls of a cell's rows and the cell's 16-bit baseline call, the engine warms up,
times them in cycles, decides per row when to stop, times stages, and returns immutable
:class:`RowMeasurement` s. The harness only copies them into result rows.

Cycles and pairing. On a shared machine whose speed swings by 2x for a second at a time (seen on
this project's CI VMs), two times taken seconds apart see different machines. So the rows of a
cell are timed in cycles: a baseline call, then one call of each row still sampling (in a fresh
shuffled order each cycle), then the next baseline call, which opens the next cycle. A row's
sample is paired with the baseline interpolated (linearly, at the middle of the row's call)
between the two baseline calls around it: the ratio sees the machine the row saw. One baseline
call serves every row of a cycle, so pairing costs one baseline call per cycle, not per row.

Stopping. A stopping rule is a small object that looks at one row's samples so far
(:class:`SamplingState`) and says whether they are enough (nvbench's stopping criteria): a
sample cap, a time budget, a spread target, a confidence-interval target. A row leaves the
cycles as soon as any of its rules is met; the cycles end when every row has left. The rules
are tested on synthetic samples, and the engine itself takes an injected clock.

Memory. CPU calls are timed with freed memory reused (:func:`freed_memory_reused`), and every
row (and the baseline) makes at least one untimed call after the block is entered: the first
call in a fresh block faults in its output and temporaries (at d=5140, 2048 tokens: 36k-180k
minor faults and +17-45% on that call). Always, even where the heap still holds the row's pages
from an earlier block: without that call the first timed sample still ran slow now and then,
with no fault (a default gpt3 sweep on a 2-core Zen 4 VM whose first round skipped it: 16 of
104 rows at 2048 tokens had a first sample over 1.3x their others, against 1-3 of about 100
with the call).
Later calls, in a shuffled order with the output checks between them, still outgrow the heap
now and then, so after the warm-up the heap gets a cushion of resident free memory, twice what
the warm-up calls faulted in (:func:`~kernelbench.measure.timing.cushion_heap`), the first calls
made since the last block counted in: where a row's first call had just faulted its temporaries
in, its warm-up faulted nothing and a block sized by the warm-up alone got no cushion (at 175B,
torchao's 2.4 GB temporary then faulted 589,824 pages on a timed sample, 2.0x its others); and
the heap keeps its pages between blocks.
In a D.1 run, samples with more than 500 minor faults (up to 5.7x their row's median time):
142 of 2399 before both, 24 of 2868 after.

What each sample saw: its page faults and context switches (:class:`~kernelbench.measure.timing.
CallUsage`), kept per sample beside its time, and the share of CPU time stolen by the
hypervisor while the cell was cycled.
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch

from kernelbench.measure.timing import (
    USAGE_FIELDS,
    CallTimer,
    CallUsage,
    Clock,
    call_timer,
    cushion_heap,
    freed_memory_reused,
    steal_share,
    steal_ticks,
)
from kernelbench.settings import default
from kernelbench.statistics import median_interval, rel_halfwidth, stats

Call = Callable[[], object]
#: Evicts one call's own memory from the caches (cold caches), outside the timed region.
Eviction = Callable[[], None]
#: What the timer read before a call: the bus's GB/s, the threads' link in ns and the cores'
#: probe in ns (each or None), and the seconds it waited for fast cores first.
Reading = tuple[float | None, float | None, float | None, float]

#: Samples of one stage timed alone. Uncapped, a decode cell's stages took up to 200 samples
#: each (their spread rarely met its target at sub-millisecond calls): 7.3 s of a 24.5 s run of
#: 4 cells (d = 2048 and 4096 at one and eight tokens, one round), 2.7 s of 19.5 s capped.
STAGE_MAX_SAMPLES = 20

#: The heap cushion of a CPU block, in multiples of the memory its warm-up calls faulted in.
CUSHION_FACTOR = 2
PAGE_BYTES = resource.getpagesize()


#: A timed call that faulted in at least this many pages (1 MiB of 4 KiB pages) had to take
#: memory from the system while timed: in a D.1 run and a default sweep on a 2-core Zen 4 such
#: samples read a median 1.21x and 1.15x their round's median (68% and 62% of them above 1.1x;
#: the other samples 4% and 15%).
FAULTED_PAGES = 256


@dataclass(frozen=True)
class SamplingState:
    """What a stopping rule sees: the samples so far (ratios when paired, else times in ms),
    the seconds the timed calls took, and how many of the samples were faulted (their call
    faulted in :data:`FAULTED_PAGES` or more)."""

    samples: tuple[float, ...]
    elapsed_s: float
    faulted: int = 0


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
    """Stop once the 95% interval of the median is within ``rel`` of it (half-width), judged at
    ``min_samples`` samples and then each time the count has doubled: a bootstrap costs about
    10 ms at 200 samples, and judging every few samples made it most of a sub-millisecond
    row's time (40 bootstraps per row and round)."""

    def __init__(self, rel: float, min_samples: int = 5) -> None:
        self.rel, self.min_samples = rel, min_samples

    def judged_at(self, n: int) -> bool:
        """Whether the interval is judged at ``n`` samples: ``min_samples`` x 2^j."""
        if n < self.min_samples or n % self.min_samples:
            return False
        ratio = n // self.min_samples
        return ratio & (ratio - 1) == 0

    def reached(self, state: SamplingState) -> bool:
        if not self.judged_at(len(state.samples)):
            return False
        interval = median_interval(state.samples)
        if interval is None:
            return False
        return rel_halfwidth(stats(state.samples).median_ms, *interval) <= self.rel


class StoppingRules:
    """Any of ``rules`` met ends the sampling; ``floor`` samples are always taken first, and
    ``floor`` that were not faulted, until twice ``floor`` (at most ``most``) have been taken:
    with one or two faulted among a row's 3 pairs, its round's median could be a faulted
    sample (torch ``llm_int8`` at d=1536, 2048 tokens: 74, 349 and 136 ms, the last two
    faulted, against 70-79 ms in its five other rounds)."""

    def __init__(self, rules: Sequence[object], floor: int = 1, most: int | None = None) -> None:
        self.rules, self.floor = tuple(rules), floor
        self.most = 2 * floor if most is None else min(2 * floor, most)

    def done(self, state: SamplingState) -> bool:
        n = len(state.samples)
        if n < self.floor or (n - state.faulted < self.floor and n < self.most):
            return False
        return any(rule.reached(state) for rule in self.rules)


@dataclass(frozen=True)
class TimerSettings:
    """The stopping rules of one row's sampling, as data (a run's settings are recorded)."""

    budget_s: float = default("budget_s")  # wall time of one row's timed calls in one round
    warmup_s: float = default("warmup_s")  # warm-up calls until this much time has passed
    min_samples: int = 3  # the spread and interval targets need this many samples first
    max_samples: int = 200
    target_rel_spread: float = 0.02  # IQR / median of the samples
    ci_target: float = default("ci_target")  # 95% interval half-width of the median, relative
    #: samples (pairs) every row takes per round before any rule may stop it, however long its
    #: call: at large sizes the budget alone stopped rows after 1-3 pairs, too few for an
    #: interval within the target after the rounds are pooled
    min_pairs: int = default("min_pairs")
    #: cold CPU calls: seconds to wait at most, before each, for the cores to run at their
    #: usual speed (:class:`~kernelbench.measure.timing.CoreGate`; 0: never wait)
    core_wait_s: float = default("core_wait_s")

    @classmethod
    def for_stages(cls, budget_s: float | None = None) -> TimerSettings:
        """Each stage timed alone, once warm (its row's first call was the warm-up), at most
        ``STAGE_MAX_SAMPLES`` times: a breakdown, never a ratio, and with cold caches each
        sample of a sub-millisecond stage costs a cache eviction several times its length."""
        budget = default("stage_budget_s") if budget_s is None else budget_s
        return cls(
            budget_s=budget,
            warmup_s=0.0,
            min_samples=1,
            min_pairs=1,
            max_samples=STAGE_MAX_SAMPLES,
        )

    def rules(self) -> StoppingRules:
        return StoppingRules(
            [
                SampleCap(self.max_samples),
                Budget(self.budget_s),
                SpreadTarget(self.target_rel_spread, max(self.min_samples, 5)),
                IntervalTarget(self.ci_target, max(self.min_samples, 5)),
            ],
            floor=max(1, min(self.min_pairs, self.max_samples)),
            most=self.max_samples,
        )


@dataclass(frozen=True)
class RowMeasurement:
    """One row's timing in one round. ``baseline_ms[i]`` is the baseline interpolated at the
    time of ``row_ms[i]`` (empty when the row is unpaired: the baseline itself, or a cell
    without one)."""

    row_ms: tuple[float, ...]
    baseline_ms: tuple[float, ...] = ()
    first_call_s: float = 0.0
    stages_ms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    throttled: int = 0
    #: what each sample's call saw (aligned with ``row_ms``)
    usage: tuple[CallUsage, ...] = ()
    #: the memory bus's bandwidth (GB/s) read just before each sample's call, by the cache
    #: eviction (aligned with ``row_ms``; empty when the timer reads none: hot caches, CUDA)
    bus_gbps: tuple[float, ...] = ()
    #: the round trip (ns) of a cache line between two of the threads, read just before each
    #: sample's call (aligned with ``row_ms``; empty without a link probe): where they ran
    link_ns: tuple[float, ...] = ()
    #: how long a fixed chain of integer steps took on two of the threads just before each
    #: sample's call, in ns (aligned with ``row_ms``; empty without a core probe): how fast
    #: the cores ran
    core_ns: tuple[float, ...] = ()
    #: how long the timer waited for fast cores before each sample's call, in ms (aligned with
    #: ``row_ms``; empty without a core gate)
    core_wait_ms: tuple[float, ...] = ()
    #: the share of CPU time the hypervisor stole while the cell was cycled (``None``: unknown)
    steal_share: float | None = None

    def usage_of(self, name: str) -> list[int]:
        """One :class:`CallUsage` field over the samples (``minor_faults``...)."""
        if name not in USAGE_FIELDS:
            raise ValueError(f"no usage field {name!r}")
        return [getattr(u, name) for u in self.usage]

    @property
    def paired(self) -> bool:
        return bool(self.baseline_ms)

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(b / r for b, r in zip(self.baseline_ms, self.row_ms, strict=True) if r > 0)


@dataclass(frozen=True)
class CellMeasurement:
    """The rows of one cell in one round: each row's measurement, the baseline's own samples
    (``None`` without a baseline) and the rows whose call raised (with the error)."""

    rows: Mapping[Hashable, RowMeasurement]
    baseline: RowMeasurement | None
    failed: Mapping[Hashable, str]


@dataclass
class _Sampling:
    """One row's samples while its cell is cycled."""

    rules: StoppingRules
    row_ms: list[float] = field(default_factory=list)
    baseline_ms: list[float] = field(default_factory=list)
    usage: list[CallUsage] = field(default_factory=list)
    bus_gbps: list[float] = field(default_factory=list)
    link_ns: list[float] = field(default_factory=list)
    core_ns: list[float] = field(default_factory=list)
    core_wait_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    def add(self, ms: float, usage: CallUsage, reading: Reading) -> None:
        self.row_ms.append(ms)
        self.usage.append(usage)
        bus_gbps, link_ns, core_ns, wait_s = reading
        self.core_wait_ms.append(wait_s * 1e3)
        if bus_gbps is not None:
            self.bus_gbps.append(bus_gbps)
        if link_ns is not None:
            self.link_ns.append(link_ns)
        if core_ns is not None:
            self.core_ns.append(core_ns)

    def aligned(self, readings: list[float]) -> tuple[float, ...]:
        """``readings`` (the bus's, the link's, the cores' or the waits for them), when there is
        one for every sample (else none)."""
        return tuple(readings) if len(readings) == len(self.row_ms) else ()

    def samples(self) -> tuple[float, ...]:
        if not self.baseline_ms:
            return tuple(self.row_ms)
        return tuple(
            b / r if r > 0 else 0.0 for b, r in zip(self.baseline_ms, self.row_ms, strict=True)
        )

    def faulted(self) -> int:
        return sum(u.minor_faults + u.major_faults >= FAULTED_PAGES for u in self.usage)

    def done(self) -> bool:
        return self.rules.done(SamplingState(self.samples(), self.elapsed_s, self.faulted()))


def interpolated_baselines(
    before_ms: float,
    after_ms: float,
    row_ms: Sequence[float],
    gaps_ms: Sequence[float] | None = None,
) -> list[float]:
    """The baseline at the middle of each of ``row_ms`` (called in this order between a baseline
    call of ``before_ms`` and one of ``after_ms``), interpolated linearly in time between the
    middles of the two baseline calls. ``gaps_ms[i]``: time between the end of the previous
    call and the start of row ``i``'s (the last entry: before the closing baseline call); none
    when not given."""
    gaps = list(gaps_ms) if gaps_ms is not None else [0.0] * (len(row_ms) + 1)
    if len(gaps) != len(row_ms) + 1:
        raise ValueError(f"gaps_ms needs {len(row_ms) + 1} entries, got {len(gaps)}")
    span = before_ms / 2 + sum(row_ms) + sum(gaps) + after_ms / 2
    at, out = before_ms / 2, []
    for ms, gap in zip(row_ms, gaps, strict=False):
        at += gap
        frac = (at + ms / 2) / span if span > 0 else 0.5
        out.append(before_ms + (after_ms - before_ms) * frac)
        at += ms
    return out


#: What a row's first output in the cycles is handed to (its accuracy check), untimed.
OutputHook = Callable[[object], None]


class MeasurementEngine:
    """Times rows on one device with one set of stopping rules (and a cheaper set for stages)."""

    def __init__(
        self,
        device: torch.device | str,
        settings: TimerSettings,
        stage_settings: TimerSettings,
        clock: Clock = time.perf_counter,
        timer: CallTimer | None = None,
        reuse_memory: bool | None = None,
        cache: str | None = None,
        link_probe: Callable[[], float | None] | None = None,
        core_probe: Callable[[], float | None] | None = None,
    ) -> None:
        """``reuse_memory``: time CPU calls under :func:`freed_memory_reused` (default: on the
        CPU). ``cache``: ``cold`` evicts the caches before every timed call, ``hot`` does not
        (see :func:`~kernelbench.measure.timing.call_timer`); default: the L2 flushed on CUDA,
        the CPU's caches left warm (peaks are measured so: the most a device attains)."""
        self.settings, self.stage_settings = settings, stage_settings
        self.clock = clock
        if cache is None:
            cache = "cold" if torch.device(device).type == "cuda" else "hot"
        self.timer = timer or call_timer(
            device, clock, cache, link_probe, core_probe, settings.core_wait_s
        )
        if reuse_memory is None:
            reuse_memory = torch.device(device).type == "cpu"
        self.reuse_memory = reuse_memory
        self._first_call_faults = 0  # faulted in by first calls since the last block's cushion

    @property
    def _gated(self) -> bool:
        """Whether the timer waits for fast cores (its rows then record each wait)."""
        return self.timer.core_gate is not None

    def _memory(self):
        return freed_memory_reused(self.reuse_memory)

    def first_call(self, call: Call) -> tuple[object, float]:
        """The row's first call (its output is checked for accuracy): result and seconds. It
        counts as warm-up, so a 40-second call is not run twice before its first sample."""
        with self._memory():
            before = self.timer.usage()[0]
            result = self.timer.seconds(call)
            self._first_call_faults += self.timer.usage()[0] - before
            return result

    def _warm_up(self, call: Call, warmed_s: float, warmup_s: float) -> None:
        """Untimed calls until ``warmup_s`` (less ``warmed_s`` already had) have passed; with
        memory reused, at least one: it pre-faults what the call allocates in this block."""
        start = self.clock() - warmed_s
        calls = 0
        force_one = self.reuse_memory
        while self.clock() - start < warmup_s or (force_one and not calls):
            call()
            self.timer.sync()
            calls += 1

    def measure_cell(
        self,
        calls: Mapping[Hashable, Call],
        baseline: Call | None = None,
        warmed_s: Mapping[Hashable, float] | None = None,
        baseline_warmed_s: float = 0.0,
        seed: int = 0,
        first_outputs: Mapping[Hashable, OutputHook] | None = None,
        baseline_first_output: OutputHook | None = None,
        evict_own: Mapping[Hashable, Eviction] | None = None,
        baseline_evict_own: Eviction | None = None,
    ) -> CellMeasurement:
        """Warm each call up (``warmed_s``: seconds of calls it already had), then sample the
        rows in cycles around ``baseline`` until each row's stopping rules are met. Without
        other rows, the baseline is sampled alone; without a baseline, the rows are unpaired.

        ``first_outputs``: the output of each such row's first timed call is handed to its
        hook after the call (a row whose call takes seconds is not called once more just to
        check its output); a raising hook fails the row. The time the hooks take is left out
        of the pairing (:func:`interpolated_baselines`' gaps). CPU memory is reused while the
        cell is timed (see the constructor).

        ``evict_own`` (and ``baseline_evict_own``): what evicts each call's own memory before
        it is timed, after the timer's cache eviction, when the caches are cold (a scan of the
        whole cache does not evict data that a scan-resistant last-level cache protects)."""
        with self._memory():
            steal_before = steal_ticks()
            warmed = dict(warmed_s or {})
            failed: dict[Hashable, str] = {}
            hooks = dict(first_outputs or {})
            evictions = dict(evict_own or {})
            if baseline is not None and not calls:
                self._warm_up(baseline, baseline_warmed_s, self.settings.warmup_s)
                if baseline_first_output is not None:
                    hooks["baseline"] = baseline_first_output
                if baseline_evict_own is not None:
                    evictions["baseline"] = baseline_evict_own
                alone = self._cycles({"baseline": baseline}, None, failed, seed, hooks, evictions)
                if "baseline" in failed:
                    raise RuntimeError(failed["baseline"])
                alone = _with_steal(alone, steal_share(steal_before, steal_ticks()))
                return CellMeasurement({}, alone["baseline"], MappingProxyType({}))
            faults_before = self.timer.usage()[0]
            for key, call in calls.items():
                try:
                    self._warm_up(call, warmed.get(key, 0.0), self.settings.warmup_s)
                except Exception as exc:  # noqa: BLE001 - one row failing leaves the others
                    failed[key] = error_text(exc)
            if baseline is not None:
                self._warm_up(baseline, baseline_warmed_s, self.settings.warmup_s)
            if self.reuse_memory:
                warm_faults = self.timer.usage()[0] - faults_before + self._first_call_faults
                cushion_heap(CUSHION_FACTOR * warm_faults * PAGE_BYTES)
            self._first_call_faults = 0
            live = {k: c for k, c in calls.items() if k not in failed}
            if baseline_first_output is not None:
                hooks[_BASELINE_KEY] = baseline_first_output
            if baseline_evict_own is not None:
                evictions[_BASELINE_KEY] = baseline_evict_own
            rows = self._cycles(live, baseline, failed, seed, hooks, evictions)
            rows = _with_steal(rows, steal_share(steal_before, steal_ticks()))
            base = rows.pop(_BASELINE_KEY, None)
            return CellMeasurement(MappingProxyType(rows), base, MappingProxyType(failed))

    def _cycles(
        self,
        calls: Mapping[Hashable, Call],
        baseline: Call | None,
        failed: dict[Hashable, str],
        seed: int,
        hooks: dict[Hashable, OutputHook],
        evictions: Mapping[Hashable, Eviction],
    ) -> dict[Hashable, RowMeasurement]:
        order = random.Random(seed)
        state = {key: _Sampling(self.settings.rules()) for key in calls}
        active = list(calls)
        base = _Sampling(self.settings.rules())  # the baseline's own samples
        # ``last``: when the previous call ended; the time from there to the next call's start
        # (an output hook's, a failed call's) is a gap the pairing leaves out
        before, last = 0.0, self.clock()
        if baseline is not None:
            before = self._call(_BASELINE_KEY, baseline, hooks, evictions)
            before_seen = self.timer.last_usage, self.timer.last_reading
            last += (before / 1e3) + self.timer.last_prepare_s
        while active:
            order.shuffle(active)
            timed: list[tuple[Hashable, float, CallUsage, Reading]] = []
            gaps: list[float] = []
            for key in active:
                start = self.clock()
                try:
                    ms = self._call(key, calls[key], hooks, evictions)
                except Exception as exc:  # noqa: BLE001 - one row failing leaves the others
                    failed[key] = error_text(exc)
                    continue
                start += self.timer.last_prepare_s  # the eviction before the call: a gap
                timed.append((key, ms, self.timer.last_usage, self.timer.last_reading))
                gaps.append((start - last) * 1e3)
                last = start + ms / 1e3
            if baseline is None:
                for key, ms, usage, reading in timed:
                    state[key].add(ms, usage, reading)
                    state[key].elapsed_s += ms / 1e3
            else:
                start = self.clock()
                after = self.timer(baseline, evictions.get(_BASELINE_KEY))
                start += self.timer.last_prepare_s
                gaps.append((start - last) * 1e3)
                last = start + after / 1e3
                base.add(before, *before_seen)
                before_seen = self.timer.last_usage, self.timer.last_reading
                share = (before + after) / 2 / max(len(timed), 1)
                interp = interpolated_baselines(before, after, [t[1] for t in timed], gaps)
                for (key, ms, usage, reading), base_ms in zip(timed, interp, strict=True):
                    state[key].add(ms, usage, reading)
                    state[key].baseline_ms.append(base_ms)
                    state[key].elapsed_s += (ms + share) / 1e3
                before = after
            active = [k for k in active if k not in failed and not state[k].done()]
        out = {
            key: RowMeasurement(
                tuple(s.row_ms),
                tuple(s.baseline_ms),
                throttled=self.timer.throttled,
                usage=tuple(s.usage),
                bus_gbps=s.aligned(s.bus_gbps),
                link_ns=s.aligned(s.link_ns),
                core_ns=s.aligned(s.core_ns),
                core_wait_ms=s.aligned(s.core_wait_ms) if self._gated else (),
            )
            for key, s in state.items()
            if key not in failed
        }
        if baseline is not None:
            base.add(before, *before_seen)
            out[_BASELINE_KEY] = RowMeasurement(
                tuple(base.row_ms),
                throttled=self.timer.throttled,
                usage=tuple(base.usage),
                bus_gbps=base.aligned(base.bus_gbps),
                link_ns=base.aligned(base.link_ns),
                core_ns=base.aligned(base.core_ns),
                core_wait_ms=base.aligned(base.core_wait_ms) if self._gated else (),
            )
        return out

    def _call(
        self,
        key: Hashable,
        call: Call,
        hooks: dict[Hashable, OutputHook],
        evictions: Mapping[Hashable, Eviction],
    ) -> float:
        """One timed call (ms); the first of a row with a hook hands its output to the hook."""
        hook = hooks.pop(key, None)
        if hook is None:
            return self.timer(call, evictions.get(key))
        out, ms = self.timer.timed(call, evictions.get(key))
        hook(out)
        return ms

    def measure(
        self,
        call: Call,
        first_call_s: float,
        baseline: Call | None = None,
        stages: Mapping[str, Call] | None = None,
        known_stages_ms: Mapping[str, float] | None = None,
    ) -> RowMeasurement:
        """One row on its own: :meth:`measure_cell` with that row only, then its stages."""
        cell = self.measure_cell({"row": call}, baseline, {"row": first_call_s})
        if "row" in cell.failed:
            raise RuntimeError(cell.failed["row"])
        meas = cell.rows["row"]
        return replace(
            meas,
            first_call_s=first_call_s,
            stages_ms=self.time_stages(stages or {}, known_stages_ms),
        )

    def time_stages(
        self,
        stages: Mapping[str, Call],
        known_ms: Mapping[str, float] | None = None,
        evict_own: Mapping[str, Eviction] | None = None,
    ) -> Mapping[str, float]:
        """Median ms of each stage not in ``known_ms``, each timed on its own (``evict_own``:
        what evicts each stage's own memory, as for :meth:`measure_cell`'s rows)."""
        stage_ms = dict(known_ms or {})
        evictions = evict_own or {}
        with self._memory():
            for name, fn in stages.items():
                if name not in stage_ms:
                    stage_ms[name] = self.time_alone(fn, self.stage_settings, evictions.get(name))
        return MappingProxyType(stage_ms)

    def time_alone(
        self, call: Call, settings: TimerSettings, evict_own: Eviction | None = None
    ) -> float:
        """Median ms of ``call`` timed on its own (stages: never printed as a ratio). A first
        call longer than the budget is the one sample: a multi-second stage is not run twice."""
        _, first_s = self.timer.seconds(call)
        if first_s >= settings.budget_s:
            return first_s * 1e3
        self._warm_up(call, first_s, settings.warmup_s)
        rules = settings.rules()
        samples: list[float] = []
        while not rules.done(SamplingState(tuple(samples), sum(samples) / 1e3)):
            samples.append(self.timer(call, evict_own))
        return stats(samples).median_ms


def _with_steal(
    rows: dict[Hashable, RowMeasurement], share: float | None
) -> dict[Hashable, RowMeasurement]:
    return {key: replace(meas, steal_share=share) for key, meas in rows.items()}


#: The baseline's key among the rows of :meth:`MeasurementEngine._cycles` (never a row's key).
_BASELINE_KEY = object()


def error_text(exc: BaseException) -> str:
    """How a failed call is recorded in a row's reason: the exception's type and message."""
    return f"{type(exc).__name__}: {exc}"[:500]
