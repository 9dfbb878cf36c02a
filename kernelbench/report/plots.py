"""Figures of a report: seaborn / matplotlib, returned as inline SVG markup.

Figures are built with :class:`matplotlib.figure.Figure` and an explicit canvas, never through
pyplot, so making a report changes no global matplotlib state (backend, rcParams) of the
caller. Every function takes the rows to draw and returns a :class:`Figure` or ``None`` when
there is nothing to draw.

The SVG keeps its text as text (``svg.fonttype: none``): tick labels, titles and legends are
``<text>`` elements a browser (and a test reading the DOM) can read, which matplotlib's SVG
writer escapes as XML, so a name holding markup is shown, never run. Each figure's element ids
carry a prefix of their own: several figures inline in one page never share an id.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from kernelbench.core import BASELINE, FP32
from kernelbench.report import data
from kernelbench.results.view import is_baseline

PANEL_W, PANEL_H = 4.6, 3.4


@dataclass
class Figure:
    title: str
    caption: str
    svg: str  # <svg ...>...</svg>, inline markup (matplotlib escapes the text in it)


def _palette(methods) -> dict[str, tuple]:
    """One colour per method, the same in every figure of a report."""
    names = data.sorted_methods([*data.METHODS, *methods])
    colours = sns.color_palette("tab10", 10) + sns.color_palette("Set2", 8)
    return {m: colours[i % len(colours)] for i, m in enumerate(names)}


def _new(n_panels: int, wrap: int = 3, sharey: bool = True, h: float = PANEL_H):
    ncols = max(1, min(n_panels, wrap))
    nrows = math.ceil(n_panels / ncols)
    fig = MplFigure(figsize=(PANEL_W * ncols, h * nrows), layout="constrained")
    FigureCanvasSVG(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, list(axes[:n_panels])


#: No date, creator or format block: the page says when and by what it was made.
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_ID = re.compile(r'(\bid="|href="#|url\(#)')


def _encode(fig: MplFigure) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML declaration or doctype,
    every id (and every reference to one) prefixed with a hash of the figure's own markup."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_NO_METADATA)
    text = buf.getvalue()
    svg = text[text.index("<svg") :].strip()
    prefix = "f" + hashlib.sha1(svg.encode("utf-8")).hexdigest()[:8] + "-"
    return _ID.sub(lambda m: m.group(1) + prefix, svg)


def _plain_log_axis(axis) -> None:
    """Numeric tick labels on a log axis (``256``, ``2048``): matplotlib's default labels are
    mathtext, which :func:`_style` turns off (then they read ``$\\mathdefault{..}$``)."""
    axis.set_major_formatter(FuncFormatter(_number))
    axis.set_minor_formatter(NullFormatter())


def _number(value: float, _pos=None) -> str:
    """A tick label as a plain number: ``0.001``, ``1e-05``, ``20``, ``2048``."""
    return f"{value:g}"


def _dmodel_axis(ax, dims: list[int]) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(dims))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(d) for d in dims], rotation=45, fontsize=8)
    ax.set_xlabel("model dimension d")


def _cell(frame: pd.DataFrame, layer: str, tokens: int) -> pd.DataFrame:
    """The rows of one layer at one token count."""
    return frame[(frame["layer"] == layer) & (frame["tokens"] == tokens)]


def _backend_panels_over_dmodel(df: pd.DataFrame, draw: Callable) -> str:
    """One panel per backend with d_model on the x axis; ``draw(ax, rows, colours)`` fills a
    panel with that backend's rows. Returns the figure's SVG markup."""
    backends = sorted(df["backend"].unique())
    colours = _palette(df["method"])
    dims = sorted(int(d) for d in df["d_model"].unique())
    with _style():
        fig, axes = _new(len(backends))
        for ax, backend in zip(axes, backends, strict=True):
            draw(ax, df[df["backend"] == backend], colours)
            _dmodel_axis(ax, dims)
            ax.set_title(f"backend {backend}")
        return _encode(fig)


def _style():
    # Names and reasons are data: a '$' in them is shown, never read as matplotlib mathtext.
    # SVG: text stays text, in the font matplotlib measured it with (the browser falls back to
    # its sans-serif); fixed hash salt: the same figure gives the same markup.
    return matplotlib.rc_context(
        {
            **sns.axes_style("whitegrid"),
            "text.parse_math": False,
            "svg.fonttype": "none",
            "svg.hashsalt": "kernelbench",
            "font.family": "sans-serif",
            "font.sans-serif": ["DejaVu Sans"],
        }
    )


def _not_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that are not the 16-bit baseline itself: its speedup is 1 by definition and
    its error is the baseline's, which the figures draw once, in black."""
    return df[~is_baseline(df)]


