"""The regression gate (kernelbench.results.compare) and kept baselines
(kernelbench.results.baseline), on synthetic runs built from ResultRow."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from kernelbench.results.baseline import (
    GATE_FILE,
    BaselineError,
    find_baseline,
    sanitize,
    update_baseline,
)
from kernelbench.results.compare import ERROR_EPS, compare_runs, processor_key, render
from kernelbench.results.schema import ENV_FILE, RESULTS_FILE, SCHEMA_VERSION, ResultRow

DEVICE_CLASS = "cpu-avx2-2core"


def row(method: str, backend: str = "custom", **kw) -> ResultRow:
    """One ok row of the 175B ffn1 cell; speedup = baseline_ms / median_ms."""
    median = kw.pop("median_ms", {"fp16": 10.0, "llm_int8": 8.0, "vectorwise": 5.0}[method])
    baseline = kw.pop("baseline_ms", 10.0)
    fields = dict(
        case="gpt3",
        size="175B",
        d_model=12288,
        layer=kw.pop("layer", "ffn1"),
        tokens=kw.pop("tokens", 512),
        m=512,
        k=12288,
        n=49152,
        dist="outliers",
        seed=0,
        backend=backend,
        method=method,
        device="cpu",
        device_class=kw.pop("device_class", DEVICE_CLASS),
        dtype="bfloat16",
        median_ms=median,
        rel_spread=0.02,
        samples=20,
        baseline_ms=baseline,
        speedup=baseline / median,
        rel_error=1e-3 if method != "fp16" else 4e-3,
    )
    fields.update(kw)
    return ResultRow(**fields)


def standard_rows(**overrides) -> list[ResultRow]:
    """torch/fp16 (the baseline), custom/llm_int8, custom/vectorwise; ``overrides`` maps a
    method to a dict of field changes for that row."""
    rows = [row("fp16", backend="torch"), row("llm_int8"), row("vectorwise")]
    return [dataclasses.replace(r, **overrides.get(r.method, {})) for r in rows]


def write_run(path: Path, rows: list[ResultRow], env: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / RESULTS_FILE).write_text("".join(r.to_json() + "\n" for r in rows), encoding="utf-8")
    env = {"schema_version": 1, "git_commit": "abc123"} if env is None else env
    (path / ENV_FILE).write_text(json.dumps(env), encoding="utf-8")
    return path


def slowed(r: ResultRow, factor: float) -> dict:
    """Field changes that make row ``r`` ``factor`` times slower against the same baseline."""
    median = r.median_ms * factor
    return {"median_ms": median, "speedup": r.baseline_ms / median}


def snapshot(*dirs: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for d in dirs
        for p in sorted(Path(d).rglob("*"))
        if p.is_file()
    }


def by_method(cmp) -> dict[str, object]:
    return {r.key[5]: r for r in cmp.rows}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_run(tmp_path / "base", standard_rows())


# --- verdicts ---------------------------------------------------------------------------------


def test_identical_runs_pass(base: Path, tmp_path: Path):
    new = write_run(tmp_path / "new", standard_rows())
    before = snapshot(base, new)
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 0
    assert cmp.problem == ""
    assert {r.verdict for r in cmp.rows} == {"same"}
    assert len(cmp.rows) == 3
    assert all(r.metric == "speedup" and r.change == 0.0 for r in cmp.rows)
    assert snapshot(base, new) == before


def test_slowdown_beyond_tolerance_and_noise_is_caught(base: Path, tmp_path: Path):
    r = row("llm_int8")
    new = write_run(tmp_path / "new", standard_rows(llm_int8=slowed(r, 1.30)))
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 1
    slow = by_method(cmp)["llm_int8"]
    assert slow.verdict == "slower" and slow.regression
    assert slow.change == pytest.approx(0.30)
    assert [x.verdict for x in cmp.rows if x is not slow] == ["same", "same"]
    assert cmp.rows[0] is slow  # regressions listed first
    text = render(cmp, "text")
    assert "custom/llm_int8" in text and "slower" in text and "REGRESSION (exit 1)" in text


def test_faster_is_reported_not_failed(base: Path, tmp_path: Path):
    r = row("vectorwise")
    new = write_run(tmp_path / "new", standard_rows(vectorwise=slowed(r, 1 / 1.5)))
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 0
    assert by_method(cmp)["vectorwise"].verdict == "faster"


def test_change_inside_the_measured_spread_passes(base: Path, tmp_path: Path):
    # 20% slower: beyond the 10% tolerance, but each run's spread is 15% (band ~21%+).
    r = row("llm_int8")
    noisy = {**slowed(r, 1.20), "rel_spread": 0.15}
    base = write_run(tmp_path / "noisy_base", standard_rows(llm_int8={"rel_spread": 0.15}))
    new = write_run(tmp_path / "new", standard_rows(llm_int8=noisy))
    cmp = compare_runs(base, new)
    got = by_method(cmp)["llm_int8"]
    assert got.verdict == "same" and cmp.exit_code == 0
    # the band combines both runs' row spreads and both baseline-row spreads in quadrature
    assert got.noise == pytest.approx(math.sqrt(2 * 0.15**2 + 2 * 0.02**2))
    assert got.band == pytest.approx(got.noise)


def test_change_inside_tolerance_passes_even_when_quiet(base: Path, tmp_path: Path):
    r = row("llm_int8")
    quiet = {**slowed(r, 1.08), "rel_spread": 0.0}
    new = write_run(tmp_path / "new", standard_rows(llm_int8=quiet))
    got = by_method(compare_runs(base, new))["llm_int8"]
    assert got.verdict == "same" and got.band == pytest.approx(0.10)
    assert by_method(compare_runs(base, new, speed_tol=0.05))["llm_int8"].verdict == "slower"


def test_unmeasured_spread_gives_unknown_not_slower(base: Path, tmp_path: Path):
    # One timed sample has IQR 0: that is no measurement of noise, so no "slower" claim.
    r = row("llm_int8")
    one_sample = {**slowed(r, 2.0), "samples": 1, "rel_spread": 0.0}
    new = write_run(tmp_path / "new", standard_rows(llm_int8=one_sample))
    cmp = compare_runs(base, new)
    got = by_method(cmp)["llm_int8"]
    assert got.verdict == "unknown" and cmp.exit_code == 0
    assert "not measured" in got.detail and got.change == pytest.approx(1.0)
    # the same for the 16-bit baseline row the speedup is measured against
    new = write_run(
        tmp_path / "new2",
        standard_rows(fp16={"samples": 2}, llm_int8=slowed(r, 2.0)),
    )
    assert by_method(compare_runs(base, new))["llm_int8"].verdict == "unknown"
    # a change inside the tolerance is still "same"
    new = write_run(tmp_path / "new3", standard_rows(llm_int8={"samples": 1}))
    assert by_method(compare_runs(base, new))["llm_int8"].verdict == "same"


def test_slower_machine_with_same_speedups_is_same(base: Path, tmp_path: Path):
    # Everything, the 16-bit baseline included, 2.5x slower: speedups unchanged, no regression.
    rows = [
        dataclasses.replace(r, median_ms=r.median_ms * 2.5, baseline_ms=r.baseline_ms * 2.5)
        for r in standard_rows()
    ]
    new = write_run(tmp_path / "new", rows)
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 0 and {r.verdict for r in cmp.rows} == {"same"}


def test_paired_rows_are_judged_on_the_spread_of_their_pairs(tmp_path: Path):
    # Each time alone is noisy (30% spread: the machine's speed swung), the pairs' ratios are
    # not (3%): a 30% slowdown of a paired row is caught, through its median_ms.
    noisy = {"rel_spread": 0.30}
    paired = {**noisy, "paired": True, "paired_rel_spread": 0.03}
    rows = standard_rows(fp16=noisy, llm_int8=paired, vectorwise=paired)
    base = write_run(tmp_path / "base", rows)
    r = row("llm_int8")
    new = write_run(
        tmp_path / "new", standard_rows(fp16=noisy, llm_int8={**paired, **slowed(r, 1.3)})
    )
    got = by_method(compare_runs(base, new))
    assert got["llm_int8"].verdict == "slower"
    assert got["llm_int8"].noise == pytest.approx(math.sqrt(2) * 0.03)
    assert got["vectorwise"].verdict == "same"
    # unpaired, the same rows' noise (row and baseline spreads, both runs) hides the change
    plain = write_run(tmp_path / "plain", standard_rows(fp16=noisy, llm_int8=noisy))
    plain_new = write_run(
        tmp_path / "plain_new", standard_rows(fp16=noisy, llm_int8={**noisy, **slowed(r, 1.3)})
    )
    got = by_method(compare_runs(plain, plain_new))["llm_int8"]
    assert got.verdict == "same" and got.noise == pytest.approx(0.6)


def test_pooled_rounds_shrink_the_noise_band(tmp_path: Path):
    # Spreads of 0.5 on the row and its 16-bit baseline in both runs: noise sqrt(4 * 0.25) = 1.0
    # hides a 40% slowdown. Pooled from 9 runs each (kernelbench merge), a spread is a spread
    # between independent runs and the median's uncertainty is 0.5 / sqrt(9): the band drops to
    # sqrt(4) * 0.5 / 3 = 0.33 and the slowdown shows.
    r = row("llm_int8")
    for rounds, verdict in ((1, "same"), (9, "slower")):
        noisy = {"rel_spread": 0.5, "rounds": rounds}
        base = write_run(tmp_path / f"b{rounds}", standard_rows(fp16=noisy, llm_int8=noisy))
        new = write_run(
            tmp_path / f"n{rounds}",
            standard_rows(fp16=noisy, llm_int8={**noisy, **slowed(r, 1.4)}),
        )
        got = by_method(compare_runs(base, new))["llm_int8"]
        assert got.verdict == verdict
        assert got.noise == pytest.approx(1.0 / math.sqrt(rounds))


def test_backend_filter_gives_verdicts_for_those_rows_only(tmp_path: Path):
    # A peer's row 2x slower fails the whole comparison; gating custom only, the peer gets no
    # verdict, while the torch 16-bit row still serves as the custom rows' baseline.
    peer = row("llm_int8", backend="bitsandbytes")
    base = write_run(tmp_path / "base", standard_rows() + [peer])
    new = write_run(
        tmp_path / "new", standard_rows() + [dataclasses.replace(peer, **slowed(peer, 2.0))]
    )
    assert compare_runs(base, new).exit_code == 1
    cmp = compare_runs(base, new, backends=["custom"])
    assert cmp.exit_code == 0
    assert {r.key[4] for r in cmp.rows} == {"custom"}
    assert {(r.verdict, r.metric) for r in cmp.rows} == {("same", "speedup")}
    assert any("custom only" in n for n in cmp.notes)
    typo = compare_runs(base, new, backends=["custum"])
    assert typo.exit_code == 2 and "custum" in typo.problem


def test_without_speedup_falls_back_to_median_and_says_so(tmp_path: Path):
    # the 16-bit baseline failed in both runs: unpaired rows have nothing to divide by
    no_speedup = {m: {"speedup": None, "baseline_ms": None} for m in ("llm_int8", "vectorwise")}
    no_speedup["fp16"] = {"status": "failed", "reason": "boom", "median_ms": None, "raw_ms": []}
    base = write_run(tmp_path / "base", standard_rows(**no_speedup))
    r = row("llm_int8")
    new = write_run(
        tmp_path / "new",
        standard_rows(
            **{**no_speedup, "llm_int8": {**slowed(r, 1.5), "speedup": None, "baseline_ms": None}}
        ),
    )
    cmp = compare_runs(base, new)
    got = by_method(cmp)["llm_int8"]
    assert got.metric == "median_ms" and got.verdict == "slower" and cmp.exit_code == 1
    assert "median_ms" in got.detail
    assert "median_ms" in render(cmp, "text")


def test_error_increase_is_caught(base: Path, tmp_path: Path):
    new = write_run(tmp_path / "new", standard_rows(vectorwise={"rel_error": 1.1e-3}))
    cmp = compare_runs(base, new)
    got = by_method(cmp)["vectorwise"]
    assert got.verdict == "error-worse" and cmp.exit_code == 1
    assert got.error_change == pytest.approx(0.10)
    assert "error-worse" in render(cmp, "text")
    # allowed relative growth
    assert compare_runs(base, new, error_tol=0.2).exit_code == 0


def test_error_float_noise_and_improvement_pass(base: Path, tmp_path: Path):
    tiny = write_run(
        tmp_path / "tiny", standard_rows(llm_int8={"rel_error": 1e-3 + ERROR_EPS / 10})
    )
    assert compare_runs(base, tiny).exit_code == 0
    better = write_run(tmp_path / "better", standard_rows(llm_int8={"rel_error": 5e-4}))
    assert compare_runs(base, better).exit_code == 0


def test_ok_row_that_fails_is_a_regression(base: Path, tmp_path: Path):
    failed = {"status": "failed", "reason": "RuntimeError: boom", "median_ms": None}
    new = write_run(tmp_path / "new", standard_rows(llm_int8=failed))
    cmp = compare_runs(base, new)
    got = by_method(cmp)["llm_int8"]
    assert got.verdict == "failed" and cmp.exit_code == 1 and "boom" in got.detail


def test_already_failing_or_skipped_rows_are_unknown(tmp_path: Path):
    failed = {"status": "failed", "reason": "boom", "median_ms": None, "speedup": None}
    base = write_run(tmp_path / "base", standard_rows(llm_int8=failed))
    new = write_run(
        tmp_path / "new",
        standard_rows(
            llm_int8=failed,
            vectorwise={
                "status": "skipped",
                "skip_kind": "over_budget",
                "reason": "one call estimated at 9 s",
            },
        ),
    )
    cmp = compare_runs(base, new)
    assert by_method(cmp)["llm_int8"].verdict == "unknown"
    assert by_method(cmp)["vectorwise"].verdict == "unknown"  # budget skips depend on timing
    assert cmp.exit_code == 0
    # rows skipped in both runs are counted in the text and markdown tables, listed in JSON
    skip = {"status": "skipped", "reason": "backend 'custom' does not implement 'vectorwise'"}
    both = compare_runs(
        write_run(tmp_path / "b2", standard_rows(vectorwise=skip)),
        write_run(tmp_path / "n2", standard_rows(vectorwise=skip)),
    )
    for fmt in ("text", "markdown"):
        out = render(both, fmt)
        assert "custom/vectorwise" not in out and "1 rows skipped in both runs" in out, out
        assert "custom/llm_int8" in out
    assert len(json.loads(render(both, "json"))["rows"]) == 3


def test_a_row_that_stopped_running_is_a_regression(base: Path, tmp_path: Path):
    gone = {"status": "skipped", "reason": "kernelbench._cpu is not built", "median_ms": None}
    new = write_run(tmp_path / "new", standard_rows(vectorwise=gone))
    cmp = compare_runs(base, new)
    assert by_method(cmp)["vectorwise"].verdict == "failed" and cmp.exit_code == 1


def test_speedup_is_derived_from_the_measured_times(base: Path, tmp_path: Path):
    # an edited median_ms with a stale stored speedup is still caught
    r = row("llm_int8")
    new = write_run(tmp_path / "new", standard_rows(llm_int8={"median_ms": r.median_ms * 1.5}))
    cmp = compare_runs(base, new)
    got = by_method(cmp)["llm_int8"]
    assert got.metric == "speedup" and got.verdict == "slower" and cmp.exit_code == 1


def test_new_and_missing_rows_are_reported(base: Path, tmp_path: Path):
    rows = [r for r in standard_rows() if r.method != "vectorwise"]
    rows.append(row("llm_int8", layer="ffn2"))
    new = write_run(tmp_path / "new", rows)
    cmp = compare_runs(base, new)
    verdicts = {(r.key[3], r.key[5]): r.verdict for r in cmp.rows}
    assert verdicts[("ffn1", "vectorwise")] == "missing"
    assert verdicts[("ffn2", "llm_int8")] == "new"
    assert cmp.exit_code == 0
    assert cmp.counts() == {"missing": 1, "new": 1, "same": 2}
    text = render(cmp, "text")
    assert "missing" in text and "new" in text


def test_resumed_run_last_row_of_a_key_wins(base: Path, tmp_path: Path):
    failed = dataclasses.replace(row("llm_int8"), status="failed", reason="x", median_ms=None)
    new = write_run(tmp_path / "new", [failed, *standard_rows()])
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 0 and len(cmp.rows) == 3
    assert any("repeated key" in n for n in cmp.notes)


def test_results_file_path_is_accepted(base: Path, tmp_path: Path):
    new = write_run(tmp_path / "new", standard_rows())
    assert compare_runs(base / RESULTS_FILE, new / RESULTS_FILE).exit_code == 0


# --- unusable input: exit 2, clear message, nothing written ------------------------------------


def _good_lines() -> str:
    return "".join(r.to_json() + "\n" for r in standard_rows())


UNUSABLE = {
    "malformed": (lambda: _good_lines() + "{not json\n" + row("fp16", "torch").to_json(), "JSON"),
    "torn last line": (lambda: _good_lines() + '{"case": "gp', "interrupted"),
    "empty": (lambda: "", "empty"),
    "blank lines": (lambda: "\n\n  \n", "empty"),
    "schema mismatch": (
        lambda: _good_lines().replace(
            f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 99'
        ),
        "schema_version",
    ),
    "missing key field": (lambda: json.dumps({"schema_version": 1, "case": "gpt3"}), "missing"),
    "non-numeric speedup": (
        lambda: _good_lines().replace('"speedup": 1.25', '"speedup": "fast"'),
        "speedup",
    ),
    "unknown status": (
        lambda: _good_lines().replace('"status": "ok"', '"status": "meh"'),
        "status",
    ),
}


@pytest.mark.parametrize("which", sorted(UNUSABLE))
@pytest.mark.parametrize("side", ["base", "new"])
def test_unusable_results_exit_2(which: str, side: str, base: Path, tmp_path: Path):
    content, words = UNUSABLE[which]
    bad = write_run(tmp_path / "bad", standard_rows())
    (bad / RESULTS_FILE).write_text(content(), encoding="utf-8")
    before = snapshot(base, bad)
    cmp = compare_runs(*((bad, base) if side == "base" else (base, bad)))
    assert cmp.exit_code == 2
    assert words in cmp.problem and str(bad) in cmp.problem
    assert cmp.rows == []
    for fmt in ("text", "markdown", "json"):
        assert "exit 2" in render(cmp, fmt) or json.loads(render(cmp, fmt))["exit_code"] == 2
    assert snapshot(base, bad) == before


def test_missing_and_undecodable_files_exit_2(base: Path, tmp_path: Path):
    cmp = compare_runs(base, tmp_path / "nowhere")
    assert cmp.exit_code == 2 and "no such file" in cmp.problem
    binary = write_run(tmp_path / "binary", standard_rows())
    (binary / RESULTS_FILE).write_bytes(b"\xff\xfe\x00garbage")
    before = snapshot(binary)
    cmp = compare_runs(base, binary)
    assert cmp.exit_code == 2 and "unreadable" in cmp.problem
    assert snapshot(binary) == before


@pytest.mark.parametrize(
    "env_text,words",
    [("{oops", "not readable JSON"), ("[1, 2]", "JSON object"), ('{"schema_version": 9}', "9")],
)
def test_bad_env_json_exit_2(env_text: str, words: str, base: Path, tmp_path: Path):
    new = write_run(tmp_path / "new", standard_rows())
    (new / ENV_FILE).write_text(env_text, encoding="utf-8")
    before = snapshot(base, new)
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 2 and words in cmp.problem and ENV_FILE in cmp.problem
    assert snapshot(base, new) == before


def test_different_device_class_exit_2(base: Path, tmp_path: Path):
    rows = [dataclasses.replace(r, device_class="cpu-avx512-16core") for r in standard_rows()]
    new = write_run(tmp_path / "new", rows)
    before = snapshot(base, new)
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 2
    assert "device class" in cmp.problem and "cpu-avx512-16core" in cmp.problem
    assert DEVICE_CLASS in cmp.problem
    assert snapshot(base, new) == before


def test_bad_tolerances_are_rejected(base: Path):
    with pytest.raises(ValueError, match="speed_tol"):
        compare_runs(base, base, speed_tol=-0.1)
    with pytest.raises(ValueError, match="error_tol"):
        compare_runs(base, base, error_tol=float("nan"))


# --- rendering --------------------------------------------------------------------------------


def test_render_all_formats(base: Path, tmp_path: Path):
    r = row("llm_int8")
    new = write_run(
        tmp_path / "new",
        standard_rows(llm_int8=slowed(r, 1.5), vectorwise={"rel_error": 2e-3}),
    )
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 1

    text = render(cmp, "text")
    assert text.splitlines()[-1].startswith("REGRESSION (exit 1): 3 rows")
    assert "+50.0%" in text and "1.000e-03 -> 2.000e-03" in text
    assert "git commits" in text

    md = render(cmp, "markdown")
    assert md.startswith("### kernelbench compare: REGRESSION (exit 1)")
    assert "| verdict | row |" in md and "|---|" in md
    assert sum(1 for line in md.splitlines() if line.startswith("| ")) == 1 + 3

    doc = json.loads(render(cmp, "json"))
    assert doc["exit_code"] == 1 and doc["counts"] == {"error-worse": 1, "slower": 1, "same": 1}
    slow = next(x for x in doc["rows"] if x["verdict"] == "slower")
    assert slow["key"]["method"] == "llm_int8" and slow["regression"] is True
    assert slow["change"] == pytest.approx(0.5)

    ok = compare_runs(base, base)
    assert render(ok, "text").splitlines()[-1] == "OK (exit 0): 3 rows: 3 same"
    with pytest.raises(ValueError, match="format"):
        render(cmp, "html")


def test_error_from_zero_renders_as_json(tmp_path: Path):
    base = write_run(tmp_path / "base", standard_rows(llm_int8={"rel_error": 0.0}))
    new = write_run(tmp_path / "new", standard_rows(llm_int8={"rel_error": 1e-6}))
    cmp = compare_runs(base, new)
    assert by_method(cmp)["llm_int8"].verdict == "error-worse"
    assert json.loads(render(cmp, "json"))["exit_code"] == 1
    assert "inf" in render(cmp, "text")


# --- baselines --------------------------------------------------------------------------------


def test_update_baseline_copies_bytes_and_is_found(base: Path, tmp_path: Path):
    store = tmp_path / "baselines"
    assert find_baseline(DEVICE_CLASS, store) is None
    before = snapshot(base)
    dest = update_baseline(base, store)
    assert dest == store / DEVICE_CLASS
    for f in (RESULTS_FILE, ENV_FILE):
        assert (dest / f).read_bytes() == (base / f).read_bytes()
    assert snapshot(base) == before
    assert find_baseline(DEVICE_CLASS, store) == dest
    assert compare_runs(dest, base).exit_code == 0
    # updating again replaces it; no temporary files are left behind
    newer = write_run(tmp_path / "newer", standard_rows(), env={"schema_version": 1})
    update_baseline(newer, store)
    assert (dest / ENV_FILE).read_bytes() == (newer / ENV_FILE).read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == [ENV_FILE, RESULTS_FILE]


def test_update_baseline_refuses_failed_rows_unless_forced(tmp_path: Path):
    run = write_run(
        tmp_path / "run", standard_rows(llm_int8={"status": "failed", "reason": "boom"})
    )
    store = tmp_path / "baselines"
    with pytest.raises(BaselineError, match="failed"):
        update_baseline(run, store)
    assert find_baseline(DEVICE_CLASS, store) is None
    assert update_baseline(run, store, force=True) == store / DEVICE_CLASS


def test_update_baseline_refuses_unusable_runs(tmp_path: Path):
    store = tmp_path / "baselines"
    with pytest.raises(BaselineError, match="not a run directory"):
        update_baseline(tmp_path / "nowhere", store)
    mixed = [*standard_rows(), row("llm_int8", device_class="cuda-NVIDIA H200")]
    with pytest.raises(BaselineError, match="several device classes"):
        update_baseline(write_run(tmp_path / "mixed", mixed), store)
    torn = write_run(tmp_path / "torn", standard_rows())
    with (torn / RESULTS_FILE).open("a") as fh:
        fh.write('{"case": ')
    with pytest.raises(BaselineError, match="interrupted"):
        update_baseline(torn, store)
    empty = write_run(tmp_path / "empty", [])
    with pytest.raises(BaselineError, match="no result rows"):
        update_baseline(empty, store)
    assert not store.exists() or not any(store.iterdir())


def test_baseline_names_are_safe_paths(tmp_path: Path):
    assert sanitize("cuda-NVIDIA H200") == "cuda-NVIDIA_H200"
    assert sanitize("../../etc") == "etc"
    assert "/" not in sanitize("a/b\\c")
    with pytest.raises(BaselineError):
        sanitize("..")
    cuda = [dataclasses.replace(r, device_class="cuda-NVIDIA H200") for r in standard_rows()]
    store = tmp_path / "baselines"
    dest = update_baseline(write_run(tmp_path / "gpu", cuda), store)
    assert dest == store / "cuda-NVIDIA_H200"
    assert find_baseline("cuda-NVIDIA H200", store) == dest
    assert find_baseline("..", store) is None
    named = update_baseline(write_run(tmp_path / "gpu2", cuda), store, name="h200 nightly")
    assert named == store / "h200_nightly"


def test_one_baseline_per_processor_of_a_class(tmp_path: Path):
    """Two processors under one class name each keep their own baseline; a machine whose
    processor has none gets another of its class (its errors still gate; compare says its speeds
    are not comparable), and a run without an identity keeps the class folder."""
    store = tmp_path / "baselines"
    zen5 = write_run(tmp_path / "zen5", standard_rows(), machine_env(family="26"))
    zen4 = write_run(tmp_path / "zen4", standard_rows(), machine_env(int8=1.9, family="25"))
    assert processor_key(machine_env(family="26")) == "AuthenticAMD-26-2-1"
    dest5 = update_baseline(zen5, store)
    assert dest5 == store / DEVICE_CLASS / "AuthenticAMD-26-2-1"
    # the class's only baseline, another processor's
    assert find_baseline(DEVICE_CLASS, store, "AuthenticAMD-25-2-1") == dest5
    dest4 = update_baseline(zen4, store)
    assert dest4 == store / DEVICE_CLASS / "AuthenticAMD-25-2-1"
    assert (dest5 / ENV_FILE).read_bytes() == (zen5 / ENV_FILE).read_bytes()  # kept, not replaced
    assert find_baseline(DEVICE_CLASS, store, "AuthenticAMD-25-2-1") == dest4
    assert find_baseline(DEVICE_CLASS, store, "AuthenticAMD-26-2-1") == dest5
    assert find_baseline(DEVICE_CLASS, store, "GenuineIntel-6-143-8") == dest4  # first by name
    assert compare_runs(dest4, zen5).exit_code == 3
    assert compare_runs(dest5, zen5).exit_code == 0
    # no identity recorded: the class folder, found before any processor's of the class
    plain = update_baseline(write_run(tmp_path / "plain", standard_rows()), store)
    assert plain == store / DEVICE_CLASS
    assert find_baseline(DEVICE_CLASS, store, "GenuineIntel-6-143-8") == plain
    assert find_baseline(DEVICE_CLASS, store, "AuthenticAMD-25-2-1") == dest4


@pytest.mark.parametrize("missing", ["vendor", "family", "model", "stepping"])
def test_a_partial_identity_names_no_processor(missing: str):
    env = machine_env()
    env["cpu"]["identity"][missing] = ""
    assert processor_key(env) is None
    assert processor_key({}) is None and processor_key({"cpu": None}) is None


def test_baseline_path_cli_prints_the_path_alone_on_stdout(tmp_path: Path, monkeypatch):
    # scripts/ci_gate.sh reads the path from stdout; the fallback's warning goes to stderr
    from typer.testing import CliRunner

    import kernelbench.run.env as env_mod
    from kernelbench.cli import app

    store = tmp_path / "baselines"
    dclass = env_mod.device_class("cpu")
    rows = [dataclasses.replace(r, device_class=dclass) for r in standard_rows()]
    other = update_baseline(write_run(tmp_path / "other", rows, machine_env(family="99")), store)
    runner = CliRunner()
    got = runner.invoke(app, ["baseline", "path", "--baselines-dir", str(store)])
    assert got.exit_code == 0
    assert got.stdout.strip() == str(other)
    monkeypatch.setattr(
        env_mod,
        "cpu_identity",
        lambda: machine_env(family="99")["cpu"]["identity"],
    )
    got = runner.invoke(app, ["baseline", "path", "--baselines-dir", str(store)])
    assert got.exit_code == 0 and got.stdout.strip() == str(other)
    empty = runner.invoke(app, ["baseline", "path", "--baselines-dir", str(tmp_path / "none")])
    assert empty.exit_code == 1


def test_baseline_update_says_a_kept_gate_tolerance_needs_measuring_again(tmp_path: Path):
    """A baseline's gate.json (its measured speed tolerance) stays when the baseline is made
    again from new rounds; the command says so, and keeps it."""
    from typer.testing import CliRunner

    from kernelbench.cli import app

    store = tmp_path / "baselines"
    run = write_run(tmp_path / "run", standard_rows(), machine_env())
    runner = CliRunner()
    first = runner.invoke(app, ["baseline", "update", str(run), "--baselines-dir", str(store)])
    assert first.exit_code == 0 and GATE_FILE not in first.output, first.output
    dest = update_baseline(run, store)
    (dest / GATE_FILE).write_text('{"speed_tol": 0.4}', encoding="utf-8")
    again = runner.invoke(app, ["baseline", "update", str(run), "--baselines-dir", str(store)])
    assert again.exit_code == 0 and "measure it again" in " ".join(again.output.split())
    assert json.loads((dest / GATE_FILE).read_text(encoding="utf-8")) == {"speed_tol": 0.4}


# --- the committed CPU baseline ----------------------------------------------------------------

BASELINES_DIR = Path(__file__).resolve().parents[1] / "reports" / "baselines"
COMMITTED = sorted(p.parent for p in BASELINES_DIR.rglob(RESULTS_FILE))


@pytest.mark.parametrize(
    "gate",
    sorted(BASELINES_DIR.rglob(GATE_FILE)),
    ids=lambda p: str(p.parent.relative_to(BASELINES_DIR)),
)
def test_a_committed_gate_file_holds_a_measured_tolerance_or_spread(gate: Path):
    """scripts/ci_gate.sh reads ``speed_tol`` from it, with its measurement beside it; compare
    reads ``between_runs`` (kernelbench spread --save, which writes the file beside a baseline
    whose tolerance was never measured). Each committed file holds one or both, measured."""
    from kernelbench.results.spread import GATE_KEY, read_spread

    data = json.loads(gate.read_text(encoding="utf-8"))
    assert "speed_tol" in data or GATE_KEY in data, f"{gate}: neither speed_tol nor {GATE_KEY}"
    if "speed_tol" in data:
        assert 0 < float(data["speed_tol"]) < 1
        assert "gate_noise.py" in data["measured"]
    if GATE_KEY in data:
        spread = read_spread(gate.parent)
        assert spread is not None and "kernelbench spread" in spread.source
    assert (gate.parent / RESULTS_FILE).is_file()


@pytest.mark.skipif(not COMMITTED, reason="no committed baseline")
@pytest.mark.parametrize(
    "committed", COMMITTED, ids=[str(p.relative_to(BASELINES_DIR)) for p in COMMITTED]
)
def test_committed_baseline_catches_a_50pct_slowdown_of_each_custom_llm_int8_row(
    tmp_path: Path, committed: Path
):
    # On the kept data, through the CLI: the baseline against itself exits 0; a copy with one
    # custom llm_int8 row's samples 50% slower exits 1 naming that row, with the baseline's own
    # measured noise on both sides of the band.
    from typer.testing import CliRunner

    from kernelbench.cli import app

    lines = (committed / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    targets = [
        i
        for i, line in enumerate(lines)
        if (r := json.loads(line))["backend"] == "custom"
        and r["method"] == "llm_int8"
        and r["status"] == "ok"
    ]
    assert targets, "the committed baseline has no measured custom llm_int8 row"
    runner = CliRunner()
    same = runner.invoke(app, ["compare", str(committed), str(committed)])
    assert same.exit_code == 0, same.output
    for i in targets:
        slowed_lines = list(lines)
        r = json.loads(lines[i])
        r["median_ms"] *= 1.5
        r["raw_ms"] = [t * 1.5 for t in r["raw_ms"]]  # rows are pooled from their samples
        slowed_lines[i] = json.dumps(r)
        copy = tmp_path / f"slow{i}"
        copy.mkdir()
        (copy / RESULTS_FILE).write_text("\n".join(slowed_lines) + "\n", encoding="utf-8")
        (copy / ENV_FILE).write_bytes((committed / ENV_FILE).read_bytes())
        got = runner.invoke(app, ["compare", str(committed), str(copy), "--backend", "custom"])
        assert got.exit_code == 1, got.output
        label = f"gpt3 {r['size']} {r['layer']} tokens={r['tokens']} custom/llm_int8"
        slower = [ln for ln in got.output.splitlines() if ln.startswith("slower ")]
        assert len(slower) == 1 and label in slower[0], got.output


# --- comparable machines ------------------------------------------------------------------------


def machine_env(int8=0.887, bf16=0.408, fp32=0.187, gbs=49.0, family="26") -> dict:
    peak = {
        "int8": {"tops": int8, "source": "measured"},
        "16bit": {"tops": bf16, "source": "measured"},
        "fp32": {"tops": fp32, "source": "measured"},
        "bandwidth": {"gbs": gbs, "source": "measured"},
    }
    identity = {"vendor": "AuthenticAMD", "family": family, "model": "2", "stepping": "1"}
    return {"schema_version": 1, "peak": peak, "cpu": {"identity": identity}}


def test_hosts_with_different_peaks_are_not_comparable_not_regressed(tmp_path: Path):
    """One class name, two hosts: the baseline's host measured half this one's peaks. A row
    slower by 56% is not called a regression: compare says the machines differ (exit 3)."""
    base = write_run(tmp_path / "base", standard_rows(), machine_env())
    r = row("llm_int8")
    new = write_run(
        tmp_path / "new",
        standard_rows(llm_int8=slowed(r, 1.56)),
        machine_env(int8=1.92, bf16=0.826, fp32=0.198),
    )
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 3 and not cmp.regressions
    assert "int8 peak 0.887 vs 1.92" in cmp.not_comparable
    assert "16bit peak" in cmp.not_comparable and "fp32" not in cmp.not_comparable  # 6%: noise
    slow = by_method(cmp)["llm_int8"]
    assert slow.verdict == "unknown" and "slower as measured" in slow.detail
    text = render(cmp, "text")
    assert "NOT COMPARABLE (exit 3)" in text and "REGRESSION" not in text
    assert json.loads(render(cmp, "json"))["exit_code"] == 3


def test_a_different_processor_is_not_comparable_and_errors_still_gate(tmp_path: Path):
    base = write_run(tmp_path / "base", standard_rows(), machine_env(family="25"))
    new = write_run(tmp_path / "new", standard_rows(), machine_env(family="26"))
    cmp = compare_runs(base, new)
    assert cmp.exit_code == 3 and "family 25 vs 26" in cmp.not_comparable
    worse = write_run(
        tmp_path / "worse", standard_rows(llm_int8={"rel_error": 0.5}), machine_env(family="26")
    )
    cmp = compare_runs(base, worse)
    assert cmp.exit_code == 1 and by_method(cmp)["llm_int8"].verdict == "error-worse"
    summary = render(cmp, "text").splitlines()[-1]  # a regression of errors, not of speed
    assert summary.startswith("REGRESSION (exit 1; of errors only: base and new ran on machines")


def test_same_machine_within_peak_noise_and_old_runs_compare_as_before(tmp_path: Path):
    base = write_run(tmp_path / "base", standard_rows(), machine_env())
    r = row("llm_int8")
    slower = standard_rows(llm_int8=slowed(r, 1.30))
    near = write_run(tmp_path / "near", slower, machine_env(int8=0.95, gbs=45.0))
    assert compare_runs(base, near).exit_code == 1  # peaks within 25%: a regression
    old = write_run(tmp_path / "old", slower)  # no identity, no peaks recorded
    assert compare_runs(base, old).exit_code == 1
    assert compare_runs(old, base).not_comparable == ""


def test_the_bandwidth_peak_of_one_host_drifts_within_its_wider_tolerance(tmp_path: Path):
    # one processor measured 52.6 and 83.3 GB/s within a day (a shared memory bus): comparable;
    # its compute peaks still separate hosts at 25%, and a bandwidth 2x apart is another machine
    base = write_run(tmp_path / "base", standard_rows(), machine_env(gbs=83.3))
    slower = standard_rows(llm_int8=slowed(row("llm_int8"), 1.30))
    drift = write_run(tmp_path / "drift", slower, machine_env(gbs=52.6))
    assert compare_runs(base, drift).exit_code == 1
    far = write_run(tmp_path / "far", slower, machine_env(gbs=34.2))
    cmp = compare_runs(base, far)
    assert cmp.exit_code == 3 and "bandwidth peak 83.3 vs 34.2 GB/s" in cmp.not_comparable
    assert "more than 75%" in cmp.not_comparable


def test_one_host_whose_peak_rose_stays_comparable_with_its_earlier_runs(tmp_path: Path):
    """The cache keeps the best call, which only rises: a host that read fp32 at 0.359 TOPS and
    later at 0.455 (27% apart) is judged by the range of its readings, not by the new best."""
    before = machine_env(int8=3.91, bf16=2.70, fp32=0.359, gbs=45.1)
    after = machine_env(int8=4.34, bf16=3.24, fp32=0.455, gbs=58.4)
    base = write_run(tmp_path / "base", standard_rows(), before)
    slower = standard_rows(llm_int8=slowed(row("llm_int8"), 1.30))
    unrecorded = write_run(tmp_path / "unrecorded", slower, after)
    cmp = compare_runs(base, unrecorded)  # no readings kept: the best calls are all there is
    assert cmp.exit_code == 3 and "fp32 peak 0.359 vs 0.455 TOPS" in cmp.not_comparable
    for kind, unit, earlier in (
        ("int8", "tops", 3.91),
        ("16bit", "tops", 2.70),
        ("fp32", "tops", 0.359),
        ("bandwidth", "gbs", 45.1),
    ):
        after["peak"][kind]["readings"] = [earlier, after["peak"][kind][unit]]
    recorded = write_run(tmp_path / "recorded", slower, after)
    assert compare_runs(base, recorded).exit_code == 1  # one host: its slowdown is judged
    assert compare_runs(recorded, base).not_comparable == ""  # symmetric
    # a lower reading kept the old way (remeasured) widens the range as well
    legacy = machine_env(int8=4.34, bf16=3.24, fp32=0.455, gbs=58.4)
    legacy["peak"]["fp32"]["remeasured"] = {"tops": 0.36}
    cmp = compare_runs(base, write_run(tmp_path / "legacy", slower, legacy))
    assert cmp.exit_code == 1 and cmp.not_comparable == ""


def test_another_host_is_told_apart_by_the_gap_between_the_ranges(tmp_path: Path):
    """Readings that spread do not make every host comparable: the tolerance applies to the
    gap between the two ranges, and the message shows them."""
    spread = machine_env(int8=0.95)
    spread["peak"]["int8"]["readings"] = [0.80, 0.95, 0.887]
    base = write_run(tmp_path / "base", standard_rows(), spread)
    fast = machine_env(int8=1.92, bf16=0.45)
    fast["peak"]["int8"]["readings"] = [1.80, 1.92]
    cmp = compare_runs(base, write_run(tmp_path / "fast", standard_rows(), fast))
    assert cmp.exit_code == 3
    assert "int8 peak 0.95 vs 1.92 TOPS (quiet readings 0.8-0.95 in 3 vs 1.8-1.92 in 2)" in (
        cmp.not_comparable
    )
    assert "16bit" not in cmp.not_comparable  # 10%: within its tolerance
    # 1.80 / 0.95: 89% apart; ranges 20% apart are one class of host
    near = machine_env(int8=1.20)
    near["peak"]["int8"]["readings"] = [1.14, 1.20]
    assert compare_runs(base, write_run(tmp_path / "near", standard_rows(), near)).exit_code == 0


def test_peak_gap_is_zero_for_overlapping_ranges_and_symmetric():
    from kernelbench.results.compare import peak_gap

    assert peak_gap((1.0, 0.8, 3), (0.9, 0.85, 2)) == 0.0
    assert peak_gap((1.0, 0.8, 3), (1.5, 1.2, 2)) == pytest.approx(0.2)
    assert peak_gap((1.5, 1.2, 2), (1.0, 0.8, 3)) == pytest.approx(0.2)


def test_cpu_identity_reads_cpuinfo_and_sysfs_caches(tmp_path: Path):
    from kernelbench.run.env import cpu_identity

    cpuinfo = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\nmicrocode\t: 0x2b0004b1\n"
        "\nprocessor\t: 1\nvendor_id\t: OtherVendor\ncpu family\t: 99\n"
    )
    for i, (level, kind, size) in enumerate(
        [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K")]
    ):
        d = tmp_path / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(value + "\n")
    ident = cpu_identity(cpuinfo, tmp_path)
    assert ident == {
        "vendor": "GenuineIntel",
        "family": "6",
        "model": "143",
        "stepping": "8",
        "microcode": "0x2b0004b1",
        "caches": {"L1d": "48K", "L1i": "32K", "L2": "2048K"},
    }
    assert cpu_identity("", tmp_path / "none") == {}


def test_between_processors_a_float_error_may_move_by_rounding_not_more(tmp_path: Path):
    """A library's float GEMM may take another kernel on another processor (oneDNN's bf16
    baseline moved one error by 1.5e-4 relative between a Zen 4 and a Zen 5): between two
    processors that is no regression; a larger change, or any error on an exact row, is."""
    base_rows = standard_rows(vectorwise={"rel_error": 0.0})  # an exact (integer) row
    base = write_run(tmp_path / "base", base_rows, machine_env(family="25"))
    rounding = {"fp16": {"rel_error": 4e-3 * (1 + 1.5e-4)}, "vectorwise": {"rel_error": 0.0}}
    other = write_run(tmp_path / "other", standard_rows(**rounding), machine_env(family="26"))
    cmp = compare_runs(base, other)
    assert cmp.exit_code == 3 and not cmp.regressions
    fp16 = by_method(cmp)["fp16"]
    assert fp16.verdict != "error-worse" and "+0.015%" in fp16.detail
    assert "rounding" in fp16.detail and "between processors" in fp16.detail
    # the same change on one processor: deterministic there, a regression
    same = write_run(tmp_path / "same", standard_rows(**rounding), machine_env(family="25"))
    assert by_method(compare_runs(base, same))["fp16"].verdict == "error-worse"
    # beyond the allowance, or on the exact row: regressions between processors too
    exact = {"vectorwise": {"rel_error": 0.0}}
    for method, change in (
        ("fp16", {**exact, "fp16": {"rel_error": 4e-3 * 1.002}}),
        ("vectorwise", {"vectorwise": {"rel_error": 1e-8}}),
    ):
        worse = write_run(tmp_path / "worse", standard_rows(**change), machine_env(family="26"))
        cmp = compare_runs(base, worse)
        assert cmp.exit_code == 1, method
        assert [r.key[5] for r in cmp.regressions] == [method]


def test_between_processors_a_float32_error_may_move_at_its_rounding_scale(tmp_path: Path):
    """A float32 GEMM's error against float64 (about 1e-7) is all summation order: torch fp32
    moved from 9.8e-8 on a Zen 4 to 1.25e-7 on a Xeon (+28%). Between processors that is
    rounding; on one processor, or grown to 1e-6, it is a regression."""
    base = write_run(
        tmp_path / "base", standard_rows(fp16={"rel_error": 9.8e-8}), machine_env(family="25")
    )
    moved = standard_rows(fp16={"rel_error": 1.25e-7})
    cmp = compare_runs(base, write_run(tmp_path / "other", moved, machine_env(family="26")))
    assert cmp.exit_code == 3 and not cmp.regressions
    assert "float32's rounding scale" in by_method(cmp)["fp16"].detail
    same = write_run(tmp_path / "same", moved, machine_env(family="25"))
    assert by_method(compare_runs(base, same))["fp16"].verdict == "error-worse"
    lost = standard_rows(fp16={"rel_error": 1e-6})
    cmp = compare_runs(base, write_run(tmp_path / "lost", lost, machine_env(family="26")))
    assert [r.key[5] for r in cmp.regressions] == ["fp16"]


def test_runs_that_met_the_threads_on_different_placements_say_so(tmp_path: Path):
    """Cold CPU runs record each call's link between two threads: a base run with every call
    on two core complexes and a new one with every call on one get a note (their memory-bound
    rows move with the host); runs on the same placement, or without readings, get none."""

    def run(path: Path, links: list[float]) -> Path:
        n = len(links)
        extra = {"raw_ms": [8.0] * n, "bus_gbps": [60.0] * n, "link_ns": links}
        rows = [row("fp16", backend="torch"), dataclasses.replace(row("llm_int8"), **extra)]
        return write_run(path, rows)

    two = run(tmp_path / "two", [330.0] * 20)
    one = run(tmp_path / "one", [50.0] * 20)
    also_two = run(tmp_path / "also_two", [320.0] * 20)
    note = "the host ran the threads apart for 100% of the base run's"
    cmp = compare_runs(two, one)
    assert any(note in n and "0% of the new run's" in n for n in cmp.notes)
    assert not any("threads apart" in n for n in compare_runs(two, also_two).notes)
    bare = write_run(tmp_path / "bare", standard_rows())
    assert not any("threads apart" in n for n in compare_runs(two, bare).notes)


def test_runs_whose_cores_ran_at_different_speeds_say_so(tmp_path: Path):
    """Cold CPU runs record each call's core probe: runs whose medians are more than 10%
    apart get a note naming both; runs within it, or without readings, get none."""

    def run(path: Path, core_ns: list[float]) -> Path:
        extra = {"raw_ms": [8.0] * len(core_ns), "core_ns": core_ns}
        rows = [row("fp16", backend="torch"), dataclasses.replace(row("llm_int8"), **extra)]
        return write_run(path, rows)

    fast = run(tmp_path / "fast", [12.7e3] * 19 + [40e3])
    slow = run(tmp_path / "slow", [16.0e3] * 20)
    near = run(tmp_path / "near", [13.5e3] * 20)
    notes = compare_runs(fast, slow).notes
    assert any("median 12.7 us in base, 16.0 us in new" in n for n in notes), notes
    assert not any("different speeds" in n for n in compare_runs(fast, near).notes)
    bare = write_run(tmp_path / "bare", standard_rows())
    assert not any("different speeds" in n for n in compare_runs(fast, bare).notes)


def _placed_row(near: int, far: int, near_speedup: float, far_speedup: float) -> ResultRow:
    """custom/llm_int8 with ``near`` pairs on one core complex (link 50 ns) at
    ``near_speedup`` and ``far`` on two (330 ns) at ``far_speedup``, one round."""
    base_ms = [10.0 + 0.01 * (i % 7) for i in range(near + far)]
    speedups = [near_speedup] * near + [far_speedup] * far
    raw = [
        b / s * (1 + 0.002 * (i % 5))
        for i, (b, s) in enumerate(zip(base_ms, speedups, strict=True))
    ]
    ratios = sorted(b / r for b, r in zip(base_ms, raw, strict=True))
    median = ratios[len(ratios) // 2]
    return row(
        "llm_int8",
        median_ms=sorted(raw)[len(raw) // 2],
        speedup=median,
        speedup_lo=median * 0.99,
        speedup_hi=median * 1.01,
        paired=True,
        raw_ms=raw,
        baseline_raw_ms=base_ms,
        bus_gbps=[45.0] * near + [80.0] * far,
        link_ns=[50.0] * near + [330.0] * far,
        round_samples=[near + far],
        samples=near + far,
    )


def test_a_speedup_that_moved_only_with_the_placements_mix_is_the_same(tmp_path: Path):
    """Two runs met the host's placements of the threads in different shares: a row at 2x on
    one core complex and 3x on two reads 2x pooled in one run and 3x in the other. In each
    placement both runs met it is the same: ``same``; slower in one of them: ``slower``."""
    base = write_run(tmp_path / "base", [row("fp16", backend="torch"), _placed_row(15, 6, 2, 3)])
    mixed = write_run(tmp_path / "mixed", [row("fp16", backend="torch"), _placed_row(6, 15, 2, 3)])
    cmp = compare_runs(base, mixed)
    llm = by_method(cmp)["llm_int8"]
    assert llm.verdict == "same" and cmp.exit_code == 0
    assert "faster pooled" in llm.detail
    assert "with the threads close together 1.99x -> 1.99x (same)" in llm.detail
    assert "apart 2.99x -> 2.99x (same)" in llm.detail
    # slower on one complex, the same on two: a regression, whatever the pooled figure says
    worse = write_run(
        tmp_path / "worse", [row("fp16", backend="torch"), _placed_row(6, 15, 1.5, 3)]
    )
    llm = by_method(compare_runs(base, worse))["llm_int8"]
    assert llm.verdict == "slower"
    assert "with the threads close together 1.99x -> 1.5x (slower)" in llm.detail
    # the HTML A/B report gives the same verdicts (no pooled band where the placements decided)
    from kernelbench.report import data, tables
    from kernelbench.results.schema import KEY_COLUMNS

    a, b = (data.load_run(p) for p in (base, mixed))
    pairs = tables.paired(a.ok, b.ok, list(KEY_COLUMNS)).set_index("method")
    assert pairs.loc["llm_int8", "verdict"] == "same"
    assert pd.isna(pairs.loc["llm_int8", "speedup_ratio_lo"])


def _shifted(changes: dict[str, list[float]]) -> list:
    """Compared rows, one per (backend, cell): ``changes[backend][i]`` is cell i's change."""
    from kernelbench.results.compare import RowComparison

    rows = []
    for backend, per_cell in changes.items():
        for i, change in enumerate(per_cell):
            key = ("gpt3", 768 * (i + 1), 2048, "ffn1", backend, "int8_raw", "cpu-x")
            rows.append(RowComparison(key, "", "same", "speedup", 1.0, 1.0, change))
    baseline = ("gpt3", 768, 2048, "ffn1", "torch", "fp16", "cpu-x")
    return [*rows, RowComparison(baseline, "", "same", "speedup", 1.0, 1.0, 0.0)]


