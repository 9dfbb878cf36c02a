"""Pooling rounds into one row per key, and the physics checks on the pooled rows."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_row

from kernelbench.core import work_bytes, work_flops
from kernelbench.results.merge import pool_rows
from kernelbench.results.physics import annotate, peaks
from kernelbench.results.schema import ResultRow
from kernelbench.results.view import pooled_rows
from kernelbench.run.plan import followup_items

M, K, N = 2048, 768, 3072


def row(method: str, ratios: list[float], base_ms: float = 10.0, round_=0, **kw) -> dict:
    """A measured row whose pairs have these speedups over a baseline of ``base_ms`` (what the
    pooling derives from the pairs is left unset)."""
    raw_ms = [base_ms / r for r in ratios]
    fields = dict(tokens=M, seed=1, device_class="cpu-test", round=round_, raw_ms=raw_ms)
    fields |= dict(baseline_raw_ms=[base_ms] * len(ratios), paired=bool(ratios))
    median = sorted(raw_ms)[len(ratios) // 2] if ratios else None
    fields |= dict(samples=len(ratios), median_ms=median)
    fields |= dict(baseline_ms=None, speedup=None, rel_spread=None, rel_error=None)
    return dataclasses.asdict(make_row(method, **(fields | kw)))


def baseline(round_=0) -> dict:
    return row(
        "fp16",
        [],
        backend="torch",
        raw_ms=[10.0, 10.0, 10.0],
        paired=False,
        median_ms=10.0,
        round_=round_,
    )


def by_method(rows: list[ResultRow]) -> dict[str, ResultRow]:
    return {r.method: r for r in rows}


def tiny_run_args(out, extra_rounds: int, ci_target: float | None = 0.0001) -> list[str]:
    """``kernelbench run`` of one small cell (torch fp16 and int8_raw, one round) into ``out``
    with ``extra_rounds``; with ``ci_target``, one so narrow that every row stays wide."""
    args = ["run", "--sizes", "768", "--tokens", "8", "--backends", "torch", "--methods"]
    args += ["fp16,int8_raw", "--out", str(out), "--budget", "0.01", "--rounds", "1"]
    args += ["--extra-rounds", str(extra_rounds), "--no-report"]
    return args + (["--ci-target", str(ci_target)] if ci_target is not None else [])


def test_rounds_pool_into_one_row_with_an_interval():
    rows = [baseline(0), baseline(1)]
    rows += [row("int8_raw", [2.0, 2.1, 1.9], round_=0), row("int8_raw", [2.2, 2.0, 2.1], round_=1)]
    rows += [
        row("llm_int8", [1.0], round_=0),
        row("llm_int8", [], round_=1, status="failed", reason="boom"),
    ]
    pooled = by_method(pool_rows(rows))
    raw = pooled["int8_raw"]
    assert raw.samples == 6 and raw.rounds == 2 and raw.paired
    assert raw.speedup == pytest.approx(2.0, abs=0.11)
    assert raw.speedup_lo <= raw.speedup <= raw.speedup_hi
    assert pooled["fp16"].speedup == 1.0 and pooled["fp16"].rounds == 2
    # one pair says nothing about its own uncertainty; a failed round is named, not hidden
    assert pooled["llm_int8"].speedup == 1.0 and pooled["llm_int8"].speedup_lo is None
    assert "round 1 failed: boom" in pooled["llm_int8"].reason


def test_more_work_measured_faster_is_suspect_beyond_the_intervals_only():
    env = {"ci_target": 0.05}
    clear = [
        baseline(),
        row("int8_raw", [2.0] * 9 + [2.02]),
        row("vectorwise", [2.4] * 10),
        row("llm_int8", [1.6] * 10),
    ]
    flagged = by_method(pooled_rows(clear, env))
    assert not flagged["llm_int8"].suspect
    assert flagged["vectorwise"].suspect and flagged["int8_raw"].suspect
    assert "ordering: vectorwise" in flagged["vectorwise"].suspect_reason
    overlapping = [
        baseline(),
        row("int8_raw", [1.8, 2.2, 1.9, 2.1, 2.0]),
        row("llm_int8", [1.9, 2.3, 2.0, 2.2, 2.1]),
    ]
    assert not any(r.suspect for r in pooled_rows(overlapping, env))


def test_int8_raw_may_trail_by_first_touching_its_larger_output_and_no_more():
    # int32 output 2048 x 3072 x 4 B = 25.2 MB, 12.6 MB more than a bf16 one; at 2.52 GB/s of
    # first touch that is 5 ms: 100% of int8_raw's 5 ms (speedup 2.0 over a 10 ms baseline)
    rate = M * N * 2 / 5e-3 / 1e9
    env = {"ci_target": 0.05, "peak": {"first_touch": {"gbs": rate, "source": "measured"}}}
    within = [baseline(), row("int8_raw", [2.0] * 10), row("vectorwise", [3.9] * 10)]
    assert not any(r.suspect for r in pooled_rows(within, env))
    beyond = [baseline(), row("int8_raw", [2.0] * 10), row("vectorwise", [4.2] * 10)]
    flagged = by_method(pooled_rows(beyond, env))
    assert (
        flagged["int8_raw"].suspect
        and "for its larger output" in flagged["int8_raw"].suspect_reason
    )
    assert by_method(pooled_rows(within, {"ci_target": 0.05}))["int8_raw"].suspect  # no rate
    # calls timed with freed memory reused: the extra bytes cost only their writing (here at
    # ten times the first-touch rate: 10%)
    reused = {
        "ci_target": 0.05,
        "cpu_memory_while_timing": "glibc malloc while timing: ...",
        "peak": {
            "first_touch": {"gbs": rate, "source": "measured"},
            "bandwidth": {"gbs": 10 * rate, "source": "measured"},
        },
    }
    assert by_method(pooled_rows(within, reused))["int8_raw"].suspect
    near = [baseline(), row("int8_raw", [2.0] * 10), row("vectorwise", [2.15] * 10)]
    assert not any(r.suspect for r in pooled_rows(near, reused))


def test_rooflines_from_measured_peaks():
    peak = {
        "int8": {"tops": 1.0, "source": "measured"},
        "16bit": {"tops": 0.5, "source": "measured"},
        "bandwidth": {"gbs": 40.0, "source": "measured"},
        "fp32": {"tops": 9.0, "source": "a guess"},
    }  # not a source: ignored
    assert set(peaks({"peak": peak}, "cpu-test")) == {"int8", "16bit", "bandwidth"}
    ms_at_peak = work_flops(M, K, N) / 1e12 * 1e3  # one call at exactly 1 TOPS
    rows = pool_rows([baseline(), row("int8_raw", [1.0] * 5, base_ms=ms_at_peak * 2)])
    for r in rows:
        r.tops = r.flops / (r.median_ms / 1e3) / 1e12 if r.median_ms else None
    annotate(rows, peaks({"peak": peak}, "cpu-test"), 0.05)
    raw = by_method(rows)["int8_raw"]
    assert raw.roofline_tops == pytest.approx(1.0) and raw.roofline_share == pytest.approx(0.5)
    assert not raw.suspect
    fast = pool_rows([baseline(), row("int8_raw", [1.0] * 5, base_ms=ms_at_peak / 2)])
    annotate(fast, peaks({"peak": peak}, "cpu-test"), 0.05)
    assert by_method(fast)["int8_raw"].suspect
    reason = by_method(fast)["int8_raw"].suspect_reason
    assert "above roofline" in reason and "slower moment" in reason and "--remeasure" in reason
    # decode: one token is bandwidth-bound, far below the compute peak
    decode = dataclasses.replace(
        raw, m=1, flops=work_flops(1, K, N), bytes=work_bytes("int8_raw", 1, K, N)
    )
    annotate([decode], peaks({"peak": peak}, "cpu-test"), 0.05)
    assert decode.roofline_tops == pytest.approx(40e9 * decode.flops / decode.bytes / 1e12)


def test_a_cold_row_gets_its_share_of_the_roofline_at_the_bus_beside_each_call():
    peak = {
        "int8": {"tops": 100.0, "source": "measured"},  # decode: bound by bandwidth only
        "bandwidth": {"gbs": 80.0, "source": "measured"},
    }
    nbytes = work_bytes("int8_raw", 1, K, N)
    ms_at_40 = nbytes / 40e9 * 1e3  # a call that streams its bytes at 40 GB/s
    decode = dict(tokens=1, m=1, cache="cold")
    calls = [ms_at_40, ms_at_40, ms_at_40 * 2]
    rounds = [
        row("int8_raw", [1.0] * 2, base_ms=ms_at_40, round_=0, bus_gbps=[40.0, 50.0], **decode),
        row("int8_raw", [0.5], base_ms=ms_at_40, round_=1, bus_gbps=[25.0], **decode),
    ]
    for r, ms in zip(rounds, ([calls[0], calls[1]], [calls[2]]), strict=True):
        r["raw_ms"] = ms
    pooled = pool_rows(rounds)
    (raw,) = pooled
    assert raw.bus_gbps == [40.0, 50.0, 25.0]  # pooled over the rounds, aligned with raw_ms
    annotate(pooled, peaks({"peak": peak}, "cpu-test"), 0.05)
    assert raw.roofline_share == pytest.approx(0.5)  # 40 GB/s of the 80 GB/s peak
    # per call: 40/40, 40/50, 20/25 of the bus just before it: median 0.8
    assert raw.bus_roofline_share == pytest.approx(0.8)
    # a round without readings: the pooled row has none, and no bus share
    rounds[1]["bus_gbps"] = []
    (unaligned,) = pool_rows(rounds)
    annotate([unaligned], peaks({"peak": peak}, "cpu-test"), 0.05)
    assert unaligned.bus_gbps == [] and unaligned.bus_roofline_share is None
    # a hot row's readings (none are taken, but a hand-made row) give no bus share
    rounds[1]["bus_gbps"] = [25.0]
    for r in rounds:
        r["cache"] = "hot"
    (hot,) = pool_rows(rounds)
    annotate([hot], peaks({"peak": peak}, "cpu-test"), 0.05)
    assert hot.roofline_share is not None and hot.bus_roofline_share is None


def test_a_row_above_the_peak_but_within_the_bus_before_its_calls_is_not_suspect():
    """A bandwidth peak read in a slower state of the machine (the threads on one core complex)
    is passed by calls made in a faster one; the bus reading before each call tells the two
    apart from a number that no bus could give."""
    peak = {
        "int8": {"tops": 100.0, "source": "measured"},  # decode: bound by bandwidth only
        "bandwidth": {"gbs": 33.0, "source": "measured"},
    }
    nbytes = work_bytes("int8_raw", 1, K, N)
    ms_at_45 = nbytes / 45e9 * 1e3  # calls that stream their weights at 45 GB/s

    def decode_row(bus: list[float] | None) -> ResultRow:
        kw = dict(tokens=1, m=1, cache="cold", bus_gbps=bus or [])
        r = row("int8_raw", [1.0] * 6, base_ms=ms_at_45, **kw)
        (pooled,) = pool_rows([r])
        annotate([pooled], peaks({"peak": peak}, "cpu-test"), 0.05)
        return pooled

    faster_state = decode_row([51.0, 49.0, 52.0, 50.0, 48.0, 51.0])
    assert faster_state.roofline_share == pytest.approx(45 / 33)
    # per call 45 GB/s of the bus before it: the median of six, between 45/51 and 45/50
    assert faster_state.bus_roofline_share == pytest.approx((45 / 51 + 45 / 50) / 2)
    assert not faster_state.suspect
    assert faster_state.above_peak  # its share passes 100%: labelled, the tables say why
    slow_bus = decode_row([33.0] * 6)  # the bus read the peak's rate: the row is against it
    assert slow_bus.suspect and "above roofline" in slow_bus.suspect_reason
    assert not slow_bus.above_peak
    assert decode_row(None).suspect  # no reading before its calls: nothing excuses it
    # beyond the compute peak, a fast bus excuses nothing
    compute_bound = {**peak, "int8": {"tops": 0.001, "source": "measured"}}
    (beyond,) = pool_rows(
        [
            row(
                "int8_raw",
                [1.0] * 6,
                base_ms=ms_at_45,
                tokens=1,
                m=1,
                cache="cold",
                bus_gbps=[500.0] * 6,
            )
        ]
    )
    annotate([beyond], peaks({"peak": compute_bound}, "cpu-test"), 0.05)
    assert beyond.suspect


def test_a_cold_row_is_held_to_the_bandwidth_peak_of_the_placement_its_calls_ran_in():
    """A host that moves its two vCPUs between one core complex (link about 60 ns) and two
    (about 290 ns) reads its bus at about half the rate on one: a row is judged against the
    figure of the placement its calls ran in, not the best of either."""
    near, far = {"link_ns": 60.0, "gbs": 34.0}, {"link_ns": 290.0, "gbs": 63.0}
    nbytes = work_bytes("int8_raw", 1, K, N)

    def decode_row(gbps: list[float], links: list[float], placements, bus=None) -> ResultRow:
        peak = {
            "int8": {"tops": 100.0, "source": "measured"},  # decode: bound by bandwidth only
            "bandwidth": {"gbs": max(p["gbs"] for p in placements), "source": "measured"},
        }
        peak["bandwidth"]["placements"] = placements
        raw_ms = [nbytes / (g * 1e9) * 1e3 for g in gbps]
        r = row("int8_raw", [1.0] * len(gbps), tokens=1, m=1, cache="cold", link_ns=links)
        r |= dict(raw_ms=raw_ms, baseline_raw_ms=raw_ms, bus_gbps=bus or [])
        (pooled,) = pool_rows([r])
        annotate([pooled], peaks({"peak": peak}, "cpu-test"), 0.05)
        return pooled

    near_calls = decode_row([45.0] * 6, [55.0, 62.0, 70.0, 58.0, 61.0, 66.0], [near, far])
    assert near_calls.roofline_share == pytest.approx(45 / 34)
    assert near_calls.suspect and "placements" in near_calls.suspect_reason
    # a bus reading of a faster moment excuses nothing where the placement has its own peak
    fast_bus = [51.0] * 6
    assert decode_row([45.0] * 6, [60.0] * 6, [near, far], bus=fast_bus).suspect
    far_calls = decode_row([45.0] * 6, [280.0, 300.0, 290.0, 310.0, 270.0, 295.0], [near, far])
    assert far_calls.roofline_share == pytest.approx(45 / 63) and not far_calls.suspect
    assert not far_calls.above_peak and not near_calls.above_peak
    # half on each: the calls' median time against the median of their placements' bounds
    mixed = decode_row([30.0, 30.0, 30.0, 50.0, 50.0, 50.0], [60.0] * 3 + [290.0] * 3, [near, far])
    assert not mixed.suspect
    # the median as the row's own (a step: the third of six), the far calls' time and bound
    assert mixed.median_ms == pytest.approx(nbytes / 50e9 * 1e3)
    assert mixed.roofline_tops == pytest.approx(mixed.flops / (nbytes / 63e9) / 1e12)
    # a placement the peak has no figure for: its best figure, and the bus may excuse the row
    unmeasured = decode_row([45.0] * 6, [290.0] * 6, [near])
    assert unmeasured.roofline_share == pytest.approx(45 / 34) and unmeasured.suspect
    excused = decode_row([45.0] * 6, [290.0] * 6, [near], bus=fast_bus)
    assert not excused.suspect and excused.above_peak


def test_a_rows_roofline_weighs_its_calls_as_its_median_does():
    """A pooled row's median gives each round the same weight: a first round of many calls
    on one core complex and later rounds of few on two put the median among the latter, and
    the roofline its shown share is of must be theirs."""
    near, far = {"link_ns": 60.0, "gbs": 37.0}, {"link_ns": 290.0, "gbs": 64.5}
    peak = {
        "int8": {"tops": 100.0, "source": "measured"},
        "bandwidth": {"gbs": 64.5, "source": "measured", "placements": [near, far]},
    }
    nbytes = work_bytes("int8_raw", 1, K, N)

    def round_of(gbps: float, link: float, calls: int, round_: int) -> dict:
        ms = nbytes / (gbps * 1e9) * 1e3
        r = row("int8_raw", [1.0] * calls, tokens=1, m=1, cache="cold", round_=round_)
        return r | dict(raw_ms=[ms] * calls, baseline_raw_ms=[ms] * calls, link_ns=[link] * calls)

    rounds = [round_of(25.0, 60.0, 8, 0)] + [round_of(40.0, 290.0, 2, i) for i in (1, 2, 3)]
    (pooled,) = pool_rows(rounds)
    annotate([pooled], peaks({"peak": peak}, "cpu-test"), 0.05)
    assert pooled.median_ms == pytest.approx(nbytes / 40e9 * 1e3)  # the far rounds' calls
    assert pooled.roofline_share == pytest.approx(40 / 64.5)  # not 40 / 37
    assert not pooled.suspect


def test_a_peak_keeps_a_best_call_per_placement_of_the_threads():
    from kernelbench.run.peak import BandwidthCall, bandwidth_placements, merge_placements

    calls = [BandwidthCall(30.0 + i % 5, 55.0 + i % 7, "sum") for i in range(30)]
    calls += [BandwidthCall(60.0 + i % 4, 280.0 + i, "gemv") for i in range(10)]
    calls += [BandwidthCall(99.0, None, "copy"), BandwidthCall(98.0, 9e6, "copy")]  # unplaced
    near, far = bandwidth_placements(calls, "today")
    assert near["gbs"] == 34.0 and near["calls"] == 30 and 55 <= near["link_ns"] <= 61
    assert far["gbs"] == 63.0 and far["calls"] == 10 and "gemv" in far["note"]
    (one,) = bandwidth_placements(calls[:30], "today")  # one group: one placement
    assert one["gbs"] == 34.0
    assert bandwidth_placements([BandwidthCall(50.0, None, "sum")] * 30, "today") == []
    # a re-measurement keeps each placement's higher best call, and placements it did not see
    fresh = [{"link_ns": 70.0, "gbs": 33.0}, {"link_ns": 800.0, "gbs": 40.0}]
    merged = merge_placements([near, far, "junk"], fresh)
    assert [(p["link_ns"] < 100, p["gbs"]) for p in merged] == [
        (True, 34.0),
        (False, 63.0),
        (False, 40.0),
    ]
    assert merge_placements(None, fresh) == fresh


def test_wide_intervals_are_flagged_and_get_an_extra_round():
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import RunOptions, plan

    env = {"ci_target": 0.05}
    rows = [baseline(), row("int8_raw", [1.0, 2.0, 3.0, 1.5, 2.5]), row("vectorwise", [1.5] * 8)]
    flagged = by_method(pooled_rows(rows, env))
    assert flagged["int8_raw"].ci_wide and not flagged["vectorwise"].ci_wide
    case = load_case("gpt3")
    items = plan(case, RunOptions(sizes=(768,), tokens=(M,), rounds=2))
    assert [i.round for i in items] == [0, 1]
    (extra,) = followup_items(rows, env, items, next_round=2)
    assert extra.round == 2 and extra.only == frozenset({("custom", "int8_raw")})
    assert followup_items([baseline(), row("vectorwise", [1.5] * 8)], env, items, 2) == []
    # a budget for the extra round: a cell that would not fit is left out
    assert followup_items(rows, env, items, 2, budget_s=1e-6) == []
    assert followup_items(rows, env, items, 2, budget_s=100.0) == [extra]
    # a fast row still samples for its budget: 0.5 s of it does not fit in 0.3 s
    assert followup_items(rows, env, items, 2, budget_s=0.3, row_budget_s=0.5) == []
    assert followup_items(rows, env, items, 2, budget_s=0.6, row_budget_s=0.5) == [extra]


def test_extra_rounds_serve_rows_within_reach_of_the_target_first():
    """Two wide cells and a budget for one: the row at the target's edge gets the extra round
    though its cell costs more; the row ten times wider gets what budget is left."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import RunOptions, plan

    env = {"ci_target": 0.05}
    near = [2.0 + 0.1 * ((i % 5) - 2) for i in range(15)]  # half-width 5%: just wide
    rows = [baseline(), row("int8_raw", [1.0, 2.0, 3.0, 1.5, 2.5])]  # half-width 50%
    rows += [
        row(
            "fp16",
            [],
            backend="torch",
            raw_ms=[100.0] * 3,
            paired=False,
            median_ms=100.0,
            tokens=256,
        ),
        row("int8_raw", near, base_ms=100.0, tokens=256),
    ]
    pooled = {r.tokens: r for r in pooled_rows(rows, env) if r.method == "int8_raw"}
    assert pooled[256].ci_wide and pooled[M].ci_wide
    items = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(256, M), rounds=1))
    (only,) = followup_items(rows, env, items, 1, budget_s=0.16)
    assert only.tokens == 256
    both = followup_items(rows, env, items, 1, budget_s=1.0)
    assert [i.tokens for i in both] == [256, M]
    # without a budget every wide row gets its round, as before
    assert len(followup_items(rows, env, items, 1)) == 2