def _has_interval(df: pd.DataFrame, value: str = "speedup") -> bool:
    cols = [value, f"{value}_lo", f"{value}_hi"]
    return all(c in df for c in cols) and not df.dropna(subset=cols).empty


def speedup_vs_dmodel(ok: pd.DataFrame, layer: str, tokens: int) -> Figure | None:
    """Speedup over 16-bit vs d_model: one line per method, one panel per backend; the paper's
    App. D.1 figures as crosses in the method's colour."""
    df = _not_baseline(_cell(ok, layer, tokens).dropna(subset=["speedup"]))
    if df.empty:
        return None
    paper = "paper_speedup" in df and df["paper_speedup"].notna().any()

    def draw(ax, sub: pd.DataFrame, colours: dict) -> None:
        for method in data.sorted_methods(sub["method"]):
            m = sub[sub["method"] == method].groupby("d_model").median(numeric_only=True)
            ax.plot(m.index, m["speedup"], marker="o", color=colours[method], label=method)
            _interval_bars(ax, m, colours[method])
            ref = m["paper_speedup"].dropna() if "paper_speedup" in m else pd.Series()
            if not ref.empty:
                ax.scatter(ref.index, ref, marker="x", color=colours[method], s=30)
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set_ylabel("speedup over 16-bit")
        title = "method (x: paper)" if paper else "method"
        ax.legend(fontsize=7, title=title, title_fontsize=7)

    svg = _backend_panels_over_dmodel(df, draw)
    parts = [f"layer {layer}, {tokens} tokens"]
    parts += ["bars: 95% interval of each speedup"] if _has_interval(df) else []
    parts += ["dotted line: the 16-bit baseline"]
    parts += ["crosses: the paper's App. D.1 figure"] if paper else []
    return Figure("Speedup over 16-bit vs model dimension", "; ".join(parts), svg)


def speedup_vs_tokens(ok: pd.DataFrame, layer: str) -> Figure | None:
    """Speedup vs token count, one panel per model size, one line per backend · method;
    only when several token counts were run."""
    df = _not_baseline(ok[ok["layer"] == layer].dropna(subset=["speedup"]))
    if df["tokens"].nunique() < 2:
        return None
    sizes = data.sizes(df)
    colours = _palette(df["method"])
    styles = dict(zip(sorted(df["backend"].unique()), ["-", "--", "-.", ":"] * 4, strict=False))
    with _style():
        fig, axes = _new(len(sizes), wrap=4)
        for ax, (d, name) in zip(axes, sizes, strict=True):
            sub = df[df["d_model"] == d]
            for (backend, method), g in sorted(sub.groupby(["backend", "method"])):
                g = g.groupby("tokens").median(numeric_only=True)
                ax.plot(
                    g.index,
                    g["speedup"],
                    marker="o",
                    ms=3,
                    ls=styles[backend],
                    color=colours[method],
                    label=f"{backend} · {method}",
                )
                _interval_bars(ax, g, colours[method])
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            _plain_log_axis(ax.xaxis)
            ax.set_title(f"{name} (d={d})", fontsize=9)
            ax.set_xlabel("tokens")
            ax.set_ylabel("speedup over 16-bit")
        legend = {}
        for ax in axes:  # every backend · method once, whichever panel drew it
            for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(name, handle)
        fig.legend(legend.values(), legend.keys(), loc="outside right upper", fontsize=7)
        svg = _encode(fig)
    bars = "; bars: 95% interval of each speedup" if _has_interval(df) else ""
    caption = f"layer {layer}; line style: backend{bars}; dotted line: the 16-bit baseline"
    return Figure("Speedup vs tokens", caption, svg)


