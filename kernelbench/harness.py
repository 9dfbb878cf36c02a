"""The sweep pipeline: case -> work items -> inputs -> method runners -> timing + accuracy -> rows.

:func:`plan` expands a case and the user's choices into :class:`WorkItem` s (one per cell and
round: size, layer, tokens); :func:`measure_cell` draws the cell's inputs once and measures every
(backend, method) pair on them, yielding the cell's :class:`ResultRow` s once it is measured. The
caller (an executor, the CLI) writes each row as it arrives. Nothing here knows how rows are
stored or shown; timing is :mod:`kernelbench.measure`'s.

Per cell, every row's runner is built and called once (its first call), then the engine times all
rows in cycles around the device's 16-bit baseline (``torch`` ``fp16``), each sample paired with
the baseline around it; in round 0, accuracy is measured against the float64 exact
product on up to ``error_rows`` output rows (all of them when m is smaller; the rows are drawn
with the cell's seed), which keeps the float64 oracle affordable at 175B shapes on a 2-core CPU.

Rows whose single call is estimated (from the same backend and method on the previous, smaller
cell of this run) to take longer than ``max_call_s`` are recorded as ``skipped`` with that
estimate, so a slow path cannot stall the sweep; errors become ``failed`` rows and the sweep
goes on.
"""

from __future__ import annotations

import datetime as dt
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from kernelbench import oracle
from kernelbench.backends import all_backends
from kernelbench.backends.base import Runner, sharing_weights, sixteen_bit_dtype
from kernelbench.cases import Case, Size, layer_inputs, load_activation_file, make_inputs
from kernelbench.core import BASELINE, FP32, METHODS, SkipKind, work_bytes, work_flops
from kernelbench.env import device_class
from kernelbench.measure import MeasurementEngine, RowMeasurement, TimerSettings, error_text
from kernelbench.plugins import origin_of
from kernelbench.prepared import (
    PreparedCell,
    PreparedCells,
    PreparedLayer,
    available_bytes,
    resident_bytes,
)
from kernelbench.quant import QuantConfig, outlier_columns
from kernelbench.results import ResultRow
from kernelbench.statistics import median_interval, rel_halfwidth, stats

#: The baselines may take this many times ``max_call_s`` per call: every speedup in a cell
#: needs them, and on CPUs without native bf16 the 16-bit baseline is the slowest row.
BASELINE_CALL_FACTOR = 3.0
#: ``--layer all``: every layer of one transformer block of each size.
ALL_LAYERS = "all"


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
        default_factory=lambda: TimerSettings(budget_s=0.05, warmup_s=0.0, min_samples=1)
    )
    max_call_s: float = 30.0
    error_rows: int = 512
    activations: Path | None = None
    #: The sweep visits its cells this many times (round 0 in size order, later rounds each in
    #: a fresh shuffled order); a row's pairs are pooled over the rounds.
    rounds: int = 3
    #: A pooled speedup whose 95% interval is wider than this (half-width, relative) is "wide":
    #: the run measures its cell again while ``extra_rounds`` last, then says so.
    ci_target: float = 0.05
    extra_rounds: int = 2
    #: Estimated seconds each extra round may take (cheapest uncertain cells first).
    extra_round_budget_s: float = 45.0
    #: Memory (bytes) a local run may keep cells' inputs and runners in between rounds, so that
    #: a later round does not quantize the weights again; ``None``: a share of physical memory
    #: (:func:`kernelbench.prepared.default_limit_bytes`), 0: keep nothing.
    keep_prepared_bytes: int | None = None


