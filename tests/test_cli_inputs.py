"""Every bad input through the CLI: one line, exit 2, no traceback, earlier results untouched.

Runs that get this far stop before they measure anything, so these tests take no timing; the
previous run in ``--out`` is synthetic rows written with :class:`ResultsWriter`.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.results.compare import Comparison, RowComparison, render
from kernelbench.results.schema import ENV_FILE, RESULTS_FILE, SETTINGS_KEY, ResultsWriter

runner = CliRunner()
TINY = ["--sizes", "768", "--tokens", "8", "--backends", "torch", "--methods", "fp16"]
TINY += ["--device", "cpu", "--no-report"]


@pytest.fixture
def previous(tmp_path: Path, row_factory) -> Path:
    """A run directory holding an earlier run (rows and env.json with its settings)."""
    out = tmp_path / "run"
    writer = ResultsWriter(out)
    writer.append(row_factory("fp16", "torch"))
    reason = "does [/] not [cpu] apply"
    writer.append(row_factory("int8_raw", "torch", status="skipped", reason=reason))
    settings = {"alpha": 6.0, "dist": None, "outlier_cmp": ">"}
    (out / ENV_FILE).write_text(json.dumps({"schema_version": 2, SETTINGS_KEY: settings}))
    return out


def snapshot(out: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    siblings = sorted(p.name for p in out.parent.iterdir())
    return {"files": files, "siblings": siblings}  # type: ignore[dict-item]


def assert_refused(result, *needles: str) -> None:
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert text.startswith("error: "), text
    for needle in needles:
        assert needle in text, text


def assert_unusable(result, needle: str) -> None:
    """compare's answer to unusable input: one line on stderr saying so, nothing on stdout
    (text format), exit 2."""
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unusable input: "), result.stderr
    assert needle in lines[0], result.stderr


def activation_files(d: Path) -> dict[str, Path]:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    files = {name: d / name for name in ("pickled.pt", "rawpickle.pt", "garbage.pt", "huge.npy")}
    torch.save({"x": Evil()}, files["pickled.pt"])
    files["rawpickle.pt"].write_bytes(pickle.dumps(Evil()))
    files["garbage.pt"].write_bytes(b"not a tensor file" * 8)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 768)}
    )
    files["huge.npy"].write_bytes(header.getvalue() + b"\0" * 64)
    files["objects.npy"] = d / "objects.npy"
    np.save(files["objects.npy"], np.array([{"a": 1}], dtype=object), allow_pickle=True)
    files["wrong_d.npy"] = d / "wrong_d.npy"
    np.save(files["wrong_d.npy"], np.ones((16, 5), dtype=np.float32))
    return files


RANGE_CASES = [
    (["--tokens", "0"], "--tokens"),
    (["--tokens", "-5"], "--tokens"),
    (["--tokens", "8,x"], "--tokens"),
    (["--sizes", "0"], "--sizes"),
    (["--budget", "-1"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--max-call", "-1"], "--max-call"),
    (["--max-call", "0"], "--max-call"),
    (["--error-rows", "-3"], "--error-rows"),
    (["--error-rows", "0"], "--error-rows"),
    (["--threads", "-1"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--rounds", "0"], "--rounds"),
    (["--extra-rounds", "-1"], "--extra-rounds"),
    (["--extra-share", "-0.1"], "--extra-share"),
    (["--ci-target", "0"], "--ci-target"),
    (["--alpha", "-1"], "--alpha"),
    (["--alpha", "nan"], "--alpha"),
    (["--dist", "nosuch"], "--dist"),
    (["--outlier-cmp", "<"], "--outlier-cmp"),
    (["--profile", "nosuch"], "--profile"),
    (["--quick", "--profile", "full"], "--quick"),
    (["--layer", "nosuch"], "unknown layer"),
    (["--backends", "nosuch"], "unknown backend"),
    (["--device", "tpu"], "--device"),
    (["--sizes", "999"], "no model dimension 999"),
    (["--executor", "slurm"], "unknown executor"),
]


@pytest.mark.parametrize(("args", "needle"), RANGE_CASES, ids=[" ".join(a) for a, _ in RANGE_CASES])
def test_bad_options_are_refused_before_out_is_touched(previous: Path, args, needle):
    before = snapshot(previous)
    result = runner.invoke(app, ["run", *TINY, *args, "--out", str(previous)])
    assert_refused(result, needle)
    assert snapshot(previous) == before


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("pickled.pt", "pickled Python objects"),
        ("rawpickle.pt", "not a torch tensor file"),
        ("garbage.pt", "not a torch tensor file"),
        ("huge.npy", "header claims shape"),
        ("objects.npy", "Python objects"),
        ("wrong_d.npy", "needs 768"),
        ("missing.npy", "does not exist"),
    ],
)
def test_bad_activation_files_are_refused_before_out_is_touched(
    previous: Path, tmp_path: Path, name: str, needle: str
):
    files = activation_files(tmp_path)
    before = snapshot(previous)
    path = files.get(name, tmp_path / name)
    result = runner.invoke(app, ["run", *TINY, "--activations", str(path), "--out", str(previous)])
    assert_refused(result, needle)
    assert "weights_only" not in result.output
    assert snapshot(previous) == before


def test_out_that_is_a_file_or_read_only_is_refused(previous: Path, tmp_path: Path):
    a_file = tmp_path / "file"
    a_file.write_text("keep me")
    assert_refused(runner.invoke(app, ["run", *TINY, "--out", str(a_file)]), "is a file")
    assert a_file.read_text() == "keep me"
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    before = snapshot(previous)
    previous.chmod(0o555)
    try:
        result = runner.invoke(app, ["run", *TINY, "--out", str(previous)])
    finally:
        previous.chmod(0o755)
    assert_refused(result, "not writable")
    assert snapshot(previous) == before


def test_resume_with_other_settings_names_the_setting(previous: Path):
    before = snapshot(previous)
    result = runner.invoke(app, ["run", *TINY, "--resume", "--alpha", "5", "--out", str(previous)])
    assert_refused(result, "alpha", "6.0", "5.0")
    result = runner.invoke(
        app, ["run", *TINY, "--resume", "--dist", "gaussian", "--out", str(previous)]
    )
    assert_refused(result, "dist")
    (previous / ENV_FILE).write_text("{garbage")
    before = snapshot(previous)
    assert_refused(runner.invoke(app, ["run", *TINY, "--resume", "--out", str(previous)]), "JSON")
    assert snapshot(previous) == before


def test_readers_refuse_unusable_runs_in_one_line(previous: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_refused(runner.invoke(app, ["report", str(empty)]), "no such file")
    assert_refused(runner.invoke(app, ["show", str(empty)]), "no such file")
    (previous / ENV_FILE).write_text("{garbage")
    assert_refused(runner.invoke(app, ["report", str(previous)]), "env.json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / RESULTS_FILE).write_text(json.dumps({"schema_version": 2, "case": "gpt3"}) + "\n")
    assert_refused(runner.invoke(app, ["show", str(broken)]), "missing fields")
    result = runner.invoke(app, ["merge", str(tmp_path / "m"), str(broken), str(broken)])
    assert_refused(result, "missing fields")
    assert_unusable(runner.invoke(app, ["compare", str(broken), str(broken)]), "missing fields")


def test_bad_lines_are_skipped_with_their_line_numbers(previous: Path):
    with (previous / RESULTS_FILE).open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"schema_version": 2, "case": "gpt3"}) + "\n")
    (previous / ENV_FILE).unlink()
    result = runner.invoke(app, ["show", str(previous)])
    assert result.exit_code == 0, result.output
    warning = [ln for ln in result.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "line 3 (not JSON" in warning[0], result.output
    assert "line 4 (missing fields" in warning[0]
    # a gate does not forgive: the same file is unusable input for compare
    assert_unusable(runner.invoke(app, ["compare", str(previous), str(previous)]), "line 3")


def test_data_is_not_read_as_markup_or_html(previous: Path):
    result = runner.invoke(app, ["show", str(previous)])
    assert result.exit_code == 0, result.output
    assert "[cpu]" in result.output and "[/]" in result.output
    evil = "<img src=x onerror=alert(1)>"
    cmp = Comparison("a", "b", 0.1, 0.0)
    cmp.rows.append(RowComparison(("k",), f"torch/{evil}", "failed", detail=evil))
    md = render(cmp, "markdown")
    assert "<img" not in md and "&lt;img" in md


def test_an_earlier_run_is_moved_aside_not_deleted(previous: Path, monkeypatch):
    from kernelbench.results import schema as results

    old = (previous / RESULTS_FILE).read_bytes()
    moved = results.move_aside(previous)
    assert not previous.exists() and (moved / RESULTS_FILE).read_bytes() == old
    assert moved.parent == previous.parent and moved.name.startswith("run.")


def test_help_is_light_and_plain():
    import subprocess
    import sys

    code = "import sys, kernelbench.cli; print('torch' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    from kernelbench.cli import commands as cli
    from kernelbench.run import cases

    assert cli.DISTRIBUTIONS == cases.DISTRIBUTIONS
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    flags = [ln for ln in result.output.splitlines() if "<bool>" in ln and "--help" not in ln]
    assert not flags, flags  # (typer draws its own --help that way)
    text = " ".join(result.output.replace("│", " ").split())
    assert "moved aside" in text and "quick: 0.3" in text, text


def test_an_installed_package_reports_the_commit_it_was_built_from(tmp_path: Path, monkeypatch):
    from kernelbench.run.env import BUILD_COMMIT_FILE, git_commit

    monkeypatch.delenv("KERNELBENCH_GIT_COMMIT", raising=False)
    package = tmp_path / "site-packages" / "kernelbench"
    package.mkdir(parents=True)
    assert git_commit(package) is None  # no checkout, no record
    commit = "0123456789abcdef0123456789abcdef01234567"
    (package / BUILD_COMMIT_FILE).write_text(commit + "-dirty\n")
    assert git_commit(package) == commit + "-dirty"
    (package / BUILD_COMMIT_FILE).write_text("\n")  # built from an sdist: unknown
    assert git_commit(package) is None


def test_explicit_flags_win_over_a_profile():
    from kernelbench.run.profiles import resolve

    quick = resolve("quick")
    assert quick.rounds == 1 and quick.error_rows == 256 and quick.sizes == (768, 1024, 2048)
    mine = resolve("quick", error_rows=512, rounds=3, sizes=(4096,))
    assert mine.error_rows == 512 and mine.rounds == 3 and mine.sizes == (4096,)
    assert mine.budget_s == quick.budget_s  # what was not given comes from the profile
    assert resolve("default").rounds == 3


def test_compare_with_a_missing_run_says_so_on_stderr(previous: Path, tmp_path: Path):
    result = runner.invoke(app, ["compare", str(previous), str(tmp_path / "nonexistent")])
    assert_unusable(result, "nonexistent")
    as_json = runner.invoke(
        app, ["compare", str(previous), str(tmp_path / "nonexistent"), "--format", "json"]
    )
    assert as_json.exit_code == 2 and "unusable input" in as_json.stderr
    assert json.loads(as_json.stdout)["exit_code"] == 2


@pytest.mark.parametrize("place", ["/proc", "/sys"])
def test_out_where_no_file_can_be_made_is_refused(place: str):
    """Checked by making a probe file there: ``os.access`` says yes to root in /proc."""
    if not Path(place).is_dir():
        pytest.skip(f"no {place} here")
    result = runner.invoke(app, ["run", *TINY, "--out", f"{place}/kb-h32-x"])
    assert_refused(result, f"{place}/kb-h32-x", "cannot be created")
    assert not Path(place, "kb-h32-x").exists()


def test_writable_out_leaves_no_probe_file(tmp_path: Path):
    from kernelbench.results.schema import check_out_dir

    check_out_dir(tmp_path / "new" / "run", move_old=True)
    check_out_dir(tmp_path, move_old=True)
    assert list(tmp_path.iterdir()) == []


def test_activations_with_another_suffix_name_the_file(previous: Path):
    result = runner.invoke(
        app, ["run", *TINY, "--activations", "/etc/passwd", "--out", str(previous)]
    )
    assert_refused(result, "/etc/passwd", ".pt or .npy", "no suffix")


@pytest.mark.parametrize(
    "flag,value,name",
    [
        ("--tokens", "16", "tokens"),
        ("--sizes", "1024", "sizes"),
        ("--layer", "attn_qkv", "layer"),
        ("--backends", "custom", "backends"),
        ("--methods", "fp32", "methods"),
    ],
)
def test_resume_refuses_another_sweep_definition(previous: Path, flag: str, value: str, name):
    env = json.loads((previous / ENV_FILE).read_text())
    env[SETTINGS_KEY].update(
        tokens=[8], sizes=[768], layer=None, backends=["torch"], methods=["fp16"]
    )
    (previous / ENV_FILE).write_text(json.dumps(env))
    before = snapshot(previous)
    args = list(TINY)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    result = runner.invoke(app, ["run", *args, "--resume", "--out", str(previous)])
    assert_refused(result, f"{name}:")
    assert snapshot(previous) == before
