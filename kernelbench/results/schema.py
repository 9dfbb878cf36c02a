"""Result rows: the versioned schema of ``results.jsonl`` and ``env.json``, written as measured.

Every row is one (case, size, tokens, layer, backend, method) on one device. Rows are appended
and flushed one by one, so a killed run loses nothing it measured; :func:`load_results` reads a
run directory into a pandas DataFrame in one call. The schema is documented field by field in
``docs/results-schema.md``; bump :data:`SCHEMA_VERSION` on any incompatible change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kernelbench.core import BASELINE
from kernelbench.settings import default

SCHEMA_VERSION = 3
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
    # pooled rows: how many of raw_ms each pooled round gave, in order (empty as written)
    round_samples: list[int] = field(default_factory=list)
    stages_ms: dict[str, float] = field(default_factory=dict)
    threads: int | None = None
    variant: str = ""  # what a peer computed when it differs from the asked-for configuration
    # where the backend came from: "builtin", "plugin <distribution> <version>", "file <path>"
    origin: str = "builtin"
    compile_s: float | None = None  # one-off compile time (torch.compile), never timed
    # seconds building the runner in this round (quantizing, packing the weight; never timed);
    # None: an earlier round's runner was kept. Pooled: the sum over the rounds that built one
    build_s: float | None = None
    throttled_samples: int = 0
    # caches at each timed call: "cold" (evicted before it: weights and activations read from
    # memory, as a model's layer does once per token) or "hot" (as the previous calls left them)
    cache: str = default("cache")
    # what each timed call saw besides computing, aligned with raw_ms (getrusage deltas over
    # the process's threads): page faults and context switches
    minor_faults: list[int] = field(default_factory=list)
    major_faults: list[int] = field(default_factory=list)
    vol_switches: list[int] = field(default_factory=list)
    invol_switches: list[int] = field(default_factory=list)
    # the memory bus's read bandwidth (GB/s) just before each timed call, aligned with raw_ms:
    # the cold-cache eviction's read rate, a reading, not a bound (empty: hot rows, CUDA)
    bus_gbps: list[float] = field(default_factory=list)
    # the round trip (ns) of a cache line between two of the run's threads just before each
    # timed call, aligned with raw_ms: where the host ran them (empty: hot rows, CUDA, one thread)
    link_ns: list[float] = field(default_factory=list)
    # how long a fixed chain of integer steps took on two of the run's threads just before each
    # timed call (ns), aligned with raw_ms: how fast the cores ran (empty: hot rows, CUDA, one
    # thread, older rows)
    core_ns: list[float] = field(default_factory=list)
    # how long the timer waited for the cores to run at their usual speed before each timed
    # call (ms), aligned with raw_ms (empty: no wait asked, hot rows, CUDA, older rows)
    core_wait_ms: list[float] = field(default_factory=list)
    steal_share: float | None = None  # CPU time the hypervisor stole while the cell was timed
    # cold CPU rows: bytes of the tensors the call reads (weights, activations, buffers) whose
    # cache lines were flushed before each timed call; below weight_bytes, part of the weights
    # was not found (memory outside tensors) and may have stayed in cache
    evicted_bytes: int | None = None
    # speed relative to the same run's baselines on the same inputs
    baseline_ms: float | None = None  # the device's 16-bit baseline (fp16 CUDA, bf16 CPU)
    # (when `paired`: its median in this row's pairs; otherwise the cell's baseline row)
    speedup: float | None = None  # median of the pairs' baseline / row ratios (paired rows)
    # 95% bootstrap confidence interval of ``speedup`` (over the pairs, and over the rounds of a
    # pooled row; None: fewer than 2 pairs)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    # paired timing (measure.py): each of the row's calls is paired with the 16-bit baseline
    # interpolated between the baseline calls around it, so baseline_ms is the baseline's median
    # over the same seconds as the row's median_ms
    paired: bool = False
    baseline_raw_ms: list[float] = field(default_factory=list)  # aligned with raw_ms
    paired_speedup: float | None = None  # median of the pairs' baseline / row ratios
    paired_rel_spread: float | None = None  # IQR / median of those ratios
    tops: float | None = None  # flops / median, in 1e12 ops per second
    flops: float | None = None  # declared work of one call (core.work_flops)
    bytes: float | None = None  # declared least memory traffic of one call (core.work_bytes)
    # physics checks, set on the pooled view of a run (kernelbench.results.physics), empty as
    # written
    roofline_tops: float | None = None  # attainable throughput: compute peak or bandwidth bound
    roofline_share: float | None = None  # tops / roofline_tops
    # the same share with, for each call, the bandwidth the bus gave just before it (bus_gbps)
    # instead of the measured peak: the median over the calls (a cold CPU row only)
    bus_roofline_share: float | None = None
    cache_resident: bool = False  # a hot row whose working set fits in a cache level
    # a cold row above its roofline at the measured peak but within the bus's bandwidth before
    # its calls, which ran in a placement of the threads the peak has no figure for: the peak
    # is behind there (shown, never a flag)
    above_peak: bool = False
    ci_wide: bool = False  # the speedup's interval is wider than the run's ci_target
    suspect: bool = False  # breaks physics beyond its interval (ordering, above roofline)
    suspect_reason: str = ""
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
READABLE_OLD_VERSIONS = (1, 2)

#: The fields aligned with ``raw_ms`` that say what each timed call saw.
USAGE_FIELDS = ("minor_faults", "major_faults", "vol_switches", "invol_switches")


def upgrade_row(row: dict) -> dict:
    """An older row as a current one. Schema 1: the unpaired ``speedup_fp32`` is dropped (fp32
    is shown as absolute time only), the skip kind is read from the reason once, here, and the
    fields schema 2 added are absent (``None``): an old run has no intervals. Schemas 1 and 2:
    ``cache`` is what those runs did: CPU calls found the caches as the previous calls left
    them (``hot``), CUDA calls had the L2 flushed before each (``cold``); no per-call usage."""
    row = dict(row)
    row.pop("speedup_fp32", None)
    if row.get("status") == "skipped" and "skip_kind" not in row:
        over = str(row.get("reason", "")).startswith("over budget")
        row["skip_kind"] = "over_budget" if over else "unsupported"
    if "cache" not in row:
        row["cache"] = "cold" if row.get("device") == "cuda" else "hot"
    row["schema_version"] = SCHEMA_VERSION
    return row


def third_party_label(rows: pd.DataFrame, detail: bool = True) -> str:
    """`` (third-party: plugin kb-int8-numpy 0.1.0)`` (or `` (third-party)`` without
    ``detail``) when ``rows``' backend did not come with kernelbench; ``""`` when it did."""
    if "origin" not in rows:
        return ""
    origins = sorted({str(o) for o in rows["origin"].dropna()} - {"", "builtin"})
    if not origins:
        return ""
    return f" (third-party: {'; '.join(origins)})" if detail else " (third-party)"


