"""Statistics of timed samples, free of torch: summaries, pooling weights and intervals.

Every speedup kernelbench prints is the median of paired ratios (a row's call and its
baseline's call, back to back) and carries a 95% bootstrap confidence interval of that median
(criterion.rs' approach): resample the pairs with replacement, take each resample's median, and
read the 2.5th and 97.5th percentiles. Pairs pooled from several rounds are resampled in two
stages (:func:`rounds_median_interval`): rounds with replacement, then pairs within each round,
each round weighing the same as in the pooled median. Resampling only the pairs would treat
them as independent, but a row's ratio drifts between rounds minutes apart on a shared machine
more than within one round (torch's vectorwise at d=768 read 1.05-1.31 in four rounds, each
with an interval under +-3%), and such an interval would claim a precision the next run does
not reproduce.

A bootstrap over three rounds still understates that drift: resampling three values cannot
know how far a fourth would fall. So the pooled interval is at least Student's t interval of
the rounds' (log) medians, centred on the pooled median (:func:`round_medians_halfwidth`):
with 3 rounds its quantile is 4.30, not 1.96. Measured on a 2-vCPU Xeon VM, runs of one
configuration repeated (the custom and torch int8 rows of 5 D.1 runs, 6 short runs, 5 default
sweeps): with the bootstrap alone 15-28% of the pairs of runs differed by more than their
intervals allowed (5% if the intervals held), with the t floor 5-8% (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Resamples per bootstrap interval: enough that the interval's ends move by well under 1% of
#: its width between seeds, cheap for a few hundred pairs.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Stats:
    median_ms: float
    iqr_ms: float
    min_ms: float
    mean_ms: float
    rel_spread: float  # IQR / median
    samples: int


def weighted_quantile(values: Sequence[float], weights: Sequence[float], p: float) -> float:
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


def stats(samples_ms: Sequence[float], weights: Sequence[float] | None = None) -> Stats:
    """Median, IQR, min, mean and IQR / median; with ``weights``, each sample counts that much.
    Unweighted quartiles interpolate linearly between order statistics."""
    if not samples_ms:
        raise ValueError("no samples")
    if weights is None:
        q1, median, q3 = np.quantile(np.asarray(samples_ms, dtype=float), [0.25, 0.5, 0.75])
        mean = float(np.mean(samples_ms))
    else:
        q1, median, q3 = (weighted_quantile(samples_ms, weights, p) for p in (0.25, 0.5, 0.75))
        mean = sum(s * w for s, w in zip(samples_ms, weights, strict=True)) / sum(weights)
    median, iqr = float(median), float(q3 - q1)
    rel = iqr / median if median > 0 else 0.0
    return Stats(median, iqr, float(min(samples_ms)), float(mean), rel, len(samples_ms))


def round_weights(per_round: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """All rounds' samples concatenated, and weights that give each round the same total."""
    values = [v for samples in per_round for v in samples]
    weights = [1.0 / len(samples) for samples in per_round for _ in samples]
    return values, weights


def round_slices(round_samples: Sequence[int] | None, calls: int) -> list[slice] | None:
    """Where each round's calls lie among a pooled row's ``calls`` values (``round_samples``:
    its calls per round, in order); ``None`` where they are unknown, do not add up to
    ``calls`` or one is not positive (a row as written, or pooled by an older reader)."""
    sizes = list(round_samples or [])
    if not sizes or sum(sizes) != calls or min(sizes) <= 0:
        return None
    ends = np.cumsum(sizes).tolist()
    return [slice(end - size, end) for size, end in zip(sizes, ends, strict=True)]


def median_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile-bootstrap confidence interval of the median of ``values`` (``None`` for fewer
    than two values: one sample says nothing about its own uncertainty). Deterministic for a
    given seed, so a results file reads the same every time it is summarised."""
    data = np.asarray(values, dtype=float)
    if data.size < 2 or not np.all(np.isfinite(data)):
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))
    medians = np.median(data[idx], axis=1)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def _weighted_medians(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per row of ``values``, :func:`weighted_quantile` at 0.5 with that row's ``weights``."""
    order = np.argsort(values, axis=1, kind="stable")
    v = np.take_along_axis(values, order, axis=1)
    cumulative = np.cumsum(np.take_along_axis(weights, order, axis=1), axis=1)
    target = 0.5 * cumulative[:, -1:] - 1e-12
    first = np.minimum((cumulative < target).sum(axis=1), v.shape[1] - 1)
    return v[np.arange(v.shape[0]), first]


