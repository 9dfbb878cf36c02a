"""The shape of the package: layering (the import contracts of pyproject.toml, run by
lint-imports), the backend registry as the one list of backends, and verification status as
data."""

from __future__ import annotations

import dataclasses
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kernelbench.backends as backends_pkg
from kernelbench import oracle
from kernelbench.backends import REGISTRY, BrokenBackend, all_backends, load_backends
from kernelbench.cli import app
from kernelbench.quant import Problem, QuantConfig

ROOT = Path(__file__).resolve().parents[1]

#: Modules of kernelbench/backends that are not backends: the interface and helpers.
BACKEND_HELPERS = {"base", "_peers", "custom_cuda", "plugins", "contract", "freshness", "residency"}


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of pyproject.toml on the package under
    ``package_parent``."""
    return subprocess.run(
        ["lint-imports", "--no-cache", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=package_parent,
        env={**os.environ, "PYTHONPATH": str(package_parent)},
    )


@pytest.fixture(scope="module")
def lint_imports_available():
    if shutil.which("lint-imports") is None:
        pytest.skip("lint-imports not installed (pip install '.[test]')")


def test_the_package_keeps_its_import_contracts(lint_imports_available):
    """Layers (a folder imports only those below it), readers without torch, and an oracle
    and machine description that need no backend: the contracts in pyproject.toml."""
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("quant.py", "from kernelbench.run import plan", "each layer imports only"),
        ("results/view.py", "import torch", "readers of a saved run"),
        ("oracle.py", "from kernelbench.backends import base", "the oracle and the machine"),
    ],
)
def test_a_planted_import_breaks_a_contract(
    lint_imports_available, tmp_path: Path, module: str, planted: str, contract: str
):
    shutil.copytree(ROOT / "kernelbench", tmp_path / "kernelbench", ignore=_not_source)
    target = tmp_path / "kernelbench" / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{planted}\n", encoding="utf-8")
    done = lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    assert f"{contract}" in done.stdout and "BROKEN" in done.stdout


def _not_source(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith(".so")}


# --- the registry --------------------------------------------------------------------------


def test_every_backend_module_is_registered_or_a_declared_helper():
    """A module in kernelbench/backends is a backend only through REGISTRY: none is left out
    silently, and every entry names a module that exists."""
    modules = {info.name for info in pkgutil.iter_modules(backends_pkg.__path__)}
    registered = {module.rsplit(".", 1)[1] for _, module in REGISTRY}
    assert modules - BACKEND_HELPERS == registered
    # built-in backends first, in REGISTRY order (installed plugins may follow)
    assert [name for name, _ in REGISTRY] == list(all_backends())[: len(REGISTRY)]


TOY_MODULE = '''
"""A toy backend: nothing but the reference stages of kernelbench.quant."""
from kernelbench.backends.base import Backend, torch_device_availability


class ToyBackend(Backend):
    name = "toy"
    description = "the reference stages of kernelbench.quant, nothing overridden"

    def availability(self, device):
        return torch_device_availability(device)


BACKEND = ToyBackend()
'''


@pytest.fixture
def toy_registered(tmp_path, monkeypatch):
    """A new backend module plus one line in the registry; the registry is reloaded after."""
    (tmp_path / "kb_toy_backend.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends_pkg, "REGISTRY", (*REGISTRY, ("toy", "kb_toy_backend")))
    all_backends.cache_clear()
    yield all_backends()["toy"]
    monkeypatch.undo()
    all_backends.cache_clear()
    sys.modules.pop("kb_toy_backend", None)


def test_adding_a_backend_is_one_module_plus_one_registry_line(
    toy_registered, make_outliers, make_randn, check_oracle
):
    toy = toy_registered
    assert list(all_backends()).index("toy") == len(REGISTRY)  # right after the built-ins
    assert toy.availability(torch.device("cpu"))
    assert toy.verification("cpu") == "unverified"
    # it runs every int8 method, and the reference stages meet the oracle
    x, dims = make_outliers(12, 48, n_outlier_dims=2)
    w, bias = make_randn(20, 48, scale=0.1), make_randn(20)
    cfg = QuantConfig()
    for method in ("int8_raw", "vectorwise", "llm_int8"):
        y = toy.runner(method, x, w, bias, cfg).run()
        check_oracle(y, method, x, w, bias, cfg, what=f"toy/{method}", backend=toy)
    # the CLI lists it, unverified
    out = CliRunner().invoke(app, ["list"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("toy "))
    block = [lines[start]]
    for ln in lines[start + 1 :]:
        if not ln.startswith(" "):
            break
        block.append(ln)
    assert "builtin" in block[0]
    assert sum("unverified" in ln for ln in block) == 2, block  # cpu and cuda


def test_the_harness_measures_a_registered_toy_backend(toy_registered):
    from kernelbench.run.cases import load_case
    from kernelbench.run.cell import measure_cell
    from kernelbench.run.plan import CallEstimator, RunOptions, plan

    tiny = dataclasses.replace(RunOptions().timer, budget_s=0.01, warmup_s=0.0, min_samples=1)
    opts = RunOptions(
        sizes=(768,),
        tokens=(4,),
        backends=("torch", "toy"),
        methods=("fp16", "llm_int8"),
        device="cpu",
        timer=tiny,
        stage_timer=tiny,
        error_rows=4,
    )
    case = load_case("gpt3")
    rows = [r for item in plan(case, opts) for r in measure_cell(item, case, opts, CallEstimator())]
    toy_row = next(r for r in rows if (r.backend, r.method) == ("toy", "llm_int8"))
    assert toy_row.status == "ok", toy_row.reason
    assert toy_row.rel_error is not None and toy_row.rel_error < 0.05


def test_a_broken_registry_entry_is_an_unavailable_backend_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "kb_no_backend.py").write_text("X = 1\n")
    (tmp_path / "kb_wrong_name.py").write_text(
        "from kernelbench.backends.torch_ops import BACKEND\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    found = load_backends(
        [
            ("missing", "kb_module_that_does_not_exist"),
            ("empty", "kb_no_backend"),
            ("other", "kb_wrong_name"),
        ]
    )
    reasons = {name: b.availability(torch.device("cpu")).reason for name, b in found.items()}
    assert all(isinstance(b, BrokenBackend) for b in found.values())
    assert "ModuleNotFoundError" in reasons["missing"]
    assert "defines no BACKEND" in reasons["empty"]
    assert "named 'torch'" in reasons["other"]
    with pytest.raises(ValueError, match="registered twice"):
        load_backends([("torch", "kernelbench.backends.torch_ops")] * 2)


# --- verification status as data -----------------------------------------------------------


def test_verification_evidence_names_files_that_exist():
    """Each verified device names its evidence (a kept report, a test file) and it exists; a
    device without evidence is reported as unverified."""
    for name, backend in all_backends().items():
        for device, evidence in backend.verified.items():
            assert device in ("cpu", "cuda"), (name, device)
            paths = [w for w in evidence.split() if w.startswith(("reports/", "tests/"))]
            assert paths, f"{name} on {device}: no report or test named in {evidence!r}"
            for p in paths:
                assert (ROOT / p).exists(), f"{name} on {device}: {p} does not exist"
        for device in ("cpu", "cuda"):
            said = backend.verification(device)
            assert said.startswith("verified: ") == (device in backend.verified), (name, said)


def test_cli_list_shows_verification():
    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "verified" in out.output
    assert "unverified" in out.output  # no backend has run on a GPU here


def test_oracle_rejects_an_unknown_method():
    x = torch.ones(2, 4)
    with pytest.raises(ValueError, match="unknown method 'row_wise'"):
        oracle.emulate(Problem("row_wise", x, x, None, QuantConfig()))


def test_readme_backend_table_states_the_verified_devices():
    """The README's backend table says "verified" in a device's column exactly where the
    backend declares evidence for that device, and lists every registered backend."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("## Backends")
    table = [ln for ln in lines[start:] if ln.startswith("| `")]
    seen = set()
    for line in table:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        name = cells[0].strip("`")
        backend = all_backends()[name]
        seen.add(name)
        for device, cell in zip(("cpu", "cuda"), cells[-2:], strict=True):
            claims = cell.startswith("verified")
            assert claims == (device in backend.verified), f"README: {name} on {device}: {cell}"
    assert seen == {name for name, _ in REGISTRY}