def speedup_heatmaps(ok: pd.DataFrame, layer: str) -> Figure | None:
    """Speedup over 16-bit as a model size x tokens heatmap, one panel per backend · method
    (``llm_int8`` and ``int8_raw``); only when several token counts were run."""
    df = ok[(ok["layer"] == layer) & ok["method"].isin(("llm_int8", "int8_raw"))]
    df = df.dropna(subset=["speedup"])
    if df["tokens"].nunique() < 2:
        return None
    panels = sorted(df.groupby(["backend", "method"]), key=lambda kv: (str(kv[0][0]), kv[0][1]))
    with _style():
        fig, axes = _new(len(panels), wrap=2, sharey=False, h=3.2)
        for ax, ((backend, method), g) in zip(axes, panels, strict=True):
            grid = g.pivot_table(index="tokens", columns="d_model", values="speedup")
            sns.heatmap(
                grid,
                ax=ax,
                annot=True,
                fmt=".2f",
                cmap="RdYlGn",
                center=1.0,
                cbar=False,
                annot_kws={"fontsize": 7},
            )
            ax.set_title(f"{backend} · {method}", fontsize=9)
            ax.set_xlabel("model dimension d")
            ax.set_ylabel("tokens")
        svg = _encode(fig)
    return Figure(
        "Speedup over 16-bit: model size x tokens",
        f"layer {layer}; green above 1 (faster than 16-bit), red below; intervals in the tables",
        svg,
    )


def stage_bars(ok: pd.DataFrame, layer: str, tokens: int) -> Figure | None:
    """Stacked bar of median time per stage, per backend · method, one panel per size; the
    black tick is the whole method's median (stages are timed separately)."""
    df = _cell(ok, layer, tokens)
    df = df[df["stages_ms"].map(lambda s: isinstance(s, dict) and bool(s))]
    if df.empty:
        return None
    stage_colours = dict(
        zip(data.STAGES, sns.color_palette("muted", len(data.STAGES)), strict=True)
    )
    sizes = data.sizes(df)
    labels = sorted(
        {(b, m) for b, m in zip(df["backend"], df["method"], strict=True)},
        key=lambda bm: (bm[0], data.method_sort_key(bm[1])),
    )
    drawn: set[str] = set()  # the legend names only the stages some bar shows
    with _style():
        fig, axes = _new(len(sizes), wrap=3, sharey=False, h=0.35 * len(labels) + 1.4)
        for ax, (d, name) in zip(axes, sizes, strict=True):
            sub = df[df["d_model"] == d]
            for y, (backend, method) in enumerate(labels):
                rows = sub[(sub["backend"] == backend) & (sub["method"] == method)]
                if rows.empty:
                    continue
                rec = rows.iloc[0]
                left = 0.0
                for stage in data.STAGES:
                    width = float(rec["stages_ms"].get(stage) or 0.0)
                    if width > 0:
                        ax.barh(y, width, left=left, color=stage_colours[stage])
                        drawn.add(stage)
                    left += width
                if pd.notna(rec.get("median_ms")):
                    ax.plot([rec["median_ms"]] * 2, [y - 0.4, y + 0.4], color="black", lw=1.5)
            ax.set_yticks(range(len(labels)))
            ax.set_yticklabels([f"{b} · {m}" for b, m in labels], fontsize=7)
            ax.invert_yaxis()
            ax.set_title(f"{name} (d={d})", fontsize=9)
            ax.set_xlabel("ms")
        handles = [Patch(color=c, label=s) for s, c in stage_colours.items() if s in drawn]
        if handles:
            axes[0].legend(handles=handles, fontsize=7, loc="lower right")
        svg = _encode(fig)
    return Figure(
        "Time per stage",
        f"layer {layer}, {tokens} tokens; median ms per stage; black tick: the whole method",
        svg,
    )


