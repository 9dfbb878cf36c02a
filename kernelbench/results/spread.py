"""The spread between runs on one processor: how far a run's speedups fall from another's
beyond their own intervals, measured from runs of one commit, kept beside the processor's
baseline and added to the noise of ``kernelbench compare``.

Why. A row's interval covers the drift between its run's rounds, minutes apart; the host
drifts over longer times too. On a 2-vCPU Xeon VM, 19 runs of 5 commits (D.1, default and
short sweeps) read 15.8% of 1732 pairs of rows beyond their combined 95% intervals (18% at
2048 tokens; 5% if the intervals covered what the next run reads), and two runs in one process
differed no less than two in two processes: the host's drift, not a process's.

What. For each pair of runs and each row both measured with an interval (a paired speedup,
pooled from more than one round where its run has several), the gap between their log
speedups ``d`` and their log half-widths ``a``, ``b``. A spread ``s`` per run, added in
quadrature, covers the pair when ``d <= sqrt(a^2 + b^2 + 2 s^2)``; :func:`fit_halfwidth` gives
the smallest ``s`` that leaves at most 5% of the pairs beyond (the rest being what a 95%
interval lets through), pooled over the rows and per backend where it has enough pairs. The
pairs are not independent (rows of one run share its drift): the figure is a calibration of
these runs, as good as the runs are typical of the machine, not a confidence statement.

Kept in ``gate.json`` beside the processor's baseline (``between_runs``), where ``compare``
finds it for two runs of that processor (:func:`spread_for`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernelbench.results.baseline import DEFAULT_DIR, GATE_FILE, BaselineError, sanitize
from kernelbench.results.compare import LoadedRun, load_run, processor_key
from kernelbench.results.schema import KEY_COLUMNS, SchemaError
from kernelbench.results.verdict import (
    RunSpread,
    most_rounds,
    one_round_of_several,
    speedup_of,
)

#: The share of pairs a fitted spread may leave beyond (what a 95% interval lets through).
TARGET_BEYOND = 0.05
#: Fewer pairs than this give no spread (pooled), and no figure of its own to a backend.
MIN_PAIRS = 20
#: The key of the spread in gate.json.
GATE_KEY = "between_runs"


class SpreadError(ValueError):
    """Runs whose spread cannot be measured, or a kept spread that cannot be read (says why)."""


@dataclass(frozen=True)
class PairGap:
    """One row measured in two runs: its log speedups' gap and their log half-widths."""

    key: tuple
    gap: float
    base_halfwidth: float
    new_halfwidth: float

    @property
    def backend(self) -> str:
        return str(self.key[KEY_COLUMNS.index("backend")])

    @property
    def tokens(self) -> int:
        return int(self.key[KEY_COLUMNS.index("tokens")])

    def needed(self) -> float:
        """The smallest spread per run that covers this pair (0: its intervals do)."""
        excess = self.gap**2 - self.base_halfwidth**2 - self.new_halfwidth**2
        return math.sqrt(excess / 2) if excess > 0 else 0.0

    def beyond(self, spread: float = 0.0) -> bool:
        return self.gap > math.sqrt(self.base_halfwidth**2 + self.new_halfwidth**2 + 2 * spread**2)


@dataclass(frozen=True)
class SpreadFit:
    runs: int
    pairs: list[PairGap]
    spread: RunSpread
    device_class: str
    processor: str | None
    commits: tuple[str, ...]

    @property
    def beyond_share(self) -> float:
        """The share of pairs beyond their own intervals (no spread)."""
        return sum(p.beyond() for p in self.pairs) / len(self.pairs)


def _log_interval(row: dict, most: int) -> tuple[float, float] | None:
    """(log speedup, log half-width) of a row with an interval; ``None`` for a row without,
    or one pooled from one round in a run of several (its interval covers that round only)."""
    if row.get("status") != "ok" or not row.get("paired"):
        return None
    value, lo, hi = speedup_of(row), row.get("speedup_lo"), row.get("speedup_hi")
    if value is None or not lo or not hi or lo <= 0 or hi < lo:
        return None
    if one_round_of_several(row, most):
        return None
    return math.log(value), math.log(hi / lo) / 2


def pair_gaps(runs: Sequence[LoadedRun]) -> list[PairGap]:
    """Every row that two of ``runs`` both measured with an interval, for every pair of runs."""
    rounds = [most_rounds(r.rows.values()) for r in runs]
    gaps = []
    for (a, ra), (b, rb) in itertools.combinations(zip(runs, rounds, strict=True), 2):
        for key in a.rows.keys() & b.rows.keys():
            x, y = _log_interval(a.rows[key], ra), _log_interval(b.rows[key], rb)
            if x is not None and y is not None:
                gaps.append(PairGap(key, abs(x[0] - y[0]), x[1], y[1]))
    return gaps


