"""Terminal tables of a run's pooled view (rich): speedups with their intervals beside the
paper's App. D.1 figures, times with sample counts and share of the roofline, errors, and the
rows that are suspect, skipped or failed. Every string from the data is escaped."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelbench.core import (
    ACCURACY_STUDY,
    BASELINE,
    METHODS,
    PAPER_TOKENS,
    TABLE1_PERPLEXITY,
    SkipKind,
    is_not_applicable,
)
from kernelbench.report.data import COMPACT_METHODS
from kernelbench.results.schema import third_party_label
from kernelbench.results.states import StateSpeedup, state_bounds
from kernelbench.results.view import (
    SLOW_FACTOR,
    StateView,
    by_round,
    headline,
    is_baseline,
    marked,
    peak_exceeded_note,
    rel_halfwidths,
    short_reason,
    slow_calls,
    slow_sixteen_bit_note,
    state_precision_lines,
    state_shares_text,
    state_split_text,
    state_view,
)
from kernelbench.statistics import rel_halfwidth

Formatter = Callable[[pd.Series], str]


def _num(v) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def speedup_text(row: pd.Series, with_paper: bool = False) -> str:
    """``1.42 ±0.04`` (half-width of the 95% interval); ``!`` marks an interval wider than the
    run's target, ``?`` a speedup without an interval (one pair), ``S`` a suspect row."""
    value = _num(row.get("speedup"))
    if value is None:
        return "-"
    lo, hi = _num(row.get("speedup_lo")), _num(row.get("speedup_hi"))
    text = (
        f"{value:.2f} ±{(hi - lo) / 2:.2f}"
        if lo is not None and hi is not None
        else f"{value:.2f} ?"
    )
    if (row.get("backend"), row.get("method")) == BASELINE:
        text = "1 (base)"
    elif row.get("ci_wide"):
        text += " [yellow]![/yellow]"
    if row.get("suspect"):
        text += " [red]S[/red]"
    paper = _num(row.get("paper_speedup")) if with_paper else None
    if paper is not None:
        text += f" [dim]({paper:.2f})[/dim]"
    return text


def time_text(row: pd.Series) -> str:
    """Median ms, sample count and share of the row's roofline."""
    ms = _num(row.get("median_ms"))
    if ms is None:
        return "-"
    text = f"{ms:.3g} n={int(row.get('samples') or 0)}"
    share = share_text(row)
    return text if share == "-" else f"{text} {share}"


def error_text(row: pd.Series) -> str:
    v = _num(row.get("rel_error"))
    return "-" if v is None else f"{v:.2e}"


def _cell(row: pd.Series | None, fmt: Formatter) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return "skip" if row["status"] == "skipped" else "[red]FAIL[/red]"
    return fmt(row)


def _applies(sub: pd.DataFrame) -> bool:
    """Whether a (backend, method) is measured or could be (not unsupported everywhere)."""
    kinds = sub["skip_kind"] if "skip_kind" in sub else pd.Series([None] * len(sub))
    unsupported = (sub["status"] == "skipped") & (kinds == SkipKind.UNSUPPORTED.value)
    return not unsupported.all()


def _method_order(methods) -> list[str]:
    return sorted(
        methods, key=lambda m: (m not in METHODS, METHODS.index(m) if m in METHODS else 0, m)
    )


def grid(df: pd.DataFrame, title: str, fmt: Formatter) -> Table:
    """Backend x method rows, one column per model size."""
    sizes = df.drop_duplicates("d_model").sort_values("d_model")[["d_model", "size"]]
    table = Table(title=title, title_justify="left")
    table.add_column("backend")
    table.add_column("method")
    for _, s in sizes.iterrows():
        table.add_column(escape(f"{s['size']}\nd={s['d_model']}"), justify="right")
    for backend in sorted(df["backend"].unique()):
        of_backend = df[df["backend"] == backend]
        for method in _method_order(of_backend["method"].unique()):
            sub = of_backend[of_backend["method"] == method]
            if not _applies(sub):
                continue  # listed under skipped rows instead
            by_d = {r["d_model"]: r for _, r in sub.iterrows()}
            table.add_row(
                escape(str(backend) + third_party_label(of_backend, detail=False)),
                escape(str(method)),
                *[_cell(by_d.get(d), fmt) for d in sizes["d_model"]],
            )
    return table


