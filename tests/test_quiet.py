"""What a person sees on the terminal: libraries' import-time chatter is kept, not printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelbench.backends import backend_status
from kernelbench.backends._peers import LazyImport, captured_output
from kernelbench.cli.commands import app
from kernelbench.results.view import short_reason

ROOT = Path(__file__).resolve().parents[1]


def python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python *args`` in a fresh process at the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


NOISY_MODULE = """
import logging, os, sys, warnings
logging.getLogger("noisy_peer").warning("Failed to load optional kernel")
warnings.warn("noisy_peer is deprecated", DeprecationWarning)
print("hello from print")
sys.stderr.write("hello from stderr\\n")
os.write(2, b"hello from fd 2\\n")
VALUE = 42
"""


def test_a_noisy_import_is_captured_and_kept(tmp_path, monkeypatch, capfd):
    (tmp_path / "kb_noisy_peer.py").write_text(NOISY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = LazyImport("kb_noisy_peer")
    module = lazy.load()
    assert module is not None and module.VALUE == 42 and lazy.error == ""
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    for said in (
        "Failed to load optional kernel",
        "noisy_peer is deprecated",
        "hello from print",
        "hello from stderr",
        "hello from fd 2",
    ):
        assert said in lazy.output


def test_streams_work_again_after_capturing(capfd):
    with captured_output() as said:
        print("inside")
    print("outside")
    os.write(2, b"outside fd\n")
    out, err = capfd.readouterr()
    assert said.text == "inside"
    assert out == "outside\n" and err == "outside fd\n"


def test_a_failing_import_is_a_reason_and_prints_nothing(capfd):
    lazy = LazyImport("kb_module_that_does_not_exist")
    assert lazy.load() is None
    assert "ModuleNotFoundError" in lazy.error
    assert capfd.readouterr() == ("", "")


def test_backend_status_records_what_loading_printed():
    status = backend_status("cpu")
    assert all("detail" in s for s in status.values())
    assert all(isinstance(s["detail"], str) for s in status.values())


def test_short_reason_drops_exception_texts_and_paths():
    long = (
        "the CUDA extension kernelbench._cuda was not built or does not load (ImportError: "
        "cannot import name '_cuda' from 'kernelbench' (/x/site-packages/kernelbench/"
        "__init__.py)); build with CUDA; the CUDA extension kernelbench._cuda was not built "
        "or does not load (ImportError: again)"
    )
    assert short_reason(long) == (
        "the CUDA extension kernelbench._cuda was not built or does not load; build with CUDA"
    )
    assert short_reason("no GPU here (CPU build)") == "no GPU here (CPU build)"
    assert short_reason("cannot open /usr/lib/x/libfoo.so now") == "cannot open libfoo.so now"


def test_list_at_80_columns_never_cuts_a_name():
    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "…" not in out.output
    assert all(len(ln) <= 80 or " " not in ln.strip() for ln in lines)
    heads = [ln.split()[0] for ln in lines if ln and not ln.startswith(" ")]
    assert {"torch", "custom"} <= set(heads)  # one block per backend, its name first


def test_list_shows_a_peers_own_version():
    pytest.importorskip("bitsandbytes")
    import importlib.metadata

    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": "80"})
    head = next(ln for ln in out.output.splitlines() if ln.startswith("bitsandbytes "))
    assert f"bitsandbytes {importlib.metadata.version('bitsandbytes')}" in head


def test_list_verbose_shows_full_reasons():
    out = CliRunner().invoke(app, ["list", "-v"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "about: " in out.output


def test_list_prints_nothing_on_stderr():
    """A real process: peers' import-time lines (logging, warnings, C code) stay off stderr."""
    proc = python("-m", "kernelbench.cli", "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "custom" in proc.stdout


def test_a_peer_is_imported_only_when_its_backend_is_asked_about():
    code = (
        "import sys\n"
        "from kernelbench.backends import backend_status\n"
        "status = backend_status('cpu', names=['torch', 'custom'])\n"
        "assert set(status) == {'torch', 'custom'}, status\n"
        "assert 'bitsandbytes' not in sys.modules and 'torchao' not in sys.modules\n"
        "print('ok')\n"
    )
    proc = python("-c", code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert proc.stderr == ""


def test_readers_print_nothing_on_stderr_and_import_no_peer(tmp_path, row_factory):
    """``show`` and ``report`` read a run without importing torch's peers (or torch)."""
    from kernelbench.results.schema import ResultsWriter

    writer = ResultsWriter(tmp_path)
    writer.append(row_factory("fp16", "torch"))
    writer.append(row_factory("llm_int8", "custom", median_ms=0.5))
    code = (
        "import sys\n"
        "from kernelbench.cli import app\n"
        "for args in (['show', sys.argv[1]], ['report', sys.argv[1]]):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, exc.code\n"
        "assert not {'torch', 'bitsandbytes', 'torchao'} & set(sys.modules)\n"
    )
    proc = python("-c", code, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "Fastest over 16-bit" in proc.stdout


def test_compiling_torchao_prints_no_warning():
    """torchao_compile's first (compiling) call: torch's advice to torchao's Int8Tensor (define
    a stable cache hash) is not shown; a fresh process, as torch warns once per process."""
    pytest.importorskip("torchao")
    code = (
        "import torch\n"
        "from kernelbench.backends import get_backend\n"
        "from kernelbench.quant import QuantConfig\n"
        "backend = get_backend('torchao_compile')\n"
        "avail = backend.availability(torch.device('cpu'))\n"
        "if not avail: print('unavailable:', avail.reason); raise SystemExit\n"
        "g = torch.Generator().manual_seed(0)\n"
        "x = torch.randn(8, 64, generator=g).bfloat16()\n"
        "w, b = torch.randn(48, 64, generator=g).bfloat16(), torch.zeros(48).bfloat16()\n"
        "r = backend.runner('vectorwise', x, w, b, QuantConfig())\n"
        "assert r.compile_seconds > 0 and r.run().shape == (8, 48)\n"
        "print('ok')\n"
    )
    proc = python("-W", "default", "-c", code, timeout=600)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.startswith("unavailable:"):
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.strip() == "ok"
    assert "_stable_hash_for_caching" not in proc.stderr, proc.stderr


def test_a_library_warning_while_reading_a_run_is_shown_once():
    """Any other warning met while ``show`` or ``report`` read a run (a plotting library's
    advice, say) is shown once after reading, and reading ends: shown inside the recording
    context it would be recorded again and again, without end. A fresh process, its memory
    capped, so that such a loop fails here instead of filling the machine."""
    code = (
        "import resource, warnings\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from kernelbench.cli.common import skipped_lines_reported\n"
        "from kernelbench.results.schema import SkippedLinesWarning\n"
        "with skipped_lines_reported():\n"
        "    warnings.warn('a library advises', UserWarning)\n"
        "    warnings.warn('line 2 is not a row', SkippedLinesWarning)\n"
        "print('done')\n"
    )
    proc = python("-c", code, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert proc.stderr.count("UserWarning: a library advises") == 1, proc.stderr[-2000:]
    assert "warning: line 2 is not a row" in proc.stderr
