"""The ``kernelbench`` command (typer + rich).

Nothing heavy is imported at module level (no torch, no pandas): ``kernelbench --help`` answers
at once, and each command imports what it needs. Bad input of any kind ends in one line on
stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import json
import shlex
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from kernelbench import profiles
from kernelbench.profiles import PROFILES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="kernelbench: int8 matmul kernels (LLM.int8()), timed and checked against float64.",
)
console = Console()
err_console = Console(stderr=True)

EXIT_INPUT, EXIT_INTERRUPTED = 2, 130
QUICK = PROFILES["quick"]
DISTRIBUTIONS = ("outliers", "gaussian", "paper-bench")


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` as one line on stderr; the caller raises what this returns."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    return typer.Exit(EXIT_INPUT)


@contextmanager
def skipped_lines_reported():
    """Lines of a results file that were not rows: one warning line each file, on stderr."""
    from kernelbench.results import SkippedLinesWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SkippedLinesWarning)
        try:
            yield
        finally:
            for w in caught:
                if issubclass(w.category, SkippedLinesWarning):
                    typer.echo(f"warning: {w.message}", err=True)
                else:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)


@app.callback()
def _root() -> None:
    """kernelbench: int8 matmul kernels, timed and checked against a float64 oracle."""


BACKEND_FILE_HELP = (
    "A Python file defining BACKEND, added as a third-party backend (repeatable). The file is "
    "executed as Python code with your permissions: give only code you chose to run"
)


def _use_backend_files(paths: list[Path] | None) -> None:
    """Load the ``--backend-file`` backends (here and in the workers of a run)."""
    if not paths:
        return
    from kernelbench import plugins

    try:
        plugins.add_backend_files(paths)
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command("list")
def list_backends(
    backend_file: list[Path] = typer.Option(
        None, "--backend-file", metavar="FILE", help=BACKEND_FILE_HELP
    ),
) -> None:
    """Every backend and method, per device: runs here, or the reason why not; where each
    backend came from (built in, an installed plugin, a file) and its version."""
    _use_backend_files(backend_file)
    import torch
    from rich.table import Table

    from kernelbench import cpu_ext
    from kernelbench.backends import all_backends
    from kernelbench.backends.base import sixteen_bit_dtype
    from kernelbench.plugins import origin_of

    table = Table(title="kernelbench backends")
    cols = ("backend", "origin", "version", "device", "available", "methods / reason", "verified")
    for col in cols:
        table.add_column(col)
    for name, backend in all_backends().items():
        origin = origin_of(name)
        source = "builtin" if not origin.third_party else f"{origin.kind} {origin.source}"
        for device in ("cpu", "cuda"):
            dev = torch.device(device)
            avail = backend.availability(dev)
            if avail:
                # what a run does: methods this backend skips on every shape are not listed
                dtype = sixteen_bit_dtype(dev)
                methods = [
                    m for m in backend.methods if backend.supports(m, dev, dtype, 256, 1024, 4096)
                ]
                detail = ", ".join(methods)
            else:
                detail = avail.reason
            row = (name, source, origin.version, device, "yes" if avail else "no", detail)
            table.add_row(*(escape(v) for v in (*row, backend.verification(dev))))
    console.print(table)
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    console.print(
        f"CPU kernel set: {cpu_ext.isa()}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; CUDA device: {escape(cuda)}"
    )


@app.command("check-backend")
def check_backend(
    name: str = typer.Argument(..., metavar="NAME", help="A backend (see kernelbench list)"),
    device: str = typer.Option("cpu", metavar="NAME", help="cpu | cuda"),
    backend_file: list[Path] = typer.Option(
        None, "--backend-file", metavar="FILE", help=BACKEND_FILE_HELP
    ),
) -> None:
    """Run the backend contract (the checks every built-in backend passes: methods, tails,
    -128, outliers, alpha, zero tokens, bad inputs, stages, against the float64 oracle) on one
    backend and print a pass/fail table. Exit code 1 names the failed contracts."""
    _use_backend_files(backend_file)
    if device not in ("cpu", "cuda"):
        raise fail(f"--device must be cpu or cuda, got {device!r}")
    from rich.table import Table

    from kernelbench.backends import all_backends
    from kernelbench.contract import CONTRACTS, run_contract
    from kernelbench.plugins import origin_of

    backends = all_backends()
    if name not in backends:
        raise fail(f"unknown backend {name!r}; known: {', '.join(backends)}")
    origin = origin_of(name)
    results = run_contract(backends[name], device)
    about = {c.name: c.description for c in CONTRACTS}
    title = f"backend contract: {name} ({origin.label()}) on {device}"
    table = Table(title=escape(title))
    for col in ("contract", "result", "seconds", "what / why"):
        table.add_column(col)
    style = {"pass": "green", "fail": "bold red", "n/a": "dim"}
    for r in results:
        detail = r.detail if r.status != "pass" else about.get(r.name, "")
        result = f"[{style[r.status]}]{r.status}[/]"
        table.add_row(escape(r.name), result, f"{r.seconds:.2f}", escape(detail))
    console.print(table)
    failed = [r.name for r in results if r.status == "fail"]
    if failed:
        typer.echo(f"{name}: FAILED contract(s): {', '.join(failed)}", err=True)
        raise typer.Exit(1)
    console.print(f"{escape(name)}: every applicable contract passed")


def _csv_ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise fail(f"{flag} must be a comma list of integers, got {text!r}") from None
    if not values:
        raise fail(f"{flag} is empty")
    return values


def _csv(text: str | None) -> tuple[str, ...] | None:
    return tuple(v.strip() for v in text.split(",") if v.strip()) if text else None


def _help_default(field: str, unit: str = "") -> str:
    values = {name: getattr(p, field) for name, p in PROFILES.items()}
    return "(default: " + "; ".join(f"{k}: {v:g}{unit}" for k, v in values.items()) + ")"


@dataclass(frozen=True)
class RunRequest:
    """Everything ``run`` was asked, checked for ranges, before torch is imported."""

    profile: profiles.Profile
    case: str
    backends: tuple[str, ...] | None
    methods: tuple[str, ...] | None
    layer: str | None
    dist: str | None
    activations: Path | None
    device: str
    out: Path
    resume: bool
    alpha: float
    outlier_cmp: str
    outlier_weights: str
    executor: str
    address: str | None


def _settings(req: RunRequest, dclass: str, threads: int) -> dict:
    """What every row of a run shares; ``--resume`` refuses to mix rows of other settings."""
    p = req.profile
    return {
        "case": req.case,
        "dist": req.dist,
        "activations": str(req.activations) if req.activations else None,
        "alpha": req.alpha,
        "outlier_cmp": req.outlier_cmp,
        "outlier_weights": req.outlier_weights,
        "budget_s": p.budget_s,
        "warmup_s": p.warmup_s,
        "error_rows": p.error_rows,
        "rounds": p.rounds,
        "ci_target": p.ci_target,
        "extra_rounds": p.extra_rounds,
        "device_class": dclass,
        "threads": threads,
    }


@app.command()
def run(
    sizes: str = typer.Option(
        None,
        metavar="CASE|DIMS",
        help="A case name, or a comma list of its model dims "
        "(default: gpt3, every size; quick: 768,1024,2048)",
    ),
    case: str = typer.Option("gpt3", metavar="NAME", help="Case (cases/NAME.toml) of the dims"),
    backends: str = typer.Option(None, metavar="LIST", help="Comma list (default: all)"),
    methods: str = typer.Option(None, metavar="LIST", help="Comma list (default: all)"),
    tokens: str = typer.Option(
        None, metavar="LIST", help="Comma list of token counts (default: the case's; quick: 256)"
    ),
    layer: str = typer.Option(
        None, metavar="NAME", help="ffn1 | ffn2 | attn_qkv | attn_out (default: the case's)"
    ),
    dist: str = typer.Option(
        None, metavar="NAME", help="outliers | gaussian | paper-bench (default: the case's)"
    ),
    activations: Path = typer.Option(
        None, metavar="FILE", help="Your own activations, .pt or .npy, shape (tokens, d)"
    ),
    device: str = typer.Option("auto", metavar="NAME", help="cpu | cuda | auto"),
    out: Path = typer.Option(
        Path("results/latest"),
        metavar="DIR",
        help="Output directory. A run already there is moved aside to DIR.<UTC time> (the "
        "terminal says where) unless --resume; results are never deleted",
    ),
    resume: bool = typer.Option(
        False, "--resume", metavar="", help="Measure only the rows DIR lacks (same settings)"
    ),
    quick: bool = typer.Option(False, "--quick", metavar="", help="Same as --profile quick"),
    profile: str = typer.Option(
        None,
        metavar="NAME",
        help="Named defaults: "
        + "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values())
        + " (default: default). Flags given explicitly win",
    ),
    rounds: int = typer.Option(
        None, metavar="N", help="Visits of each cell; rows pooled " + _help_default("rounds")
    ),
    ci_target: float = typer.Option(
        None,
        metavar="FRACTION",
        help="Speedup intervals wider than this (relative half-width) get extra rounds, then a "
        "flag " + _help_default("ci_target"),
    ),
    extra_rounds: int = typer.Option(
        None,
        metavar="N",
        help="At most this many extra rounds for rows whose interval is too wide "
        + _help_default("extra_rounds"),
    ),
    threads: int = typer.Option(None, metavar="N", help="CPU threads (default: torch's)"),
    budget: float = typer.Option(
        None, metavar="SECONDS", help="Timed samples per row and round " + _help_default("budget_s")
    ),
    max_call: float = typer.Option(
        None,
        metavar="SECONDS",
        help="Skip rows whose one call is estimated above this " + _help_default("max_call_s"),
    ),
    alpha: float = typer.Option(6.0, help="Outlier threshold (0 = no decomposition)"),
    outlier_cmp: str = typer.Option(">", metavar="OP", help="'>' (paper) or '>=' (bitsandbytes)"),
    outlier_weights: str = typer.Option(
        "fp16", metavar="NAME", help="fp16 (paper eq. 8) or int8 (bitsandbytes)"
    ),
    error_rows: int = typer.Option(
        None, metavar="N", help="Output rows checked against float64 " + _help_default("error_rows")
    ),
    no_report: bool = typer.Option(False, "--no-report", metavar="", help="No report.html"),
    executor: str = typer.Option("local", metavar="NAME", help="local | ray"),
    address: str = typer.Option(None, metavar="HOST:PORT", help="Ray cluster (--executor ray)"),
    backend_file: list[Path] = typer.Option(
        None, "--backend-file", metavar="FILE", help=BACKEND_FILE_HELP
    ),
) -> None:
    """Time every method of every backend on the case's layers, check its error against a
    float64 oracle, and print the paper's App. D.1 table beside ours."""
    _use_backend_files(backend_file)
    if quick and profile not in (None, "quick"):
        raise fail(f"--quick and --profile {profile} contradict each other")
    dims = None
    if sizes and sizes[0].isdigit():
        dims = _csv_ints(sizes, "--sizes")
    elif sizes:
        case = sizes
    try:
        chosen = profiles.resolve(
            "quick" if quick else (profile or "default"),
            sizes=dims,
            tokens=_csv_ints(tokens, "--tokens"),
            budget_s=budget,
            max_call_s=max_call,
            error_rows=error_rows,
            rounds=rounds,
            ci_target=ci_target,
            extra_rounds=extra_rounds,
            threads=threads,
        )
    except profiles.SettingError as exc:
        raise fail(str(exc)) from None
    if dist is not None and dist not in DISTRIBUTIONS:
        raise fail(f"--dist must be one of {', '.join(DISTRIBUTIONS)}, got {dist!r}")
    if outlier_cmp not in (">", ">="):
        raise fail(f"--outlier-cmp must be '>' or '>=', got {outlier_cmp!r}")
    if outlier_weights not in ("fp16", "int8"):
        raise fail(f"--outlier-weights must be fp16 or int8, got {outlier_weights!r}")
    if not alpha == alpha or abs(alpha) == float("inf") or alpha < 0:
        raise fail(f"--alpha must be a finite number >= 0, got {alpha}")
    req = RunRequest(
        chosen, case, _csv(backends), _csv(methods), layer, dist, activations, device, out,
        resume, alpha, outlier_cmp, outlier_weights, executor, address,
    )  # fmt: skip
    _run(req, no_report)


