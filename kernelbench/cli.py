"""The ``kernelbench`` command (typer + rich)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kernelbench.backends import all_backends

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="kernelbench: int8 matmul kernels (LLM.int8()), timed and checked against float64.",
)
console = Console()


@app.callback()
def _root() -> None:
    """kernelbench: int8 matmul kernels, timed and checked against a float64 oracle."""


def _devices() -> list[torch.device]:
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    return devices


@app.command("list")
def list_backends() -> None:
    """Every backend, per device: available, or the reason why not."""
    table = Table(title="kernelbench backends")
    table.add_column("backend")
    table.add_column("device")
    table.add_column("available")
    table.add_column("methods / reason")
    table.add_column("verified")
    for name, backend in all_backends().items():
        for device in ("cpu", "cuda"):
            avail = backend.availability(torch.device(device))
            detail = ", ".join(backend.methods) if avail else avail.reason
            verified = backend.verification(device)
            table.add_row(name, device, "yes" if avail else "no", detail, verified)
    console.print(table)
    from kernelbench import cpu_ext

    console.print(
        f"CPU kernel set: {cpu_ext.isa()}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; CUDA device: "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}"
    )


QUICK_SIZES = (768, 1024, 2048)
QUICK_TOKENS = (256,)


def _csv_ints(text: str | None, what: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} must be a comma list of integers, got {text!r}") from None


def _csv(text: str | None) -> tuple[str, ...] | None:
    return tuple(v.strip() for v in text.split(",") if v.strip()) if text else None


@app.command()
def run(
    sizes: str = typer.Option("gpt3", help="A case name, or a comma list of its model dims"),
    case: str = typer.Option("gpt3", help="Case file (cases/NAME.toml) when --sizes lists dims"),
    backends: str = typer.Option(None, help="Comma list (default: all)"),
    methods: str = typer.Option(None, help="Comma list (default: all)"),
    tokens: str = typer.Option(None, help="Comma list of token counts (default: the case's)"),
    layer: str = typer.Option(None, help="ffn1 | ffn2 | attn_qkv | attn_out (default: ffn1)"),
    dist: str = typer.Option(None, help="outliers | gaussian | paper-bench (default: outliers)"),
    activations: Path = typer.Option(None, help="Your own activations, .pt or .npy (tokens, d)"),
    device: str = typer.Option("auto", help="cpu | cuda | auto"),
    out: Path = typer.Option(Path("results/latest"), help="Output directory"),
    resume: bool = typer.Option(False, help="Skip rows already in OUT/results.jsonl"),
    quick: bool = typer.Option(False, help="CI-sized subset: d 768,1024,2048 at 256 tokens"),
    threads: int = typer.Option(None, help="CPU threads (default: torch's default)"),
    budget: float = typer.Option(None, help="Seconds of timed samples per row"),
    paired: bool = typer.Option(
        True, help="Time each row in alternation with the 16-bit baseline (see docs)"
    ),
    max_call: float = typer.Option(None, help="Skip rows whose one call is estimated above this"),
    alpha: float = typer.Option(6.0, help="Outlier threshold (0 = no decomposition)"),
    outlier_cmp: str = typer.Option(">", help="'>' (paper) or '>=' (bitsandbytes)"),
    outlier_weights: str = typer.Option("fp16", help="fp16 (paper eq. 8) or int8 (bitsandbytes)"),
    error_rows: int = typer.Option(512, help="Output rows checked against float64 (sampled)"),
    no_report: bool = typer.Option(False, "--no-report", help="Do not write report.html"),
    executor: str = typer.Option("local", help="local | ray"),
    address: str = typer.Option(None, help="Ray cluster address HOST:PORT (--executor ray)"),
) -> None:
    """Time every method of every backend on the case's layers, check its error against a
    float64 oracle, and print the paper's App. D.1 table beside ours."""
    import sys

    from kernelbench import env as envmod
    from kernelbench.cases import load_case
    from kernelbench.console import print_tables
    from kernelbench.executors import get_executor
    from kernelbench.harness import RunOptions, method_pairs, plan, resolve_device
    from kernelbench.quant import QuantConfig
    from kernelbench.results import ENV_FILE, ResultsWriter, load_results
    from kernelbench.timing import TimerSettings

    if threads:
        torch.set_num_threads(threads)
    dims = None
    if sizes and sizes[0].isdigit():
        dims = _csv_ints(sizes, "--sizes")
    else:
        case = sizes
    if quick:
        dims = dims or QUICK_SIZES
        tokens = tokens or ",".join(map(str, QUICK_TOKENS))
    try:
        the_case = load_case(case)
        # A Ray driver need not have the workers' GPU: the executor resolves the device there.
        dev = resolve_device(device) if executor == "local" else torch.device("cpu")
        timer = TimerSettings(
            budget_s=budget or (0.3 if quick else 3.0), warmup_s=0.05 if quick else 0.2
        )
        opts = RunOptions(
            case=the_case.name,
            sizes=dims,
            tokens=_csv_ints(tokens, "--tokens"),
            layer=layer,
            dist=dist,
            backends=_csv(backends),
            methods=_csv(methods),
            device=dev.type if executor == "local" else device,
            cfg=QuantConfig(alpha, outlier_cmp, outlier_weights),
            timer=timer,
            max_call_s=max_call or (5.0 if quick else 30.0),
            error_rows=256 if quick else error_rows,
            activations=activations,
            paired=paired,
        )
        items = plan(the_case, opts)
        pairs = method_pairs(opts)
        runner = get_executor(executor, address=address)
    except (ValueError, KeyError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    writer = ResultsWriter(out)
    done = writer.done_keys() if resume else set()
    if not resume and writer.path.exists():
        writer.path.unlink()
    env = envmod.collect(
        dev,
        sys.argv[1:],
        {
            "seed": the_case.seed,
            "timer": vars(timer) | {},
            "paired": opts.paired,
            "max_call_s": opts.max_call_s,
            "error_rows": opts.error_rows,
            "quant": vars(opts.cfg) | {},
        },
    )
    if hasattr(runner, "cluster_env"):
        try:
            env["hosts"] = runner.cluster_env(opts.device)["hosts"]
        except Exception as exc:  # noqa: BLE001 - per-host env is informative
            console.print(f"[yellow]no per-host env: {escape(str(exc))}[/yellow]")
    (out / ENV_FILE).write_text(json.dumps(env, indent=2, default=str), encoding="utf-8")
    console.print(
        f"kernelbench run: {len(items)} cells x {len(pairs)} (backend, method) pairs "
        f"on {env['device_class']}, {torch.get_num_threads()} threads -> {out}"
    )
    total = len(items) * len(pairs)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=total)
        mark = {"ok": "", "skipped": " (skipped)", "failed": " [red](failed)[/red]"}
        try:
            for item, row in runner.run(items, the_case, opts, done):
                writer.append(row)
                label = f"{item.label} {row.backend}/{row.method}{mark[row.status]}"
                progress.update(task, advance=1, description=label)
        except ValueError as exc:  # an executor that cannot start (no GPU on the cluster...)
            console.print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(2) from None
        progress.update(task, completed=total)
    df = load_results(out)
    print_tables(df, console)
    if not no_report:
        _write_report([out], None)


