"""Self-contained HTML reports of kernelbench runs.

``write_report([DIR])`` renders one run to ``DIR/report.html``; ``write_report([A, B])``
compares two runs cell by cell (median time B / A) into ``B/compare.html``. The page needs no
network: inline CSS, no scripts, plots inline as SVG (their text kept as text), and a
Content-Security-Policy that forbids loading anything else. Every string taken from results or
env.json is escaped by jinja2's autoescape, or, inside a plot, by matplotlib's SVG writer.

Layers: :mod:`.data` (loading, selection), :mod:`.tables` (pivots), :mod:`.plots` (figures),
``template.html.j2`` (markup). Nothing here times anything.
"""

from __future__ import annotations

import datetime as _dt
from importlib import resources
from pathlib import Path

import jinja2

from kernelbench import __version__
from kernelbench.core import is_not_applicable
from kernelbench.report import data, plots, tables
from kernelbench.results.baseline import DEFAULT_DIR
from kernelbench.results.schema import KEY_COLUMNS
from kernelbench.results.spread import kept_spread_line, machine_of, spread_for, spread_line
from kernelbench.results.verdict import RunSpread
from kernelbench.results.view import (
    ci_target,
    headline,
    marked,
    peak_exceeded_note,
    precision_by_tokens_line,
    precision_line,
    slow_sixteen_bit_note,
    state_precision_lines,
    state_split_text,
    state_view,
)

__all__ = ["write_report", "render_report"]

TEMPLATE = "template.html.j2"


def write_report(
    run_dirs: list[Path], output: Path | None = None, baselines_dir: Path = DEFAULT_DIR
) -> Path:
    """Write the report of one run, or the A/B comparison of two, and return its path.

    One directory: ``<dir>/report.html`` unless ``output`` is given. Two directories (A, B):
    per-cell ratios B / A, written to ``output`` or ``<second dir>/compare.html``. The spread
    between runs kept in ``baselines_dir`` for the runs' processor is stated (one run) or in
    the verdicts (two, as ``compare``'s).
    """
    dirs = [Path(d) for d in run_dirs]
    if len(dirs) not in (1, 2):
        raise ValueError(f"a report takes one or two run directories, got {len(dirs)}")
    runs = [data.load_run(d) for d in dirs]
    default = "report.html" if len(runs) == 1 else "compare.html"
    out = Path(output) if output is not None else runs[-1].path / default
    out.parent.mkdir(parents=True, exist_ok=True)
    a, b = (machine_of(set(r.ok["device_class"]), r.env) for r in (runs[0], runs[-1]))
    if len(runs) == 1:
        html = render_report(runs, between_line=kept_spread_line(a, baselines_dir))
    else:
        html = render_report(runs, spread_for(a, b, baselines_dir))
    out.write_text(html, encoding="utf-8")
    return out