@dataclass
class _Prepared:
    case: object  # kernelbench.cases.Case
    opts: object  # kernelbench.harness.RunOptions
    items: list
    pairs: list[tuple[str, str]]
    runner: object  # an executor
    device: object  # torch.device
    env: dict


def _prepare(req: RunRequest) -> _Prepared:
    """Load and check everything the run needs (case, activations, executor), writing nothing."""
    import torch

    from kernelbench import env as envmod
    from kernelbench.cases import load_activation_file, load_case
    from kernelbench.executors import get_executor
    from kernelbench.harness import RunOptions, method_pairs, plan, resolve_device
    from kernelbench.measure import TimerSettings
    from kernelbench.quant import QuantConfig

    p = req.profile
    if p.threads:
        torch.set_num_threads(p.threads)
    local = req.executor == "local"
    try:
        the_case = load_case(req.case)
        # A Ray driver need not have the workers' GPU: the executor resolves the device there.
        dev = resolve_device(req.device) if local else torch.device("cpu")
        opts = RunOptions(
            case=the_case.name,
            sizes=p.sizes,
            tokens=p.tokens,
            layer=req.layer,
            dist=req.dist,
            backends=req.backends,
            methods=req.methods,
            device=dev.type if local else req.device,
            cfg=QuantConfig(req.alpha, req.outlier_cmp, req.outlier_weights),
            timer=TimerSettings(budget_s=p.budget_s, warmup_s=p.warmup_s),
            max_call_s=p.max_call_s,
            error_rows=p.error_rows,
            activations=req.activations,
            rounds=p.rounds,
            ci_target=p.ci_target,
            extra_rounds=p.extra_rounds,
        )
        items = plan(the_case, opts)
        pairs = method_pairs(opts)
        if req.activations is not None:
            _check_activations(load_activation_file(req.activations), items, the_case)
        runner = get_executor(req.executor, address=req.address)
    except KeyError as exc:
        raise fail(f"case {req.case!r}: missing entry {exc}") from None
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    env = envmod.collect(dev, sys.argv[1:])
    return _Prepared(the_case, opts, items, pairs, runner, dev, env)


