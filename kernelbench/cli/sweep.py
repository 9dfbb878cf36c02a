"""``kernelbench run`` once its options are checked: load and check everything the run needs,
open the output directory (an earlier run moved aside, or resumed with the same settings), then
measure every row with progress and write it as it comes.

Nothing reaches ``--out`` before every input has been checked; each problem ends in one
``error:`` line and exit 2 (:func:`kernelbench.cli.commands.fail`).
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.markup import escape

# The readers the end of a run uses (torch-free; report.console loads the report package
# write_report uses), imported with this module, when the run starts: imported at the end, they
# would be whatever the package's files hold by then, and a package changed during an
# hours-long sweep (reinstalled, or its checkout moved on) failed there, after the rounds.
from kernelbench.cli.common import (
    between_runs_line,
    console,
    fail,
    skipped_lines_reported,
    write_report,
)
from kernelbench.report.console import print_tables
from kernelbench.results import schema as res
from kernelbench.results.compare import processor_key
from kernelbench.results.physics import ABOVE_ROOFLINE, peaks
from kernelbench.results.view import busy_note, flagged, load_view, marked
from kernelbench.run import profiles
from kernelbench.settings import default

EXIT_INTERRUPTED = 130
#: env.json: the seconds the run's planned rounds took, over every process that ran them.
PLANNED_KEY = "planned_rounds_s"
#: env.json: each cell's last measured time (the pacer's memory), for a resumed run.
CELLS_KEY = "cell_seconds"


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """Everything ``run`` was asked, checked for ranges, before torch is imported; what was
    not asked is ``None`` (the case's or the backends' own choice) or the declared default."""

    profile: profiles.Profile
    case: str
    device: str
    out: Path
    executor: str
    backends: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    layer: str | None = None
    dist: str | None = None
    activations: Path | None = None
    resume: bool = False
    alpha: float = default("alpha")
    outlier_cmp: str = default("outlier_cmp")
    outlier_weights: str = default("outlier_weights")
    address: str | None = None
    #: --sizes named model dims; otherwise a profile's sizes are a preference (see _sizes).
    sizes_given: bool = False
    cache: str = default("cache")


def _sizes(req: RunRequest, case) -> tuple[int, ...] | None:
    """The model dims to run: the user's, or the profile's that the case has (a profile's
    CI-sized dims are GPT-3's), else the case's two smallest."""
    wanted = req.profile.sizes
    if wanted is None or req.sizes_given:
        return wanted
    dims = sorted({s.d_model for s in case.sizes})
    return tuple(d for d in wanted if d in dims) or tuple(dims[:2])


def _settings(req: RunRequest, prep: _Prepared, dclass: str, threads: int) -> dict:
    """What every row of a run shares, and the sweep's definition (tokens, sizes, layer,
    backends, methods); ``--resume`` refuses to mix rows of other settings or extend the
    sweep to other rows."""
    p = req.profile
    opts, case = prep.opts, prep.case

    def listed(values) -> list | None:
        return None if values is None else list(values)

    return {
        "case": req.case,
        "tokens": listed(opts.tokens or case.default_tokens),
        "sizes": listed(opts.sizes),
        "layer": opts.layer or case.default_layer,
        "backends": listed(opts.backends),
        "methods": listed(opts.methods),
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
        "extra_share": p.extra_share,
        "extra_round_budget_s": p.extra_round_budget_s,
        "cache": req.cache,
        "core_wait_s": p.core_wait_s,
        "device_class": dclass,
        "threads": threads,
    }


@dataclass
class _Prepared:
    case: object  # kernelbench.run.cases.Case
    opts: object  # kernelbench.run.cell.RunOptions
    items: list
    pairs: list[tuple[str, str]]
    runner: object  # an executor
    device: object  # torch.device
    env: dict


def _prepare(req: RunRequest) -> _Prepared:
    """Load and check everything the run needs (case, activations, executor), writing nothing."""
    import torch

    from kernelbench.measure.engine import TimerSettings
    from kernelbench.quant import QuantConfig
    from kernelbench.run import env as envmod
    from kernelbench.run.cases import load_activation_file, load_case
    from kernelbench.run.executors import get_executor
    from kernelbench.run.plan import RunOptions, method_pairs, plan, resolve_device

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
            sizes=_sizes(req, the_case),
            tokens=p.tokens,
            layer=req.layer,
            dist=req.dist,
            backends=req.backends,
            methods=req.methods,
            device=dev.type if local else req.device,
            cfg=QuantConfig(req.alpha, req.outlier_cmp, req.outlier_weights),
            # a round stops sampling a row once its own interval meets the run's target: the
            # pooled interval (over rounds) is what the run reports and extends
            timer=TimerSettings(
                budget_s=p.budget_s,
                warmup_s=p.warmup_s,
                ci_target=p.ci_target,
                min_pairs=p.min_pairs,
                core_wait_s=p.core_wait_s,
            ),
            max_call_s=p.max_call_s,
            error_rows=p.error_rows,
            activations=req.activations,
            rounds=p.rounds,
            ci_target=p.ci_target,
            extra_rounds=p.extra_rounds,
            extra_share=p.extra_share,
            extra_round_budget_s=p.extra_round_budget_s,
            cache=req.cache,
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
    from kernelbench.backends import backend_status
    from kernelbench.kernels import cpu_ext

    env = envmod.collect(
        dev, sys.argv[1:], kernel_isa=cpu_ext.isa(), huge_pages=cpu_ext.huge_page_setting()
    )
    env["backends"] = backend_status(dev, names=dict.fromkeys(b for b, _ in pairs))
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


def run_sweep(req: RunRequest, no_report: bool) -> None:
    """The whole run: checks, the output directory, the sweep, the tables and the report."""
    prep = _prepare(req)
    try:
        res.check_out_dir(req.out, move_old=not req.resume)
    except res.RunDirError as exc:
        raise fail(str(exc)) from None
    settings = _settings(req, prep, prep.env["device_class"], prep.env["threads"])
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
    earlier: list[dict] = []
    if req.resume:
        note = writer.repair_tail()
        if note:
            console.print(escape(note))
        earlier = writer.written_rows()
        done = writer.done_keys(earlier)
    _write_env(req, prep, settings, old_env)
    _sweep(req, prep, writer, done, earlier)
    filled = res.complete_speedups(req.out)
    if filled:
        console.print(f"{filled} row(s) got their speedup from their cell's earlier baseline row")
    view = _remeasure_exceeded_peak(req, prep)
    with skipped_lines_reported():
        line = between_runs_line(req.out, view["device_class"].unique())
        print_tables(view, console, between_line=line)
    if not no_report:
        write_report([req.out], None)


def _write_env(req: RunRequest, prep: _Prepared, settings: dict, old_env: dict) -> None:
    from dataclasses import asdict

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
        extra_share=opts.extra_share,
        quant=asdict(opts.cfg),
        profile=req.profile.name,
    )
    env["cache"] = _cache_env(opts.cache, opts.device)
    if opts.device != "cuda":
        from kernelbench.measure.timing import allocator_note

        env["cpu_memory_while_timing"] = allocator_note()
    env[res.SETTINGS_KEY] = settings
    if old_env.get("started_at"):
        env["first_started_at"] = old_env.get("first_started_at") or old_env["started_at"]
    # what the earlier processes learnt (their load, their planned rounds' seconds, their cells'
    # times): this one's is added when it ends
    for learnt in ("load", PLANNED_KEY, CELLS_KEY, res.EXTRA_KEY, res.LEFT_OUT_KEY):
        if learnt in old_env:
            env[learnt] = old_env[learnt]
    # every command that wrote rows here: the first run, then each --resume
    earlier = old_env.get("commands") or ([old_env["command"]] if old_env.get("command") else [])
    env["commands"] = [*earlier, env["command"]]
    if hasattr(prep.runner, "cluster_env"):
        try:
            env["hosts"] = prep.runner.cluster_env(opts.device)["hosts"]
        except Exception as exc:  # noqa: BLE001 - per-host env is informative
            console.print(f"[yellow]no per-host env: {escape(str(exc))}[/yellow]")
    if req.executor == "local":  # rooflines: this device class's measured peaks (cached)
        from kernelbench.run.peak import PeakRefused, cached_peak, cached_peak_exists

        if not cached_peak_exists(prep.device):
            console.print("measuring this device's peaks once (kernelbench peak), 1-2 min ...")
        try:
            env["peak"] = {**env.get("peak", {}), **cached_peak(prep.device)}
        except PeakRefused as exc:  # the run goes on without rooflines
            console.print(f"[yellow]{escape(str(exc))}; no rooflines in this run[/yellow]")
    prep.env.update(env)
    res.write_env(req.out, env)
    prep.opts = _with_fp32_peak(prep.opts, prep.env)


def _with_fp32_peak(opts, env: dict):
    """``opts`` with the fp32 peak of ``env`` (as the rooflines read it: :func:`peaks`), where
    it has one: fp32's later rounds are then chosen alike in every run of the machine."""
    import math
    from dataclasses import replace

    tops = peaks(env, env.get("device_class")).get("fp32", {}).get("tops")
    if tops is None or not math.isfinite(tops):
        return opts
    return replace(opts, fp32_peak_tops=tops)


