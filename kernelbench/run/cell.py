"""One cell of the sweep: inputs -> method runners -> timing + accuracy -> rows.

:func:`kernelbench.run.plan.plan` expands a case and the user's choices into work items (one
per cell and round: size, layer, tokens); :func:`measure_cell` draws the cell's inputs once and
measures every (backend, method) pair on them, yielding the cell's :class:`ResultRow` s once it is
measured. The caller (an executor, the CLI) writes each row as it arrives. Nothing here knows how
rows are stored or shown; timing is :mod:`kernelbench.measure.engine`'s.

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
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from kernelbench import oracle
from kernelbench.backends import all_backends, freshness, residency
from kernelbench.backends.base import Runner, sharing_weights, sixteen_bit_dtype
from kernelbench.backends.plugins import origin_of
from kernelbench.core import BASELINE, FP32, SkipKind, work_bytes, work_flops
from kernelbench.kernels import cpu_ext
from kernelbench.measure.engine import MeasurementEngine, RowMeasurement, error_text
from kernelbench.measure.timing import available_after_release, available_bytes
from kernelbench.quant import Problem, outlier_columns
from kernelbench.results.schema import USAGE_FIELDS, ResultRow
from kernelbench.run.cases import Case, layer_inputs, make_inputs
from kernelbench.run.env import device_class
from kernelbench.run.plan import (
    CallEstimator,
    RunOptions,
    WorkItem,
    fp32_in_round,
    max_call_s,
    method_pairs,
    resolve_device,
)
from kernelbench.run.prepared import (
    PreparedCell,
    PreparedCells,
    PreparedLayer,
    memory_in_use,
)
from kernelbench.statistics import median_interval, stats


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


@dataclass
class CellPlan:
    """What one cell will measure in one round, decided before any input is drawn: its rows in
    measuring order (the baseline first; rows that cannot run already skipped, with the
    reason)."""

    item: WorkItem
    device: torch.device
    dtype: torch.dtype
    m: int
    k: int
    n: int
    flops: float
    rows: list[ResultRow]
    #: the baseline row is new to this run (else it is timed again only for the others to
    #: pair with, and not written)
    write_baseline: bool

    def written(self) -> list[ResultRow]:
        """The rows the cell gives back once measured."""
        return [r for r in self.rows if (r.backend, r.method) != BASELINE or self.write_baseline]


def plan_cell(
    item: WorkItem,
    case: Case,
    opts: RunOptions,
    estimator: CallEstimator,
    done: set[tuple] | None = None,
) -> CellPlan | None:
    """The rows of ``item`` not in ``done`` (keys and rounds written already), each skipped
    with its reason when its backend cannot run it here or its call is estimated over the
    run's ``max_call_s``; ``None`` when nothing is left to measure."""
    device = resolve_device(opts.device)
    dclass = device_class(device)
    dtype = sixteen_bit_dtype(device)
    k, n = case.shape(item.layer, item.size.d_model)
    m = item.tokens
    flops = work_flops(m, k, n)
    pairs = method_pairs(opts)
    at_peak_s = flops / (opts.fp32_peak_tops * 1e12) if opts.fp32_peak_tops else None
    if not fp32_in_round(item.round, estimator.estimate(FP32, flops, m), at_peak_s):
        pairs = [p for p in pairs if p != FP32]
    if item.only is not None:
        pairs = [p for p in pairs if p in item.only or p == BASELINE]
    done = done or set()
    rows = {p: base_row(item, case, *p, device, dclass) for p in pairs}
    todo = [p for p in pairs if (rows[p].key(), item.round) not in done]
    if not todo:
        return None
    write_baseline = BASELINE in todo
    if BASELINE in pairs and not write_baseline:
        todo.insert(0, BASELINE)  # the later rows pair with it: time it again, do not write it
    for backend_name, method in todo:
        row = rows[(backend_name, method)]
        row.round, row.cache = item.round, opts.cache
        row.flops, row.bytes = flops, work_bytes(method, m, k, n)
        skip = _skip_reason(backend_name, method, device, dtype, m, k, n, flops, opts, estimator)
        if skip is not None:
            row.status, (row.skip_kind, row.reason) = "skipped", skip
    planned = [rows[p] for p in todo]
    return CellPlan(item, device, dtype, m, k, n, flops, planned, write_baseline)


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
    plan = plan_cell(item, case, opts, estimator, done)
    if plan is not None:
        _measure_plan(plan, case, opts, estimator, activations, prepared)
        for row in plan.written():
            yield _stamp(row)


