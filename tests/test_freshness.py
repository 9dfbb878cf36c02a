"""Outputs computed in the timed call: the activations are redrawn in place between calls and
a later output must follow them. Two backends that compute at build time (one keeps its whole
output, one its activations' quantization) pass every other contract and are caught by both
``kernelbench check-backend`` and the sweep."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kernelbench.backends import add_backend_files, all_backends, freshness, plugins
from kernelbench.backends.contract import run_contract
from kernelbench.cli import app
from kernelbench.measure.engine import TimerSettings
from kernelbench.run.cases import load_case
from kernelbench.run.cell import measure_cell
from kernelbench.run.plan import CallEstimator, RunOptions, plan


def tiny_opts(**kw) -> RunOptions:
    base = dict(
        sizes=(768,),
        tokens=(8,),
        device="cpu",
        timer=TimerSettings(budget_s=0.02, warmup_s=0.0, min_samples=1),
        stage_timer=TimerSettings(budget_s=0.01, warmup_s=0.0, min_samples=1),
        error_rows=8,
        rounds=1,
        extra_rounds=0,
    )
    return RunOptions(**(base | kw))


CACHED_OUTPUT = """
from kernelbench.api import Availability, Backend, Runner


class CachedOutput(Backend):
    \"\"\"The reference stages, but the output is computed once, when the runner is built.\"\"\"

    name = "cached_output"
    api_version = 1
    methods = ("vectorwise", "llm_int8")

    def availability(self, device):
        return Availability.yes()

    def runner(self, method, x, weight, bias, cfg, kept_rows=None):
        honest = super().runner(method, x, weight, bias, cfg, kept_rows)
        y = honest.run()
        return Runner(run=lambda: y.clone(), weight_bytes=honest.weight_bytes,
                      outlier_cols=honest.outlier_cols)


BACKEND = CachedOutput()
"""

BUILD_TIME_QUANTIZE = """
from kernelbench.api import Availability, Backend, Runner
from kernelbench.backends.base import method_config
from kernelbench.checks import check_activation


class BuildTimeQuantize(Backend):
    \"\"\"Quantizes its activations when built; each call only multiplies and dequantizes.\"\"\"

    name = "build_time_quantize"
    api_version = 1
    methods = ("vectorwise", "llm_int8")

    def availability(self, device):
        return Availability.yes()

    def runner(self, method, x, weight, bias, cfg, kept_rows=None):
        check_activation(x, weight)
        mcfg = method_config(method, cfg)
        rows = kept_rows if method == "llm_int8" else None
        pw = self.prepare_weight(weight, bias, mcfg, rows)
        qa = self.quantize(x, pw, mcfg)

        def run():
            acc = self.int8_matmul(qa.int8, pw)
            return self.dequantize(acc, qa, pw, self.outlier_product(qa, pw))

        return Runner(run=run, weight_bytes=pw.nbytes, outlier_cols=int(qa.outlier_cols.numel()))


