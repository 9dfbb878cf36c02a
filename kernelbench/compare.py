"""Regression verdicts between two runs: the CI gate on speed and error.

``compare_runs(BASE, NEW)`` matches the rows of two run directories (or ``results.jsonl`` files)
by :data:`kernelbench.results.KEY_COLUMNS` and gives each a verdict; :func:`render` prints the
:class:`Comparison` as text, markdown or JSON. Nothing is written: both inputs are only read.

Speed. Each row is compared through its ``speedup`` (the same run's 16-bit baseline time over the
row's time), so runs taken on machines of different speed, or under different load, compare: the
baseline was measured beside the row, on the same inputs. When either run lacks a usable
``speedup`` the raw ``median_ms`` is compared instead, and the row's detail says so. The change is
the relative growth of the row's (normalised) time: ``+0.20`` is 20% slower.

Noise band. A row is ``slower`` only when its change exceeds *both* ``speed_tol`` and the two runs'
measured spread combined; ``faster`` is the mirror image. Each run's spread is the row's
``rel_spread`` (IQR / median), combined in quadrature with the 16-bit baseline row's ``rel_spread``
when the comparison goes through ``speedup`` (a ratio carries the noise of both times). A ``paired``
row (timed in alternation with its baseline, so that its ``speedup`` is two medians over the same
seconds) brings the spread of its pairs' ratios instead. The two runs' spreads are then combined in
quadrature too, ``sqrt(a**2 + b**2)``: the runs are independent measurements, and independent
relative errors of a ratio add in quadrature to first order. The linear sum ``a + b`` is the worst
case bound and would widen the band by up to ~41% for equal spreads, hiding real regressions;
quadrature is still conservative here because IQR / median measures the spread of single samples,
several times the uncertainty of a median of many samples. A spread from fewer than
:data:`MIN_SPREAD_SAMPLES` samples (or a missing ``rel_spread`` or baseline row) is not a
measurement: it adds nothing to the band, and a row whose change goes beyond the tolerance while a
spread is unmeasured is ``unknown`` (reported, with the reason), not ``slower``: noise cannot be
ruled out. A row pooled from R runs (``rounds``, made by ``kernelbench merge``) enters with
``rel_spread / sqrt(R)``: its spread is then one between independent runs, and the median of R such
draws is known that much better (see ``_spread``).

Error. ``rel_error`` is deterministic for fixed seeds and the same device class, so any growth
beyond ``error_tol`` (relative) plus :data:`ERROR_EPS` (absolute) is ``error-worse``.

Verdicts: ``faster``, ``slower``, ``same``, ``error-worse``, ``failed`` (ok in BASE, failed in
NEW), ``new`` (only in NEW), ``missing`` (only in BASE) and ``unknown`` (no verdict possible:
skipped or failed in BASE, skipped in NEW, no timing, or unmeasured noise). ``slower``,
``error-worse`` and ``failed`` are regressions; ``new``, ``missing`` and ``unknown`` are reported
and never fail the gate.

Exit codes (:attr:`Comparison.exit_code`): 0 no regression, 1 regression, 2 unusable input
(unreadable, empty or malformed file, schema mismatch, different device classes).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernelbench.results import (
    ENV_FILE,
    KEY_COLUMNS,
    READABLE_OLD_VERSIONS,
    RESULTS_FILE,
    SCHEMA_VERSION,
    SchemaError,
)
from kernelbench.results import read_rows as _read_rows

#: Absolute slack on ``rel_error`` growth. The int8 kernels are exact or per-element
#: deterministic, so for fixed seeds and one device class ``rel_error`` repeats bit for bit; the
#: only float noise left is the float64 summation order of the Frobenius norms (thread-dependent
#: reductions): at most ~N * 1.1e-16 relative for N <= ~1e7 output elements, i.e. below ~1e-9
#: relative and ~1e-10 absolute on errors <= 0.1. 1e-9 covers that with margin, while any real
#: change in quantization (a rounding rule, a lost outlier column) moves ``rel_error`` by
#: orders of magnitude more.
ERROR_EPS = 1e-9

#: The run's 16-bit baseline row (whose spread enters the band of ``speedup`` comparisons).
BASELINE_BACKEND, BASELINE_METHOD = "torch", "fp16"

#: Fewer timed samples than this give no usable spread (1 sample: IQR 0; 2: half their gap),
#: so a speed change beyond the tolerance on such rows is ``unknown``, not ``slower``.
MIN_SPREAD_SAMPLES = 3

EXIT_OK, EXIT_REGRESSION, EXIT_UNUSABLE = 0, 1, 2
REGRESSIONS = ("failed", "error-worse", "slower")
#: Display order: regressions first.
VERDICT_ORDER = ("failed", "error-worse", "slower", "missing", "unknown", "new", "faster", "same")
FORMATS = ("text", "markdown", "json")
_STATUSES = ("ok", "skipped", "failed")
_NUMERIC = ("median_ms", "rel_spread", "speedup", "rel_error", "baseline_ms")


@dataclass
class RowComparison:
    """One matched key. ``change`` is the relative growth of the row's time (through
    ``speedup`` when ``metric == "speedup"``), ``band`` the threshold it had to exceed."""

    key: tuple
    label: str
    verdict: str
    metric: str = ""  # "speedup" | "median_ms" | ""
    base_value: float | None = None
    new_value: float | None = None
    change: float | None = None
    noise: float | None = None
    band: float | None = None
    base_error: float | None = None
    new_error: float | None = None
    error_change: float | None = None  # relative growth of rel_error
    detail: str = ""

    @property
    def regression(self) -> bool:
        return self.verdict in REGRESSIONS


@dataclass
class Comparison:
    base: str
    new: str
    speed_tol: float
    error_tol: float
    rows: list[RowComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problem: str = ""  # non-empty: the inputs were unusable (exit 2)

    @property
    def regressions(self) -> list[RowComparison]:
        return [r for r in self.rows if r.regression]

    @property
    def exit_code(self) -> int:
        if self.problem:
            return EXIT_UNUSABLE
        return EXIT_REGRESSION if self.regressions else EXIT_OK

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in VERDICT_ORDER}
        for r in self.rows:
            out[r.verdict] += 1
        return {v: n for v, n in out.items() if n}


# --- reading a run (strict: a gate compares complete, well-formed runs only) -----------------


@dataclass
class LoadedRun:
    path: Path
    rows: dict[tuple, dict]
    env: dict
    duplicates: int

    @property
    def device_classes(self) -> set[str]:
        return {k[KEY_COLUMNS.index("device_class")] for k in self.rows}


def _results_path(path: Path) -> Path:
    return path / RESULTS_FILE if path.is_dir() else path


def _check_row(path: Path, i: int, row: dict) -> None:
    for c in KEY_COLUMNS:
        if not isinstance(row[c], (str, int)) or isinstance(row[c], bool):
            raise SchemaError(f"{path}: row {i}: {c} must be a string or integer, got {row[c]!r}")
    if row["status"] not in _STATUSES:
        raise SchemaError(f"{path}: row {i}: status {row['status']!r} is not one of {_STATUSES}")
    for c in _NUMERIC:
        v = row.get(c)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise SchemaError(f"{path}: row {i}: {c} must be a finite number >= 0, got {v!r}")


def load_run(path: Path) -> LoadedRun:
    """Rows keyed by KEY_COLUMNS (the last row of a key wins: ``--resume`` appends retries)."""
    path = Path(path)
    results = _results_path(path)
    if not results.is_file():
        raise SchemaError(f"{results}: no such file")
    try:
        text = results.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{results}: unreadable ({exc})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise SchemaError(f"{results}: empty (no result rows)")
    rows = _read_rows(results)
    if len(rows) != len(lines):  # read_rows forgives a torn last line; a gate does not
        raise SchemaError(f"{results}: the last line is not JSON (an interrupted run?)")
    keyed: dict[tuple, dict] = {}
    for i, row in enumerate(rows, 1):
        _check_row(results, i, row)
        keyed[tuple(row[c] for c in KEY_COLUMNS)] = row
    env_path = results.parent / ENV_FILE
    env: dict = {}
    if env_path.exists():
        try:
            env = json.loads(env_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SchemaError(f"{env_path}: not readable JSON ({exc})") from None
        if not isinstance(env, dict):
            raise SchemaError(f"{env_path}: not a JSON object")
        version = env.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION and version not in READABLE_OLD_VERSIONS:
            raise SchemaError(f"{env_path}: schema_version {version!r} is not {SCHEMA_VERSION}")
    return LoadedRun(results, keyed, env, len(rows) - len(keyed))


# --- verdicts -------------------------------------------------------------------------------


def _label(row: dict) -> str:
    size = row.get("size") or f"d={row['d_model']}"
    return (
        f"{row['case']} {size} {row['layer']} tokens={row['tokens']} "
        f"{row['backend']}/{row['method']}"
    )


def _spread(row: dict | None, field: str = "rel_spread") -> float | None:
    """The row's measured noise: ``row[field] / sqrt(rounds)``; ``None`` when it was not
    measured: no row, not ok, no ``field``, or fewer than :data:`MIN_SPREAD_SAMPLES` samples (one
    sample has IQR 0). ``field`` is ``paired_rel_spread`` for a paired row's ``speedup``: the
    spread of its pairs' ratios (both times of a pair saw the same machine).

    ``rounds`` > 1 for a row pooled from several runs (``kernelbench merge``): its spread then
    spans the drift between runs, which are independent draws of the machine's state, and the
    pooled median's uncertainty shrinks as ``1 / sqrt(rounds)`` of that spread (standard error of
    a median of R draws ~ 0.93 * IQR / sqrt(R)). Samples within one run are not independent (the
    drift is slow), so a single run's spread is never divided."""
    if row is None or row["status"] != "ok" or row.get(field) is None:
        return None
    if row.get("samples", 0) < MIN_SPREAD_SAMPLES:
        return None
    return row[field] / math.sqrt(max(1, int(row.get("rounds") or 1)))