def _remeasure_exceeded_peak(req: RunRequest, prep: _Prepared):
    """Rows above their roofline: the cached peak was measured in a slower moment of the
    machine (a host that shares its cores out reads 11-17% apart between quiet readings), or
    in another placement of the threads than some of the rows' calls (``above_peak``: the
    peak has no figure for theirs), or the row is wrong. Measure the peaks again, once (quiet
    by their own checks; the cache keeps each placement's best call and adds the ones it had
    not seen), and read the run against them; rows still above make it read the bandwidth
    again in their calls' placements (:func:`_reread_in_placements`): a row still above
    stays flagged. Returns the run's view, read against the peaks it ends with."""
    from kernelbench.run.peak import PeakRefused, cached_peak

    view = load_view(req.out)
    above = _rows_above_roofline(view)
    if req.executor != "local" or not above:
        return view
    console.print(
        f"{above} row(s) faster than the cached peaks allow: measuring the peaks again "
        "(kernelbench peak --remeasure), 1-2 min ..."
    )
    try:
        fresh = cached_peak(prep.device, remeasure=True)
    except PeakRefused as exc:
        said = f"{escape(str(exc))}; the rows are read against the cached peaks"
        console.print(f"[yellow]{said}[/yellow]")
        return view
    view = _read_against(req, fresh)
    still = _rows_above_roofline(view)
    console.print(f"against the peaks measured again: {still} of the {above} row(s) still above")
    if still:
        view = _reread_in_placements(req, prep, view)
    return view