@dataclass(frozen=True)
class WorkItem:
    """One cell of the sweep; every (backend, method) pair is measured on its inputs."""

    size: Size
    layer: str
    tokens: int
    dist: str
    round: int = 0
    #: Measure only these (backend, method) pairs (and the baseline they pair with); ``None``:
    #: all of the run's pairs. Extra rounds for wide or suspect rows use it.
    only: frozenset[tuple[str, str]] | None = None

    @property
    def label(self) -> str:
        text = f"{self.size.name} d={self.size.d_model} {self.layer} tokens={self.tokens}"
        return f"{text} round {self.round}" if self.round else text


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
    if layer != ALL_LAYERS:
        for s in sizes:
            case.shape(layer, s.d_model)  # validates the layer name
    tokens = opts.tokens or case.default_tokens
    dist = opts.dist or case.default_dist
    if opts.activations is not None:
        dist = f"file:{Path(opts.activations).name}"
    layers = [
        (s, lay)
        for s in sizes
        for lay in (case.layer_names(s.d_model) if layer == ALL_LAYERS else (layer,))
    ]
    items = []
    for r in range(opts.rounds):
        # round 0 goes up in size, so that every call-time estimate comes from below; later
        # rounds each in a fresh shuffled order. The token counts of a layer come one after
        # another (in a shuffled order after round 0): they share its prepared weights.
        order = list(layers)
        rng = random.Random(case.seed + r)
        if r:
            rng.shuffle(order)
        for s, lay in order:
            counts = list(tokens)
            if r:
                rng.shuffle(counts)
            items += [WorkItem(s, lay, t, dist, round=r) for t in counts]
    return items


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
    """Throughput of each (backend, method) at each token count seen so far in this run, to
    skip hopeless rows (small token counts run far below the large ones' throughput, so an
    estimate comes only from the same token count)."""

    def __init__(self) -> None:
        self.ops_per_s: dict[tuple[tuple[str, str], int], tuple[float, int]] = {}

    def record(
        self, key: tuple[str, str], ops: float, seconds: float, d_model: int, tokens: int
    ) -> None:
        if seconds > 0:
            self.ops_per_s[(key, tokens)] = (ops / seconds, d_model)

    def estimate(self, key: tuple[str, str], ops: float, tokens: int) -> tuple[float, int] | None:
        if (key, tokens) not in self.ops_per_s:
            return None
        rate, d_model = self.ops_per_s[(key, tokens)]
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
        origin=origin_of(backend).label(),
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
    prepared: PreparedCells | None = None,
) -> Iterator[ResultRow]:
    """Measure every (backend, method) pair on one cell in one round; yields rows as measured.

    Accuracy (against the float64 oracle) and stage times are measured in round 0 only: they
    do not change between rounds, and the oracle is the costliest part of a large cell. With
    ``prepared``, the cell's inputs and runners are kept for its later rounds (within that
    cache's memory budget), and taken from it when an earlier round kept them."""
    device = resolve_device(opts.device)
    dclass = device_class(device)
    dtype = sixteen_bit_dtype(device)
    k, n = case.shape(item.layer, item.size.d_model)
    m = item.tokens
    flops = work_flops(m, k, n)
    pairs = method_pairs(opts)
    if item.round >= FP32_ROUNDS:
        pairs = [p for p in pairs if p != FP32]
    if item.only is not None:
        pairs = [p for p in pairs if p in item.only or p == BASELINE]
    done = done or set()

    def pending(b: str, mt: str) -> bool:
        row = base_row(item, case, b, mt, device, dclass)
        return (row.key(), item.round) not in done

    todo = [(b, mt) for b, mt in pairs if pending(b, mt)]
    if not todo:
        return
    if BASELINE in pairs and BASELINE not in todo:
        todo.insert(0, BASELINE)  # the later rows pair with it: time it again, do not write it
    layer_key = (item.size.d_model, item.layer, item.dist)
    cell_key = (layer_key, m)
    kept = prepared.get(cell_key) if prepared is not None else None
    if prepared is not None and (kept is None or any(p not in kept.runners for p in todo)):
        prepared.release_layer(unless=layer_key)
        prepared.make_room(WORKING_SET_PER_WEIGHT_BYTE * k * n * dtype.itemsize, keep=cell_key)
    in_use = resident_bytes(device)
    layers: list[PreparedLayer] = []  # drawn (or taken from ``prepared``) once something is built

    def layer() -> PreparedLayer:
        if not layers:
            held = _layer(item, case, opts, dtype, device, activations, prepared, layer_key)
            layers.append(held)
        return layers[0]

    if kept is None:
        inputs = make_inputs(
            case, item.size, item.layer, m, item.dist, dtype, device, activations, layer().inputs
        )
        kept = PreparedCell(inputs, layer().kept_rows)
    inputs, kept_rows = kept.inputs, kept.kept_rows
    check = _AccuracyCheck(inputs, opts, device) if item.round == 0 else None
    engine = MeasurementEngine(device, opts.timer, opts.stage_timer)
    cell = _Cell(baseline_error=None)
    inputs_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    ready: list[_Prepared] = []  # built, waiting for the cycles
    reused_layer: bool | None = None
    measured: list[_Prepared] = []
    rows: list[ResultRow] = []  # in measuring order, filled in place
    reserve = RESERVE_PER_WEIGHT_BYTE * k * n * dtype.itemsize + RESERVE_BYTES
    for backend_name, method in todo:
        row = base_row(item, case, backend_name, method, device, dclass)
        row.seed, row.round = inputs.seed, item.round
        row.planted_outlier_cols = inputs.planted_outliers
        row.flops, row.bytes = flops, work_bytes(method, m, k, n)
        rows.append(row)
        skip = _skip_reason(backend_name, method, device, dtype, m, k, n, flops, opts, estimator)
        if skip is not None:
            row.status, (row.skip_kind, row.reason) = "skipped", skip
            continue
        if any(p.key != BASELINE for p in ready) and _memory_short(reserve, prepared, cell_key):
            # the cell's runners do not all fit: time those built so far, free them, go on
            _measure_prepared(ready, engine, cell, inputs.seed, device)
            measured += [p for p in ready if p.key != BASELINE]
            ready = [p for p in ready if p.key == BASELINE]
            prepared = None  # a cell that does not fit in memory is not kept
        try:
            built = kept.runners.get((backend_name, method))
            warm_s = _warm_enough(item, (backend_name, method), flops, estimator, built, opts)
            setup = (opts, engine, check, kept_rows, device)
            backend = all_backends()[backend_name]
            shared = None
            if built is None and layer().inputs.weight is inputs.weight:
                shared = layer().shared  # runners built on these weights share what they prepare
                if reused_layer is None:  # earlier cells of the layer prepared its weights
                    reused_layer = len(shared) > 0
            with sharing_weights(shared):
                one = _prepare_row(row, backend, inputs, setup, inputs_bytes, warm_s, built)
            if check is not None:
                _time_stages(one, engine, cell)
            # the stages' inputs and the operands have served: free them before the next
            # runner is built (at 175B shapes they are a gigabyte per runner)
            operands = one.runner.operands if one.check is not None else None
            one.runner = replace(one.runner, stages={}, operands=operands)
            ready.append(one)
        except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the sweep goes on
            _fail(row, error_text(exc), device)
    _measure_prepared(ready, engine, cell, inputs.seed, device)
    for p in measured + ready:
        if p.row.status == "ok":
            estimator.record(p.key, flops, p.row.median_ms / 1e3, item.size.d_model, m)
            if prepared is not None and p.key not in kept.runners and p.key != FP32:
                kept.runners[p.key] = p.runner
    del ready, measured, check
    layers.clear()
    if prepared is not None:
        now = resident_bytes(device)
        grown = now - in_use if now is not None and in_use is not None else 0
        # at least what it declares (the allocator may have reused memory freed before),
        # unless its weights were prepared by an earlier cell of its layer (charged there)
        declared = sum(r.weight_bytes for r in kept.runners.values())
        floor = 0 if reused_layer else declared + inputs.x.nbytes + inputs.weight.nbytes
        kept.nbytes = max(kept.nbytes + grown, floor)
        prepared.offer(cell_key, kept)
    del kept
    for row in rows:
        if (row.backend, row.method) != BASELINE or pending(*BASELINE):
            yield _stamp(row)


