"""The sweep pipeline: case -> work items -> inputs -> method runners -> timing + accuracy -> rows.

:func:`plan` expands a case and the user's choices into :class:`WorkItem` s (one per cell: size,
layer, tokens); :func:`measure_cell` draws the cell's inputs once and measures every (backend,
method) pair on them, yielding :class:`ResultRow` s as they are measured. The caller (an
executor, the CLI) writes each row as it arrives. Nothing here knows how rows are stored or shown.

Per cell, the device's 16-bit baseline (``torch`` ``fp16``) and ``fp32`` are measured first so
every later row carries its speedup; accuracy is measured against the float64 exact product on
up to ``error_rows`` output rows (all of them when m is smaller; the rows are drawn with the
cell's seed), which keeps the float64 oracle affordable at 175B shapes on a 2-core CPU.

Rows whose single call is estimated (from the same backend and method on the previous, smaller
cell of this run) to take longer than ``max_call_s`` are recorded as ``skipped`` with that
estimate, so a slow path cannot stall the sweep; errors become ``failed`` rows and the sweep
goes on.
"""

from __future__ import annotations

import datetime as dt
import math
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbench import oracle
from kernelbench.backends import METHODS, all_backends
from kernelbench.backends.base import Runner, sixteen_bit_dtype
from kernelbench.cases import Case, Size, load_activation_file, make_inputs
from kernelbench.env import device_class
from kernelbench.quant import QuantConfig, outlier_columns
from kernelbench.results import ResultRow
from kernelbench.timing import Measurement, TimerSettings, stats, time_fn, time_paired

BASELINE = ("torch", "fp16")
FP32 = ("torch", "fp32")
#: The baselines may take this many times ``max_call_s`` per call: every speedup in a cell
#: needs them, and on CPUs without native bf16 the 16-bit baseline is the slowest row.
BASELINE_CALL_FACTOR = 3.0


@dataclass(frozen=True)
class RunOptions:
    case: str = "gpt3"
    sizes: tuple[int, ...] | None = None  # d_model values; None = all of the case
    tokens: tuple[int, ...] | None = None
    layer: str | None = None
    dist: str | None = None
    backends: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    device: str = "cpu"
    cfg: QuantConfig = field(default_factory=QuantConfig)
    timer: TimerSettings = field(default_factory=TimerSettings)
    stage_timer: TimerSettings = field(
        default_factory=lambda: TimerSettings(
            budget_s=0.5, warmup_s=0.0, min_samples=1, noise_window=3
        )
    )
    max_call_s: float = 30.0
    error_rows: int = 512
    activations: Path | None = None
    #: Time each row in alternation with the cell's 16-bit baseline (``ResultRow.paired``).
    paired: bool = True


@dataclass(frozen=True)
class WorkItem:
    """One cell of the sweep; every (backend, method) pair is measured on its inputs."""

    size: Size
    layer: str
    tokens: int
    dist: str

    @property
    def label(self) -> str:
        return f"{self.size.name} d={self.size.d_model} {self.layer} tokens={self.tokens}"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or auto, got {device!r}")
    return torch.device(device)


def plan(case: Case, opts: RunOptions) -> list[WorkItem]:
    sizes = [case.size(d) for d in opts.sizes] if opts.sizes else list(case.sizes)
    layer = opts.layer or case.default_layer
    case.shape(layer, sizes[0].d_model)  # validates the layer name
    tokens = opts.tokens or case.default_tokens
    dist = opts.dist or case.default_dist
    if opts.activations is not None:
        dist = f"file:{Path(opts.activations).name}"
    return [WorkItem(s, layer, t, dist) for t in tokens for s in sizes]


def method_pairs(opts: RunOptions) -> list[tuple[str, str]]:
    """(backend, method) pairs in measuring order: baselines first."""
    backends = list(opts.backends or [n for n, b in all_backends().items() if b.in_default_sweep])
    methods = list(opts.methods or METHODS)
    unknown = [b for b in backends if b not in all_backends()]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; known: {', '.join(all_backends())}")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; known: {', '.join(METHODS)}")
    pairs = [(b, m) for b in backends for m in methods]
    first = [p for p in (BASELINE, FP32) if p in pairs]
    return first + [p for p in pairs if p not in first]