def rounds_median_interval(
    per_round: Sequence[Sequence[float]],
    confidence: float = CONFIDENCE,
    seed: int = 0,
    equal_rounds: bool = True,
) -> tuple[float, float] | None:
    """Two-stage bootstrap interval of the pooled median of several rounds' values (each round
    weighing the same; with ``equal_rounds=False`` each value does, the median of all values):
    each resample draws the rounds with replacement, then values within each round with
    replacement. The interval so covers the drift between rounds as well as the scatter within
    them. (A round drawn twice in one resample reuses its one within-round resample: the
    between-round stage is what this adds.) It is widened, where narrower, to the t interval of
    the rounds' medians around the pooled median (:func:`round_medians_halfwidth`; at 95% only).
    One round: :func:`median_interval`."""
    rounds = [np.asarray(r, dtype=float) for r in per_round if len(r)]
    if len(rounds) < 2:
        return median_interval(rounds[0]) if rounds else None
    if not all(np.all(np.isfinite(r)) for r in rounds):
        return None
    rng = np.random.default_rng(seed)
    picks = rng.multinomial(len(rounds), [1.0 / len(rounds)] * len(rounds), BOOTSTRAP_RESAMPLES)
    values = np.concatenate(
        [r[rng.integers(0, r.size, size=(BOOTSTRAP_RESAMPLES, r.size))] for r in rounds], axis=1
    )
    weights = np.concatenate(
        [
            np.repeat(picks[:, [i]] / (r.size if equal_rounds else 1), r.size, axis=1)
            for i, r in enumerate(rounds)
        ],
        axis=1,
    )
    medians = _weighted_medians(values, weights)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = (float(v) for v in np.percentile(medians, [tail, 100 - tail]))
    halfwidth = round_medians_halfwidth(rounds, equal_rounds) if confidence == CONFIDENCE else None
    if halfwidth is not None:
        pooled_values, pooled_weights = round_weights(rounds)
        if not equal_rounds:
            pooled_weights = [1.0] * len(pooled_values)
        pooled = weighted_quantile(pooled_values, pooled_weights, 0.5)
        lo = min(lo, pooled * math.exp(-halfwidth))
        hi = max(hi, pooled * math.exp(halfwidth))
    return lo, hi


#: Student's t quantiles at 0.975 by degrees of freedom (1-30); beyond, the Cornish-Fisher
#: expansion of the normal quantile (within 0.1% of the exact value at 31 degrees).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t_quantile_975(dof: int) -> float:
    """Student's t distribution's 0.975 quantile with ``dof`` degrees of freedom (>= 1)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def round_medians_halfwidth(
    per_round: Sequence[Sequence[float]], equal_rounds: bool = True
) -> float | None:
    """Half-width, on the log scale, of the 95% t interval of the mean of the rounds' log
    medians (``None`` for fewer than two rounds or a value that is not positive): what the
    rounds' scatter says of the drift between them, however few they are. With
    ``equal_rounds=False`` each round weighs as many values as it has, and the t quantile
    takes the rounds' effective number ((sum of weights)^2 / sum of squared weights)."""
    rounds = [np.asarray(r, dtype=float) for r in per_round if len(r)]
    if len(rounds) < 2 or not all(np.all(r > 0) for r in rounds):
        return None
    logs = np.log([float(np.median(r)) for r in rounds])
    weights = np.array([1.0 if equal_rounds else float(r.size) for r in rounds])
    weights /= weights.sum()
    effective = 1.0 / float(np.sum(weights**2))
    mean = float(np.sum(weights * logs))
    variance = float(np.sum(weights * (logs - mean) ** 2)) * effective / (effective - 1)
    dof = max(1, math.floor(effective - 1 + 1e-9))
    return t_quantile_975(dof) * math.sqrt(variance / effective)


def rounds_to_narrow(halfwidth: float, rounds: int, target: float, most: int) -> int | None:
    """The fewest further rounds (1 to ``most``) after which a t interval of ``rounds`` round
    medians, ``halfwidth`` wide now, is within ``target``, if the rounds scatter as they did:
    the quantile falls and the count grows (from 3 rounds one more narrows it 1.56x, from 6
    1.13x). ``None`` when ``most`` do not reach it, or with fewer than two rounds (no t
    interval yet to project)."""
    if rounds < 2 or not math.isfinite(halfwidth) or halfwidth < 0:
        return None
    now = t_quantile_975(rounds - 1) / math.sqrt(rounds)
    for more in range(1, most + 1):
        n = rounds + more
        if halfwidth * t_quantile_975(n - 1) / math.sqrt(n) / now <= target:
            return more
    return None


def rel_halfwidth(value: float | None, lo: float | None, hi: float | None) -> float:
    """Half the interval's width relative to the value (``inf`` without an interval)."""
    if value is None or lo is None or hi is None or value <= 0:
        return math.inf
    return (hi - lo) / 2 / value
