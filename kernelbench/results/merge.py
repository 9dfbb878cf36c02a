"""Pool rows of one key into one: the rounds of a run, or several runs of one sweep.

A run visits its cells in several rounds (``--rounds``); :func:`pool_rows` gives the one row per
key that every table, report and verdict reads, with the speedup's 95% interval recomputed over
all pooled pairs. ``kernelbench merge`` pools several runs the same way.

On a shared machine the speed drifts over tens of seconds (measured here: a row's median moved
by up to 35% between two back-to-back ``--quick`` runs while its own IQR / median stayed under
2%), so the spread of samples taken within one row's fraction of a second understates the noise
between runs. Pooling the raw samples of N runs (rounds) gives a median that one disturbed round
cannot move much, and a spread (``rel_spread``) that includes the drift between rounds, which is
what :mod:`kernelbench.results.compare` needs for its noise band.

Per key (:data:`~kernelbench.results.schema.KEY_COLUMNS`): the ``ok`` rows' ``raw_ms`` are
concatenated and the statistics recomputed with each round weighing the same (a round whose calls
converged after 5 samples counts as much as one that took 45); the speedup's interval resamples
rounds, then pairs within them (:func:`~kernelbench.statistics.rounds_median_interval`), so that it
covers the drift between rounds; stage times are the median of the rounds' stage times;
``baseline_ms``, ``speedup`` and ``tops`` are recomputed from the pooled medians
of the same cell, except that a paired row (timed in cycles with its baseline,
:mod:`kernelbench.measure.engine`) pools its own ``baseline_raw_ms`` beside its ``raw_ms`` and
takes ``baseline_ms`` from those. Errors are deterministic for fixed seeds; should the rounds
disagree, the largest is kept (never the flattering one). A key with no ``ok`` row keeps its last
round's row (skipped or failed, with the reason). Nothing is written to the inputs."""

from __future__ import annotations

import statistics
from dataclasses import fields
from pathlib import Path

from kernelbench.core import BASELINE, work_flops
from kernelbench.results.schema import (
    KEY_COLUMNS,
    USAGE_FIELDS,
    ResultRow,
    ResultsWriter,
    SchemaError,
    load_env,
    read_rows,
    results_path,
    write_env,
)
from kernelbench.statistics import (
    round_weights,
    rounds_median_interval,
    stats,
    weighted_quantile,
)

_ROW_FIELDS = {f.name for f in fields(ResultRow)}
_PAIR = (KEY_COLUMNS.index("backend"), KEY_COLUMNS.index("method"))


def _pair(key: tuple) -> tuple[str, str]:
    return key[_PAIR[0]], key[_PAIR[1]]


def _cell(key: tuple) -> tuple:
    """The key without backend and method: the rows measured on the same inputs."""
    return tuple(v for c, v in zip(KEY_COLUMNS, key, strict=True) if c not in ("backend", "method"))


def row_key(row: dict) -> tuple:
    return tuple(row[c] for c in KEY_COLUMNS)


def _read_run(path: Path) -> list[dict]:
    results = results_path(path)
    rows = read_rows(results)
    if not rows:
        raise SchemaError(f"{results}: no result rows")
    return rows


