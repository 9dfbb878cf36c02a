"""Terminal tables of a run (rich): the App. D.1 speedup table beside the paper, and errors."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console
from rich.table import Table

from kernelbench.backends import METHODS


def _num(v) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def _cell(row: pd.Series | None, field: str, fmt: str, with_paper: bool) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return "skip" if row["status"] == "skipped" else "FAIL"
    v = _num(row.get(field))
    if v is None:
        return "-"
    text = format(v, fmt)
    paper = _num(row.get("paper_speedup")) if with_paper else None
    if paper is not None:
        text += f" [dim]({paper:.2f})[/dim]"
    return text


def _grid(df: pd.DataFrame, title: str, field: str, fmt: str, with_paper: bool) -> Table:
    sizes = df.drop_duplicates("d_model").sort_values("d_model")[["d_model", "size"]]
    table = Table(title=title, title_justify="left")
    table.add_column("backend")
    table.add_column("method")
    for _, s in sizes.iterrows():
        table.add_column(f"{s['size']}\nd={s['d_model']}", justify="right")
    order = {m: i for i, m in enumerate(METHODS)}
    keys = df[["backend", "method"]].drop_duplicates()
    keys = keys.assign(o=keys["method"].map(order)).sort_values(["backend", "o"])
    for _, key in keys.iterrows():
        sub = df[(df["backend"] == key["backend"]) & (df["method"] == key["method"])]
        never = (sub["status"] == "skipped") & ~sub["reason"].str.startswith("over budget")
        if never.all():
            continue  # a pair that does not apply here: listed under skipped rows instead
        by_d = {r["d_model"]: r for _, r in sub.iterrows()}
        table.add_row(
            key["backend"],
            key["method"],
            *[_cell(by_d.get(d), field, fmt, with_paper) for d in sizes["d_model"]],
        )
    return table


def print_tables(df: pd.DataFrame, console: Console | None = None) -> None:
    """Per device class, layer and token count: speedup over 16-bit (paper figure beside it),
    speedup over fp32, relative error, and the skipped/failed rows with their reasons."""
    console = console or Console()
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)  # a log file: do not cut the tables to 80 columns
    for (dclass, layer, tokens), cell in df.groupby(["device_class", "layer", "tokens"]):
        head = f"{dclass} · layer {layer} · {tokens} tokens"
        console.print(
            _grid(cell, f"Speedup over 16-bit ({head}); (paper App. D.1)", "speedup", ".2f", True)
        )
        console.print(
            _grid(cell, f"Relative Frobenius error vs float64 ({head})", "rel_error", ".2e", False)
        )
        base = cell[(cell["backend"] == "torch") & (cell["method"] == "fp16")]
        if len(base):
            console.print(
                "[dim]fp16 row = the device's 16-bit baseline (bf16 on CPU); "
                "int8_raw error is against the exact integer product.[/dim]"
            )
    bad = df[df["status"] != "ok"]
    if len(bad):
        table = Table(title="Skipped and failed rows", title_justify="left")
        for col in ("backend", "status", "methods", "d_model", "reason"):
            table.add_column(col)
        for (backend, status, reason), g in bad.groupby(["backend", "status", "reason"]):
            methods = ", ".join(sorted(g["method"].unique(), key=METHODS.index))
            dims = ", ".join(str(d) for d in sorted(g["d_model"].unique()))
            table.add_row(backend, status, methods, dims, str(reason))
        console.print(table)