def _run_noise(run: LoadedRun, row: dict, via_speedup: bool) -> list[float | None]:
    """The spreads that make up one run's noise on the compared metric: a paired row's pair
    ratios; else the row's own spread, and for a ``speedup`` ratio that of the run's 16-bit
    baseline row of the same cell (unless the row is that baseline)."""
    if via_speedup and row.get("paired"):
        return [_spread(row, "paired_rel_spread")]
    if not via_speedup or (row["backend"], row["method"]) == (BASELINE_BACKEND, BASELINE_METHOD):
        return [_spread(row)]
    swap = {"backend": BASELINE_BACKEND, "method": BASELINE_METHOD}
    baseline = run.rows.get(tuple(swap.get(c, row[c]) for c in KEY_COLUMNS))
    return [_spread(row), _spread(baseline)]


def _positive(v) -> bool:
    return v is not None and v > 0


def _speedup(row: dict) -> float | None:
    """baseline_ms / median_ms, derived from the measured times (not the stored ``speedup``,
    which an edited or partially written row may no longer agree with)."""
    if _positive(row.get("baseline_ms")) and _positive(row.get("median_ms")):
        return row["baseline_ms"] / row["median_ms"]
    return None


def _speed(
    rc: RowComparison, b: dict, n: dict, base: LoadedRun, new: LoadedRun, tol: float
) -> None:
    """Fill the speed fields of ``rc`` and set its verdict to faster / slower / same / unknown."""
    notes = []
    sb, sn = _speedup(b), _speedup(n)
    via_speedup = sb is not None and sn is not None
    if via_speedup:
        rc.metric, rc.base_value, rc.new_value = "speedup", sb, sn
        rc.change = sb / sn - 1.0
    elif _positive(b.get("median_ms")) and _positive(n.get("median_ms")):
        rc.metric, rc.base_value, rc.new_value = "median_ms", b["median_ms"], n["median_ms"]
        rc.change = n["median_ms"] / b["median_ms"] - 1.0
        notes.append("no 16-bit baseline speedup: compared raw median_ms (machine speed included)")
    else:
        rc.verdict, rc.detail = "unknown", "no timing to compare"
        return
    spreads = _run_noise(base, b, via_speedup) + _run_noise(new, n, via_speedup)
    rc.noise = math.sqrt(sum((s or 0.0) ** 2 for s in spreads))
    rc.band = max(tol, rc.noise)
    speed_gain = 1.0 / (1.0 + rc.change) - 1.0  # relative growth of speed
    if rc.change > rc.band:
        rc.verdict = "slower"
    elif speed_gain > rc.band:
        rc.verdict = "faster"
    else:
        rc.verdict = "same"
    unmeasured = sum(s is None for s in spreads)
    if unmeasured and rc.verdict != "same":
        notes.append(
            f"{rc.verdict} beyond the tolerance, but {unmeasured} of {len(spreads)} spreads were "
            f"not measured (< {MIN_SPREAD_SAMPLES} samples or no row): noise cannot be ruled out"
        )
        rc.verdict = "unknown"
    rc.detail = "; ".join(notes)