def test_the_outlier_test_has_one_encoding():
    """'>' and '>=' become one OutlierTest everywhere: it equals its string, is written to JSON
    as that string, and the kernels read its ``inclusive`` flag."""
    from kernelbench.quant import OutlierTest, outlier_columns

    cfg = QuantConfig(6.0, ">=")
    assert cfg.outlier_cmp is OutlierTest.GE and cfg.outlier_cmp == ">="
    assert json.loads(json.dumps(dataclasses.asdict(cfg)))["outlier_cmp"] == ">="
    assert f"{cfg.outlier_cmp}" == ">=" and not QuantConfig().outlier_cmp.inclusive
    x = torch.tensor([[6.0, 1.0, -7.0]])
    assert outlier_columns(x, 6.0, cfg.outlier_cmp).tolist() == [0, 2]
    assert outlier_columns(x, 6.0, ">").tolist() == [2]
    with pytest.raises(ValueError, match="outlier_cmp must be"):
        QuantConfig(6.0, "=>")


def test_rows_reach_every_reader(tmp_path, row_factory):
    """Rows written as the harness writes them are read by show, report and compare alike
    (the end of the pipeline, without torch backends in the loop)."""
    from rich.console import Console

    from kernelbench.report import write_report
    from kernelbench.report.console import print_tables
    from kernelbench.results.compare import compare_runs
    from kernelbench.results.schema import ResultsWriter
    from kernelbench.results.view import load_view

    writer = ResultsWriter(tmp_path)
    for row in (
        row_factory("fp16", "torch", median_ms=2.0, baseline_ms=2.0),
        row_factory("llm_int8", "custom", median_ms=1.0, baseline_ms=2.0),
        row_factory("vectorwise", "torchao", status="skipped"),
    ):
        writer.append(row)
    view = load_view(tmp_path)
    assert set(view["method"]) == {"fp16", "llm_int8", "vectorwise"}
    llm = view[view["method"] == "llm_int8"].iloc[0]
    assert llm["speedup"] == pytest.approx(2.0)
    console = Console(record=True, width=200)
    print_tables(view, console)
    assert "llm_int8" in console.export_text()
    assert "llm_int8" in write_report([tmp_path]).read_text()
    assert compare_runs(tmp_path, tmp_path).exit_code == 0