def _read_against(req: RunRequest, peak: dict, **more):
    """The run's view read against ``peak`` (written into its env.json, with ``more``)."""
    env = res.load_env(req.out)
    env["peak"] = {**env.get("peak", {}), **peak}
    env.update(more)
    res.write_env(req.out, env)
    return load_view(req.out)


def _reread_in_placements(req: RunRequest, prep: _Prepared, view):
    """Rows still above after the peaks were measured again, in a placement of the threads
    the re-measurement may not have run in: read the bandwidth again in their calls'
    placements, waiting for the host to run the threads there (:func:`~kernelbench.run.peak.
    reread_bandwidth`), and say which it did not; recorded in env.json's ``peak_reread``."""
    from kernelbench.run.peak import PLACEMENT_WAIT_S, PeakRefused, placements_of, reread_bandwidth

    above = _above_roofline(view)
    cold = view[above & (view["cache"] == "cold")] if "cache" in view else view.iloc[:0]
    links = [v for calls in cold.get("link_ns", []) if isinstance(calls, list) for v in calls]
    targets = placements_of(links)
    if not targets:
        return view
    where = ", ".join(f"{t:.0f} ns" for t in targets)
    console.print(
        f"reading the bandwidth again where the host ran those rows' threads (round trip "
        f"{where}), waiting up to {PLACEMENT_WAIT_S:.0f} s for it to run them there ..."
    )
    try:
        got = reread_bandwidth(prep.device, targets)
    except PeakRefused as exc:
        console.print(
            f"[yellow]{escape(str(exc))}; the rows are read against the cached peaks[/yellow]"
        )
        return view
    reread = {
        "placements_ns": targets,
        "read": got.read,
        "missed": got.missed,
        "waited_s": round(got.waited_s, 1),
    }
    view = _read_against(req, got.peak, peak_reread=reread)
    said = f"{_rows_above_roofline(view)} row(s) still above"
    if got.missed:
        missed = ", ".join(f"{t:.0f} ns" for t in got.missed)
        said += (
            f"; in {got.waited_s:.0f} s the host did not run the threads where their round "
            f"trip read {missed}: that placement's figure was not read again "
            "(kernelbench peak --remeasure when it does)"
        )
    console.print(f"against the bandwidth read again: {said}")
    return view


def _rows_above_roofline(view) -> int:
    """Rows flagged above their roofline, and those above the measured peak's only where it
    has no figure for their calls' placement."""
    return int(_above_roofline(view).sum())


def _above_roofline(view):
    return flagged(view, ABOVE_ROOFLINE) | marked(view, "above_peak")