def _layer(item, case, opts, dtype, device, activations, prepared, layer_key) -> PreparedLayer:
    """The cell's layer: held by ``prepared`` for the layer's other cells (every token count
    shares its weights, and the weights prepared from them), or drawn for this cell alone."""
    held = prepared.layer(layer_key) if prepared is not None else None
    if held is not None and held.inputs.x.shape[0] >= item.tokens:
        return held
    inputs = layer_inputs(
        case, item.size, item.layer, item.dist, dtype, device, activations, item.tokens
    )
    cal = inputs.calibration
    layer = PreparedLayer(inputs, outlier_columns(cal, opts.cfg.alpha, opts.cfg.outlier_cmp))
    if prepared is not None and prepared.limit_bytes:
        prepared.hold_layer(layer_key, layer)
    return layer


def max_call_s(pair: tuple[str, str], limit_s: float) -> float:
    """The longest estimated call ``pair`` may have before its row is skipped, under the run's
    ``max_call_s`` of ``limit_s``."""
    return limit_s * (BASELINE_CALL_FACTOR if pair in (BASELINE, FP32) else 1.0)


def _skip_reason(backend_name, method, device, dtype, m, k, n, flops, opts, estimator):
    """(skip kind, reason) when the row is not to be measured, else ``None``."""
    avail = all_backends()[backend_name].supports(method, device, dtype, m, k, n)
    if not avail:
        return SkipKind.UNSUPPORTED.value, avail.reason
    est = estimator.estimate((backend_name, method), flops, m)
    cap = max_call_s((backend_name, method), opts.max_call_s)
    if est is not None and est[0] > cap:
        return SkipKind.OVER_BUDGET.value, (
            f"one call estimated at {est[0]:.0f} s (from this run's d={est[1]} cell) "
            f"> {cap:g} s (max_call_s)"
        )
    return None


