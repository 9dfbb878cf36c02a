"""Third-party backends: discovery (entry points, --backend-file), the API version check,
where each backend came from, the contract run on a plugin (check-backend), and a broken plugin
becoming skipped/failed rows while the sweep goes on."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kernelbench.api import API_VERSION
from kernelbench.backends import BrokenBackend, add_backend_files, all_backends, plugins
from kernelbench.backends.contract import run_contract
from kernelbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "kb-int8-numpy"
EXAMPLE_FILE = EXAMPLE_PLUGIN / "kb_int8_numpy" / "__init__.py"
BROKEN_FILE = ROOT / "examples" / "broken_tails_backend.py"
WIDE = {"COLUMNS": "250"}


@pytest.fixture
def fresh_registry(monkeypatch):
    """No backend files, no plugins but those a test installs; the registry reloaded after."""
    monkeypatch.setenv(plugins.BACKEND_FILES_ENV, "")  # restored (unset) after the test
    monkeypatch.setattr(plugins, "_origins", {})
    all_backends.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    all_backends.cache_clear()
    for name in [m for m in sys.modules if m.startswith(("kb_int8_numpy", "kernelbench_user_"))]:
        sys.modules.pop(name)


def install_entry_points(monkeypatch, *entries: tuple[str, str]) -> None:
    """Make ``(name, "module:attr")`` look like installed ``kernelbench.backends`` plugins."""
    eps = [metadata.EntryPoint(n, v, plugins.ENTRY_POINT_GROUP) for n, v in entries]
    real = metadata.entry_points

    def entry_points(**kw):
        return eps if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw)

    monkeypatch.setattr(plugins.metadata, "entry_points", entry_points)
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))


def backend_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


TEMPLATE = """
from kernelbench.api import Availability, Backend

class B(Backend):
    name = "{name}"
    {declaration}
    def availability(self, device):
        return Availability.yes()

BACKEND = B()
"""


def reason(name: str) -> str:
    return all_backends()[name].availability(torch.device("cpu")).reason


# --- discovery -------------------------------------------------------------------------------


def test_an_installed_entry_point_is_a_third_party_backend(fresh_registry):
    install_entry_points(fresh_registry, ("int8_numpy", "kb_int8_numpy:BACKEND"))
    backends = all_backends()
    assert list(backends)[-1] == "int8_numpy"
    assert backends["int8_numpy"].availability(torch.device("cpu"))
    origin = plugins.origin_of("int8_numpy")
    assert origin.kind == "plugin" and origin.third_party
    assert not plugins.origin_of("custom").third_party
    out = CliRunner().invoke(app, ["list"], env=WIDE)
    assert out.exit_code == 0, out.output
    text = out.output
    block = text[text.index("int8_numpy  (") :].split("\n\n")[0]
    head, rest = block.split("\n", 1)
    assert "plugin" in head
    cpu = rest[rest.index("  cpu ") : rest.index("  cuda ")]
    assert "runs" in cpu and "unverified" in cpu


def test_an_entry_point_that_fails_to_import_or_misnames_is_reported(fresh_registry):
    install_entry_points(
        fresh_registry,
        ("gone", "kb_module_that_does_not_exist:BACKEND"),
        ("renamed", "kb_int8_numpy:BACKEND"),
        ("torch", "kb_int8_numpy:BACKEND"),
    )
    backends = all_backends()
    assert isinstance(backends["gone"], BrokenBackend)
    assert "ModuleNotFoundError" in reason("gone")
    assert "loads a backend named 'int8_numpy'" in reason("renamed")
    # a plugin never replaces a built-in backend
    assert backends["torch"].availability(torch.device("cpu"))
    clash = next(n for n in backends if n.startswith("torch@"))
    assert "already used by a built-in backend" in reason(clash)


def test_backend_file_is_loaded_with_its_path_as_origin(fresh_registry):
    add_backend_files([BROKEN_FILE])
    assert "broken_tails" in all_backends()
    origin = plugins.origin_of("broken_tails")
    assert (origin.kind, origin.source, origin.version) == ("file", str(BROKEN_FILE), "0.0.1")
    with pytest.raises(ValueError, match="no such file"):
        add_backend_files([Path("/nonexistent/kb.py")])


def test_a_backend_file_that_fails_to_import_is_a_broken_backend(fresh_registry, tmp_path):
    path = backend_file(tmp_path, "crashes", "raise RuntimeError('kernel library missing')\n")
    add_backend_files([path])
    assert isinstance(all_backends()["crashes"], BrokenBackend)
    assert "RuntimeError: kernel library missing" in reason("crashes")


# --- the API version -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "declaration, expected",
    [
        (f"api_version = {API_VERSION + 1}", "upgrade kernelbench"),
        ("", "declares no api_version"),
        ("api_version = '1'", "must be an int"),
        ("api_version = 0", "no longer supports"),
    ],
)
def test_api_version_is_checked(fresh_registry, tmp_path, declaration, expected):
    path = backend_file(
        tmp_path, "versioned", TEMPLATE.format(name="versioned", declaration=declaration)
    )
    add_backend_files([path])
    assert isinstance(all_backends()["versioned"], BrokenBackend)
    assert expected in reason("versioned")
    out = CliRunner().invoke(app, ["list"], env=WIDE)
    assert out.exit_code == 0 and "versioned" in out.output


def test_the_current_api_version_loads(fresh_registry, tmp_path):
    decl = f"api_version = {API_VERSION}"
    path = backend_file(tmp_path, "current", TEMPLATE.format(name="current", declaration=decl))
    add_backend_files([path])
    assert not isinstance(all_backends()["current"], BrokenBackend)


# --- the contract ----------------------------------------------------------------------------


def test_check_backend_passes_the_example_plugin(fresh_registry):
    out = CliRunner().invoke(
        app, ["check-backend", "int8_numpy", "--backend-file", str(EXAMPLE_FILE)], env=WIDE
    )
    assert out.exit_code == 0, out.output
    assert "every applicable contract passed" in out.output
    for name in ("methods", "tails", "int8_extremes", "alpha", "bad_inputs"):
        line = next(ln for ln in out.output.splitlines() if f" {name} " in ln)
        assert "pass" in line, line


def test_check_backend_fails_a_kernel_that_drops_its_tail(fresh_registry):
    out = CliRunner().invoke(
        app, ["check-backend", "broken_tails", "--backend-file", str(BROKEN_FILE)], env=WIDE
    )
    assert out.exit_code == 1, out.output
    assert "FAILED contract(s)" in out.output and "tails" in out.output
    tails = next(ln for ln in out.output.splitlines() if " tails " in ln)
    assert "fail" in tails and "outside the oracle tolerance" in tails
    # a shape that is a multiple of its tile is right: the failure is the tail, not everything
    results = {r.name: r for r in run_contract(all_backends()["broken_tails"])}
    assert results["outliers"].status == "pass" and results["tails"].status == "fail"


def test_check_backend_rejects_an_unknown_name(fresh_registry):
    out = CliRunner().invoke(app, ["check-backend", "nope"])
    assert out.exit_code == 2 and "unknown backend 'nope'" in out.output


UNCHECKED = f"""
from kernelbench.api import Availability, Backend, Runner

