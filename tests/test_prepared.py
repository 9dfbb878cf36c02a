"""Cells kept prepared between rounds: the memory budget's policy, and a later round reusing
the runners an earlier round built (and building them again when nothing was kept)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest
import torch

from kernelbench.backends import all_backends
from kernelbench.core import work_flops
from kernelbench.measure.engine import MeasurementEngine, TimerSettings
from kernelbench.results.schema import ResultsWriter, read_rows
from kernelbench.run.cases import CellInputs, load_case
from kernelbench.run.cell import measure_cell
from kernelbench.run.executors import get_executor
from kernelbench.run.plan import (
    FP32_REPEAT_MAX_CALL_S,
    CallEstimator,
    RunOptions,
    fp32_in_round,
    plan,
)
from kernelbench.run.prepared import PreparedCell, PreparedCells, default_limit_bytes


def tiny_opts(methods: tuple[str, ...], rounds: int) -> RunOptions:
    """One small cell (d=768, 8 tokens) of torch and custom, timed briefly."""
    return RunOptions(
        sizes=(768,),
        tokens=(8,),
        backends=("torch", "custom"),
        methods=methods,
        timer=TimerSettings(budget_s=0.02, warmup_s=0.0, min_samples=1),
        stage_timer=TimerSettings(budget_s=0.01, warmup_s=0.0, min_samples=1),
        error_rows=8,
        rounds=rounds,
        extra_rounds=0,
    )


def _recorded_calls(monkeypatch, owner, name: str) -> list[tuple]:
    """Calls of ``owner.name`` (still made) from now on, each as its positional arguments."""
    calls: list[tuple] = []
    real = getattr(owner, name)

    def recording(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls


def cell(nbytes: int) -> PreparedCell:
    t = torch.ones(1)
    return PreparedCell(CellInputs(t, t, t, seed=1, planted_outliers=0), t, nbytes=nbytes)


def test_cells_are_kept_within_the_limit_and_large_ones_push_out_smaller_ones():
    cache = PreparedCells(100)
    assert cache.offer("a", cell(30)) and cache.offer("b", cell(40))
    assert not cache.offer("huge", cell(101)) and cache.get("huge") is None
    assert cache.offer("c", cell(60))  # pushes out "a" (least recently used, smaller)...
    assert cache.get("a") is None and cache.get("b") is not None  # ... and only as much as needed
    assert cache.nbytes == 100
    assert not cache.offer("d", cell(50))  # only smaller cells may go, and they do not free 50
    assert cache.get("b") is not None and cache.get("c") is not None
    assert not PreparedCells(0).offer("a", cell(1))
    assert default_limit_bytes() > 0


def test_cells_are_let_go_while_memory_is_short_never_the_one_about_to_run():
    cache = PreparedCells(100)
    for key in ("a", "b", "c"):
        cache.offer(key, cell(10))
    cache.get("a")  # least recently used: "b", then "c", then "a"
    free = iter([5, 5, 7, 7, 50])
    released: list[int] = []
    cache.make_room(20, keep="b", available=lambda: next(free), release=lambda: released.append(1))
    # the heap's free pages were given back before any cell went, and after each one let go
    # while still short (what it held may sit in the heap)
    assert released == [1, 1]
    assert len(cache) == 1 and cache.get("b") is not None  # "c" and "a" went first
    free = iter([5, 50])  # giving back the heap's free pages was enough
    cache.make_room(20, keep="b", available=lambda: next(free), release=lambda: None)
    assert len(cache) == 1
    cache.make_room(20, keep="b", available=lambda: None)  # unknown: nothing to judge by
    assert len(cache) == 1
    cache.make_room(20, keep="b", available=lambda: 0)
    assert len(cache) == 1  # never the one about to run: its caller holds it anyway


def test_a_later_round_reuses_the_runners_an_earlier_round_kept(monkeypatch):
    case = load_case("gpt3")
    opts = tiny_opts(methods=("fp16", "int8_raw", "llm_int8"), rounds=2)
    builds: list[tuple[str, str]] = []
    backends = dict(all_backends())
    for name in ("torch", "custom"):
        real = type(backends[name]).runner

        def counting(self, method, *a, _real=real, **kw):
            builds.append((self.name, method))
            return _real(self, method, *a, **kw)

        monkeypatch.setattr(type(backends[name]), "runner", counting)
    first_calls = _recorded_calls(monkeypatch, MeasurementEngine, "first_call")
    from kernelbench.run import cell as harness

    draws = _recorded_calls(monkeypatch, harness, "layer_inputs")
    room = _recorded_calls(monkeypatch, PreparedCells, "make_room")
    first, later = plan(case, opts)
    for limit, built_again in ((1 << 40, 0), (0, 5)):
        cache, estimator = PreparedCells(limit), CallEstimator()
        list(measure_cell(first, case, opts, estimator, prepared=cache))
        assert len(builds) == len(first_calls) == 5 and len(draws) == 1
        builds.clear()
        first_calls.clear()
        draws.clear()
        room.clear()
        rows = list(measure_cell(later, case, opts, estimator, prepared=cache))
        # a kept runner has had its first call; a rebuilt one (milliseconds long) gets one;
        # a kept cell draws no inputs (custom fp16, skipped, has no runner)
        assert len(builds) == len(first_calls) == built_again
        weight_bytes = 768 * 3072 * 2
        working_set = harness.WORKING_SET_PER_WEIGHT_BYTE * weight_bytes
        timing = harness.RESERVE_PER_WEIGHT_BYTE * weight_bytes + harness.RESERVE_BYTES
        if built_again:
            assert [c[1] for c in room].count(working_set) == 1
        else:  # nor does it look for room to build a runner it has, only for its timing
            assert [c[1] for c in room] == [timing]
        assert len(draws) == (1 if built_again else 0)
        draws.clear()
        first_calls.clear()
        measured = [r for r in rows if r.status != "skipped"]
        assert len(measured) == 5 and all(r.status == "ok" and r.samples >= 1 for r in measured)
        assert {r.outlier_cols for r in rows if r.method == "llm_int8"} == {2}
        builds.clear()


def test_the_local_executor_keeps_cells_for_its_next_run(monkeypatch):
    """A sweep's extra rounds are a later ``run`` of the same executor: they reuse the runners
    the rounds before kept, and the call-time estimates (it rebuilt every runner there)."""
    from kernelbench.run.executors import LocalExecutor

    case = load_case("gpt3")
    opts = replace(tiny_opts(methods=("fp16", "int8_raw"), rounds=2), keep_prepared_bytes=1 << 40)
    builds = _recorded_calls(monkeypatch, type(all_backends()["custom"]), "runner")
    first, later = plan(case, opts)
    executor = LocalExecutor()
    built = [row for _, row in executor.run([first], case, opts, set())]
    assert len(builds) == 1
    estimates = dict(executor.estimator.ops_per_s)
    rows = [row for _, row in executor.run([later], case, opts, set())]
    assert len(builds) == 1  # custom's runner came from the first run
    assert all(r.status in ("ok", "skipped") for r in rows)
    # each row says whether its round built its runner (and how long that took) or kept one
    measured = [r for r in built if r.status == "ok"]
    assert measured and all(r.build_s is not None and r.build_s >= 0 for r in measured)
    assert all(r.build_s is None for r in rows if r.status == "ok")
    assert estimates and set(estimates) <= set(executor.estimator.ops_per_s)


def test_a_cell_whose_runners_do_not_fit_is_timed_in_groups(monkeypatch):
    from kernelbench.run import cell as harness

    case = load_case("gpt3")
    opts = tiny_opts(methods=("fp16", "int8_raw", "vectorwise", "llm_int8"), rounds=1)
    groups: list[list] = []
    timed_before: list[weakref.ref] = []  # the calls of the groups timed so far
    alive: list[int] = []  # how many of those each group found still alive
    real = MeasurementEngine.measure_cell

    def spy(self, calls, **kw):
        gc.collect()
        alive.append(sum(ref() is not None for ref in timed_before))
        timed_before.extend(weakref.ref(call) for call in calls.values())
        groups.append(sorted(calls))
        return real(self, calls, **kw)

    monkeypatch.setattr(MeasurementEngine, "measure_cell", spy)
    monkeypatch.setattr(harness, "available_bytes", lambda: 0)  # never room for two
    cache = PreparedCells(1 << 40)
    (item,) = plan(case, opts)
    rows = [
        r
        for r in measure_cell(item, case, opts, CallEstimator(), prepared=cache)
        if r.status != "skipped"
    ]
    assert len(groups) == 5 and all(len(g) == 1 for g in groups)  # one row each, with the baseline
    assert alive == [0] * 5  # a group's runners are freed before the next is built
    assert all(r.status == "ok" for r in rows) and len(rows) == 6
    assert all(r.paired for r in rows if r.method != "fp16")
    base = next(r for r in rows if r.method == "fp16")
    assert base.samples >= 1 and base.baseline_rel_error == base.rel_error
    assert len(cache) == 0  # a cell that did not fit is not kept


def _count_prepares(monkeypatch, names=("torch", "custom")) -> list[tuple[str, object]]:
    prepares: list[tuple[str, object]] = []
    for name in names:
        cls = type(all_backends()[name])
        real = cls.prepare_weight

        def counting(self, weight, bias, cfg, kept_rows=None, _real=real):
            prepares.append((self.name, cfg.decomposition))
            return _real(self, weight, bias, cfg, kept_rows)

        monkeypatch.setattr(cls, "prepare_weight", counting)
    return prepares


def test_the_token_counts_of_a_layer_share_its_weights_and_prepare_them_once(monkeypatch):
    case = load_case("gpt3")
    opts = replace(tiny_opts(("fp16", "int8_raw", "vectorwise", "llm_int8"), 1), tokens=(8, 16))
    prepares = _count_prepares(monkeypatch)
    from kernelbench import quant

    quantized = _recorded_calls(monkeypatch, quant, "prepare_weight")
    items = plan(case, opts)
    assert [(i.size.d_model, i.tokens) for i in items] == [(768, 8), (768, 16)]
    cache, estimator = PreparedCells(1 << 40), CallEstimator()
    rows = [r for i in items for r in measure_cell(i, case, opts, estimator, prepared=cache)]
    # custom: int8_raw and vectorwise quantize alike (one preparation), llm_int8 keeps outlier
    # weights (another); torch: int8_raw and llm_int8. Once for both token counts.
    assert sorted(prepares) == [
        ("custom", False),
        ("custom", True),
        ("torch", False),
        ("torch", True),
    ]
    # the reference quantization under them, once per config for both backends
    assert len(quantized) == 2
    measured = [r for r in rows if r.status != "skipped"]
    assert all(r.status == "ok" for r in measured) and len(measured) == 12
    # the weights are charged to the cell that prepared them, not again to the next one
    layer_key = (768, "ffn1", "outliers")
    assert cache.get((layer_key, 16)).nbytes < cache.get((layer_key, 8)).nbytes / 2
    assert len({r.seed for r in measured}) == 1  # one layer: one seed
    for r in measured:
        assert r.rel_error is not None and r.rel_error < 0.05
    # without a cache that holds layers, each cell prepares its own (and still shares within)
    prepares.clear()
    for i in items:
        list(measure_cell(i, case, opts, CallEstimator(), prepared=PreparedCells(0)))
    assert len(prepares) == 8


def test_a_long_row_is_checked_on_its_first_call_in_the_cycles(monkeypatch):
    """Round 0: a row whose call is estimated long gets no separate first call; its first
    call in the cycles is checked against the oracle, as a first call would be."""
    case = load_case("gpt3")
    opts = tiny_opts(("fp16", "int8_raw", "llm_int8"), 1)
    (item,) = plan(case, opts)
    first_calls = _recorded_calls(monkeypatch, MeasurementEngine, "first_call")
    checked = [r for r in measure_cell(item, case, opts, CallEstimator()) if r.status == "ok"]
    assert len(first_calls) == 5
    first_calls.clear()
    estimator = CallEstimator()  # every call estimated at 5 s
    for backend, method in (
        ("torch", "fp16"),
        ("torch", "int8_raw"),
        ("torch", "llm_int8"),
        ("custom", "int8_raw"),
        ("custom", "llm_int8"),
    ):
        estimator.record((backend, method), work_flops(item.tokens, 768, 3072), 5.0, 512, 8)
    deferred = [r for r in measure_cell(item, case, opts, estimator) if r.status == "ok"]
    assert not first_calls and len(deferred) == len(checked) == 5
    for a, b in zip(checked, deferred, strict=True):
        assert (a.backend, a.method) == (b.backend, b.method)
        # checked on the activations as redrawn before the cycles (kernelbench.backends.freshness):
        # other values of the same magnitudes, so an error of the same size, not the same bits
        assert b.rel_error is not None and b.max_abs_error is not None
        assert b.rel_error == pytest.approx(a.rel_error, rel=0.25, abs=1e-12)
    assert all(r.paired for r in deferred if r.method != "fp16")
    assert next(r for r in deferred if r.method == "int8_raw").rel_error == 0.0


def test_fp32_is_measured_again_in_later_rounds_only_where_its_call_is_short():
    """A one-round fp32 row's interval covers that round only (two runs then disagreed on
    most fp32 cells): it is measured in every round where cheap, in round 0 only where its
    call is estimated long."""
    case = load_case("gpt3")
    opts = tiny_opts(("fp16", "fp32", "int8_raw"), 2)
    first, later = plan(case, opts)
    fp32 = ("torch", "fp32")
    cache, estimator = PreparedCells(1 << 40), CallEstimator()
    r0 = measure_cell(first, case, opts, estimator, prepared=cache)
    r0 = {(r.backend, r.method) for r in r0 if r.status == "ok"}
    flops = work_flops(later.tokens, *case.shape(later.layer, later.size.d_model))
    assert estimator.estimate(fp32, flops, later.tokens)[0] < FP32_REPEAT_MAX_CALL_S
    r1 = list(measure_cell(later, case, opts, estimator, prepared=cache))
    assert fp32 in r0 and fp32 in {(r.backend, r.method) for r in r1 if r.status == "ok"}
    assert next(r for r in r1 if (r.backend, r.method) == fp32).round == 1
    # this run measured the call at the limit: round 0 only
    estimator.record(fp32, flops, FP32_REPEAT_MAX_CALL_S, later.size.d_model, later.tokens)
    again = replace(later, round=2)
    r2 = measure_cell(again, case, opts, estimator, prepared=cache)
    r2 = {(r.backend, r.method) for r in r2 if r.status == "ok"}
    assert fp32 not in r2 and ("custom", "int8_raw") in r2
    # not measured at this token count yet: round 0 only
    assert not fp32_in_round(1, None) and fp32_in_round(0, None)


def test_fp32s_later_rounds_follow_the_machines_peak_where_one_is_known():
    """With the machine's fp32 peak known, the call's time at that peak decides whether fp32 is
    measured in a later round, whatever this run's estimate: two runs of one machine choose
    alike where a call near the limit went either way by the estimate."""
    from kernelbench.cli.sweep import _with_fp32_peak
    from kernelbench.run.cell import plan_cell

    case = load_case("gpt3")
    opts = tiny_opts(("fp16", "fp32", "int8_raw"), 2)
    _, later = plan(case, opts)
    fp32 = ("torch", "fp32")
    flops = work_flops(later.tokens, *case.shape(later.layer, later.size.d_model))
    estimates = {}
    for name, factor in (("over", 1.01), ("under", 0.99)):
        estimates[name] = CallEstimator()
        seconds = FP32_REPEAT_MAX_CALL_S * factor
        estimates[name].record(fp32, flops, seconds, later.size.d_model, later.tokens)

    def measured(estimate: str, at_peak_s: float | None) -> bool:
        tops = flops / at_peak_s / 1e12 if at_peak_s else None
        cell = plan_cell(later, case, replace(opts, fp32_peak_tops=tops), estimates[estimate])
        return fp32 in {(r.backend, r.method) for r in cell.rows}

    short, long = 0.9 * FP32_REPEAT_MAX_CALL_S, 1.1 * FP32_REPEAT_MAX_CALL_S
    assert measured("over", short) and measured("under", short)
    assert not measured("over", long) and not measured("under", long)
    assert measured("under", None) and not measured("over", None)  # no peak: the estimate
    assert fp32_in_round(0, None, long)

    # the run takes the fp32 peak from env.json's peaks, where it has a figure
    def env(fp32: object) -> dict:
        return {"device_class": "cpu-test", "peak": fp32 if fp32 is None else {"fp32": fp32}}

    measured = {"tops": 0.195, "source": "measured"}
    assert _with_fp32_peak(opts, env(measured)).fp32_peak_tops == 0.195
    for fp32 in (
        None,
        {},
        {"tops": 0},
        {"tops": "x"},
        {"tops": float("inf"), "source": "measured"},
    ):
        assert _with_fp32_peak(opts, env(fp32)).fp32_peak_tops is None
    # a peak the rooflines would not use (no source, another class) chooses nothing either
    assert _with_fp32_peak(opts, env({"tops": 0.195})).fp32_peak_tops is None
    other = measured | {"device_class": "cpu-other"}
    assert _with_fp32_peak(opts, env(other)).fp32_peak_tops is None


def test_a_resumed_run_estimates_calls_from_the_rows_written_before(tmp_path):
    """A run resumed after its round 0 measures fp32 in round 1 as the uninterrupted run
    would: its estimates start from the written rows, not from nothing."""
    case = load_case("gpt3")
    opts = tiny_opts(("fp16", "fp32"), 2)
    first, later = plan(case, opts)
    writer = ResultsWriter(tmp_path)
    for _, row in get_executor("local").run([first], case, opts, set()):
        writer.append(row)
    done, written = writer.done_keys(), read_rows(writer.path)

    def round_1_pairs(learn: bool) -> set[tuple[str, str]]:
        executor = get_executor("local")
        if learn:
            executor.learn(written)
        rows = [row for _, row in executor.run([first, later], case, opts, done)]
        assert all(r.round == 1 for r in rows)  # round 0 is done
        return {(r.backend, r.method) for r in rows if r.status == "ok"}

    assert ("torch", "fp32") in round_1_pairs(learn=True)
    assert round_1_pairs(learn=False) == {("torch", "fp16")}  # nothing to estimate from
    estimator = CallEstimator()
    estimator.record_rows([*written, dict(written[0], status="failed", median_ms=None)])
    flops = work_flops(later.tokens, *case.shape(later.layer, later.size.d_model))
    fp32_row = next(r for r in written if r["method"] == "fp32")
    seconds, d_model = estimator.estimate(("torch", "fp32"), flops, later.tokens)
    assert seconds == pytest.approx(fp32_row["median_ms"] / 1e3) and d_model == 768


def test_a_kept_cell_lets_other_layers_and_cells_go_when_its_timing_lacks_room(monkeypatch):
    """A cell timed from what an earlier round kept still needs memory for its calls' outputs
    and temporaries: another layer held for building is let go, and so are other kept cells
    while the system has too little free."""
    from kernelbench.run import prepared as keeping

    case = load_case("gpt3")
    opts = replace(tiny_opts(methods=("fp16", "int8_raw"), rounds=2), sizes=(768, 1024))
    items = plan(case, opts)
    assert [(i.size.d_model, i.round) for i in items] == [(768, 0), (1024, 0), (768, 1), (1024, 1)]
    cache, estimator = PreparedCells(1 << 40), CallEstimator()
    for item in items[:2]:
        list(measure_cell(item, case, opts, estimator, prepared=cache))
    cell_768, cell_1024 = ((768, "ffn1", "outliers"), 8), ((1024, "ffn1", "outliers"), 8)
    assert cache.get(cell_768) and cache.get(cell_1024) and cache.layer(cell_1024[0])
    builds = _recorded_calls(monkeypatch, type(all_backends()["custom"]), "runner")
    monkeypatch.setattr(keeping, "available_bytes", lambda: 0)  # no room for anything else
    rows = list(measure_cell(items[2], case, opts, estimator, prepared=cache))
    assert builds == []  # timed from the kept runners...
    assert all(r.status in ("ok", "skipped") for r in rows)
    assert cache.layer(cell_1024[0]) is None  # ... without the other layer...
    assert cache.get(cell_1024) is None and cache.get(cell_768) is not None  # ... or its cell


def test_a_layer_kept_through_another_builds_its_cells_again_from_its_prepared_weights(
    monkeypatch,
):
    """A layer measured again in a later round, after another layer: a cell of it that was not
    kept is built from the weights its kept cells' runners hold, not quantized again, and
    while parked the layer keeps only what those runners hold (not the fp32 copy)."""
    case = load_case("gpt3")
    opts = replace(
        tiny_opts(("fp16", "fp32", "int8_raw", "llm_int8"), 2), sizes=(768, 1024), tokens=(8, 16)
    )
    items = plan(case, opts)
    cache, estimator = PreparedCells(1 << 40), CallEstimator()
    for item in items[:4]:  # round 0: both layers
        list(measure_cell(item, case, opts, estimator, prepared=cache))
    layer_768 = (768, "ffn1", "outliers")
    parked = cache.layer(layer_768)
    assert parked is not None and cache.layer((1024, "ffn1", "outliers")) is not None
    fp32 = [
        v
        for _, _, v in parked.shared._entries.values()
        if isinstance(v, tuple) and v[0] is not None and v[0].dtype == torch.float32
    ]
    assert not fp32  # the fp32 copy (no kept runner holds it) went when the layer was parked
    del cache._cells[(layer_768, 16)]  # as if memory had been short for it
    prepares = _count_prepares(monkeypatch)
    from kernelbench.run import cell as harness

    draws = _recorded_calls(monkeypatch, harness, "layer_inputs")
    room = _recorded_calls(monkeypatch, PreparedCells, "make_room")
    later = [i for i in items[4:] if i.size.d_model == 768]
    rows = [r for i in later for r in measure_cell(i, case, opts, estimator, prepared=cache)]
    assert prepares == [] and draws == []
    # nor room for building them from scratch: only for the timing, as a kept cell's
    weight_bytes = 768 * 3072 * 2
    timing = harness.RESERVE_PER_WEIGHT_BYTE * weight_bytes + harness.RESERVE_BYTES
    assert room and {c[1] for c in room} == {timing}
    measured = [r for r in rows if r.status != "skipped"]
    assert measured and all(r.status == "ok" for r in measured)
    assert cache.get((layer_768, 16)) is not None


def test_the_cells_of_the_layer_being_measured_are_not_let_go_to_make_room():
    """Letting a cell of the layer being measured go frees only its activations (its runners
    share the layer's prepared weights): room is made from the other layers' cells."""
    cache = PreparedCells(100)
    for key, layer in (("a", "L1"), ("b", "L2"), ("c", "L1")):
        kept = cell(10)
        kept.layer_key = layer
        cache.offer(key, kept)
    cache.make_room(20, keep="c", keep_layer="L1", available=lambda: 0, release=lambda: None)
    assert cache.get("a") is not None and cache.get("b") is None