#: Memory a cell's measurement may need, per byte of its 16-bit weight: every row's runner is
#: alive during the cycles (an int8 weight, stage inputs and operands each, the fp32 copy), and
#: round 0 adds the float64 oracle. Measured at 175B shapes on the CPU: 15 GB for a 1.2 GB
#: weight. Cells kept from earlier rounds are let go when less than this is free.
WORKING_SET_PER_WEIGHT_BYTE = 14

#: While the rows of a cell are built, at least this much memory stays free (per byte of the
#: 16-bit weight, plus RESERVE_BYTES): room for the next runner's build. When less is free, the
#: rows built so far are timed (in cycles with the baseline) and freed before the rest are
#: built, so a cell too large to hold every runner at once is measured in groups.
RESERVE_PER_WEIGHT_BYTE = 4
RESERVE_BYTES = 1 << 30


def _memory_short(reserve: int, prepared: PreparedCells | None, cell_key) -> bool:
    """True when less than ``reserve`` is free even after letting kept cells go."""
    if prepared is not None:
        prepared.make_room(reserve, keep=cell_key)
    free = available_bytes()
    return free is not None and free < reserve


#: ``fp32`` is measured in round 0 only (paired with the baseline in that round's cycles): it
#: is a reference point, not a contender, and at 175B shapes one call takes a 2-core CPU 17 s.
FP32_ROUNDS = 1

#: In rounds after the first, a row whose call this run measured at this many seconds or more
#: skips its separate first call: its calls in the cycles are warm enough, and at 175B shapes
#: a first call per row and round costs a minute of a 2-core machine's time.
LONG_CALL_S = 1.0


@dataclass
class _Cell:
    """What the rows of one cell share while it is measured."""

    baseline_error: float | None
    #: each backend's int8 GEMM stage, timed with its int8_raw row
    gemm_stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class _Prepared:
    """A row whose runner is built and warm, waiting for the cell's cycles."""

    row: ResultRow
    runner: Runner
    warmed_s: float  # seconds of calls it already had (its first call, or the estimate)
    #: round 0 without a separate first call: the output of its first call in the cycles is
    #: checked against the oracle (a call of seconds is not made once more just for that)
    check: _AccuracyCheck | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.row.backend, self.row.method)

    def output_check(self) -> Callable[[object], None]:
        """The hook that checks this row's first output in the cycles, then lets the operands
        the check needed go."""
        check = self.check

        def record(y) -> None:
            self.row.rel_error, self.row.max_abs_error = check.errors(self.runner, y)
            self.runner = replace(self.runner, operands=None)
            self.check = None

        return record


def _warm_enough(item, key, flops, estimator: CallEstimator, kept: Runner | None, opts):
    """Seconds of warm-up a row may count as done without a first call, or ``None``: it needs
    one. A runner kept from an earlier round has had its first call (and in the cycles, other
    rows' calls come between its own, so a warm cache is not what warm-up would buy); a freshly
    built one needs it unless its call is long (in round 0 its output is then checked on its
    first call in the cycles)."""
    if kept is not None:
        return opts.timer.warmup_s
    est = estimator.estimate(key, flops, item.tokens)
    return est[0] if est is not None and est[0] >= LONG_CALL_S else None


def _fail(row: ResultRow, reason: str, device: torch.device) -> None:
    row.status, row.reason = "failed", reason[:500]
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _AccuracyCheck:
    """The float64 oracle on up to ``error_rows`` output rows of the cell."""

    def __init__(self, inputs, opts: RunOptions, device: torch.device) -> None:
        self.rows_idx = _error_rows(inputs.x.shape[0], opts.error_rows, inputs.seed)
        x_sub = inputs.x[self.rows_idx.to(device)]
        self.reference = oracle.exact(x_sub, inputs.weight, inputs.bias)
        self._int_products: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _int_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The exact product of int8 operands on the checked rows (float64 is exact here).
        Backends that quantize alike share operands: each distinct pair is multiplied once (at
        175B shapes one such product costs a 2-core CPU ten seconds)."""
        for a0, b0, ref in self._int_products:
            same_shapes = a0.shape == a.shape and b0.shape == b.shape
            if same_shapes and torch.equal(a0, a) and torch.equal(b0, b):
                return ref
        ref = oracle.int_product(a[self.rows_idx.to(a.device)], b)
        self._int_products.append((a, b, ref))
        return ref

    def errors(self, runner: Runner, y: torch.Tensor) -> tuple[float, float]:
        """(relative Frobenius error, max abs error) of the runner's output ``y``."""
        # int8_raw: the exact integer product of the same operands
        ref = self._int_product(*runner.operands) if runner.returns_int32 else self.reference
        got = y[self.rows_idx.to(y.device)].cpu()
        return oracle.rel_frobenius(got, ref.cpu()), oracle.max_abs_error(got, ref.cpu())