def _measure_plan(
    plan: CellPlan,
    case: Case,
    opts: RunOptions,
    estimator: CallEstimator,
    activations: torch.Tensor | None,
    prepared: PreparedCells | None,
) -> None:
    """Draw the cell's inputs (or take them from ``prepared``), build and check each planned
    row's runner, time them in cycles around the baseline, and fill the plan's rows in place."""
    item, device, dtype = plan.item, plan.device, plan.dtype
    m, k, n, flops = plan.m, plan.k, plan.n, plan.flops
    todo = [(r.backend, r.method) for r in plan.rows if r.status != "skipped"]
    layer_key = (item.size.d_model, item.layer, item.dist)
    cell_key = (layer_key, m)
    kept = prepared.get(cell_key) if prepared is not None else None
    weight_bytes = k * n * dtype.itemsize
    reserve = RESERVE_PER_WEIGHT_BYTE * weight_bytes + RESERVE_BYTES
    if prepared is not None:
        # another layer keeps only what its kept cells hold, and a kept cell's timing needs
        # room too (outputs and the methods' temporaries, gigabytes at 175B): what other
        # layers' kept cells hold must never leave it short
        prepared.release_layer(unless=layer_key)
        whole = kept is not None and all(p in kept.runners for p in todo)
        # a later round (no oracle, no fp32 copy) that builds on a held layer's prepared
        # weights needs only its timing's room too; making room for the whole working set
        # gave the heap back to the system before every such cell, to be faulted in again
        held = prepared.layer(layer_key)
        on_held = (
            item.round > 0
            and held is not None
            and len(held.shared) > 0
            and (kept is None or kept.inputs.weight is held.inputs.weight)
        )
        needed = reserve if whole or on_held else WORKING_SET_PER_WEIGHT_BYTE * weight_bytes
        prepared.make_room(needed, keep=cell_key, keep_layer=layer_key)
    # before the memory in use is read: a cold engine's eviction buffer is not the cell's
    engine = MeasurementEngine(
        device,
        opts.timer,
        opts.stage_timer,
        cache=opts.cache,
        link_probe=link_probe(device),
        core_probe=core_probe(device),
    )
    in_use = memory_in_use(device)
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
        kept = PreparedCell(inputs, layer().kept_rows, layer_key=layer_key)
    inputs, kept_rows = kept.inputs, kept.kept_rows
    check = _AccuracyCheck(inputs, opts, device) if item.round == 0 else None
    cell = _Cell(baseline_error=None)
    inputs_bytes = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    ready: list[_Prepared] = []  # built, waiting for the cycles
    reused_layer: bool | None = None
    measured: list[ResultRow] = []  # rows timed in an earlier group (their runners freed)
    for row in plan.rows:
        backend_name, method = row.backend, row.method
        row.seed, row.planted_outlier_cols = inputs.seed, inputs.planted_outliers
        if row.status == "skipped":
            continue
        built = kept.runners.get((backend_name, method))  # a kept runner needs no room
        others_ready = any(p.key != BASELINE for p in ready)
        if built is None and others_ready and _memory_short(reserve, prepared, cell_key):
            # the cell's runners do not all fit: time those built so far, free them, go on
            _measure_prepared(ready, engine, cell, inputs, check, item.round, device)
            measured += [p.row for p in ready if p.key != BASELINE]
            ready = [p for p in ready if p.key == BASELINE]  # the others' runners go here
            prepared = None  # a cell that does not fit in memory is not kept
        try:
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
            del one  # held by ``ready`` alone: a group timed and dropped frees its runners
        except Exception as exc:  # noqa: BLE001 - a failing row is recorded, the sweep goes on
            _fail(row, error_text(exc), device)
    _measure_prepared(ready, engine, cell, inputs, check, item.round, device)
    for r in measured + [p.row for p in ready]:
        if r.status == "ok":
            estimator.record((r.backend, r.method), flops, r.median_ms / 1e3, item.size.d_model, m)
    for p in ready if prepared is not None else ():
        if p.row.status == "ok" and p.key not in kept.runners and p.key != FP32:
            kept.runners[p.key] = p.runner
    del ready, measured, check
    layers.clear()
    if prepared is not None:
        now = memory_in_use(device)
        grown = now - in_use if now is not None and in_use is not None else 0
        # at least what it declares (the allocator may have reused memory freed before),
        # unless its weights were prepared by an earlier cell of its layer (charged there)
        declared = sum(r.weight_bytes for r in kept.runners.values())
        floor = 0 if reused_layer else declared + inputs.x.nbytes + inputs.weight.nbytes
        kept.nbytes = max(kept.nbytes + grown, floor)
        prepared.offer(cell_key, kept)
    del kept


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
#: round 0 adds the float64 oracle. Measured at 175B shapes on the CPU (round 0, a run of that
#: cell alone): 16.4 GB over the process's own for a 1.2 GB weight, 13.6 per byte; the rest is
#: margin. Cells kept from earlier rounds are let go when less than this is free.
WORKING_SET_PER_WEIGHT_BYTE = 16

