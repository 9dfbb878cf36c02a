"""The ``kernelbench`` command (typer + rich).

Nothing heavy is imported at module level (no torch, no pandas): ``kernelbench --help`` answers
at once, and each command imports what it needs. Bad input of any kind ends in one line on
stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from kernelbench.cli.common import (
    between_runs_line,
    console,
    err_console,
    fail,
    skipped_lines_reported,
    write_report,
)
from kernelbench.run import profiles
from kernelbench.run.profiles import PROFILES
from kernelbench.settings import SETTINGS, SettingError, check

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="kernelbench: int8 matmul kernels (LLM.int8()), timed and checked against float64.",
)
#: kernelbench.run.cases.DISTRIBUTIONS, without importing torch (a test keeps them equal)
DISTRIBUTIONS = ("outliers", "gaussian", "paper-bench")


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
    from kernelbench.backends import add_backend_files

    try:
        add_backend_files(paths)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _backend_version(backend, origin) -> str:
    """Where a backend comes from, with the version of the code it measures: a peer's own
    distribution version, kernelbench's for built-in code, the plugin's for a plugin."""
    import importlib.metadata

    if origin.third_party:
        return origin.label()
    if not backend.library:
        return f"builtin, kernelbench {origin.version}"
    try:
        version = importlib.metadata.version(backend.library)
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    return f"builtin, {backend.library} {version}"


@app.command("list")
def list_backends(
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Full reasons, what each backend printed while loading, and its description",
    ),
    backend_file: list[Path] = typer.Option(
        None, "--backend-file", metavar="FILE", help=BACKEND_FILE_HELP
    ),
) -> None:
    """Every backend and method, per device: runs here, or the reason why not; where each
    backend came from (built in, an installed plugin, a file) and its version. One block per
    backend; lines wrap at word boundaries, never cutting a name."""
    _use_backend_files(backend_file)
    import textwrap

    import torch

    from kernelbench.backends import all_backends
    from kernelbench.backends.base import sixteen_bit_dtype
    from kernelbench.backends.plugins import origin_of
    from kernelbench.kernels import cpu_ext
    from kernelbench.results.view import short_reason

    width = max(console.width, 60)

    def say(text: str, indent: str, first: str | None = None) -> None:
        lines = textwrap.wrap(
            text,
            width=width,
            initial_indent=indent if first is None else first,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for line in lines or [indent if first is None else first]:
            console.print(escape(line), soft_wrap=True, highlight=False)

    for name, backend in all_backends().items():
        origin = origin_of(name)
        console.print(
            f"[bold]{escape(name)}[/bold]  ({escape(_backend_version(backend, origin))})",
            soft_wrap=True,
            highlight=False,
        )
        details: list[str] = []
        for device in ("cpu", "cuda"):
            dev = torch.device(device)
            avail = backend.availability(dev)
            if avail:
                # what a run does: methods this backend skips on every shape are not listed
                dtype = sixteen_bit_dtype(dev)
                methods = [
                    m for m in backend.methods if backend.supports(m, dev, dtype, 256, 1024, 4096)
                ]
                line = "runs " + ", ".join(methods)
            else:
                line = "no: " + (avail.reason if verbose else short_reason(avail.reason))
            say(line, " " * 8, f"  {device:<6}")
            say(backend.verification(dev), " " * 8)
            if avail.detail and avail.detail not in details:
                details.append(avail.detail)
        if verbose:
            if backend.description:
                say("about: " + backend.description, " " * 4, "  ")
            for detail in details:
                console.print("  printed while loading:", highlight=False)
                for line in detail.splitlines():
                    say(line, " " * 6, "    ")
        elif details:
            console.print("  (printed messages while loading: see list -v)", highlight=False)
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    say(
        f"CPU kernel set: {cpu_ext.isa()}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; CUDA device: {cuda}",
        "  ",
        "",
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
    -128, outliers, alpha, zero tokens, bad inputs, stages, outputs that follow their input,
    against the float64 oracle) on one backend and print a pass/fail table. Exit code 1 names
    the failed contracts."""
    _use_backend_files(backend_file)
    if device not in ("cpu", "cuda"):
        raise fail(f"--device must be cpu or cuda, got {device!r}")
    from rich.table import Table

    from kernelbench.backends import all_backends
    from kernelbench.backends.contract import CONTRACTS, run_contract
    from kernelbench.backends.plugins import origin_of

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


def _help(name: str) -> str:
    """A setting's declared help text with its choices."""
    s = SETTINGS[name]
    return f"{s.help} ({' | '.join(s.choices)})" if s.choices else s.help