def test_a_shift_every_backend_shares_is_said_and_one_backends_is_not():
    from kernelbench.results.compare import common_shift_note

    together = common_shift_note(_shifted({"torch": [-0.06] * 8, "custom": [-0.04] * 8}))
    assert "read faster" in together and "8 of 8 cells" in together
    assert "torch -6.0%" in together and "custom -4.0%" in together
    # one backend's own change (its code) with the others steady: no common shift
    assert common_shift_note(_shifted({"torch": [0.0] * 8, "custom": [-0.2] * 8})) == ""
    assert common_shift_note(_shifted({"torch": [-0.01] * 8, "custom": [-0.2] * 8})) == ""
    # cells that move both ways, or too few cells to tell: nothing said
    mixed = [0.05, -0.05, 0.06, -0.04, 0.05, -0.06, 0.04, -0.05]
    assert common_shift_note(_shifted({"torch": mixed, "custom": mixed})) == ""
    assert common_shift_note(_shifted({"torch": [-0.06] * 4, "custom": [-0.06] * 4})) == ""


def test_a_row_of_one_round_in_a_run_of_several_is_not_called_slower(tmp_path: Path):
    """fp32 with a long call is timed in the first round only: its interval covers that round,
    so a change beyond it is unknown, not slower, while the rows pooled from every round are
    judged."""

    def rounds(slow: float) -> list[ResultRow]:
        out = []
        for r in range(3):
            for x in standard_rows():
                if x.method == "vectorwise" and r:
                    continue  # the one-round row
                changes = slowed(x, slow) if x.method != "fp16" and slow != 1.0 else {}
                x = dataclasses.replace(x, round=r, **changes)
                calls = [x.median_ms * (1 + 0.01 * (i % 3 - 1)) for i in range(20)]
                out.append(dataclasses.replace(x, raw_ms=calls))
        return out

    base = write_run(tmp_path / "b", rounds(1.0))
    new = write_run(tmp_path / "n", rounds(1.3))
    got = by_method(compare_runs(base, new))
    assert got["llm_int8"].verdict == "slower"
    assert got["vectorwise"].verdict == "unknown"
    assert "one round of a run of several" in got["vectorwise"].detail
    # runs of one round each (--quick): judged as measured
    single = by_method(
        compare_runs(
            write_run(tmp_path / "b1", standard_rows()),
            write_run(
                tmp_path / "n1",
                [
                    dataclasses.replace(x, **slowed(x, 1.3)) if x.method != "fp16" else x
                    for x in standard_rows()
                ],
            ),
        )
    )
    assert single["vectorwise"].verdict == "slower"