def test_within_reach_projects_a_rows_rounds_not_its_width_alone():
    """A cheap row of six rounds at about +-9% (one more round narrows it 1.13x: out of reach)
    and a dear one of three rounds at about +-6% (1.56x: within reach in one round), a budget
    for one cell: the dear row gets the round. By the width alone (within twice the target)
    the cheap one came first."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import RunOptions, plan

    env = {"ci_target": 0.05, "rounds": 3, "extra_rounds": 3}
    rows = []
    for r, ratio in enumerate([1.89, 2.12] * 3):  # 2048 tokens, 10 ms pairs
        rows += [baseline(round_=r), row("int8_raw", [ratio] * 5, round_=r)]
    for r, ratio in enumerate([1.95, 2.0, 2.05]):  # 256 tokens, 100 ms pairs
        dear = dict(tokens=256, base_ms=100.0, round_=r)
        rows += [
            baseline(round_=r) | {"tokens": 256, "raw_ms": [100.0] * 3, "median_ms": 100.0},
            row("int8_raw", [ratio] * 5, **dear),
        ]
    pooled = {r.tokens: r for r in pooled_rows(rows, env) if r.method == "int8_raw"}
    assert pooled[M].rounds == 6 and pooled[256].rounds == 3
    widths = {t: (p.speedup_hi - p.speedup_lo) / 2 / p.speedup for t, p in pooled.items()}
    assert 0.08 < widths[M] <= 0.10 and 0.05 < widths[256] < 0.075
    items = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(256, M), rounds=3))
    (only,) = followup_items(rows, env, items, 3, budget_s=0.16)
    assert only.tokens == 256 and only.round == 3
    # the last extra round: one more round must do it, and it still does for the dear row
    (last,) = followup_items(rows, env | {"extra_rounds": 1}, items, 3, budget_s=0.16)
    assert last.tokens == 256
    # with room for both, the cheap row gets its round too
    assert sorted(i.tokens for i in followup_items(rows, env, items, 3, budget_s=1.0)) == [256, M]


def test_an_ordering_contradiction_gets_the_extra_round_before_cheaper_wide_rows():
    """A one-round run's intervals miss the spread between rounds, so a contradiction of the
    work order is measured again first, even where a cheaper cell holds a row within reach."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import RunOptions, plan

    env = {"ci_target": 0.05}
    contradiction = [  # 2048 tokens, 10 ms pairs: vectorwise (more work) measured faster
        baseline(),
        row("int8_raw", [2.0] * 9 + [2.02]),
        row("vectorwise", [2.4] * 10),
    ]
    near = [2.0 + 0.12 * ((i % 5) - 2) for i in range(15)]  # half-width 6%: just wide
    cheap = [
        row("fp16", [], backend="torch", raw_ms=[5.0] * 3, paired=False, median_ms=5.0, tokens=8),
        row("int8_raw", near, base_ms=5.0, tokens=8),
    ]
    pooled = pooled_rows(contradiction + cheap, env)
    assert {(r.tokens, r.method) for r in pooled if r.suspect} == {
        (M, "int8_raw"),
        (M, "vectorwise"),
    }
    assert any(r.tokens == 8 and r.ci_wide and not r.suspect for r in pooled)
    items = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(8, M), rounds=1))
    # room for one cell (pairs of 29 and 7.5 ms): the contradiction's, though it costs more
    (only,) = followup_items(contradiction + cheap, env, items, 1, budget_s=0.03)
    assert only.tokens == M
    assert only.only == frozenset({("custom", "int8_raw"), ("custom", "vectorwise")})
    assert [i.tokens for i in followup_items(contradiction + cheap, env, items, 1, 1.0)] == [M, 8]


