"""The memory bus's states: speedups split by what the bus read before each call.

On a VM whose memory bus and cores are shared with other guests, the machine alternates
between states seconds to minutes long, and int8 and 16-bit calls move in opposite directions
between them (on the 2-core Zen 5 VM: custom ``int8_raw`` at one token 3.1x bf16 while the
cache eviction read under 70 GB/s, 6-7x above it, at every GPT-3 size). A row whose pairs
come from both states has an interval as wide as the states are apart, however many pairs it
takes. Each cold CPU call records the eviction's read rate just before it (``bus_gbps``); when
a run's readings fall in two groups far apart, each row's pairs are split at the gap between
them and each group gets its own median and interval. The pooled speedup stays the headline: a
mix of the two states' medians by fixed shares has narrower intervals that the next run does not
reproduce (docs/benchmarks.md).

What the states are, on that VM: where the host runs its two vCPUs. Each cold CPU call also
records the round trip of a cache line between two of the run's threads (``link_ns``): about 50
ns while both vCPUs sit on one core complex (one shared L3, one link to memory: the bus reads
40-65 GB/s) and about 300 ns while they sit on two (two links: 70-110 GB/s; the threads' shared
data crosses between complexes, and bf16 calls run slower). The bus reading of one state drifts
over a run and overlaps the other's (a slow state read 60-72 GB/s in one run, 46-57 in others),
so where every call carries a link reading the link decides, sharp where the bus is not: two
groups are two states (the one whose bus readings are slower named ``slow``), one group is one.

The core probe's readings (``core_ns``) fall in two groups the same way on a host that shares
its cores out (:func:`core_split`); the run's headline says so, the rows are not split by them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kernelbench.statistics import round_slices, rounds_median_interval

#: The two groups' median readings must be at least this many times apart to be two states.
MIN_SEPARATION = 1.3
#: ... and each group must hold at least this share of the readings.
MIN_SHARE = 0.1
#: Fewer readings than this: no split.
MIN_READINGS = 20
#: The link readings' groups: a round trip within one core complex and one across complexes
#: differ by several times (about 50 and 300 ns on the Zen 5 VM), and a reading is the fastest
#: of several batches, so a few calls on the other side are a state, not noise: a group needs
#: this share of the calls, and at least LINK_MIN_CALLS of them, and medians this far apart.
LINK_MIN_SHARE = 0.01
LINK_MIN_CALLS = 5
LINK_MIN_SEPARATION = 2.0
#: A link reading above this is not a placement but a thread that was not running (on a
#: machine busy with other work a reading took 7.4 ms): its call's state is unknown.
LINK_MAX_NS = 20_000.0
#: The two states, in the order tables show them.
STATES = ("slow", "fast")


@dataclass(frozen=True)
class BusSplit:
    """Readings below ``threshold_gbps`` are the slow state's; with ``link_threshold_ns``, a
    call with a link reading is classed by it instead (below: ``slow_is_near``'s state)."""

    threshold_gbps: float
    slow_gbps: float  # median reading of each state
    fast_gbps: float
    slow_share: float  # share of the readings in the slow state
    link_threshold_ns: float | None = None
    slow_is_near: bool = True
    near_ns: float | None = None  # median link reading of each group
    far_ns: float | None = None

    @property
    def near_share(self) -> float:
        """The share of the calls whose threads were on one core complex (link splits)."""
        return self.slow_share if self.slow_is_near else 1 - self.slow_share

    @property
    def near_far_states(self) -> tuple[str, str]:
        """The state names of the near and the far group (link splits)."""
        return ("slow", "fast") if self.slow_is_near else ("fast", "slow")

    @property
    def near_far_gbps(self) -> tuple[float, float]:
        """The bus medians of the near and the far group (link splits)."""
        pair = (self.slow_gbps, self.fast_gbps)
        return pair if self.slow_is_near else pair[::-1]


def call_readings(
    rows: Iterable[tuple[object, object]], links_only: bool = False
) -> tuple[list[float], list[float | None]]:
    """The bus and link readings of rows given as ``(bus_gbps, link_ns)`` lists, aligned: a row
    whose links do not match its bus readings adds ``None`` links (the bus then classes its
    calls), or nothing with ``links_only``."""
    bus: list[float] = []
    links: list[float | None] = []
    for b, link in rows:
        b = list(b) if isinstance(b, list | tuple) else []
        link = list(link) if isinstance(link, list | tuple) else []
        if link and len(link) == len(b):
            bus += b
            links += link
        elif not links_only:
            bus += b
            links += [None] * len(b)
    return bus, links


def far_share(links: Sequence[float], split: BusSplit) -> float | None:
    """The share of ``links`` (those under :data:`LINK_MAX_NS`) at or above the split's link
    threshold: the calls with the threads on two core complexes (``None``: none to count)."""
    if split.link_threshold_ns is None:
        return None
    placed = [v for v in links if v <= LINK_MAX_NS]
    if not placed:
        return None
    return sum(v >= split.link_threshold_ns for v in placed) / len(placed)


@dataclass(frozen=True)
class StateSpeedup:
    speedup: float
    lo: float | None
    hi: float | None
    pairs: int
    median_ms: float | None = None  # the median of the row's own calls in that state


def _valid(r: float | None) -> bool:
    return r is not None and r > 0 and math.isfinite(r)


def _two_groups(
    readings: Sequence[float],
    min_share: float = MIN_SHARE,
    min_calls: int = 1,
    min_separation: float = MIN_SEPARATION,
) -> tuple[float, float, float, float] | None:
    """(threshold, lower group's median, upper group's median, lower group's share) of the
    two-means split of the readings' logarithms (exact: every cut of the sorted values is
    tried), or ``None`` when they do not fall in two groups far and full enough apart (each
    with ``min_share`` of the readings and ``min_calls`` of them, medians ``min_separation``
    times apart)."""
    logs = sorted(math.log(r) for r in readings if _valid(r))
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

    lowest = max(1, min_calls, math.ceil(min_share * n))
    cuts = range(lowest, n - lowest + 1)
    if not cuts:
        return None
    cut = min(cuts, key=lambda i: spread(0, i) + spread(i, n))
    low, high = logs[:cut], logs[cut:]
    low_median, high_median = math.exp(statistics.median(low)), math.exp(statistics.median(high))
    if high_median < min_separation * low_median:
        return None
    return math.exp((low[-1] + high[0]) / 2), low_median, high_median, cut / n


def link_threshold(links: Sequence[float]) -> float | None:
    """The round trip that parts the link readings' two groups (the threads on one core
    complex and on two: :data:`LINK_MIN_SHARE`, :data:`LINK_MIN_CALLS`,
    :data:`LINK_MIN_SEPARATION`), or ``None`` when they are one group (readings above
    :data:`LINK_MAX_NS` are left out)."""
    placed = [v for v in links if _valid(v) and v <= LINK_MAX_NS]
    groups = _two_groups(placed, LINK_MIN_SHARE, LINK_MIN_CALLS, LINK_MIN_SEPARATION)
    return groups[0] if groups is not None else None


def same_placement(a_ns: float, b_ns: float) -> bool:
    """Whether two link readings (or two groups' medians) are of one placement of the threads:
    within :data:`LINK_MIN_SEPARATION` of each other, the least that parts two groups."""
    if not (_valid(a_ns) and _valid(b_ns)) or max(a_ns, b_ns) > LINK_MAX_NS:
        return False
    return max(a_ns, b_ns) < LINK_MIN_SEPARATION * min(a_ns, b_ns)


@dataclass(frozen=True)
class CoreSplit:
    """The core probe's readings (``core_ns``) in two groups: the cores at their usual speed
    and slowed (on a host that shares its cores out, another guest's work on them)."""

    threshold_ns: float
    fast_ns: float  # median reading of each group
    slow_ns: float
    fast_share: float  # share of the readings in the fast group


def core_split(readings: Sequence[float]) -> CoreSplit | None:
    """The split of the core readings in two groups (:data:`MIN_SEPARATION` apart, each with
    :data:`MIN_SHARE` of them), or ``None`` when they are one. On a 2-vCPU Xeon VM a default
    sweep's readings fell at about 18 and 33 us, 58-88% of them in the faster group by run, and
    the bf16 baseline ran 1.6-3x slower in the other, int8 calls 1.3-2.3x: the steal count and
    the load of other processes showed nothing."""
    groups = _two_groups(readings)
    return CoreSplit(*groups) if groups is not None else None


def bus_split(
    readings: Sequence[float], links: Sequence[float | None] | None = None
) -> BusSplit | None:
    """The split of the calls into two states, or ``None`` when there are not two.

    By the link readings (``links``, aligned with ``readings``) when every call has one: two
    groups (:data:`LINK_MIN_SHARE`, :data:`LINK_MIN_CALLS`, :data:`LINK_MIN_SEPARATION`) are
    the two states, each named by its bus median (the slower one ``slow``); one group is one
    state, however the bus readings spread within it (readings above :data:`LINK_MAX_NS` are
    left out). Without a link reading for every call, by the bus readings alone."""
    if links is not None and len(links) == len(readings) and all(_valid(v) for v in links):
        placed = [v for v in links if v <= LINK_MAX_NS]
        by_link = _two_groups(placed, LINK_MIN_SHARE, LINK_MIN_CALLS, LINK_MIN_SEPARATION)
        if by_link is None:
            return None
        threshold, near_ns, far_ns, near_share = by_link
        pairs = [(b, v) for b, v in zip(readings, links, strict=True) if v <= LINK_MAX_NS]
        near = [b for b, v in pairs if v < threshold and _valid(b)]
        far = [b for b, v in pairs if v >= threshold and _valid(b)]
        if near and far:
            near_gbps, far_gbps = statistics.median(near), statistics.median(far)
            slow_is_near = near_gbps <= far_gbps
            slow_gbps, fast_gbps = sorted((near_gbps, far_gbps))
            return BusSplit(
                math.sqrt(slow_gbps * fast_gbps),
                slow_gbps,
                fast_gbps,
                near_share if slow_is_near else 1 - near_share,
                link_threshold_ns=threshold,
                slow_is_near=slow_is_near,
                near_ns=near_ns,
                far_ns=far_ns,
            )
    by_bus = _two_groups(readings)
    if by_bus is None:
        return None
    return BusSplit(*by_bus)


def state_of(bus_gbps: float | None, split: BusSplit, link_ns: float | None = None) -> str | None:
    """``"slow"`` or ``"fast"``: the state a call's readings put it in (``None``: no reading).
    The link reading decides when the split has a link threshold and the call has one (above
    :data:`LINK_MAX_NS`: ``None``, a thread was not running)."""
    if split.link_threshold_ns is not None and _valid(link_ns):
        if link_ns > LINK_MAX_NS:
            return None
        near = link_ns < split.link_threshold_ns
        return "slow" if near == split.slow_is_near else "fast"
    if not _valid(bus_gbps):
        return None
    return "slow" if bus_gbps < split.threshold_gbps else "fast"


def state_bounds(split: BusSplit) -> dict[str, str]:
    """What puts a call in each state, in :data:`STATES` order (``under 66 ns`` ...)."""
    if split.link_threshold_ns is not None:
        near = f"link under {split.link_threshold_ns:.0f} ns"
        far = f"link {split.link_threshold_ns:.0f} ns and above"
        return {"slow": near, "fast": far} if split.slow_is_near else {"slow": far, "fast": near}
    return {
        "slow": f"under {split.threshold_gbps:.0f} GB/s",
        "fast": f"{split.threshold_gbps:.0f} GB/s and above",
    }


def state_speedups(
    raw_ms: Sequence[float],
    baseline_raw_ms: Sequence[float],
    bus_gbps: Sequence[float],
    split: BusSplit,
    link_ns: Sequence[float] | None = None,
    round_samples: Sequence[int] | None = None,
) -> dict[str, StateSpeedup]:
    """Each state's paired speedups (baseline / call, the pairs whose call the bus reading
    before it puts in that state): median, 95% interval (``None`` with one pair), count, and
    the median of the row's calls in that state. Empty when the three are not aligned (an
    unpaired row, a round without readings). ``link_ns``: each call's link reading (used when
    aligned, :func:`state_of`). ``round_samples``: the pooled row's pairs per round; when they
    add up, the interval is two-stage over the rounds' pairs in that state (each pair weighing
    the same, :func:`~kernelbench.statistics.rounds_median_interval`), so that drift between
    rounds within one state widens it as it widens a pooled interval."""
    if not raw_ms or not (len(raw_ms) == len(baseline_raw_ms) == len(bus_gbps)):
        return {}
    links = list(link_ns) if link_ns is not None and len(link_ns) == len(raw_ms) else None
    sizes = list(round_samples) if isinstance(round_samples, list | tuple) else []
    rounds = [0] * len(raw_ms)
    for index, calls in enumerate(round_slices(sizes, len(raw_ms)) or []):
        rounds[calls] = [index] * (calls.stop - calls.start)
    ratios: dict[str, dict[int, list[float]]] = {state: {} for state in STATES}
    times: dict[str, list[float]] = {state: [] for state in STATES}
    for i, (t, b, bus) in enumerate(zip(raw_ms, baseline_raw_ms, bus_gbps, strict=True)):
        state = state_of(bus, split, links[i] if links else None)
        if t and t > 0 and b and state is not None:
            ratios[state].setdefault(rounds[i], []).append(b / t)
            times[state].append(t)
    out = {}
    for state, per_round in ratios.items():
        values = [v for group in per_round.values() for v in group]
        if values:
            interval = rounds_median_interval(list(per_round.values()), equal_rounds=False)
            lo, hi = interval if interval else (None, None)
            median_ms = statistics.median(times[state])
            out[state] = StateSpeedup(statistics.median(values), lo, hi, len(values), median_ms)
    return out
