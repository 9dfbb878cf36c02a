"""``kernelbench accuracy``: rows in the run schema that the run readers take, bad input as one
line with exit code 2."""

from __future__ import annotations

from typer.testing import CliRunner

from kernelbench.cli.commands import app
from kernelbench.core import ACCURACY_STUDY, BASELINE
from kernelbench.results.schema import load_results
from kernelbench.results.view import load_view

SMALL = ["--sizes", "768", "--seeds", "2", "--tokens", "64", "--error-rows", "16"]


def test_study_writes_run_rows_that_show_and_report_read(tmp_path):
    out = tmp_path / "acc"
    runner = CliRunner()
    res = runner.invoke(app, ["accuracy", *SMALL, "--error-cols", "32", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Table 1" in res.output and "model-level" in res.output
    df = load_results(out)
    study = {m for m, _ in ACCURACY_STUDY}
    assert set(df["method"]) == study | {BASELINE[1]}
    assert len(df) == 2 * (len(study) + 1) and df["seed"].nunique() == 2
    assert df["rel_error"].notna().all() and (df["rel_error"] > 0).all()
    assert df["median_ms"].isna().all()  # no timing
    # each row's baseline error is the 16-bit row's of the same seed
    base = df[df["method"] == BASELINE[1]].set_index("seed")["rel_error"]
    assert (df["baseline_rel_error"] == df["seed"].map(base)).all()
    # the planted outliers (App. C, 125M: up to 40) hurt per-tensor absmax far more than
    # LLM.int8(), which keeps them in 16-bit
    err = df.groupby("method")["rel_error"].max()
    assert err["absmax_torch"] > 5 * err["llm_int8"]
    view = load_view(out)  # the seeds pool into one row per key: the largest error
    pooled = view.set_index("method")["rel_error"]
    assert pooled["llm_int8"] == df[df["method"] == "llm_int8"]["rel_error"].max()
    assert runner.invoke(app, ["show", str(out)]).exit_code == 0
    report = tmp_path / "r.html"
    assert runner.invoke(app, ["report", str(out), "-o", str(report)]).exit_code == 0
    assert report.stat().st_size > 0


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    runner = CliRunner()
    for args, words in (
        (["--sizes", "999"], "no model dimension 999"),
        (["--methods", "int8,nope"], "unknown method(s) int8, nope"),
        (["--dist", "laplace"], "unknown distribution 'laplace'"),
    ):
        res = runner.invoke(app, ["accuracy", *args, "--out", str(tmp_path / "x")])
        assert res.exit_code == 2, res.output
        assert words in res.output and "Traceback" not in res.output