def share_text(row: pd.Series) -> str:
    """Share of the row's roofline at the measured peak bandwidth (of its calls' placements,
    where the peak has figures for them), and (``b``) at the bandwidth the bus gave just before
    each call, for a cold row that read it."""
    share = _num(row.get("roofline_share"))
    if share is None:
        return "-"
    text = f"{share:.0%}"
    bus = _num(row.get("bus_roofline_share"))
    if bus is not None:
        text += f" b{bus:.0%}"
    if row.get("cache_resident") is True:
        text += " [cyan]c[/cyan]"
    if row.get("above_peak") is True:
        text += " [yellow]p[/yellow]"
    return text


def tokens_grid(
    df: pd.DataFrame,
    backend: str,
    method: str,
    title: str,
    fmt: Callable[[pd.Series], str] = speedup_text,
) -> Table:
    """Speedup (with its interval; or what ``fmt`` shows) of one backend and method: tokens x
    model size."""
    sub = df[(df["backend"] == backend) & (df["method"] == method)]
    sizes = sub.drop_duplicates("d_model").sort_values("d_model")[["d_model", "size"]]
    table = Table(title=title, title_justify="left")
    table.add_column("tokens", justify="right")
    for _, s in sizes.iterrows():
        table.add_column(escape(f"{s['size']}\nd={s['d_model']}"), justify="right")
    for tokens in sorted(sub["tokens"].unique()):
        by_d = {r["d_model"]: r for _, r in sub[sub["tokens"] == tokens].iterrows()}
        table.add_row(str(tokens), *[_cell(by_d.get(d), fmt) for d in sizes["d_model"]])
    return table


def _print_cell(cell: pd.DataFrame, head: str, console: Console) -> None:
    has_paper = cell["paper_speedup"].notna().any() if "paper_speedup" in cell else False
    paper = "; paper App. D.1 in ()" if has_paper else ""
    console.print(f"[bold]{head}[/bold]", soft_wrap=True)
    console.print(
        grid(
            cell,
            f"Speedup over 16-bit, 95% interval{paper}",
            lambda r, p=has_paper: speedup_text(r, p),
        )
    )
    console.print(grid(cell, "Median ms, samples, share of roofline", time_text))
    console.print(grid(cell, "Relative error vs float64", error_text))


def _legend(shown: pd.DataFrame, speedups_only: pd.DataFrame | None = None) -> str:
    """What the marks in the printed tables mean: only the marks that appear. ``shown``: the
    rows of the speedup, time and error tables; ``speedups_only``: rows shown only as a
    speedup (the by-tokens tables)."""
    every = shown if speedups_only is None else pd.concat([shown, speedups_only])
    cells = every[every["status"] == "ok"]  # a skipped or failed cell prints no mark
    ok = cells[~is_baseline(cells)]  # the baseline prints "1 (base)": no interval marks

    parts = ["fp16 = the device's 16-bit baseline (bf16 on CPU)"]
    with_speedup = ok.dropna(subset=["speedup"]) if "speedup" in ok else ok
    if "speedup_lo" in with_speedup and with_speedup["speedup_lo"].notna().any():
        parts.append("±: half the 95% interval of the median pair ratio")
    if marked(ok, "ci_wide").any():
        parts.append("! interval wider than the run's target")
    if "speedup_lo" in with_speedup and with_speedup["speedup_lo"].isna().any():
        parts.append("? one pair only")
    if marked(cells, "suspect").any():  # S follows the baseline's "1 (base)" too
        parts.append("S suspect (see below)")
    main = shown[shown["status"] == "ok"]  # the time and error tables
    if marked(main, "cache_resident").any():
        parts.append(
            "c cache-resident (a hot row whose working set fits in a cache: bounded by compute "
            "only)"
        )
    if marked(cells, "above_peak").any():  # shares print in the by-tokens tables too
        parts.append(
            "p above the measured peak's roofline, within the bus's bandwidth before its calls: "
            "they ran in a placement of the threads the peak has no figure for (not flagged; "
            "kernelbench peak --remeasure while the host runs them so)"
        )
    if "bus_roofline_share" in every and every["bus_roofline_share"].notna().any():
        parts.append(
            "b: share of the roofline at the bandwidth the bus gave just before each call (the "
            "cache eviction's read rate: a reading, not a bound; it can pass 100%), beside the "
            "share at the measured peak"
        )
    if (main["method"] == "int8_raw").any():
        parts.append("int8_raw error is against the exact integer product")
    if (shown["layer"] == "block").any():
        parts.append("layer block = the sum of one transformer block's linears")
    return "; ".join(parts) + "."


