"""Result rows: the versioned schema of ``results.jsonl`` and ``env.json``, written as measured.

Every row is one (case, size, tokens, layer, backend, method) on one device. Rows are appended
and flushed one by one, so a killed run loses nothing it measured; :func:`load_results` reads a
run directory into a pandas DataFrame in one call. The schema is documented field by field in
``docs/results-schema.md``; bump :data:`SCHEMA_VERSION` on any incompatible change.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 2
RESULTS_FILE = "results.jsonl"
ENV_FILE = "env.json"

#: Columns that identify a row: two rows with the same key measure the same thing.
KEY_COLUMNS = ("case", "d_model", "tokens", "layer", "backend", "method", "device_class")


@dataclass
class ResultRow:
    # what was measured
    case: str
    size: str  # the model's name in the case, e.g. "175B"
    d_model: int
    layer: str
    tokens: int
    m: int
    k: int
    n: int
    dist: str  # activation distribution
    seed: int
    backend: str
    method: str
    device: str  # "cpu" | "cuda"
    device_class: str  # e.g. "cpu-avx2-2core", "cuda-NVIDIA H200"
    dtype: str  # the layer's 16-bit dtype
    status: str = "ok"  # "ok" | "skipped" | "failed"
    reason: str = ""
    skip_kind: str | None = None  # a core.SkipKind value when status == "skipped"
    round: int = 0  # which round of the run measured this row (a run visits its cells R times)
    # timing (milliseconds)
    median_ms: float | None = None
    iqr_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    rel_spread: float | None = None  # iqr / median
    samples: int = 0
    rounds: int = 1  # runs pooled into this row by `kernelbench merge` (1: one run)
    raw_ms: list[float] = field(default_factory=list)
    stages_ms: dict[str, float] = field(default_factory=dict)
    threads: int | None = None
    variant: str = ""  # what a peer computed when it differs from the asked-for configuration
    compile_s: float | None = None  # one-off compile time (torch.compile), never timed
    throttled_samples: int = 0
    # speed relative to the same run's baselines on the same inputs
    baseline_ms: float | None = None  # the device's 16-bit baseline (fp16 CUDA, bf16 CPU)
    # (when `paired`: its median in this row's pairs; otherwise the cell's baseline row)
    speedup: float | None = None  # median of the pairs' baseline / row ratios (paired rows)
    # 95% bootstrap confidence interval of ``speedup`` (over the pairs; None: fewer than 2 pairs)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    # paired timing (timing.time_paired): the row's calls alternated with the 16-bit baseline's,
    # so baseline_ms is the baseline's median over the same seconds as the row's median_ms
    paired: bool = False
    baseline_raw_ms: list[float] = field(default_factory=list)  # aligned with raw_ms
    paired_speedup: float | None = None  # median of the pairs' baseline / row ratios
    paired_rel_spread: float | None = None  # IQR / median of those ratios
    tops: float | None = None  # flops / median, in 1e12 ops per second
    flops: float | None = None  # declared work of one call (core.work_flops)
    bytes: float | None = None  # declared least memory traffic of one call (core.work_bytes)
    paper_speedup: float | None = None  # the paper's App. D.1 figure for this cell, if any
    # accuracy against the float64 oracle
    rel_error: float | None = None  # relative Frobenius error
    max_abs_error: float | None = None
    baseline_rel_error: float | None = None  # the 16-bit baseline's error on the same inputs
    outlier_cols: int | None = None  # outlier columns the backend detected
    planted_outlier_cols: int | None = None  # outlier columns the input generator planted
    # memory
    weight_bytes: int | None = None
    weight_bytes_16bit: int | None = None
    peak_mem_bytes: int | None = None
    # bookkeeping
    host: str = ""
    timestamp: str = ""
    schema_version: int = SCHEMA_VERSION

    def key(self) -> tuple:
        return tuple(getattr(self, c) for c in KEY_COLUMNS)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), allow_nan=False, default=_jsonable)


def _jsonable(obj: Any):
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


#: Older schema versions this code reads, upgraded row by row by :func:`upgrade_row`.
READABLE_OLD_VERSIONS = (1,)


def upgrade_row(row: dict) -> dict:
    """A schema-1 row as a schema-2 row: the unpaired ``speedup_fp32`` is dropped (fp32 is shown
    as absolute time only), the skip kind is read from the reason once, here, and the fields
    schema 2 added are absent (``None``): an old run has no intervals."""
    row = dict(row)
    row.pop("speedup_fp32", None)
    if row.get("status") == "skipped" and "skip_kind" not in row:
        over = str(row.get("reason", "")).startswith("over budget")
        row["skip_kind"] = "over_budget" if over else "unsupported"
    row["schema_version"] = SCHEMA_VERSION
    return row


class SchemaError(ValueError):
    """A results file that is not kernelbench results of a version this code can read."""


class ResultsWriter:
    """Appends rows to ``<out>/results.jsonl``, one flushed line each (safe against ^C)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / RESULTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def done_keys(self) -> set[tuple]:
        """Keys of rows already measured (for ``--resume``): ok rows and rows skipped because
        they do not apply count as done; failed rows and rows skipped over the time budget
        (which depends on ``--max-call``) are tried again."""
        if not self.path.exists():
            return set()
        rows = read_rows(self.path)
        return {
            tuple(r[c] for c in KEY_COLUMNS)
            for r in rows
            if r["status"] == "ok"
            or (r["status"] == "skipped" and not str(r.get("reason", "")).startswith("over budget"))
        }

    def append(self, row: ResultRow) -> None:
        line = row.to_json()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_rows(path: Path) -> list[dict]:
    """Rows of a results.jsonl, validated; a torn last line (a killed writer) is skipped."""
    path = Path(path)
    if not path.exists():
        raise SchemaError(f"{path}: no such file")
    rows: list[dict] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):  # a torn final line from an interrupted write
                continue
            raise SchemaError(f"{path}:{i}: not JSON ({exc.msg})") from None
        version = row.get("schema_version") if isinstance(row, dict) else None
        if version in READABLE_OLD_VERSIONS:
            row = upgrade_row(row)
            version = row["schema_version"]
        if version != SCHEMA_VERSION:
            raise SchemaError(f"{path}:{i}: schema_version {version!r} is not {SCHEMA_VERSION}")
        missing = [c for c in (*KEY_COLUMNS, "status") if c not in row]
        if missing:
            raise SchemaError(f"{path}:{i}: missing fields {missing}")
        rows.append(row)
    return rows


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """A run directory (or a results.jsonl path) as a DataFrame, one row per result."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / RESULTS_FILE
    rows = read_rows(path)
    if not rows:
        raise SchemaError(f"{path}: no result rows")
    return pd.DataFrame(rows)


def load_env(run_dir: str | Path) -> dict:
    path = Path(run_dir) / ENV_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))
