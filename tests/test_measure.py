"""The measurement engine, its stopping rules and statistics: on synthetic samples and an
injected clock, never on how fast this machine is."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbench.measure.engine import (
    STAGE_MAX_SAMPLES,
    Budget,
    IntervalTarget,
    MeasurementEngine,
    SampleCap,
    SamplingState,
    SpreadTarget,
    StoppingRules,
    TimerSettings,
    interpolated_baselines,
)
from kernelbench.measure.timing import CallTimer
from kernelbench.statistics import (
    median_interval,
    rel_halfwidth,
    round_medians_halfwidth,
    round_slices,
    round_weights,
    rounds_median_interval,
    rounds_to_narrow,
    stats,
    t_quantile_975,
    weighted_quantile,
)


class FakeMachine:
    """A clock and calls that advance it: ``call(ms)`` takes ``ms`` times the machine's current
    slowness, which follows ``slowness(call_index)``."""

    def __init__(self, slowness=lambda i: 1.0) -> None:
        self.now = 0.0
        self.calls = 0
        self.slowness = slowness

    def clock(self) -> float:
        return self.now

    def call(self, ms: float):
        def run():
            self.now += ms * self.slowness(self.calls) / 1e3
            self.calls += 1

        return run


def engine(machine: FakeMachine, reuse_memory: bool = False, **settings) -> MeasurementEngine:
    """An engine on ``machine``'s clock; memory reuse (and its pre-faulting calls) and a floor
    of pairs only when asked, so that call counts are the stopping rules' own."""
    timer = TimerSettings(**{"min_pairs": 1, **settings})
    stage = TimerSettings(budget_s=0.01, warmup_s=0.0, min_samples=1)
    return MeasurementEngine(
        "cpu",
        timer,
        stage,
        clock=machine.clock,
        timer=CallTimer(machine.clock),
        reuse_memory=reuse_memory,
    )


def test_a_short_noisy_stage_is_timed_at_most_the_stage_cap():
    """A sub-millisecond stage whose spread never meets its target stops at the cap, not at
    the run's 200 samples: with cold caches each sample costs an eviction."""
    machine = FakeMachine(slowness=lambda i: (1.0, 1.6, 0.7, 2.2)[i % 4])
    e = MeasurementEngine(
        "cpu",
        TimerSettings(),
        TimerSettings.for_stages(),
        clock=machine.clock,
        timer=CallTimer(machine.clock),
        reuse_memory=False,
    )
    ms = e.time_stages({"quantize": machine.call(0.05)})["quantize"]
    assert machine.calls == 1 + STAGE_MAX_SAMPLES  # the first call, then the samples
    assert TimerSettings().max_samples / 5 > STAGE_MAX_SAMPLES
    assert 0.05 * 0.7 <= ms <= 0.05 * 2.2


def test_stats_on_synthetic_samples():
    st = stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert st.median_ms == 3.0 and st.min_ms == 1.0 and st.samples == 5
    assert st.iqr_ms == pytest.approx(2.0)
    assert st.rel_spread == pytest.approx(2.0 / 3.0)
    # weights: each round weighs the same however many samples it took
    values, weights = round_weights([[1.0] * 9, [5.0]])
    assert stats(values, weights).median_ms == 1.0
    values, weights = round_weights([[1.0] * 9, [5.0], [5.0]])
    assert stats(values, weights).median_ms == 5.0  # two rounds of three say 5