def fit_halfwidth(gaps: Iterable[PairGap], target: float = TARGET_BEYOND) -> float:
    """The smallest spread per run that leaves at most ``target`` of ``gaps`` beyond."""
    needed = sorted((g.needed() for g in gaps), reverse=True)
    allowed = math.floor(target * len(needed) + 1e-9)
    return needed[allowed] if allowed < len(needed) else 0.0


def _identity(run: LoadedRun) -> tuple[str, str | None]:
    identity = machine_of(run.device_classes, run.env)
    if identity is None:
        raise SpreadError(f"{run.path}: rows of {len(run.device_classes)} device classes; need one")
    return identity


def measure_spread(paths: Sequence[Path], target: float = TARGET_BEYOND) -> SpreadFit:
    """The spread between the runs in ``paths`` (runs of one processor, taken as they would be
    compared: minutes or hours apart), each paired with the others of its commit. Raises
    :class:`SpreadError` naming what is wrong with the input."""
    if len(paths) < 2:
        raise SpreadError("give two or more runs of one commit on one machine")
    if not 0 < target < 0.5:
        raise SpreadError(f"target must be between 0 and 0.5, got {target!r}")
    runs = []
    for path in paths:
        try:
            runs.append(load_run(Path(path)))
        except SchemaError as exc:
            raise SpreadError(str(exc)) from None
    identities = {_identity(r) for r in runs}
    if len(identities) != 1:
        seen = ", ".join(f"{c} ({p or 'processor not recorded'})" for c, p in sorted(identities))
        raise SpreadError(f"runs of different machines: {seen}; give runs of one processor")
    device_class, processor = identities.pop()
    by_commit: dict[str, list[LoadedRun]] = {}
    for r in runs:
        by_commit.setdefault(str(r.env.get("git_commit") or "?"), []).append(r)
    paired = {c: rs for c, rs in by_commit.items() if len(rs) > 1}
    if not paired:
        raise SpreadError(
            f"no two runs of one commit among {len(runs)} runs of {len(by_commit)} commits: runs "
            "are paired only with runs of their own commit, so that nothing but the machine "
            "differs"
        )
    gaps = [g for rs in paired.values() for g in pair_gaps(rs)]
    if len(gaps) < MIN_PAIRS:
        raise SpreadError(
            f"{len(gaps)} rows measured with an interval in two runs of one commit; need at "
            f"least {MIN_PAIRS} (runs of one sweep, several rounds each)"
        )
    commits = tuple(sorted(paired))
    by_backend: dict[str, list[PairGap]] = {}
    by_tokens: dict[int, list[PairGap]] = {}
    by_both: dict[str, dict[int, list[PairGap]]] = {}
    for g in gaps:
        by_backend.setdefault(g.backend, []).append(g)
        by_tokens.setdefault(g.tokens, []).append(g)
        by_both.setdefault(g.backend, {}).setdefault(g.tokens, []).append(g)
    used = sum(len(rs) for rs in paired.values())
    source = (
        f"{used} runs of {len(commits)} commit(s) ({', '.join(c[:7] for c in commits)}), "
        f"{len(gaps)} pairs of rows (kernelbench spread, at most {target:.0%} beyond)"
    )

    def fitted(groups: dict) -> dict:
        return {k: fit_halfwidth(g, target) for k, g in groups.items() if len(g) >= MIN_PAIRS}

    both = {b: fitted(at) for b, at in by_both.items()}
    spread = RunSpread(
        fit_halfwidth(gaps, target),
        fitted(by_backend),
        source,
        # one token count measured is the pooled figure again
        fitted(by_tokens) if len(by_tokens) > 1 else {},
        {b: at for b, at in both.items() if at and len(by_tokens) > 1},
    )
    return SpreadFit(used, gaps, spread, device_class, processor, commits)


def spread_folder(device_class: str, processor: str | None, baselines_dir: Path) -> Path:
    """Where a processor's spread is kept: its baseline folder (the class folder when the runs
    record no processor)."""
    try:
        folder = Path(baselines_dir) / sanitize(device_class)
    except BaselineError as exc:
        raise SpreadError(str(exc)) from None
    return folder / sanitize(processor) if processor else folder


