"""The one speed verdict: did a row get faster or slower between two runs, beyond the noise?

``kernelbench compare`` (the CI gate) and the HTML A/B report both call :func:`speed_verdict`
on the pooled rows of the two runs, so they cannot disagree.

Each row is compared through its ``speedup`` (the same run's 16-bit baseline over the row, on the
same inputs), so runs on machines of different speed or load compare; when either run lacks a
speedup the raw ``median_ms`` is compared and the detail says so. The change is the relative
growth of the row's (normalised) time: ``+0.20`` is 20% slower.

Noise. A row is ``slower`` only when its change exceeds both the tolerance and the two runs'
noise combined in quadrature (independent runs; independent relative errors of a ratio add in
quadrature to first order). A run's noise on a row is, in order of preference:

1. the half-width of its speedup's 95% interval, relative (a paired row with an interval: the
   uncertainty of the very number compared);
2. the spread of its pairs' ratios (``paired_rel_spread``) for a paired row without interval;
3. its own ``rel_spread``, with that of its cell's 16-bit baseline row when compared through an
   unpaired speedup.

Placements. On a VM whose host moves the threads between one core complex and two
(:mod:`kernelbench.results.states`), a pooled speedup mixes the two placements in the shares
that row's calls met them, and two runs' shares differ: a row at 2.1x on one complex and 2.3x on
two reads anything between, pooled. Where both runs record the threads' link, a row called
slower or faster pooled is judged again in each placement both runs measured it in with an
interval (:func:`placement_verdict`), and those verdicts decide where they agree (the same in
every placement: ``same``; slower in one and the same in the other: ``slower``), the pooled
call kept in its detail. On the Zen 5 VM two consecutive D.1 runs that met one complex for 53%
and 68% of their calls differed by 10-36% on 15 rows pooled, and on none in either placement.

One round. A row pooled from one round while its run has rows of several (``fp32`` where its
call is long, timed in the first round only) has an interval that covers that round's seconds,
not the drift between rounds: slower or faster beyond its band, it is ``unknown``
(:func:`one_round_verdict`). Runs of one round each (``--quick``) are judged as measured; the
gate pools several.

Between runs. A run's rounds are minutes apart; the host drifts over longer times too, so two
runs of one commit differ by more than their intervals allow (on a 2-vCPU Xeon VM, 15.8% of
1732 pairs of rows from 19 runs beyond their combined 95% intervals). A :class:`RunSpread`
measured on a processor (``kernelbench spread``, :mod:`kernelbench.results.spread`) enters
each run's noise on a speedup as one more half-width: ``speed_verdict(..., between=...)``.

Spreads (2, 3) from a row pooled from R rounds enter as ``spread / sqrt(R)``: rounds are
independent draws of the machine's state. A spread from fewer than :data:`MIN_SPREAD_SAMPLES`
samples is not a measurement: a change beyond the tolerance with such a spread is ``unknown``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kernelbench.results.states import BusSplit, bus_split, call_readings, state_speedups
from kernelbench.statistics import rel_halfwidth

#: Fewer timed samples than this give no usable spread (1 sample: IQR 0; 2: half their gap).
MIN_SPREAD_SAMPLES = 3


@dataclass(frozen=True)
class SpeedCall:
    verdict: str  # "faster" | "slower" | "same" | "unknown"
    metric: str = ""  # "speedup" | "median_ms" | ""
    base_value: float | None = None
    new_value: float | None = None
    change: float | None = None  # relative growth of the row's time
    noise: float | None = None
    band: float | None = None
    detail: str = ""
    #: how many of the spreads behind ``noise`` were not measured (then entered as 0)
    unmeasured: int = 0


@dataclass(frozen=True)
class RunSpread:
    """How far one run's speedups fall from another's on one processor beyond their own
    intervals: a relative 95% half-width per run, pooled (``halfwidth``), per backend
    (``by_backend``), per token count (``by_tokens``) and per backend and token count
    (``by_backend_tokens``) where measured; ``source`` says where and how it was measured.
    By token count because the drift differs there: two default sweeps of one commit on a
    2-vCPU Zen 4 VM left 2 of 88 pairs of 256-token rows beyond their own intervals and 12-18
    of 88 at 1-32 tokens."""

    halfwidth: float
    by_backend: dict[str, float] = field(default_factory=dict)
    source: str = ""
    by_tokens: dict[int, float] = field(default_factory=dict)
    by_backend_tokens: dict[str, dict[int, float]] = field(default_factory=dict)

    def for_backend(self, backend: str) -> float:
        return self.by_backend.get(backend, self.halfwidth)

    def for_row(self, backend: str, tokens: int | None = None) -> float:
        """The spread for a row: of its backend at its token count, else of its token count,
        else of its backend, else pooled (the most specific one measured)."""
        if isinstance(tokens, numbers.Real) and math.isfinite(tokens):
            tokens = int(tokens)
            own = self.by_backend_tokens.get(backend, {})
            if tokens in own:
                return own[tokens]
            if tokens in self.by_tokens:
                return self.by_tokens[tokens]
        return self.for_backend(backend)

    def describe(self) -> str:
        parts = ", ".join(f"{b} +-{v:.1%}" for b, v in sorted(self.by_backend.items()))
        each = f" ({parts})" if parts else ""
        if self.by_tokens:
            at = ", ".join(f"{t} +-{v:.1%}" for t, v in sorted(self.by_tokens.items()))
            each += f"; by token count {at}"
        return f"+-{self.halfwidth:.1%} per run{each}"


def _positive(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v > 0


def _number(v) -> float | None:
    return float(v) if _positive(v) else None


def speedup_of(row: dict) -> float | None:
    """The row's speedup: its paired median ratio when stored, else baseline_ms / median_ms."""
    stored = _number(row.get("speedup"))
    if stored is not None and row.get("paired"):
        return stored
    base, med = _number(row.get("baseline_ms")), _number(row.get("median_ms"))
    return base / med if base is not None and med is not None else None