def _cache_env(mode: str, device: str) -> dict:
    """env.json's ``cache``: the mode, and on the CPU the cache sizes that bound hot rows and
    the bytes its scan reads before each timed call of a cold one (``scan_flushed``: a scan
    shorter than twice the last-level cache, its buffer flushed after each read)."""
    entry: dict = {"mode": mode}
    if device != "cuda":
        from kernelbench.measure.timing import cache_sizes, evict_bytes, scan_flushed

        entry["levels"] = cache_sizes()
        if mode == "cold":
            entry["evict_bytes"] = evict_bytes(entry["levels"])
            entry["scan_flushed"] = scan_flushed(entry["evict_bytes"], entry["levels"])
    return entry


def resume_command(argv: list[str]) -> str:
    """The command line that resumes the run ``argv`` started."""
    args = list(argv) if "--resume" in argv else [*argv, "--resume"]
    return shlex.join(["kernelbench", *args])


def _sweep(req: RunRequest, prep: _Prepared, writer, done: set, earlier: list[dict]) -> None:
    """Measure and write every row (then the extra rounds the run's uncertain rows get), with
    progress; ^C ends with a one-line summary and exit 130. ``earlier``: the rows a resumed
    run found written."""
    from kernelbench.cli.progress import CostModel, sweep_progress
    from kernelbench.run.cell import link_probe
    from kernelbench.run.load import LoadWatch
    from kernelbench.run.plan import (
        CellPacer,
        extra_round_budget,
        followup_items,
        max_call_s,
        round_allowance,
    )

    # one class name covers processors 2x apart: name this one (vendor-family-model-stepping)
    processor = processor_key(prep.env)
    machine = prep.env["device_class"] + (f" ({processor})" if processor else "")
    console.print(
        f"kernelbench run: {len(prep.items)} cells x {len(prep.pairs)} (backend, method) pairs "
        f"on {escape(machine)}, {prep.env['threads']} threads -> {escape(str(req.out))}"
    )
    cost = CostModel(req.profile.budget_s, lambda pair: max_call_s(pair, req.profile.max_call_s))
    if earlier:  # resumed: the call-time estimates start from the calls measured before
        prep.runner.learn(earlier)
        cost.calls.record_rows(earlier)
    count = [0]
    # other processes' CPU is read as all of it less ours: Ray's workers would count as others
    watch = LoadWatch() if req.executor == "local" else None
    # where the host runs this process's threads now: an extra round adds pairs to that state
    probe = link_probe(prep.device) if req.executor == "local" else None
    # cells one at a time, timed: an extra round starts only the cells that fit its budget
    # (Ray's executor takes every item at once: no pacing)
    pacer = CellPacer() if req.executor == "local" else None
    if pacer is not None:  # resumed: the cells an earlier process timed are not free
        pacer.recall(prep.env.get(CELLS_KEY))
    # resumed: the planned and extra rounds' seconds the earlier processes spent
    planned_before_s = res.env_seconds(prep.env.get(PLANNED_KEY))
    extra_spent_s = res.env_seconds(prep.env.get(res.EXTRA_KEY))
    extra_budget_s = planned_s = None
    started = time.monotonic()
    try:
        with sweep_progress(console) as progress:
            task = progress.add_task("starting", total=None, rows=0)
            _measure(prep, prep.items, writer, done, cost, progress, task, count, watch, pacer)
            planned_s = time.monotonic() - started
            # a longer sweep gets longer extra rounds: a share of what its rounds took
            extra_budget_s = extra_round_budget(planned_before_s + planned_s, prep.opts)
            for extra in range(prep.opts.extra_rounds):
                next_round = prep.opts.rounds + extra
                # each round's share and what the earlier extra rounds left of theirs
                allowance = round_allowance(extra_budget_s, extra, extra_spent_s)
                # paced, the round's cells are chosen by their measured times as they start
                # (cells an earlier round passed over first in their tier); unpaced (Ray), by
                # an estimate from their calls
                more = followup_items(
                    res.read_rows(writer.path),
                    prep.env,
                    prep.items,
                    next_round,
                    None if pacer is not None else allowance,
                    row_budget_s=prep.opts.timer.budget_s,
                    link_now_ns=probe() if probe is not None else None,
                    waiting=pacer.waiting if pacer is not None else (),
                )
                if not more:
                    break
                began = time.monotonic()
                try:
                    _measure(
                        prep,
                        more,
                        writer,
                        done,
                        cost,
                        progress,
                        task,
                        count,
                        watch,
                        pacer,
                        budget_s=allowance,
                    )
                finally:
                    extra_spent_s += time.monotonic() - began
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
    finally:
        if planned_s is None:  # interrupted in the planned rounds
            planned_s = time.monotonic() - started
        _record_after(
            req.out,
            watch.summary() if watch is not None else None,
            extra_budget_s,
            planned_before_s + planned_s,
            pacer.memory() if pacer is not None else None,
            extra_spent_s,
            pacer.left_out() if pacer is not None and extra_budget_s is not None else None,
        )