def _prepare_row(
    row, backend, inputs, setup, inputs_bytes: int, warm_s: float | None, runner: Runner | None
):
    """Build the row's runner (unless an earlier round's ``runner`` is given) and make its first
    call (in round 0 checked against the oracle); with ``warm_s``, skip the first call and
    count that much warm-up as done."""
    opts, engine, check, kept_rows, device = setup
    if device.type == "cuda":
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    if runner is None:
        runner = backend.runner(
            row.method, inputs.x, inputs.weight, inputs.bias, opts.cfg, kept_rows=kept_rows
        )
    deferred = None
    if warm_s is None:
        y, warm_s = engine.first_call(runner.run)
        if check is not None:
            row.rel_error, row.max_abs_error = check.errors(runner, y)
        del y
    else:
        deferred = check
    row.outlier_cols = runner.outlier_cols
    row.weight_bytes = runner.weight_bytes
    row.variant, row.compile_s = runner.variant, runner.compile_seconds
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - before
        row.peak_mem_bytes = int(inputs_bytes + peak)
    return _Prepared(row, runner, warm_s, deferred)


def _measure_prepared(ready: list[_Prepared], engine, cell: _Cell, seed: int, device) -> None:
    """Time the cell's rows in cycles around the baseline; fill the rows."""
    base = next((p for p in ready if p.key == BASELINE), None)
    others = [p for p in ready if p is not base]
    try:
        meas = engine.measure_cell(
            {p.key: p.runner.run for p in others},
            baseline=base.runner.run if base else None,
            warmed_s={p.key: p.warmed_s for p in others},
            baseline_warmed_s=base.warmed_s if base else 0.0,
            seed=seed,
            first_outputs={p.key: p.output_check() for p in others if p.check is not None},
            baseline_first_output=base.output_check() if base and base.check else None,
        )
    except Exception as exc:  # noqa: BLE001 - the baseline failed: so does every pairing
        for p in ready:
            _fail(p.row, f"baseline call failed: {error_text(exc)}", device)
        return
    if base is not None and base.row.median_ms is None:  # its first group's samples
        _fill_row(base.row, meas.baseline, cell, is_baseline=True)
        cell.baseline_error = base.row.rel_error
        base.row.baseline_rel_error = cell.baseline_error
    for p in others:
        if p.key in meas.failed:
            _fail(p.row, meas.failed[p.key], device)
        else:
            _fill_row(p.row, meas.rows[p.key], cell, is_baseline=False)
    for p in others:
        p.row.baseline_rel_error = cell.baseline_error
        if p.row.status == "ok" and p.row.method == "int8_raw" and p.row.stages_ms:
            p.row.stages_ms["int8_matmul"] = p.row.median_ms  # its whole call is that stage


def _time_stages(p: _Prepared, engine, cell: _Cell) -> None:
    """Time the row's stages, each on its own, right after its first call (round 0). The GEMM
    stage is timed once per backend, with its ``int8_raw`` row (the same GEMM)."""
    known: dict[str, float] = {}
    if p.row.backend in cell.gemm_stage_ms:
        known["int8_matmul"] = cell.gemm_stage_ms[p.row.backend]
    try:
        p.row.stages_ms = dict(engine.time_stages(p.runner.stages, known))
    except Exception as exc:  # noqa: BLE001 - stages are a breakdown: their failure is noted
        p.row.reason = f"stage timing failed: {error_text(exc)}"[:500]
    if p.row.method == "int8_raw" and "int8_matmul" in p.row.stages_ms:
        cell.gemm_stage_ms[p.row.backend] = p.row.stages_ms["int8_matmul"]