def save_spread(fit: SpreadFit, baselines_dir: Path = DEFAULT_DIR) -> Path:
    """Write ``fit``'s spread into gate.json in the processor's folder (created if missing),
    keeping what else the file holds; returns the file."""
    folder = spread_folder(fit.device_class, fit.processor, baselines_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / GATE_FILE
    doc = _read_gate(path) if path.is_file() else {}
    doc[GATE_KEY] = {
        "halfwidth": round(fit.spread.halfwidth, 5),
        "by_backend": {b: round(v, 5) for b, v in sorted(fit.spread.by_backend.items())},
        "by_tokens": {str(t): round(v, 5) for t, v in sorted(fit.spread.by_tokens.items())},
        "by_backend_tokens": {
            b: {str(t): round(v, 5) for t, v in sorted(at.items())}
            for b, at in sorted(fit.spread.by_backend_tokens.items())
        },
        "runs": fit.runs,
        "pairs": len(fit.pairs),
        "beyond_own_intervals": round(fit.beyond_share, 4),
        "measured": fit.spread.source,
    }
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{GATE_FILE}.")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _read_gate(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpreadError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SpreadError(f"{path}: not a JSON object")
    return doc


def _fraction(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpreadError(f"{where} must be a number, got {value!r}")
    if not (math.isfinite(value) and 0 <= value < 1):
        raise SpreadError(f"{where} must be in [0, 1), got {value!r}")
    return float(value)


def read_spread(folder: Path) -> RunSpread | None:
    """The spread kept in ``folder``'s gate.json (``None``: no file, or none measured)."""
    path = Path(folder) / GATE_FILE
    if not path.is_file():
        return None
    entry = _read_gate(path).get(GATE_KEY)
    if entry is None:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("by_backend", {}), dict):
        raise SpreadError(f"{path}: {GATE_KEY} must be an object with a by_backend object")
    where = f"{path}: {GATE_KEY}"
    both = entry.get("by_backend_tokens", {})
    if not isinstance(both, dict) or not all(isinstance(v, dict) for v in both.values()):
        raise SpreadError(f"{where}.by_backend_tokens must map backends to objects")
    return RunSpread(
        _fraction(entry.get("halfwidth"), f"{where}.halfwidth"),
        {
            str(b): _fraction(v, f"{where}.by_backend.{b}")
            for b, v in entry.get("by_backend", {}).items()
        },
        f"{entry.get('measured') or 'measured'} ({path})",
        _by_tokens(entry.get("by_tokens", {}), f"{where}.by_tokens"),
        {str(b): _by_tokens(at, f"{where}.by_backend_tokens.{b}") for b, at in both.items()},
    )


def _by_tokens(value: object, where: str) -> dict[int, float]:
    """A gate.json object of spreads keyed by token count (``{"1": 0.12, ...}``)."""
    if not isinstance(value, dict):
        raise SpreadError(f"{where} must be an object keyed by token count")
    out = {}
    for key, v in value.items():
        if not str(key).isdigit() or int(key) <= 0:
            raise SpreadError(f"{where}: {key!r} is not a token count")
        out[int(key)] = _fraction(v, f"{where}.{key}")
    return out


def machine_of(device_classes: Iterable[str], env: dict) -> tuple[str, str | None] | None:
    """(device class, processor) of a run with rows of one class (``None``: several, or none)."""
    classes = set(device_classes)
    return (classes.pop(), processor_key(env)) if len(classes) == 1 else None


def spread_for(
    base: tuple[str, str | None] | None,
    new: tuple[str, str | None] | None,
    baselines_dir: Path = DEFAULT_DIR,
) -> RunSpread | None:
    """The spread kept for the machine of two runs (each :func:`machine_of`), when both ran on
    one processor (or neither records one) of one device class; ``None`` otherwise or when none
    is kept."""
    if base is None or base != new:
        return None
    return read_spread(spread_folder(*base, baselines_dir))


def kept_spread_line(
    machine: tuple[str, str | None] | None, baselines_dir: Path = DEFAULT_DIR
) -> str:
    """:func:`spread_line` of the spread kept for one run's ``machine`` (:func:`machine_of`).
    A kept file that cannot be read is said in the line, not raised: one run is shown and
    reported whatever that file holds (two runs are judged with it, so ``compare`` fails)."""
    try:
        return spread_line(spread_for(machine, machine, baselines_dir))
    except SpreadError as exc:
        return f"The kept spread between runs is not readable: {exc}"


def spread_line(spread: RunSpread | None) -> str:
    """What a run's reader should know of its intervals against another run's: the kept
    spread, or that none is kept."""
    if spread is None:
        return (
            "Intervals cover this run's rounds; how far another run on this machine reads beyond "
            "them is not measured (kernelbench spread)."
        )
    return (
        f"Between runs on this processor a speedup moves beyond its interval by "
        f"{spread.describe()}: {spread.source}."
    )