#: While the rows of a cell are built, at least this much memory stays free (per byte of the
#: 16-bit weight, plus RESERVE_BYTES): room for the next runner's build. When less is free, the
#: rows built so far are timed (in cycles with the baseline) and freed before the rest are
#: built, so a cell too large to hold every runner at once is measured in groups. A cell whose
#: runners were all kept from an earlier round needs as much free for its timing: at 175B
#: shapes on the CPU its calls' outputs and temporaries took 4 GB over a 1.2 GB weight.
RESERVE_PER_WEIGHT_BYTE = 4
RESERVE_BYTES = 1 << 30


def _memory_short(reserve: int, prepared: PreparedCells | None, cell_key) -> bool:
    """True when less than ``reserve`` is free even after letting kept cells go."""
    if prepared is not None:
        prepared.make_room(reserve, keep=cell_key)
    free = available_after_release(reserve, available_bytes)
    return free is not None and free < reserve


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
    #: cold CPU caches: flushes the lines of the tensors ``runner.run`` reaches before each
    #: timed call (:mod:`kernelbench.backends.residency`)
    evict_own: Callable[[], None] | None = None

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
        self._inputs, self._device = inputs, device
        self._reference: torch.Tensor | None = None
        self._int_products: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    @property
    def reference(self) -> torch.Tensor:
        """The exact layer on the checked rows, for the inputs' current values."""
        if self._reference is None:
            x_sub = self._inputs.x[self.rows_idx.to(self._device)]
            self._reference = oracle.exact(x_sub, self._inputs.weight, self._inputs.bias)
        return self._reference

    def inputs_changed(self) -> None:
        """The activations (and int8 operands) were redrawn: the references are recomputed
        when next needed."""
        self._reference = None
        self._int_products.clear()

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
        problem = Problem(row.method, inputs.x, inputs.weight, inputs.bias, opts.cfg, kept_rows)
        started = time.perf_counter()
        runner = backend.build(problem)
        row.build_s = round(time.perf_counter() - started, 4)
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
    evict_own = None
    if opts.cache == "cold" and device.type == "cpu" and cpu_ext.available():
        evict_own = residency.call_eviction(runner.run)
        row.evicted_bytes = evict_own.bytes
    return _Prepared(row, runner, warm_s, deferred, evict_own)


def _measure_prepared(
    ready: list[_Prepared], engine, cell: _Cell, inputs, check, round_: int, device
) -> None:
    """Time the cell's rows in cycles around the baseline; fill the rows. The activations are
    redrawn in place first, and each row's first output in the cycles must follow them."""
    base = next((p for p in ready if p.key == BASELINE), None)
    others = [p for p in ready if p is not base]
    try:
        hooks, restore = _follow_hooks(ready, inputs, check, round_)
    except Exception as exc:  # noqa: BLE001 - the inputs stay as drawn; the cell's rows fail
        for p in ready:
            _fail(p.row, f"inputs could not be redrawn in place: {error_text(exc)}", device)
        return
    try:
        meas = engine.measure_cell(
            {p.key: p.runner.run for p in others},
            baseline=base.runner.run if base else None,
            warmed_s={p.key: p.warmed_s for p in others},
            baseline_warmed_s=base.warmed_s if base else 0.0,
            seed=inputs.seed,
            first_outputs={p.key: hooks[p.key] for p in others if p.key in hooks},
            baseline_first_output=hooks.get(BASELINE) if base else None,
            evict_own={p.key: p.evict_own for p in others if p.evict_own is not None},
            baseline_evict_own=base.evict_own if base else None,
        )
    except Exception as exc:  # noqa: BLE001 - the baseline failed: so does every pairing
        for p in ready:
            _fail(p.row, f"baseline call failed: {error_text(exc)}", device)
        return
    finally:
        restore()
        if check is not None:
            check.inputs_changed()
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


