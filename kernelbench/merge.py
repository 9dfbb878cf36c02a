"""Pool several runs of one sweep into one run: samples taken minutes apart, one row per key.

On a shared machine the speed drifts over tens of seconds (measured here: a row's median moved
by up to 35% between two back-to-back ``--quick`` runs while its own IQR / median stayed under
2%), so the spread of samples taken within one row's fraction of a second understates the noise
between runs. Pooling the raw samples of N runs (rounds) gives a median that one disturbed round
cannot move much, and a spread (``rel_spread``) that includes the drift between rounds, which is
what :mod:`kernelbench.compare` needs for its noise band.

Per key (:data:`~kernelbench.results.KEY_COLUMNS`): the ``ok`` rows' ``raw_ms`` are concatenated and
the statistics recomputed with each round weighing the same (a round whose calls converged after 5
samples counts as much as one that took 45); stage times are the median of the rounds' stage times;
``baseline_ms``, ``speedup`` and ``tops`` are recomputed from the pooled medians
of the same cell, except that a paired row (timed in alternation with its baseline,
:func:`kernelbench.timing.time_paired`) pools its own ``baseline_raw_ms`` beside its ``raw_ms`` and
takes ``baseline_ms`` from those. Errors are deterministic for fixed seeds; should the rounds
disagree, the largest is kept (never the flattering one). A key with no ``ok`` row keeps its last
round's row (skipped or failed, with the reason). Nothing is written to the inputs."""

from __future__ import annotations

import json
import statistics
from dataclasses import fields
from pathlib import Path

from kernelbench.results import (
    ENV_FILE,
    KEY_COLUMNS,
    RESULTS_FILE,
    ResultRow,
    ResultsWriter,
    SchemaError,
    load_env,
    read_rows,
)

#: (backend, method) of the 16-bit baseline and of fp32, whose pooled medians the speedups use.
BASELINE = ("torch", "fp16")
FP32 = ("torch", "fp32")
_ROW_FIELDS = {f.name for f in fields(ResultRow)}


_PAIR = (KEY_COLUMNS.index("backend"), KEY_COLUMNS.index("method"))


def _pair(key: tuple) -> tuple[str, str]:
    return key[_PAIR[0]], key[_PAIR[1]]


def _cell(key: tuple) -> tuple:
    """The key without backend and method: the rows measured on the same inputs."""
    return tuple(v for c, v in zip(KEY_COLUMNS, key, strict=True) if c not in ("backend", "method"))


def _read_run(path: Path) -> dict[tuple, dict]:
    results = path / RESULTS_FILE if path.is_dir() else path
    rows = read_rows(results)
    if not rows:
        raise SchemaError(f"{results}: no result rows")
    return {tuple(r[c] for c in KEY_COLUMNS): r for r in rows}  # the last row of a key wins


def _weighted_quantile(values: list[float], weights: list[float], p: float) -> float:
    """The smallest value whose cumulative weight reaches ``p`` of the total (a step function:
    with one sample per round and three rounds, the quartiles are the lowest and highest round
    and the median the middle one)."""
    pairs = sorted(zip(values, weights, strict=True))
    target = p * sum(weights)
    cumulative = 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= target - 1e-12:
            return value
    return pairs[-1][0]


def _concat(per_round: list[list[float]]) -> tuple[list[float], list[float]]:
    """All rounds' samples, and weights that give each round the same total weight."""
    values = [v for samples in per_round for v in samples]
    weights = [1.0 / len(samples) for samples in per_round for _ in samples]
    return values, weights