def error_vs_dmodel(ok: pd.DataFrame, layer: str, tokens: int) -> Figure | None:
    """Relative error vs d_model per method, one panel per backend; the dashed black line is
    the 16-bit baseline's error on the same inputs."""
    df = _cell(ok, layer, tokens).dropna(subset=["rel_error"])
    # a panel per backend with a method besides the baseline, whose line every row carries
    df = _not_baseline(df[df["rel_error"] > 0])
    if df.empty:
        return None
    baseline = "baseline_rel_error" in df and (df["baseline_rel_error"] > 0).any()

    def draw(ax, sub: pd.DataFrame, colours: dict) -> None:
        _method_lines(ax, sub, "rel_error", colours)
        base = sub.groupby("d_model")["baseline_rel_error"].median().dropna()
        base = base[base > 0]
        if not base.empty:
            ax.plot(base.index, base.values, color="black", ls="--", label="16-bit baseline")
        _numeric_log_axis(ax, "y")
        ax.set_ylabel("relative error (Frobenius)")
        ax.legend(fontsize=7)

    svg = _backend_panels_over_dmodel(df, draw)
    dashed = "; dashed: the 16-bit baseline on the same inputs" if baseline else ""
    return Figure(
        "Error vs model dimension",
        f"layer {layer}, {tokens} tokens; error against the float64 product{dashed}; log scale",
        svg,
    )


def _interval_bars(ax, m: pd.DataFrame, colour, value: str = "speedup") -> None:
    """Vertical bars from ``<value>_lo`` to ``<value>_hi`` where a point has an interval."""
    lo, hi = f"{value}_lo", f"{value}_hi"
    if lo not in m or hi not in m:
        return
    have = m.dropna(subset=[value, lo, hi])
    if not have.empty:
        ax.vlines(have.index, have[lo], have[hi], color=colour, lw=1.5)


def _method_lines(ax, sub: pd.DataFrame, column: str, colours: dict) -> None:
    """One line per method: the median of ``column`` per d_model."""
    for method in data.sorted_methods(sub["method"]):
        m = sub[sub["method"] == method].groupby("d_model")[column].median()
        ax.plot(m.index, m.values, marker="o", color=colours[method], label=method)


def memory_bars(ok: pd.DataFrame, layer: str) -> Figure | None:
    """Weight MiB per method and size beside the 16-bit weights of the same layer."""
    all_rows = ok[ok["layer"] == layer].dropna(subset=["weight_bytes"])
    df = _not_baseline(all_rows)  # the baseline's bar is the grey 16-bit one
    if df.empty:
        return None
    per = df.groupby(["d_model", "method"])["weight_bytes"].median().unstack("method")
    per = per[data.sorted_methods(per.columns)]
    per.insert(0, "16-bit weights", all_rows.groupby("d_model")["weight_bytes_16bit"].median())
    per = per / 2**20
    colours = _palette(df["method"])
    colours["16-bit weights"] = (0.3, 0.3, 0.3)
    with _style():
        fig, (ax,) = _new(1, h=PANEL_H + 0.6)
        fig.set_figwidth(max(PANEL_W, 1.0 + 0.9 * len(per)))
        per.plot.bar(ax=ax, color=[colours[c] for c in per.columns], width=0.85)
        _numeric_log_axis(ax, "y")
        ax.set_xlabel("model dimension d")
        ax.set_ylabel("MiB")
        ax.legend(fontsize=7)
        svg = _encode(fig)
    return Figure(
        "Weight memory per method",
        f"layer {layer}; MiB kept for the weights; grey: the layer's 16-bit weights; log scale",
        svg,
    )