def test_the_one_round_rule_is_the_verdict_modules_so_the_html_ab_report_shares_it():
    from kernelbench.report.tables import paired
    from kernelbench.results.verdict import SpeedCall, one_round_verdict

    slower = SpeedCall("slower", "speedup", 1.0, 0.8, 0.25, 0.05, 0.1)
    assert one_round_verdict(slower, {"rounds": 1}, {"rounds": 1}, 3, 3).verdict == "unknown"
    assert one_round_verdict(slower, {"rounds": 3}, {"rounds": 3}, 3, 3).verdict == "slower"
    assert one_round_verdict(slower, {"rounds": 1}, {"rounds": 1}, 1, 1).verdict == "slower"
    keys = ["method"]
    a = pd.DataFrame(
        {
            "method": ["fp32"],
            "speedup": [0.20],
            "speedup_lo": [0.199],
            "speedup_hi": [0.201],
            "paired": [True],
            "median_ms": [5.0],
            "rounds": [1],
            "status": ["ok"],
            "size": ["2.7B"],
        }
    )
    b = a.assign(speedup=[0.16], speedup_lo=[0.159], speedup_hi=[0.161], median_ms=[6.2])
    several = pd.DataFrame({"method": ["llm_int8"], "rounds": [3]})
    assert paired(a, b, keys)["verdict"].iloc[0] == "slower"  # runs of one round each
    mixed = paired(pd.concat([a, several]), pd.concat([b, several]), keys)
    assert mixed.set_index("method").loc["fp32", "verdict"] == "unknown"