def print_tables(
    df: pd.DataFrame,
    console: Console | None = None,
    skipped_table: bool = False,
    all_wide: bool = False,
    states: StateView | None = None,
    between_line: str = "",
) -> None:
    """Per device class and layer: speedup over 16-bit with its interval (the paper's figure
    beside it where the paper has one), time with sample count and share of the roofline, and
    relative error, at one token count (2048 when measured, else the largest); with several
    token counts, compact tables of ``llm_int8`` and ``int8_raw`` speedup by tokens x size per
    backend. First the headline (:func:`~kernelbench.results.view.headline`, the run's
    precision against the view's ``attrs["ci_target"]`` in its second line); after the
    tables, suspect rows, wide rows (with what their slow calls saw), then skipped and failed
    rows: one line per reason group, or with ``skipped_table`` the full table. Rows of
    (backend, method) pairs that do not apply (the backend has no such method) are counted,
    not listed. ``states``: ``df``'s state view where the caller has one (the headline's);
    ``between_line``: what is known of the spread between runs, after the headline."""
    console = console or Console()
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)  # a log file: do not cut the tables to 80 columns
    for line in headline(df, states):
        console.print(f"[bold]{escape(line)}[/bold]", soft_wrap=True)
    if between_line:
        console.print(escape(between_line), soft_wrap=True)
    shown, by_tokens = [], []
    for (dclass, layer), of_layer in df.groupby(["device_class", "layer"]):
        all_tokens = sorted(of_layer["tokens"].unique())
        main = PAPER_TOKENS if PAPER_TOKENS in all_tokens else all_tokens[-1]
        modes = sorted({str(c) for c in of_layer.get("cache", pd.Series(dtype=str)).dropna()})
        caches = f" · {'/'.join(modes)} caches" if modes else ""
        head = escape(f"{dclass} · layer {layer} · {main} tokens{caches}")
        _print_cell(of_layer[of_layer["tokens"] == main], head, console)
        shown.append(of_layer[of_layer["tokens"] == main])
        if len(all_tokens) < 2:
            continue
        ok = of_layer[of_layer["status"] == "ok"]
        for backend in sorted(ok["backend"].unique()):
            for method in COMPACT_METHODS:
                if ((ok["backend"] == backend) & (ok["method"] == method)).any():
                    title = escape(
                        f"{backend} {method}: speedup over 16-bit by tokens "
                        f"({dclass} · layer {layer})"
                    )
                    console.print(tokens_grid(of_layer, backend, method, title))
                    pair = (of_layer["backend"] == backend) & (of_layer["method"] == method)
                    by_tokens.append(of_layer[pair])
                    if of_layer[pair]["roofline_share"].notna().any():
                        title = escape(f"{backend} {method}: share of its roofline by tokens")
                        console.print(tokens_grid(of_layer, backend, method, title, share_text))
    if shown:
        extra = pd.concat(by_tokens) if by_tokens else None
        console.print(f"[dim]{escape(_legend(pd.concat(shown), extra))}[/dim]")
    _print_warnings(df, console)
    _print_suspects(df, console)
    _print_wide(df, console, None if all_wide else WIDE_SHOWN)
    if skipped_table:
        _print_skipped(df, console)
    else:
        _print_skipped_summary(df, console)


