"""Physics checks on the pooled rows of a run: numbers that contradict each other are flagged.

* Ordering: within one backend and cell, ``int8_raw``, ``vectorwise`` and ``llm_int8`` each do
  strictly more arithmetic than the one before (:data:`kernelbench.core.WORK_ORDER`). A method
  whose speedup interval lies wholly above that of a method doing less work was measured faster
  than physics allows: both rows are ``suspect``, with the reason. One allowance: ``int8_raw``
  writes an int32 output, twice the bytes of a 16-bit one; it may be slower by the time of
  writing those extra bytes: at the device's memory ``bandwidth`` when the run timed its CPU
  calls with freed memory reused (``cpu_memory_while_timing`` in env.json), else at its
  measured ``first_touch`` rate, into memory the call allocates fresh (on a 2-core VM, 168 MB of
  int32 output took 108 ms of a 1-second call that way).
* Roofline: each row's attainable throughput is its precision's compute peak, or the memory
  bandwidth times its arithmetic intensity (its declared flops over bytes), whichever is lower.
  A row whose throughput, even at the slow end of the interval of its calls' median time, is
  above that bound is ``suspect``; its shown share is of its pooled median (rounds weighing the
  same). Peaks come from the run's ``env.json`` (``kernelbench peak`` measures them).
  The bandwidth is the memory's: a ``cold`` row (caches evicted before each call) reads its
  data from there, at the rate of the placement of the threads its calls ran in where the peak
  has a figure for it (a VM whose host moves its two vCPUs between one core complex and two
  reads its bus at about half the rate on one; each call's link reading says where it ran).
  A ``hot`` row whose working set (its declared bytes) fits in a cache level (``env.json``'s
  ``cache.levels``) reads it from that cache, whose bandwidth is not measured: it is bounded
  by its compute peak only and labelled ``cache_resident``, never flagged for beating the
  memory's bandwidth.
* Beside the roofline at the peak bandwidth, a cold CPU row gets its share of the roofline at
  the bandwidth the bus gave just before each of its calls (the cache eviction's read rate: a
  reading, not a bound): on a VM whose shared bus reads 27-83 GB/s over minutes, that share
  says whether a streaming kernel is near the bus's limit, which the share of the best-ever
  peak cannot.
* Width: a speedup whose 95% interval is wider than ``ci_target`` (half-width, relative) is
  ``ci_wide``: shown, but flagged, so nobody reads a noisy ratio as a finding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from kernelbench.core import (
    WORK_ORDER,
    output_bytes,
    precision_class,
    roofline_ops,
    work_bytes,
    work_flops,
)
from kernelbench.results.schema import ResultRow
from kernelbench.results.states import same_placement
from kernelbench.statistics import (
    median_interval,
    rel_halfwidth,
    round_slices,
    round_weights,
    weighted_quantile,
)

PEAK_SOURCES = ("measured", "datasheet")
#: Peak kinds that are byte rates (GB/s), not op rates.
BYTE_RATES = ("bandwidth", "first_touch")
#: A row is above its roofline only beyond this relative margin as well as beyond its interval:
#: the peaks themselves are medians of a few measured calls.
ROOFLINE_MARGIN = 0.05
#: How each kind of physics flag's reason begins: readers of ``suspect_reason`` find the kind by
#: it (the extra rounds retry an ordering contradiction; a run re-measures an exceeded peak).
ORDERING = "ordering"
ABOVE_ROOFLINE = "above roofline"


def peaks(env: dict, device_class: str) -> dict[str, dict]:
    """Device peaks from env.json, keyed by kind: ``int8``, ``16bit``, ``fp32`` (``tops``) and
    ``bandwidth`` (``gbs``).

    ``env["peak"]`` holds ``{kind: {"tops" | "gbs": float, "source": "measured" | "datasheet",
    "note": str, "device_class": str (optional: applies to that class only)}}``. Entries without
    a positive figure or with another source are ignored: nothing here guesses a peak."""
    found: dict[str, dict] = {}
    raw = env.get("peak")
    if not isinstance(raw, dict):
        return found
    for kind, entry in raw.items():
        if not isinstance(entry, dict):
            continue
        unit = "gbs" if kind in BYTE_RATES else "tops"
        value, source = entry.get(unit), entry.get("source")
        if not isinstance(value, (int, float)) or value <= 0 or source not in PEAK_SOURCES:
            continue
        if entry.get("device_class") not in (None, device_class):
            continue
        found[str(kind)] = {
            unit: float(value),
            "source": source,
            "note": str(entry.get("note", "")),
        }
        placed = placement_peaks(entry)
        if unit == "gbs" and placed:
            found[str(kind)]["placements"] = placed
    return found


def placement_peaks(entry: dict) -> list[tuple[float, float]]:
    """``(link_ns, gbs)`` of each placement of the threads a bandwidth peak has a best call
    for (its ``placements``; empty in older caches and where there is no link probe)."""
    out = []
    for p in entry.get("placements") or []:
        link, gbs = (p.get(k) if isinstance(p, dict) else None for k in ("link_ns", "gbs"))
        valid = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (link, gbs))
        if valid:
            out.append((float(link), float(gbs)))
    return out


def call_bandwidths(row: ResultRow, placements: list[tuple[float, float]]) -> list[float | None]:
    """The bandwidth peak (GB/s) of the placement each of a cold row's calls ran in, by the
    link reading just before it (:func:`~kernelbench.results.states.same_placement`; ``None``
    where the peak has no figure for that placement, or the call no reading). Empty where the
    row has no reading for every call or the peak no placements."""
    links = row.link_ns
    if row.cache != "cold" or not placements or not links or len(links) != len(row.raw_ms):
        return []
    out: list[float | None] = []
    for link in links:
        near = [
            (abs(math.log(link / ns)), gbs) for ns, gbs in placements if same_placement(link, ns)
        ]
        out.append(min(near)[1] if near else None)
    return out


def _flag(row: ResultRow, reason: str) -> None:
    row.suspect = True
    row.suspect_reason = f"{row.suspect_reason}; {reason}" if row.suspect_reason else reason


def _interval_text(row: ResultRow) -> str:
    return f"{row.speedup:.2f} [{row.speedup_lo:.2f}, {row.speedup_hi:.2f}]"


def output_allowance(
    less: ResultRow, more: ResultRow, peak: dict[str, dict], outputs_reused: bool = False
) -> float:
    """Relative slowdown ``less`` may show over ``more`` from its larger output alone: the extra
    bytes written at the measured ``bandwidth`` (``outputs_reused``: calls write into memory
    freed by earlier calls) or first-touched at the ``first_touch`` rate (fresh memory), over
    ``less``'s time (0 without that rate or without extra bytes)."""
    rate = peak.get("bandwidth" if outputs_reused else "first_touch", {}).get("gbs")
    extra = output_bytes(less.method, less.m, less.n) - output_bytes(more.method, more.m, more.n)
    if not rate or extra <= 0 or not less.median_ms:
        return 0.0
    return extra / (rate * 1e9) / (less.median_ms / 1e3)


