"""What every command shares: the consoles, the one-line error with exit 2, warnings about
skipped result lines, and writing a run's report."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)

EXIT_INPUT = 2


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` as one line on stderr; the caller raises what this returns."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    return typer.Exit(EXIT_INPUT)


@contextmanager
def skipped_lines_reported():
    """Lines of a results file that were not rows: one warning line each file, on stderr."""
    from kernelbench.results.schema import SkippedLinesWarning

    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SkippedLinesWarning)
            yield
    finally:
        # after the recording context: inside it, showwarning records (a warning shown there
        # is appended to the very list being shown, without end)
        for w in caught:
            if issubclass(w.category, SkippedLinesWarning):
                typer.echo(f"warning: {w.message}", err=True)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def between_runs_line(
    run_dir: Path, device_classes: Iterable[str], baselines: Path = Path("reports/baselines")
) -> str:
    """What is known of the spread between runs on the machine of the run in ``run_dir`` (its
    rows' ``device_classes``), as one line (:func:`~kernelbench.results.spread.
    kept_spread_line`, which the run's HTML report states too)."""
    from kernelbench.results.schema import SchemaError, load_env, results_path
    from kernelbench.results.spread import kept_spread_line, machine_of

    try:
        machine = machine_of(device_classes, load_env(results_path(run_dir).parent))
    except SchemaError:
        return ""  # no usable env.json: the run is shown, nothing is said of other runs
    return kept_spread_line(machine, baselines)


def write_report(
    dirs: list[Path],
    output: Path | None,
    strict: bool = False,
    baselines: Path = Path("reports/baselines"),
) -> None:
    """Write the HTML report; a run's own report is a courtesy (a problem is a warning), the
    ``report`` command's is the point (a problem is exit 2)."""
    from kernelbench.results.schema import SchemaError
    from kernelbench.results.spread import SpreadError

    try:
        from kernelbench.report import write_report

        with skipped_lines_reported():
            path = write_report(dirs, output, baselines)
    except (ImportError, SchemaError, SpreadError, OSError) as exc:
        if strict:
            raise fail(f"no report written: {exc}") from None
        typer.echo(f"warning: no report written: {' '.join(str(exc).split())}", err=True)
        return
    console.print(f"report: {escape(str(path))}")