def test_the_quick_profile_looks_again_at_its_flagged_rows_within_seconds():
    from kernelbench.run.plan import RunOptions, extra_round_budget
    from kernelbench.run.profiles import resolve

    quick = resolve("quick")
    assert quick.rounds == 1 and quick.extra_rounds == 1
    opts = RunOptions(
        extra_rounds=quick.extra_rounds,
        extra_share=quick.extra_share,
        extra_round_budget_s=quick.extra_round_budget_s,
    )
    assert extra_round_budget(15.0, opts) == 5.0  # a 15 s first look gets 5 s more at most
    assert resolve("quick", extra_rounds=0).extra_rounds == 0  # the CI gate's protocol


def test_extra_rounds_judge_each_placement_on_its_own():
    """Calls on one core complex (link 50 ns) and on two (330 ns) give two speedups: the
    pooled interval spans both, but a row narrow in each placement is settled; a row wide in
    one placement only waits while the host is in the other."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import RunOptions, plan

    env = {"ci_target": 0.05}

    def placed(method: str, near: list[float], far: list[float], **kw) -> dict:
        links = [50.0] * len(near) + [330.0] * len(far)
        return row(method, near + far, bus_gbps=[60.0] * len(links), link_ns=links, **kw)

    steady_near = [2.0 + 0.01 * (i % 3) for i in range(12)]
    steady_far = [4.0 + 0.02 * (i % 3) for i in range(12)]
    scattered_near = [1.5, 2.5, 2.0, 3.0, 1.2, 2.2] * 2
    scattered_far = [3.0, 5.0, 4.0, 6.0, 2.5, 4.5] * 2
    rows = [baseline(), placed("int8_raw", steady_near, steady_far)]
    assert by_method(pooled_rows(rows, env))["int8_raw"].ci_wide  # it mixes 2x and 4x
    items = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(M, 256), rounds=1))
    assert followup_items(rows, env, items, 1) == []
    # wide on one complex, in a cell that costs 10x the other's, wide on two complexes
    rows += [
        placed("vectorwise", scattered_near, steady_far, base_ms=10.0),
        baseline() | {"tokens": 256, "raw_ms": [1.0] * 3, "median_ms": 1.0},
        placed("int8_raw", steady_near, scattered_far, tokens=256, base_ms=1.0),
    ]

    def chosen(link_now_ns: float | None) -> list[int]:
        # a budget for the dear cell, not for both: the cheap one first, all else equal
        extra = followup_items(rows, env, items, 1, budget_s=0.013, link_now_ns=link_now_ns)
        return [i.tokens for i in extra]

    assert chosen(None) == [256]
    assert chosen(330.0) == [256]  # the host is on two complexes now
    assert chosen(55.0) == [M]  # on one: the round adds pairs where they are wanted
    (dear,) = [i for i in followup_items(rows, env, items, 1) if i.tokens == M]
    assert dear.only == frozenset({("custom", "vectorwise")})  # int8_raw is settled


def test_an_extra_round_starts_only_the_cells_whose_last_time_fits_its_budget():
    """Cells are timed as the executor takes them (from handing one out to being asked for the
    next); an extra round skips a cell whose last time no longer fits and goes on to the next,
    and a cell not yet timed counts as free."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import CellPacer, RunOptions, plan

    now = [0.0]
    pacer = CellPacer(clock=lambda: now[0])
    cells = plan(load_case("gpt3"), RunOptions(sizes=(768, 1024, 2048), tokens=(1,), rounds=1))
    took = {768: 4.0, 1024: 25.0, 2048: 3.0}
    for item in pacer.paced(cells):  # a full round: no budget, every cell
        pacer.note_row(item, timed=True)
        now[0] += took[item.size.d_model]
    assert sorted(pacer.seconds.values()) == [3.0, 4.0, 25.0]
    started = []
    for item in pacer.paced(cells, budget_s=10.0):
        started.append(item.size.d_model)
        pacer.note_row(item, timed=True)
        now[0] += 1.0  # each takes a second now
    assert started == [768, 2048]  # 4 s fits; 25 s does not; 3 s still fits after 4
    assert pacer.seconds[(768, "ffn1", 1)] == 1.0  # the latest time stands for the next
    fresh = CellPacer(clock=lambda: now[0])
    assert len(list(fresh.paced(cells, budget_s=0.0))) == 3
    for _ in pacer.paced(cells):  # every row written before (resumed): no row comes back
        now[0] += 0.5
    assert pacer.seconds[(1024, "ffn1", 1)] == 25.0  # the last time a cell was timed stands