def ratio_vs_dmodel(pairs: pd.DataFrame, layer: str, tokens: int) -> Figure | None:
    """A/B: what the verdict judges, B's speedup over its own 16-bit baseline divided by A's,
    vs d_model, one line per method, one panel per backend; bars: the verdict's noise band
    around each ratio (``speedup_ratio_lo`` / ``_hi`` of :func:`.tables.paired`), which
    leaves out 1 exactly where the verdict is faster or slower. The time ratio B / A, which
    moves with the machine's load, is in the table cells only."""
    df = _not_baseline(_cell(pairs, layer, tokens).dropna(subset=["speedup_ratio"]))
    if df.empty:
        return None

    def draw(ax, sub: pd.DataFrame, colours: dict) -> None:
        for method in data.sorted_methods(sub["method"]):
            m = sub[sub["method"] == method].groupby("d_model").median(numeric_only=True)
            ax.plot(m.index, m["speedup_ratio"], marker="o", color=colours[method], label=method)
            _interval_bars(ax, m, colours[method], "speedup_ratio")
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set_ylabel("speedup over 16-bit, B / A")
        ax.legend(fontsize=7, title="method", title_fontsize=7)

    svg = _backend_panels_over_dmodel(df, draw)
    parts = [
        f"layer {layer}, {tokens} tokens; B's speedup over its own 16-bit baseline divided by "
        "A's, the measure the verdict judges: above 1, B gained on its baseline"
    ]
    if _has_interval(df, "speedup_ratio"):
        parts.append(
            "bars: the verdict's noise band (both speedups' 95% intervals combined); a bar clear "
            "of the dotted line at 1 is a faster or slower verdict"
        )
    parts.append("the time ratio B / A, which moves with the machine's load, is in the table")
    return Figure("Speedup over 16-bit, B / A", "; ".join(parts), svg)