def _print_warnings(df: pd.DataFrame, console: Console) -> None:
    for note in (slow_sixteen_bit_note(df), peak_exceeded_note(df)):
        if note:
            console.print(f"[yellow]{escape(note)}[/yellow]")


#: Wide rows listed at the end of a run (the widest first); ``show --wide`` lists them all. A
#: default sweep on a 2-core VM had 313: the table filled the last screens and hid the summary.
WIDE_SHOWN = 10


def _print_wide(df: pd.DataFrame, console: Console, limit: int | None = None) -> None:
    """Rows whose interval is wider than the target (the ``limit`` widest, or all), with what
    their slow calls saw."""
    if not marked(df, "ci_wide").any():
        return
    wide = df[marked(df, "ci_wide") & (df["layer"] != "block")]
    if not len(wide):
        return
    width = rel_halfwidths(wide).fillna(math.inf)  # no interval: listed first
    wide = wide.assign(_width=width).sort_values("_width", ascending=False)
    more = len(wide) - limit if limit is not None and len(wide) > limit else 0
    if more:
        wide = wide.head(limit)
    widest = f"the {len(wide)} widest of {len(wide) + more}, " if more else ""
    table = Table(
        title=f"Wide rows ({widest}their calls above {SLOW_FACTOR}x the median, and what those "
        "saw)",
        title_justify="left",
    )
    for col in ("backend", "method", "d_model", "tokens", "speedup", "by round", "bus GB/s",
                "link ns", "core us", "moved", "slow", "faulted", "preempted", "max faults",
                "steal"):  # fmt: skip
        table.add_column(col)
    for _, r in wide.iterrows():
        seen = slow_calls(r)
        steal = seen["steal_share"]
        rounds = by_round(r)
        row_moved, base_moved = rounds.moved(rounds.row_ms), rounds.moved(rounds.baseline_ms)
        cells = (
            r["backend"], r["method"], r["d_model"], r["tokens"], speedup_text(r),
            " ".join(f"{v:.2f}" for v in rounds.speedups) or "-",
            " ".join(f"{v:.0f}" for v in rounds.bus_gbps) or "-",
            " ".join(f"{v:.0f}" for v in rounds.link_ns) or "-",
            " ".join(f"{v / 1e3:.0f}" for v in rounds.core_ns) or "-",
            f"{row_moved:.2f}x / {base_moved:.2f}x" if row_moved and base_moved else "-",
            f"{seen['slow']} of {seen['samples']}", seen["slow_faulted"], seen["slow_preempted"],
            "-" if seen["max_faults"] is None else seen["max_faults"],
            "-" if steal is None else f"{steal:.1%}",
        )  # fmt: skip
        table.add_row(*(str(v) if i == 4 else escape(str(v)) for i, v in enumerate(cells)))
    console.print(table)
    console.print(
        "by round: the row's median speedup in each round; moved: its slowest round's median "
        "time over its fastest's, then the same of its 16-bit baseline (rounds that disagree: "
        "the machine moved between them); bus GB/s: by round, the median bandwidth the bus "
        "gave just before the row's calls (on a shared bus, calls that stream their weights "
        "move with it); link ns: by round, the median round trip of a cache line between two "
        "threads before them (where the host ran the threads: close together or apart; on AMD, "
        "one core complex or two); core "
        "us: by round, the median time of a fixed chain of integer steps on two threads "
        "before them (how fast the cores ran: a host that shares them out reads slower)"
    )
    if more:
        console.print(f"{more} more wide rows: kernelbench show --wide RUN")