def test_an_extra_round_estimates_a_cell_by_the_rows_it_measures_again():
    """An extra round measures only a cell's uncertain rows (and their baseline): the cell's
    last time is scaled to them, so a budget too small for the whole cell still takes it."""
    from dataclasses import replace

    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import CellPacer, RunOptions, plan

    now = [0.0]
    pacer = CellPacer(clock=lambda: now[0])
    (cell,) = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(1,), rounds=1))
    for item in pacer.paced([cell]):
        for _ in range(9):  # the baseline and 8 other rows timed
            pacer.note_row(item, timed=True)
        pacer.note_row(item, timed=False)  # a skipped row costs nothing
        now[0] += 20.0
    assert pacer.rows[(768, "ffn1", 1)] == 9
    extra = replace(cell, round=1, only=frozenset({("custom", "llm_int8")}))
    assert pacer.estimate(extra) == 20.0 * 2 / 9
    assert pacer.estimate(replace(cell, round=1)) == 20.0  # the whole cell again
    assert list(pacer.paced([replace(cell, round=1)], budget_s=5.0)) == []
    assert list(pacer.paced([extra], budget_s=5.0)) == [extra]


def test_extra_rounds_carry_what_they_leave_to_the_next():
    """Each extra round may take its share and what the earlier ones left (less what they
    overspent); together they never take more than their shares."""
    from kernelbench.run.plan import round_allowance

    assert round_allowance(50.0, 0, 0.0) == 50.0
    assert round_allowance(50.0, 1, 30.0) == 70.0  # the first left 20 s
    assert round_allowance(50.0, 1, 60.0) == 40.0  # the first overspent 10 s
    assert round_allowance(50.0, 2, 30.0 + 65.0) == pytest.approx(55.0)
    assert round_allowance(50.0, 0, 80.0) == 0.0  # resumed after more than a round's share