def _pool(rows: list[dict]) -> ResultRow:
    """One row from the rounds of one key (each round weighing the same)."""
    ok = [r for r in rows if r["status"] == "ok" and r.get("raw_ms")]
    if not ok:  # untimed (the accuracy study's seeds): the largest error of each kind
        row = ResultRow(**{k: v for k, v in rows[-1].items() if k in _ROW_FIELDS})
        for name in ("rel_error", "max_abs_error", "baseline_rel_error", "outlier_cols"):
            values = [r.get(name) for r in rows if r.get(name) is not None]
            setattr(row, name, max(values) if values else getattr(row, name))
        return row
    row = ResultRow(**{k: v for k, v in ok[0].items() if k in _ROW_FIELDS})
    row.raw_ms, weights = round_weights([r["raw_ms"] for r in ok])
    row.round_samples = [len(r["raw_ms"]) for r in ok]
    st = stats(row.raw_ms, weights)
    row.median_ms, row.iqr_ms, row.min_ms, row.mean_ms = (
        st.median_ms,
        st.iqr_ms,
        st.min_ms,
        st.mean_ms,
    )
    row.rel_spread, row.samples = st.rel_spread, st.samples
    # A paired row pools its baseline's calls the same way, when every round was paired (the
    # pairs stay aligned); otherwise it is pooled as an unpaired row.
    row.paired = all(
        r.get("paired") and len(r.get("baseline_raw_ms") or []) == len(r["raw_ms"]) for r in ok
    )
    row.baseline_raw_ms, row.paired_speedup, row.paired_rel_spread = [], None, None
    row.speedup = row.speedup_lo = row.speedup_hi = None
    if row.paired:
        row.baseline_raw_ms, _ = round_weights([r["baseline_raw_ms"] for r in ok])
        row.baseline_ms = weighted_quantile(row.baseline_raw_ms, weights, 0.5)
        per_round = [
            [b / t for b, t in zip(r["baseline_raw_ms"], r["raw_ms"], strict=True)] for r in ok
        ]
        rs = stats([q for ratios in per_round for q in ratios], weights)
        row.speedup = row.paired_speedup = rs.median_ms
        row.paired_rel_spread = rs.rel_spread
        stored = (ok[0].get("speedup_lo"), ok[0].get("speedup_hi"))
        if len(ok) == 1 and None not in stored:  # one round: its interval as measured
            row.speedup_lo, row.speedup_hi = stored
        elif (interval := rounds_median_interval(per_round)) is not None:
            row.speedup_lo, row.speedup_hi = interval
    elif (row.backend, row.method) == BASELINE:
        row.baseline_ms, row.speedup = row.median_ms, 1.0
    row.rounds = sum(int(r.get("rounds") or 1) for r in ok)
    row.round = min(int(r.get("round") or 0) for r in ok)
    row.throttled_samples = sum(int(r.get("throttled_samples") or 0) for r in ok)
    # what each call saw: kept only when every round has it, aligned with raw_ms
    for name in (*USAGE_FIELDS, "bus_gbps", "link_ns", "core_ns", "core_wait_ms"):
        aligned = all(len(r.get(name) or []) == len(r["raw_ms"]) for r in ok)
        setattr(row, name, [v for r in ok for v in r[name]] if aligned else [])
    modes = {str(r.get("cache") or "") for r in ok}
    row.cache = modes.pop() if len(modes) == 1 else "mixed"  # pooled hot and cold: said so
    steals = [r["steal_share"] for r in ok if r.get("steal_share") is not None]
    row.steal_share = max(steals) if steals else None
    stages = sorted({s for r in ok for s in (r.get("stages_ms") or {})})
    row.stages_ms = {
        s: statistics.median(r["stages_ms"][s] for r in ok if s in (r.get("stages_ms") or {}))
        for s in stages
    }
    for name in ("rel_error", "max_abs_error", "baseline_rel_error", "outlier_cols"):
        values = [r.get(name) for r in ok if r.get(name) is not None]
        setattr(row, name, max(values) if values else None)
    compiles = [r["compile_s"] for r in ok if r.get("compile_s") is not None]
    row.compile_s = statistics.median(compiles) if compiles else None
    builds = [r["build_s"] for r in ok if r.get("build_s") is not None]
    row.build_s = sum(builds) if builds else None
    row.timestamp = max(str(r.get("timestamp") or "") for r in ok) or row.timestamp
    row.tops = work_flops(row.m, row.k, row.n) / (row.median_ms / 1e3) / 1e12
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:  # kept in view: a round that failed is not hidden by the rounds that ran
        row.reason = "; ".join(f"round {r.get('round', 0)} failed: {r['reason']}" for r in failed)
    return row


def pool_rows(rows: list[dict]) -> list[ResultRow]:
    """One row per key, pooled over every row of that key (rounds of one run, or several
    runs), in order of each key's first appearance."""
    by_key: dict[tuple, list[dict]] = {}
    for r in rows:
        by_key.setdefault(row_key(r), []).append(r)
    pooled = {k: _pool(group) for k, group in by_key.items()}
    base = {_cell(k): r.median_ms for k, r in pooled.items() if _pair(k) == BASELINE}
    for key, row in pooled.items():
        if row.status == "ok" and not row.paired and _pair(key) != BASELINE:
            # unpaired (older runs, --no-paired): the cell's pooled baseline, a ratio without
            # an interval, which the tables mark
            row.baseline_ms = base.get(_cell(key))
            row.speedup = row.baseline_ms / row.median_ms if row.baseline_ms else None
    return list(pooled.values())


def merge_runs(paths: list[Path]) -> tuple[list[ResultRow], dict]:
    """Pooled rows (in the first run's order, then keys only later runs have) and an env.

    Raises :class:`~kernelbench.results.schema.SchemaError` for an unreadable run, fewer than two
    runs, or runs of different device classes or cases (pooling those would mix machines)."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise SchemaError("merge needs at least two runs")
    runs = [_read_run(p) for p in paths]
    classes = [sorted({r["device_class"] for r in run}) for run in runs]
    if any(c != classes[0] for c in classes):
        raise SchemaError(
            "runs of different device classes: "
            + "; ".join(f"{p}: {c}" for p, c in zip(paths, classes, strict=True))
        )
    rows = pool_rows([r for run in runs for r in run])
    envs = [load_env(p if p.is_dir() else p.parent) for p in paths]
    env = dict(envs[0])
    env["round_command"] = env.pop("command", None)  # what each round ran
    env["command"] = "kernelbench merge " + " ".join(str(p) for p in paths)
    env["merged_from"] = [
        {"run": str(p), "git_commit": e.get("git_commit"), "started_at": e.get("started_at")}
        for p, e in zip(paths, envs, strict=True)
    ]
    return rows, env


def write_merged(paths: list[Path], out: Path) -> list[ResultRow]:
    """Merge ``paths`` into the run directory ``out`` (its results.jsonl is replaced)."""
    rows, env = merge_runs(paths)
    out = Path(out)
    if out.resolve() in {Path(p).resolve() for p in paths}:
        raise SchemaError(f"{out}: the output must not be one of the runs being merged")
    writer = ResultsWriter(out)
    writer.path.unlink(missing_ok=True)
    for row in rows:
        writer.append(row)
    write_env(out, env)
    return rows
