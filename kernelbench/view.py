"""The view every reader of a run shares: rows pooled over rounds, with intervals and checks.

``results.jsonl`` holds one row per (key, round) as measured; tables, reports and the CI gate
read one row per key: :func:`pooled_view` pools the rounds (:func:`kernelbench.merge.pool_rows`)
and runs the physics checks (:mod:`kernelbench.physics`) with the run's peaks and ``ci_target``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from kernelbench.merge import pool_rows
from kernelbench.physics import annotate, peaks
from kernelbench.results import ResultRow, SchemaError, load_env, read_rows

#: The interval target of runs whose env.json does not record one.
DEFAULT_CI_TARGET = 0.05


def ci_target(env: dict) -> float:
    value = env.get("ci_target")
    return float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_CI_TARGET


def pooled_rows(rows: list[dict], env: dict) -> list[ResultRow]:
    """One annotated row per key."""
    pooled = pool_rows(rows)
    for dclass in {r.device_class for r in pooled}:
        of_class = [r for r in pooled if r.device_class == dclass]
        annotate(of_class, peaks(env, dclass), ci_target(env))
    return pooled


def pooled_view(rows: list[dict], env: dict) -> pd.DataFrame:
    """:func:`pooled_rows` as a DataFrame."""
    return pd.DataFrame([dataclasses.asdict(r) for r in pooled_rows(rows, env)])


def load_view(run_dir: str | Path) -> pd.DataFrame:
    """A run directory (or its results.jsonl) as its pooled, annotated view."""
    path = Path(run_dir)
    results = path / "results.jsonl" if path.is_dir() else path
    rows = read_rows(results)
    if not rows:
        raise SchemaError(f"{results}: no result rows")
    return pooled_view(rows, load_env(results.parent))
