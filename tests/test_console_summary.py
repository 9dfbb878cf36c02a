"""The end of a run on the terminal: a headline first, skipped rows one line per reason, pairs
that do not apply counted and not listed, a legend of the marks shown only."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.core import is_not_applicable, not_implemented_reason
from kernelbench.report.console import print_tables
from kernelbench.results.schema import ResultsWriter
from kernelbench.results.view import headline, load_view

CUDA_REASON = (
    "cuBLASLt runs on CUDA devices only, not 'cpu'; the CUDA extension was not built "
    "(ImportError: cannot import name '_cuda' from 'kernelbench' "
    "(/opt/venv/lib/python3.11/site-packages/kernelbench/__init__.py))"
)


@pytest.fixture
def run_dir(tmp_path, row_factory):
    writer = ResultsWriter(tmp_path)
    for d in (768, 2048):
        interval = dict(speedup_lo=1.9, speedup_hi=2.1) if d == 768 else {}
        rows = [
            row_factory("fp16", "torch", d_model=d, median_ms=2.0, baseline_ms=2.0),
            row_factory(
                "llm_int8", "custom", d_model=d, median_ms=1.0, baseline_ms=2.0, **interval
            ),
            row_factory("int8_raw", "torch", d_model=d, median_ms=1.6, baseline_ms=2.0),
            row_factory(
                "fp16",
                "custom",
                d_model=d,
                status="skipped",
                reason=not_implemented_reason("custom", "fp16"),
            ),
            row_factory("llm_int8", "cublaslt", d_model=d, status="skipped", reason=CUDA_REASON),
            row_factory("int8_raw", "cublaslt", d_model=d, status="skipped", reason=CUDA_REASON),
        ]
        for row in rows:
            writer.append(row)
    return tmp_path


def printed(run_dir, **kw) -> str:
    console = Console(record=True, width=200)
    print_tables(load_view(run_dir), console, **kw)
    return console.export_text()


def test_not_applicable_reasons_are_recognised():
    assert is_not_applicable(not_implemented_reason("custom", "fp16"))
    assert not is_not_applicable(CUDA_REASON) and not is_not_applicable(None)


def test_torch_vectorwise_is_a_pair_that_does_not_apply(tmp_path, row_factory):
    """The torch backend implements 'vectorwise_torch', not 'vectorwise': a sweep's torch
    'vectorwise' row is counted among the pairs that do not apply, never listed as a skip;
    so is such a row written by an earlier version in its own words."""
    import torch

    from kernelbench.backends.torch_ops import BACKEND as TORCH
    from kernelbench.measure.engine import TimerSettings
    from kernelbench.run.cases import load_case
    from kernelbench.run.executors import get_executor
    from kernelbench.run.plan import RunOptions, plan

    why = TORCH.supports("vectorwise", torch.device("cpu"), torch.bfloat16, 8, 768, 3072)
    assert not why and why.reason.startswith(not_implemented_reason("torch", "vectorwise"))
    assert is_not_applicable(why.reason) and "vectorwise_torch" in why.reason
    assert TORCH.supports("vectorwise_torch", torch.device("cpu"), torch.bfloat16, 8, 768, 3072)
    tiny = TimerSettings(budget_s=0.02, warmup_s=0.0, min_samples=1)
    opts = RunOptions(sizes=(768,), tokens=(8,), backends=("torch",),
                      methods=("fp16", "vectorwise", "vectorwise_torch"), device="cpu",
                      timer=tiny, stage_timer=tiny, error_rows=8, rounds=1,
                      extra_rounds=0)  # fmt: skip
    case = load_case("gpt3")
    writer = ResultsWriter(tmp_path / "run")
    for _, row in get_executor("local").run(plan(case, opts), case, opts, set()):
        writer.append(row)
    old = "on the torch backend 'vectorwise' is the same computation as 'vectorwise_torch'"
    writer.append(row_factory("vectorwise", "torch", d_model=2048, status="skipped", reason=old))
    text = printed(tmp_path / "run")
    assert "Not measured" not in text and "skipped (vectorwise)" not in text, text
    assert "2 rows of (backend, method) pairs that do not apply" in text


def test_headline_names_the_fastest_at_each_end_with_its_interval(run_dir):
    first, second, third = headline(load_view(run_dir))
    assert first.startswith("Fastest over 16-bit (cpu-test-2core · layer ffn1 · 8 tokens)")
    assert "d=768: custom llm_int8 2.00x [1.90, 2.10]" in first
    assert "d=2048: custom llm_int8 2.00x" in first
    assert second.startswith("Precision: ") and "of 4 speedups" in second
    # one round: its intervals do not cover the drift between runs, and the run says so
    assert third.startswith("Each interval comes from one round")


def test_a_run_of_several_rounds_has_no_few_rounds_note(tmp_path, row_factory):
    writer = ResultsWriter(tmp_path)
    for rnd, ms in enumerate((1.0, 1.05, 0.98)):
        base = [2.0, 2.1, 1.9, 2.0]
        writer.append(row_factory("fp16", "torch", median_ms=2.0, raw_ms=base, round=rnd))
        writer.append(
            row_factory(
                "llm_int8",
                "custom",
                median_ms=ms,
                raw_ms=[ms, ms * 1.02, ms * 0.99, ms],
                baseline_raw_ms=base,
                paired=True,
                round=rnd,
            )  # fmt: skip
        )
    df = load_view(tmp_path)
    assert df.loc[df["method"] == "llm_int8", "rounds"].item() == 3
    lines = headline(df)
    assert len(lines) == 2 and not any("one round" in line for line in lines)


def test_a_row_on_two_rounds_is_named_with_why_its_interval_is_wide(tmp_path, row_factory):
    """A quick run: one base round, and a second for one wide row: that row's interval is
    Student's t of two round medians (one degree of freedom), and the run says so."""
    writer = ResultsWriter(tmp_path)
    base = [2.0, 2.1, 1.9, 2.0]
    for rnd, ms in enumerate((1.0, 1.13)):
        writer.append(row_factory("fp16", "torch", median_ms=2.0, raw_ms=base, round=rnd))
        for method in ("llm_int8",) if rnd else ("llm_int8", "vectorwise"):
            writer.append(
                row_factory(method, "custom", median_ms=ms, raw_ms=[ms, ms * 1.02, ms * 0.99, ms],
                            baseline_raw_ms=base, paired=True, round=rnd)
            )  # fmt: skip
    df = load_view(tmp_path)
    wide = df[df["method"] == "llm_int8"].iloc[0]
    assert wide["rounds"] == 2 and (wide["speedup_hi"] - wide["speedup_lo"]) / 2 > 0.8
    note = [line for line in headline(df) if "rounds" in line]
    assert len(note) == 1 and note[0].startswith("1 of 2 intervals rest on two rounds"), note
    assert "the other 1 on one round" in note[0]