def _print_suspects(df: pd.DataFrame, console: Console) -> None:
    suspect = marked(df, "suspect")
    if not suspect.any():
        return
    table = Table(title="Suspect rows: numbers that contradict physics", title_justify="left")
    for col in ("backend", "method", "d_model", "tokens", "reason"):
        table.add_column(col)
    for _, r in df[suspect].iterrows():
        cells = (r["backend"], r["method"], r["d_model"], r["tokens"], r["suspect_reason"])
        table.add_row(*(escape(str(v)) for v in cells))
    console.print(table)


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _not_applicable(df: pd.DataFrame) -> pd.Series:
    return (df["status"] == "skipped") & df["reason"].map(is_not_applicable).astype(bool)


def _print_skipped_summary(df: pd.DataFrame, console: Console) -> None:
    """One line per (backend, status, reason) group of rows that were not measured, with a
    short reason; then how many rows do not apply."""
    bad = df[(df["status"] != "ok") & (df["layer"] != "block")]
    na = _not_applicable(bad)
    # the first clause of the short reason: the cause; the rest is how to fix it (list -v)
    listed = bad[~na].assign(
        short=bad[~na]["reason"].map(lambda r: short_reason(str(r)).split("; ")[0])
    )
    if len(listed):
        console.print(
            f"[bold]Not measured: {_rows(len(listed))}[/bold] (kernelbench show --skipped RUN: "
            "the table; kernelbench list -v: full reasons)",
            soft_wrap=True,
        )
    for (backend, status, reason), g in listed.groupby(["backend", "status", "short"]):
        methods = _method_order(g["method"].unique())
        which = "every method" if len(methods) == len(METHODS) else ", ".join(methods)
        word = "failed" if status == "failed" else "skipped"
        line = f"  {backend}{third_party_label(g, detail=False)}: {len(g)} {word} ({which}): "
        colour = "red" if status == "failed" else "default"
        console.print(f"[{colour}]{escape(line + reason)}[/{colour}]", soft_wrap=True)
    if na.any():
        console.print(
            f"[dim]{_rows(int(na.sum()))} of (backend, method) pairs that do not apply (the "
            "backend has no such method): not listed.[/dim]",
            soft_wrap=True,
        )


def _print_skipped(df: pd.DataFrame, console: Console) -> None:
    bad = df[df["status"] != "ok"]
    bad = bad[~_not_applicable(bad)]
    if not len(bad):
        return
    table = Table(title="Skipped and failed rows, grouped by reason", title_justify="left")
    for col in ("backend", "status", "methods", "d_model", "reason"):
        table.add_column(col)
    for (backend, status, reason), g in bad.groupby(["backend", "status", "reason"]):
        methods = ", ".join(_method_order(g["method"].unique()))
        dims = ", ".join(str(d) for d in sorted(g["d_model"].unique()))
        name = f"{backend}{third_party_label(g, detail=False)}"
        table.add_row(*(escape(str(v)) for v in (name, status, methods, dims, reason)))
    console.print(table)


