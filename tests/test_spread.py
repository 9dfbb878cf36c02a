"""The spread between runs: measured from runs of one commit, kept beside the processor's
baseline, added to each run's noise by ``compare`` and the A/B report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_compare import row, write_run
from typer.testing import CliRunner

from kernelbench.cli.commands import app
from kernelbench.report import write_report
from kernelbench.results.compare import compare_runs, load_run
from kernelbench.results.schema import KEY_COLUMNS
from kernelbench.results.spread import (
    GATE_KEY,
    PairGap,
    SpreadError,
    fit_halfwidth,
    machine_of,
    measure_spread,
    read_spread,
    save_spread,
    spread_for,
)
from kernelbench.results.verdict import RunSpread

IDENTITY = {"vendor": "GenuineIntel", "family": "6", "model": "207", "stepping": "2"}
PROCESSOR = "GenuineIntel-6-207-2"
CLASS = "cpu-avx2-2core"


def env(commit: str = "abc123", **identity) -> dict:
    return {
        "schema_version": 1,
        "git_commit": commit,
        "cpu": {"identity": {**IDENTITY, **identity}},
    }


def drifted_run(
    path: Path, shift: float, cells: int = 30, halfwidth: float = 0.02, rounds: int = 4, **kw
) -> Path:
    """A run of ``cells`` token counts, each a 16-bit baseline (4 rounds) and one custom
    ``llm_int8`` row whose speedup is 0.8 x (1 + shift) with a +-``halfwidth`` interval, pooled
    from ``rounds`` rounds."""
    rows = []
    for tokens in range(1, cells + 1):
        speedup = 0.8 * (1 + shift)
        rows.append(row("fp16", backend="torch", tokens=tokens, rounds=4))
        rows.append(
            row(
                "llm_int8",
                tokens=tokens,
                rounds=rounds,
                paired=True,
                median_ms=10.0 / speedup,
                speedup=speedup,
                speedup_lo=speedup * math.exp(-halfwidth),
                speedup_hi=speedup * math.exp(halfwidth),
            )
        )
    return write_run(path, rows, kw.get("env") or env())


def test_fit_leaves_at_most_the_target_beyond():
    # 40 pairs, intervals +-2% each, gaps 1%..40%: a pair needs sqrt((gap^2 - 2 * 0.02^2) / 2)
    gaps = [PairGap(("k", i), 0.01 * i, 0.02, 0.02) for i in range(1, 41)]
    fitted = fit_halfwidth(gaps, 0.05)
    assert sum(g.beyond(fitted) for g in gaps) == 2  # 5% of 40
    assert sum(g.beyond(fitted * 0.99) for g in gaps) > 2  # the smallest that does
    assert fitted == pytest.approx(math.sqrt((0.38**2 - 2 * 0.02**2) / 2))
    # pairs that their own intervals cover need nothing
    assert fit_halfwidth([PairGap(("k", i), 0.01, 0.02, 0.02) for i in range(30)]) == 0.0


def test_runs_that_drift_apart_get_the_spread_that_covers_them(tmp_path: Path):
    runs = [drifted_run(tmp_path / f"r{i}", s) for i, s in enumerate((-0.06, 0.0, 0.06))]
    fit = measure_spread(runs)
    assert fit.runs == 3 and len(fit.pairs) == 90  # 3 pairs of runs x 30 rows
    assert fit.beyond_share == 1.0  # 6-12% apart, +-2% intervals
    # the widest pair (12% apart) is covered, with its intervals, by the fitted spread
    widest = math.log(1.06 / 0.94)
    assert fit.spread.halfwidth == pytest.approx(math.sqrt((widest**2 - 2 * 0.02**2) / 2))
    assert fit.spread.by_backend == {"custom": fit.spread.halfwidth}
    assert (fit.device_class, fit.processor) == (CLASS, PROCESSOR)


def by_token_run(path: Path, decode_shift: float) -> Path:
    """24 sizes at 1 and at 256 tokens: the 1-token rows' speedups moved by ``decode_shift``,
    the 256-token rows' not (+-2% intervals each)."""
    rows = []
    for d in range(24):
        for tokens, shift in ((1, decode_shift), (256, 0.0)):
            speedup = 0.8 * (1 + shift)
            rows.append(row("fp16", backend="torch", tokens=tokens, d_model=768 + d, rounds=4))
            rows.append(
                row(
                    "llm_int8",
                    tokens=tokens,
                    d_model=768 + d,
                    rounds=4,
                    paired=True,
                    median_ms=10.0 / speedup,
                    speedup=speedup,
                    speedup_lo=speedup * math.exp(-0.02),
                    speedup_hi=speedup * math.exp(0.02),
                )
            )
    return write_run(path, rows, env())