def _error(rc: RowComparison, b: dict, n: dict, tol: float) -> None:
    e0, e1 = b.get("rel_error"), n.get("rel_error")
    rc.base_error, rc.new_error = e0, e1
    if e0 is None or e1 is None:
        return
    rc.error_change = (e1 / e0 - 1.0) if e0 > 0 else (math.inf if e1 > 0 else 0.0)
    if e1 > e0 * (1.0 + tol) + ERROR_EPS:
        rc.verdict = "error-worse"


def _compare_row(key: tuple, base: LoadedRun, new: LoadedRun, speed_tol: float, error_tol: float):
    b, n = base.rows.get(key), new.rows.get(key)
    rc = RowComparison(key=key, label=_label(n or b), verdict="unknown")
    if b is None:
        rc.verdict = "new"
        return rc
    if n is None:
        rc.verdict = "missing"
        return rc
    if b["status"] != "ok" or n["status"] != "ok":
        if b["status"] == "ok":  # and NEW is not
            over_budget = str(n.get("reason", "")).startswith("over budget")
            # A row that ran and now does not (a backend that stopped building, a method that
            # stopped applying) is a regression; a budget skip depends on timing noise.
            rc.verdict = "failed" if n["status"] == "failed" or not over_budget else "unknown"
        rc.detail = f"base {b['status']}, new {n['status']}: {n.get('reason') or b.get('reason')}"
        return rc
    _speed(rc, b, n, base, new, speed_tol)
    _error(rc, b, n, error_tol)
    return rc