def accuracy_summary(rows) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(method, size) -> (median, min, max) over the seeds of a method's error relative to the
    16-bit baseline's on the same inputs (``rel_error / baseline_rel_error``); ``rows`` are
    :class:`~kernelbench.results.schema.ResultRow` of the accuracy study."""
    ratios: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.rel_error is not None and r.baseline_rel_error:
            ratios.setdefault((r.method, r.size), []).append(r.rel_error / r.baseline_rel_error)
    out = {}
    for key, values in ratios.items():
        values.sort()
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        out[key] = (median, values[0], values[-1])
    return out


def print_accuracy(rows, console: Console) -> None:
    """Methods x sizes: error / the 16-bit baseline's (median over seeds, min-max), with Table
    1's perplexity beside it where the paper has that size."""
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)  # a log file: do not cut the table to 80 columns
    table_of = accuracy_summary(rows)
    sizes = list(dict.fromkeys(r.size for r in rows))
    labels = dict(ACCURACY_STUDY)
    methods = [m for m, _ in ACCURACY_STUDY if any(k[0] == m for k in table_of)]
    methods += sorted({k[0] for k in table_of} - set(methods) - {BASELINE[1]})
    seeds = len({r.seed for r in rows}) // max(len(sizes), 1)
    t = Table(
        title="Error relative to the 16-bit baseline's (median over "
        f"{seeds} seed(s), min-max); [dim]Table 1 perplexity[/dim]",
        caption="kernel-level: one layer's output error against float64; Table 1's perplexities "
        "are model-level (C4, OPT models), shown for orientation only",
    )
    t.add_column("method")
    for s in sizes:
        t.add_column(escape(s), justify="right")
    base = {}
    for r in rows:
        if r.method == BASELINE[1] and r.rel_error is not None:
            base.setdefault(r.size, []).append(r.rel_error)
    t.add_row("16-bit baseline (rel. error)", *(f"{max(base.get(s, [0])):.2e}" for s in sizes))
    for m in methods:
        cells = []
        for s in sizes:
            med = table_of.get((m, s))
            text = "-" if med is None else f"{med[0]:.3g} ({med[1]:.3g}-{med[2]:.3g})"
            ppl = TABLE1_PERPLEXITY.get(m, {}).get(s)
            cells.append(text + (f" [dim]{ppl:.2f}[/dim]" if ppl is not None else ""))
        t.add_row(escape(labels.get(m, m)), *cells)
    console.print(t)


def _state_text(s: StateSpeedup | None, target: float) -> str:
    if s is None:
        return "-"
    if s.lo is None or s.hi is None:
        return f"{s.speedup:.2f} ? n={s.pairs}"
    mark = "" if rel_halfwidth(s.speedup, s.lo, s.hi) <= target else " [yellow]![/yellow]"
    return f"{s.speedup:.2f} ±{(s.hi - s.lo) / 2:.2f} n={s.pairs}{mark}"


def print_state_tables(
    df: pd.DataFrame, console: Console | None = None, states: StateView | None = None
) -> None:
    """Speedups split by the memory bus's state (:mod:`kernelbench.results.states`): how the
    run's bus readings split, then per device class, layer and token count each row's
    speedup in the slow and the fast state (median ± half its 95% interval, pairs), and each
    state's precision; and each int8 method's share of its roofline in each state. Says so
    when the readings show no two states."""
    console = console or Console()
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)
    states = state_view(df) if states is None else states
    split = states.split
    console.print(escape(state_split_text(states)), soft_wrap=True)
    if split is None:
        return
    target = float(df.attrs.get("ci_target") or 0.05)
    bounds = state_bounds(split)
    rows = df.loc[list(states.by_row)]
    for (dclass, layer, tokens), cell in rows.groupby(["device_class", "layer", "tokens"]):
        for state, bound in bounds.items():
            head = f"{dclass} · layer {layer} · {tokens} tokens · {state} state ({bound})"
            console.print(f"[bold]{escape(head)}[/bold]", soft_wrap=True)
            console.print(
                grid(
                    cell,
                    "Speedup over 16-bit, 95% interval, pairs",
                    lambda r, st=state: _state_text(states.by_row[r.name].get(st), target),
                )
            )
    for (dclass, layer), of_layer in rows.groupby(["device_class", "layer"]):
        for backend in sorted(of_layer["backend"].unique()):
            for method in COMPACT_METHODS:
                pair = (of_layer["backend"] == backend) & (of_layer["method"] == method)
                if not of_layer[pair]["roofline_share"].notna().any():
                    continue
                title = escape(
                    f"{backend} {method}: share of its roofline by tokens, slow | fast state "
                    f"({dclass} · layer {layer})"
                )
                console.print(
                    tokens_grid(
                        of_layer,
                        backend,
                        method,
                        title,
                        lambda r: state_shares_text(r, states.by_row.get(r.name, {}), "-"),
                    )
                )
    for line in state_precision_lines(states, target):
        console.print(line)