def test_the_spread_is_fitted_per_token_count_and_compare_uses_the_rows_own(tmp_path: Path):
    """Decode rows drift between runs where prefill rows do not: one pooled figure would
    widen the prefill rows' bands and leave the decode rows' too narrow."""
    a, b = by_token_run(tmp_path / "a", 0.0), by_token_run(tmp_path / "b", 0.10)
    fit = measure_spread([a, b])
    gap = math.log(1.10)
    decode = math.sqrt((gap**2 - 2 * 0.02**2) / 2)
    assert fit.spread.by_tokens == {1: pytest.approx(decode), 256: 0.0}
    assert fit.spread.by_backend_tokens == {"custom": fit.spread.by_tokens}
    assert fit.spread.for_row("custom", 256) == 0.0
    assert fit.spread.for_row("custom", 1) == pytest.approx(decode)
    assert fit.spread.for_row("custom", 32) == fit.spread.for_backend("custom")  # not measured
    assert "by token count 1 +-" in fit.spread.describe()
    # kept and read back as measured
    path = save_spread(fit, tmp_path / "baselines")
    kept = read_spread(path.parent)
    assert kept.by_tokens == {1: pytest.approx(decode, abs=1e-5), 256: 0.0}
    assert kept.by_backend_tokens["custom"][1] == pytest.approx(decode, abs=1e-5)
    # compare: a shift within the decode rows' band is beyond a prefill row's
    moved = write_run(
        tmp_path / "moved",
        [row("fp16", backend="torch", tokens=t, d_model=768, rounds=4) for t in (1, 256)]
        + [
            row(
                "llm_int8",
                tokens=t,
                d_model=768,
                rounds=4,
                paired=True,
                median_ms=10.0 / (0.8 * 1.06),
                speedup=0.8 * 1.06,
                speedup_lo=0.8 * 1.06 * math.exp(-0.02),
                speedup_hi=0.8 * 1.06 * math.exp(0.02),
            )
            for t in (1, 256)
        ],
        env(),
    )
    got = compare_runs(a, moved, speed_tol=0.0, between=kept)  # 6% faster, both token counts
    verdicts = {
        r.key[KEY_COLUMNS.index("tokens")]: r.verdict for r in got.rows if r.key[5] == "llm_int8"
    }
    assert verdicts == {1: "same", 256: "faster"}


def test_a_kept_spread_by_token_count_that_is_not_one_is_refused(tmp_path: Path):
    folder = tmp_path / "kept"
    folder.mkdir()
    for bad, says in (
        ({"by_tokens": {"one": 0.1}}, "not a token count"),
        ({"by_tokens": {"1": 2.0}}, "must be in"),
        ({"by_backend_tokens": {"custom": 0.1}}, "map backends to objects"),
    ):
        entry = {"halfwidth": 0.02, "by_backend": {}, **bad}
        (folder / "gate.json").write_text(json.dumps({GATE_KEY: entry}), encoding="utf-8")
        with pytest.raises(SpreadError, match=says):
            read_spread(folder)


def test_bad_sets_of_runs_are_refused_with_the_reason(tmp_path: Path):
    a = drifted_run(tmp_path / "a", 0.0)
    with pytest.raises(SpreadError, match="two or more runs"):
        measure_spread([a])
    other = drifted_run(tmp_path / "other", 0.05, env=env(model="143"))
    with pytest.raises(SpreadError, match="different machines"):
        measure_spread([a, other])
    later = drifted_run(tmp_path / "later", 0.05, env=env(commit="def456"))
    with pytest.raises(SpreadError, match="no two runs of one commit"):
        measure_spread([a, later])
    few = drifted_run(tmp_path / "few", 0.05, cells=5)
    with pytest.raises(SpreadError, match="need at least"):
        measure_spread([a, few])
    # rows pooled from one round in a run of several say nothing of the drift between runs
    with pytest.raises(SpreadError, match="need at least"):
        measure_spread([drifted_run(tmp_path / "one", 0.05, rounds=1), a])