def _baseline_and_row(path, row_factory, base_calls: dict, row_calls: dict) -> None:
    """A run of one cell: the 16-bit baseline (2 ms a call) and custom llm_int8 (1 ms), each
    with the per-call lists given (their length is the row's number of calls)."""
    writer = ResultsWriter(path)
    for method, backend, ms, calls in (
        ("fp16", "torch", 2.0, base_calls),
        ("llm_int8", "custom", 1.0, row_calls),
    ):
        n = len(next(iter(calls.values())))
        writer.append(
            row_factory(method, backend, median_ms=ms, baseline_ms=2.0, raw_ms=[ms] * n, **calls)
        )


def test_headline_says_how_long_the_run_waited_for_fast_cores(tmp_path, row_factory):
    """Rows record each call's wait for fast cores: the headline counts the calls that waited,
    their total and the waits that ran out at the run's cap; a run that never waited says
    nothing of it."""
    from kernelbench.results.schema import write_env

    def run(path, waits):
        _baseline_and_row(path, row_factory, {"core_wait_ms": waits}, {"core_wait_ms": [0.0] * 4})
        write_env(path, {"timer": {"core_wait_s": 2.0}})
        return headline(load_view(path))

    lines = run(tmp_path / "waited", [0.0, 500.0, 2000.0, 2000.5])
    note = [line for line in lines if line.startswith("Waited for the cores")]
    assert note == [
        "Waited for the cores to run at their usual speed before 3 of 8 timed calls (4.5 s in "
        "all, outside the clock): they read slower at those moments (a host that shares them "
        "out, or other work); 2 waits ran out at 2 s."
    ]
    assert not any("Waited" in line for line in run(tmp_path / "never", [0.0] * 4))