@app.command()
def show(run_dir: Path) -> None:
    """Print the tables of a saved run again."""
    from kernelbench.console import print_tables
    from kernelbench.results import SchemaError, load_results

    try:
        df = load_results(run_dir)
    except SchemaError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    print_tables(df, console)


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or two for A/B"),
    output: Path = typer.Option(None, "-o", "--output", help="HTML file to write"),
) -> None:
    """Write a self-contained HTML report (two directories: side by side with ratios)."""
    if len(run_dirs) not in (1, 2):
        console.print("[red]error:[/red] give one run directory, or two for an A/B report")
        raise typer.Exit(2)
    _write_report(run_dirs, output)


@app.command()
def compare(
    base: Path,
    new: Path,
    speed_tol: float = typer.Option(0.10, help="Relative slowdown allowed beyond the noise"),
    error_tol: float = typer.Option(0.0, help="Relative growth of rel_error allowed"),
    fmt: str = typer.Option("text", "--format", help="text | markdown | json"),
    backend: list[str] = typer.Option(
        None, "--backend", help="Give verdicts for this backend's rows only (repeatable)"
    ),
) -> None:
    """Gate NEW against BASE: exit 0 (no regression), 1 (regression), 2 (unusable input)."""
    from kernelbench.compare import FORMATS, compare_runs, render

    if fmt not in FORMATS:
        console.print(f"[red]error:[/red] --format must be one of {', '.join(FORMATS)}")
        raise typer.Exit(2)
    try:
        result = compare_runs(base, new, speed_tol, error_tol, backend or None)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    typer.echo(render(result, fmt), nl=False)
    raise typer.Exit(result.exit_code)


@app.command()
def merge(
    out: Path = typer.Argument(..., help="Run directory to write (its results.jsonl is replaced)"),
    runs: list[Path] = typer.Argument(..., help="Two or more runs of the same sweep"),
) -> None:
    """Pool the samples of several runs (rounds) of one sweep into one run, e.g. for a baseline
    or a CI gate that must not hinge on one disturbed round."""
    from kernelbench.merge import write_merged
    from kernelbench.results import SchemaError

    try:
        rows = write_merged(runs, out)
    except SchemaError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    ok = sum(r.status == "ok" for r in rows)
    console.print(f"merged {len(runs)} runs: {len(rows)} rows ({ok} ok) -> {out}")


baseline_app = typer.Typer(help="Kept baselines under reports/baselines/<device class>/.")
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("update")
def baseline_update(
    run_dir: Path,
    baselines_dir: Path = typer.Option(Path("reports/baselines"), help="Where baselines live"),
    force: bool = typer.Option(False, help="Accept a run with failed rows"),
) -> None:
    """Make RUN_DIR the baseline of its device class (results.jsonl + env.json)."""
    from kernelbench.baseline import BaselineError, update_baseline

    try:
        dest = update_baseline(run_dir, baselines_dir, force=force)
    except BaselineError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console.print(f"baseline written: {dest}")


@baseline_app.command("path")
def baseline_path(
    device: str = typer.Option("cpu", help="cpu | cuda"),
    baselines_dir: Path = typer.Option(Path("reports/baselines"), help="Where baselines live"),
) -> None:
    """Print the baseline folder of this machine's device class (exit 1 when there is none)."""
    from kernelbench.baseline import find_baseline
    from kernelbench.env import device_class

    found = find_baseline(device_class(torch.device(device)), baselines_dir)
    if found is None:
        console.print(f"no baseline for {device_class(torch.device(device))}", style="yellow")
        raise typer.Exit(1)
    typer.echo(str(found))


def _write_report(dirs: list[Path], output: Path | None) -> None:
    try:
        from kernelbench.report import write_report
    except ImportError as exc:
        console.print(f"[yellow]no report written: {exc}[/yellow]")
        return
    path = write_report(dirs, output)
    console.print(f"report: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
