"""The harness pipeline: cases, inputs, timer, rows, resume, failures, the CLI."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kernelbench.backends import all_backends
from kernelbench.backends.base import Availability, Backend
from kernelbench.checks import InputError
from kernelbench.cli import app
from kernelbench.kernels import cpu_ext
from kernelbench.measure.engine import TimerSettings
from kernelbench.quant import outlier_columns
from kernelbench.results.schema import (
    KEY_COLUMNS,
    ResultsWriter,
    SkippedLinesWarning,
    load_results,
    read_rows,
)
from kernelbench.run.cases import load_activation_file, load_case, make_inputs, outlier_activations
from kernelbench.run.cell import measure_cell
from kernelbench.run.executors import get_executor
from kernelbench.run.plan import RunOptions, method_pairs, plan
from kernelbench.statistics import stats

TINY_TIMER = TimerSettings(budget_s=0.02, warmup_s=0.0, min_samples=1)
STAGE_TIMER = TimerSettings(budget_s=0.01, warmup_s=0.0, min_samples=1)


def tiny_opts(**kw) -> RunOptions:
    base = dict(
        sizes=(768,),
        tokens=(8,),
        backends=("torch", "custom"),
        methods=("fp32", "fp16", "int8_raw", "llm_int8"),
        device="cpu",
        timer=TINY_TIMER,
        stage_timer=STAGE_TIMER,
        error_rows=8,
        rounds=1,
        extra_rounds=0,
    )
    base.update(kw)
    return RunOptions(**base)


# --- cases and inputs ---------------------------------------------------------------------------


def test_gpt3_case_matches_the_paper_table():
    case = load_case("gpt3")
    assert [s.d_model for s in case.sizes] == [768, 1024, 1536, 2048, 2560, 4096, 5140, 12288]
    assert case.shape("ffn1", 4096) == (4096, 16384)
    assert case.shape("ffn2", 768) == (3072, 768)
    assert case.paper_figure("llm_int8", 12288, "ffn1", 2048) == 1.81
    assert case.paper_figure("llm_int8", 12288, "ffn1", 16) is None  # not the paper's cell
    with pytest.raises(InputError, match="no model dimension 999"):
        case.size(999)
    with pytest.raises(InputError, match="unknown layer"):
        case.shape("ffn3", 768)


def test_outlier_distribution_follows_app_c_statistics():
    case = load_case("gpt3")
    stats_13b = case.outlier_stats["FSEQ-13B"]
    gen = torch.Generator().manual_seed(0)
    x, dims = outlier_activations(gen, 4096, 512, stats_13b)
    assert dims.numel() == 7
    # regular dims stay within [-3.5, 3.5]; outlier dims reach the table's magnitudes
    regular = torch.ones(512, dtype=torch.bool)
    regular[dims] = False
    assert float(x[:, regular].abs().max()) <= 3.5
    found = outlier_columns(x, 6.0, ">")
    assert set(found.tolist()) == set(dims.tolist())
    # one-sided dims: the first 6 keep the quartiles' (negative) sign on affected positions
    col = x[:, dims[0]]
    affected = col.abs() > 3.5
    share = float(affected.float().mean())
    assert 0.65 < share < 0.80  # 73% of positions
    q = torch.quantile(col[affected].double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    assert torch.allclose(q, torch.tensor([-63.0, -58.0, -45.0], dtype=torch.float64), atol=2.5)


def test_inputs_are_seeded_fresh_and_never_zero():
    case = load_case("gpt3")
    size = case.size(768)
    a = make_inputs(case, size, "ffn1", 16, "outliers", torch.bfloat16, torch.device("cpu"))
    b = make_inputs(case, size, "ffn1", 16, "outliers", torch.bfloat16, torch.device("cpu"))
    c = make_inputs(case, size, "ffn1", 32, "outliers", torch.bfloat16, torch.device("cpu"))
    assert torch.equal(a.x, b.x) and a.seed == b.seed
    # every token count of a layer: the same weights, the first rows of the same activations
    assert a.seed == c.seed and torch.equal(a.weight, c.weight) and torch.equal(a.x, c.x[:16])
    other = make_inputs(case, size, "ffn2", 16, "outliers", torch.bfloat16, torch.device("cpu"))
    assert other.seed != a.seed
    # more tokens than the calibration batch: a larger batch with the same first rows, weights
    big = make_inputs(case, size, "ffn1", 2050, "outliers", torch.bfloat16, torch.device("cpu"))
    assert torch.equal(big.x[:32], c.x) and torch.equal(big.weight, a.weight)
    assert a.x.abs().sum() > 0 and a.weight.abs().sum() > 0
    paper = make_inputs(case, size, "ffn1", 16, "paper-bench", torch.bfloat16, torch.device("cpu"))
    assert (paper.x == 8.0).all(dim=0).sum() == 5


class _Evil:
    def __reduce__(self):
        return (open, ("pwned", "w"))


def test_activation_files_are_data_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arr = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "a.npy", arr)
    assert load_activation_file(tmp_path / "a.npy").shape == (4, 8)
    torch.save(torch.from_numpy(arr).reshape(2, 2, 8), tmp_path / "a.pt")
    assert load_activation_file(tmp_path / "a.pt").shape == (4, 8)
    # a pickled object array must be refused, not unpickled
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        load_activation_file(tmp_path / "obj.npy")
    (tmp_path / "evil.pt").write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(InputError, match="not a torch tensor file"):  # never unpickled
        load_activation_file(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()
    torch.save({"not": "a tensor"}, tmp_path / "dict.pt")
    with pytest.raises(InputError, match="one tensor"):
        load_activation_file(tmp_path / "dict.pt")
    np.save(tmp_path / "nan.npy", np.full((2, 8), np.nan, dtype=np.float32))
    with pytest.raises(InputError, match="NaN"):
        load_activation_file(tmp_path / "nan.npy")
    with pytest.raises(InputError, match=".pt or .npy"):
        load_activation_file(tmp_path / "x.csv") if (tmp_path / "x.csv").write_text("1") else None


# --- the pipeline ------------------------------------------------------------------------------


def test_measure_cell_rows_have_baselines_errors_and_memory():
    case = load_case("gpt3")
    opts = tiny_opts()
    (item,) = plan(case, opts)
    from kernelbench.run.plan import CallEstimator

    rows = list(measure_cell(item, case, opts, CallEstimator()))
    assert [(r.backend, r.method) for r in rows[:2]] == [("torch", "fp16"), ("torch", "fp32")]
    by = {(r.backend, r.method): r for r in rows}
    for key in (("custom", "int8_raw"), ("custom", "llm_int8"), ("torch", "llm_int8")):
        r = by[key]
        assert r.status == "ok", r.reason
        assert r.speedup > 0 and r.baseline_ms > 0  # median of paired ratios (checked below)
        assert r.samples >= 1 and len(r.raw_ms) == r.samples
        assert r.weight_bytes < r.weight_bytes_16bit
    assert by[("custom", "int8_raw")].rel_error == 0.0  # exact integer product
    assert by[("custom", "llm_int8")].outlier_cols == 2  # FSEQ-125M plants two outlier dims
    assert by[("custom", "llm_int8")].rel_error < 0.05
    assert by[("custom", "llm_int8")].baseline_rel_error == by[("torch", "fp16")].rel_error
    assert set(by[("custom", "llm_int8")].stages_ms) >= {"quantize", "int8_matmul", "dequantize"}
    # paired timing: every row but the baseline alternated with it; its speedup is the median
    # of the pairs' ratios, with a 95% interval around it
    assert not by[("torch", "fp16")].paired and by[("torch", "fp16")].speedup == 1.0
    r = by[("custom", "llm_int8")]
    assert r.paired and len(r.baseline_raw_ms) == len(r.raw_ms) == r.samples >= 1
    assert r.baseline_ms == pytest.approx(stats(r.baseline_raw_ms).median_ms)
    ratios = [b / t for b, t in zip(r.baseline_raw_ms, r.raw_ms, strict=True)]
    assert r.speedup == r.paired_speedup == pytest.approx(stats(ratios).median_ms)
    if r.samples >= 2:
        assert r.speedup_lo <= r.speedup <= r.speedup_hi
    assert r.flops == 2.0 * r.m * r.k * r.n and r.bytes > 0
    assert r.planted_outlier_cols == 2 and r.round == 0


@pytest.mark.skipif(not cpu_ext.available(), reason="the CPU extension is not built")
def test_cold_cpu_rows_flush_at_least_their_weights_and_hot_rows_nothing():
    """A last-level cache that resists scans keeps a weight the scan meant to evict: a cold
    row also flushes the tensors its call reads, and records how many bytes those were."""
    case = load_case("gpt3")
    from kernelbench.run.plan import CallEstimator

    for cache in ("cold", "hot"):
        opts = tiny_opts(cache=cache, methods=("fp16", "int8_raw", "llm_int8"))
        (item,) = plan(case, opts)
        rows = [r for r in measure_cell(item, case, opts, CallEstimator()) if r.status == "ok"]
        assert len(rows) == 5
        for r in rows:
            if cache == "hot":
                assert r.evicted_bytes is None
            else:  # the weights, at least (and the activations, scales, bias)
                assert r.evicted_bytes >= r.weight_bytes > 0, (r.backend, r.method)


def test_the_int8_gemm_stage_time_goes_only_to_rows_with_that_stage():
    """A backend's ``int8_raw`` GEMM time is reused for its other rows' ``int8_matmul`` stage,
    never added to a row that has no such stage (fp8: one scaled fp8 GEMM)."""
    case = load_case("gpt3")
    opts = tiny_opts(backends=("torch",), methods=("fp16", "int8_raw", "fp8_e4m3", "llm_int8"))
    (item,) = plan(case, opts)
    from kernelbench.run.plan import CallEstimator

    by = {(r.backend, r.method): r for r in measure_cell(item, case, opts, CallEstimator())}
    fp8 = by[("torch", "fp8_e4m3")]
    assert fp8.status == "ok", fp8.reason
    assert set(fp8.stages_ms) == {"quantize"}
    assert "int8_matmul" in by[("torch", "llm_int8")].stages_ms


class _ExplodingBackend(Backend):
    name = "exploding"
    methods = ("int8_raw",)

    def availability(self, device):
        return Availability.yes()

    def runner(self, *a, **kw):
        raise RuntimeError("kernel launch failed <boom>")


def test_a_failing_backend_is_a_failed_row_and_the_sweep_goes_on(monkeypatch, tmp_path):
    backends = dict(all_backends())
    backends["exploding"] = _ExplodingBackend()
    monkeypatch.setattr("kernelbench.run.cell.all_backends", lambda: backends)
    monkeypatch.setattr("kernelbench.run.plan.all_backends", lambda: backends)
    case = load_case("gpt3")
    opts = tiny_opts(backends=("exploding", "torch"), methods=("fp16", "int8_raw"))
    writer = ResultsWriter(tmp_path)
    for _, row in get_executor("local").run(plan(case, opts), case, opts, set()):
        writer.append(row)
    rows = {(r["backend"], r["method"]): r for r in read_rows(writer.path)}
    assert rows[("exploding", "int8_raw")]["status"] == "failed"
    assert "kernel launch failed" in rows[("exploding", "int8_raw")]["reason"]
    assert rows[("torch", "int8_raw")]["status"] == "ok"
    assert rows[("exploding", "fp16")]["status"] == "skipped"


class _FlakyBackend(Backend):
    """Its runner builds and its first call works; its calls in the cycles then raise."""

    name = "flaky"
    methods = ("int8_raw",)

    def availability(self, device):
        return Availability.yes()

    def runner(self, method, x, w, bias, cfg, **kw):
        runner = all_backends()["torch"].runner(method, x, w, bias, cfg, **kw)
        calls = iter(range(1))

        def run():
            if next(calls, None) is None:
                raise RuntimeError("lost the device <mid-run>")
            return runner.run()

        return type(runner)(
            run=run, returns_int32=True, operands=runner.operands, weight_bytes=runner.weight_bytes
        )


def test_a_row_failing_in_the_cycles_is_failed_and_its_cell_goes_on(monkeypatch):
    backends = dict(all_backends())
    backends["flaky"] = _FlakyBackend()
    monkeypatch.setattr("kernelbench.run.cell.all_backends", lambda: backends)
    monkeypatch.setattr("kernelbench.run.plan.all_backends", lambda: backends)
    case = load_case("gpt3")
    opts = tiny_opts(backends=("torch", "flaky"), methods=("fp16", "int8_raw"))
    (item,) = plan(case, opts)
    from kernelbench.run.plan import CallEstimator

    by = {(r.backend, r.method): r for r in measure_cell(item, case, opts, CallEstimator())}
    assert by[("flaky", "int8_raw")].status == "failed"
    assert "lost the device" in by[("flaky", "int8_raw")].reason
    assert by[("torch", "int8_raw")].status == "ok" and by[("torch", "int8_raw")].paired
    assert by[("torch", "fp16")].status == "ok"


def test_later_rounds_skip_the_first_call_of_a_long_row_only(monkeypatch):
    from kernelbench.run import cell as harness

    case = load_case("gpt3")
    opts = tiny_opts(methods=("fp16", "int8_raw"), backends=("torch",), rounds=2)
    first, later = plan(case, opts)
    estimator = harness.CallEstimator()
    list(measure_cell(first, case, opts, estimator))
    seen = []
    real = harness.MeasurementEngine.first_call
    monkeypatch.setattr(
        harness.MeasurementEngine,
        "first_call",
        lambda self, call: (seen.append(call), real(self, call))[1],
    )
    list(measure_cell(later, case, opts, estimator))
    assert len(seen) == 2  # calls of milliseconds: each gets its first call
    seen.clear()
    monkeypatch.setattr(harness, "LONG_CALL_S", 0.0)  # as if every call took long
    rows = list(measure_cell(later, case, opts, estimator))
    assert seen == [] and all(r.status == "ok" and r.samples >= 1 for r in rows)
    assert all(r.rel_error is None for r in rows)  # accuracy is round 0's


def test_resume_skips_measured_rows_and_keeps_order(tmp_path):
    case = load_case("gpt3")
    opts = tiny_opts(methods=("fp16", "int8_raw"))
    writer = ResultsWriter(tmp_path)
    first = list(get_executor("local").run(plan(case, opts), case, opts, set()))
    for _, row in first[:2]:
        writer.append(row)
    done = writer.done_keys()
    assert len(done) == 2
    rest = [row for _, row in get_executor("local").run(plan(case, opts), case, opts, done)]
    assert {(r.key(), r.round) for r in rest}.isdisjoint(done)
    assert len(rest) == len(first) - 2


def test_torn_last_line_is_ignored_and_bad_schema_refused(tmp_path):
    case = load_case("gpt3")
    opts = tiny_opts(methods=("fp16",), backends=("torch",))
    writer = ResultsWriter(tmp_path)
    for _, row in get_executor("local").run(plan(case, opts), case, opts, set()):
        writer.append(row)
    with writer.path.open("a") as fh:
        fh.write('{"schema_version": 1, "case": "gpt')  # a write cut off by ^C
    with pytest.warns(SkippedLinesWarning, match="the last line is cut off"):
        df = load_results(tmp_path)
    assert len(df) == 1 and set(KEY_COLUMNS) <= set(df.columns)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.jsonl").write_text(json.dumps({"schema_version": 99}) + "\n")
    from kernelbench.results.schema import SchemaError

    with pytest.raises(SchemaError, match="schema_version"):
        load_results(bad)


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown backend"):
        method_pairs(tiny_opts(backends=("nope",)))
    with pytest.raises(ValueError, match="unknown method"):
        method_pairs(tiny_opts(methods=("fp8",)))
    with pytest.raises(ValueError, match="unknown executor"):
        get_executor("slurm")


def test_cli_run_show_and_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # read by OpenMP at start: nothing changes
    runner = CliRunner()
    out = tmp_path / "run"
    args = [
        "run",
        "--sizes",
        "768",
        "--tokens",
        "8",
        "--backends",
        "torch,custom",
        "--methods",
        "fp16,llm_int8",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--budget",
        "0.02",
        "--rounds",
        "1",
        "--extra-rounds",
        "0",
        "--no-report",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Speedup over 16-bit" in result.output
    env = json.loads((out / "env.json").read_text())
    assert env["device_class"].startswith("cpu-") and env["torch"] == torch.__version__
    assert env["rounds"] == 1 and env["ci_target"] == 0.05
    assert env["extra_share"] == 0.2 and env["settings"]["extra_share"] == 0.2
    assert env["extra_round_budget_s"] == 0.0  # no extra rounds asked for
    assert env["environment"]["OMP_WAIT_POLICY"] == "PASSIVE"
    n_rows = len(read_rows(out / "results.jsonl"))
    assert n_rows == 4
    from kernelbench.run.executors import LocalExecutor

    learnt: list[int] = []
    monkeypatch.setattr(LocalExecutor, "learn", lambda self, rows: learnt.append(len(rows)))
    again = runner.invoke(app, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert len(read_rows(out / "results.jsonl")) == n_rows  # nothing measured twice
    assert learnt == [n_rows]  # the estimates start from the rows written before
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "llm_int8" in shown.output
    bad = runner.invoke(app, ["run", "--sizes", "999", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "no model dimension 999" in bad.output


def test_resume_retries_rows_skipped_over_budget(tmp_path, row_factory):
    writer = ResultsWriter(tmp_path)
    writer.append(row_factory("fp16", "torch"))
    over = dict(skip_kind="over_budget", reason="99 s")
    writer.append(row_factory("int8_raw", "torch", status="skipped", **over))
    # a row written without a kind: kept, as its reason does not say "over budget"
    kindless = dict(skip_kind=None, reason="same computation")
    writer.append(row_factory("vectorwise", "torch", status="skipped", **kindless))
    writer.append(row_factory("llm_int8", "torch", status="failed", reason="boom"))
    assert {k[5] for k, _round in writer.done_keys()} == {"fp16", "vectorwise"}


def test_git_commit_is_the_package_checkouts_or_none(tmp_path, monkeypatch):
    import subprocess

    from kernelbench.run.env import git_commit

    monkeypatch.delenv("KERNELBENCH_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    (repo / "kernelbench").mkdir(parents=True)
    (repo / "site" / "kernelbench").mkdir(parents=True)
    (repo / "kernelbench" / "__init__.py").write_text("")

    def git(*args: str) -> str:
        env = {
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin:/usr/local/bin",
        }
        done = subprocess.run(
            ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    head = git("rev-parse", "HEAD")
    assert git_commit(repo / "kernelbench") == head  # a source checkout
    # installed inside some other repository (a pyenv tree): not that repository's commit
    assert git_commit(repo / "site" / "kernelbench") is None
    assert git_commit(tmp_path) is None  # no repository at all
    monkeypatch.setenv("KERNELBENCH_GIT_COMMIT", "abc123")
    assert git_commit(repo / "site" / "kernelbench") == "abc123"


@pytest.mark.parametrize("block_rows", [16, 32, 1024])
@pytest.mark.parametrize(
    "n, k", [(37, 21), (1025, 7), (17, 1), (33, 3), (49, 1), (5, 3), (1040, 15)]
)
def test_a_weight_drawn_in_blocks_is_the_one_draw_weight(monkeypatch, block_rows, n, k):
    """The layer's weight is drawn a block of rows at a time (no full-size float32 copy) and
    must be exactly ``torch.randn(n, k)`` of the same generator, scaled and cast, and leave the
    generator where one draw leaves it (the bias is drawn next)."""
    from kernelbench.run import cases

    monkeypatch.setattr(cases, "WEIGHT_BLOCK_ROWS", block_rows)
    one = torch.Generator().manual_seed(3)
    want = torch.randn(n, k, generator=one).div_(k**0.5).to(torch.bfloat16)
    blocks = torch.Generator().manual_seed(3)
    got = cases._normal_weight(n, k, blocks, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert torch.equal(torch.randn(4, generator=blocks), torch.randn(4, generator=one))


def test_env_json_records_the_variables_that_change_what_is_measured():
    from kernelbench.run.env import measured_environment

    environ = {
        "OMP_NUM_THREADS": "2",
        "LD_PRELOAD": "/usr/lib/libjemalloc.so.2",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "CUDA_LAUNCH_BLOCKING": "1",
        "KERNELBENCH_CACHE": "/tmp/peaks",  # env.json records the peaks it read
        "HOME": "/root",
        "PATH": "/usr/bin",
        "API_TOKEN": "secret",
    }
    recorded = measured_environment(environ)
    assert set(recorded) == {
        "OMP_NUM_THREADS",
        "LD_PRELOAD",
        "GLIBC_TUNABLES",
        "ONEDNN_MAX_CPU_ISA",
        "CUDA_LAUNCH_BLOCKING",
    }
    assert recorded["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