def test_a_cell_passed_over_for_the_budget_goes_first_in_its_tier_next_round():
    """A dear cell that did not fit a round's share waits; in a later round whose allowance
    covers it, it goes before the cheaper cells of its tier (which every round served first,
    so that it never got one), and a waiting cell that does not fit leaves the others theirs."""
    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import CellPacer, RunOptions, plan

    env = {"ci_target": 0.05}
    near = [2.0 + 0.1 * ((i % 5) - 2) for i in range(15)]  # just wide: within reach
    rows = [baseline(), row("int8_raw", near)]  # 2048 tokens, pairs of 10 + 5 ms
    rows += [
        baseline() | {"tokens": 256, "raw_ms": [100.0] * 3, "median_ms": 100.0},
        row("int8_raw", near, base_ms=100.0, tokens=256),  # pairs of 100 + 50 ms
    ]
    items = plan(load_case("gpt3"), RunOptions(sizes=(768,), tokens=(256, M), rounds=1))
    dear = (768, "ffn1", 256)

    def tokens(**kw) -> list[int]:
        return [i.tokens for i in followup_items(rows, env, items, 1, **kw)]

    assert tokens() == [M, 256]  # cheapest first
    assert tokens(waiting={dear}) == [256, M]
    assert tokens(budget_s=0.16) == [M]  # room for one: the cheap one
    assert tokens(budget_s=0.16, waiting={dear}) == [256]
    assert tokens(budget_s=0.2, waiting={dear}) == [256, M]
    assert tokens(budget_s=0.1, waiting={dear}) == [M]  # it does not fit: the cheap one does
    # the pacer: a cell it passes over waits until it hands it out
    now = [0.0]
    pacer = CellPacer(clock=lambda: now[0])
    for item in pacer.paced(items):
        pacer.note_row(item, timed=True)
        now[0] += 60.0 if item.tokens == 256 else 5.0
    assert list(pacer.paced(items, budget_s=50.0)) == [items[1]] and set(pacer.waiting) == {dear}
    (left_out,) = pacer.left_out()  # as env.json keeps it: estimate and the round's seconds left
    assert left_out == {
        "d_model": 768,
        "layer": "ffn1",
        "tokens": 256,
        "estimate_s": 60.0,
        "left_s": 50.0,
    }
    for _ in pacer.paced(items, budget_s=70.0):
        now[0] += 1.0
    assert pacer.waiting == {} and pacer.left_out() == []