class CallEstimator:
    """Throughput of each (backend, method) seen so far in this run, to skip hopeless rows."""

    def __init__(self) -> None:
        self.ops_per_s: dict[tuple[str, str], tuple[float, int]] = {}

    def record(self, key: tuple[str, str], ops: float, seconds: float, d_model: int) -> None:
        if seconds > 0:
            self.ops_per_s[key] = (ops / seconds, d_model)

    def estimate(self, key: tuple[str, str], ops: float) -> tuple[float, int] | None:
        if key not in self.ops_per_s:
            return None
        rate, d_model = self.ops_per_s[key]
        return ops / rate, d_model


def _error_rows(m: int, limit: int, seed: int) -> torch.Tensor:
    if m <= limit:
        return torch.arange(m)
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(m, generator=gen)[:limit].sort().values


def base_row(
    item: WorkItem,
    case: Case,
    backend: str,
    method: str,
    device: torch.device,
    dclass: str,
) -> ResultRow:
    """The row of one (backend, method) on one cell before anything is measured: its key and
    the cell's description. Executors use it to record rows they could not measure."""
    k, n = case.shape(item.layer, item.size.d_model)
    m = item.tokens
    return ResultRow(
        case=case.name,
        size=item.size.name,
        d_model=item.size.d_model,
        layer=item.layer,
        tokens=m,
        m=m,
        k=k,
        n=n,
        dist=item.dist,
        seed=0,
        backend=backend,
        method=method,
        device=device.type,
        device_class=dclass,
        dtype=str(sixteen_bit_dtype(device)).replace("torch.", ""),
        threads=torch.get_num_threads(),
        host=socket.gethostname(),
        paper_speedup=case.paper_figure(method, item.size.d_model, item.layer, m),
        weight_bytes_16bit=(n * k + n) * 2,
    )


def measure_cell(
    item: WorkItem,
    case: Case,
    opts: RunOptions,
    estimator: CallEstimator,
    done: set[tuple] | None = None,
    activations: torch.Tensor | None = None,
) -> Iterator[ResultRow]:
    """Measure every (backend, method) pair on one cell; yields rows as they are measured."""
    device = resolve_device(opts.device)
    dclass = device_class(device)
    dtype = sixteen_bit_dtype(device)
    k, n = case.shape(item.layer, item.size.d_model)
    m = item.tokens
    ops = 2.0 * m * k * n
    pairs = method_pairs(opts)
    done = done or set()

    todo = [
        (b, mt) for b, mt in pairs if base_row(item, case, b, mt, device, dclass).key() not in done
    ]
    if not todo:
        return
    inputs = make_inputs(case, item.size, item.layer, m, item.dist, dtype, device, activations)
    rows_idx = _error_rows(m, opts.error_rows, inputs.seed)
    x_sub = inputs.x[rows_idx.to(device)]
    reference = oracle.exact(x_sub, inputs.weight, inputs.bias)
    kept_rows = outlier_columns(inputs.x, opts.cfg.alpha, opts.cfg.outlier_cmp)
    times: dict[tuple[str, str], float] = {}
    baseline_error: float | None = None
    baseline_fn = None  # the 16-bit baseline's call, kept for the paired timing of later rows

    for backend_name, method in todo:
        row = base_row(item, case, backend_name, method, device, dclass)
        row.seed = inputs.seed
        backend = all_backends()[backend_name]
        avail = backend.supports(method, device, dtype, m, k, n)
        if not avail:
            row.status, row.reason = "skipped", avail.reason
            yield _stamp(row)
            continue
        est = estimator.estimate((backend_name, method), ops)
        cap = opts.max_call_s * (
            BASELINE_CALL_FACTOR if (backend_name, method) in (BASELINE, FP32) else 1.0
        )
        if est is not None and est[0] > cap:
            row.status = "skipped"
            row.reason = (
                f"over budget: one call estimated at {est[0]:.0f} s (from this run's "
                f"d={est[1]} cell) > {cap:g} s (max_call_s)"
            )
            yield _stamp(row)
            continue
        try:
            call = _measure_row(
                row,
                backend,
                method,
                inputs,
                opts,
                device,
                kept_rows,
                rows_idx,
                reference,
                times,
                baseline_fn,
            )
            estimator.record((backend_name, method), ops, row.median_ms / 1e3, item.size.d_model)
            times[(backend_name, method)] = row.median_ms
            if (backend_name, method) == BASELINE:
                baseline_error = row.rel_error
                baseline_fn = call if opts.paired else None
        except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the sweep goes on
            row.status = "failed"
            row.reason = f"{type(exc).__name__}: {exc}"[:500]
            if device.type == "cuda":
                torch.cuda.empty_cache()
        _fill_relative(row, times, baseline_error, ops)
        yield _stamp(row)