def _spread(row: dict | None, field: str = "rel_spread") -> float | None:
    if row is None or row.get("status") != "ok" or row.get(field) is None:
        return None
    value = row[field]
    if isinstance(value, float) and math.isnan(value):
        return None
    if (row.get("samples") or 0) < MIN_SPREAD_SAMPLES:
        return None
    return value / math.sqrt(max(1, int(row.get("rounds") or 1)))


def row_noise(row: dict, baseline: dict | None, via_speedup: bool) -> list[float | None]:
    """The relative uncertainties that make up one run's noise on the compared metric."""
    if via_speedup and row.get("paired"):
        lo, hi = _number(row.get("speedup_lo")), _number(row.get("speedup_hi"))
        if lo is not None and hi is not None:
            return [rel_halfwidth(speedup_of(row), lo, hi)]
        return [_spread(row, "paired_rel_spread")]
    if not via_speedup or baseline is None or baseline is row:
        return [_spread(row)]
    return [_spread(row), _spread(baseline)]


def speed_verdict(
    base: dict,
    new: dict,
    tol: float,
    base_baseline: dict | None = None,
    new_baseline: dict | None = None,
    between: float = 0.0,
) -> SpeedCall:
    """Verdict of ``new`` against ``base`` (two ok rows of one key); ``*_baseline``: the 16-bit
    baseline row of each run's cell, whose spread enters an unpaired speedup's noise;
    ``between``: the processor's spread between runs (a relative 95% half-width per run,
    :class:`RunSpread`), added to each run's noise on a speedup (it was measured on speedups,
    not on raw times)."""
    notes = []
    sb, sn = speedup_of(base), speedup_of(new)
    via_speedup = sb is not None and sn is not None
    if via_speedup:
        metric, bv, nv, change = "speedup", sb, sn, sb / sn - 1.0
    elif _positive(base.get("median_ms")) and _positive(new.get("median_ms")):
        bv, nv = float(base["median_ms"]), float(new["median_ms"])
        metric, change = "median_ms", nv / bv - 1.0
        notes.append("no 16-bit baseline speedup: compared raw median_ms (machine speed included)")
    else:
        return SpeedCall("unknown", detail="no timing to compare")
    spreads = row_noise(base, base_baseline, via_speedup) + row_noise(
        new, new_baseline, via_speedup
    )
    drift = [between, between] if via_speedup and between > 0 else []
    noise = math.sqrt(sum((s or 0.0) ** 2 for s in spreads + drift))
    band = max(tol, noise)
    speed_gain = 1.0 / (1.0 + change) - 1.0  # relative growth of speed
    verdict = "slower" if change > band else "faster" if speed_gain > band else "same"
    unmeasured = sum(s is None for s in spreads)
    if unmeasured and verdict != "same":
        notes.append(
            f"{verdict} beyond the tolerance, but {unmeasured} of {len(spreads)} spreads were "
            f"not measured (< {MIN_SPREAD_SAMPLES} samples or no row): noise cannot be ruled out"
        )
        verdict = "unknown"
    return SpeedCall(verdict, metric, bv, nv, change, noise, band, "; ".join(notes), unmeasured)


def link_readings(rows: Iterable[dict]) -> tuple[list[float], list[float | None]]:
    """The bus and link readings of the calls of ``rows`` that have a link reading, aligned."""
    return call_readings(((r.get("bus_gbps"), r.get("link_ns")) for r in rows), links_only=True)


def joint_split(base_rows: Iterable[dict], new_rows: Iterable[dict]) -> BusSplit | None:
    """The split of two runs' calls into the host's placements of the threads, from the link
    readings of both runs' rows (``None``: either run has none, or they show one placement)."""
    (b_bus, b_links), (n_bus, n_links) = link_readings(base_rows), link_readings(new_rows)
    if not b_links or not n_links:
        return None
    split = bus_split(b_bus + n_bus, b_links + n_links)
    return split if split is not None and split.link_threshold_ns is not None else None