def test_headline_says_when_the_cores_read_slow_before_part_of_the_calls(tmp_path, row_factory):
    """The core readings in two groups (the host's other guests on the cores, which the load
    and steal do not show): the headline gives the slow share of the calls and each group's
    median; readings in one group say nothing."""

    def run(path, cores):
        _baseline_and_row(path, row_factory, {"core_ns": cores}, {"core_ns": cores})
        return [line for line in headline(load_view(path)) if line.startswith("The cores")]

    two = [18_000.0 + i for i in range(15)] + [33_000.0 + i for i in range(5)]
    assert run(tmp_path / "two", two) == [
        "The cores read slow before 25% of the timed calls (a fixed chain of steps took a "
        "median 33.0 us there, 18.0 us before the others): other work on the cores, on this "
        "machine or the host's (the steal count misses a host that shares them out); speedups "
        "over 16-bit differ between the two, and a row with calls in both has an interval that "
        "covers the mix."
    ]
    assert run(tmp_path / "one", [18_000.0 + 100 * i for i in range(20)]) == []


def test_headline_comes_first_and_skips_are_one_line_per_reason(run_dir):
    text = printed(run_dir)
    assert text.splitlines()[0].startswith("Fastest over 16-bit")
    assert "Not measured: 4 rows" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("  cublaslt:")]
    assert lines == [
        "  cublaslt: 4 skipped (int8_raw, llm_int8): cuBLASLt runs on CUDA devices only, not 'cpu'"
    ]
    assert "site-packages" not in text and "ImportError" not in text
    assert "does not implement" not in text
    assert "2 rows of (backend, method) pairs that do not apply" in text


def test_legend_explains_only_what_is_shown(run_dir):
    text = printed(run_dir)
    assert "? one pair only" in text  # d=2048 has no interval
    assert "layer block" not in text and "S suspect" not in text