def test_runs_with_different_setups_say_so_and_keep_their_verdicts(tmp_path: Path):
    """A thread count, a library version or an environment variable that changes what is
    measured (the allocator, OpenMP) is named in a note; the rows are judged as before."""
    env = {"schema_version": 1, "torch": "2.13.0", "threads": 2, "libraries": {"torchao": "0.18.0"}}
    base = write_run(tmp_path / "base", standard_rows(), {**env, "environment": {}})
    new_env = {
        **env,
        "threads": 1,
        "libraries": {"torchao": "0.19.0"},
        "environment": {"LD_PRELOAD": "libjemalloc.so.2", "OMP_NUM_THREADS": "1"},
    }
    new = write_run(tmp_path / "new", standard_rows(), new_env)
    cmp = compare_runs(base, new)
    note = next(n for n in cmp.notes if n.startswith("base and new ran with different setups"))
    for words in (
        "threads 2 vs 1",
        "torchao 0.18.0 vs 0.19.0",
        "LD_PRELOAD unset vs 'libjemalloc.so.2'",
        "OMP_NUM_THREADS unset vs '1'",
    ):
        assert words in note
    assert "torch " not in note  # the same torch
    assert cmp.exit_code == 0 and {r.verdict for r in cmp.rows} == {"same"}
    assert note in render(cmp, "text")


def test_same_setups_or_an_unrecorded_environment_add_no_note(tmp_path: Path):
    env = {"schema_version": 1, "torch": "2.13.0", "threads": 2, "environment": {"OMP_X": "1"}}
    base = write_run(tmp_path / "base", standard_rows(), env)
    same = write_run(tmp_path / "same", standard_rows(), env)
    older = write_run(  # a run from before env.json recorded its environment
        tmp_path / "older", standard_rows(), {k: v for k, v in env.items() if k != "environment"}
    )
    for other in (same, older):
        notes = compare_runs(base, other).notes
        assert not any("different setups" in n for n in notes)
