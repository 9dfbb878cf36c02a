"""How often does the CI speed gate fail unchanged code, and catch a real slowdown, here?

Usage (each ROUND a `kernelbench run --quick --cache hot --extra-rounds 0` of one unchanged
commit, taken one after another with nothing else running):

    python scripts/gate_noise.py ROUND1 ... ROUND10 [--baseline-rounds 4] [--group 3] [--tol 0.3]

It replays `scripts/ci_gate.sh` on every way of drawing, from the rounds, disjoint sets of
BASELINE_ROUNDS rounds (the committed baseline), GROUP rounds (the gate's first merge) and
GROUP more (the confirming rounds), merged in memory as `kernelbench merge` does:

1. `compare BASE FIRST --backend custom --speed-tol TOL`: no `slower` row passes;
2. otherwise `compare BASE FIRST+CONFIRM ...`: a `slower` row there fails CI.

Unchanged code should never fail: each failure is a false alarm. Then for every draw and every
`custom` `llm_int8` row, that row's `median_ms` is raised by INJECT (1.5 = +50%: a regression
the gate must catch) in both merges, and the script counts how often the gate fails naming that row.
The committed baseline pools more rounds than BASELINE_ROUNDS, so CI's own noise is at most
what this reports. Prints plain text; writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import statistics
import sys
from pathlib import Path

from kernelbench.results.compare import LoadedRun, compare_loaded_runs
from kernelbench.results.merge import merge_runs
from kernelbench.results.schema import KEY_COLUMNS


def merged(paths: list[Path]) -> LoadedRun:
    rows, env = merge_runs(paths)
    keyed = {tuple(getattr(r, c) for c in KEY_COLUMNS): dataclasses.asdict(r) for r in rows}
    return LoadedRun(Path("+".join(p.name for p in paths)), keyed, env, 0)


def slowed(run: LoadedRun, key: tuple | None, factor: float) -> LoadedRun:
    if key is None:
        return run
    rows = dict(run.rows)
    row = dict(rows[key], median_ms=rows[key]["median_ms"] * factor)
    for name in ("speedup", "speedup_lo", "speedup_hi"):  # every pair's row call slower
        if row.get(name) is not None:
            row[name] /= factor
    rows[key] = row
    return LoadedRun(run.path, rows, run.env, 0)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]


Draw = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]

#: Up to this many draws are listed whole, then shuffled; past it they are sampled one by one
#: (20 rounds have 4845 x 560 x 286 ways: listing them took 22 GB).
LISTED_DRAWS = 1_000_000


def sample_draws(n: int, nb: int, g: int, limit: int, seed: int = 0) -> list[Draw]:
    """At most ``limit`` distinct draws (baseline, first merge, first + confirming) of disjoint
    rounds out of ``n``, in random order; every one when there are no more than ``limit``."""
    rng = random.Random(seed)
    total = math.comb(n, nb) * math.comb(n - nb, g) * math.comb(n - nb - g, g)
    if total <= LISTED_DRAWS:
        draws = []
        for base in itertools.combinations(range(n), nb):
            rest = [i for i in range(n) if i not in base]
            for first in itertools.combinations(rest, g):
                left = [i for i in rest if i not in first]
                draws += [(base, first, first + c) for c in itertools.combinations(left, g)]
        rng.shuffle(draws)
        return draws[:limit]
    seen: dict[Draw, None] = {}  # distinct, in the order drawn
    while len(seen) < min(limit, total):
        base = tuple(sorted(rng.sample(range(n), nb)))
        rest = [i for i in range(n) if i not in base]
        first = tuple(sorted(rng.sample(rest, g)))
        left = [i for i in rest if i not in first]
        seen[(base, first, first + tuple(sorted(rng.sample(left, g))))] = None
    return list(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="+", type=Path)
    ap.add_argument("--baseline-rounds", type=int, default=4)
    ap.add_argument("--group", type=int, default=3, help="rounds per gate merge (KB_GATE_ROUNDS)")
    ap.add_argument("--tol", type=float, default=0.30, help="KB_GATE_SPEED_TOL under test")
    ap.add_argument("--backend", default="custom")
    ap.add_argument("--inject", type=float, default=1.5, help="median_ms factor of the test")
    ap.add_argument("--draws", type=int, default=3000, help="at most this many draws (random)")
    args = ap.parse_args()
    n, nb, g = len(args.rounds), args.baseline_rounds, args.group
    if n < nb + 2 * g:
        sys.exit(f"need at least {nb + 2 * g} rounds (baseline {nb} + 2 x group {g})")

    draws = sample_draws(n, nb, g, args.draws)
    cache: dict[tuple, LoadedRun] = {}
    ours = [args.backend]

    def run_of(idx: tuple) -> LoadedRun:
        key = tuple(sorted(idx))
        if key not in cache:
            cache[key] = merged([args.rounds[i] for i in key])
        return cache[key]

    def gate(base: LoadedRun, first: LoadedRun, both: LoadedRun, key, stage_changes=None):
        """(failed, names the slowed row, first stage flagged) of the two-stage gate."""
        one = compare_loaded_runs(base, slowed(first, key, args.inject), args.tol, 0, ours)
        if stage_changes is not None:
            for r in one.rows:
                if r.change is not None:
                    stage_changes.setdefault(r.label, []).append(abs(r.change))
        if not any(r.verdict == "slower" for r in one.rows):
            return False, False, False
        two = compare_loaded_runs(base, slowed(both, key, args.inject), args.tol, 0, ours)
        slower = [r for r in two.rows if r.verdict == "slower"]
        return bool(slower), any(r.key == key for r in slower), True

    targets = [
        k
        for k, r in run_of(draws[0][0]).rows.items()
        if r["backend"] == args.backend and r["method"] == "llm_int8" and r["status"] == "ok"
    ]
    changes: dict[str, list[float]] = {}
    flagged = failed = caught = tried = 0
    for b, f, fc in draws:
        base, first, both = run_of(b), run_of(f), run_of(fc)
        fail, _, flag = gate(base, first, both, None, changes)
        flagged += flag
        failed += fail
        for key in targets:
            tried += 1
            caught += gate(base, first, both, key)[1]

    every = [c for cs in changes.values() for c in cs]
    print(
        f"{n} rounds; {len(draws)} draws of baseline {nb} rounds, gate {g} + {g} confirming; "
        f"--speed-tol {args.tol}"
    )
    print(f"|change| of {args.backend} rows, baseline vs first merge (unchanged code):")
    print(
        f"  median {statistics.median(every):.1%}, 95th percentile {pct(every, 0.95):.1%}, "
        f"max {max(every):.1%}"
    )
    for label, cs in changes.items():
        print(f"  {label}: median {statistics.median(cs):.1%}, 95th pct {pct(cs, 0.95):.1%}")
    print(
        f"unchanged code: first stage flagged a 'slower' row in {flagged} of {len(draws)} draws; "
        f"the gate failed (confirmed) in {failed} ({failed / len(draws):.2%})"
    )
    print(
        f"x{args.inject} median_ms on one {args.backend} llm_int8 row: the gate failed naming it "
        f"in {caught} of {tried} cases ({caught / max(tried, 1):.1%})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