def _record_after(
    out: Path,
    load: dict | None,
    extra_budget_s: float | None,
    planned_s: float,
    cells: list[dict] | None,
    extra_s: float = 0.0,
    left_out: list[dict] | None = None,
) -> None:
    """What the run learnt while it ran, into its env.json (also when interrupted): the load
    it ran under (said when busy), the seconds its planned rounds took and its extra rounds
    took (the earlier processes' included), what each extra round's share was, and its cells'
    last times, and the cells its extra rounds left out for their cost."""
    from kernelbench.run.load import combined_load

    env = res.load_env(out)
    if load is not None:
        env["load"] = combined_load(env.get("load"), load)
    env[PLANNED_KEY] = round(planned_s, 1)
    if extra_s > 0:
        env[res.EXTRA_KEY] = round(extra_s, 1)
    if left_out is not None:
        env[res.LEFT_OUT_KEY] = left_out
    if extra_budget_s is not None:
        env["extra_round_budget_s"] = round(extra_budget_s, 1)
    if cells is not None:
        env[CELLS_KEY] = cells
    res.write_env(out, env)
    if load and load.get("busy"):
        console.print(f"[yellow]{escape(busy_note(load))}[/yellow]")


def _measure(
    prep: _Prepared,
    items,
    writer,
    done,
    cost,
    progress,
    task,
    count: list,
    watch=None,
    pacer=None,
    budget_s: float | None = None,
) -> None:
    """Run ``items`` through the executor (paced by ``pacer``, which with ``budget_s`` leaves
    out the cells that would not fit it), writing each row; the bar advances by each row's
    estimated cost and names the row timed next."""
    remaining = _planned_rows(prep, items, done)
    spent = progress.tasks[0].completed if progress.tasks else 0.0
    progress.update(task, description=escape(_next_label(remaining)))
    fed = items if pacer is None else pacer.paced(items, budget_s)
    for item, row in prep.runner.run(fed, prep.case, prep.opts, done):
        writer.append(row)
        count[0] += 1
        if pacer is not None:
            pacer.note_row(item, row.status == "ok")
        if watch is not None:
            watch.mark()
        pair = (row.backend, row.method)
        flops, runs = remaining.pop((item, pair), (0.0, False))
        cost.record(pair, float(row.flops or 0.0), row.tokens, row.d_model, row.median_ms)
        # the finished row counts with its call now known: the ETA scales the model's units
        # by the seconds they took, which the planned estimate (call unknown) would skew
        if row.status == "ok":
            spent += cost.cost(pair, flops, item.tokens, runs, item.round == 0)
        left = sum(
            cost.cost(p, f, it.tokens, ok, it.round == 0) for (it, p), (f, ok) in remaining.items()
        )
        progress.update(
            task,
            completed=spent,
            total=spent + left,
            rows=count[0],
            description=escape(_next_label(remaining)),
        )
    if remaining:  # cells the pacer left out of the budget: no longer ahead
        progress.update(task, total=spent, description=escape(_next_label({})))


def _next_label(remaining: dict) -> str:
    """The row the executor measures next (rows come back in planned order)."""
    nxt = next(iter(remaining), None)
    return f"timing {nxt[0].label} {nxt[1][0]}/{nxt[1][1]}" if nxt else "finishing"


def _planned_rows(prep: _Prepared, items, done: set) -> dict:
    """(item, pair) -> (flops, runs here) of every row still to measure, in measuring order."""
    from kernelbench.backends import all_backends
    from kernelbench.backends.base import sixteen_bit_dtype
    from kernelbench.core import work_flops

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
            if (tuple(fields[c] for c in res.KEY_COLUMNS), item.round) in done:
                continue
            try:
                runs = bool(
                    backends[backend].supports(method, prep.device, dtype, item.tokens, k, n)
                )
            except Exception:  # noqa: BLE001 - only an estimate
                runs = True
            planned[(item, (backend, method))] = (flops, runs)
    return planned