class SchemaError(ValueError):
    """A results file that is not kernelbench results of a version this code can read."""


class SkippedLinesWarning(UserWarning):
    """Lines of a results file that were not rows (not JSON, missing fields...), skipped."""


_STATUSES = ("ok", "skipped", "failed")
#: Fields every row must carry to be read at all; any other missing field gets its default.
REQUIRED_FIELDS = (*KEY_COLUMNS, "status")
_FIELD_DEFAULTS: dict[str, Any] = {
    f.name: (
        f.default
        if f.default is not dataclasses.MISSING
        else f.default_factory()  # type: ignore[misc]
        if f.default_factory is not dataclasses.MISSING
        else ("" if f.type == "str" else None)
    )
    for f in dataclasses.fields(ResultRow)
}


@dataclass(frozen=True)
class SkippedLine:
    line: int  # 1-based line number in the file
    why: str

    def __str__(self) -> str:
        return f"line {self.line} ({self.why})"


@dataclass
class RunRows:
    """What one results file holds: its rows, in file order, and the lines that were not rows."""

    path: Path
    rows: list[dict]
    skipped: list[SkippedLine] = field(default_factory=list)
    torn_tail: bool = False  # the last line is cut off (a writer killed mid-line)

    def skipped_message(self) -> str:
        """One line naming the skipped lines (empty when none were)."""
        if not self.skipped:
            return ""
        shown = ", ".join(str(s) for s in self.skipped[:5])
        more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        torn = " - the last line is cut off: an interrupted run?" if self.torn_tail else ""
        return (
            f"{self.path}: skipped {len(self.skipped)} line(s) that are not rows: "
            f"{shown}{more}{torn}"
        )