def _measure_row(
    row, backend, method, inputs, opts, device, kept_rows, rows_idx, reference, times, baseline_fn
):
    """Fill ``row`` with the method's accuracy and times; returns the timed call."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runner: Runner = backend.runner(
        method, inputs.x, inputs.weight, inputs.bias, opts.cfg, kept_rows=kept_rows
    )
    y, first_call_s = _timed_call(runner.run, device)  # a warm-up too: not repeated
    if runner.returns_int32:
        # int8_raw: the exact integer product of the same operands (float64 is exact here).
        a, b = runner.operands
        ref = a[rows_idx.to(a.device)].double() @ b.double().T
        got = y[rows_idx.to(y.device)]
    else:
        ref, got = reference, y[rows_idx.to(y.device)]
    row.rel_error = oracle.rel_frobenius(got.cpu(), ref.cpu())
    row.max_abs_error = oracle.max_abs_error(got.cpu(), ref.cpu())
    row.outlier_cols = runner.outlier_cols
    row.weight_bytes = runner.weight_bytes
    row.variant, row.compile_s = runner.variant, runner.compile_seconds
    del y
    pair_s = _pair_seconds(runner.run, first_call_s, times, baseline_fn, opts.timer, device)
    if pair_s * opts.timer.min_samples <= opts.timer.budget_s:
        paired = time_paired(runner.run, baseline_fn, opts.timer, device, warmed_s=first_call_s)
        meas = Measurement(paired.row_ms)
        row.paired, row.baseline_raw_ms = True, paired.baseline_ms
        ps = paired.stats
        row.paired_speedup, row.paired_rel_spread = ps.median_ms, ps.rel_spread
    else:
        meas = time_fn(runner.run, opts.timer, device, warmed_s=first_call_s)
    st = meas.stats
    row.median_ms, row.iqr_ms, row.min_ms, row.mean_ms = (
        st.median_ms,
        st.iqr_ms,
        st.min_ms,
        st.mean_ms,
    )
    row.rel_spread, row.samples, row.raw_ms = st.rel_spread, st.samples, meas.samples_ms
    row.throttled_samples = meas.throttled
    raw_key = (row.backend, "int8_raw")
    for stage, fn in runner.stages.items():
        if stage == "int8_matmul" and raw_key in times and method != "int8_raw":
            row.stages_ms[stage] = times[raw_key]  # the same GEMM, measured as int8_raw
            continue
        if stage == "int8_matmul" and method == "int8_raw":
            row.stages_ms[stage] = st.median_ms
            continue
        row.stages_ms[stage] = time_fn(fn, opts.stage_timer, device).stats.median_ms
    if device.type == "cuda":
        row.peak_mem_bytes = int(torch.cuda.max_memory_allocated(device))
    return runner.run


def _pair_seconds(call, first_call_s, times, baseline_fn, timer, device) -> float:
    """One call of the row plus one of the baseline, in seconds (inf: no baseline to pair with).
    The row's first call may carry one-off costs (allocation, primitive creation): when it alone
    rules pairing out but is shorter than the budget, one warm call decides instead."""
    if baseline_fn is None:
        return math.inf
    base_s = times[BASELINE] / 1e3
    fits = (first_call_s + base_s) * timer.min_samples <= timer.budget_s
    if fits or first_call_s >= timer.budget_s:
        return first_call_s + base_s
    return _timed_call(call, device)[1] + base_s


def _timed_call(call, device: torch.device) -> tuple[object, float]:
    """``call()``'s result and its wall time in seconds, the device synchronised."""
    t0 = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - t0


def _fill_relative(row: ResultRow, times, baseline_error, ops: float) -> None:
    if row.status != "ok":
        return
    # A paired row's baseline is the 16-bit baseline's median over the row's own pairs.
    base = stats(row.baseline_raw_ms).median_ms if row.paired else times.get(BASELINE)
    row.baseline_ms = base
    row.speedup = base / row.median_ms if base else None
    row.tops = ops / (row.median_ms / 1e3) / 1e12
    row.baseline_rel_error = baseline_error


def _stamp(row: ResultRow) -> ResultRow:
    row.timestamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return row


def load_user_activations(opts: RunOptions) -> torch.Tensor | None:
    return load_activation_file(opts.activations) if opts.activations else None