def _declared_option(name: str, metavar: str):
    """A typer option for setting ``name``: its declared default, help and bounds."""
    s = SETTINGS[name]
    return typer.Option(s.default, metavar=metavar, min=s.low, max=s.high, help=_help(name))


def _profiled_help(name: str) -> str:
    """A profile setting's help: its declared text, then its value in each profile."""
    values = [f"{p}: {getattr(profile, name):g}" for p, profile in PROFILES.items()]
    return f"{SETTINGS[name].help} ({'; '.join(values)})"


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
        + " (without --profile: default). Flags given explicitly win",
    ),
    rounds: int = typer.Option(None, metavar="N", help=_profiled_help("rounds")),
    ci_target: float = typer.Option(None, metavar="FRACTION", help=_profiled_help("ci_target")),
    extra_rounds: int = typer.Option(None, metavar="N", help=_profiled_help("extra_rounds")),
    extra_share: float = typer.Option(None, metavar="FRACTION", help=_profiled_help("extra_share")),
    threads: int = typer.Option(None, metavar="N", help=SETTINGS["threads"].help),
    budget: float = typer.Option(None, metavar="SECONDS", help=_profiled_help("budget_s")),
    max_call: float = typer.Option(None, metavar="SECONDS", help=_profiled_help("max_call_s")),
    core_wait: float = typer.Option(None, metavar="SECONDS", help=_profiled_help("core_wait_s")),
    alpha: float = typer.Option(SETTINGS["alpha"].default, help=SETTINGS["alpha"].help),
    outlier_cmp: str = typer.Option(
        SETTINGS["outlier_cmp"].default, metavar="OP", help=SETTINGS["outlier_cmp"].help
    ),
    outlier_weights: str = typer.Option(
        SETTINGS["outlier_weights"].default, metavar="NAME", help=SETTINGS["outlier_weights"].help
    ),
    cache: str = typer.Option(SETTINGS["cache"].default, metavar="MODE", help=_help("cache")),
    error_rows: int = typer.Option(None, metavar="N", help=_profiled_help("error_rows")),
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
            extra_share=extra_share,
            threads=threads,
            core_wait_s=core_wait,
        )
        check("alpha", alpha)
        check("outlier_cmp", outlier_cmp)
        check("outlier_weights", outlier_weights)
        check("cache", cache)
    except SettingError as exc:
        raise fail(str(exc)) from None
    if dist is not None and dist not in DISTRIBUTIONS:
        raise fail(f"--dist must be one of {', '.join(DISTRIBUTIONS)}, got {dist!r}")
    from kernelbench.cli.sweep import RunRequest, run_sweep

    req = RunRequest(
        profile=chosen,
        case=case,
        backends=_csv(backends),
        methods=_csv(methods),
        layer=layer,
        dist=dist,
        activations=activations,
        device=device,
        out=out,
        resume=resume,
        alpha=alpha,
        outlier_cmp=outlier_cmp,
        outlier_weights=outlier_weights,
        executor=executor,
        address=address,
        sizes_given=dims is not None,
        cache=cache,
    )
    run_sweep(req, no_report)