def _fill_row(row: ResultRow, meas: RowMeasurement, cell: _Cell, is_baseline: bool) -> None:
    st = stats(meas.row_ms)
    row.median_ms, row.iqr_ms, row.min_ms, row.mean_ms = (
        st.median_ms,
        st.iqr_ms,
        st.min_ms,
        st.mean_ms,
    )
    row.rel_spread, row.samples, row.raw_ms = st.rel_spread, st.samples, list(meas.row_ms)
    row.throttled_samples = meas.throttled
    row.tops = row.flops / (row.median_ms / 1e3) / 1e12
    if meas.paired:
        ratios = meas.ratios
        rs = stats(ratios)
        row.paired, row.baseline_raw_ms = True, list(meas.baseline_ms)
        row.baseline_ms = stats(meas.baseline_ms).median_ms
        row.speedup = row.paired_speedup = rs.median_ms
        row.paired_rel_spread = rs.rel_spread
        interval = median_interval(ratios)
        if interval is not None:
            row.speedup_lo, row.speedup_hi = interval
    elif is_baseline:
        row.baseline_ms, row.speedup = row.median_ms, 1.0


def _stamp(row: ResultRow) -> ResultRow:
    row.timestamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return row


def load_user_activations(opts: RunOptions) -> torch.Tensor | None:
    return load_activation_file(opts.activations) if opts.activations else None


#: A row whose pooled interval is wider than this many times the run's ``ci_target`` seldom
#: narrows to it in an extra round. Three decode sweeps on a 2-core VM (768-4096 x tokens 1, 8,
#: 32; 3 rounds + 2 extra): of the rows that got extra rounds, 26 of 107 within twice the target
#: reached it, 4 of 120 beyond twice did (their intervals narrowed by about 15%).
WITHIN_REACH = 2.0


def followup_items(
    rows: list[dict],
    env: dict,
    items: list[WorkItem],
    next_round: int,
    budget_s: float | None = None,
    row_budget_s: float = 0.0,
) -> list[WorkItem]:
    """Work items of one extra round for the cells whose pooled rows are still uncertain: a
    speedup interval wider than the run's ``ci_target``, or an ordering contradiction (which
    more pairs either resolve or confirm). Each item measures only those rows (and the
    baseline they pair with). With ``budget_s``, the rows within reach of the target (at most
    :data:`WITHIN_REACH` times it, or in an ordering contradiction) come first, then the
    others, each tier's cheapest cells first, and the round stops where their estimated cost
    would exceed it: more pairs go where they can settle a row. A row is estimated as the
    engine times it: for its budget per round (``row_budget_s``, an uncertain row seldom meets
    its interval target sooner), and at least one pair (its time and its baseline's, measured
    so far)."""
    from kernelbench.view import pooled_rows

    target = float(env.get("ci_target") or 0.0)
    tiers: tuple[dict[tuple, set], dict[tuple, set]] = ({}, {})  # within reach, the others
    costs: tuple[dict[tuple, float], dict[tuple, float]] = ({}, {})
    for row in pooled_rows(rows, env):
        if row.layer not in {i.layer for i in items}:
            continue  # a per-block row: its layers are measured, not it
        if (row.backend, row.method) == FP32:
            continue  # measured in round 0 only (FP32_ROUNDS)
        ordering = "ordering" in row.suspect_reason
        if row.status == "ok" and (row.ci_wide or ordering):
            width = rel_halfwidth(row.speedup, row.speedup_lo, row.speedup_hi)
            tier = 0 if ordering or width <= WITHIN_REACH * target else 1
            cell = (row.d_model, row.layer, row.tokens)
            tiers[tier].setdefault(cell, set()).add((row.backend, row.method))
            pair_s = ((row.median_ms or 0.0) + (row.baseline_ms or 0.0)) / 1e3
            costs[tier][cell] = costs[tier].get(cell, 0.0) + max(row_budget_s, pair_s)
    cells = {(i.size.d_model, i.layer, i.tokens): i for i in items}
    chosen: dict[tuple, set[tuple[str, str]]] = {}
    spent = 0.0
    for uncertain, cost in zip(tiers, costs, strict=True):
        for c in sorted(uncertain, key=cost.__getitem__):
            if c not in cells:
                continue
            if budget_s is not None and spent + cost[c] > budget_s:
                break
            spent += cost[c]
            chosen.setdefault(c, set()).update(uncertain[c])
    return [
        WorkItem(cells[c].size, c[1], c[2], cells[c].dist, next_round, frozenset(pairs))
        for c, pairs in chosen.items()
    ]