def test_stopping_rules_on_synthetic_samples():
    quiet = SamplingState((10.0,) * 5, 0.05)
    noisy = SamplingState((10.0, 20.0, 5.0, 30.0, 7.0), 0.072)
    assert SampleCap(5).reached(quiet) and not SampleCap(6).reached(quiet)
    assert Budget(0.05).reached(quiet) and not Budget(0.06).reached(quiet)
    assert not Budget(0.0).reached(SamplingState((), 0.0))  # never stop before one sample
    assert SpreadTarget(0.02).reached(quiet) and not SpreadTarget(0.02).reached(noisy)
    assert not SpreadTarget(0.02, min_samples=6).reached(quiet)
    assert IntervalTarget(0.02).reached(quiet) and not IntervalTarget(0.02).reached(noisy)
    # judged at 5, 10, 20, 40, ... samples only (a bootstrap each time)
    target = IntervalTarget(0.02)
    assert [n for n in range(1, 100) if target.judged_at(n)] == [5, 10, 20, 40, 80]
    assert not target.reached(SamplingState((10.0,) * 6, 0.06))
    rules = StoppingRules([Budget(1.0), SpreadTarget(0.02)], floor=3)
    assert not rules.done(SamplingState((10.0,) * 2, 5.0))  # the floor comes first
    assert rules.done(SamplingState((10.0,) * 3, 5.0))
    # faulted samples do not count toward the floor, until twice the floor has been taken
    assert not rules.done(SamplingState((10.0,) * 3, 5.0, faulted=1))
    assert not rules.done(SamplingState((10.0,) * 4, 5.0, faulted=2))
    assert rules.done(SamplingState((10.0,) * 4, 5.0, faulted=1))
    assert rules.done(SamplingState((10.0,) * 6, 5.0, faulted=6))


def test_interval_of_the_median_covers_it_and_narrows_with_samples():
    assert median_interval([1.0]) is None
    few = median_interval([1.0, 1.2, 0.9, 1.1, 1.05])
    many = median_interval([1.0, 1.2, 0.9, 1.1, 1.05] * 20)
    assert few[0] <= 1.05 <= few[1] and many[0] <= 1.05 <= many[1]
    assert many[1] - many[0] < few[1] - few[0]
    assert median_interval([1.0, 2.0, 3.0], seed=1) == median_interval([1.0, 2.0, 3.0], seed=1)
    assert rel_halfwidth(2.0, 1.9, 2.1) == pytest.approx(0.05)
    assert rel_halfwidth(2.0, None, None) == float("inf")


def test_pooled_interval_covers_the_drift_between_rounds():
    """Four tight rounds whose medians drift (as torch's vectorwise at d=768 did: 1.05-1.31):
    resampling only the pairs gives an interval far narrower than the drift, which the next run
    does not reproduce; resampling rounds, then pairs, covers it."""
    gen = np.random.default_rng(7)
    per_round = [list(m * (1 + 0.01 * gen.standard_normal(40))) for m in (1.17, 1.31, 1.22, 1.05)]
    values, weights = round_weights(per_round)
    pairs_only = median_interval(values)  # rounds of equal size: each weighs the same
    lo, hi = rounds_median_interval(per_round)
    assert pairs_only[1] - pairs_only[0] < 0.06
    assert lo <= 1.10 and hi >= 1.25 and lo <= weighted_quantile(values, weights, 0.5) <= hi
    # rounds that agree keep an interval as narrow as the pairs alone give
    same = [list(1.2 * (1 + 0.01 * gen.standard_normal(40))) for _ in range(4)]
    lo, hi = rounds_median_interval(same)
    plo, phi = median_interval([v for r in same for v in r])
    assert hi - lo < 2 * (phi - plo) and lo <= 1.2 <= hi
    # deterministic, one round is the plain interval, nothing to resample is no interval
    assert rounds_median_interval(per_round) == rounds_median_interval(per_round)
    assert rounds_median_interval([[1.0, 1.2, 0.9]]) == median_interval([1.0, 1.2, 0.9])
    assert rounds_median_interval([[1.0]]) is None and rounds_median_interval([]) is None


def test_round_slices_split_a_pooled_rows_calls_by_round_or_say_they_cannot():
    calls = [10.0, 11.0, 12.0, 20.0, 21.0, 30.0]
    assert [calls[s] for s in round_slices([3, 2, 1], 6)] == [
        [10.0, 11.0, 12.0],
        [20.0, 21.0],
        [30.0],
    ]
    assert round_slices((6,), 6) == [slice(0, 6)]
    for sizes in (None, [], [3, 2], [3, 2, 2], [3, 0, 3], [4, -1, 3]):
        assert round_slices(sizes, 6) is None, sizes