def _pool(rows: list[dict]) -> ResultRow:
    """One row from the rounds of one key."""
    ok = [r for r in rows if r["status"] == "ok" and r.get("raw_ms")]
    if not ok:
        return ResultRow(**{k: v for k, v in rows[-1].items() if k in _ROW_FIELDS})
    row = ResultRow(**{k: v for k, v in ok[0].items() if k in _ROW_FIELDS})
    row.raw_ms, weights = _concat([r["raw_ms"] for r in ok])
    q1, median, q3 = (_weighted_quantile(row.raw_ms, weights, p) for p in (0.25, 0.5, 0.75))
    row.median_ms, row.iqr_ms, row.min_ms = median, q3 - q1, min(row.raw_ms)
    row.mean_ms = sum(t * w for t, w in zip(row.raw_ms, weights, strict=True)) / sum(weights)
    row.rel_spread = row.iqr_ms / median if median > 0 else 0.0
    row.samples = len(row.raw_ms)
    # A paired row pools its baseline's calls the same way, when every round was paired (the
    # pairs stay aligned); otherwise it is pooled as an unpaired row.
    row.paired = all(
        r.get("paired") and len(r.get("baseline_raw_ms") or []) == len(r["raw_ms"]) for r in ok
    )
    row.baseline_raw_ms, row.paired_speedup, row.paired_rel_spread = [], None, None
    if row.paired:
        row.baseline_raw_ms, _ = _concat([r["baseline_raw_ms"] for r in ok])
        row.baseline_ms = _weighted_quantile(row.baseline_raw_ms, weights, 0.5)
        ratios = [b / t for b, t in zip(row.baseline_raw_ms, row.raw_ms, strict=True)]
        p1, pm, p3 = (_weighted_quantile(ratios, weights, p) for p in (0.25, 0.5, 0.75))
        row.paired_speedup, row.paired_rel_spread = pm, (p3 - p1) / pm if pm > 0 else 0.0
    row.rounds = sum(int(r.get("rounds") or 1) for r in ok)
    row.throttled_samples = sum(int(r.get("throttled_samples") or 0) for r in ok)
    stages = sorted({s for r in ok for s in (r.get("stages_ms") or {})})
    row.stages_ms = {
        s: statistics.median(r["stages_ms"][s] for r in ok if s in (r.get("stages_ms") or {}))
        for s in stages
    }
    for name in ("rel_error", "max_abs_error", "baseline_rel_error"):
        values = [r.get(name) for r in ok if r.get(name) is not None]
        setattr(row, name, max(values) if values else None)
    compiles = [r["compile_s"] for r in ok if r.get("compile_s") is not None]
    row.compile_s = statistics.median(compiles) if compiles else None
    row.timestamp = max(str(r.get("timestamp") or "") for r in ok) or row.timestamp
    return row


def merge_runs(paths: list[Path]) -> tuple[list[ResultRow], dict]:
    """Pooled rows (in the first run's order, then keys only later runs have) and an env.

    Raises :class:`~kernelbench.results.SchemaError` for an unreadable run, fewer than two runs,
    or runs of different device classes or cases (pooling those would mix machines)."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise SchemaError("merge needs at least two runs")
    runs = [_read_run(p) for p in paths]
    classes = [sorted({k[KEY_COLUMNS.index("device_class")] for k in run}) for run in runs]
    if any(c != classes[0] for c in classes):
        raise SchemaError(
            "runs of different device classes: "
            + "; ".join(f"{p}: {c}" for p, c in zip(paths, classes, strict=True))
        )
    keys: dict[tuple, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run))
    rows = {k: _pool([run[k] for run in runs if k in run]) for k in keys}
    medians = {k: r.median_ms for k, r in rows.items() if r.status == "ok"}
    for key, row in rows.items():
        if row.status != "ok":
            continue
        cell = _cell(key)
        same_cell = [k for k in medians if _cell(k) == cell]
        base = next((medians[k] for k in same_cell if _pair(k) == BASELINE), None)
        if row.paired:  # its own baseline calls, pooled over the rounds in _pool
            base = row.baseline_ms
        row.baseline_ms = base
        row.speedup = base / row.median_ms if base else None
        row.tops = 2.0 * row.m * row.k * row.n / (row.median_ms / 1e3) / 1e12
    envs = [load_env(p if p.is_dir() else p.parent) for p in paths]
    env = dict(envs[0])
    env["round_command"] = env.pop("command", None)  # what each round ran
    env["command"] = "kernelbench merge " + " ".join(str(p) for p in paths)
    env["merged_from"] = [
        {"run": str(p), "git_commit": e.get("git_commit"), "started_at": e.get("started_at")}
        for p, e in zip(paths, envs, strict=True)
    ]
    return list(rows.values()), env


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
    (out / ENV_FILE).write_text(json.dumps(env, indent=2, default=str), encoding="utf-8")
    return rows
