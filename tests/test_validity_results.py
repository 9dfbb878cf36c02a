"""The reader's side of measurement validity: cache modes in rows and rooflines, per-sample
usage through pooling, the precision line and what wide rows' slow calls saw (torch-free)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from conftest import make_row

from kernelbench.core import work_bytes, work_flops
from kernelbench.results.merge import pool_rows
from kernelbench.results.physics import annotate, cache_levels, peaks, resident_level
from kernelbench.results.schema import SCHEMA_VERSION, upgrade_row
from kernelbench.results.view import precision_line, slow_calls

K, N = 768, 3072
PEAK = {
    "int8": {"tops": 1.0, "source": "measured"},
    "bandwidth": {"gbs": 40.0, "source": "measured"},
}
LEVELS = {"L1d": 48 * 2**10, "L2": 2**20, "L3": 32 * 2**20}


def decode_row(cache: str, ms: float):
    """An int8_raw row at one token, timed at ``ms`` per call."""
    flops, nbytes = work_flops(1, K, N), work_bytes("int8_raw", 1, K, N)
    row = make_row(
        "int8_raw", tokens=1, m=1, k=K, n=N, cache=cache, flops=flops, bytes=nbytes,
        raw_ms=[ms] * 5, median_ms=ms, samples=5, device_class="cpu-test",
    )  # fmt: skip
    row.tops = flops / (ms / 1e3) / 1e12
    return row


def test_a_hot_cache_resident_row_is_labelled_not_suspect_and_a_cold_one_is_bounded_by_dram():
    # 2.4 MB of int8 weight at 23 us: 100 GB/s, beyond the 40 GB/s of memory
    fast_ms = work_bytes("int8_raw", 1, K, N) / 100e9 * 1e3
    hot, cold = decode_row("hot", fast_ms), decode_row("cold", fast_ms)
    annotate([hot, cold], peaks({"peak": PEAK}, "cpu-test"), 0.05, levels=LEVELS)
    assert hot.cache_resident and not hot.suspect
    assert resident_level(hot, LEVELS) == "L3"
    assert hot.roofline_tops == pytest.approx(1.0)  # compute only: cache bandwidth unmeasured
    # the same time from a cold row beats the memory's bandwidth: physics says no
    assert not cold.cache_resident and cold.suspect
    assert "above roofline" in cold.suspect_reason
    # a hot row too large for any cache streams from memory: bounded by DRAM as before
    big = decode_row("hot", fast_ms)
    annotate([big], peaks({"peak": PEAK}, "cpu-test"), 0.05, levels={"L3": 2**20})
    assert not big.cache_resident and big.suspect
    # without recorded cache sizes (older runs) nothing is labelled
    old = decode_row("hot", fast_ms)
    annotate([old], peaks({"peak": PEAK}, "cpu-test"), 0.05)
    assert not old.cache_resident and old.suspect


def test_cache_levels_from_env():
    assert cache_levels({"cache": {"mode": "cold", "levels": LEVELS}}) == LEVELS
    assert cache_levels({}) == {} and cache_levels({"cache": "cold"}) == {}
    assert cache_levels({"cache": {"levels": {"L3": "big", "L2": 0}}}) == {}


def test_older_rows_read_as_the_cache_they_had():
    cpu = dataclasses.asdict(make_row("int8_raw", device="cpu"))
    cuda = dataclasses.asdict(make_row("int8_raw", device="cuda"))
    for r in (cpu, cuda):
        del r["cache"]
        r["schema_version"] = 2
    assert upgrade_row(cpu)["cache"] == "hot" and upgrade_row(cuda)["cache"] == "cold"
    assert upgrade_row(cpu)["schema_version"] == SCHEMA_VERSION


def _round(round_: int, raw, faults, cache="cold", steal=0.01) -> dict:
    row = make_row(
        "int8_raw", round=round_, raw_ms=raw, samples=len(raw), median_ms=sorted(raw)[1],
        minor_faults=faults, major_faults=[0] * len(raw), vol_switches=[0] * len(raw),
        invol_switches=[1] + [0] * (len(raw) - 1), cache=cache, steal_share=steal,
    )  # fmt: skip
    return dataclasses.asdict(row)


def test_pooling_keeps_usage_aligned_with_the_samples_and_names_mixed_caches():
    (pooled,) = pool_rows([_round(0, [1.0, 1.1, 2.0], [0, 0, 900]), _round(1, [1.0] * 3, [0] * 3)])
    assert pooled.raw_ms == [1.0, 1.1, 2.0, 1.0, 1.0, 1.0]
    assert pooled.minor_faults == [0, 0, 900, 0, 0, 0]
    assert pooled.cache == "cold" and pooled.steal_share == pytest.approx(0.01)
    no_usage = _round(1, [1.0] * 3, [0] * 3)
    no_usage["minor_faults"] = []  # an older round without usage: none is kept (not misaligned)
    (pooled,) = pool_rows([_round(0, [1.0, 1.1, 2.0], [0, 0, 900]), no_usage])
    assert pooled.minor_faults == []
    (mixed,) = pool_rows([_round(0, [1.0] * 3, [0] * 3), _round(1, [1.0] * 3, [0] * 3, "hot")])
    assert mixed.cache == "mixed"


def test_slow_calls_say_what_the_slow_samples_saw():
    seen = slow_calls(_round(0, [1.0, 1.0, 1.0, 2.0, 3.0], [0, 0, 0, 36000, 0]))
    assert seen["samples"] == 5 and seen["slow"] == 2
    assert seen["slow_faulted"] == 1 and seen["max_faults"] == 36000
    assert seen["slow_preempted"] == 0  # the preempted call (the first) was not slow
    assert seen["steal_share"] == pytest.approx(0.01)
    assert slow_calls({"raw_ms": []})["slow"] == 0


def test_precision_line_counts_rows_within_the_target_and_the_median_width():
    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "ok", "skipped"],
            "backend": ["custom", "custom", "custom", "torch", "custom"],
            "method": ["llm_int8", "int8_raw", "llm_int8", "fp16", "vectorwise"],
            "layer": ["ffn1", "ffn1", "block", "ffn1", "ffn1"],
            "speedup": [2.0, 1.0, 1.5, 1.0, None],
            "speedup_lo": [1.96, 0.8, 1.4, None, None],
            "speedup_hi": [2.04, 1.2, 1.6, None, None],
            "ci_wide": [False, True, False, False, False],
        }
    )
    line = precision_line(df, 0.05)
    assert line == ("precision: 1 of 2 speedups within ±5% (95% interval), median half-width 11.0%")
    assert precision_line(df[df["status"] == "skipped"], 0.05) == ""


def test_precision_by_token_count_names_the_widest_when_beyond_reach():
    from kernelbench.results.view import precision_by_tokens_line

    df = pd.DataFrame(
        {
            "status": ["ok"] * 5,
            "backend": ["custom", "custom", "torch", "custom", "custom"],
            "method": ["llm_int8", "int8_raw", "fp16", "llm_int8", "int8_raw"],
            "layer": ["ffn1"] * 5,
            "tokens": [1, 1, 1, 2048, 2048],
            "speedup": [2.0, 2.0, 1.0, 0.5, 0.5],
            "speedup_lo": [1.96, 1.9, None, 0.4, 0.45],
            "speedup_hi": [2.04, 2.1, None, 0.6, 0.55],
            "ci_wide": [False, False, False, True, True],
        }
    )
    line = precision_by_tokens_line(df, 0.05)
    assert "1 token: 2 of 2 (3.5%); 2048 tokens: 0 of 2 (15.0%)." in line
    assert "at 2048 tokens" in line and "--tokens 2048" in line
    narrow = df.assign(speedup_lo=df["speedup"] * 0.97, speedup_hi=df["speedup"] * 1.03)
    assert "--tokens" not in precision_by_tokens_line(narrow, 0.05)
    assert precision_by_tokens_line(df[df["tokens"] == 1], 0.05) == ""  # one token count


def test_the_report_says_how_the_rows_found_the_caches():
    from kernelbench.report import _cache_text

    ok = pd.DataFrame({"cache": ["cold", "cold"], "cache_resident": [False, False]})
    assert _cache_text(ok).startswith("caches: cold (evicted before every timed call")
    hot = pd.DataFrame({"cache": ["hot", "hot"], "cache_resident": [True, False]})
    assert _cache_text(hot) == "caches: hot; 1 rows cache-resident"
    assert _cache_text(pd.DataFrame({"x": [1]})) == ""


def test_a_run_lists_its_widest_rows_and_show_wide_lists_them_all():
    """At the end of a run the wide-rows table holds the widest few (the summary stays on
    screen); ``show --wide`` lists every one."""
    import io

    from rich.console import Console

    from kernelbench.report import console as console_mod

    n = console_mod.WIDE_SHOWN + 5
    df = pd.DataFrame(
        {
            "status": ["ok"] * n,
            "backend": ["custom"] * n,
            "method": [f"m{i}" for i in range(n)],
            "layer": ["ffn1"] * n,
            "d_model": [768] * n,
            "tokens": [1] * n,
            "speedup": [2.0] * n,
            "speedup_lo": [2.0 - 0.01 * (i + 1) for i in range(n)],
            "speedup_hi": [2.0 + 0.01 * (i + 1) for i in range(n)],
            "ci_wide": [True] * n,
            "raw_ms": [[1.0, 1.0, 3.0]] * n,
        }
    )

    def printed(limit):
        out = io.StringIO()
        console_mod._print_wide(df, Console(file=out, width=200), limit)
        return out.getvalue()

    few = printed(console_mod.WIDE_SHOWN)
    assert f"the {console_mod.WIDE_SHOWN} widest of {n}" in few
    assert "5 more wide rows: kernelbench show --wide RUN" in few
    assert f"m{n - 1} " in few and "m0 " not in few  # the widest kept, the narrowest left out
    every = printed(None)
    assert "more wide rows" not in every and "m0 " in every and f"m{n - 1} " in every


def _paired_round(round_: int, raw, base) -> dict:
    row = _round(round_, raw, [0] * len(raw))
    row.update(paired=True, baseline_raw_ms=base)
    return row


def test_a_wide_row_says_what_each_round_measured_and_which_call_moved():
    """Two tight rounds that disagree: the row's calls took 1 ms then 2 ms while the 16-bit
    calls around them held 3 ms (x1.1): the pooled row keeps each round's size, the view gives
    each round's medians, the wide-rows table prints them."""
    import io

    from rich.console import Console

    from kernelbench.report import console as console_mod
    from kernelbench.results.view import by_round

    first = _paired_round(0, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0])
    second = _paired_round(1, [2.0, 2.0, 2.0, 2.0], [3.3, 3.3, 3.3, 3.3])
    (pooled,) = pool_rows([first, second])
    assert pooled.round_samples == [3, 4]
    rounds = by_round(dataclasses.asdict(pooled))
    assert rounds.speedups == pytest.approx([3.0, 1.65])
    assert rounds.row_ms == pytest.approx([1.0, 2.0])
    assert rounds.moved(rounds.row_ms) == pytest.approx(2.0)
    assert rounds.moved(rounds.baseline_ms) == pytest.approx(1.1)
    # a row as written (no round sizes) or unpaired: nothing to split
    assert by_round(first).speedups == [] and rounds.moved([1.0]) is None
    unpaired = dataclasses.asdict(pooled) | {"baseline_raw_ms": []}
    assert by_round(unpaired).speedups == []
    df = pd.DataFrame([dataclasses.asdict(pooled) | {"ci_wide": True, "layer": "ffn1"}])
    out = io.StringIO()
    console_mod._print_wide(df, Console(file=out, width=250), None)
    assert "3.00 1.65" in out.getvalue() and "2.00x / 1.10x" in out.getvalue()
    assert rounds.bus_gbps == []  # hot caches: no bus readings, the column says "-"