def test_the_roofline_check_and_the_by_round_view_split_a_row_alike():
    from types import SimpleNamespace

    from kernelbench.results.physics import _rounds
    from kernelbench.results.view import by_round

    raw = [1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    row = {"raw_ms": raw, "baseline_raw_ms": [3.0] * 9, "round_samples": [3, 2, 4]}
    assert _rounds(SimpleNamespace(**row)) == [[1.0] * 3, [2.0] * 2, [4.0] * 4]
    assert by_round(row).speedups == [3.0, 1.5, 0.75]
    row["round_samples"] = [3, 2]  # not adding up: one round, no per-round view
    assert _rounds(SimpleNamespace(**row)) == [raw]
    assert by_round(row).speedups == []


def test_t_quantiles():
    assert t_quantile_975(1) == 12.706 and t_quantile_975(2) == 4.303
    assert t_quantile_975(30) == 2.042
    assert t_quantile_975(31) == pytest.approx(2.0395, abs=2e-3)  # beyond the table
    assert t_quantile_975(10_000) == pytest.approx(1.960, abs=1e-3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def test_rounds_to_narrow_projects_the_t_interval_of_more_rounds():
    # the same scatter over n rounds: t(n-1) / sqrt(n) of it
    def width(n: int) -> float:
        return t_quantile_975(n - 1) / np.sqrt(n)

    assert width(3) / width(4) == pytest.approx(1.56, abs=0.01)
    assert width(6) / width(7) == pytest.approx(1.135, abs=0.01)
    # a 3-round row at +-7.5% reaches +-5% in one more round; a 6-round row at +-6% needs two
    assert rounds_to_narrow(0.075, 3, 0.05, most=3) == 1
    assert rounds_to_narrow(0.06, 6, 0.05, most=3) == 2
    assert rounds_to_narrow(0.06, 6, 0.05, most=1) is None
    assert rounds_to_narrow(0.10, 6, 0.05, most=3) is None  # twice the target: 11 more rounds
    assert rounds_to_narrow(0.10, 6, 0.05, most=12) == 11
    assert rounds_to_narrow(0.07, 1, 0.05, most=3) is None  # no t interval of rounds yet
    assert rounds_to_narrow(float("inf"), 3, 0.05, most=3) is None


def test_round_medians_halfwidth_is_the_t_interval_of_their_logs():
    per_round = [[1.0, 1.0, 1.0], [1.1, 1.1], [1.2]]
    logs = np.log([1.0, 1.1, 1.2])
    want = 4.303 * logs.std(ddof=1) / np.sqrt(3)
    assert round_medians_halfwidth(per_round) == pytest.approx(want)
    assert round_medians_halfwidth([[1.0, 2.0]]) is None  # one round: no drift to read
    assert round_medians_halfwidth([[1.0], [0.0]]) is None
    # weighed by their values, a round of one value counts for little, and the t quantile
    # takes the effective number of rounds
    big = [[1.0] * 40, [1.02] * 40, [0.98] * 40]
    assert round_medians_halfwidth([*big, [2.0]], equal_rounds=False) < round_medians_halfwidth(
        [*big, [2.0]]
    )


def test_three_rounds_that_disagree_get_the_t_interval_not_the_bootstraps():
    """Three tight rounds at 1.0, 1.1 and 1.2: resampling three rounds cannot know how far a
    fourth would fall; the t interval of their medians (quantile 4.30) can."""
    gen = np.random.default_rng(11)
    per_round = [list(m * (1 + 0.01 * gen.standard_normal(40))) for m in (1.0, 1.1, 1.2)]
    lo, hi = rounds_median_interval(per_round)
    half = round_medians_halfwidth(per_round)
    assert half == pytest.approx(0.2266, abs=0.01)
    assert lo < 0.9 and hi > 1.35
    # at a confidence other than 95% only the bootstrap applies (the t table is for 95%)
    blo, bhi = rounds_median_interval(per_round, confidence=0.9)
    assert blo > lo and bhi < hi


def _coverage(runs: int = 300) -> float:
    """Share of simulated runs of 3 rounds (speedups moving by 5% sd between rounds, 2% within)
    whose pooled interval covers the machine's typical speedup, 1.0."""
    gen = np.random.default_rng(5)
    covered = 0
    for _ in range(runs):
        per_round = [
            list(np.exp(0.05 * gen.standard_normal()) * np.exp(0.02 * gen.standard_normal(20)))
            for _ in range(3)
        ]
        lo, hi = rounds_median_interval(per_round)
        covered += lo <= 1.0 <= hi
    return covered / runs


def test_pooled_intervals_cover_a_drifting_machine_as_often_as_they_claim(monkeypatch):
    assert 0.90 <= _coverage() <= 0.995
    # the two-stage bootstrap alone: about 80%
    monkeypatch.setattr("kernelbench.statistics.round_medians_halfwidth", lambda *a, **k: None)
    assert _coverage() < 0.85


def test_rounds_can_weigh_by_their_pairs():
    """With each pair weighing the same, a round of two pairs moves the median less than a
    round of forty, and the interval still covers the drift between rounds."""
    gen = np.random.default_rng(3)
    big = [list(2.0 * (1 + 0.01 * gen.standard_normal(40))) for _ in range(4)]
    tiny = [[3.0, 3.1]]
    lo, hi = rounds_median_interval(big + tiny, equal_rounds=False)
    assert lo <= 2.0 <= hi and hi < 2.2  # the tiny round cannot carry the median
    elo, ehi = rounds_median_interval(big + tiny)  # equal rounds: a third of the weight
    assert ehi > hi
    drift = [list(m * (1 + 0.01 * gen.standard_normal(40))) for m in (1.0, 1.2, 1.1, 0.95)]
    lo, hi = rounds_median_interval(drift, equal_rounds=False)
    assert lo <= 1.0 and hi >= 1.1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=6), min_size=2, max_size=4))