def check_ordering(
    rows: Iterable[ResultRow], peak: dict[str, dict] | None = None, outputs_reused: bool = False
) -> None:
    """Flag rows of one backend and cell whose speedups contradict :data:`WORK_ORDER` (beyond
    their intervals and the larger output's :func:`output_allowance`)."""
    groups: dict[tuple, dict[str, ResultRow]] = {}
    for row in rows:
        if row.status == "ok" and row.method in WORK_ORDER and row.speedup_lo is not None:
            cell = (row.device_class, row.case, row.d_model, row.layer, row.tokens, row.backend)
            groups.setdefault(cell, {})[row.method] = row
    for by_method in groups.values():
        present = [m for m in WORK_ORDER if m in by_method]
        for i, less in enumerate(present):
            for more in present[i + 1 :]:
                a, b = by_method[less], by_method[more]
                allowance = output_allowance(a, b, peak or {}, outputs_reused)
                if b.speedup_lo > a.speedup_hi * (1 + allowance):
                    reason = (
                        f"{ORDERING}: {more} {_interval_text(b)} measured faster than {less} "
                        f"{_interval_text(a)}, which does less work"
                    )
                    if allowance:
                        reason += f" (beyond {allowance:.0%} for its larger output)"
                    _flag(a, reason)
                    _flag(b, reason)