def _follow_hooks(ready: list[_Prepared], inputs, check, round_: int):
    """Redraw the cell's activations in place (:mod:`kernelbench.backends.freshness`) and
    return each row's first-output hook (its deferred accuracy check, on the new values, then
    its spot check that the output follows them: a stale output fails the row) and what
    restores the activations after the cycles (so every other check sees the cell's drawn
    values)."""
    if not ready:
        return {}, lambda: None
    gen = torch.Generator().manual_seed(inputs.seed * 1009 + round_)
    int_ops = {p.key: p.runner.operands for p in ready if p.runner.returns_int32}
    spots, restore = freshness.redraw_and_check(
        inputs.x, inputs.weight, inputs.bias, [p.key for p in ready], int_ops, gen
    )
    if check is not None:
        check.inputs_changed()
    hooks = {}
    for p in ready:
        accuracy = p.output_check() if p.check is not None else None
        spot = spots.get(p.key)
        if accuracy is None and spot is None:
            continue

        def hook(y, accuracy=accuracy, spot=spot) -> None:
            if spot is not None:
                spot.verify(y)
            if accuracy is not None:
                accuracy(y)

        hooks[p.key] = hook
    return hooks, restore


def _time_stages(p: _Prepared, engine, cell: _Cell) -> None:
    """Time the row's stages, each on its own, right after its first call (round 0). The GEMM
    stage is timed once per backend, with its ``int8_raw`` row (the same GEMM), and given to the
    rows that have that stage (not to a row without an int8 GEMM, such as ``fp8_e4m3``)."""
    known: dict[str, float] = {}
    if p.row.backend in cell.gemm_stage_ms and "int8_matmul" in p.runner.stages:
        known["int8_matmul"] = cell.gemm_stage_ms[p.row.backend]
    evictions = {}
    if p.evict_own is not None:  # cold CPU caches: each stage flushes its own tensors too
        evictions = {name: residency.call_eviction(fn) for name, fn in p.runner.stages.items()}
    try:
        p.row.stages_ms = dict(engine.time_stages(p.runner.stages, known, evictions))
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
    _fill_usage(row, meas)
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


def _cpu_reading(device: torch.device, read: Callable[[], float | None]):
    """``read``, a reading a cold CPU timer takes before each call (``None``: not on the CPU,
    or the extension is not built)."""
    if device.type != "cpu" or not cpu_ext.available():
        return None
    return read


def link_probe(device: torch.device):
    """The reading of where the threads run (:func:`_cpu_reading`)."""
    return _cpu_reading(device, cpu_ext.thread_round_trip_ns)


def core_probe(device: torch.device):
    """The reading of how fast the cores run (:func:`_cpu_reading`)."""
    return _cpu_reading(device, cpu_ext.core_probe_ns)


def _fill_usage(row: ResultRow, meas: RowMeasurement) -> None:
    """Per sample, the faults and context switches its call took and the bus bandwidth, the
    threads' link and the cores' probe read before it, and how long the timer waited for fast
    cores first; the cell's steal share."""
    if len(meas.usage) == len(meas.row_ms):
        for name in USAGE_FIELDS:
            setattr(row, name, meas.usage_of(name))
    if len(meas.bus_gbps) == len(meas.row_ms):
        row.bus_gbps = [round(v, 2) for v in meas.bus_gbps]
    if len(meas.link_ns) == len(meas.row_ms):
        row.link_ns = [round(v, 1) for v in meas.link_ns]
    if len(meas.core_ns) == len(meas.row_ms):
        row.core_ns = [round(v, 1) for v in meas.core_ns]
    if len(meas.core_wait_ms) == len(meas.row_ms):
        row.core_wait_ms = [round(v, 3) for v in meas.core_wait_ms]
    row.steal_share = meas.steal_share


def _stamp(row: ResultRow) -> ResultRow:
    row.timestamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return row
