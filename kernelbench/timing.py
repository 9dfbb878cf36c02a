"""One timer interface: give it a zero-argument callable and a time budget, get raw samples.

The timer takes budgets, not iteration counts (triton's ``do_bench``); when to stop is a small
pluggable object tested on synthetic numbers (nvbench's stopping criteria); statistics are a
separate pure function. Two clocks:

* CPU: ``time.perf_counter`` around each call, after warm-up, threads pinned by the caller.
* CUDA: device events around each call; before every sample the L2 cache is flushed by writing
  a buffer twice the device's L2 size (outside the timed region); optional CUDA-graph replay to
  take launch gaps out; the SM clock is read per sample and samples below 90% of the first
  reading are flagged as throttled. (UNVERIFIED: no GPU in the session that wrote this.)

:func:`time_paired` times a row against its 16-bit baseline in alternation and keeps the ratio of
each adjacent pair of calls: on a shared machine whose speed swings by 2x for a second at a time
(seen on this project's CI VM), both calls of a pair see the same machine, so the ratio holds
still while each time alone does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TimerSettings:
    budget_s: float = 5.0  # wall time for the timed samples of one row
    # Warm-up: calls until this much time has passed, at least one unless the caller already
    # made one (``warmed_s``: seconds of calls just made on the same inputs, e.g. the accuracy
    # check), so a 40-second call is not run twice before its first sample.
    warmup_s: float = 0.2
    min_samples: int = 3
    max_samples: int = 200
    target_rel_spread: float = 0.02  # stop once IQR / median is below this (with min_samples)
    noise_window: int = 5  # the spread is judged on at least this many samples
    cuda_graph: bool = False


@dataclass
class Stats:
    median_ms: float
    iqr_ms: float
    min_ms: float
    mean_ms: float
    rel_spread: float
    samples: int


def stats(samples_ms: list[float]) -> Stats:
    """Median, IQR (linear-interpolated quartiles), min, mean and IQR / median."""
    if not samples_ms:
        raise ValueError("no samples")
    s = sorted(samples_ms)

    def q(p: float) -> float:
        pos = p * (len(s) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    median = q(0.5)
    iqr = q(0.75) - q(0.25)
    return Stats(median, iqr, s[0], sum(s) / len(s), iqr / median if median > 0 else 0.0, len(s))


class StoppingCriterion:
    """Decides when enough samples were taken. ``add`` each sample (ms), then ask ``done``."""

    def __init__(self, settings: TimerSettings) -> None:
        self.settings = settings
        self.samples: list[float] = []
        self.elapsed_s = 0.0

    def add(self, sample_ms: float, elapsed_s: float | None = None) -> None:
        """``elapsed_s``: the time the sample took when ``sample_ms`` is not one (a ratio)."""
        self.samples.append(sample_ms)
        self.elapsed_s += sample_ms / 1e3 if elapsed_s is None else elapsed_s

    def converged(self) -> bool:
        st = self.settings
        n = len(self.samples)
        if n < max(st.min_samples, st.noise_window):
            return False
        return stats(self.samples).rel_spread <= st.target_rel_spread

    def done(self) -> bool:
        st = self.settings
        n = len(self.samples)
        if n >= st.max_samples:
            return True
        if n >= 1 and self.elapsed_s >= st.budget_s:
            return True  # out of time: stop with what we have (at least one sample)
        return n >= st.min_samples and self.converged()


@dataclass
class Measurement:
    samples_ms: list[float]
    throttled: int = 0
    clocks_mhz: list[float] = field(default_factory=list)
    #: True when the only sample is the caller's first call (see :func:`time_fn`).
    single_first_call: bool = False

    @property
    def stats(self) -> Stats:
        return stats(self.samples_ms)


def _warm_up(
    call: Callable[[], object],
    settings: TimerSettings,
    warmed_s: float,
    sync: Callable[[], object] = lambda: None,
) -> None:
    if warmed_s <= 0:
        call()
        sync()
    start = time.perf_counter() - warmed_s
    while time.perf_counter() - start < settings.warmup_s:
        call()
        sync()


def time_cpu(
    fn: Callable[[], object], settings: TimerSettings, warmed_s: float = 0.0
) -> Measurement:
    """Warm up, then time ``fn`` with perf_counter until the stopping criterion says so."""
    _warm_up(fn, settings, warmed_s)
    criterion = StoppingCriterion(settings)
    while not criterion.done():
        t0 = time.perf_counter()
        fn()
        criterion.add((time.perf_counter() - t0) * 1e3)
    return Measurement(criterion.samples)


class L2Flusher:
    """Evicts the L2 cache between samples by writing a buffer twice the device's L2 size."""

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.bytes = 2 * l2
        self.buffer = torch.empty(self.bytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.fill_(0x5A)


def _sm_clock_mhz(device: torch.device) -> float | None:
    try:
        return float(torch.cuda.clock_rate(device))  # needs pynvml / amdsmi
    except Exception:  # noqa: BLE001 - clocks are informative, never fatal
        return None


def time_cuda(
    fn: Callable[[], object], settings: TimerSettings, device: torch.device, warmed_s: float = 0.0
) -> Measurement:
    """Device-event timing with L2 flush outside the timed region (UNVERIFIED on a GPU)."""
    timed = _call_timer(device)
    call = fn
    if settings.cuda_graph:
        fn()  # warm-up outside capture (allocations, autotuning)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        call = graph.replay
        warmed_s = 0.0  # the graph itself has not run yet
    _warm_up(call, settings, warmed_s, lambda: torch.cuda.synchronize(device))
    criterion = StoppingCriterion(settings)
    clocks: list[float] = []
    throttled = 0
    first_clock: float | None = None
    while not criterion.done():
        criterion.add(timed(call))
        clock = _sm_clock_mhz(device)
        if clock is not None:
            clocks.append(clock)
            first_clock = first_clock or clock
            if clock < 0.9 * first_clock:
                throttled += 1
    return Measurement(criterion.samples, throttled, clocks)


def time_fn(
    fn: Callable[[], object],
    settings: TimerSettings,
    device: torch.device,
    warmed_s: float = 0.0,
) -> Measurement:
    """Time ``fn`` on ``device``. ``warmed_s``: the duration of a call the caller has just made
    on the same inputs. When that one call already took the whole budget, it is the sample: a
    call that long is timed once, and its first-call costs (allocation, primitive creation:
    milliseconds) are far below its own spread (``samples == 1`` says so in the results)."""
    cpu = torch.device(device).type == "cpu"  # on CUDA every sample is event-timed
    if cpu and warmed_s > 0 and warmed_s >= settings.budget_s:
        return Measurement([warmed_s * 1e3], single_first_call=True)
    if torch.device(device).type == "cuda":
        return time_cuda(fn, settings, torch.device(device), warmed_s)
    return time_cpu(fn, settings, warmed_s)


@dataclass
class PairedMeasurement:
    """``ratios[i] = baseline_ms[i] / row_ms[i]``: the speedup of one adjacent pair of calls."""

    ratios: list[float]
    row_ms: list[float]
    baseline_ms: list[float]

    @property
    def stats(self) -> Stats:
        return stats(self.ratios)


def _call_timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """One timed call in ms: perf_counter on CPU; on CUDA an L2 flush, then device events
    (UNVERIFIED on a GPU, like :func:`time_cuda`)."""
    if device.type != "cuda":

        def timed(fn: Callable[[], object]) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        return timed
    flush = L2Flusher(device)
    stream = torch.cuda.current_stream(device)

    def timed_cuda(fn: Callable[[], object]) -> float:
        flush()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        return begin.elapsed_time(end)

    return timed_cuda


def time_paired(
    row_fn: Callable[[], object],
    baseline_fn: Callable[[], object],
    settings: TimerSettings,
    device: torch.device,
    warmed_s: float = 0.0,
) -> PairedMeasurement:
    """Warm ``row_fn`` up (``warmed_s`` as in :func:`time_fn`; the baseline was timed just
    before), then alternate timed calls of the two, the order flipped every pair so that
    neither always runs right after the other. The stopping criterion judges the pairs'
    ratios; the budget counts both calls."""
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    _warm_up(row_fn, settings, warmed_s, sync)
    timed = _call_timer(device)
    criterion = StoppingCriterion(settings)
    rows: list[float] = []
    bases: list[float] = []
    while not criterion.done():
        if len(rows) % 2:
            r, b = timed(row_fn), timed(baseline_fn)
        else:
            b, r = timed(baseline_fn), timed(row_fn)
        rows.append(r)
        bases.append(b)
        criterion.add(b / r if r > 0 else 0.0, elapsed_s=(r + b) / 1e3)
    return PairedMeasurement(criterion.samples, rows, bases)