def test_compare_adds_the_spread_to_each_runs_noise(tmp_path: Path):
    base = drifted_run(tmp_path / "base", 0.0)
    new = drifted_run(tmp_path / "new", 0.12)
    alone = compare_runs(base, new)
    assert {r.verdict for r in alone.rows if r.key[5] == "llm_int8"} == {"faster"}
    spread = RunSpread(0.05, {"custom": 0.10}, "test runs")
    got = compare_runs(base, new, between=spread)
    rows = [r for r in got.rows if r.key[5] == "llm_int8"]
    assert {r.verdict for r in rows} == {"same"}
    assert rows[0].noise == pytest.approx(math.sqrt(2 * math.sinh(0.02) ** 2 + 2 * 0.10**2))
    assert any("custom +-10.0%" in n and "test runs" in n for n in got.notes)
    # a change beyond the widened band is still called
    far = drifted_run(tmp_path / "far", 0.40)
    assert {r.verdict for r in compare_runs(base, far, between=spread).rows} >= {"faster"}


def test_compare_does_not_use_a_spread_across_machines(tmp_path: Path):
    base = drifted_run(tmp_path / "base", 0.0)
    new = drifted_run(tmp_path / "new", 0.0, env=env(model="143"))
    machines = [machine_of(r.device_classes, r.env) for r in map(load_run, (base, new))]
    fit = measure_spread([base, drifted_run(tmp_path / "b2", 0.1)])
    save_spread(fit, tmp_path / "baselines")
    assert spread_for(*machines, tmp_path / "baselines") is None
    assert spread_for(machines[0], machines[0], tmp_path / "baselines") == read_spread(
        tmp_path / "baselines" / CLASS / PROCESSOR
    )


def test_saved_spread_keeps_the_gate_tolerance_and_compare_finds_it(tmp_path: Path):
    runs = [drifted_run(tmp_path / f"r{i}", s) for i, s in enumerate((-0.06, 0.0, 0.06))]
    folder = tmp_path / "baselines" / CLASS / PROCESSOR
    folder.mkdir(parents=True)
    (folder / "gate.json").write_text(json.dumps({"speed_tol": 0.3, "measured": "rounds"}))
    cli = CliRunner()
    keep = ["--save", "--baselines", str(tmp_path / "baselines")]
    out = cli.invoke(app, ["spread", *map(str, runs), *keep])
    assert out.exit_code == 0, out.output
    assert "beyond their own 95% intervals: 90 of 90 pairs" in out.output
    doc = json.loads((folder / "gate.json").read_text())
    assert doc["speed_tol"] == 0.3 and doc[GATE_KEY]["pairs"] == 90
    new = drifted_run(tmp_path / "new", 0.10)
    args = ["compare", str(runs[1]), str(new), "--baselines", str(tmp_path / "baselines")]
    found = cli.invoke(app, args)
    assert found.exit_code == 0 and "spread between runs measured on this processor" in found.output
    off = cli.invoke(app, [*args, "--no-between-runs"])
    assert off.exit_code == 0 and "faster" in off.output and "spread between" not in off.output
    # the A/B report judges with the same spread and says so
    html = write_report([runs[1], new], tmp_path / "ab.html", tmp_path / "baselines").read_text()
    assert "Verdicts and bands include the spread between runs" in html


def test_a_malformed_kept_spread_fails_compare_and_is_said_for_one_run(tmp_path: Path):
    folder = tmp_path / "baselines" / CLASS / PROCESSOR
    folder.mkdir(parents=True)
    (folder / "gate.json").write_text(json.dumps({GATE_KEY: {"halfwidth": 7}}))
    with pytest.raises(SpreadError, match=r"gate.json: between_runs.halfwidth must be in \[0, 1\)"):
        read_spread(folder)
    base = drifted_run(tmp_path / "base", 0.0)
    out = CliRunner().invoke(
        app, ["compare", str(base), str(base), "--baselines", str(tmp_path / "baselines")]
    )
    assert out.exit_code != 0 and "halfwidth must be in" in out.output
    # one run is still shown and reported, the line saying what is wrong with the file
    html = write_report([base], tmp_path / "one.html", tmp_path / "baselines").read_text()
    assert "The kept spread between runs is not readable" in html and "halfwidth must be in" in html


def test_one_run_says_what_is_known_of_the_spread_between_runs(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # show and the report read reports/baselines here
    run = drifted_run(tmp_path / "run", 0.0)
    cli = CliRunner()
    shown = cli.invoke(app, ["show", str(run)])
    assert shown.exit_code == 0, shown.output
    assert "how far another run on this machine reads beyond them is not measured" in shown.output
    runs = [run, drifted_run(tmp_path / "r2", 0.1)]
    assert cli.invoke(app, ["spread", *map(str, runs), "--save"]).exit_code == 0
    shown = cli.invoke(app, ["show", str(run)])
    assert "Between runs on this processor a speedup moves beyond its interval by" in " ".join(
        shown.output.split()
    )
    html = write_report([run], tmp_path / "one.html").read_text()
    assert "Between runs on this processor a speedup moves beyond its interval" in html