def test_show_skipped_prints_the_full_table(run_dir):
    out = CliRunner().invoke(app, ["show", str(run_dir), "--skipped"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "Skipped and failed rows" in out.output and "ImportError" in out.output
    assert "does not implement" not in out.output
    short = CliRunner().invoke(app, ["show", str(run_dir)], env={"COLUMNS": "250"})
    assert "Skipped and failed rows" not in short.output


def test_a_run_whose_every_row_was_skipped_prints_its_reasons(tmp_path, row_factory):
    """Nothing measured (a backend that cannot run here, alone in the sweep): the headline
    says so and the skipped rows are summarised; the tables do not fail on an empty view."""
    writer = ResultsWriter(tmp_path)
    writer.append(row_factory("llm_int8", "cublaslt", status="skipped", reason=CUDA_REASON))
    text = printed(tmp_path)
    assert "no speedup over 16-bit measured" in text or "No row was measured" in text
    assert "cublaslt: 1 skipped" in text
    assert "Traceback" not in text


def _two_token_run(path, row_factory, without_interval: str):
    """custom llm_int8 and vectorwise at 8 and 2048 tokens, each speedup with an interval but
    ``without_interval``'s at 8 tokens (printed ``?``); only llm_int8 has a by-tokens table."""
    writer = ResultsWriter(path)
    for tokens in (8, 2048):
        writer.append(row_factory("fp16", "torch", tokens=tokens))
        for method in ("llm_int8", "vectorwise"):
            bare = (method, tokens) == (without_interval, 8)
            interval = {} if bare else dict(speedup_lo=0.99, speedup_hi=1.01)
            writer.append(row_factory(method, "custom", tokens=tokens, **interval))
    return path


def test_legend_names_a_mark_only_where_a_table_prints_it(tmp_path, row_factory):
    """A speedup without interval at a token count no table prints (vectorwise has no
    by-tokens table): no '?' in the tables, none in the legend; the same on llm_int8, whose
    by-tokens table prints it: explained."""
    hidden = printed(_two_token_run(tmp_path / "a", row_factory, "vectorwise"))
    assert "?" not in hidden
    shown = printed(_two_token_run(tmp_path / "b", row_factory, "llm_int8"))
    assert "1.00 ?" in shown and "? one pair only" in shown


def test_decode_shares_of_the_roofline_at_the_peak_and_at_the_bus(tmp_path, row_factory):
    """A run at two token counts prints each llm_int8 row's share of its roofline by tokens:
    at the measured peak bandwidth, and (b) at the bandwidth the bus gave before each call."""
    from kernelbench.core import work_bytes
    from kernelbench.results.schema import write_env

    k, n = 768, 3072
    writer = ResultsWriter(tmp_path)
    for tokens in (1, 2048):
        ms = work_bytes("llm_int8", 1, k, n) / 40e9 * 1e3 if tokens == 1 else 1.0
        writer.append(row_factory("fp16", "torch", tokens=tokens, cache="cold"))
        writer.append(
            row_factory(
                "llm_int8",
                "custom",
                tokens=tokens,
                cache="cold",
                median_ms=ms,
                raw_ms=[ms] * 4,
                bus_gbps=[50.0] * 4,
            )
        )
    write_env(
        tmp_path,
        {
            "peak": {
                "int8": {"tops": 100.0, "source": "measured"},
                "bandwidth": {"gbs": 80.0, "source": "measured"},
            }
        },
    )
    text = printed(tmp_path)
    assert "share of its roofline" in text  # the title, wrapped over the narrow table
    assert "50% b80%" in text  # 40 GB/s: half the 80 GB/s peak, 80% of the 50 GB/s bus
    assert "b: share of the roofline at the bandwidth the bus gave" in text


@pytest.mark.parametrize(
    "rates, noted, suspect",
    [
        ([50.0, 50.0, 100.0, 100.0, 100.0], True, False),  # median past the peak, interval not
        ([100.0] * 5, False, True),  # wholly past: flagged instead
        ([50.0] * 5, False, False),
    ],
    ids=["median-past-peak", "flagged", "below"],
)
def test_rows_past_the_cached_peak_at_their_median_are_named(
    tmp_path, row_factory, rates, noted, suspect
):
    """A cold decode row whose calls streamed at 50 GB/s in one state of a shared host and 100
    GB/s in another reads 125% of a cached 80 GB/s peak at its median; its interval reaches
    below the peak, so it is not flagged, but the run says the peak was read in a slower
    moment (and how to raise it), in the terminal and in the report."""
    from kernelbench.core import work_bytes
    from kernelbench.report import write_report
    from kernelbench.results.schema import write_env

    nbytes = work_bytes("llm_int8", 1, 768, 3072)
    raw_ms = [nbytes / (gbs * 1e9) * 1e3 for gbs in rates]
    writer = ResultsWriter(tmp_path)
    writer.append(row_factory("fp16", "torch", tokens=1, cache="cold"))
    median = sorted(raw_ms)[2]
    writer.append(
        row_factory("llm_int8", "custom", tokens=1, cache="cold", median_ms=median, raw_ms=raw_ms)
    )
    peak = {
        "int8": {"tops": 100.0, "source": "measured"},
        "bandwidth": {"gbs": 80.0, "source": "measured"},
    }
    write_env(tmp_path, {"peak": peak})
    view = load_view(tmp_path)
    assert bool(view[view["method"] == "llm_int8"]["suspect"].iloc[0]) == suspect
    text = printed(tmp_path)
    assert ("ran faster at their median than the cached peaks allow" in text) == noted
    if noted:
        assert "up to 125% of the roofline: custom llm_int8, d=768, tokens=1" in text
        assert "kernelbench peak --remeasure" in text
    html = write_report([tmp_path]).read_text()
    assert ("ran faster at their median than the cached peaks allow" in html) == noted


def test_a_share_above_a_peak_without_its_placement_is_marked():
    import pandas as pd

    from kernelbench.report.console import share_text

    row = pd.Series({"roofline_share": 1.3, "bus_roofline_share": 0.9, "above_peak": True})
    assert share_text(row) == "130% b90% [yellow]p[/yellow]"
    assert share_text(row.drop("above_peak")) == "130% b90%"


def test_headline_says_which_placement_the_bandwidth_was_not_read_again_in(tmp_path, row_factory):
    """A run whose rows stayed above their roofline read the bandwidth again where they ran;
    a placement the host did not give within the wait is named in the headline (and the
    report, which shows the headline); a re-read that missed nothing, or none, says nothing."""
    from kernelbench.results.schema import write_env

    def run(path, reread):
        _baseline_and_row(path, row_factory, {"link_ns": [60.0] * 4}, {"link_ns": [60.0] * 4})
        if reread is not None:
            write_env(path, {"peak_reread": reread})
        return [line for line in headline(load_view(path)) if line.startswith("Rows stayed")]

    missed = {"placements_ns": [58.8, 301.2], "read": [58.8], "missed": [301.2], "waited_s": 300.0}
    assert run(tmp_path / "missed", missed) == [
        "Rows stayed above their roofline after the peaks were measured again; the run waited "
        "300 s for the host to run the threads where a cache line's round trip read 301 ns, "
        "and it did not: rows there are judged against that placement's cached bandwidth "
        "(kernelbench peak --remeasure when the host runs them there)."
    ]
    read = {"placements_ns": [58.8], "read": [58.8], "missed": [], "waited_s": 21.3}
    assert run(tmp_path / "read", read) == []
    assert run(tmp_path / "none", None) == []


def test_headline_names_the_environment_that_changes_what_is_measured(tmp_path, row_factory):
    """A run with an allocator preloaded or OpenMP set says so in its headline (console,
    `show`, the report); one with none set, or from before env.json recorded it, says nothing."""
    from kernelbench.results.schema import write_env

    def run(path, environment):
        _baseline_and_row(path, row_factory, {"link_ns": [60.0] * 4}, {"link_ns": [60.0] * 4})
        if environment is not None:
            write_env(path, {"environment": environment})
        return [line for line in headline(load_view(path)) if line.startswith("Ran with")]

    preloaded = {"OMP_NUM_THREADS": "2", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert run(tmp_path / "set", preloaded) == [
        "Ran with these set, which change what is measured: "
        "LD_PRELOAD=/usr/lib/libjemalloc.so.2, OMP_NUM_THREADS=2."
    ]
    assert run(tmp_path / "unset", {}) == []
    assert run(tmp_path / "older", None) == []


def test_headline_names_the_cells_the_extra_rounds_left_out_for_their_cost(tmp_path, row_factory):
    """A run whose extra rounds passed a cell over (its estimate beyond what its round had
    left) names it with both figures and the extra rounds' seconds: its wide rows keep the
    planned rounds' intervals for that reason. None left out, entries that are not a cell's,
    or a run from before env.json recorded it: nothing."""
    from kernelbench.results.schema import write_env

    def run(path, extra):
        _baseline_and_row(path, row_factory, {"link_ns": [60.0] * 4}, {"link_ns": [60.0] * 4})
        write_env(path, extra)
        return [line for line in headline(load_view(path)) if line.startswith("Extra rounds")]

    cell = {"d_model": 12288, "layer": "ffn1", "tokens": 2048, "estimate_s": 88.2, "left_s": 66.7}
    extra = {"extra_rounds_s": 117.1, "extra_round_budget_s": 47.9}
    assert run(tmp_path / "left", {**extra, "extra_left_out": [cell, {"d_model": "x"}]}) == [
        "Extra rounds left out for their cost: d=12288 ffn1 2048 tokens (88 s estimated, 67 s "
        "left of its round); the extra rounds took 117 s, each its 48 s and what the earlier "
        "ones left: their uncertain rows keep the rounds they had."
    ]
    assert run(tmp_path / "none", {**extra, "extra_left_out": []}) == []
    assert run(tmp_path / "junk", {"extra_left_out": [{"d_model": 768}]}) == []
    assert run(tmp_path / "older", {"extra_round_budget_s": 30.0}) == []