def _check_activations(acts, items, case) -> None:
    for item in items:
        k, _ = case.shape(item.layer, item.size.d_model)
        if acts.shape[1] != k:
            raise ValueError(
                f"--activations have d={acts.shape[1]}; layer {item.layer} at "
                f"d_model={item.size.d_model} needs {k} (give --sizes matching your file)"
            )
        if acts.shape[0] < item.tokens:
            raise ValueError(f"--activations have {acts.shape[0]} tokens, {item.tokens} asked")


def _run(req: RunRequest, no_report: bool) -> None:
    from kernelbench import results as res

    prep = _prepare(req)
    try:
        res.check_out_dir(req.out, move_old=not req.resume)
    except res.RunDirError as exc:
        raise fail(str(exc)) from None
    settings = _settings(req, prep.env["device_class"], prep.env["threads"])
    old_env: dict = {}
    if req.resume:
        try:
            old_env = res.load_env(req.out) if req.out.is_dir() else {}
        except res.SchemaError as exc:
            raise fail(f"{exc}; cannot --resume this run") from None
        diff = res.settings_differences(old_env, settings)
        if diff:
            raise fail(
                f"--resume: {req.out} was measured with other settings ({'; '.join(diff)}); "
                "give the same flags, or another --out"
            )
    elif res.holds_run(req.out):
        moved = res.move_aside(req.out)
        console.print(f"an earlier run in {escape(str(req.out))} was moved to {escape(str(moved))}")
    writer = res.ResultsWriter(req.out)
    done: set = set()
    if req.resume:
        note = writer.repair_tail()
        if note:
            console.print(escape(note))
        done = writer.done_keys()
    _write_env(req, prep, settings, old_env)
    _sweep(req, prep, writer, done)
    filled = res.complete_speedups(req.out)
    if filled:
        console.print(f"{filled} row(s) got their speedup from their cell's earlier baseline row")
    from kernelbench.console import print_tables
    from kernelbench.view import load_view

    with skipped_lines_reported():
        print_tables(load_view(req.out), console)
    if not no_report:
        _write_report([req.out], None)


