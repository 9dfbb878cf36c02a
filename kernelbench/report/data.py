"""What a report is built from: runs loaded from disk, labels, and which rows make the main table.

No timing here and no HTML: this module only reads ``results.jsonl`` / ``env.json`` and
answers questions about them (which layer and token count is the App. D.1 cell, which device
peak applies to a method). Rendering lives in :mod:`.tables`, :mod:`.plots` and the template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kernelbench.core import (
    ACCURACY_STUDY,
    BASELINE,
    METHOD_LABELS,
    METHODS,
    PAPER_LAYER,
    PAPER_TOKENS,
    STUDY_BACKEND,
)
from kernelbench.core import STAGES as STAGES  # per-stage fields of ``stages_ms``, for plots
from kernelbench.results.physics import peaks as peaks  # env.json's peaks, for the tables
from kernelbench.results.schema import load_env, read_run_rows, results_path
from kernelbench.results.view import load_view

#: The methods whose tables by token count (speedup, share of the roofline, by bus state) a
#: reader gets for every backend: the paper's method and the bare int8 product.
COMPACT_METHODS = ("llm_int8", "int8_raw")


@dataclass
class Run:
    """One run directory: its rows (all statuses) and its env.json (``{}`` when absent);
    ``study``: the rows of an accuracy study in it, one per seed (not pooled), else empty."""

    path: Path
    rows: pd.DataFrame
    env: dict = field(default_factory=dict)
    study: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def ok(self) -> pd.DataFrame:
        return self.rows[self.rows["status"] == "ok"]

    @property
    def not_ok(self) -> pd.DataFrame:
        return self.rows[self.rows["status"] != "ok"]

    @property
    def command(self) -> str:
        cmd = self.env.get("command")
        if cmd:
            return str(cmd)
        argv = self.env.get("argv")
        return " ".join(str(a) for a in argv) if argv else "(not recorded)"


def load_run(path: Path) -> Run:
    path = Path(path)
    run_dir = path if path.is_dir() else path.parent
    rows = load_view(path)
    for col, default in (("stages_ms", None), ("reason", ""), ("size", "")):
        if col not in rows.columns:
            rows[col] = default
    return Run(run_dir, rows, load_env(run_dir), study_rows(path))


def study_rows(path: Path) -> pd.DataFrame:
    """The accuracy study's rows of a run, every seed its own row (the pooled view keeps one
    per key): its untimed ``STUDY_BACKEND`` rows and the 16-bit baseline's beside them. Empty
    when the run holds no study."""
    measured = pd.DataFrame(read_run_rows(results_path(path)).rows)
    if measured.empty or not (measured["backend"] == STUDY_BACKEND).any():
        return measured.iloc[0:0]
    untimed = measured["median_ms"].isna() & measured["rel_error"].notna()
    study = measured["backend"].isin((STUDY_BACKEND, BASELINE[0])) & untimed
    return measured[study & (measured["status"] == "ok")].reset_index(drop=True)


def study_methods(methods) -> list[str]:
    """The study's methods in Table 1's order (``ACCURACY_STUDY``), then any other."""
    order = [m for m, _ in ACCURACY_STUDY]
    present = set(methods)
    return [m for m in order if m in present] + sorted(present - set(order))


def study_label(method: str) -> str:
    """A study method in Table 1's wording (the 16-bit baseline as such)."""
    if method == BASELINE[1]:
        return "16-bit baseline"
    return dict(ACCURACY_STUDY).get(method) or METHOD_LABELS.get(method, method)


def method_sort_key(method: str) -> tuple[int, str]:
    try:
        return (METHODS.index(method), method)
    except ValueError:
        return (len(METHODS), method)


def sorted_methods(methods) -> list[str]:
    return sorted(set(methods), key=method_sort_key)


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, method)


def main_cell(ok: pd.DataFrame) -> tuple[str | None, int | None]:
    """The (layer, tokens) that the App. D.1 table shows: the paper's ffn1 at 2048 tokens when
    measured, else the most measured layer and the largest token count run for it."""
    if ok.empty:
        return None, None
    layers = ok["layer"].value_counts()
    layer = PAPER_LAYER if PAPER_LAYER in layers.index else str(layers.index[0])
    tokens = ok.loc[ok["layer"] == layer, "tokens"]
    tok = PAPER_TOKENS if (tokens == PAPER_TOKENS).any() else int(tokens.max())
    return layer, tok


def sizes(df: pd.DataFrame) -> list[tuple[int, str]]:
    """(d_model, size name) pairs in order of d_model."""
    pairs = df[["d_model", "size"]].drop_duplicates("d_model").sort_values("d_model")
    return [(int(d), str(s)) for d, s in pairs.itertuples(index=False)]


def peak_kind(method: str) -> str:
    """Which device peak bounds a method: its own dtype's for the baselines, int8 otherwise."""
    return {"fp16": "16bit", "fp32": "fp32"}.get(method, "int8")


def flat_env(env: dict, prefix: str = "") -> list[tuple[str, str]]:
    """env.json as (dotted key, text) pairs for a key/value table."""
    items: list[tuple[str, str]] = []
    for key, value in env.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            items.extend(flat_env(value, name + "."))
        elif isinstance(value, (list, tuple)):
            items.append((name, " ".join(str(v) for v in value)))
        else:
            items.append((name, "" if value is None else str(value)))
    return items
