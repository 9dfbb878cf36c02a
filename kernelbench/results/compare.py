"""Regression verdicts between two runs: the CI gate on speed and error.

``compare_runs(BASE, NEW)`` matches the rows of two run directories (or ``results.jsonl`` files)
by :data:`kernelbench.results.schema.KEY_COLUMNS` and gives each a verdict; :func:`render` prints
the :class:`Comparison` as text, markdown or JSON. Nothing is written: both inputs are only read.

Speed. Each row is compared through its ``speedup`` (the same run's 16-bit baseline time over the
row's time), so runs taken on machines of different speed, or under different load, compare: the
baseline was measured beside the row, on the same inputs. When either run lacks a usable
``speedup`` the raw ``median_ms`` is compared instead, and the row's detail says so. The change is
the relative growth of the row's (normalised) time: ``+0.20`` is 20% slower.

Noise band. The speed verdict is :func:`kernelbench.results.verdict.speed_verdict`, the same
function the HTML A/B report uses: a row is ``slower`` only beyond both ``speed_tol`` and the two
runs' noise (each speedup's 95% interval where it has one), and ``unknown`` when the noise was not
measured. Each run's noise is widened by the spread between runs kept for their processor, when
one is (:mod:`kernelbench.results.spread`): a run's interval covers the drift between its
rounds, not the host's drift between runs. Rows of one key (a run's rounds) are pooled first
(:func:`kernelbench.results.merge.pool_rows`). Where both runs record the threads' link (cold
CPU runs on a host that moves them between one core complex and two), a row called slower or
faster pooled is judged again in each placement both runs met it in
(:func:`kernelbench.results.verdict.placement_verdict`): a pooled speedup mixes the placements
in the shares the row met them, and those shares move between runs.

Error. ``rel_error`` is deterministic for fixed seeds on one processor, so any growth beyond
``error_tol`` (relative) plus :data:`ERROR_EPS` (absolute) is ``error-worse``. Between two
processors a library's float GEMM may take another kernel, and another summation order (oneDNN's
bf16 GEMM moved one error by 1.5e-4 relative between a Zen 4 and a Zen 5; its fp32 GEMM one by
34%, at 1e-7): there an error is worse only beyond :data:`CROSS_PROCESSOR_ERROR_TOL` relative
and :data:`CROSS_PROCESSOR_ERROR_ABS` absolute too; an exact row (error 0) still gates at
``ERROR_EPS``.

Verdicts: ``faster``, ``slower``, ``same``, ``error-worse``, ``failed`` (ok in BASE, failed in
NEW), ``new`` (only in NEW), ``missing`` (only in BASE) and ``unknown`` (no verdict possible:
skipped or failed in BASE, skipped in NEW, no timing, or unmeasured noise). ``slower``,
``error-worse`` and ``failed`` are regressions; ``new``, ``missing`` and ``unknown`` are reported
and never fail the gate.

Comparable machines. One device class can hold different machines (one class name, two
processors, or one processor whose host gives it half the bandwidth): when both runs' env.json
record the processor's identity (``cpu.identity``: vendor, family, model, stepping) and it
differs, or a measured peak (``peak``: int8, 16-bit, fp32 TOPS, bandwidth) differs by more than
its tolerance (:data:`PEAK_TOLS`), the machines are not comparable. A peak is judged by its
range: from the lowest quiet reading the cache kept of it (``readings``) to its best call, the
figure the rooflines use; two ranges that overlap are one host's own spread. Speed differences
are then not judged (the rows' speed verdicts are ``unknown``, saying why) and, without an error
regression, the exit code is 3. Runs that do not record these fields compare as before.

Exit codes (:attr:`Comparison.exit_code`): 0 no regression, 1 regression, 2 unusable input
(unreadable, empty or malformed file, schema mismatch, different device classes), 3 no error
regression, but the machines are not comparable: speed not judged.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import html
import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernelbench.core import BASELINE, SkipKind
from kernelbench.results.merge import pool_rows
from kernelbench.results.schema import (
    ENV_FILE,
    KEY_COLUMNS,
    READABLE_OLD_VERSIONS,
    SCHEMA_VERSION,
    SchemaError,
    load_env,
    read_run_rows,
    results_path,
)
from kernelbench.results.states import BusSplit, far_share
from kernelbench.results.verdict import (
    RunSpread,
    joint_split,
    judge,
    link_readings,
    most_rounds,
)

#: Absolute slack on ``rel_error`` growth. The int8 kernels are exact or per-element
#: deterministic, so for fixed seeds and one device class ``rel_error`` repeats bit for bit; the
#: only float noise left is the float64 summation order of the Frobenius norms (thread-dependent
#: reductions): at most ~N * 1.1e-16 relative for N <= ~1e7 output elements, i.e. below ~1e-9
#: relative and ~1e-10 absolute on errors <= 0.1. 1e-9 covers that with margin, while any real
#: change in quantization (a rounding rule, a lost outlier column) moves ``rel_error`` by
#: orders of magnitude more.
ERROR_EPS = 1e-9
#: The default tolerances: a slowdown of 10% beyond both runs' noise, no error increase.
SPEED_TOL = 0.10
ERROR_TOL = 0.0
#: Between runs on different processors: the relative error change that rounding alone may make
#: (a summation order changes a float GEMM's error by ~1e-4; a quantization change, by percents).
CROSS_PROCESSOR_ERROR_TOL = 1e-3
#: ... and, for a row with an error, the absolute change at float32's own rounding scale (8
#: units of roundoff, 4.8e-7): a float32 row's error against float64 (about 1e-7) is all
#: summation order, and another processor's kernel moved it by 2-34% (torch fp32 at d
#: 768-2560, a Zen 4 against a Xeon: 1.07e-7 -> 1.43e-7 at d 1536). Quantized rows' errors
#: (1e-3 to 1e-1) cannot hide a change in it; an exact row (error 0) still gates at ERROR_EPS.
CROSS_PROCESSOR_ERROR_ABS = 8 * 2.0**-24


EXIT_OK, EXIT_REGRESSION, EXIT_UNUSABLE, EXIT_NOT_COMPARABLE = 0, 1, 2, 3
#: Measured compute peaks of two runs' machines differing by more than this (relative to the
#: smaller) make them different machines: the noise of one peak measured twice on a quiet machine
#: is a few percent, and hosts sold under one class name differed by 2x (int8) here.
PEAK_TOL = 0.25
#: The same for the bandwidth peak, wider: on a VM the memory bus is shared with other guests,
#: and one host (one processor identity, one microcode) measured 52.6, 60.0, 80.4 and 83.3 GB/s
#: within a day. A different processor is told apart by its identity and its compute peaks.
BANDWIDTH_TOL = 0.75
#: The peaks compared (with their unit and tolerance), and the processor identity fields.
PEAK_KINDS = {"int8": "tops", "16bit": "tops", "fp32": "tops", "bandwidth": "gbs"}
PEAK_TOLS = {"int8": PEAK_TOL, "16bit": PEAK_TOL, "fp32": PEAK_TOL, "bandwidth": BANDWIDTH_TOL}
IDENTITY_KEYS = ("vendor", "family", "model", "stepping")
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
    #: why an error growth was not called worse (runs on two processors), shown after detail
    error_note: str = ""

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
    #: non-empty: the two machines are not comparable (why); speed is not judged (exit 3)
    not_comparable: str = ""

    @property
    def regressions(self) -> list[RowComparison]:
        return [r for r in self.rows if r.regression]

    @property
    def exit_code(self) -> int:
        if self.problem:
            return EXIT_UNUSABLE
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_NOT_COMPARABLE if self.not_comparable else EXIT_OK

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

    @functools.cached_property
    def most_rounds(self) -> int:
        """The most rounds any of its rows was pooled from."""
        return most_rounds(self.rows.values())


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
    """One pooled row per key (the rounds of a run, and ``--resume`` retries, pooled)."""
    path = Path(path)
    results = results_path(path)
    n_rows, keyed = _pooled(results, *_stamp(results))
    keyed = copy.deepcopy(keyed)
    env = load_env(results.parent)
    version = env.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION and version not in READABLE_OLD_VERSIONS:
        env_path = results.parent / ENV_FILE
        raise SchemaError(f"{env_path}: schema_version {version!r} is not {SCHEMA_VERSION}")
    return LoadedRun(results, keyed, env, n_rows - len(keyed))


def _stamp(results: Path) -> tuple[int, int] | tuple[None, None]:
    """The file's modification time and size (``None`` s when it cannot be read: the reader then
    says why)."""
    try:
        st = results.stat()
    except OSError:
        return None, None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _pooled(results: Path, mtime_ns: int | None, size: int | None) -> tuple[int, dict]:
    """(rows read, one pooled row per key) of a results file, remembered while the file is
    unchanged (its time and size are part of the key): pooling bootstraps every row's interval,
    seconds for a committed baseline, and a gate or a report compares one run many times."""
    rows = read_run_rows(results, strict=True).rows  # a gate reads complete runs only
    for i, row in enumerate(rows, 1):
        _check_row(results, i, row)
    return len(rows), {tuple(r.key()): dataclasses.asdict(r) for r in pool_rows(rows)}


# --- verdicts -------------------------------------------------------------------------------


def _label(row: dict) -> str:
    size = row.get("size") or f"d={row['d_model']}"
    return (
        f"{row['case']} {size} {row['layer']} tokens={row['tokens']} "
        f"{row['backend']}/{row['method']}"
    )


def _baseline_row(run: LoadedRun, row: dict) -> dict | None:
    swap = {"backend": BASELINE[0], "method": BASELINE[1]}
    return run.rows.get(tuple(swap.get(c, row[c]) for c in KEY_COLUMNS))


def _speed(
    rc: RowComparison,
    b: dict,
    n: dict,
    base: LoadedRun,
    new: LoadedRun,
    tol: float,
    split: BusSplit | None = None,
    between: RunSpread | None = None,
) -> None:
    """Fill the speed fields of ``rc`` from :func:`kernelbench.results.verdict.judge` (the
    pooled verdict, judged again in each placement of the threads with ``split``, then the
    one-round rule; ``between``: the processor's spread between runs, added to each run's
    noise)."""
    rounds = (base.most_rounds, new.most_rounds)
    baselines = (_baseline_row(base, b), _baseline_row(new, n))
    tokens = b.get("tokens")
    call, _ = judge(b, n, tol, split, rounds, str(b["backend"]), between, baselines, tokens)
    rc.verdict, rc.metric, rc.detail = call.verdict, call.metric, call.detail
    rc.base_value, rc.new_value, rc.change = call.base_value, call.new_value, call.change
    rc.noise, rc.band = call.noise, call.band


def _error(rc: RowComparison, b: dict, n: dict, tol: float, rounding: float = 0.0) -> None:
    """``rounding``: the relative change allowed on top of ``tol`` (runs on two processors)."""
    e0, e1 = b.get("rel_error"), n.get("rel_error")
    rc.base_error, rc.new_error = e0, e1
    if e0 is None or e1 is None:
        return
    rc.error_change = (e1 / e0 - 1.0) if e0 > 0 else (math.inf if e1 > 0 else 0.0)
    if e1 <= e0 * (1.0 + tol) + ERROR_EPS:
        return
    floor = CROSS_PROCESSOR_ERROR_ABS if rounding and e0 > 0 else 0.0
    if e1 <= e0 * (1.0 + max(tol, rounding)) + max(ERROR_EPS, floor):
        rc.error_note = (
            f"error {rc.error_change:+.3%}: within what a float GEMM's rounding may move "
            f"between processors ({rounding:.1%}, or {CROSS_PROCESSOR_ERROR_ABS:.1e} at "
            "float32's rounding scale)"
        )
        return
    rc.verdict = "error-worse"


def _compare_row(
    key: tuple,
    base: LoadedRun,
    new: LoadedRun,
    speed_tol: float,
    error_tol: float,
    rounding: float = 0.0,
    split: BusSplit | None = None,
    between: RunSpread | None = None,
):
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
            over_budget = n.get("skip_kind") == SkipKind.OVER_BUDGET.value
            # A row that ran and now does not (a backend that stopped building, a method that
            # stopped applying) is a regression; a budget skip depends on timing noise.
            rc.verdict = "failed" if n["status"] == "failed" or not over_budget else "unknown"
        rc.detail = f"base {b['status']}, new {n['status']}: {n.get('reason') or b.get('reason')}"
        return rc
    _speed(rc, b, n, base, new, speed_tol, split, between)
    _error(rc, b, n, error_tol, rounding)
    return rc


def _check_tolerances(speed_tol: float, error_tol: float) -> None:
    for name, tol in (("speed_tol", speed_tol), ("error_tol", error_tol)):
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")


def compare_runs(
    base: Path,
    new: Path,
    speed_tol: float = SPEED_TOL,
    error_tol: float = ERROR_TOL,
    backends: list[str] | None = None,
    between: RunSpread | None = None,
) -> Comparison:
    """Compare run NEW against run BASE (run directories or ``results.jsonl`` files).

    ``backends`` limits the verdicts to those backends' rows (a project gating its own kernels);
    the other rows still serve as the 16-bit baseline of their cell. ``between``: the spread
    between runs measured on the runs' processor (:mod:`kernelbench.results.spread`), added to
    each run's noise on a speedup. Never raises on bad input
    files: an unusable input gives a Comparison with ``problem`` set
    and ``exit_code == 2``. Negative or non-finite tolerances are a programming error
    (:class:`ValueError`)."""
    _check_tolerances(speed_tol, error_tol)
    try:
        b_run, n_run = load_run(Path(base)), load_run(Path(new))
    except SchemaError as exc:
        return Comparison(str(base), str(new), speed_tol, error_tol, problem=str(exc))
    return compare_loaded_runs(b_run, n_run, speed_tol, error_tol, backends, between)


def compare_loaded_runs(
    b_run: LoadedRun,
    n_run: LoadedRun,
    speed_tol: float = SPEED_TOL,
    error_tol: float = ERROR_TOL,
    backends: list[str] | None = None,
    between: RunSpread | None = None,
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
            cmp.notes.append(f"{run.path}: {run.duplicates} row(s) of repeated keys pooled")
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
    rounding = CROSS_PROCESSOR_ERROR_TOL if _identity_differences(b_run.env, n_run.env) else 0.0
    split = joint_split(b_run.rows.values(), n_run.rows.values())
    cmp.not_comparable = machines_differ(b_run.env, n_run.env)
    if cmp.not_comparable:
        between = None  # measured on one processor; speeds are not judged anyway
    cmp.rows = [
        _compare_row(k, b_run, n_run, speed_tol, error_tol, rounding, split, between) for k in keys
    ]
    if between is not None:
        cmp.notes.append(
            f"bands include the spread between runs measured on this processor, "
            f"{between.describe()}: {between.source}"
        )
    if placement := placements_differ(b_run, n_run, split):
        cmp.notes.append(placement)
    if cores := core_speeds_differ(b_run, n_run):
        cmp.notes.append(cores)
    if setups := setups_differ(b_run.env, n_run.env):
        cmp.notes.append(setups)
    if shift := common_shift_note(cmp.rows):
        cmp.notes.append(shift)
    if cmp.not_comparable:
        for r in cmp.rows:
            if r.verdict in ("slower", "faster", "same"):
                r.detail = f"speed not judged ({r.verdict} as measured): machines not comparable"
                r.verdict = "unknown"
    for r in cmp.rows:
        if r.error_note:
            r.detail = f"{r.detail}; {r.error_note}" if r.detail else r.error_note
    cmp.rows.sort(key=lambda r: VERDICT_ORDER.index(r.verdict))  # stable: file order within
    return cmp


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def peak_readings(entry: object, unit: str) -> list[float]:
    """Every quiet measurement of one peak that its cache entry records: its ``readings``
    (newest last), else the kept best call and the lower reading kept beside it
    (``remeasured``), as entries written before readings were kept have them."""
    if not isinstance(entry, dict):
        return []
    listed = entry.get("readings")
    if isinstance(listed, list):
        found = [v for v in map(_number, listed) if v is not None]
        if found:
            return found
    lower = entry.get("remeasured")
    lower = lower.get(unit) if isinstance(lower, dict) else None
    return [v for v in (_number(entry.get(unit)), _number(lower)) if v is not None]


def _peaks(env: dict) -> dict[str, tuple[float, float, int]]:
    """Per peak kind: the figure a run's rooflines used (the best call, the range's top), the
    lowest quiet reading of it the cache kept, and how many readings there were."""
    out = {}
    for kind, unit in PEAK_KINDS.items():
        entry = (env.get("peak") or {}).get(kind)
        best = _number(entry.get(unit)) if isinstance(entry, dict) else None
        if best is None:
            continue
        readings = peak_readings(entry, unit)
        out[kind] = (best, min([best, *readings]), max(1, len(readings)))
    return out


def peak_gap(base: tuple[float, float, int], new: tuple[float, float, int]) -> float:
    """How far apart two hosts' readings of one peak are, relative to the lower: 0 when the
    ranges (lowest reading to best call) overlap, else the higher range's lowest reading over
    the lower range's best, less one. A best call only rises as a host is measured again (the
    cache keeps the best), so judging the best calls alone parted a host from itself."""
    (b_best, b_low, _), (n_best, n_low, _) = base, new
    if b_best < n_low:
        return n_low / b_best - 1
    if n_best < b_low:
        return b_low / n_best - 1
    return 0.0


def processor_key(env: dict) -> str | None:
    """The processor of a run's env.json as one path component, ``AuthenticAMD-25-17-1``
    (vendor, family, model, stepping), or ``None`` when the run does not record all four: the
    sub-class under which a device class keeps one baseline per processor."""
    ident = (env.get("cpu") or {}).get("identity") or {}
    parts = [str(ident.get(k, "")).strip() for k in IDENTITY_KEYS]
    if not all(parts):
        return None
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(parts))


def _recorded_differences(
    base: dict, new: dict, keys: Iterable[str]
) -> list[tuple[str, object, object]]:
    """(key, base, new) for each of ``keys`` both dicts record (not ``None``) and that differs."""
    return [
        (k, base[k], new[k])
        for k in keys
        if base.get(k) is not None and new.get(k) is not None and base[k] != new[k]
    ]


def _identity_differences(base_env: dict, new_env: dict) -> list[tuple[str, str, str]]:
    """(key, base, new) for each processor identity field both runs record and that differs."""
    ids = [((env.get("cpu") or {}).get("identity") or {}) for env in (base_env, new_env)]
    return _recorded_differences(*ids, IDENTITY_KEYS)


def _range(peak: tuple[float, float, int]) -> str:
    best, low, count = peak
    return f"{low:.3g}-{best:.3g} in {count}" if count > 1 else f"{best:.3g}"


def machines_differ(base_env: dict, new_env: dict) -> str:
    """Why the machines of two runs are not comparable (``""``: comparable, or not known):
    a different processor identity, or a measured peak's readings further apart than its
    tolerance (:func:`peak_gap`)."""
    why = []
    differ = _identity_differences(base_env, new_env)
    if differ:
        pairs = ", ".join(f"{k} {b} vs {n}" for k, b, n in differ)
        why.append(f"different processors ({pairs})")
    base, new = _peaks(base_env), _peaks(new_env)
    for kind in base.keys() & new.keys():
        if peak_gap(base[kind], new[kind]) > PEAK_TOLS[kind]:
            unit = "GB/s" if PEAK_KINDS[kind] == "gbs" else "TOPS"
            text = f"{kind} peak {base[kind][0]:.3g} vs {new[kind][0]:.3g} {unit}"
            if base[kind][2] > 1 or new[kind][2] > 1:
                text += f" (quiet readings {_range(base[kind])} vs {_range(new[kind])})"
            why.append(f"{text} (apart by more than {PEAK_TOLS[kind]:.0%})")
    if not why:
        return ""
    return (
        "base and new ran on machines that are not comparable: "
        + "; ".join(why)
        + "; speed differences are not judged (make the baseline on this machine)"
    )


def setups_differ(base_env: dict, new_env: dict) -> str:
    """What the two runs ran with that differs and changes what is measured: torch's and the
    peers' versions, the thread count, the environment variables env.json records (each only
    where both runs record it); ``""``: nothing known to differ. Said, not judged: an upgrade
    is often what a comparison is for."""
    libraries = [env.get("libraries") or {} for env in (base_env, new_env)]
    differ = [
        f"{name} {base} vs {new}"
        for name, base, new in [
            *_recorded_differences(base_env, new_env, ("torch", "threads")),
            *_recorded_differences(*libraries, sorted(libraries[0])),
        ]
    ]
    envs = [env.get("environment") for env in (base_env, new_env)]
    if all(isinstance(e, dict) for e in envs):
        for name in sorted(envs[0].keys() | envs[1].keys()):
            base, new = envs[0].get(name), envs[1].get(name)
            if base != new:
                differ.append(f"{name} {_setting(base)} vs {_setting(new)}")
    return "base and new ran with different setups: " + "; ".join(differ) if differ else ""


def _setting(value: str | None) -> str:
    return "unset" if value is None else repr(value)


# --- rendering -------------------------------------------------------------------------------


#: Runs whose shares of calls with the threads apart differ by more than this are said to.
PLACEMENT_SHARE_DIFFERENCE = 0.1


def placements_differ(b_run: LoadedRun, n_run: LoadedRun, split: BusSplit | None) -> str:
    """A note when the two runs' cold CPU calls met the host's placements of the threads (one
    core complex, or two: :mod:`kernelbench.results.states`) in shares apart by more than
    :data:`PLACEMENT_SHARE_DIFFERENCE`: the speed of a row that depends on memory then moves
    with the host, not only with the code. ``split``: the joint split of both runs' link
    readings (:func:`~kernelbench.results.verdict.joint_split`); empty when there is none."""
    if split is None:
        return ""
    b_links, n_links = link_readings(b_run.rows.values())[1], link_readings(n_run.rows.values())[1]
    base, new = far_share(b_links, split), far_share(n_links, split)
    if base is None or new is None or abs(base - new) <= PLACEMENT_SHARE_DIFFERENCE:
        return ""
    return (
        f"the host ran the threads apart for {base:.0%} of the base run's timed calls and "
        f"{new:.0%} of the new run's (a cache line's round trip about {split.far_ns:.0f} ns, "
        f"against {split.near_ns:.0f} close together): rows whose speed depends on memory move "
        "with that as well as with the code (kernelbench show --states)"
    )


#: Runs whose median core probe readings differ by more than this are said to.
CORE_SPEED_DIFFERENCE = 0.1


def median_core_ns(rows: Iterable[dict]) -> float | None:
    """The median of the core probe's readings over the timed calls of ``rows`` (``None``:
    none recorded)."""
    readings = [
        float(v)
        for r in rows
        for v in (r.get("core_ns") or [])
        if isinstance(v, int | float) and v > 0
    ]
    return statistics.median(readings) if readings else None


def core_speeds_differ(b_run: LoadedRun, n_run: LoadedRun) -> str:
    """A note when the cores ran at different speeds in the two runs: the medians of their
    core probe readings (a fixed chain of integer steps on two threads before each cold CPU
    call) apart by more than :data:`CORE_SPEED_DIFFERENCE`. On a 2-vCPU Xeon VM whose host
    shares its cores out, two runs of one commit read 12.7 and 16.0 us, and torch's
    ``vectorwise_torch`` at 2048 tokens, d = 2048, 0.41 [0.40, 0.46] and 0.51 [0.47, 0.52]
    times the bf16 baseline (95% intervals): the baseline (AMX) slowed with the cores, the int8
    calls less. Empty when either run has no readings."""
    base, new = median_core_ns(b_run.rows.values()), median_core_ns(n_run.rows.values())
    if base is None or new is None or max(base, new) / min(base, new) - 1 <= CORE_SPEED_DIFFERENCE:
        return ""
    return (
        f"the cores ran at different speeds in the two runs (a fixed chain of integer steps on "
        f"two threads before each timed call: median {base / 1e3:.1f} us in base, "
        f"{new / 1e3:.1f} us in new): on a host that shares its cores out, speedups over the "
        "16-bit baseline move with that as well as with the code"
    )


#: A shift common to every backend is said when its cells moved one way with a two-sided sign
#: test below this, in at least this many cells, each backend's median beyond MIN_COMMON_SHIFT.
COMMON_SHIFT_P = 0.05
MIN_SHIFT_CELLS = 6
MIN_COMMON_SHIFT = 0.02


def _sign_test_p(agree: int, n: int) -> float:
    """Two-sided sign test: the chance of ``agree`` or more of ``n`` coin flips one way."""
    tail = sum(math.comb(n, k) for k in range(agree, n + 1)) / 2**n
    return min(1.0, 2 * tail)


def common_shift_note(rows: Iterable[RowComparison]) -> str:
    """A note when the speedups of every backend moved the same way between the runs: each
    cell (a layer at a token count) contributes the median change of its rows compared through
    their speedup, the cells' changes agree in sign beyond chance (:data:`COMMON_SHIFT_P`), and
    each backend's median change goes the same way, beyond :data:`MIN_COMMON_SHIFT`. Such a
    shift comes from the host or the 16-bit baseline every speedup is taken over, not from one
    backend's code: on a 2-vCPU Xeon VM two D.1 runs of one commit, the host about 15% faster
    during the second (core probe 12.6 against 14.9 us), read every backend's speedups 4-9%
    higher there (medians), and seven torch rows "faster" beyond their intervals. Verdicts are
    left as measured; the note says how much of a row's change the others share. Empty
    otherwise."""
    col = {c: KEY_COLUMNS.index(c) for c in ("backend", "method")}
    by_cell: dict[tuple, list[float]] = {}
    by_backend: dict[str, list[float]] = {}
    for r in rows:
        pair = (r.key[col["backend"]], r.key[col["method"]])
        if r.metric != "speedup" or r.change is None or pair == BASELINE:
            continue  # the baseline's own row reads 1x in both
        growth = math.log1p(r.change)
        cell = tuple(v for i, v in enumerate(r.key) if i not in col.values())
        by_cell.setdefault(cell, []).append(growth)
        by_backend.setdefault(r.key[col["backend"]], []).append(growth)
    cells = [statistics.median(v) for v in by_cell.values()]
    if len(cells) < MIN_SHIFT_CELLS or len(by_backend) < 2:
        return ""
    shift = statistics.median(cells)
    same_way = sum(1 for c in cells if c * shift > 0)
    backends = {b: statistics.median(v) for b, v in by_backend.items()}
    if (
        abs(math.expm1(shift)) < MIN_COMMON_SHIFT
        or _sign_test_p(same_way, len(cells)) >= COMMON_SHIFT_P
        or any(m * shift <= 0 or abs(math.expm1(m)) < MIN_COMMON_SHIFT for m in backends.values())
    ):
        return ""
    way = "slower" if shift > 0 else "faster"
    each = ", ".join(f"{b} {_pct(math.expm1(m))}" for b, m in sorted(backends.items()))
    return (
        f"every backend's rows read {way} over the 16-bit baseline in new: {same_way} of "
        f"{len(cells)} cells moved that way (each cell's median change; sign test p = "
        f"{_sign_test_p(same_way, len(cells)):.2g}), their time by a median "
        f"{_pct(math.expm1(shift))}; each backend's median: {each}. A shift every backend "
        "shares comes from the host or the baseline, not from one backend's code: read a "
        "row's change against it"
    )


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
    # errors gate across machines too: such a regression says the speeds were not judged
    regression = "REGRESSION (exit 1)"
    if c.not_comparable:
        regression = f"REGRESSION (exit 1; of errors only: {c.not_comparable})"
    state = {
        EXIT_REGRESSION: regression,
        EXIT_NOT_COMPARABLE: f"NOT COMPARABLE (exit 3): {c.not_comparable}.",
    }.get(c.exit_code, "OK (exit 0)")
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
        return "| " + " | ".join(_md_text(cell).replace("|", "\\|") for cell in row) + " |"

    out = [f"### kernelbench compare: {_summary(c)}", "", f"base `{c.base}` · new `{c.new}`", ""]
    rows, notes = _shown(c)
    if rows:
        out += [md(_HEADER), "|" + "---|" * len(_HEADER)] + [md(_cells(r)) for r in rows] + [""]
    out += [f"- {_md_text(n)}" for n in notes]
    return "\n".join(out).rstrip() + "\n"


def _md_text(text: str) -> str:
    """Data as markdown text: HTML in a name or reason is shown, never rendered."""
    return html.escape(str(text), quote=False)


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
        "not_comparable": c.not_comparable,
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