def test_two_stage_resample_medians_are_weighted_quantiles(per_round):
    """The vectorised weighted median of each resample is :func:`weighted_quantile` at 0.5."""
    from kernelbench.statistics import _weighted_medians

    values, weights = round_weights(per_round)
    v = np.array([values, values[::-1]])
    w = np.array([weights, [x * 2 for x in weights[::-1]]])
    got = _weighted_medians(v, w)
    assert got[0] == weighted_quantile(values, weights, 0.5)
    assert got[1] == weighted_quantile(values[::-1], weights[::-1], 0.5)


def test_paired_ratio_holds_while_the_machine_speed_swings():
    """A machine whose speed halves for stretches (as the CI VM's does): each time alone swings
    2x, the ratio of the two calls of a pair does not."""
    machine = FakeMachine(lambda i: 2.0 if (i // 6) % 2 else 1.0)
    e = engine(
        machine, budget_s=100, warmup_s=0.0, max_samples=21, target_rel_spread=-1.0, ci_target=-1.0
    )
    meas = e.measure(machine.call(1.0), first_call_s=1.0, baseline=machine.call(2.0))
    assert meas.paired and len(meas.row_ms) == len(meas.baseline_ms) == 21
    assert max(meas.row_ms) == pytest.approx(2 * min(meas.row_ms))  # the machine did swing
    assert stats(meas.ratios).median_ms == pytest.approx(2.0)
    # only a sample next to a switch-over (its two baseline calls saw different machines) differs
    assert sum(abs(r - 2.0) < 1e-9 for r in meas.ratios) >= 13


def test_a_row_alone_is_bracketed_by_baseline_calls_and_the_budget_counts_both():
    machine = FakeMachine()
    order = []
    row, base = machine.call(10.0), machine.call(30.0)
    e = engine(machine, budget_s=0.2, warmup_s=0.0, target_rel_spread=-1.0, ci_target=-1.0)
    meas = e.measure(
        lambda: (order.append("row"), row()), 1.0, baseline=lambda: (order.append("b"), base())
    )
    assert len(meas.row_ms) == 5  # 5 samples of 10 ms + one 30 ms baseline each fill 0.2 s
    assert order == ["b", "row"] * 5 + ["b"]
    assert meas.baseline_ms == pytest.approx((30.0,) * 5)


def test_interpolated_baseline_follows_the_machine_between_its_two_calls():
    # baseline 10 ms before, 20 ms after; rows of 5 and 15 ms between their middles
    got = interpolated_baselines(10.0, 20.0, [5.0, 15.0])
    span = 5.0 + 5.0 + 15.0 + 10.0
    assert got == pytest.approx([10.0 + 10.0 * 7.5 / span, 10.0 + 10.0 * 17.5 / span])
    assert interpolated_baselines(10.0, 10.0, [1.0, 2.0, 3.0]) == [10.0] * 3


def test_a_cell_shares_one_baseline_call_per_cycle_and_holds_each_ratio_while_speed_swings():
    machine = FakeMachine(lambda i: 2.0 if (i // 7) % 2 else 1.0)
    calls: list[str] = []

    def call(name, ms):
        run = machine.call(ms)
        return lambda: (calls.append(name), run())

    e = engine(
        machine, budget_s=100, warmup_s=0.0, max_samples=30, target_rel_spread=-1.0, ci_target=-1.0
    )
    rows = {"a": call("a", 2.0), "b": call("b", 4.0), "c": call("c", 8.0)}
    cell = e.measure_cell(rows, baseline=call("base", 8.0), seed=3)
    assert not cell.failed and set(cell.rows) == {"a", "b", "c"}
    assert calls.count("base") == 31  # one per cycle, and the one that closes the last
    assert len(cell.baseline.row_ms) == 31 and not cell.baseline.paired
    orders = {tuple(calls[i + 1 : i + 4]) for i in range(0, len(calls) - 1, 4)}
    assert len(orders) > 1  # each cycle in a fresh order
    for name, want in (("a", 4.0), ("b", 2.0), ("c", 1.0)):
        ratios = cell.rows[name].ratios
        assert len(ratios) == 30
        assert max(cell.rows[name].row_ms) == pytest.approx(2 * min(cell.rows[name].row_ms))
        assert stats(ratios).median_ms == pytest.approx(want)


def test_rows_leave_the_cycles_when_done_and_a_raising_row_leaves_the_others():
    machine = FakeMachine()
    broken_after = iter(range(3))

    def flaky():
        if next(broken_after, None) is None:
            raise RuntimeError("kernel fell over")
        machine.call(1.0)()

    e = engine(machine, warmup_s=0.0, target_rel_spread=-1.0, ci_target=-1.0, max_samples=4)
    rows = {"short": machine.call(1.0), "flaky": flaky}
    cell = e.measure_cell(rows, baseline=machine.call(2.0))
    assert cell.failed == {"flaky": "RuntimeError: kernel fell over"}
    assert set(cell.rows) == {"short"} and len(cell.rows["short"].row_ms) == 4
    alone = e.measure_cell({}, baseline=machine.call(2.0))
    assert alone.baseline is not None and len(alone.baseline.row_ms) == 4 and not alone.rows


def test_first_call_is_the_warm_up_and_stages_are_timed_alone():
    machine = FakeMachine()
    calls = []
    e = engine(machine, budget_s=0.0, warmup_s=0.5)
    meas = e.measure(
        lambda: calls.append(1),
        first_call_s=1.0,
        stages={"q": lambda: None},
        known_stages_ms={"int8_matmul": 3.0},
    )
    assert len(calls) == 1  # a first call longer than the warm-up: one timed sample, no more
    assert set(meas.stages_ms) == {"q", "int8_matmul"} and meas.stages_ms["int8_matmul"] == 3.0
    assert not meas.paired and meas.first_call_s == 1.0
    with pytest.raises(TypeError):
        meas.stages_ms["q"] = 1.0  # immutable


def test_stopping_on_a_quiet_machine_takes_few_samples():
    machine = FakeMachine()
    e = engine(machine, budget_s=100, warmup_s=0.0, min_samples=3, target_rel_spread=0.02)
    meas = e.measure(machine.call(2.0), 1.0, baseline=machine.call(4.0))
    assert len(meas.row_ms) == 5  # the spread target is judged from five samples on


def test_interpolated_baseline_leaves_out_the_gaps_between_calls():
    # a 30 ms gap before the second row: the machine moved on while nothing was timed
    got = interpolated_baselines(10.0, 20.0, [5.0, 15.0], gaps_ms=[0.0, 30.0, 0.0])
    span = 5.0 + 5.0 + 30.0 + 15.0 + 10.0
    assert got == pytest.approx([10.0 + 10.0 * 7.5 / span, 10.0 + 10.0 * 47.5 / span])
    with pytest.raises(ValueError, match="gaps_ms"):
        interpolated_baselines(10.0, 20.0, [5.0], gaps_ms=[0.0])


def test_first_output_hooks_get_the_first_call_and_their_time_is_left_out_of_the_pairing():
    """A row checked on its first timed call's output: the check (a long pause here) happens
    between calls while the machine slows down steadily; the pairs still see the true ratio."""

    class DriftingMachine:
        def __init__(self) -> None:
            self.now = 0.0

        def clock(self) -> float:
            return self.now

        def call(self, ms: float, out=None):
            def run():
                self.now += ms * (1.0 + self.now) / 1e3  # 1 s later, everything is 2x slower
                return out

            return run

    machine = DriftingMachine()
    seen: list[object] = []

    def check(out):
        seen.append(out)
        machine.now += 0.5  # the accuracy check takes half a second

    timer = TimerSettings(
        budget_s=100, warmup_s=0.0, max_samples=3, target_rel_spread=-1.0, ci_target=-1.0
    )
    e = MeasurementEngine("cpu", timer, timer, clock=machine.clock, timer=CallTimer(machine.clock))
    base_seen: list[object] = []
    cell = e.measure_cell(
        {"a": machine.call(4.0, out="a-output"), "b": machine.call(2.0, out="b-output")},
        baseline=machine.call(8.0, out="base-output"),
        first_outputs={"a": check, "b": check},
        baseline_first_output=base_seen.append,
        seed=1,
    )
    assert sorted(seen) == ["a-output", "b-output"] and base_seen == ["base-output"]
    assert len(cell.rows["a"].row_ms) == 3  # the checked call is a sample
    assert stats(cell.rows["a"].ratios).median_ms == pytest.approx(2.0, rel=0.01)
    assert stats(cell.rows["b"].ratios).median_ms == pytest.approx(4.0, rel=0.01)
    # the first cycle's pair, around the checks (without leaving out the gaps: 4% off)
    first_a = cell.rows["a"].ratios[0]
    assert first_a == pytest.approx(2.0, rel=0.01)


def test_a_raising_output_hook_fails_its_row_only():
    machine = FakeMachine()

    def bad_check(out):
        raise ValueError("output has NaN")

    e = engine(machine, warmup_s=0.0, target_rel_spread=-1.0, ci_target=-1.0, max_samples=2)
    cell = e.measure_cell(
        {"bad": machine.call(1.0), "good": machine.call(1.0)},
        baseline=machine.call(2.0),
        first_outputs={"bad": bad_check},
    )
    assert cell.failed == {"bad": "ValueError: output has NaN"}
    assert len(cell.rows["good"].row_ms) == 2


def test_a_temporary_past_2_gib_is_not_faulted_in_again_while_timing():
    """A positive trim threshold (an int) stops at 2 GiB: what one free leaves beyond it at the
    heap's top was given back and faulted in again by the next call. Allocated with glibc's own
    malloc (no Python allocation between, so the block is the heap's top whatever earlier tests
    left in the heap; torch's aligned allocations can land elsewhere in a fragmented heap)."""
    import ctypes

    from kernelbench.measure import timing

    if timing._LIBC is None:
        pytest.skip("glibc only")
    nbytes = (2 << 30) + (256 << 20)  # 2.25 GiB
    if (timing.available_bytes() or 0) < 3 * nbytes:
        pytest.skip("not enough memory for a 2.25 GiB temporary")
    libc = timing._LIBC  # its malloc and free typed for pointers

    def temporary() -> None:
        block = libc.malloc(nbytes)
        assert block, "malloc failed"
        ctypes.memset(block, 1, nbytes)
        libc.free(block)

    try:
        with timing.freed_memory_reused():
            temporary()  # faulted in once
            before = timing.process_usage()[0]
            temporary()
            faults = timing.process_usage()[0] - before
    finally:
        timing.release_free_memory()
    assert faults < 1000, f"{faults} page faults for a temporary the heap had kept"


def test_giving_back_the_heaps_top_leaves_its_holes_resident():
    """When the run needs memory it gives back the heap's top first: a freed hole below live
    memory keeps its pages (mincore), for the next block's calls to reuse without faulting
    them in, and the top is trimmed (glibc's ``keepcost``: what the top could give back);
    giving back every free page drops the hole's too."""
    import ctypes
    import ctypes.util
    import resource

    from kernelbench.measure import timing

    if timing._LIBC is None or timing._MALLINFO2 is None:
        pytest.skip("glibc 2.33+ only")
    libc = timing._LIBC  # its malloc and free typed for pointers
    mincore = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = resource.getpagesize()
    hole_bytes, top_bytes = 64 << 20, 256 << 20

    def resident_pages(address: int, nbytes: int) -> int:
        start = -(-address // page) * page + page  # past the chunk's header page
        length = (address + nbytes) // page * page - page - start
        vec = ctypes.create_string_buffer(length // page)
        assert mincore(start, length, vec) == 0, ctypes.get_errno()
        return sum(b & 1 for b in vec.raw)

    def touched(nbytes: int) -> int:
        block = libc.malloc(nbytes)
        assert block, "malloc failed"
        ctypes.memset(block, 1, nbytes)
        return block

    with timing.freed_memory_reused():
        hole = touched(hole_bytes)
        # a live chunk above the hole keeps it a hole (not the top): malloc serves the heap's
        # free chunks first, wherever they lie, so chunks are taken until one lies above
        taken = [libc.malloc(hole_bytes)]
        while taken[-1] and taken[-1] < hole:
            taken.append(libc.malloc(hole_bytes))
        live = taken.pop()
        assert live, "malloc failed"
        for chunk in taken:
            libc.free(chunk)
        libc.free(hole)
        libc.free(touched(top_bytes))
    try:
        pages = resident_pages(hole, hole_bytes)
        assert pages > 0.9 * hole_bytes / page
        timing.release_heap_top()
        assert resident_pages(hole, hole_bytes) == pages  # the hole kept
        assert timing._MALLINFO2().keepcost < timing._DEFAULT_TRIM_THRESHOLD + (1 << 20)
        timing.release_free_memory()
        assert resident_pages(hole, hole_bytes) < 0.1 * pages  # every free page given back
    finally:
        libc.free(live)
        timing.release_free_memory()


def test_memory_is_given_back_a_step_at_a_time_until_enough_is_free():
    """The heap's top, then every free page, each only while the memory still falls short."""
    from kernelbench.measure.timing import available_after_release

    done: list[str] = []
    steps = (lambda: done.append("top"), lambda: done.append("all"))
    for readings, given_back, free in (
        ([50], [], 50),  # enough: nothing given back
        ([5, 25], ["top"], 25),  # the top was enough
        ([5, 8, 30], ["top", "all"], 30),
        ([5, 8, 9], ["top", "all"], 9),  # still short: the caller lets kept cells go
    ):
        done.clear()
        reading = iter(readings)
        assert available_after_release(20, lambda r=reading: next(r), steps) == free
        assert done == given_back


def test_cpu_memory_is_reused_while_timing_and_given_back_when_released(monkeypatch):
    from kernelbench.measure import timing

    class FakeLibc:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def mallopt(self, param, value):
            self.calls.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad):
            self.calls.append(("trim", pad))
            return 1

    libc = FakeLibc()
    monkeypatch.setattr(timing, "_LIBC", libc)
    monkeypatch.setattr(timing, "_heap_kept", False)
    # -1: no trimming at all (a positive int threshold stops at 2 GiB)
    never_trim = [("mallopt", timing._M_TRIM_THRESHOLD, -1)]
    with timing.freed_memory_reused(), timing.freed_memory_reused():  # nested: set once
        assert libc.calls == [("mallopt", timing._M_MMAP_MAX, 0), *never_trim]
        timing.release_free_memory()  # inside a block: nothing given back
    # on exit mmap comes back, but nothing is trimmed: the next block reuses the pages
    assert libc.calls[2:] == [("mallopt", timing._M_MMAP_MAX, timing._DEFAULT_MMAP_MAX)]
    libc.calls.clear()
    with timing.freed_memory_reused():  # the heap is still kept: only mmap is switched
        pass
    assert libc.calls == [
        ("mallopt", timing._M_MMAP_MAX, 0),
        ("mallopt", timing._M_MMAP_MAX, timing._DEFAULT_MMAP_MAX),
    ]
    libc.calls.clear()
    timing.release_free_memory()  # the run needs memory: defaults back, free pages returned
    assert libc.calls == [
        ("mallopt", timing._M_TRIM_THRESHOLD, timing._DEFAULT_TRIM_THRESHOLD),
        ("trim", 0),
    ]
    libc.calls.clear()
    with timing.freed_memory_reused():  # and the next block keeps the heap again
        pass
    assert libc.calls[1:2] == never_trim
    libc.calls.clear()
    with timing.freed_memory_reused(enabled=False):
        pass
    assert libc.calls == []
    # the engine times CPU calls so (cycles, first calls, stages), and not where told not to
    machine = FakeMachine()
    e = engine(
        machine,
        reuse_memory=True,
        warmup_s=0.0,
        max_samples=2,
        target_rel_spread=-1.0,
        ci_target=-1.0,
    )
    e.measure_cell({"a": machine.call(1.0)}, baseline=machine.call(2.0))
    e.first_call(machine.call(1.0))
    e.time_stages({"s": machine.call(1.0)})
    assert libc.calls.count(("mallopt", timing._M_MMAP_MAX, 0)) == 3
    assert ("trim", 0) not in libc.calls
    libc.calls.clear()
    quiet = MeasurementEngine(
        "cpu",
        TimerSettings(),
        TimerSettings(),
        clock=machine.clock,
        timer=CallTimer(machine.clock),
        reuse_memory=False,
    )
    quiet.first_call(machine.call(1.0))
    assert libc.calls == []


def test_heap_cushion_only_inside_a_reuse_block_and_within_available_memory(monkeypatch):
    from kernelbench.measure import timing

    if timing._LIBC is None:
        pytest.skip("glibc only")
    assert timing.cushion_heap(1 << 20) == 0  # outside a block it would just be trimmed
    with timing.freed_memory_reused():
        assert timing.cushion_heap(1 << 20, available=lambda: 1 << 30) == 1 << 20
        assert timing.cushion_heap(1 << 30, available=lambda: 8 << 20) == 2 << 20
        assert timing.cushion_heap(0) == 0


def test_memory_in_use_leaves_out_the_freed_pages_the_heap_keeps():
    """A kept cell is charged what it holds: the pages its cycles freed stay resident in the
    heap (for the next block), but belong to no one."""
    import torch

    from kernelbench.measure import timing
    from kernelbench.run.prepared import memory_in_use

    if timing.heap_live_bytes() is None:
        pytest.skip("glibc 2.33+ only")
    cpu = torch.device("cpu")
    with timing.freed_memory_reused():
        before = memory_in_use(cpu)
        held = torch.empty(64 << 20, dtype=torch.uint8)
        held.fill_(1)
        assert memory_in_use(cpu) - before >= 64 << 20
        freed = torch.empty(128 << 20, dtype=torch.uint8)
        freed.fill_(1)
        del freed  # resident still (no trimming in a block), but free
        grown = memory_in_use(cpu) - before
        assert 64 << 20 <= grown < 96 << 20
        del held


#: An allocator preloaded over glibc's, as jemalloc or tcmalloc is through ``LD_PRELOAD``
#: (here it only forwards to glibc, which is all the test needs: malloc is no longer libc's).
_PRELOADED_MALLOC = """
#include <stddef.h>
void *__libc_malloc(size_t); void __libc_free(void *);
void *__libc_calloc(size_t, size_t); void *__libc_realloc(void *, size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
"""


def test_memory_handling_is_off_under_a_preloaded_allocator(tmp_path):
    """With another malloc preloaded, glibc's mallopt and malloc_trim govern a heap no tensor
    lives in: the harness says nothing of reusing freed memory (env.json) instead of claiming
    what it cannot do."""
    import shutil
    import subprocess
    import sys

    from kernelbench.measure import timing

    compiler = shutil.which("cc") or shutil.which("gcc")
    if timing._LIBC is None or compiler is None:
        pytest.skip("glibc and a C compiler only")
    assert timing.allocator_note()  # glibc's own malloc here
    source = tmp_path / "preloaded_malloc.c"
    source.write_text(_PRELOADED_MALLOC)
    shim = tmp_path / "preloaded_malloc.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", shim, source], check=True)
    probe = "from kernelbench.measure import timing; print(repr(timing.allocator_note()))"
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "''"
