"""Tables of a report, as plain data (pandas pivots -> :class:`Grid`); the template renders them.

Nothing here writes HTML: cells carry text and a background colour, and the template escapes
every string. Numbers are formatted once, here, so the tests can compare them with the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from kernelbench.core import TABLE1_PERPLEXITY
from kernelbench.report import data
from kernelbench.results.schema import third_party_label
from kernelbench.results.states import STATES, StateSpeedup
from kernelbench.results.verdict import RunSpread, joint_split, judge, most_rounds
from kernelbench.results.view import StateView, marked, state_shares_text
from kernelbench.statistics import rel_halfwidth

#: Group columns of one App. D.1 cell (the key without layer / tokens, which the grid fixes).
CELL = ["backend", "method", "d_model"]


@dataclass
class Cell:
    text: str = ""
    note: str = ""  # small text beside the number (the paper's figure, a share of peak)
    color: str = ""  # background, "#rrggbb"
    cls: str = ""  # extra CSS class (a verdict)
    attrs: dict[str, str] = field(default_factory=dict)  # data-* attributes, for tests/tools


@dataclass
class Row:
    label: str
    sub: str
    cells: list[Cell]


@dataclass
class Grid:
    title: str
    caption: str
    columns: list[tuple[str, str]]  # (label, sub label)
    rows: list[Row]
    kind: str = ""  # "speedup", "tops", "memory", "ratio": a CSS / test hook
    row_header: str = "method"  # what the rows are


def speedup_color(value: float | None, span: float = 2.0) -> str:
    """Red below 1x, white at 1x, green above, on a log2 scale clipped at 2**±span."""
    if value is None or not math.isfinite(value) or value <= 0:
        return ""
    t = max(-1.0, min(1.0, math.log2(value) / span))
    lo, hi, mid = (0xE8, 0x8A, 0x80), (0x7C, 0xC6, 0x7C), (0xFF, 0xFF, 0xFF)
    end = hi if t > 0 else lo
    rgb = [round(m + (e - m) * abs(t)) for m, e in zip(mid, end, strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def _columns(df: pd.DataFrame) -> tuple[list[int], list[tuple[str, str]]]:
    pairs = data.sizes(df)
    return [d for d, _ in pairs], [(s or f"d={d}", f"d={d}") for d, s in pairs]


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    """rows = method, columns = d_model; duplicates (several cases / seeds) take the median."""
    return df.pivot_table(index="method", columns="d_model", values=value, aggfunc="median")


def _get(pivot: pd.DataFrame | None, method: str, d_model: int) -> float | None:
    if pivot is None:
        return None
    try:
        value = pivot.at[method, d_model]
    except KeyError:
        return None
    return None if pd.isna(value) else float(value)


def _cell_attrs(backend: str, method: str, d_model: int, value: float | None) -> dict[str, str]:
    return {
        "backend": backend,
        "method": method,
        "d-model": str(d_model),
        "value": "" if value is None else repr(value),
    }


#: The cell of one (method, model dimension) of a grid.
CellOf = Callable[[str, int], Cell]


def _method_rows(
    df: pd.DataFrame, dims: list[int], cell: CellOf, sub: Callable[[str], str] = str
) -> list[Row]:
    """A row per method of ``df`` (in the report's order), a cell per model dimension."""
    return [
        Row(data.method_label(method), sub(method), [cell(method, d) for d in dims])
        for method in data.sorted_methods(df["method"])
    ]


def _backend_grids(
    df_all: pd.DataFrame,
    kind: str,
    caption: str | Callable[[pd.DataFrame], str],
    cells: Callable[[str, pd.DataFrame], CellOf | None],
    sub: Callable[[str], str] = str,
) -> list[Grid]:
    """One grid per backend of ``df_all``: ``cells(backend, its rows)`` gives the backend's
    cell function (None leaves the backend out); ``caption``, text or a function of the
    backend's rows (a caption naming only the marks its grid shows)."""
    grids = []
    for backend, df in sorted(df_all.groupby("backend"), key=lambda kv: str(kv[0])):
        cell = cells(str(backend), df)
        if cell is None:
            continue
        dims, columns = _columns(df)
        rows = _method_rows(df, dims, cell, sub)
        text = caption(df) if callable(caption) else caption
        grids.append(Grid(f"backend {backend}{third_party_label(df)}", text, columns, rows, kind))
    return grids


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def interval_note(row: dict) -> str:
    """``[1.38, 1.46] n=24``: the speedup's 95% interval and the pairs behind it."""
    lo, hi, n = row.get("speedup_lo"), row.get("speedup_hi"), row.get("samples")
    text = "" if _missing(lo) or _missing(hi) else f"[{lo:.2f}, {hi:.2f}]"
    return f"{text} n={int(n)}".strip() if not _missing(n) else text


def flags(row: dict | None) -> str:
    if row is None:
        return ""
    return (" !" if row.get("ci_wide") else "") + (" S" if row.get("suspect") else "")


def suspect_rows(ok: pd.DataFrame) -> list[dict[str, str]]:
    """Rows that contradict physics, with the reason."""
    bad = ok[marked(ok, "suspect")]
    cols = ["backend", "method", "size", "d_model", "layer", "tokens", "suspect_reason"]
    return [{c: str(r.get(c, "")) for c in cols} for r in bad.to_dict("records")]


def speedup_grids(ok: pd.DataFrame, layer: str, tokens: int) -> list[Grid]:
    """App. D.1 Table 5 per backend: our speedup over 16-bit, the paper's figure beside it."""

    def cells(backend: str, df: pd.DataFrame) -> CellOf:
        ours, paper = _pivot(df, "speedup"), _pivot(df, "paper_speedup")
        rows_by = {(r["method"], r["d_model"]): r for r in df.to_dict("records")}

        def cell(method: str, d: int) -> Cell:
            row = rows_by.get((method, d))
            value, ref = _get(ours, method, d), _get(paper, method, d)
            notes = [interval_note(row)] if row is not None else []
            notes += [f"paper {fmt(ref)}"] if ref is not None else []
            return Cell(
                text=fmt(value) + flags(row),
                note=" · ".join(n for n in notes if n),
                color=speedup_color(value),
                cls="suspect" if row is not None and row.get("suspect") else "",
                attrs=_cell_attrs(backend, method, d, value),
            )

        return cell

    def caption(df: pd.DataFrame) -> str:
        """Names only what this grid shows: the paper's figures, the ! and S marks."""
        under = ["its 95% interval", "samples n"]
        if "paper_speedup" in df and df["paper_speedup"].notna().any():
            under.append("'paper x', the paper's App. D.1 figure, where the paper has this cell")
        parts = [
            "speedup over the 16-bit baseline (higher is better), median of paired ratios",
            f"layer {layer}, {tokens} tokens",
            "under each number: " + ", ".join(under),
        ]
        if marked(df, "ci_wide").any():
            parts.append("! interval wider than the run's target")
        if marked(df, "suspect").any():
            parts.append("S suspect (see below)")
        return "; ".join(parts)

    return _backend_grids(ok, "speedup", caption, cells)


def _state_value(s: StateSpeedup | None, target: float) -> tuple[str, str]:
    """(number with its ! mark, interval and pairs) of one state's speedup."""
    if s is None:
        return "–", "n=0"
    wide = rel_halfwidth(s.speedup, s.lo, s.hi) > target
    interval = "" if s.lo is None or s.hi is None else f"[{s.lo:.2f}, {s.hi:.2f}] "
    return fmt(s.speedup) + (" !" if wide else ""), f"{interval}n={s.pairs}"


def state_grids(ok: pd.DataFrame, states: StateView, target: float) -> list[Grid]:
    """Per layer, token count and backend: each row's speedup in the bus's slow and fast state
    (:func:`kernelbench.results.view.state_view`), side by side. Empty without two states."""
    if states.split is None or not states.by_row:
        return []
    rows = ok.loc[[i for i in states.by_row if i in ok.index]]
    caption = (
        "speedup over the 16-bit baseline in the slow state | in the fast state (median of the "
        "pairs whose call the bus reading puts there); under each number: each state's 95% "
        f"interval and pairs; ! interval wider than ±{target:.0%}"
    )

    def cells(backend: str, df: pd.DataFrame) -> CellOf:
        by_key = {(r.method, r.d_model): states.by_row[i] for i, r in df.iterrows()}

        def cell(method: str, d: int) -> Cell:
            by_state = by_key.get((method, d))
            if by_state is None:
                return Cell(text="–")
            slow, fast = (_state_value(by_state.get(st), target) for st in STATES)
            return Cell(
                text=f"{slow[0]} | {fast[0]}",
                note=f"{slow[1]} | {fast[1]}",
                attrs={
                    **_cell_attrs(backend, method, d, None),
                    **{st: repr(by_state[st].speedup) if st in by_state else "" for st in STATES},
                },
            )

        return cell

    grids = []
    for (layer, tokens), df in rows.groupby(["layer", "tokens"]):
        for g in _backend_grids(df, "states", caption, cells):
            g.title += f" · layer {layer} · {tokens} tokens"
            grids.append(g)
    return grids


def state_share_grids(ok: pd.DataFrame, states: StateView) -> list[Grid]:
    """Per layer, backend and method of :data:`~kernelbench.report.data.COMPACT_METHODS`: its
    share of the roofline in the slow and the fast state, tokens x model size. Empty without
    two states."""
    if states.split is None or "roofline_share" not in ok:
        return []
    rows = ok.loc[[i for i in states.by_row if i in ok.index]]
    grids = []
    for (layer, backend, method), df in rows.groupby(["layer", "backend", "method"]):
        if method not in data.COMPACT_METHODS or not df["roofline_share"].notna().any():
            continue
        dims, columns = _columns(df)
        by_key = {(int(r["tokens"]), int(r["d_model"])): (i, r) for i, r in df.iterrows()}

        def cell(tokens: int, d: int, by_key=by_key) -> Cell:
            found = by_key.get((tokens, d))
            if found is None:
                return Cell(text="–")
            i, row = found
            return Cell(text=state_shares_text(row, states.by_row[i], "–"))

        grid_rows = [
            Row(f"{t} tokens", "", [cell(int(t), d) for d in dims])
            for t in sorted(df["tokens"].unique())
        ]
        grids.append(
            Grid(
                f"backend {backend}{third_party_label(df)} · {method} · layer {layer}",
                "share of its roofline over the calls in the slow | the fast state (the run's "
                "peaks; – where the row has no call in that state)",
                columns,
                grid_rows,
                "state-shares",
                row_header="tokens",
            )
        )
    return grids


def tops_grids(ok: pd.DataFrame, peaks: dict[str, dict]) -> list[Grid]:
    """Achieved TOPS per cell and, where the device's peak for that kind is known, its share."""

    def cells(backend: str, df: pd.DataFrame) -> CellOf | None:
        if df["tops"].isna().all():
            return None
        tops = _pivot(df, "tops")
        roof = _pivot(df, "roofline_share") if _known(df, "roofline_share") else None
        bus = _pivot(df, "bus_roofline_share") if _known(df, "bus_roofline_share") else None
        above = _pivot(df.assign(above_peak=marked(df, "above_peak").astype(float)), "above_peak")

        def cell(method: str, d: int) -> Cell:
            value, share = _get(tops, method, d), _get(roof, method, d)
            note = f"{100 * share:.0f}% of roofline" if share is not None else ""
            at_bus = _get(bus, method, d)
            if note and at_bus is not None:
                note += f" ({100 * at_bus:.0f}% at the bus)"
            if note and (_get(above, method, d) or 0.0) > 0:
                note += ", above the measured peak: its placement has no figure"
            return Cell(text=fmt(value, 3), note=note, attrs=_cell_attrs(backend, method, d, value))

        return cell

    def sub(method: str) -> str:
        peak = peaks.get(data.peak_kind(method))
        return f"{method} · " + (
            f"peak {peak['tops']:g} TOPS ({peak['source']})" if peak else "no peak known"
        )

    caption = (
        "achieved 1e12 ops/s (declared work / median time); under each number: share of the row's "
        "roofline (its precision's measured compute peak, or bandwidth x arithmetic "
        "intensity when lower; a cold row's bandwidth that of the threads' placement in each of "
        "its calls where the peak has a figure for it)"
    )
    if _known(ok, "bus_roofline_share"):
        caption += (
            "; 'at the bus': the same share with, for each call, the bandwidth the bus gave just "
            "before it (the cache eviction's read rate: a reading, not a bound; it can pass 100%)"
        )
    return _backend_grids(ok, "tops", caption, cells, sub)


def _known(df: pd.DataFrame, column: str) -> bool:
    return column in df and bool(df[column].notna().any())


def error_grids(ok: pd.DataFrame) -> list[Grid]:
    """Relative Frobenius error against float64 per backend, method and size; beside each
    decomposing row, the outlier columns it detected and the columns the inputs planted."""

    def cells(backend: str, df: pd.DataFrame) -> CellOf:
        by = {(r["method"], r["d_model"]): r for r in df.to_dict("records")}

        def cell(method: str, d: int) -> Cell:
            r = by.get((method, d)) or {}
            value = None if _missing(r.get("rel_error")) else r["rel_error"]
            found, planted = r.get("outlier_cols"), r.get("planted_outlier_cols")
            note = ""
            if method == "llm_int8" and not _missing(found) and not _missing(planted):
                note = f"outliers {int(found)} found / {int(planted)} planted"
            text = "–" if value is None else f"{value:.2e}"
            return Cell(text=text, note=note, attrs=_cell_attrs(backend, method, d, value))

        return cell

    def caption(df: pd.DataFrame) -> str:
        text = "relative Frobenius error against the float64 product"
        if (df["method"] == "int8_raw").any():
            text += " (int8_raw: against the exact integer product)"
        llm = df[df["method"] == "llm_int8"]
        cols = ["outlier_cols", "planted_outlier_cols"]
        if all(c in llm for c in cols) and not llm.dropna(subset=cols).empty:
            text += "; llm_int8: outlier columns detected beside those the inputs planted"
        return text

    return _backend_grids(ok, "error", caption, cells)


def accuracy_grids(study: pd.DataFrame) -> list[Grid]:
    """The accuracy study per layer and distribution: methods x sizes, each method's error
    divided by the 16-bit baseline's on the same inputs (median over seeds, the seeds' range
    beside it) and Table 1's perplexity where the paper has that method and size; the first row
    is the 16-bit baseline's own error."""
    grids = []
    base_method = data.BASELINE[1]
    for (layer, dist), df in sorted(study.groupby(["layer", "dist"]), key=lambda kv: str(kv[0])):
        dims, columns = _columns(df)
        names = dict(data.sizes(df))
        ratio = df["rel_error"] / df["baseline_rel_error"].where(df["baseline_rel_error"] > 0)
        per = df.assign(ratio=ratio).groupby(["method", "d_model"])
        spread = per["ratio"].agg(["median", "min", "max", "count"])
        base = per["rel_error"].agg(["median", "min", "max"])

        def cell(method: str, d: int, spread=spread, base=base, names=names) -> Cell:
            if method == base_method:
                if (method, d) not in base.index:
                    return Cell("–")
                b = base.loc[(method, d)]
                return Cell(f"{b['median']:.2e}", f"{b['min']:.2e}–{b['max']:.2e}",
                            attrs=_cell_attrs("", method, d, float(b["median"])))  # fmt: skip
            if (method, d) not in spread.index or _missing(spread.loc[(method, d), "median"]):
                return Cell("–", attrs=_cell_attrs("", method, d, None))
            r = spread.loc[(method, d)]
            ppl = TABLE1_PERPLEXITY.get(method, {}).get(names.get(d, ""))
            note = f"{r['min']:.3g}–{r['max']:.3g}" + (f" · ppl {ppl:.2f}" if ppl else "")
            value = float(r["median"])
            return Cell(f"{value:.3g}×", note, attrs=_cell_attrs("", method, d, value))

        rows = [
            Row(data.study_label(m), m, [cell(m, d) for d in dims])
            for m in [base_method, *data.study_methods(set(df["method"]) - {base_method})]
        ]
        seeds = int(spread["count"].max()) if not spread.empty else 0
        caption = (
            f"layer {layer}, {dist}: error against float64 divided by the 16-bit baseline's on the "
            f"same inputs, median over {seeds} seed(s), the seeds' range beside it (first row: "
            "the 16-bit baseline's own relative error); ppl: Table 1's C4 perplexity of OPT "
            "models, model-level, beside these kernel-level errors for orientation only"
        )
        grids.append(Grid("accuracy study", caption, columns, rows, "accuracy"))
    return grids


def memory_grid(ok: pd.DataFrame) -> Grid | None:
    """Weight bytes per method and size, as MiB and as a share of the 16-bit weights."""
    df = ok.dropna(subset=["weight_bytes"]) if "weight_bytes" in ok else ok.iloc[0:0]
    if df.empty:
        return None
    dims, columns = _columns(df)
    mine, base = _pivot(df, "weight_bytes"), _pivot(df, "weight_bytes_16bit")

    def cell(method: str, d: int) -> Cell:
        value, ref = _get(mine, method, d), _get(base, method, d)
        ratio = value / ref if value is not None and ref else None
        return Cell(
            text=fmt(value / 2**20, 2) if value is not None else "–",
            note=f"{ratio:.3f}× of 16-bit" if ratio is not None else "",
            attrs=_cell_attrs("", method, d, value),
        )

    rows = _method_rows(df, dims, cell)
    return Grid("weight memory", "MiB kept for the weights", columns, rows, "memory")


def problem_rows(not_ok: pd.DataFrame) -> list[dict[str, str]]:
    """Every skipped or failed row with its reason."""
    cols = ["status", "backend", "method", "device_class", "size", "d_model", "layer", "tokens"]
    out = []
    for rec in not_ok.sort_values(["status", "backend", "method", "d_model"]).to_dict("records"):
        row = {c: str(rec.get(c, "")) for c in cols}
        row["reason"] = str(rec.get("reason") or "(no reason recorded)")
        out.append(row)
    return out


#: Fields each run's row brings to an A/B pair (suffixed _a / _b), enough for the verdict.
_PAIR_FIELDS = [
    "size",
    "median_ms",
    "rel_spread",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "paired",
    "paired_rel_spread",
    "baseline_ms",
    "samples",
    "rounds",
    "status",
    # each call's readings: the verdict judges a row again in each placement of the threads
    "raw_ms",
    "baseline_raw_ms",
    "bus_gbps",
    "link_ns",
    "round_samples",
]


def paired(
    a_ok: pd.DataFrame, b_ok: pd.DataFrame, keys: list[str], between: RunSpread | None = None
) -> pd.DataFrame:
    """Rows measured in both runs, with the time ratio B/A (below 1: B is faster), the ratio
    of their speedups over 16-bit B/A (``speedup_ratio``) and the verdict of
    :func:`kernelbench.results.verdict.judge` on it (``speed_verdict``, judged again in each
    placement of the threads, then the one-round rule): the one ``compare`` gives.

    ``speedup_ratio_lo`` / ``_hi``: the verdict's noise band around the speedup ratio,
    ``r / (1 + noise)`` to ``r * (1 + noise)``; at zero tolerance the verdict is faster or
    slower exactly when the band leaves out 1. NaN where the verdict did not compare
    speedups, a spread behind its noise was not measured, or the placements decided it.
    ``between``: the spread between runs kept for the runs' processor, in each run's noise as
    in ``compare``."""
    cols = [*keys, *(c for c in _PAIR_FIELDS if c in a_ok.columns and c in b_ok.columns)]
    merged = a_ok[cols].merge(b_ok[cols], on=keys, suffixes=("_a", "_b"))
    merged["size"] = merged["size_b"].where(merged["size_b"].astype(bool), merged["size_a"])
    merged["ratio"] = merged["median_ms_b"] / merged["median_ms_a"]
    readings = ["bus_gbps", "link_ns"]
    split = joint_split(
        a_ok.reindex(columns=readings).to_dict("records"),
        b_ok.reindex(columns=readings).to_dict("records"),
    )
    # the most rounds any row of each run was pooled from (fp32's one round is then told apart)
    most = tuple(
        most_rounds(ok.reindex(columns=["rounds"]).to_dict("records")) for ok in (a_ok, b_ok)
    )
    calls, by_placement = [], []
    for rec in merged.to_dict("records"):
        a, b = _side(rec, "_a"), _side(rec, "_b")
        backend, tokens = str(rec.get("backend", "")), rec.get("tokens")
        call, placed = judge(a, b, 0.0, split, most, backend, between, tokens=tokens)
        calls.append(call)
        by_placement.append(placed)
    merged["verdict"] = [c.verdict for c in calls]
    # what the verdict judges: each run's speedup over its own 16-bit baseline, B / A
    nan = float("nan")
    ratios = [c.new_value / c.base_value if c.metric == "speedup" else nan for c in calls]
    merged["speedup_ratio"] = ratios
    # no band where the placements decided: the pooled noise is not what was judged
    noises = [
        c.noise
        if c.metric == "speedup" and c.noise is not None and not c.unmeasured and not placed
        else nan
        for c, placed in zip(calls, by_placement, strict=True)
    ]
    merged["speedup_ratio_lo"] = [r / (1 + n) for r, n in zip(ratios, noises, strict=True)]
    merged["speedup_ratio_hi"] = [r * (1 + n) for r, n in zip(ratios, noises, strict=True)]
    return merged


def _side(rec: dict, suffix: str) -> dict:
    side = {k[: -len(suffix)]: v for k, v in rec.items() if k.endswith(suffix)}
    return {**side, "status": side.get("status", "ok")}


def ratio_grids(pairs: pd.DataFrame, layer: str, tokens: int) -> list[Grid]:
    """Per backend and (method, size): the measure the verdict judges first, B's speedup over
    its own 16-bit baseline divided by A's (above 1: B gained on its baseline), coloured by it
    where the verdict is faster or slower;
    the verdict; and, secondary, the plain median time B / A (which also moves when the
    machine's load or the baseline moved)."""

    def cells(backend: str, df: pd.DataFrame) -> CellOf:
        speedup = _pivot(df, "speedup_ratio")
        ratio = _pivot(df, "ratio")
        calls = {(r["method"], r["d_model"]): r["verdict"] for r in df.to_dict("records")}

        def cell(method: str, d: int) -> Cell:
            value = _get(speedup, method, d)
            time_ratio = _get(ratio, method, d)
            call = calls.get((method, d), "") if value or time_ratio else ""
            time_note = f"time B/A {fmt(time_ratio, 3)}×" if time_ratio else ""
            attrs = _cell_attrs(backend, method, d, value)
            attrs["time-ratio"] = "" if time_ratio is None else repr(time_ratio)
            return Cell(
                text=f"{fmt(value, 3)}×" if value is not None else "–",
                note=" · ".join(x for x in (call, time_note) if x),
                # coloured only where the verdict found a change: one meaning per colour
                color=speedup_color(value) if value and call in ("faster", "slower") else "",
                cls=f"verdict-{call}" if call else "",
                attrs=attrs,
            )

        return cell

    caption = (
        f"speedup over 16-bit, B / A (above 1: B gained on its own 16-bit baseline), with the "
        f"verdict of kernelbench compare at zero tolerance (beyond both runs' noise, each "
        f"speedup's 95% interval) and the median time B / A; layer {layer}, {tokens} tokens"
    )
    in_cell = pairs[(pairs["layer"] == layer) & (pairs["tokens"] == tokens)]
    return _backend_grids(in_cell, "ratio", caption, cells)


def ratio_summary(pairs: pd.DataFrame) -> str:
    """One line over every matched cell (all layers and token counts, not only the grid's)."""
    ratios = pairs["ratio"].dropna()
    ratios = ratios[ratios > 0]
    if ratios.empty:
        return "no matched cell has a time in both runs"
    calls = [
        v for r, v in zip(pairs["ratio"], pairs["verdict"], strict=True) if pd.notna(r) and r > 0
    ]
    counts = ", ".join(f"{calls.count(v)} {v}" for v in ("faster", "same", "slower", "unknown"))
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    gains = pairs["speedup_ratio"].dropna() if "speedup_ratio" in pairs else pd.Series([])
    gains = gains[gains > 0]
    gain = (
        f"geometric mean of the speedup over 16-bit B / A "
        f"{math.exp(sum(math.log(r) for r in gains) / len(gains)):.3f}, of the time B / A "
        if len(gains)
        else "geometric mean of the time B / A "
    )
    return (
        f"all {len(ratios)} matched cells (every layer and token count): {gain}{geomean:.3f}; "
        f"B is {counts}"
    )


def unmatched_rows(a_ok: pd.DataFrame, b_ok: pd.DataFrame, keys: list[str]) -> list[dict]:
    """Cells measured (ok) in only one of the two runs."""
    a_keys = a_ok[keys].drop_duplicates()
    b_keys = b_ok[keys].drop_duplicates()
    both = a_keys.merge(b_keys, on=keys, how="outer", indicator=True)
    only = both[both["_merge"] != "both"]
    out = []
    for rec in only.to_dict("records"):
        where = "A only" if rec.pop("_merge") == "left_only" else "B only"
        out.append({"where": where, **{k: str(rec[k]) for k in keys}})
    return out
