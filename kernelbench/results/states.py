"""The memory bus's states: speedups split by what the bus read before each call.

On a VM whose memory bus and cores are shared with other guests, the machine alternates
between states seconds to minutes long, and int8 and 16-bit calls move in opposite directions
between them (on the 2-core Zen 5 VM: custom ``int8_raw`` at one token 3.1x bf16 while the
cache eviction read under 70 GB/s, 6-7x above it, at every GPT-3 size). A row whose pairs
come from both states has an interval as wide as the states are apart, however many pairs it
takes. Each cold CPU call records the eviction's read rate just before it (``bus_gbps``); when
a run's readings fall in two groups far apart, each row's pairs are split at the gap between
them and each group gets its own median and interval. The split is a reading of the bus, not of
the other guests: a pair near the threshold can belong to either state. The pooled speedup stays
the headline: a mix of the two states' medians by fixed shares has narrower intervals that the
next run does not reproduce (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kernelbench.statistics import median_interval

#: The two groups' median readings must be at least this many times apart to be two states.
MIN_SEPARATION = 1.3
#: ... and each group must hold at least this share of the readings.
MIN_SHARE = 0.1
#: Fewer readings than this: no split.
MIN_READINGS = 20
#: The two states, in the order tables show them.
STATES = ("slow", "fast")


@dataclass(frozen=True)
class BusSplit:
    """Readings below ``threshold_gbps`` are the slow state's."""

    threshold_gbps: float
    slow_gbps: float  # median reading of each state
    fast_gbps: float
    slow_share: float  # share of the readings in the slow state


@dataclass(frozen=True)
class StateSpeedup:
    speedup: float
    lo: float | None
    hi: float | None
    pairs: int
    median_ms: float | None = None  # the median of the row's own calls in that state


def bus_split(readings: Sequence[float]) -> BusSplit | None:
    """The split of the readings into two groups (the two-means split of their logarithms,
    exact: every cut of the sorted values is tried), or ``None`` when they do not fall in two
    groups far and full enough apart (:data:`MIN_SEPARATION`, :data:`MIN_SHARE`)."""
    logs = sorted(math.log(r) for r in readings if r and r > 0 and math.isfinite(r))
    n = len(logs)
    if n < MIN_READINGS:
        return None
    prefix, prefix_sq = [0.0], [0.0]
    for v in logs:
        prefix.append(prefix[-1] + v)
        prefix_sq.append(prefix_sq[-1] + v * v)

    def spread(i: int, j: int) -> float:  # sum of squared deviations of logs[i:j]
        s, q = prefix[j] - prefix[i], prefix_sq[j] - prefix_sq[i]
        return q - s * s / (j - i)

    lowest = max(1, math.ceil(MIN_SHARE * n))
    cuts = range(lowest, n - lowest + 1)
    if not cuts:
        return None
    cut = min(cuts, key=lambda i: spread(0, i) + spread(i, n))
    slow, fast = logs[:cut], logs[cut:]
    slow_gbps, fast_gbps = math.exp(statistics.median(slow)), math.exp(statistics.median(fast))
    if fast_gbps < MIN_SEPARATION * slow_gbps:
        return None
    return BusSplit(math.exp((slow[-1] + fast[0]) / 2), slow_gbps, fast_gbps, cut / n)


def state_of(bus_gbps: float | None, split: BusSplit) -> str | None:
    """``"slow"`` or ``"fast"``: the state a reading puts its call in (``None``: no reading)."""
    if bus_gbps is None or not math.isfinite(bus_gbps) or bus_gbps <= 0:
        return None
    return "slow" if bus_gbps < split.threshold_gbps else "fast"


def state_speedups(
    raw_ms: Sequence[float],
    baseline_raw_ms: Sequence[float],
    bus_gbps: Sequence[float],
    split: BusSplit,
) -> dict[str, StateSpeedup]:
    """Each state's paired speedups (baseline / call, the pairs whose call the bus reading
    before it puts in that state): median, 95% interval (``None`` with one pair), count, and
    the median of the row's calls in that state. Empty when the three are not aligned (an
    unpaired row, a round without readings)."""
    if not raw_ms or not (len(raw_ms) == len(baseline_raw_ms) == len(bus_gbps)):
        return {}
    ratios: dict[str, list[float]] = {state: [] for state in STATES}
    times: dict[str, list[float]] = {state: [] for state in STATES}
    for t, b, bus in zip(raw_ms, baseline_raw_ms, bus_gbps, strict=True):
        state = state_of(bus, split)
        if t and t > 0 and b and state is not None:
            ratios[state].append(b / t)
            times[state].append(t)
    out = {}
    for state, values in ratios.items():
        if values:
            interval = median_interval(values)
            lo, hi = interval if interval else (None, None)
            median_ms = statistics.median(times[state])
            out[state] = StateSpeedup(statistics.median(values), lo, hi, len(values), median_ms)
    return out