def results_path(run: str | Path) -> Path:
    """``run`` itself when it is a file, else ``run/results.jsonl``."""
    path = Path(run)
    return path / RESULTS_FILE if path.is_dir() else path


def _parse_line(text: str) -> dict | str:
    """A row (upgraded to this schema, optional fields filled) or why the line is not one."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc.msg}"
    if not isinstance(row, dict):
        return "not a JSON object"
    version = row.get("schema_version")
    if version in READABLE_OLD_VERSIONS:
        row = upgrade_row(row)
        version = row["schema_version"]
    if version != SCHEMA_VERSION:
        return f"schema_version {version!r} is not {SCHEMA_VERSION}"
    missing = [c for c in REQUIRED_FIELDS if c not in row]
    if missing:
        return f"missing fields {missing}"
    for c in KEY_COLUMNS:
        if not isinstance(row[c], (str, int)) or isinstance(row[c], bool):
            return f"{c} must be a string or an integer, got {row[c]!r}"
    if row["status"] not in _STATUSES:
        return f"status {row['status']!r} is not one of {', '.join(_STATUSES)}"
    defaults = {
        k: type(v)() if isinstance(v, (list, dict)) else v for k, v in _FIELD_DEFAULTS.items()
    }
    return {**defaults, **row}


def read_run_rows(run: str | Path, strict: bool = False) -> RunRows:
    """Every row of a run's results file, with one policy for lines that are not rows: they are
    skipped and listed (:attr:`RunRows.skipped`, with their line numbers) - or, with ``strict``
    (a gate, a baseline), refused. Raises :class:`SchemaError` for a missing or unreadable file
    and for a file without a single row."""
    path = results_path(run)
    if not path.is_file():
        raise SchemaError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}: unreadable ({exc})") from None
    result = RunRows(path, [])
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parsed = _parse_line(line)
        if isinstance(parsed, str):
            result.skipped.append(SkippedLine(i, parsed))
        else:
            result.rows.append(parsed)
    last = result.skipped[-1] if result.skipped else None
    result.torn_tail = bool(
        last and last.line == len(lines) and last.why.startswith("not JSON")
        and not text.endswith("\n")
    )  # fmt: skip
    if not result.rows:
        if not result.skipped:
            raise SchemaError(f"{path}: empty (no result rows)")
        raise SchemaError(f"{path}: no result rows ({result.skipped[0]})")
    if strict and result.skipped:
        raise SchemaError(result.skipped_message().replace("skipped", "found", 1))
    return result


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a results file (:func:`read_run_rows`); skipped lines are announced as a
    :class:`SkippedLinesWarning`."""
    run = read_run_rows(path)
    _warn_skipped(run)
    return run.rows


def _warn_skipped(run: RunRows) -> None:
    if run.skipped:
        warnings.warn(run.skipped_message(), SkippedLinesWarning, stacklevel=3)