@app.command()
def accuracy(
    sizes: str = typer.Option(
        "gpt3", metavar="CASE|DIMS", help="A case name, or a comma list of its model dims"
    ),
    case: str = typer.Option("gpt3", metavar="NAME", help="Case (cases/NAME.toml) of the dims"),
    methods: str = typer.Option(
        None, metavar="LIST", help="Comma list (default: every Table 1 row and today's schemes)"
    ),
    layer: str = typer.Option(None, metavar="NAME", help="Layer (default: the case's)"),
    dist: str = typer.Option("outliers", metavar="NAME", help="outliers | gaussian | paper-bench"),
    activations: Path = typer.Option(
        None, metavar="FILE", help="Your own activations, .pt or .npy, shape (tokens, d)"
    ),
    seeds: int = _declared_option("seeds", "N"),
    tokens: int = _declared_option("study_tokens", "N"),
    error_rows: int = _declared_option("study_error_rows", "N"),
    error_cols: int = _declared_option("study_error_cols", "N"),
    out: Path = typer.Option(
        Path("results/accuracy"),
        metavar="DIR",
        help="Output directory (an earlier run there is moved aside)",
    ),
) -> None:
    """The error study alone (no timing): every Table 1 int8 variant, SmoothQuant, int8
    weight-only and fp8 x size x seed, against float64, next to the 16-bit baseline."""
    import dataclasses
    import sys

    import torch

    from kernelbench.checks import InputError
    from kernelbench.core import ALL_METHODS
    from kernelbench.report.console import print_accuracy
    from kernelbench.results import schema as res
    from kernelbench.run import accuracy as study
    from kernelbench.run import env as run_env
    from kernelbench.run.cases import load_activation_file, load_case

    try:
        the_case = load_case(sizes if sizes and not sizes[0].isdigit() else case)
        dims = _csv_ints(sizes, "--sizes") if sizes and sizes[0].isdigit() else None
        d_models = dims or tuple(s.d_model for s in the_case.sizes)
        for d in d_models:
            the_case.size(d)
        the_layer = layer or the_case.default_layer
        for d in d_models:
            the_case.shape(the_layer, d)
        chosen = _csv(methods) or study.STUDY_METHODS
        unknown = [m for m in chosen if m not in ALL_METHODS]
        if unknown:
            raise InputError(f"unknown method(s) {', '.join(unknown)}; known: "
                             f"{', '.join(ALL_METHODS)}")  # fmt: skip
        acts, the_dist = None, dist
        if activations is not None:
            acts, the_dist = load_activation_file(activations), f"file:{activations}"
        elif dist not in DISTRIBUTIONS:
            raise InputError(f"unknown distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")
        res.check_out_dir(out, move_old=True)
    except (InputError, res.RunDirError) as exc:
        raise fail(str(exc)) from None
    if res.holds_run(out):
        console.print(f"an earlier run in {out} was moved to {res.move_aside(out)}")
    opts = study.StudyOptions(
        case=the_case, d_models=tuple(d_models), layer=the_layer, dist=the_dist, seeds=seeds,
        tokens=tokens, error_rows=error_rows, error_cols=error_cols, methods=tuple(chosen),
        activations=acts,
    )  # fmt: skip
    cpu = torch.device("cpu")
    settings = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    settings = {k: v for k, v in settings.items() if k not in ("case", "activations")}
    env = run_env.collect(
        cpu, ["accuracy", *sys.argv[2:]],
        {"study": "accuracy", "seed": the_case.seed, "quant": dataclasses.asdict(opts.cfg),
         "accuracy": {k: str(v) if k in ("dtype", "cfg") else v for k, v in settings.items()}},
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    res.write_env(out, env)
    writer = res.ResultsWriter(out)
    rows: list = []

    def keep(row) -> None:
        writer.append(row)
        rows.append(row)

    try:
        study.study(opts, env["device_class"], keep)
    except InputError as exc:
        raise fail(str(exc)) from None
    print_accuracy(rows, console)
    console.print(f"rows written to {out}")


@app.command()
def show(
    run_dir: Path,
    skipped: bool = typer.Option(
        False, "--skipped", help="List rows not measured as a full table, not one line a reason"
    ),
    wide: bool = typer.Option(False, "--wide", help="List every wide row, not only the widest"),
    states: bool = typer.Option(
        False,
        "--states",
        help="Speedups split by the host's state (where it ran the threads, close together or "
        "apart, read before each cold CPU call; else the bus's reading), when the readings "
        "fall in two groups",
    ),
) -> None:
    """Print the headline and tables of a saved run again."""
    from kernelbench.report.console import print_state_tables, print_tables
    from kernelbench.results.schema import SchemaError
    from kernelbench.results.view import load_view, state_view

    try:
        with skipped_lines_reported():
            df = load_view(run_dir)  # its attrs carry the run's interval target
    except SchemaError as exc:
        raise fail(str(exc)) from None
    # the headline and the state tables split the same readings: once
    by_state = state_view(df) if states else None
    print_tables(
        df,
        console,
        skipped_table=skipped,
        all_wide=wide,
        states=by_state,
        between_line=between_runs_line(run_dir, df["device_class"].unique()),
    )
    if states:
        print_state_tables(df, console, by_state)


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory, or two for A/B"),
    output: Path = typer.Option(None, "-o", "--output", help="HTML file to write"),
    baselines: Path = typer.Option(
        Path("reports/baselines"), help="Where kept baselines and their spreads are (A/B)"
    ),
) -> None:
    """Write a self-contained HTML report (two directories: side by side with ratios)."""
    if len(run_dirs) not in (1, 2):
        raise fail("give one run directory, or two for an A/B report")
    write_report(run_dirs, output, strict=True, baselines=baselines)


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
    between_runs: bool = typer.Option(
        True,
        help="Add the spread between runs kept for the runs' processor (kernelbench spread) "
        "to each run's noise",
    ),
    baselines: Path = typer.Option(
        Path("reports/baselines"), help="Where kept baselines and their spreads are"
    ),
) -> None:
    """Gate NEW against BASE: exit 0 (no regression), 1 (regression), 2 (unusable input),
    3 (the machines are not comparable: speed not judged)."""
    from kernelbench.results.compare import (
        FORMATS,
        compare_loaded_runs,
        compare_runs,
        load_run,
        render,
    )
    from kernelbench.results.schema import SchemaError
    from kernelbench.results.spread import SpreadError, machine_of, spread_for

    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}")
    try:
        runs = load_run(base), load_run(new)
    except SchemaError:
        runs = None  # compare_runs says what is wrong with the input
    spread = None
    if between_runs and runs is not None:
        try:
            spread = spread_for(*(machine_of(r.device_classes, r.env) for r in runs), baselines)
        except SpreadError as exc:
            raise fail(str(exc)) from None
    try:
        if runs is None:
            result = compare_runs(base, new, speed_tol, error_tol, backend or None)
        else:
            result = compare_loaded_runs(*runs, speed_tol, error_tol, backend or None, spread)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if result.problem:
        # unusable input is an error like any other: one line on stderr; the machine-readable
        # formats still write their document (with the problem in it) to stdout
        typer.echo(f"error: unusable input: {' '.join(result.problem.split())}", err=True)
        if fmt != "text":
            typer.echo(render(result, fmt), nl=False)
        raise typer.Exit(result.exit_code)
    typer.echo(render(result, fmt), nl=False)
    raise typer.Exit(result.exit_code)