@pytest.mark.parametrize("fp32_ms, warned", [(2.0, True), (20.0, False)])
def test_tables_warn_when_fp32_beats_the_sixteen_bit_baseline(
    tmp_path, row_factory, fp32_ms, warned
):
    """On CPUs without native bf16 the 16-bit baseline is emulated (torch's bf16 GEMM ran 17-20
    GFLOP/s on an AVX2 VM, fp32 110-150): the tables say so, since every speedup over 16-bit
    then overstates int8's gain over the fastest float path."""
    from rich.console import Console

    from kernelbench.report.console import print_tables
    from kernelbench.results.schema import ResultsWriter
    from kernelbench.results.view import load_view

    writer = ResultsWriter(tmp_path)
    for row in (
        row_factory("fp16", "torch", median_ms=10.0, baseline_ms=10.0),
        row_factory("fp32", "torch", median_ms=fp32_ms, baseline_ms=10.0),
        row_factory("llm_int8", "custom", median_ms=1.0, baseline_ms=10.0),
    ):
        writer.append(row)
    console = Console(record=True, width=200)
    print_tables(load_view(tmp_path), console)
    text = console.export_text()
    assert ("faster than the 16-bit baseline in 1 of 1 cells" in text) == warned
    assert ("fp32 ran 5x" in text) == warned
    from kernelbench.report import write_report

    assert ("fp32 ran 5x" in write_report([tmp_path]).read_text()) == warned


def test_backend_status_is_plain_data_for_env_json():
    from kernelbench.backends import backend_status

    status = backend_status("cpu")
    assert list(status) == list(all_backends())
    assert status["torch"]["available"] and status["torch"]["verification"].startswith("verified")
    assert not status["cutlass"]["available"] and status["cutlass"]["reason"]
    assert json.loads(json.dumps(status)) == status


def test_a_run_imports_the_readers_its_end_uses_when_it_starts():
    """The end of a run (extra-round planning, the tables, the report, env.json's load) reads
    the run back with torch-free readers; imported only there, a package changed during a long
    sweep (reinstalled, its checkout moved on) failed after the rounds. ``run`` imports its
    sweep module first: that import brings them, and still no torch (option errors come first)."""
    readers = [
        "kernelbench.report",
        "kernelbench.report.console",
        "kernelbench.results.compare",
        "kernelbench.results.physics",
        "kernelbench.results.schema",
        "kernelbench.results.spread",
        "kernelbench.results.states",
        "kernelbench.results.view",
    ]
    code = (
        "import json, sys, kernelbench.cli.sweep; "
        f"print(json.dumps([[m for m in {readers!r} if m not in sys.modules], "
        "'torch' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    missing, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert missing == []
    assert not torch_loaded
