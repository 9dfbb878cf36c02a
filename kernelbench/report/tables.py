"""Tables of a report, as plain data (pandas pivots -> :class:`Grid`); the template renders them.

Nothing here writes HTML: cells carry text and a background colour, and the template escapes
every string. Numbers are formatted once, here, so the tests can compare them with the results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from kernelbench.report import data

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


def _get(pivot: pd.DataFrame, method: str, d_model: int) -> float | None:
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


def speedup_grids(ok: pd.DataFrame, layer: str, tokens: int) -> list[Grid]:
    """App. D.1 Table 5 per backend: our speedup over 16-bit, the paper's figure beside it."""
    grids = []
    for backend, df in sorted(ok.groupby("backend"), key=lambda kv: str(kv[0])):
        dims, columns = _columns(df)
        ours, paper = _pivot(df, "speedup"), _pivot(df, "paper_speedup")
        rows = []
        for method in data.sorted_methods(df["method"]):
            cells = []
            for d in dims:
                value, ref = _get(ours, method, d), _get(paper, method, d)
                cells.append(
                    Cell(
                        text=fmt(value),
                        note=f"paper {fmt(ref)}" if ref is not None else "",
                        color=speedup_color(value),
                        attrs=_cell_attrs(str(backend), method, d, value),
                    )
                )
            rows.append(Row(data.method_label(method), method, cells))
        grids.append(
            Grid(
                f"backend {backend}",
                f"speedup over the 16-bit baseline (higher is better); layer {layer}, "
                f"{tokens} tokens; grey: the paper's App. D.1 figure for the same cell",
                columns,
                rows,
                "speedup",
            )
        )
    return grids


def tops_grids(ok: pd.DataFrame, peaks: dict[str, dict]) -> list[Grid]:
    """Achieved TOPS per cell and, where the device's peak for that kind is known, its share."""
    grids = []
    for backend, df in sorted(ok.groupby("backend"), key=lambda kv: str(kv[0])):
        if df["tops"].isna().all():
            continue
        dims, columns = _columns(df)
        tops = _pivot(df, "tops")
        rows = []
        for method in data.sorted_methods(df["method"]):
            peak = peaks.get(data.peak_kind(method))
            cells = []
            for d in dims:
                value = _get(tops, method, d)
                share = value / peak["tops"] if value is not None and peak else None
                cells.append(
                    Cell(
                        text=fmt(value, 3),
                        note=f"{100 * share:.1f}% of peak" if share is not None else "",
                        attrs=_cell_attrs(str(backend), method, d, value),
                    )
                )
            peak_text = (
                f"peak {peak['tops']:g} TOPS ({peak['source']})" if peak else "no peak known"
            )
            rows.append(Row(data.method_label(method), f"{method} · {peak_text}", cells))
        grids.append(Grid(f"backend {backend}", "achieved 1e12 ops/s", columns, rows, "tops"))
    return grids


def memory_grid(ok: pd.DataFrame) -> Grid | None:
    """Weight bytes per method and size, as MiB and as a share of the 16-bit weights."""
    df = ok.dropna(subset=["weight_bytes"]) if "weight_bytes" in ok else ok.iloc[0:0]
    if df.empty:
        return None
    dims, columns = _columns(df)
    mine, base = _pivot(df, "weight_bytes"), _pivot(df, "weight_bytes_16bit")
    rows = []
    for method in data.sorted_methods(df["method"]):
        cells = []
        for d in dims:
            value, ref = _get(mine, method, d), _get(base, method, d)
            ratio = value / ref if value is not None and ref else None
            cells.append(
                Cell(
                    text=fmt(value / 2**20, 2) if value is not None else "–",
                    note=f"{ratio:.3f}× of 16-bit" if ratio is not None else "",
                    attrs=_cell_attrs("", method, d, value),
                )
            )
        rows.append(Row(data.method_label(method), method, cells))
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


def verdict(ratio: float, spread_a, spread_b) -> str:
    """SAME / FASTER / SLOWER for B against A, inside the runs' own noise band (the larger
    relative IQR of the two); UNKNOWN when either run recorded no spread."""
    spreads = [s for s in (spread_a, spread_b) if s is not None and not pd.isna(s)]
    if len(spreads) < 2:
        return "unknown"
    band = max(spreads)
    if abs(ratio - 1.0) <= band:
        return "same"
    return "faster" if ratio < 1.0 else "slower"


def paired(a_ok: pd.DataFrame, b_ok: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows measured in both runs, with the time ratio B/A (below 1: B is faster)."""
    cols = [*keys, "size", "median_ms", "rel_spread", "speedup"]
    merged = a_ok[cols].merge(b_ok[cols], on=keys, suffixes=("_a", "_b"))
    merged["size"] = merged["size_b"].where(merged["size_b"].astype(bool), merged["size_a"])
    merged["ratio"] = merged["median_ms_b"] / merged["median_ms_a"]
    return merged


def ratio_grids(pairs: pd.DataFrame, layer: str, tokens: int) -> list[Grid]:
    """Per backend: median time B/A per (method, size), coloured (green: B faster)."""
    grids = []
    cell = pairs[(pairs["layer"] == layer) & (pairs["tokens"] == tokens)]
    for backend, df in sorted(cell.groupby("backend"), key=lambda kv: str(kv[0])):
        dims, columns = _columns(df)
        ratio = _pivot(df, "ratio")
        sp_a, sp_b = _pivot(df, "rel_spread_a"), _pivot(df, "rel_spread_b")
        rows = []
        for method in data.sorted_methods(df["method"]):
            cells = []
            for d in dims:
                value = _get(ratio, method, d)
                call = verdict(value, _get(sp_a, method, d), _get(sp_b, method, d)) if value else ""
                cells.append(
                    Cell(
                        text=f"{fmt(value, 3)}×" if value is not None else "–",
                        note=call,
                        color=speedup_color(1 / value) if value else "",
                        cls=f"verdict-{call}" if call else "",
                        attrs=_cell_attrs(str(backend), method, d, value),
                    )
                )
            rows.append(Row(data.method_label(method), method, cells))
        grids.append(
            Grid(
                f"backend {backend}",
                f"median time B / A (below 1: B is faster); layer {layer}, {tokens} tokens; "
                "verdict inside the larger relative IQR of the two runs",
                columns,
                rows,
                "ratio",
            )
        )
    return grids


def ratio_summary(pairs: pd.DataFrame) -> str:
    """One line over every matched cell (all layers and token counts, not only the grid's)."""
    ratios = pairs["ratio"].dropna()
    ratios = ratios[ratios > 0]
    if ratios.empty:
        return "no matched cell has a time in both runs"
    calls = [
        verdict(r, a, b)
        for r, a, b in zip(
            pairs["ratio"], pairs["rel_spread_a"], pairs["rel_spread_b"], strict=True
        )
        if pd.notna(r) and r > 0
    ]
    counts = ", ".join(f"{calls.count(v)} {v}" for v in ("faster", "same", "slower", "unknown"))
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return (
        f"all {len(ratios)} matched cells (every layer and token count): geometric mean of "
        f"B / A {geomean:.3f}; B is {counts}"
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