@app.command()
def spread(
    runs: list[Path] = typer.Argument(..., help="Runs of one machine, two or more of a commit"),
    save: bool = typer.Option(
        False, help="Keep it in gate.json beside the processor's baseline, for compare"
    ),
    baselines: Path = typer.Option(
        Path("reports/baselines"), help="Where kept baselines and their spreads are"
    ),
) -> None:
    """How far runs of one commit on this machine differ beyond their own intervals: the
    spread per run that ``compare`` adds to each run's noise."""
    from kernelbench.results.spread import SpreadError, measure_spread, save_spread

    try:
        fit = measure_spread(runs)
    except SpreadError as exc:
        raise fail(str(exc)) from None
    beyond = sum(p.beyond() for p in fit.pairs)
    lines = [
        f"{fit.device_class} ({fit.processor or 'processor not recorded'}): {fit.spread.source}",
        f"beyond their own 95% intervals: {beyond} of {len(fit.pairs)} pairs "
        f"({fit.beyond_share:.1%}; 5% if they covered what the next run reads)",
        f"spread between runs: {fit.spread.describe()}",
    ]
    for name, value in sorted(fit.spread.by_backend.items()):
        pairs = [p for p in fit.pairs if p.backend == name]
        own = sum(p.beyond() for p in pairs)
        left = sum(p.beyond(value) for p in pairs)
        lines.append(f"  {name}: {len(pairs)} pairs, {own} beyond their intervals, {left} with it")
    for tokens in sorted({p.tokens for p in fit.pairs}):
        pairs = [p for p in fit.pairs if p.tokens == tokens]
        own = sum(p.beyond() for p in pairs)
        left = sum(p.beyond(fit.spread.for_row(p.backend, p.tokens)) for p in pairs)
        each = sorted(fit.spread.by_backend_tokens.items())
        figures = (
            [f"+-{fit.spread.by_tokens[tokens]:.1%}"] if tokens in fit.spread.by_tokens else []
        )
        figures += [", ".join(f"{b} +-{at[tokens]:.1%}" for b, at in each if tokens in at)]
        figure = f" ({'; '.join(f for f in figures if f)})" if any(figures) else ""
        lines.append(
            f"  {tokens} tokens{figure}: {len(pairs)} pairs, {own} beyond their intervals, "
            f"{left} with the spread"
        )
    if save:
        try:
            path = save_spread(fit, baselines)
        except (SpreadError, OSError) as exc:
            raise fail(str(exc)) from None
        lines.append(f"kept in {path}")
    typer.echo("\n".join(lines))


@app.command()
def merge(
    out: Path = typer.Argument(..., help="Run directory to write (its results.jsonl is replaced)"),
    runs: list[Path] = typer.Argument(..., help="Two or more runs of the same sweep"),
) -> None:
    """Pool the samples of several runs (rounds) of one sweep into one run, e.g. for a baseline
    or a CI gate that must not hinge on one disturbed round."""
    from kernelbench.results.merge import write_merged
    from kernelbench.results.schema import SchemaError

    if out.exists() and not out.is_dir():
        raise fail(f"{out} is a file, not a run directory")
    try:
        with skipped_lines_reported():
            rows = write_merged(runs, out)
    except (SchemaError, OSError) as exc:
        raise fail(str(exc)) from None
    ok = sum(r.status == "ok" for r in rows)
    console.print(f"merged {len(runs)} runs: {len(rows)} rows ({ok} ok) -> {out}")