def render_report(
    runs: list[data.Run], between: RunSpread | None = None, between_line: str | None = None
) -> str:
    """``between``: the spread between runs kept for the runs' processor (``None``: none).
    One run's headline states ``between_line`` where given (what
    :func:`~kernelbench.results.spread.kept_spread_line` says), else ``between``'s line."""
    if len(runs) == 1:
        line = between_line if between_line is not None else spread_line(between)
        context = _single(runs[0], line)
    else:
        context = _compare(*runs, between)
    context["generated_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    context["version"] = __version__
    return _template().render(**context)


def _template() -> jinja2.Template:
    # autoescape=True, not select_autoescape(): the template's name ends in ".j2", which
    # select_autoescape would not treat as HTML.
    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    source = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    return env.from_string(source)


def _backend_lines(env: dict) -> list[dict[str, str]]:
    """The run's backends as recorded in env.json: available or why not, and verification."""
    found = env.get("backends")
    if not isinstance(found, dict):
        return []
    return [
        {
            "name": str(name),
            "available": "yes" if info.get("available") else "no",
            "verification": str(info.get("verification", "")),
            "reason": str(info.get("reason", "")),
        }
        for name, info in sorted(found.items())
        if isinstance(info, dict)
    ]


def _run_info(run: data.Run, label: str) -> dict:
    not_ok = run.not_ok
    n_na = int(not_ok["reason"].map(is_not_applicable).astype(bool).sum()) if len(not_ok) else 0
    return {
        "backends": _backend_lines(run.env),
        "label": label,
        "path": str(run.path),
        "command": run.command,
        "env": data.flat_env(run.env),
        "n_rows": len(run.rows),
        "n_ok": len(run.ok),
        "n_not_measured": len(not_ok) - n_na,
        "n_not_applicable": n_na,
        "device_classes": sorted(str(c) for c in run.rows["device_class"].unique()),
    }


def _what_ran(run: data.Run) -> str:
    """``case gpt3 · cpu-avx512vnni-2core · 2026-12-03``: what a report's title names."""
    cases = sorted(str(c) for c in run.rows["case"].unique()) if "case" in run.rows else []
    classes = sorted(str(c) for c in run.ok["device_class"].unique()) or sorted(
        str(c) for c in run.rows["device_class"].unique()
    )
    started = str(run.env.get("first_started_at") or run.env.get("started_at") or "")[:10]
    parts = [f"case {', '.join(cases)}" if cases else "", ", ".join(classes), started]
    return " · ".join(p for p in parts if p)


def _peak_lines(peaks: dict[str, dict]) -> list[str]:
    lines = []
    for kind, p in sorted(peaks.items()):
        value = f"{p['gbs']:.3g} GB/s" if "gbs" in p else f"{p['tops']:.3g} TOPS"
        line = f"{kind}: {value} ({p['source']}{', ' + p['note'] if p['note'] else ''})"
        placed = p.get("placements") or []
        if placed:
            each = ", ".join(
                f"{gbs:.3g} GB/s at a round trip of about {ns:.0f} ns" for ns, gbs in placed
            )
            line += f"; by the threads' placement: {each} (a cold row is held to its calls')"
        lines.append(line)
    return lines


def _cache_text(ok) -> str:
    """How the rows found the caches: ``cold`` (evicted before every timed call) or ``hot``,
    with the hot rows whose working set fits in a cache counted."""
    if "cache" not in ok:
        return ""
    modes = sorted({str(c) for c in ok["cache"].dropna()})
    text = "caches: " + "/".join(modes)
    if "cold" in modes:
        text += " (evicted before every timed call: weights read from memory)"
    if resident := int(marked(ok, "cache_resident").sum()):
        text += f"; {resident} rows cache-resident"
    return text


def _accuracy(run: data.Run) -> dict | None:
    """The accuracy section: the study's grids and its error-vs-size figure (None: no study)."""
    if run.study.empty:
        return None
    figure = plots.accuracy_vs_size(run.study)
    return {
        "grids": tables.accuracy_grids(run.study),
        "figures": [figure] if figure is not None else [],
    }


def _states(ok, target: float) -> dict | None:
    """The by-state section of a device class's rows (None: its readings show no two states)."""
    states = state_view(ok)
    if states.split is None:
        return None
    return {
        "split": state_split_text(states),
        "precision": state_precision_lines(states, target),
        "grids": tables.state_grids(ok, states, target),
        "shares": tables.state_share_grids(ok, states),
    }


def _single(run: data.Run, between_line: str) -> dict:
    """``between_line``: what is known of the spread between runs on the run's machine."""
    groups = []
    accuracy = _accuracy(run)
    # a study's rows are untimed: the timed sections show the timed rows only
    timed = run.ok if accuracy is None else run.ok[run.ok["median_ms"].notna()]
    for device_class, ok in sorted(timed.groupby("device_class"), key=lambda kv: str(kv[0])):
        layer, tokens = data.main_cell(ok)
        cell = ok[(ok["layer"] == layer) & (ok["tokens"] == tokens)]
        peaks = data.peaks(run.env, str(device_class))
        figures = [
            plots.speedup_vs_dmodel(ok, layer, tokens),
            plots.speedup_vs_tokens(ok, layer),
            plots.speedup_heatmaps(ok, layer),
            plots.stage_bars(ok, layer, tokens),
            plots.error_vs_dmodel(ok, layer, tokens),
            plots.speed_error_frontier(ok, layer, tokens),
            plots.memory_bars(ok, layer),
        ]
        groups.append(
            {
                "device_class": str(device_class),
                "layer": layer,
                "tokens": tokens,
                "speedup": tables.speedup_grids(cell, layer, tokens),
                "tops": tables.tops_grids(cell, peaks),
                "peaks": _peak_lines(peaks),
                "memory": tables.memory_grid(cell),
                "errors": tables.error_grids(cell),
                "suspects": tables.suspect_rows(ok),
                "sixteen_bit_note": slow_sixteen_bit_note(ok),
                "peak_note": peak_exceeded_note(ok),
                "caches": _cache_text(ok),
                "precision": precision_line(ok, ci_target(run.env)),
                "precision_by_tokens": precision_by_tokens_line(ok, ci_target(run.env)),
                "states": _states(ok, ci_target(run.env)),
                "paper_cell": (layer, tokens) == (data.PAPER_LAYER, data.PAPER_TOKENS),
                "has_paper": bool(cell["paper_speedup"].notna().any())
                if "paper_speedup" in cell
                else False,
                "figures": [f for f in figures if f is not None],
            }
        )
    return {
        "mode": "single",
        "title": f"kernelbench: {_what_ran(run)}",
        "headline": [*headline(run.rows), between_line],
        "runs": [_run_info(run, "run")],
        "groups": groups,
        "accuracy": accuracy,
        "problems": [{"run": "run", **p} for p in tables.problem_rows(run.not_ok)],
    }


def _compare(a: data.Run, b: data.Run, between: RunSpread | None = None) -> dict:
    classes_a, classes_b = set(a.ok["device_class"]), set(b.ok["device_class"])
    one_each = len(classes_a) == 1 and len(classes_b) == 1 and classes_a != classes_b
    # Two single-machine runs on different machines: compare cell for cell across them.
    keys = [c for c in KEY_COLUMNS if not (one_each and c == "device_class")]
    pairs = tables.paired(a.ok, b.ok, keys, between)
    groups = []
    if one_each:
        label = f"A: {next(iter(classes_a))} · B: {next(iter(classes_b))}"
        by_class = [(label, pairs)]
    else:
        by_class = sorted(pairs.groupby("device_class"), key=lambda kv: str(kv[0]))
    for label, df in by_class:
        layer, tokens = data.main_cell(df)
        if layer is None:
            continue
        figure = plots.ratio_vs_dmodel(df, layer, tokens)
        groups.append(
            {
                "device_class": str(label),
                "layer": layer,
                "tokens": tokens,
                "ratio": tables.ratio_grids(df, layer, tokens),
                "summary": tables.ratio_summary(df),
                "figures": [figure] if figure is not None else [],
            }
        )
    problems = [{"run": "A", **p} for p in tables.problem_rows(a.not_ok)]
    problems += [{"run": "B", **p} for p in tables.problem_rows(b.not_ok)]
    return {
        "mode": "compare",
        "title": f"kernelbench A/B: A {_what_ran(a)} vs B {_what_ran(b)}",
        "headline": [],
        "runs": [_run_info(a, "A"), _run_info(b, "B")],
        "groups": groups,
        "accuracy": None,
        "unmatched": tables.unmatched_rows(a.ok, b.ok, keys),
        "unmatched_keys": keys,
        "between": (
            f"Verdicts and bands include the spread between runs measured on this processor, "
            f"{between.describe()}: {between.source}."
            if between is not None
            else "Bands cover each run's own rounds only: no spread between runs is kept for "
            "the runs' processor (kernelbench spread), or they ran on different machines."
        ),
        "problems": problems,
    }