def _write_env(req: RunRequest, prep: _Prepared, settings: dict, old_env: dict) -> None:
    from dataclasses import asdict

    from kernelbench.results import ENV_FILE, SETTINGS_KEY

    env = dict(prep.env)
    opts = prep.opts
    env.update(
        seed=prep.case.seed,
        timer=asdict(opts.timer),
        max_call_s=opts.max_call_s,
        error_rows=opts.error_rows,
        rounds=opts.rounds,
        ci_target=opts.ci_target,
        extra_rounds=opts.extra_rounds,
        quant=asdict(opts.cfg),
        profile=req.profile.name,
    )
    env[SETTINGS_KEY] = settings
    if old_env.get("started_at"):
        env["first_started_at"] = old_env.get("first_started_at") or old_env["started_at"]
    if hasattr(prep.runner, "cluster_env"):
        try:
            env["hosts"] = prep.runner.cluster_env(opts.device)["hosts"]
        except Exception as exc:  # noqa: BLE001 - per-host env is informative
            console.print(f"[yellow]no per-host env: {escape(str(exc))}[/yellow]")
    if req.executor == "local":  # rooflines: this device class's measured peaks (cached)
        from kernelbench.peak import cached_peak, cached_peak_exists

        if not cached_peak_exists(prep.device):
            console.print("measuring this device's peaks once (kernelbench peak), ~30 s ...")
        env["peak"] = {**env.get("peak", {}), **cached_peak(prep.device)}
    prep.env.update(env)
    (req.out / ENV_FILE).write_text(json.dumps(env, indent=2, default=str), encoding="utf-8")