class Unchecked(Backend):
    name = "unchecked"
    api_version = {API_VERSION}

    def availability(self, device):
        return Availability.yes()

    def runner(self, method, x, weight, bias, cfg, kept_rows=None):
        return Runner(run=lambda: x.float() @ weight.float().T)

BACKEND = Unchecked()
"""


def test_contract_fails_a_backend_that_skips_the_input_checks(fresh_registry, tmp_path):
    """Bad input must be a ValueError/TypeError naming it: a backend that returns a number for
    NaN input or mismatched shapes fails ``bad_inputs``."""
    add_backend_files([backend_file(tmp_path, "unchecked", UNCHECKED)])
    results = {r.name: r for r in run_contract(all_backends()["unchecked"])}
    assert results["bad_inputs"].status == "fail"
    assert "accepted" in results["bad_inputs"].detail or "not ValueError" in (
        results["bad_inputs"].detail
    )
    assert results["methods"].status == "fail"  # no quantization at all: not the oracle's


# --- a broken plugin in a sweep --------------------------------------------------------------


def sweep_rows(backends: tuple[str, ...]) -> list:
    from kernelbench.run.cases import load_case
    from kernelbench.run.cell import measure_cell
    from kernelbench.run.plan import CallEstimator, RunOptions, plan

    tiny = dataclasses.replace(RunOptions().timer, budget_s=0.01, warmup_s=0.0, min_samples=1)
    opts = RunOptions(
        sizes=(768,),
        tokens=(4,),
        layer="ffn1",
        backends=backends,
        methods=("fp16", "int8_raw", "llm_int8"),
        device="cpu",
        timer=tiny,
        stage_timer=tiny,
        error_rows=4,
    )
    case = load_case("gpt3")
    return [r for item in plan(case, opts) for r in measure_cell(item, case, opts, CallEstimator())]


def test_a_contract_breaking_plugin_gives_failed_rows_and_the_sweep_goes_on(fresh_registry):
    add_backend_files([BROKEN_FILE])
    rows = sweep_rows(("torch", "broken_tails"))
    broken = [r for r in rows if r.backend == "broken_tails" and r.method != "fp16"]
    assert {r.method for r in broken} == {"int8_raw", "llm_int8"}  # fp16: not its method
    for r in broken:
        assert r.status == "failed"
        assert "fails the contract" in r.reason and "tails" in r.reason
        assert r.origin == f"file {BROKEN_FILE} 0.0.1"
    ours = [r for r in rows if r.backend == "torch"]
    assert ours and all(r.status == "ok" and r.origin == "builtin" for r in ours)


def test_a_plugin_that_fails_to_import_gives_skipped_rows(fresh_registry, tmp_path):
    path = backend_file(tmp_path, "noimport", "import kb_no_such_kernel_library\n")
    add_backend_files([path])
    rows = sweep_rows(("torch", "noimport"))
    skipped = [r for r in rows if r.backend == "noimport"]
    assert skipped and all(r.status == "skipped" for r in skipped)
    assert all("ModuleNotFoundError" in r.reason and r.origin.startswith("file") for r in skipped)
    assert all(r.status == "ok" for r in rows if r.backend == "torch")


def test_third_party_rows_are_labelled_in_tables_and_report(row_factory):
    import pandas as pd
    from rich.console import Console

    from kernelbench.report.console import _print_skipped, grid, speedup_text
    from kernelbench.report.tables import speedup_grids

    plugin = "plugin kb-int8-numpy 0.1.0"
    rows = [row_factory(backend="int8_numpy", origin=plugin), row_factory(backend="custom")]
    rows.append(row_factory("vectorwise", "int8_numpy", status="failed", origin=plugin))
    df = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    con = Console(width=200, record=True)
    con.print(grid(df, "speedup", speedup_text))
    text = con.export_text()
    assert "int8_numpy (third-party)" in text and "custom (third-party)" not in text
    con = Console(width=200, record=True)
    _print_skipped(df, con)
    assert "int8_numpy (third-party)" in con.export_text()
    titles = {g.title for g in speedup_grids(df, "ffn1", 8)}
    assert titles == {f"backend int8_numpy (third-party: {plugin})", "backend custom"}
