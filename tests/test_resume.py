"""A run killed mid-way and resumed: the file stays valid, nothing is measured twice, every ok
row has its speedup. The kill comes after a number of rows is written (never after a time), so
the test does not depend on the machine's speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from kernelbench.cli import app
from kernelbench.cli.sweep import resume_command
from kernelbench.results.schema import KEY_COLUMNS, RESULTS_FILE, ResultsWriter, read_run_rows

ARGS = ["run", "--sizes", "768", "--tokens", "8", "--backends", "torch"]
ARGS += ["--methods", "fp16,int8_raw", "--device", "cpu", "--no-report", "--budget", "0.2"]
ARGS += ["--rounds", "6", "--extra-rounds", "0"]
ARGS += ["--core-wait", "0"]  # a child process: the suite's fixture cannot reach its timers


def _rows_written(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _kill_after(out: Path, rows: int, timeout_s: float = 300.0) -> None:
    cmd = [sys.executable, "-m", "kernelbench.cli", *ARGS, "--out", str(out)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    try:
        while _rows_written(out / RESULTS_FILE) < rows:
            assert child.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no rows written in time"
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_killed_run_resumes_to_a_valid_complete_file(tmp_path: Path):
    out = tmp_path / "run"
    _kill_after(out, rows=3)
    results = out / RESULTS_FILE
    with results.open("ab") as fh:  # the kill cut a write half-way
        fh.write(b'{"schema_version": 2, "case": "gp')
    result = CliRunner().invoke(app, [*ARGS, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert "cut a torn last line" in result.output
    run = read_run_rows(out, strict=True)  # every line a row
    keys = [(tuple(r[c] for c in KEY_COLUMNS), r["round"]) for r in run.rows]
    assert len(keys) == len(set(keys)), "a row was measured twice"
    assert len(keys) == 2 * 6  # two methods, six rounds: nothing missing
    ok = [r for r in run.rows if r["status"] == "ok"]
    assert ok and all(r["speedup"] is not None for r in ok), [r["method"] for r in ok]
    env = json.loads((out / "env.json").read_text())
    assert env["settings"]["rounds"] == 6 and env.get("first_started_at")
    assert len(env["commands"]) == 2  # the killed run's command, then the resume's


def test_resume_keeps_a_complete_last_row_that_lost_its_newline(tmp_path: Path):
    writer = ResultsWriter(tmp_path)
    line = json.dumps(
        {
            "schema_version": 2,
            "case": "gpt3",
            "d_model": 768,
            "tokens": 8,
            "layer": "ffn1",
            "backend": "torch",
            "method": "fp16",
            "device_class": "x",
            "status": "ok",
        }
    )
    writer.path.write_text(line)
    assert writer.repair_tail() == ""
    assert writer.path.read_text() == line + "\n"


def test_interrupt_summary_names_the_resume_command():
    assert resume_command(["run", "--quick"]) == "kernelbench run --quick --resume"
    assert resume_command(["run", "--out", "a b", "--resume"]) == (
        "kernelbench run --out 'a b' --resume"
    )


def test_ctrl_c_prints_a_summary_and_exits_130(tmp_path: Path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kernelbench.cli", *ARGS, "--out", str(out)]
    # The child gets the default SIGINT disposition: a test run started in the background of a
    # non-interactive shell inherits SIGINT ignored, and so would the child (seen: it ran to
    # the end and exited 0).
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 300
    while _rows_written(out / RESULTS_FILE) < 2:
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert "interrupted:" in err and "--resume" in err and "Traceback" not in err
    assert os.path.exists(out / RESULTS_FILE)


def test_the_run_header_names_the_processor(tmp_path: Path, monkeypatch):
    # one class name covers processors 2x apart: the header says which one ran
    import kernelbench.run.env as env_mod

    identity = {"vendor": "AuthenticAMD", "family": "25", "model": "17", "stepping": "1"}
    monkeypatch.setattr(env_mod, "cpu_identity", lambda: dict(identity))
    args = [a if a != "6" else "1" for a in ARGS]  # one round
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    header = " ".join(result.output.split())  # the console wraps long lines
    assert "pairs on cpu-" in header and "(AuthenticAMD-25-17-1), " in header, header
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["cpu"]["identity"] == identity