def test_a_paced_sweep_chooses_its_extra_cells_by_their_measured_times(tmp_path, monkeypatch):
    """The local executor's extra rounds are cut by the pacer (measured cell times), not by the
    estimate from the calls that an unpaced executor uses."""
    from typer.testing import CliRunner

    import kernelbench.run.plan as plan_module
    from kernelbench.cli import app

    budgets = []
    real = plan_module.followup_items

    def recording(*args, **kwargs):
        budgets.append(args[4] if len(args) > 4 else kwargs.get("budget_s"))
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "followup_items", recording)
    args = tiny_run_args(tmp_path / "run", extra_rounds=1, ci_target=None)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert budgets == [None]


def test_a_pacer_recalls_the_cells_another_process_timed():
    """A resumed run's pacer takes each cell's last time and rows from the earlier process's
    memory (through JSON, as env.json keeps it), so its extra round is cut as the earlier
    process's would have been; entries that are not a cell's time are passed over."""
    import json

    from kernelbench.run.cases import load_case
    from kernelbench.run.plan import CellPacer, RunOptions, plan

    now = [0.0]
    first = CellPacer(clock=lambda: now[0])
    cells = plan(load_case("gpt3"), RunOptions(sizes=(768, 1024, 2048), tokens=(1,), rounds=1))
    took = {768: 4.0, 1024: 25.0, 2048: 3.0}
    for item in first.paced(cells):
        first.note_row(item, timed=True)
        now[0] += took[item.size.d_model]
    kept = json.loads(json.dumps(first.memory()))
    assert [c["seconds"] for c in kept] == [4.0, 25.0, 3.0] and {c["rows"] for c in kept} == {1}
    bad = [{"d_model": 4096}, {**kept[0], "seconds": "nan"}, {**kept[0], "rows": -1}, "x", None]
    resumed = CellPacer(clock=lambda: now[0])
    assert resumed.recall([*bad, *kept]) == 3
    assert resumed.seconds == first.seconds and resumed.rows == first.rows
    assert [i.size.d_model for i in resumed.paced(cells, budget_s=10.0)] == [768, 2048]
    assert CellPacer().recall({"not": "a list"}) == 0
    # a cell the pacer timed itself keeps its own time
    own = CellPacer(clock=lambda: now[0])
    for item in own.paced(cells[:1]):
        own.note_row(item, timed=True)
        now[0] += 1.0
    own.recall(kept)
    assert own.seconds[(768, "ffn1", 1)] == 1.0 and own.seconds[(1024, "ffn1", 1)] == 25.0