def cache_levels(env: dict) -> dict[str, int]:
    """The cache sizes (bytes by level) a run recorded in env.json (empty when none)."""
    levels = (env.get("cache") or {}).get("levels") if isinstance(env.get("cache"), dict) else None
    if not isinstance(levels, dict):
        return {}
    return {str(k): int(v) for k, v in levels.items() if isinstance(v, int) and v > 0}


def resident_level(row: ResultRow, levels: dict[str, int]) -> str | None:
    """The smallest cache level a ``hot`` row's working set fits in (``None``: memory, or a
    cold row)."""
    if row.cache != "hot" or not row.bytes or not levels:
        return None
    fitting = [(size, name) for name, size in levels.items() if row.bytes <= size]
    return min(fitting)[1] if fitting else None


def bus_roofline_share(row: ResultRow, peak_ops: float) -> float | None:
    """Median over a cold row's calls of its throughput over the roofline at the bandwidth the
    bus gave just before that call (``bus_gbps``, the eviction's read rate), instead of the
    measured peak bandwidth. ``None`` without a reading for every call (hot rows, CUDA, older
    runs). Informative, never a flag: the eviction's read rate is a reading of the bus, not a
    bound (part of its buffer may hit the last-level cache; a long stream can read faster
    than it), so the share can pass 100%."""
    readings, times = row.bus_gbps, row.raw_ms
    if row.cache != "cold" or not row.flops or not readings or len(readings) != len(times):
        return None
    shares = sorted(
        row.flops / (ms / 1e3) / roofline_ops(row.flops, row.bytes or 0.0, peak_ops, gbps * 1e9)
        for ms, gbps in zip(times, readings, strict=True)
        if ms > 0 and gbps > 0
    )
    return statistics.median(shares) if shares else None


def _within_bus(row: ResultRow, slow_ms: float) -> bool:
    """Whether a cold row stayed within the roofline at the bandwidth the bus gave just before
    its calls (its :func:`bus_roofline_share`, taken at the slow end of its interval). A row
    above the peak's roofline but within that one ran while the bus gave more than the peak
    was read at: a peak measured in a slower state of the machine, not a number against
    physics (a 2-vCPU Zen 4 VM read its bandwidth peak at 33-34 GB/s twice, the bus's rate
    there with the threads on one core complex; with them on two, the eviction read 51 GB/s
    before the calls and 8-token rows streamed their weights at 44-53 GB/s). Asked only of a
    row with a call in a placement the peak has no figure for (:func:`call_bandwidths`). A
    row beyond its compute peak is beyond this roofline too, and a row without a reading for
    every call is not excused."""
    share = row.bus_roofline_share
    if share is None or not row.median_ms or slow_ms <= 0:
        return False
    return share * row.median_ms / slow_ms <= 1 + ROOFLINE_MARGIN


def _rounds(row: ResultRow) -> list[list[float]]:
    """The row's calls by round (``round_samples``; one round where they do not add up)."""
    times = list(row.raw_ms)
    slices = round_slices(row.round_samples, len(times))
    return [times[s] for s in slices] if slices else [times]