def _check_tolerances(speed_tol: float, error_tol: float) -> None:
    for name, tol in (("speed_tol", speed_tol), ("error_tol", error_tol)):
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")


def compare_runs(
    base: Path,
    new: Path,
    speed_tol: float = 0.10,
    error_tol: float = 0.0,
    backends: list[str] | None = None,
) -> Comparison:
    """Compare run NEW against run BASE (run directories or ``results.jsonl`` files).

    ``backends`` limits the verdicts to those backends' rows (a project gating its own kernels);
    the other rows still serve as the 16-bit baseline of their cell. Never raises on bad input
    files: an unusable input gives a Comparison with ``problem`` set
    and ``exit_code == 2``. Negative or non-finite tolerances are a programming error
    (:class:`ValueError`)."""
    _check_tolerances(speed_tol, error_tol)
    try:
        b_run, n_run = load_run(Path(base)), load_run(Path(new))
    except SchemaError as exc:
        return Comparison(str(base), str(new), speed_tol, error_tol, problem=str(exc))
    return compare_loaded_runs(b_run, n_run, speed_tol, error_tol, backends)


def compare_loaded_runs(
    b_run: LoadedRun,
    n_run: LoadedRun,
    speed_tol: float = 0.10,
    error_tol: float = 0.0,
    backends: list[str] | None = None,
) -> Comparison:
    """:func:`compare_runs` on runs already read with :func:`load_run` (e.g. to compare many
    pairs, or an edited copy of a run, without writing files)."""
    _check_tolerances(speed_tol, error_tol)
    cmp = Comparison(str(b_run.path), str(n_run.path), speed_tol, error_tol)
    if b_run.device_classes != n_run.device_classes:
        cmp.problem = (
            f"different device classes: base {sorted(b_run.device_classes)}, new "
            f"{sorted(n_run.device_classes)}; compare runs of the same machine class"
        )
        return cmp
    for run in (b_run, n_run):
        if run.duplicates:
            cmp.notes.append(f"{run.path}: {run.duplicates} repeated key(s); the last row counts")
    commits = [r.env.get("git_commit") for r in (b_run, n_run)]
    if all(commits):
        cmp.notes.append(f"git commits: base {commits[0]}, new {commits[1]}")
    keys = list(b_run.rows) + [k for k in n_run.rows if k not in b_run.rows]
    if backends:
        col = KEY_COLUMNS.index("backend")
        unknown = sorted(set(backends) - {k[col] for k in keys})
        if unknown:
            cmp.problem = f"no rows of backend(s) {unknown} in either run"
            return cmp
        keys = [k for k in keys if k[col] in backends]
        cmp.notes.append(f"verdicts for backend(s) {', '.join(backends)} only")
    cmp.rows = [_compare_row(k, b_run, n_run, speed_tol, error_tol) for k in keys]
    cmp.rows.sort(key=lambda r: VERDICT_ORDER.index(r.verdict))  # stable: file order within
    return cmp