def _numeric_log_axis(ax, axis: str = "y") -> None:
    """A log axis whose ticks read as plain numbers (``0.001``, ``20``): with mathtext off
    (:func:`_style`), matplotlib's default ``10^k`` labels would print as raw markup."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    wide = lo > 0 and hi / lo > 1e3  # many decades: one tick per decade
    subs = (1.0,) if wide else (1.0, 2.0, 5.0)
    target.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    target.set_major_formatter(FuncFormatter(_number))
    target.set_minor_locator(NullLocator())


def accuracy_vs_size(study: pd.DataFrame) -> Figure | None:
    """The accuracy study: relative error against float64 vs model size, one line per method
    (median over seeds, shaded from the smallest to the largest seed), the 16-bit baseline as a
    dashed line over a grey band (16-bit quality: at or below its error); one panel per layer
    and distribution, log y."""
    df = study.dropna(subset=["rel_error"])
    df = df[df["rel_error"] > 0]
    if df.empty:
        return None
    panels = sorted(df.groupby(["layer", "dist"]), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
    colours = _palette(df["method"])
    base_method = BASELINE[1]
    with _style():
        fig, axes = _new(len(panels), wrap=2, sharey=False, h=PANEL_H + 1.2)
        fig.set_figwidth(max(fig.get_figwidth(), 11.0))
        for ax, ((layer, dist), sub) in zip(axes, panels, strict=True):
            spread = sub.groupby(["method", "d_model"])["rel_error"].agg(["median", "min", "max"])
            ax.set_yscale("log")
            base = spread.loc[base_method] if base_method in spread.index else None
            for method in data.study_methods(sub["method"]):
                if method in (base_method, FP32[1]):  # fp32: in the table, far below the band
                    continue
                m = spread.loc[method]
                ax.plot(m.index, m["median"], marker="o", ms=3, color=colours[method],
                        label=data.study_label(method))  # fmt: skip
                ax.fill_between(m.index, m["min"], m["max"], color=colours[method], alpha=0.15,
                                lw=0)  # fmt: skip
            if base is not None:  # drawn last: its floor is the axis' own bottom
                floor = min(ax.get_ylim()[0], float(base["min"].min()) / 2)
                ax.fill_between(base.index, floor, base["max"], color="0.55", alpha=0.3, lw=0,
                                label="at or below the 16-bit baseline", zorder=0)  # fmt: skip
                ax.plot(base.index, base["median"], color="0.3", lw=1.2, ls="--",
                        label="16-bit baseline")  # fmt: skip
                ax.set_ylim(bottom=floor)
            pairs = data.sizes(sub)
            _dmodel_axis(ax, [d for d, _ in pairs])
            ax.set_xticklabels([f"{s}\n{d}" if s else str(d) for d, s in pairs], fontsize=8)
            _numeric_log_axis(ax, "y")
            ax.set_ylabel("relative error against float64")
            ax.set_title(f"layer {layer}, {dist}", fontsize=9)
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside right upper", fontsize=7)
        svg = _encode(fig)
    seeds = int(df.groupby(["method", "d_model", "layer", "dist"]).size().max())
    return Figure(
        "Accuracy study: error vs model size",
        f"kernel-level error of one layer's output against float64 (relative Frobenius), "
        f"median over {seeds} seed(s), shaded: smallest to largest seed; dashed: the 16-bit "
        "baseline on the same inputs (median), grey band: at or below its largest error over "
        "the seeds, i.e. 16-bit quality; 32-bit float, far below the band, is in the "
        "table only",
        svg,
    )


def speed_error_frontier(ok: pd.DataFrame, layer: str, tokens: int) -> Figure | None:
    """Where each scheme sits: speedup over 16-bit against error relative to 16-bit, one point
    per backend x method, one panel per model size (the cell ``layer`` x ``tokens``)."""
    df = _cell(ok, layer, tokens).dropna(subset=["speedup", "rel_error", "baseline_rel_error"])
    df = df[(df["baseline_rel_error"] > 0) & (df["rel_error"] > 0) & (df["speedup"] > 0)]
    # the baselines themselves are no point: fp32 is shown as absolute time, never as a speedup
    df = df[~df["method"].isin((BASELINE[1], FP32[1]))]
    if df.empty:
        return None
    df = df.assign(error_ratio=df["rel_error"] / df["baseline_rel_error"])
    sizes = data.sizes(df)
    colours = _palette(df["method"])
    backends = sorted(df["backend"].unique())
    markers = dict(zip(backends, ["o", "s", "^", "D", "v", "P", "X", "*"] * 4, strict=False))
    with _style():
        fig, axes = _new(len(sizes), wrap=3, sharey=False)
        for ax, (d, name) in zip(axes, sizes, strict=True):
            sub = df[df["d_model"] == d]
            for r in sub.itertuples(index=False):
                ax.scatter(r.error_ratio, r.speedup, color=colours[r.method], s=36,
                           marker=markers[r.backend], edgecolor="black", linewidth=0.4,
                           label=f"{r.backend} · {r.method}")  # fmt: skip
            ax.axhline(1.0, color="black", lw=0.8, ls=":")
            ax.axvline(1.0, color="black", lw=0.8, ls=":")
            _numeric_log_axis(ax, "x")
            ax.set_xlabel("error / 16-bit baseline's")
            ax.set_ylabel("speedup over 16-bit")
            ax.set_title(f"{name} (d={d})", fontsize=9)
        legend = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        fig.legend(legend.values(), legend.keys(), loc="outside right upper", fontsize=7)
        svg = _encode(fig)
    return Figure(
        "Speed against error",
        f"layer {layer}, {tokens} tokens; one point per backend · method (marker: backend); up is "
        "faster, left is closer to 16-bit quality; dotted lines: the 16-bit baseline",
        svg,
    )