def resume_command(argv: list[str]) -> str:
    """The command line that resumes the run ``argv`` started."""
    args = list(argv) if "--resume" in argv else [*argv, "--resume"]
    return shlex.join(["kernelbench", *args])


def _sweep(req: RunRequest, prep: _Prepared, writer, done: set) -> None:
    """Measure and write every row (then the extra rounds the run's uncertain rows get), with
    progress; ^C ends with a one-line summary and exit 130."""
    from kernelbench.harness import followup_items
    from kernelbench.progress import CostModel, sweep_progress
    from kernelbench.results import read_rows

    console.print(
        f"kernelbench run: {len(prep.items)} cells x {len(prep.pairs)} (backend, method) pairs "
        f"on {escape(prep.env['device_class'])}, {prep.env['threads']} threads -> "
        f"{escape(str(req.out))}"
    )
    cost = CostModel(req.profile.budget_s, paired=True)
    count = [0]
    try:
        with sweep_progress(console) as progress:
            task = progress.add_task("starting", total=None, rows=0)
            _measure(prep, prep.items, writer, done, cost, progress, task, count)
            for extra in range(prep.opts.extra_rounds):
                next_round = prep.opts.rounds + extra
                more = followup_items(
                    read_rows(writer.path),
                    prep.env,
                    prep.items,
                    next_round,
                    prep.opts.extra_round_budget_s,
                )
                if not more:
                    break
                _measure(prep, more, writer, done, cost, progress, task, count)
    except KeyboardInterrupt:
        kept = sum(1 for line in writer.path.open(encoding="utf-8") if line.strip())
        typer.echo(
            f"interrupted: {count[0]} row(s) written by this run, {kept} kept in {writer.path}; "
            f"resume with: {resume_command(sys.argv[1:])}",
            err=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except ValueError as exc:  # an executor that cannot start (no GPU on the cluster...)
        raise fail(str(exc)) from None


def _measure(prep: _Prepared, items, writer, done, cost, progress, task, count: list) -> None:
    """Run ``items`` through the executor, writing each row; the bar advances by each row's
    estimated cost and names the row timed next."""
    remaining = _planned_rows(prep, items, done, cost)
    spent = progress.tasks[0].completed if progress.tasks else 0.0
    for item, row in prep.runner.run(items, prep.case, prep.opts, done):
        writer.append(row)
        count[0] += 1
        pair = (row.backend, row.method)
        spent += remaining.pop((item, pair), (0.0, 0.0, False))[0]
        cost.record(pair, float(row.flops or 0.0), row.median_ms)
        left = sum(cost.cost(p, f, ok) for (_, p), (_, f, ok) in remaining.items())
        nxt = next(iter(remaining), None)
        label = f"timing {nxt[0].label} {nxt[1][0]}/{nxt[1][1]}" if nxt else "finishing"
        progress.update(
            task, completed=spent, total=spent + left, rows=count[0], description=escape(label)
        )


def _planned_rows(prep: _Prepared, items, done: set, cost) -> dict:
    """(item, pair) -> (estimated seconds, flops, runs here) of every row still to measure, in
    measuring order."""
    from kernelbench.backends import all_backends
    from kernelbench.backends.base import sixteen_bit_dtype
    from kernelbench.core import work_flops
    from kernelbench.results import KEY_COLUMNS

    dtype = sixteen_bit_dtype(prep.device)
    backends = all_backends()
    planned = {}
    for item in items:
        k, n = prep.case.shape(item.layer, item.size.d_model)
        flops = work_flops(item.tokens, k, n)
        only = item.only
        for backend, method in prep.pairs:
            if only is not None and (backend, method) not in only:
                continue
            fields = {
                "case": prep.case.name,
                "d_model": item.size.d_model,
                "tokens": item.tokens,
                "layer": item.layer,
                "backend": backend,
                "method": method,
                "device_class": prep.env["device_class"],
            }
            if (tuple(fields[c] for c in KEY_COLUMNS), item.round) in done:
                continue
            try:
                runs = bool(
                    backends[backend].supports(method, prep.device, dtype, item.tokens, k, n)
                )
            except Exception:  # noqa: BLE001 - only an estimate
                runs = True
            planned[(item, (backend, method))] = (
                cost.cost((backend, method), flops, runs),
                flops,
                runs,
            )
    return planned


@app.command()
def show(run_dir: Path) -> None:
    """Print the tables of a saved run again."""
    from kernelbench.console import print_tables
    from kernelbench.results import SchemaError
    from kernelbench.view import load_view

    try:
        with skipped_lines_reported():
            df = load_view(run_dir)
    except SchemaError as exc:
        raise fail(str(exc)) from None
    print_tables(df, console)


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or two for A/B"),
    output: Path = typer.Option(None, "-o", "--output", help="HTML file to write"),
) -> None:
    """Write a self-contained HTML report (two directories: side by side with ratios)."""
    if len(run_dirs) not in (1, 2):
        raise fail("give one run directory, or two for an A/B report")
    _write_report(run_dirs, output, strict=True)


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
        raise fail(f"--format must be one of {', '.join(FORMATS)}")
    try:
        result = compare_runs(base, new, speed_tol, error_tol, backend or None)
    except ValueError as exc:
        raise fail(str(exc)) from None
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

    if out.exists() and not out.is_dir():
        raise fail(f"{out} is a file, not a run directory")
    try:
        with skipped_lines_reported():
            rows = write_merged(runs, out)
    except (SchemaError, OSError) as exc:
        raise fail(str(exc)) from None
    ok = sum(r.status == "ok" for r in rows)
    console.print(f"merged {len(runs)} runs: {len(rows)} rows ({ok} ok) -> {out}")