def test_a_resumed_run_spends_its_extra_rounds_as_the_run_it_continues(tmp_path, monkeypatch):
    """A run interrupted after its planned rounds and resumed: the extra rounds' budget is a
    share of the planned rounds' time over both processes (not the resuming one's, which had
    nothing planned left), and the pacer knows the cells the first process timed."""
    import json

    from typer.testing import CliRunner

    import kernelbench.run.plan as plan_module
    from kernelbench.cli import app

    planned, known = [], []
    real_budget, real_followup, real_paced = (
        plan_module.extra_round_budget,
        plan_module.followup_items,
        plan_module.CellPacer.paced,
    )

    def budget(planned_s, opts):
        planned.append(planned_s)
        return real_budget(planned_s, opts)

    def paced(self, items, budget_s=None):
        if budget_s is not None:
            known.append(dict(self.seconds))
        return real_paced(self, items, budget_s)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "extra_round_budget", budget)
    monkeypatch.setattr(plan_module.CellPacer, "paced", paced)
    monkeypatch.setattr(plan_module, "followup_items", interrupted)
    out = tmp_path / "run"
    args = tiny_run_args(out, extra_rounds=1)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 130, first.output
    env = json.loads((out / "env.json").read_text())
    before = env["planned_rounds_s"]
    assert before > 0 and before == pytest.approx(planned[0], abs=0.1)
    (cell,) = env["cell_seconds"]
    assert (cell["d_model"], cell["layer"], cell["tokens"], cell["rows"]) == (768, "ffn1", 8, 2)
    monkeypatch.setattr(plan_module, "followup_items", real_followup)
    again = CliRunner().invoke(app, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert len(planned) == 2 and planned[1] >= before  # the first process's planned time counts
    assert known and known[0].get((768, "ffn1", 8)) == pytest.approx(cell["seconds"], abs=0.01)
    env = json.loads((out / "env.json").read_text())
    assert env["planned_rounds_s"] == pytest.approx(planned[1], abs=0.1)


def test_a_run_counts_its_extra_rounds_seconds_over_every_process(tmp_path, monkeypatch):
    """Each extra round's allowance counts what the earlier extra rounds took, the earlier
    processes' too (env.json's ``extra_rounds_s``): a resumed run re-walks its extra rounds
    with their rows written, and without it would hand their shares out again."""
    import json

    from typer.testing import CliRunner

    import kernelbench.run.plan as plan_module
    from kernelbench.cli import app

    spent = []
    real = plan_module.round_allowance

    def recording(per_round_s, extra, spent_s):
        spent.append((extra, spent_s))
        return real(per_round_s, extra, spent_s)

    monkeypatch.setattr(plan_module, "round_allowance", recording)
    out = tmp_path / "run"
    args = tiny_run_args(out, extra_rounds=2)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [e for e, _ in spent] == [0, 1]
    assert spent[0][1] == 0.0 and spent[1][1] > 0.0
    env = json.loads((out / "env.json").read_text())
    took = env["extra_rounds_s"]
    assert took >= round(spent[1][1], 1) > 0
    assert env["extra_left_out"] == []  # a cell of a few calls fits every round
    spent.clear()
    again = CliRunner().invoke(app, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert spent and spent[0] == (0, pytest.approx(took))


def test_extra_rounds_of_a_longer_sweep_get_a_share_of_its_time():
    """Each extra round may take the share of the planned rounds' time split over the extra
    rounds, and never less than the fixed minimum a short run gets."""
    from kernelbench.run.plan import RunOptions, extra_round_budget

    opts = RunOptions(extra_rounds=3, extra_share=0.2, extra_round_budget_s=30.0)
    assert extra_round_budget(900.0, opts) == pytest.approx(60.0)  # 0.2 x 900 s / 3
    assert extra_round_budget(60.0, opts) == 30.0  # a short run: the minimum
    assert extra_round_budget(0.0, opts) == 30.0  # resumed with every planned row written
    assert extra_round_budget(900.0, RunOptions(extra_rounds=0)) == 0.0
    assert extra_round_budget(900.0, RunOptions(extra_rounds=3, extra_share=0.0)) == 30.0


def test_peak_does_not_try_shapes_a_slow_path_would_take_minutes_on(monkeypatch):
    """A series is tried smallest shape first; once its rate is known, a shape whose call would
    exceed PEAK_MAX_CALL_S is not called (torch's bf16 GEMM on an AVX2 CPU: ~17 GFLOP/s)."""
    from kernelbench.run import peak

    rate_flops = 17e9
    called = []
    monkeypatch.setattr(peak, "_best_s", lambda engine, call: call())

    def make_call(m, k, n):
        called.append((m, k, n))
        return lambda: work_flops(m, k, n) / rate_flops

    tops, how = peak._best_of_shapes(None, make_call, "slow")
    assert tops == pytest.approx(rate_flops / 1e12)
    smallest = min(peak.PEAK_SHAPES, key=lambda s: work_flops(*s))
    assert called[0] == smallest
    assert all(work_flops(*s) / rate_flops <= peak.PEAK_MAX_CALL_S for s in called[1:])
    assert len(called) < len(peak.PEAK_SHAPES) and "not tried" in how
    # a fast series tries every shape
    called.clear()
    rate_flops = 1e15
    peak._best_of_shapes(None, make_call, "fast")
    assert sorted(called) == sorted(peak.PEAK_SHAPES)


@pytest.mark.core_wait
def test_peaks_on_the_cpu_wait_for_fast_cores_before_each_call():
    """A peak is a best call: on a host that shares its cores out, its calls wait for the
    cores' usual speed (the run's wait), or a slow moment is cached as the machine's limit."""
    import torch

    from kernelbench.kernels import cpu_ext
    from kernelbench.run import peak
    from kernelbench.settings import default

    engine = peak._engine(torch.device("cpu"))
    gate = engine.timer.core_gate
    if not cpu_ext.available():
        assert gate is None
        return
    assert gate is not None and gate.max_wait_s == default("core_wait_s")
    assert gate.probe is cpu_ext.core_probe_ns
    assert engine.timer.before_call is None  # hot caches: peaks are the most a device attains


def test_cold_timers_in_tests_do_not_wait_for_fast_cores():
    """The suite's fixture: a test's run does not wait for fast cores (its time would follow the
    machine's load); the run's setting itself is unchanged."""
    from kernelbench.measure.timing import call_timer
    from kernelbench.settings import default

    timer = call_timer("cpu", cache="cold", core_probe=lambda: 1.0, core_wait_s=2.0)
    assert timer.core_gate is not None and timer.core_gate.max_wait_s == 0.0
    assert default("core_wait_s") > 0


def test_rows_above_a_peak_without_their_placement_make_the_run_measure_it_again():
    """A flagged row and a row above the peak only where it has no figure for the calls'
    placement both count: a re-measurement may add that placement's figure."""
    import pandas as pd

    from kernelbench.cli.sweep import _rows_above_roofline

    view = pd.DataFrame(
        {
            "suspect_reason": ["above roofline: 1.2 TOPS > 1.0", "", "", "ordering: x"],
            "above_peak": [False, True, False, False],
        }
    )
    assert _rows_above_roofline(view) == 2
    assert _rows_above_roofline(view.drop(columns="above_peak")) == 1  # older views