# --- rendering -------------------------------------------------------------------------------


def _pct(v: float | None) -> str:
    return "" if v is None else ("inf" if math.isinf(v) else f"{v * 100:+.1f}%")


def _speed_cell(r: RowComparison) -> str:
    if not r.metric:
        return ""
    unit = "x" if r.metric == "speedup" else " ms"
    return f"{r.base_value:.4g}{unit} -> {r.new_value:.4g}{unit}"


def _error_cell(r: RowComparison) -> str:
    if r.base_error is None or r.new_error is None:
        return ""
    grew = f" ({_pct(r.error_change)})" if r.error_change else ""
    return f"{r.base_error:.3e} -> {r.new_error:.3e}{grew}"


def _cells(r: RowComparison) -> list[str]:
    band = "" if r.band is None else f"±{r.band * 100:.1f}%"
    return [
        r.verdict,
        r.label,
        _speed_cell(r),
        _pct(r.change),
        band,
        _error_cell(r),
        r.detail,
    ]


_HEADER = ["verdict", "row", "speed base -> new", "time change", "band", "rel_error", "detail"]


def _summary(c: Comparison) -> str:
    if c.problem:
        return f"UNUSABLE INPUT (exit 2): {c.problem}"
    counts = ", ".join(f"{n} {v}" for v, n in c.counts().items()) or "no rows"
    state = "REGRESSION (exit 1)" if c.exit_code == EXIT_REGRESSION else "OK (exit 0)"
    return f"{state}: {len(c.rows)} rows: {counts}"


def _skipped_in_both(r: RowComparison) -> bool:
    return r.verdict == "unknown" and r.detail.startswith("base skipped, new skipped")


def _shown(c: Comparison) -> tuple[list[RowComparison], list[str]]:
    """The rows the text and markdown tables list, and notes: rows skipped in both runs (a
    backend that does not implement a method, a CUDA backend on a CPU run: most rows of a CPU
    sweep) are counted, not listed; JSON lists every row."""
    shown = [r for r in c.rows if not _skipped_in_both(r)]
    hidden = len(c.rows) - len(shown)
    notes = [f"{hidden} rows skipped in both runs are not listed (--format json lists them)"]
    return shown, c.notes + (notes if hidden else [])


def _text(c: Comparison) -> str:
    head = [
        f"base: {c.base}",
        f"new:  {c.new}",
        f"speed_tol {c.speed_tol:.0%}, error_tol {c.error_tol:g} (+{ERROR_EPS:g} abs)",
    ]
    rows, notes = _shown(c)
    table = [_HEADER] + [_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_HEADER))]
    body = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]
    notes = [f"note: {n}" for n in notes]
    return "\n".join(head + ([""] + body if rows else []) + [""] + notes + [_summary(c)]) + "\n"


def _markdown(c: Comparison) -> str:
    def md(row: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"

    out = [f"### kernelbench compare: {_summary(c)}", "", f"base `{c.base}` · new `{c.new}`", ""]
    rows, notes = _shown(c)
    if rows:
        out += [md(_HEADER), "|" + "---|" * len(_HEADER)] + [md(_cells(r)) for r in rows] + [""]
    out += [f"- {n}" for n in notes]
    return "\n".join(out).rstrip() + "\n"


def _json(c: Comparison) -> str:
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    rows = []
    for r in c.rows:
        d = {k: clean(v) for k, v in asdict(r).items()}
        d["key"] = dict(zip(KEY_COLUMNS, r.key, strict=True))
        d["regression"] = r.regression
        rows.append(d)
    doc = {
        "exit_code": c.exit_code,
        "problem": c.problem,
        "base": c.base,
        "new": c.new,
        "speed_tol": c.speed_tol,
        "error_tol": c.error_tol,
        "error_eps": ERROR_EPS,
        "counts": c.counts(),
        "notes": c.notes,
        "rows": rows,
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def render(comparison: Comparison, fmt: str = "text") -> str:
    """The comparison as ``text`` (terminal / CI log), ``markdown`` (PR comment) or ``json``."""
    renderers = {"text": _text, "markdown": _markdown, "json": _json}
    if fmt not in renderers:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return renderers[fmt](comparison)