@app.command()
def peak(
    device: str = typer.Option("auto", help="cpu | cuda | auto"),
    remeasure: bool = typer.Option(
        False, "--remeasure", metavar="", help="Measure again even if cached"
    ),
) -> None:
    """Measure (once per device class, then cached) this device's int8, 16-bit and fp32 GEMM
    peaks and memory bandwidth: every run's rooflines."""
    from kernelbench.env import device_class
    from kernelbench.harness import resolve_device
    from kernelbench.peak import cache_path, cached_peak

    dev = resolve_device(device)
    found = cached_peak(dev, remeasure=remeasure)
    for kind, entry in found.items():
        value = f"{entry['gbs']:.1f} GB/s" if "gbs" in entry else f"{entry['tops']:.3g} TOPS"
        console.print(f"{kind:>9}: {value}  [dim]{escape(entry['note'])}[/dim]")
    console.print(f"cached in {cache_path(device_class(dev))}")


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
        raise fail(str(exc)) from None
    console.print(f"baseline written: {dest}")


@baseline_app.command("path")
def baseline_path(
    device: str = typer.Option("cpu", help="cpu | cuda"),
    baselines_dir: Path = typer.Option(Path("reports/baselines"), help="Where baselines live"),
) -> None:
    """Print the baseline folder of this machine's device class (exit 1 when there is none)."""
    import torch

    from kernelbench.baseline import find_baseline
    from kernelbench.env import device_class

    found = find_baseline(device_class(torch.device(device)), baselines_dir)
    if found is None:
        console.print(f"no baseline for {device_class(torch.device(device))}", style="yellow")
        raise typer.Exit(1)
    typer.echo(str(found))


def _write_report(dirs: list[Path], output: Path | None, strict: bool = False) -> None:
    """Write the HTML report; a run's own report is a courtesy (a problem is a warning), the
    ``report`` command's is the point (a problem is exit 2)."""
    from kernelbench.results import SchemaError

    try:
        from kernelbench.report import write_report

        with skipped_lines_reported():
            path = write_report(dirs, output)
    except (ImportError, SchemaError, OSError) as exc:
        if strict:
            raise fail(f"no report written: {exc}") from None
        typer.echo(f"warning: no report written: {' '.join(str(exc).split())}", err=True)
        return
    console.print(f"report: {escape(str(path))}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
