"""Pooling several rounds of one sweep into one run (kernelbench.results.merge, ``kernelbench
merge``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_compare import row, write_run
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.results.compare import compare_runs
from kernelbench.results.merge import merge_runs, write_merged
from kernelbench.results.schema import ENV_FILE, RESULTS_FILE, SchemaError, load_results


def timed(method: str, raw: list[float], backend: str = "custom", **kw):
    """An ok row whose statistics are those of ``raw`` (as the timer would store them)."""
    ordered = sorted(raw)
    return row(
        method,
        backend=backend,
        raw_ms=list(raw),
        median_ms=ordered[len(raw) // 2],
        samples=len(raw),
        **kw,
    )


def round_rows(fp16: list[float], llm: list[float], **llm_kw) -> list:
    return [timed("fp16", fp16, backend="torch"), timed("llm_int8", llm, **llm_kw)]


def rows_by_method(rows) -> dict:
    return {r.method: r for r in rows}


def test_rounds_weigh_the_same_whatever_their_sample_count(tmp_path: Path):
    # Round 1 converged after 3 samples at ~10 ms; round 2 took 9 samples at ~20 ms. Pooled
    # per sample, round 2 would own the median; pooled per round, each holds half the weight.
    a = write_run(tmp_path / "a", round_rows([5.0, 5.0, 5.0], [10.0, 10.0, 10.0]))
    b = write_run(tmp_path / "b", round_rows([5.0] * 9, [20.0] * 9))
    c = write_run(tmp_path / "c", round_rows([5.0] * 3, [11.0] * 3))
    rows, env = merge_runs([a, b, c])
    llm = rows_by_method(rows)["llm_int8"]
    assert llm.samples == 15 and len(llm.raw_ms) == 15
    assert llm.median_ms == 11.0  # the middle round, not the 9-sample one
    assert llm.min_ms == 10.0
    assert llm.iqr_ms == pytest.approx(20.0 - 10.0)  # quartiles: lowest and highest round
    assert llm.rel_spread == pytest.approx(10.0 / 11.0)
    assert llm.mean_ms == pytest.approx((10.0 + 20.0 + 11.0) / 3)
    # speedup recomputed from the pooled medians of the same cell
    assert llm.baseline_ms == 5.0 and llm.speedup == pytest.approx(5.0 / 11.0)
    assert [m["run"] for m in env["merged_from"]] == [str(a), str(b), str(c)]


def test_one_disturbed_round_does_not_move_the_median(tmp_path: Path):
    quiet = [10.0, 10.2, 9.9, 10.1]
    runs = [
        write_run(tmp_path / f"r{i}", round_rows([5.0] * 4, raw))
        for i, raw in enumerate([quiet, [25.0, 26.0, 24.0, 25.5], quiet])
    ]
    llm = rows_by_method(merge_runs(runs)[0])["llm_int8"]
    assert 9.9 <= llm.median_ms <= 10.2
    assert llm.rel_spread > 1.0  # but the drift between rounds shows in the spread


def test_errors_keep_the_worst_round_and_skips_keep_their_reason(tmp_path: Path):
    skipped = dataclasses.replace(
        row("vectorwise"), status="skipped", reason="over budget: 9 s", median_ms=None
    )
    a = write_run(tmp_path / "a", round_rows([5.0] * 3, [8.0] * 3, rel_error=1e-3) + [skipped])
    b = write_run(tmp_path / "b", round_rows([5.0] * 3, [8.0] * 3, rel_error=2e-3) + [skipped])
    rows = rows_by_method(merge_runs([a, b])[0])
    assert rows["llm_int8"].rel_error == 2e-3
    assert rows["vectorwise"].status == "skipped"
    assert rows["vectorwise"].reason == "over budget: 9 s"


def test_build_time_adds_up_over_the_rounds_that_built(tmp_path: Path):
    """A round that kept its runner built nothing (``None``): the pooled row's build time is
    what the rounds spent building, not a median that would hide a rebuild."""
    runs = [
        write_run(tmp_path / f"r{i}", round_rows([5.0] * 3, [8.0] * 3, build_s=built))
        for i, built in enumerate([2.5, None, 1.5])
    ]
    assert rows_by_method(merge_runs(runs)[0])["llm_int8"].build_s == pytest.approx(4.0)
    kept = [write_run(tmp_path / f"k{i}", round_rows([5.0] * 3, [8.0] * 3)) for i in range(2)]
    assert rows_by_method(merge_runs(kept)[0])["llm_int8"].build_s is None


def test_a_key_ok_in_one_round_only_pools_that_round(tmp_path: Path):
    failed = dataclasses.replace(
        row("llm_int8"), status="failed", reason="RuntimeError: boom", median_ms=None
    )
    a = write_run(tmp_path / "a", [timed("fp16", [5.0] * 3, backend="torch"), failed])
    b = write_run(tmp_path / "b", round_rows([5.0] * 3, [7.0, 8.0, 9.0]))
    llm = rows_by_method(merge_runs([a, b])[0])["llm_int8"]
    assert llm.status == "ok" and llm.median_ms == 8.0 and llm.samples == 3


@pytest.mark.parametrize("n_runs", [0, 1])
def test_fewer_than_two_runs_are_refused(n_runs: int, tmp_path: Path):
    runs = [write_run(tmp_path / f"r{i}", round_rows([5.0] * 3, [8.0] * 3)) for i in range(n_runs)]
    with pytest.raises(SchemaError, match="at least two runs"):
        merge_runs(runs)


def test_different_device_classes_are_refused(tmp_path: Path):
    a = write_run(tmp_path / "a", round_rows([5.0] * 3, [8.0] * 3))
    other = [
        dataclasses.replace(r, device_class="cpu-avx512-2core")
        for r in round_rows([5.0] * 3, [8.0] * 3)
    ]
    b = write_run(tmp_path / "b", other)
    with pytest.raises(SchemaError, match="different device classes"):
        merge_runs([a, b])


def test_empty_or_missing_runs_are_refused(tmp_path: Path):
    a = write_run(tmp_path / "a", round_rows([5.0] * 3, [8.0] * 3))
    empty = write_run(tmp_path / "empty", [])
    with pytest.raises(SchemaError, match="no result rows"):
        merge_runs([a, empty])
    with pytest.raises(SchemaError):
        merge_runs([a, tmp_path / "nowhere"])


def test_output_may_not_be_an_input_and_inputs_are_untouched(tmp_path: Path):
    a = write_run(tmp_path / "a", round_rows([5.0] * 3, [8.0] * 3))
    b = write_run(tmp_path / "b", round_rows([5.0] * 3, [9.0] * 3))
    before = {p: p.read_bytes() for d in (a, b) for p in d.iterdir()}
    with pytest.raises(SchemaError, match="must not be one of the runs"):
        write_merged([a, b], a)
    out = tmp_path / "merged"
    write_merged([a, b], out)
    assert {p: p.read_bytes() for d in (a, b) for p in d.iterdir()} == before
    df = load_results(out)
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert len(json.loads((out / ENV_FILE).read_text())["merged_from"]) == 2
    write_merged([a, b], out)  # a second merge replaces, never appends
    assert len((out / RESULTS_FILE).read_text().splitlines()) == 2


def test_merged_run_compares_and_a_merged_slowdown_is_caught(tmp_path: Path):
    def rounds(prefix: str, factor: float) -> list[Path]:
        return [
            write_run(
                tmp_path / f"{prefix}{i}",
                round_rows([5.0, 5.1, 4.9], [x * factor for x in (8.0 + 0.1 * i, 8.1, 7.9)]),
            )
            for i in range(3)
        ]

    base, same, slow = tmp_path / "base", tmp_path / "same", tmp_path / "slow"
    write_merged(rounds("b", 1.0), base)
    write_merged(rounds("s", 1.0), same)
    write_merged(rounds("x", 1.5), slow)
    assert compare_runs(base, same).exit_code == 0
    cmp = compare_runs(base, slow)
    assert cmp.exit_code == 1
    assert [r.label for r in cmp.regressions] == ["gpt3 175B ffn1 tokens=512 custom/llm_int8"]


def test_cli_merge(tmp_path: Path):
    a = write_run(tmp_path / "a", round_rows([5.0] * 3, [8.0] * 3))
    b = write_run(tmp_path / "b", round_rows([5.0] * 3, [9.0] * 3))
    runner = CliRunner()
    result = runner.invoke(app, ["merge", str(tmp_path / "m"), str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert "merged 2 runs: 2 rows (2 ok)" in result.output
    result = runner.invoke(app, ["merge", str(tmp_path / "m2"), str(a)])
    assert result.exit_code == 2 and "at least two runs" in result.output


def test_paired_rows_pool_their_own_baseline_calls(tmp_path: Path):
    # Round 1 ran in a slow stretch: both calls of every pair took twice as long.
    fast = dict(paired=True, baseline_raw_ms=[10.0, 10.2, 9.8])
    slow = dict(paired=True, baseline_raw_ms=[20.0, 20.4, 19.6])
    runs = [
        write_run(tmp_path / "r1", round_rows([11.0] * 3, [16.0, 16.2, 15.8], **slow)),
        write_run(tmp_path / "r2", round_rows([11.0] * 3, [8.0, 8.1, 7.9], **fast)),
        write_run(tmp_path / "r3", round_rows([11.0] * 3, [8.0, 8.1, 7.9], **fast)),
    ]
    rows, _ = merge_runs(runs)
    llm = rows_by_method(rows)["llm_int8"]
    assert llm.paired and len(llm.baseline_raw_ms) == len(llm.raw_ms) == 9
    assert llm.baseline_ms == 10.2 and llm.median_ms == 8.1  # pooled over the pairs, not 11.0
    # the speedup is the median of the pairs' ratios (every pair's ratio is ~1.25), with its
    # 95% interval over all nine pairs
    assert llm.speedup == llm.paired_speedup == pytest.approx(1.25, rel=0.02)
    assert llm.speedup_lo <= llm.speedup <= llm.speedup_hi
    assert llm.paired_rel_spread < 0.03
    # one unpaired round: the pooled row is unpaired, its baseline the cell's fp16 row
    runs.append(write_run(tmp_path / "r4", round_rows([11.0] * 3, [8.0, 8.1, 7.9])))
    llm = rows_by_method(merge_runs(runs)[0])["llm_int8"]
    assert not llm.paired and llm.baseline_raw_ms == [] and llm.baseline_ms == 11.0