def load_results(run_dir: str | Path) -> pd.DataFrame:
    """A run directory (or a results.jsonl path) as a DataFrame, one row per result. Lines that
    are not rows are skipped with a :class:`SkippedLinesWarning` naming them; their
    :class:`SkippedLine` s are also in ``df.attrs["skipped_lines"]``."""
    run = read_run_rows(run_dir)
    _warn_skipped(run)
    df = pd.DataFrame(run.rows)
    df.attrs["skipped_lines"] = list(run.skipped)
    return df


def load_env(run_dir: str | Path) -> dict:
    """A run's ``env.json`` (``{}`` when there is none); :class:`SchemaError` when it is not a
    JSON object."""
    path = Path(run_dir) / ENV_FILE
    if not path.exists():
        return {}
    try:
        env = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(env, dict):
        raise SchemaError(f"{path}: not a JSON object")
    return env


# --- writing ---------------------------------------------------------------------------------


def write_env(run_dir: str | Path, env: dict) -> None:
    """Write a run's ``env.json`` (indented; values JSON cannot hold as their text)."""
    path = Path(run_dir) / ENV_FILE
    path.write_text(json.dumps(env, indent=2, default=str), encoding="utf-8")


def _retry_on_resume(row: dict) -> bool:
    """Failed rows and rows skipped for this run's limits (over budget, not run) are measured
    again by ``--resume``; ok rows and rows that cannot run here are kept."""
    if row["status"] == "failed":
        return True
    if row["status"] != "skipped":
        return False
    kind = row.get("skip_kind")
    if kind is None:  # a row written without a kind: read it the way upgrade_row does
        kind = "over_budget" if str(row.get("reason", "")).startswith("over budget") else ""
    return kind in ("over_budget", "not_run")


class ResultsWriter:
    """Appends rows to ``<out>/results.jsonl``, one flushed line each (safe against ^C)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / RESULTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def written_rows(self) -> list[dict]:
        """The rows already in the file (``[]`` when there is none yet)."""
        if not self.path.exists():
            return []
        try:
            return read_run_rows(self.path).rows
        except SchemaError:  # an empty file: nothing done yet
            return []

    def done_keys(self, rows: list[dict] | None = None) -> set[tuple]:
        """``(key, round)`` of the rows already measured (for ``--resume``): every row except
        those :func:`_retry_on_resume` measures again; ``rows``: the file's, read already."""
        rows = self.written_rows() if rows is None else rows
        return {
            (tuple(r[c] for c in KEY_COLUMNS), r.get("round") or 0)
            for r in rows
            if not _retry_on_resume(r)
        }

    def repair_tail(self) -> str:
        """Cut a torn last line (a write killed half-way) so the next row starts on a line of its
        own; returns what was done, empty when the file ended with a complete line."""
        if not self.path.exists():
            return ""
        with self.path.open("rb+") as fh:
            data = fh.read()
            if not data or data.endswith(b"\n"):
                return ""
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            if isinstance(_parse_line(tail.decode("utf-8", "replace")), dict):
                fh.write(b"\n")  # a complete row that only lost its newline
                return ""
            fh.truncate(cut)
            fh.flush()
            os.fsync(fh.fileno())
        line = data.count(b"\n") + 1
        return f"cut a torn last line (line {line}, {len(tail)} bytes) from {self.path}"

    def append(self, row: ResultRow) -> None:
        line = row.to_json()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def rewrite(self, rows: list[dict]) -> None:
        """Replace the file by ``rows`` atomically (a kill leaves the old file or the new one)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, allow_nan=False, default=_jsonable) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def _cell_of(row: dict) -> tuple:
    return tuple(row[c] for c in KEY_COLUMNS if c not in ("backend", "method"))


def complete_speedups(out_dir: Path) -> int:
    """Give every ok row without a speedup one from its cell's 16-bit baseline row (same round
    when there is one): rows measured by ``--resume`` after their baseline was measured in an
    earlier attempt. Rewrites the file only when a row changed; returns how many did."""
    writer = ResultsWriter(out_dir)
    rows = read_run_rows(writer.path).rows
    base: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] == "ok" and (r["backend"], r["method"]) == BASELINE and r.get("median_ms"):
            base.setdefault(_cell_of(r), r)
            base[(*_cell_of(r), r.get("round", 0))] = r
    changed = 0
    for r in rows:
        if r["status"] != "ok" or r.get("speedup") is not None or not r.get("median_ms"):
            continue
        b = base.get((*_cell_of(r), r.get("round", 0))) or base.get(_cell_of(r))
        if b is None:
            continue
        r["baseline_ms"] = b["median_ms"]
        r["speedup"] = b["median_ms"] / r["median_ms"]
        if r.get("baseline_rel_error") is None:
            r["baseline_rel_error"] = b.get("rel_error")
        changed += 1
    if changed:
        writer.rewrite(rows)
    return changed


# --- the run directory -----------------------------------------------------------------------

#: Files a run writes into its directory; a directory holding one of them holds a run.
RUN_FILES = (RESULTS_FILE, ENV_FILE, "report.html", "compare.html")
#: The env.json entry holding the settings every row of a run was measured with.
SETTINGS_KEY = "settings"
#: env.json: the seconds a run's extra rounds took, over every process that ran them.
EXTRA_KEY = "extra_rounds_s"
#: env.json: the cells a run's extra rounds left out for their cost (the last round that
#: offered them), each with its estimated and the round's remaining seconds.
LEFT_OUT_KEY = "extra_left_out"


def env_seconds(value) -> float:
    """A number of seconds read from a run's env.json (0 where it is none)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return 0.0
    return seconds if 0 <= seconds < float("inf") else 0.0