def _by_state(row: dict, split: BusSplit) -> dict[str, dict]:
    """The row's speedup in each placement it has an interval in, as a row to judge."""
    raw = row.get("raw_ms")
    if not row.get("paired") or not isinstance(raw, list | tuple) or not raw:
        return {}
    links = row.get("link_ns")
    states = state_speedups(
        raw,
        row.get("baseline_raw_ms") or [],
        row.get("bus_gbps") or [],
        split,
        links if isinstance(links, list | tuple) else None,
        row.get("round_samples"),
    )
    return {
        state: {
            "status": "ok",
            "paired": True,
            "speedup": s.speedup,
            "speedup_lo": s.lo,
            "speedup_hi": s.hi,
        }
        for state, s in states.items()
        if s.lo is not None and s.hi is not None
    }


def placement_verdict(
    call: SpeedCall,
    base: dict,
    new: dict,
    split: BusSplit | None,
    tol: float,
    between: float = 0.0,
) -> SpeedCall:
    """``call`` (the pooled verdict of ``base`` against ``new``), judged again in each
    placement of the threads both rows have an interval in when it is slower or faster: the
    same in every one of them, ``same``; slower in some and faster in none, ``slower`` (and the
    other way round, ``faster``); slower in one and faster in another, the pooled verdict. The
    detail keeps the pooled call and gives each placement's."""
    if split is None or call.verdict not in ("slower", "faster"):
        return call
    near, far = split.near_far_states
    names = {near: "with the threads close together", far: "apart"}
    b, n = _by_state(base, split), _by_state(new, split)
    calls = {
        st: speed_verdict(b[st], n[st], tol, between=between)
        for st in (near, far)
        if st in b and st in n
    }
    if not calls:
        return call
    told = "; ".join(
        f"{names[st]} {c.base_value:.3g}x -> {c.new_value:.3g}x ({c.verdict})"
        for st, c in calls.items()
    )
    verdicts = {c.verdict for c in calls.values()}
    if verdicts == {"same"}:
        verdict = "same"
    elif "slower" in verdicts and "faster" not in verdicts and "unknown" not in verdicts:
        verdict = "slower"
    elif "faster" in verdicts and "slower" not in verdicts and "unknown" not in verdicts:
        verdict = "faster"
    else:
        verdict = call.verdict
    detail = f"{call.verdict} pooled ({call.change:+.1%}); in each placement both runs met: {told}"
    return replace(
        call, verdict=verdict, detail=f"{call.detail}; {detail}" if call.detail else detail
    )


def _rounds(row: dict) -> int:
    value = row.get("rounds")
    return int(value) if isinstance(value, int | float) and value == value and value >= 1 else 1


def most_rounds(rows: Iterable[dict]) -> int:
    """The most rounds any of a run's ``rows`` was pooled from (1 without any)."""
    return max(map(_rounds, rows), default=1)


def one_round_of_several(row: dict, most: int) -> bool:
    """Whether ``row`` was pooled from one round while its run has rows of ``most`` rounds
    (``fp32`` where its call is long: timed in the first round only): its interval covers that
    round's seconds only."""
    return _rounds(row) == 1 < most


def one_round_verdict(
    call: SpeedCall, base: dict, new: dict, base_rounds: int, new_rounds: int
) -> SpeedCall:
    """``call``, made ``unknown`` when it is slower or faster and either row was pooled from one
    round while its run has rows of several (``base_rounds``, ``new_rounds``: the most rounds
    of any row of each run; fp32 where its call is long is timed in the first round only): that
    row's interval covers one round's seconds, not the drift between rounds that the others
    include. Two D.1 runs of one commit on a 2-vCPU Xeon VM read torch ``fp32`` at 2.7B
    0.2015x and 0.1619x, one round each, "slower" beyond a +-10% band. Runs of one round each
    (``--quick``) keep their verdicts."""
    if call.verdict not in ("slower", "faster"):
        return call
    sides = ((base, base_rounds), (new, new_rounds))
    if not any(one_round_of_several(row, most) for row, most in sides):
        return call
    why = (
        f"{call.verdict} beyond its band, but measured in one round of a run of several (fp32 "
        "is timed in the first round only where its call is long): its interval covers that "
        "round's seconds, not the drift between rounds or runs"
    )
    return replace(call, verdict="unknown", detail=f"{call.detail}; {why}" if call.detail else why)


def judge(
    base: dict,
    new: dict,
    tol: float,
    split: BusSplit | None,
    rounds: tuple[int, int],
    backend: str,
    between: RunSpread | None = None,
    baselines: tuple[dict | None, dict | None] = (None, None),
    tokens: int | None = None,
) -> tuple[SpeedCall, bool]:
    """The verdict ``compare`` and the HTML A/B report give a row of ``backend``:
    :func:`speed_verdict` pooled (each run's noise widened by ``between`` for that backend
    and ``tokens``;
    ``baselines``: each run's 16-bit baseline row of the cell), judged again in each placement
    (:func:`placement_verdict`, with ``split``), then the one-round rule
    (:func:`one_round_verdict`, ``rounds``: the most rounds of any row of each run). Returns
    the call and whether the placements changed the pooled verdict."""
    drift = between.for_row(backend, tokens) if between is not None else 0.0
    pooled = speed_verdict(base, new, tol, *baselines, drift)
    placed = placement_verdict(pooled, base, new, split, tol, drift)
    return one_round_verdict(placed, base, new, *rounds), placed.verdict != pooled.verdict