def _peak_amount(value: float, field: str) -> str:
    """A peak figure as ``kernelbench peak`` prints it: GB/s to 0.1, TOPS to 3 digits."""
    return f"{value:.1f}" if field == "gbs" else f"{value:.3g}"


@app.command()
def peak(
    device: str = typer.Option("auto", help="cpu | cuda | auto"),
    remeasure: bool = typer.Option(
        False, "--remeasure", metavar="", help="Measure again even if cached"
    ),
) -> None:
    """Measure (once per device class, then cached) this device's int8, 16-bit and fp32 GEMM
    peaks and memory bandwidth: every run's rooflines. Measured on a quiet machine only (other
    processes' CPU and steal checked before and during; retried, then refused, exit 2)."""
    from kernelbench.run.env import device_class
    from kernelbench.run.peak import PeakRefused, cache_path, cached_peak
    from kernelbench.run.plan import resolve_device

    dev = resolve_device(device)
    try:
        found = cached_peak(dev, remeasure=remeasure)
    except PeakRefused as exc:
        raise fail(str(exc)) from None
    for kind, entry in found.items():
        field, unit = ("gbs", "GB/s") if "gbs" in entry else ("tops", "TOPS")
        value = f"{_peak_amount(entry[field], field)} {unit}"
        console.print(f"{kind:>9}: {value}  [dim]{escape(entry['note'])}[/dim]")
        lower = entry.get("remeasured")
        if lower:
            again = f"{_peak_amount(lower[field], field)} {unit}"
            console.print(
                f"{'':>9}  kept: this measurement read {again} (a best call is a lower bound)"
            )
        readings = entry.get("readings") or []
        if len(readings) > 1:
            console.print(
                f"{'':>9}  {len(readings)} quiet readings on this processor: "
                f"{_peak_amount(min(readings), field)}-{_peak_amount(max(readings), field)}"
            )
        for placed in entry.get("placements") or []:
            console.print(
                f"{'':>9}  threads' round trip about {placed['link_ns']:.0f} ns: best "
                f"{_peak_amount(placed['gbs'], field)} {unit} ({placed.get('calls', '?')} calls)"
            )
    console.print(f"cached in {cache_path(device_class(dev))}")


baseline_app = typer.Typer(
    help="Kept baselines under reports/baselines/<device class>/<processor>/."
)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("update")
def baseline_update(
    run_dir: Path,
    baselines_dir: Path = typer.Option(Path("reports/baselines"), help="Where baselines live"),
    force: bool = typer.Option(False, help="Accept a run with failed rows"),
) -> None:
    """Make RUN_DIR the baseline of its device class (results.jsonl + env.json)."""
    from kernelbench.results.baseline import GATE_FILE, BaselineError, update_baseline

    try:
        dest = update_baseline(run_dir, baselines_dir, force=force)
    except BaselineError as exc:
        raise fail(str(exc)) from None
    console.print(f"baseline written: {dest}")
    if (dest / GATE_FILE).is_file():
        console.print(
            f"{escape(str(dest / GATE_FILE))} keeps the speed tolerance measured on the old "
            "rounds: measure it again on these (scripts/gate_noise.py)",
            style="yellow",
        )


@baseline_app.command("path")
def baseline_path(
    device: str = typer.Option("cpu", help="cpu | cuda"),
    baselines_dir: Path = typer.Option(Path("reports/baselines"), help="Where baselines live"),
) -> None:
    """Print the baseline folder of this machine's device class and processor (its own, else
    another of the class; exit 1 when the class has none)."""
    import torch

    from kernelbench.results.baseline import find_baseline
    from kernelbench.results.compare import processor_key
    from kernelbench.run.env import cpu_identity, device_class

    dev = torch.device(device)
    dclass = device_class(dev)
    processor = processor_key({"cpu": {"identity": cpu_identity()}}) if dev.type == "cpu" else None
    found = find_baseline(dclass, baselines_dir, processor)
    if found is None:
        console.print(f"no baseline for {dclass}", style="yellow")
        raise typer.Exit(1)
    if processor and found.name != processor:
        # stderr: stdout is the path alone (scripts read it)
        err_console.print(f"no baseline for this processor ({processor}); using {found}")
    typer.echo(str(found))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