class RunDirError(ValueError):
    """An output directory a run cannot use (the message says why)."""


def holds_run(out: Path) -> bool:
    return any((Path(out) / name).exists() for name in RUN_FILES)


def _writable_dir(path: Path) -> bool:
    """Whether a file can be made in ``path``: tried, by creating and removing a probe file
    (``os.access`` says yes to root everywhere, /proc and /sys included)."""
    if not path.is_dir():
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".kernelbench-probe-", dir=path)
    except OSError:
        return False
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        return False
    return True


def check_out_dir(out: Path, move_old: bool) -> None:
    """Raise :class:`RunDirError` unless a run can write into ``out``: a directory (or a path
    that can become one) that is writable; with ``move_old``, its parent must be writable too,
    so that an earlier run there can be moved aside."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, not a directory")
    if out.is_dir():
        if not _writable_dir(out):
            raise RunDirError(f"--out {out} is not writable")
        if move_old and holds_run(out) and not _writable_dir(out.resolve().parent):
            raise RunDirError(
                f"--out {out} holds a run that cannot be moved aside ({out.resolve().parent} is "
                "not writable); give another --out, or --resume"
            )
        return
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not _writable_dir(ancestor):
        raise RunDirError(f"--out {out} cannot be created: {ancestor} is not a writable directory")


def move_aside(out: Path) -> Path:
    """Rename the run directory ``out`` to a timestamped sibling (``latest`` ->
    ``latest.2026-01-31T12-00-00``) and return that path; nothing is deleted."""
    out = Path(out)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H-%M-%S")
    dest = out.with_name(f"{out.name}.{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = out.with_name(f"{out.name}.{stamp}-{n}")
    os.rename(out, dest)
    return dest


def settings_differences(stored_env: dict, settings: dict) -> list[str]:
    """The settings whose value in a run's ``env.json`` differs from ``settings`` (as
    ``"name: stored -> new"``); a run written before settings were recorded compares none."""
    stored = stored_env.get(SETTINGS_KEY)
    if not isinstance(stored, dict):
        return []
    return [
        f"{name}: {stored.get(name)!r} -> {value!r}"
        for name, value in settings.items()
        if name in stored and _same_json(stored[name]) != _same_json(value)
    ]


def _same_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