def _placed_bounds(
    row: ResultRow, compute_ops: float, bandwidth_gbs: float, placed: list[float | None]
) -> list[float]:
    """Seconds each call of a row whose calls ran in known placements could take at least: its
    roofline at the bandwidth peak of its placement (the peak's best figure where it has none
    for it). A call can be no faster than its own bound, so the calls' median is no faster
    than the bounds' median: the check takes them as they are (against the interval of the
    calls' median), the shown share with the round weights of the row's pooled median."""
    return [
        row.flops
        / roofline_ops(row.flops, row.bytes or 0.0, compute_ops, (gbs or bandwidth_gbs) * 1e9)
        for gbs in placed
    ]


def check_roofline(
    rows: Iterable[ResultRow], peak: dict[str, dict], levels: dict[str, int] | None = None
) -> None:
    """Set each ok row's roofline and share of it; flag rows above it beyond their interval.
    A cold row whose calls ran in placements of the threads the bandwidth peak has figures for
    is held to those (:func:`call_bandwidths`); where a call's placement has none, the row is
    not flagged when the bus gave its calls that bandwidth just before them
    (:func:`_within_bus`): it is labelled ``above_peak`` instead, as its share passes 100%. A
    hot row resident in one of the cache ``levels`` is bounded by compute only."""
    bandwidth = peak.get("bandwidth", {}).get("gbs")
    placements = peak.get("bandwidth", {}).get("placements") or []
    for row in rows:
        compute = peak.get(precision_class(row.method), {}).get("tops")
        if row.status != "ok" or not row.median_ms or compute is None:
            continue
        if not row.flops:  # rows of older runs declare no work: it follows from the shape
            row.flops = work_flops(row.m, row.k, row.n)
            row.bytes = work_bytes(row.method, row.m, row.k, row.n)
        row.cache_resident = resident_level(row, levels or {}) is not None
        bw = bandwidth * 1e9 if bandwidth and not row.cache_resident else math.inf
        roof = roofline_ops(row.flops, row.bytes or 0.0, compute * 1e12, bw)
        placed = call_bandwidths(row, placements) if bandwidth and not row.cache_resident else []
        shown = roof
        if placed:
            bounds = _placed_bounds(row, compute * 1e12, bandwidth, placed)
            _, weights = round_weights(_rounds(row))
            shown = row.flops / weighted_quantile(bounds, weights, 0.5)
            roof = row.flops / statistics.median(bounds)
        unplaced = not placed or None in placed
        row.roofline_tops = shown / 1e12
        row.roofline_share = row.tops / row.roofline_tops if row.tops else None
        row.bus_roofline_share = bus_roofline_share(row, compute * 1e12)
        interval = median_interval(row.raw_ms)
        slow_ms = interval[1] if interval else row.median_ms
        best_case = row.flops / (slow_ms / 1e3)
        above = best_case > roof * (1 + ROOFLINE_MARGIN)
        excused = above and unplaced and _within_bus(row, slow_ms)
        row.above_peak = excused
        if above and not excused:
            at = " at the bandwidth of its calls' placements" if placed else ""
            _flag(
                row,
                f"{ABOVE_ROOFLINE}: {best_case / 1e12:.3g} TOPS at the slow end of its interval "
                f"> {roof / 1e12:.3g} TOPS attainable{at} (a peak measured in a slower moment "
                "of the machine, or under load? kernelbench peak --remeasure)",
            )


def check_width(rows: Iterable[ResultRow], ci_target: float) -> None:
    """Flag speedups whose 95% interval is wider than ``ci_target`` (or that have none)."""
    for row in rows:
        if row.status == "ok" and row.speedup is not None and row.paired:
            row.ci_wide = rel_halfwidth(row.speedup, row.speedup_lo, row.speedup_hi) > ci_target


def annotate(
    rows: list[ResultRow],
    peak: dict[str, dict],
    ci_target: float,
    outputs_reused: bool = False,
    levels: dict[str, int] | None = None,
) -> list[ResultRow]:
    """All checks on pooled rows (in place); returns them."""
    for row in rows:
        row.suspect, row.suspect_reason, row.ci_wide = False, "", False
    check_width(rows, ci_target)
    check_ordering(rows, peak, outputs_reused)
    check_roofline(rows, peak, levels)
    return rows