def test_a_wide_row_shows_the_bus_reading_of_each_round():
    """The same row on a bus that moved: 80 GB/s before the fast round's calls, 40 before the
    slow round's, and the threads' link 320 ns then 55 (the host moved them); the by-round view
    and the wide-rows table carry the medians."""
    import io

    from rich.console import Console

    from kernelbench.report import console as console_mod
    from kernelbench.results.view import by_round

    first = _paired_round(0, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]) | {
        "bus_gbps": [79.0, 80.0, 81.0],
        "link_ns": [330.0, 320.0, 310.0],
        "core_ns": [13_000.0, 13_500.0, 12_900.0],
    }
    second = _paired_round(1, [2.0, 2.0, 2.0, 2.0], [3.3] * 4) | {
        "bus_gbps": [40.0] * 4,
        "link_ns": [55.0] * 4,
        "core_ns": [26_000.0] * 4,
    }
    (pooled,) = pool_rows([first, second])
    rounds = by_round(dataclasses.asdict(pooled))
    assert rounds.bus_gbps == pytest.approx([80.0, 40.0])
    assert rounds.link_ns == pytest.approx([320.0, 55.0])
    assert rounds.core_ns == pytest.approx([13_000.0, 26_000.0])
    misaligned = dataclasses.asdict(pooled) | {"bus_gbps": [80.0]}
    assert by_round(misaligned).bus_gbps == [] and by_round(misaligned).speedups
    df = pd.DataFrame([dataclasses.asdict(pooled) | {"ci_wide": True, "layer": "ffn1"}])
    out = io.StringIO()
    console_mod._print_wide(df, Console(file=out, width=250), None)
    assert "80 40" in out.getvalue() and "320 55" in out.getvalue()
    assert "13 26" in out.getvalue()  # the cores' probe by round, in us


def test_a_boolean_column_reads_as_set_only_where_it_is():
    import pandas as pd

    from kernelbench.results.view import marked

    df = pd.DataFrame({"ci_wide": [True, None, False, float("nan")]}, index=[3, 5, 7, 9])
    assert marked(df, "ci_wide").tolist() == [True, False, False, False]
    absent = marked(df, "above_peak")  # an older run's view: not set, on the same rows
    assert absent.tolist() == [False] * 4 and list(absent.index) == [3, 5, 7, 9]