BACKEND = BuildTimeQuantize()
"""

CHEATERS = {"cached_output": CACHED_OUTPUT, "build_time_quantize": BUILD_TIME_QUANTIZE}


def cheater_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(CHEATERS[name]))
    return path


def load_unguarded(tmp_path: Path, name: str):
    """The backend as the sweep would see a built-in one: no contract guard around it."""
    spec = importlib.util.spec_from_file_location(f"kb_test_{name}", cheater_file(tmp_path, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BACKEND


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.setenv(plugins.BACKEND_FILES_ENV, "")
    monkeypatch.setattr(plugins, "_origins", {})
    all_backends.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    all_backends.cache_clear()
    for name in [m for m in sys.modules if m.startswith("kernelbench_user_")]:
        sys.modules.pop(name)


# --- the redraw and the spot check ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_redraw_keeps_magnitudes_and_changes_values(dtype):
    gen = torch.Generator().manual_seed(1)
    for m, k in ((1, 1), (1, 7), (5, 3), (64, 96)):
        t = (torch.randn(m, k, generator=gen) * 50).clamp(-127, 127).to(dtype)
        t[t == 0] = 1
        before = t.clone()
        restore = freshness.redraw_(t, gen)
        assert torch.equal(t.abs(), before.abs()), (m, k)
        assert not torch.equal(t, before), (m, k)
        restore()
        assert torch.equal(t, before), (m, k)


def test_spot_check_tells_a_fresh_output_from_a_stale_one():
    gen = torch.Generator().manual_seed(2)
    x, w, bias = torch.randn(8, 32, generator=gen), torch.randn(12, 32), torch.randn(12)
    y_old = x @ w.T + bias
    x0 = x.clone()
    spots, restore = freshness.redraw_and_check(x, w, bias, ["row"], {}, gen)
    spot = spots["row"]
    spot.verify(x @ w.T + bias)  # computed on the new values
    with pytest.raises(freshness.StaleOutput, match="not computed from its current input"):
        spot.verify(y_old)
    nan = (x @ w.T + bias).fill_(float("nan"))
    with pytest.raises(freshness.StaleOutput):
        spot.verify(nan)
    restore()
    assert torch.equal(x, x0)


def test_int8_operands_are_redrawn_and_their_product_checked():
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (6, 40), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (10, 40), generator=gen, dtype=torch.int8)
    x, w = torch.randn(6, 40), torch.randn(10, 40)
    stale = (a.long() @ b.long().T).to(torch.int32)
    spot = freshness.redraw_and_check(x, w, None, ["raw"], {"raw": (a, b)}, gen)[0]["raw"]
    spot.verify((a.long() @ b.long().T).to(torch.int32))
    with pytest.raises(freshness.StaleOutput):
        spot.verify(stale)


# --- check-backend ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch", "custom"])
def test_builtin_backends_follow_their_input(name):
    results = {r.name: r for r in run_contract(all_backends()[name])}
    assert results["follows_input"].status == "pass", results["follows_input"].detail


@pytest.mark.parametrize("name", sorted(CHEATERS))
def test_check_backend_catches_a_result_computed_at_build_time(fresh_registry, tmp_path, name):
    add_backend_files([cheater_file(tmp_path, name)])
    results = {r.name: r for r in run_contract(all_backends()[name])}
    assert results["follows_input"].status == "fail"
    assert "not computed from its current input" in results["follows_input"].detail
    # every other contract passes: only the redraw tells
    others = {n: r.status for n, r in results.items() if n != "follows_input"}
    assert "fail" not in others.values(), others
    out = CliRunner().invoke(
        app, ["check-backend", name, "--backend-file", str(cheater_file(tmp_path, name))]
    )
    assert out.exit_code == 1 and "follows_input" in out.output, out.output


# --- the sweep --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CHEATERS))
def test_the_sweep_fails_a_row_computed_at_build_time(monkeypatch, tmp_path, name):
    backends = dict(all_backends())
    backends[name] = load_unguarded(tmp_path, name)
    monkeypatch.setattr("kernelbench.run.cell.all_backends", lambda: backends)
    monkeypatch.setattr("kernelbench.run.plan.all_backends", lambda: backends)
    case = load_case("gpt3")
    opts = tiny_opts(backends=("torch", name), methods=("fp32", "fp16", "llm_int8"), rounds=2)
    estimator = CallEstimator()
    for item in plan(case, opts):  # round 0, then round 1 on fresh runners
        by = {(r.backend, r.method): r for r in measure_cell(item, case, opts, estimator)}
        bad = by[(name, "llm_int8")]
        assert bad.status == "failed", bad
        assert "not computed from its current input" in bad.reason
        assert by[("torch", "llm_int8")].status == "ok"
        assert by[("torch", "fp16")].status == "ok"


def test_an_operand_made_under_inference_mode_is_redrawn_and_restored():
    """Peers may build their int8 operands under torch.inference_mode: such a tensor is
    updated in place inside it, and restored exactly."""
    with torch.inference_mode():
        a = torch.randint(-128, 128, (5, 7), dtype=torch.int8)
    before = a.clone()
    undo = freshness.redraw_(a, torch.Generator().manual_seed(0))
    assert not torch.equal(a, before) and torch.equal(a.abs(), before.abs())
    undo()
    assert torch.equal(a, before)
