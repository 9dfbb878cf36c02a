"""The view every reader of a run shares: rows pooled over rounds, with intervals and checks.

``results.jsonl`` holds one row per (key, round) as measured; tables, reports and the CI gate
read one row per key: :func:`pooled_view` pools the rounds
(:func:`kernelbench.results.merge.pool_rows`) and runs the physics checks
(:mod:`kernelbench.results.physics`) with the run's peaks and ``ci_target``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from kernelbench.core import BASELINE, PAPER_TOKENS
from kernelbench.results.merge import pool_rows
from kernelbench.results.physics import ROOFLINE_MARGIN, annotate, cache_levels, peaks
from kernelbench.results.schema import (
    EXTRA_KEY,
    LEFT_OUT_KEY,
    ResultRow,
    SchemaError,
    env_seconds,
    load_env,
    read_rows,
    results_path,
)
from kernelbench.results.states import (
    LINK_MIN_SEPARATION,
    MIN_SEPARATION,
    MIN_SHARE,
    STATES,
    BusSplit,
    StateSpeedup,
    bus_split,
    call_readings,
    core_split,
    state_speedups,
)
from kernelbench.settings import default, recorded
from kernelbench.statistics import rel_halfwidth, round_slices

_EXCEPTION = re.compile(r"\b\w*(Error|Exception)\b")
_PATH = re.compile(r"(?<![\w.])/(?:[^\s/'\"]+/)+([^\s/'\"]+)")


def short_reason(reason: str) -> str:
    """``reason`` for a terminal line: parenthesised exception texts and paths dropped, other
    paths cut to their file name, repeated clauses once (the full text stays in ``env.json``
    and ``kernelbench list -v``)."""
    kept, depth, group = [], 0, []
    for ch in reason:
        if ch == "(":
            depth += 1
        if depth:
            group.append(ch)
        else:
            kept.append(ch)
        if ch == ")" and depth:
            depth -= 1
            if not depth:
                text = "".join(group)
                if not (_EXCEPTION.search(text) or "/" in text):
                    kept.append(text)
                group = []
    out = _PATH.sub(r"\1", "".join(kept) + "".join(group))
    out = re.sub(r"\s+", " ", out).replace(" ;", ";").replace(" ,", ",").strip()
    return "; ".join(dict.fromkeys(c.strip() for c in out.split(";") if c.strip()))


def ci_target(env: dict) -> float:
    """The run's interval target (the declared default for a run that recorded none)."""
    value = recorded(env, "ci_target")
    valid = isinstance(value, (int, float)) and value > 0
    return float(value) if valid else float(default("ci_target"))


def pooled_rows(rows: list[dict], env: dict) -> list[ResultRow]:
    """One annotated row per key."""
    pooled = pool_rows(rows)
    for dclass in {r.device_class for r in pooled}:
        of_class = [r for r in pooled if r.device_class == dclass]
        reused = bool(env.get("cpu_memory_while_timing"))
        annotate(of_class, peaks(env, dclass), ci_target(env), reused, cache_levels(env))
    return pooled + block_rows(pooled)


def pooled_view(rows: list[dict], env: dict) -> pd.DataFrame:
    """:func:`pooled_rows` as a DataFrame; ``attrs["ci_target"]`` is the run's interval
    target, ``attrs["load"]`` the load it ran under (env.json's, when recorded),
    ``attrs["core_wait_s"]`` how long it waited at most for fast cores before a call,
    ``attrs["peak_reread"]`` the bandwidth read again by placement at its end (when it was),
    ``attrs["environment"]`` the variables set that change what is measured (when recorded)."""
    df = pd.DataFrame([dataclasses.asdict(r) for r in pooled_rows(rows, env)])
    df.attrs["ci_target"] = ci_target(env)
    df.attrs["load"] = env.get("load")
    df.attrs["peak_reread"] = env.get("peak_reread")
    df.attrs["environment"] = env.get("environment")
    df.attrs["extra"] = {
        "seconds": env.get(EXTRA_KEY),
        "per_round_s": env.get("extra_round_budget_s"),
        "left_out": env.get(LEFT_OUT_KEY),
    }
    timer = env.get("timer")
    df.attrs["core_wait_s"] = timer.get("core_wait_s") if isinstance(timer, dict) else None
    return df


def load_view(run_dir: str | Path) -> pd.DataFrame:
    """A run directory (or its results.jsonl) as its pooled, annotated view."""
    results = results_path(run_dir)
    rows = read_rows(results)
    if not rows:
        raise SchemaError(f"{results}: no result rows")
    return pooled_view(rows, load_env(results.parent))


def _weighted(values: list[float], weights: list[float]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True))


def block_rows(rows: list[ResultRow]) -> list[ResultRow]:
    """Per (size, tokens, backend, method): one row ``layer="block"`` summing one transformer
    block's linears, when the run measured several layers of that size and the method ran on
    all of them (the kernel-level counterpart of App. D.2's per-token latency).

    Its speedup is the summed baseline time over the summed time, i.e. the time-weighted mean
    of the layers' speedups; its interval weighs the layers' interval ends the same way (a
    conservative bound: it assumes the layers' errors move together)."""
    cells: dict[tuple, list[ResultRow]] = {}
    layers: dict[tuple, set[str]] = {}
    for r in rows:
        cell = (r.device_class, r.case, r.d_model, r.tokens)
        layers.setdefault(cell, set()).add(r.layer)
        cells.setdefault((*cell, r.backend, r.method), []).append(r)
    out = []
    for (*cell, _backend, _method), group in cells.items():
        names = layers[tuple(cell)]
        if len(names) < 2 or len(group) != len(names) or any(r.status != "ok" for r in group):
            continue
        times = [r.median_ms for r in group]
        total = sum(times)
        weights = [t / total for t in times]
        row = dataclasses.replace(group[0], layer="block", k=0, n=0, raw_ms=[], baseline_raw_ms=[])
        row.median_ms, row.samples = total, min(r.samples for r in group)
        row.flops = sum(r.flops or 0.0 for r in group)
        row.bytes = sum(r.bytes or 0.0 for r in group)
        row.tops = row.flops / (total / 1e3) / 1e12 if row.flops else None
        row.paired = all(r.paired for r in group)
        row.reason = "sum of layers " + ", ".join(r.layer for r in group)
        row.rel_error = max((r.rel_error for r in group if r.rel_error is not None), default=None)
        row.iqr_ms = row.rel_spread = row.roofline_tops = row.roofline_share = None
        row.bus_roofline_share, row.bus_gbps = None, []
        row.stages_ms, row.paper_speedup = {}, None
        speedups = [r.speedup for r in group]
        if all(s is not None for s in speedups):
            row.speedup = _weighted(speedups, weights)
            row.baseline_ms = total * row.speedup
            lows, highs = [r.speedup_lo for r in group], [r.speedup_hi for r in group]
            if all(v is not None for v in lows + highs):
                row.speedup_lo = _weighted(lows, weights)
                row.speedup_hi = _weighted(highs, weights)
        row.suspect = any(r.suspect for r in group)
        row.suspect_reason = "; ".join(f"{r.layer}: {r.suspect_reason}" for r in group if r.suspect)
        row.ci_wide = any(r.ci_wide for r in group)
        out.append(row)
    return out


def slow_sixteen_bit_note(df: pd.DataFrame) -> str | None:
    """A warning when fp32 beat the 16-bit baseline (beyond its interval) in some cell: the
    16-bit GEMM is emulated or unoptimised there (torch's bf16 on CPUs without native bf16),
    and every speedup over 16-bit overstates what int8 gains over the fastest float path."""
    if "speedup" not in df or "method" not in df:
        return None
    fp32 = df[(df["method"] == "fp32") & (df["status"] == "ok")]
    low = fp32["speedup_lo"] if "speedup_lo" in fp32 else fp32["speedup"]
    faster = fp32[low.fillna(fp32["speedup"]) > 1.0]
    if not len(faster):
        return None
    lo, hi = (f"{v:.2g}" for v in faster["speedup"].astype(float).agg(["min", "max"]))
    return (
        f"fp32 ran {lo if lo == hi else f'{lo}-{hi}'}x faster than the 16-bit baseline in "
        f"{len(faster)} of {len(fp32)} cells: the 16-bit GEMM is emulated or unoptimised here, "
        "so speedups over 16-bit overstate int8's gain over the fastest float path (compare "
        "with the fp32 row)."
    )


def peak_exceeded_note(df: pd.DataFrame) -> str | None:
    """A warning when some rows ran faster at their median than their roofline allows, yet
    are not ``suspect`` (their intervals reach below it, or the bus gave their calls that
    bandwidth just before them: :func:`~kernelbench.results.physics.check_roofline`): a cached
    peak read in a slower moment of the machine than those calls (a shared VM's memory bus
    moves by 2x over minutes), of which every share of the roofline in the run is a share."""
    if "roofline_share" not in df:
        return None
    ok = df[(df["status"] == "ok") & (df["layer"] != "block")] if "layer" in df else df
    share = ok["roofline_share"].astype(float)
    suspect = marked(ok, "suspect")
    over = ok[(share > 1 + ROOFLINE_MARGIN) & ~suspect]
    if not len(over):
        return None
    top = over.loc[over["roofline_share"].astype(float).idxmax()]
    return (
        f"{len(over)} row(s) ran faster at their median than the cached peaks allow (up to "
        f"{float(top['roofline_share']):.0%} of the roofline: {top['backend']} {top['method']}, "
        f"d={top['d_model']}, tokens={top['tokens']}); their intervals reach below it, or the "
        "bus gave their calls that bandwidth just before them, so they are not flagged, but a "
        "peak was read in a slower moment of this machine than those calls, and the run's "
        "shares of the roofline are shares of that lower peak: "
        "`kernelbench peak --remeasure` in a quiet moment keeps the higher reading."
    )


#: A sample this many times its row's median is a slow call, whose usage is worth a look.
SLOW_FACTOR = 1.25


def flagged(df: pd.DataFrame, kind: str) -> pd.Series:
    """Whether each row carries a physics flag of ``kind`` (``physics.ORDERING``,
    ``physics.ABOVE_ROOFLINE``): its ``suspect_reason`` names it."""
    if "suspect_reason" not in df:
        return pd.Series(False, index=df.index)
    return df["suspect_reason"].fillna("").str.contains(kind, regex=False)


def marked(df: pd.DataFrame, column: str) -> pd.Series:
    """Which rows have the boolean ``column`` set (``ci_wide``, ``suspect``, ``above_peak``...):
    a missing value, or a view without the column (an older run), reads as not set."""
    if column not in df:
        return pd.Series(False, index=df.index)
    return df[column].fillna(False).astype(bool)


def is_baseline(df: pd.DataFrame) -> pd.Series:
    """Which rows are the 16-bit baseline's (a boolean mask on ``df``'s index; an empty
    frame keeps its columns when masked with it, as a list mask would not)."""
    backend, method = BASELINE
    return (df["backend"] == backend) & (df["method"] == method)


def _speedup_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The measured speedups of a view: ok rows with a speedup, the 16-bit baseline itself and
    per-block sums left out."""
    if not len(df) or not {"status", "speedup", "backend", "method"} <= set(df.columns):
        return df.iloc[0:0]
    rows = df[(df["status"] == "ok") & df["speedup"].notna()]
    if "layer" in rows:
        rows = rows[rows["layer"] != "block"]
    return rows[~is_baseline(rows)]


def rel_halfwidths(rows: pd.DataFrame) -> pd.Series:
    """Each row's 95% speedup interval, half its width relative to the speedup (NaN without
    an interval): :func:`kernelbench.statistics.rel_halfwidth` over a frame."""
    return (rows["speedup_hi"] - rows["speedup_lo"]) / 2 / rows["speedup"]


@dataclasses.dataclass(frozen=True)
class StateView:
    """A view's speedups split by the memory bus's state (:mod:`kernelbench.results.states`):
    how many bus readings its paired rows hold, their split (``None``: no two states), and each
    paired row's speedups by state, keyed by the view's index."""

    readings: int
    split: BusSplit | None
    by_row: dict[object, dict[str, StateSpeedup]]


def state_view(df: pd.DataFrame, only: Iterable[object] | None = None) -> StateView:
    """:class:`StateView` of the paired speedup rows of ``df``: the split and each row's
    per-state speedups computed once (with ``only``, those of the rows of these index labels:
    the split still from every row's readings)."""
    rows = _speedup_rows(df)
    if "paired" not in rows or "bus_gbps" not in rows:
        return StateView(0, None, {})
    rows = rows[marked(rows, "paired")]
    has_links = "link_ns" in rows
    row_links = rows["link_ns"] if has_links else [None] * len(rows)
    readings, links = call_readings(zip(rows["bus_gbps"], row_links, strict=True))
    split = bus_split(readings, links)
    if split is None:
        return StateView(len(readings), None, {})
    wanted = None if only is None else set(only)
    by_row = {
        idx: state_speedups(
            r["raw_ms"],
            r["baseline_raw_ms"],
            r["bus_gbps"],
            split,
            r["link_ns"] if has_links else None,
            r.get("round_samples"),
        )
        for idx, r in rows.iterrows()
        if wanted is None or idx in wanted
    }
    return StateView(len(readings), split, by_row)


def state_roofline_share(row: pd.Series | dict, state: StateSpeedup | None) -> float | None:
    """The row's share of its roofline over its calls in one bus state (its pooled share scaled
    by its pooled median over that state's median call); ``None`` where either is unknown."""
    share, median = row.get("roofline_share"), row.get("median_ms")
    if state is None or state.median_ms is None or state.median_ms <= 0:
        return None
    if share is None or median is None or pd.isna(share) or pd.isna(median):
        return None
    return float(share) * float(median) / state.median_ms


def state_roofline_shares(
    row: pd.Series | dict, by_state: dict[str, StateSpeedup]
) -> list[float | None]:
    """:func:`state_roofline_share` in each state, in :data:`STATES` order."""
    return [state_roofline_share(row, by_state.get(state)) for state in STATES]


def state_shares_text(
    row: pd.Series | dict, by_state: dict[str, StateSpeedup], missing: str
) -> str:
    """The row's shares of its roofline in each state as ``slow | fast`` percentages,
    ``missing`` where a state has none."""
    shares = state_roofline_shares(row, by_state)
    return " | ".join(missing if v is None else f"{v:.0%}" for v in shares)


def state_precision(
    by_row: Iterable[dict[str, StateSpeedup]], target: float
) -> dict[str, tuple[int, int, float]]:
    """Per state: (speedups within ``target``, speedups with two pairs or more in that
    state, median relative half-width)."""
    widths: dict[str, list[float]] = {state: [] for state in STATES}
    for by_state in by_row:
        for state, s in by_state.items():
            if s.pairs >= 2:
                widths[state].append(rel_halfwidth(s.speedup, s.lo, s.hi))
    return {
        state: (sum(w <= target for w in ws), len(ws), statistics.median(ws) if ws else math.nan)
        for state, ws in widths.items()
    }


def state_split_text(states: StateView) -> str:
    """One sentence: how the view's bus readings split into two states, or that they do not."""
    split = states.split
    if split is None:
        return (
            f"No two states in this run's {states.readings} calls (cold CPU calls record the "
            "round trip of a cache line between two threads and the bus's rate before them: "
            f"link readings in two groups {LINK_MIN_SEPARATION:g}x apart, or, without them, bus "
            f"readings in two groups {MIN_SEPARATION}x apart, each with {MIN_SHARE:.0%} of the "
            "readings): the pooled tables stand as they are."
        )
    if split.link_threshold_ns is not None:
        near, far = split.near_far_states
        return (
            f"Bus states: {states.readings} calls, each with the round trip of a cache line "
            f"between two threads read before it: under {split.link_threshold_ns:.0f} ns "
            f"(median {split.near_ns:.0f}: the threads close together) the {near} state, "
            f"above it (median {split.far_ns:.0f}: apart) the {far} one; the bus read a "
            f"median {split.slow_gbps:.0f} GB/s in the slow state ({split.slow_share:.0%} of "
            f"the calls) and {split.fast_gbps:.0f} in the fast. Each pair goes to the state "
            "its call's link reading puts it in."
        )
    return (
        f"Bus states: {states.readings} readings before the calls; under "
        f"{split.threshold_gbps:.0f} GB/s the slow state ({split.slow_share:.0%} of them, "
        f"median {split.slow_gbps:.0f} GB/s), above it the fast one (median "
        f"{split.fast_gbps:.0f} GB/s). Each pair goes to the state its call's reading puts "
        "it in; a pair near the threshold can belong to either."
    )


def state_precision_lines(states: StateView, target: float) -> list[str]:
    """Per state, one line: its speedups within ``target`` and their median half-width."""
    return [
        f"Precision in the {state} state: {within} of {total} speedups within "
        f"±{target:.0%}, median half-width {median:.1%}."
        for state, (within, total, median) in state_precision(
            states.by_row.values(), target
        ).items()
    ]


def _precision(rows: pd.DataFrame) -> tuple[int, pd.Series]:
    """Of measured speedups: how many are within the run's target (not flagged ``ci_wide``),
    and the relative half-widths of those with an interval."""
    wide = int(marked(rows, "ci_wide").sum())
    if {"speedup_lo", "speedup_hi"} <= set(rows.columns):
        widths = rel_halfwidths(rows).dropna()
    else:
        widths = pd.Series(dtype=float)
    return len(rows) - wide, widths


def precision_line(df: pd.DataFrame, target: float | None = None) -> str:
    """One line: how many measured speedups have a 95% interval within the run's target, of
    all, and the median relative half-width. Empty without a measured speedup."""
    rows = _speedup_rows(df)
    if not len(rows):
        return ""
    within, widths = _precision(rows)
    target_text = f"±{target:.0%}" if target else "the run's target"
    median = f"median half-width {widths.median():.1%}" if len(widths) else "no intervals"
    return (
        f"precision: {within} of {len(rows)} speedups within {target_text} (95% interval), {median}"
    )


#: A token count whose median half-width is beyond this many times the target gets a hint.
WITHIN_REACH_NOTE = 2.0


def precision_by_tokens_line(df: pd.DataFrame, target: float) -> str:
    """One line when the speedups span several token counts: for each, how many are within
    ``target`` and their median half-width. A sweep spends its rounds alike on every cell and
    a long cell gets no more of them, so its precision differs by token count (a default
    sweep on a 2-vCPU Xeon VM: 4 of 48 int8 rows within +-5% at 2048 tokens, median 26%, and
    27-38 of 48 at 1-256 tokens, 4.1-4.7%); empty with one token count."""
    rows = _speedup_rows(df)
    if not len(rows) or "tokens" not in rows or rows["tokens"].nunique() < 2:
        return ""
    parts, medians = [], {}
    for tokens, at in rows.groupby("tokens"):
        within, widths = _precision(at)
        median = f" ({widths.median():.1%})" if len(widths) else ""
        if len(widths):
            medians[int(tokens)] = float(widths.median())
        parts.append(f"{tokens} token{'s' if tokens != 1 else ''}: {within} of {len(at)}{median}")
    line = (
        f"Precision by token count (speedups within ±{target:.0%}, median half-width): "
        + "; ".join(parts)
        + "."
    )
    widest = max(medians, key=medians.__getitem__, default=None)
    if widest is not None and medians[widest] > WITHIN_REACH_NOTE * target:
        line += (
            f" The widest, at {widest} tokens, narrow with more rounds: a run of those alone "
            f"(--tokens {widest}) spends all its rounds there."
        )
    return line


def few_rounds_note(df: pd.DataFrame) -> str:
    """A note when the run's speedup intervals rest on one or two rounds each. Every one on
    one round (``--quick``, ``--rounds 1``): such an interval covers the scatter within that
    round's seconds, not the drift between rounds or runs, which on a shared host is larger
    (docs/benchmarks.md). Some on two (a quick run's extra round): Student's t of two round
    medians has one degree of freedom (quantile 12.7): two rounds 13% apart give about +-90%."""
    rows = _speedup_rows(df)
    if "rounds" not in rows or "speedup_lo" not in rows:
        return ""
    rows = rows[rows["speedup_lo"].notna()]
    rounds = rows["rounds"].fillna(1)
    if not len(rows) or rounds.max() > 2:
        return ""
    pool = (
        "pool rounds (--rounds 3 or more, or kernelbench merge of several runs) before reading "
        "a difference of a few percent."
    )
    if rounds.max() <= 1:
        return (
            "Each interval comes from one round: it covers the scatter within that round, not "
            f"the drift between rounds or runs; {pool}"
        )
    two, one = int((rounds == 2).sum()), int((rounds <= 1).sum())
    return (
        f"{two} of {len(rows)} intervals rest on two rounds: Student's t of two round "
        "medians, one degree of freedom, is wide whenever the two differ at all; "
        + (f"the other {one} on one round cover the scatter within it only; " if one else "")
        + pool
    )


def slow_calls(row: pd.Series | dict) -> dict:
    """What the row's slow calls (above :data:`SLOW_FACTOR` x its median) saw: how many there
    are, how many of them faulted pages or were preempted, the most faults one call took, and
    the steal share while its cell was timed."""
    raw = list(row.get("raw_ms") or [])
    minor = list(row.get("minor_faults") or [])
    major = list(row.get("major_faults") or [])
    invol = list(row.get("invol_switches") or [])
    median = float(pd.Series(raw).median()) if raw else 0.0
    slow = [i for i, ms in enumerate(raw) if median and ms > SLOW_FACTOR * median]
    aligned = len(minor) == len(raw) and len(major) == len(raw)
    faults = [minor[i] + major[i] for i in range(len(raw))] if aligned else []
    steal = row.get("steal_share")
    return {
        "samples": len(raw),
        "slow": len(slow),
        "slow_faulted": sum(1 for i in slow if faults and faults[i] > 0),
        "slow_preempted": sum(1 for i in slow if len(invol) == len(raw) and invol[i] > 0),
        "max_faults": max(faults) if faults else None,
        "steal_share": None if steal is None or steal != steal else float(steal),
    }


@dataclasses.dataclass(frozen=True)
class RoundMedians:
    """A paired pooled row's medians in each of its rounds, in order: its speedup, its own
    time and its 16-bit baseline's time (ms), the bus bandwidth read just before its calls
    (GB/s; empty when its calls read none: hot caches, CUDA), the threads' link and the cores'
    probe (ns). Rounds that disagree while each is tight say the machine moved between them,
    which call moved more, and whether the bus, the threads' placement or the cores' speed did."""

    speedups: list[float]
    row_ms: list[float]
    baseline_ms: list[float]
    bus_gbps: list[float] = dataclasses.field(default_factory=list)
    #: the median round trip (ns) between two threads before the row's calls (where they ran)
    link_ns: list[float] = dataclasses.field(default_factory=list)
    #: the median core probe (ns) before the row's calls (how fast the cores ran)
    core_ns: list[float] = dataclasses.field(default_factory=list)

    @staticmethod
    def moved(values: list[float]) -> float | None:
        """The largest over the smallest (``None`` with fewer than two rounds)."""
        return max(values) / min(values) if len(values) > 1 and min(values) > 0 else None


def per_call(row: pd.Series | dict, name: str) -> list:
    """The row's per-call list ``name`` (a reading or a wait before each timed call), when it
    has one entry for each of the row's calls (``raw_ms``); else empty."""
    values, raw = row.get(name), row.get("raw_ms")
    if not isinstance(values, list | tuple) or not isinstance(raw, list | tuple):
        return []
    return list(values) if len(values) == len(raw) else []


def run_calls(df: pd.DataFrame, name: str) -> list:
    """Every row's per-call list ``name`` (:func:`per_call`) one after another: the run's
    readings or waits, one per timed call; empty without that column."""
    if not len(df) or name not in df:
        return []
    return [v for _, row in df.iterrows() for v in per_call(row, name)]


def by_round(row: pd.Series | dict) -> RoundMedians:
    """:class:`RoundMedians` of a pooled row; empty when the row is unpaired or its rounds are
    not known (a row as written, an older pooled one)."""
    sizes = list(row.get("round_samples") or [])
    raw = list(row.get("raw_ms") or [])
    base = list(row.get("baseline_raw_ms") or [])
    bus, link, core = (per_call(row, name) for name in ("bus_gbps", "link_ns", "core_ns"))
    out = RoundMedians([], [], [])
    slices = round_slices(sizes, len(raw))
    if slices is None or len(base) != len(raw):
        return out
    for calls in slices:
        times, bases = raw[calls], base[calls]
        ratios = [b / t for b, t in zip(bases, times, strict=True) if t > 0]
        if ratios:
            out.speedups.append(float(pd.Series(ratios).median()))
            out.row_ms.append(float(pd.Series(times).median()))
            out.baseline_ms.append(float(pd.Series(bases).median()))
            if bus:
                out.bus_gbps.append(float(pd.Series(bus[calls]).median()))
            if link:
                out.link_ns.append(float(pd.Series(link[calls]).median()))
            if core:
                out.core_ns.append(float(pd.Series(core[calls]).median()))
    return out


def headline_cell(df: pd.DataFrame) -> tuple[str, str, int] | None:
    """(device class, layer, tokens) of the cell a run is read by first: the first device
    class and layer (a block's sum when measured), at 2048 tokens (the paper's) when measured,
    else the most tokens; ``None`` without a measured row."""
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:
        return None
    dclass = sorted(ok["device_class"].unique())[0]
    ok = ok[ok["device_class"] == dclass]
    layers = sorted(ok["layer"].unique())
    layer = "block" if "block" in layers else layers[0]
    tokens = sorted(ok[ok["layer"] == layer]["tokens"].unique())
    return dclass, layer, PAPER_TOKENS if PAPER_TOKENS in tokens else int(tokens[-1])


def _speedup_with_interval(row) -> str:
    lo, hi = row.get("speedup_lo"), row.get("speedup_hi")
    text = f"{row['speedup']:.2f}x"
    if lo is not None and hi is not None and not (pd.isna(lo) or pd.isna(hi)):
        text += f" [{lo:.2f}, {hi:.2f}]"
    return text


def busy_note(load: dict) -> str:
    """What a run measured on a busy machine says first."""
    cores = [
        f"{name} {load[key]:.2f} cores"
        for key, name in (("other_cores", "other processes"), ("steal_cores", "stolen"))
        if load.get(key) is not None
    ]
    average = f" (on average over {load.get('seconds', 0) / 60:.0f} min: {', '.join(cores)})"
    return (
        f"The machine was busy while this run ran: {load.get('why') or 'busy'}"
        + (average if cores else "")
        + "; its times are of what was left of it."
    )


def environment_note(environment: dict | None) -> str:
    """One line naming the environment variables the run had set that change what is
    measured (env.json's ``environment``: threads, instruction sets, the allocator...)."""
    if not isinstance(environment, dict) or not environment:
        return ""
    settings = ", ".join(f"{name}={value}" for name, value in sorted(environment.items()))
    return f"Ran with these set, which change what is measured: {settings}."


def missed_placement_note(reread: dict | None) -> str:
    """One line when the run read the bandwidth again where its rows above their roofline
    had run (env.json's ``peak_reread``) and the host did not run the threads in one of those
    placements while it waited: the rows there are judged against that placement's cached
    figure. Empty when nothing was missed (or nothing read again)."""
    missed = [float(ns) for ns in (reread or {}).get("missed") or []]
    if not missed:
        return ""
    where = ", ".join(f"{ns:.0f} ns" for ns in missed)
    waited = float(reread.get("waited_s") or 0.0)
    return (
        "Rows stayed above their roofline after the peaks were measured again; the run waited "
        f"{waited:.0f} s for the host to run the threads where a cache line's round trip read "
        f"{where}, and it did not: rows there are judged against that placement's cached "
        "bandwidth (kernelbench peak --remeasure when the host runs them there)."
    )


def left_out_note(extra: dict | None) -> str:
    """One line when the run's extra rounds left cells out for their cost (env.json's
    ``extra_left_out``): which, each one's estimate against what its last round had left, and
    the extra rounds' seconds. Their uncertain rows keep the intervals of the rounds they had
    (a 175B cell at 2048 tokens can cost more than any extra round has on a 2-core CPU);
    empty when none was left out."""
    if not isinstance(extra, dict) or not isinstance(extra.get("left_out"), list):
        return ""
    cells = []
    for cell in extra["left_out"]:
        try:
            d_model, layer, tokens = int(cell["d_model"]), str(cell["layer"]), int(cell["tokens"])
            estimate, left = float(cell["estimate_s"]), float(cell["left_s"])
        except (KeyError, TypeError, ValueError):
            continue
        plural = "s" if tokens != 1 else ""
        cells.append(
            f"d={d_model} {layer} {tokens} token{plural} ({estimate:.0f} s estimated, "
            f"{left:.0f} s left of its round)"
        )
    if not cells:
        return ""
    line = f"Extra rounds left out for their cost: {'; '.join(cells)}"
    seconds, per_round = env_seconds(extra.get("seconds")), env_seconds(extra.get("per_round_s"))
    if seconds > 0 and per_round > 0:
        line += (
            f"; the extra rounds took {seconds:.0f} s, each its {per_round:.0f} s and what "
            "the earlier ones left"
        )
    return line + ": their uncertain rows keep the rounds they had."


def core_wait_note(df: pd.DataFrame) -> str:
    """One line when the run waited for fast cores before its timed calls
    (:class:`~kernelbench.measure.timing.CoreGate`): how often, how long in all, and how many
    waits ran out (those calls were taken on slow cores); empty when it never waited."""
    waits = [float(w) for w in run_calls(df, "core_wait_ms")]
    waited = [w for w in waits if w > 0]
    if not waited:
        return ""
    line = (
        f"Waited for the cores to run at their usual speed before {len(waited):,} of "
        f"{len(waits):,} timed calls ({sum(waited) / 1e3:.1f} s in all, outside the clock): "
        "they read slower at those moments (a host that shares them out, or other work)"
    )
    cap = df.attrs.get("core_wait_s")
    if cap:
        ran_out = sum(w >= cap * 1e3 for w in waited)
        line += f"; {ran_out} waits ran out at {cap:g} s" if ran_out else ""
    return line + "."


def core_state_note(df: pd.DataFrame) -> str:
    """One line when the run's core readings (cold CPU calls, ``core_ns``) fall in two groups:
    the share of the timed calls taken after a slow reading, and each group's median. The
    machine's load (other processes, steal) does not show a host that shares the cores out;
    these readings do, and speedups over 16-bit differ between the two (bf16 slows more).
    Empty with one group or no readings."""
    readings = [float(v) for v in run_calls(df, "core_ns") if v]
    split = core_split(readings)
    if split is None:
        return ""
    return (
        f"The cores read slow before {1 - split.fast_share:.0%} of the timed calls (a fixed "
        f"chain of steps took a median {split.slow_ns / 1e3:.1f} us there, "
        f"{split.fast_ns / 1e3:.1f} us before the others): other work on the cores, on this "
        "machine or the host's (the steal count misses a host that shares them out); speedups "
        "over 16-bit differ between the two, and a row with calls in both has an interval that "
        "covers the mix."
    )


def placement_note(df: pd.DataFrame) -> str:
    """One line when the run's link readings (cold CPU calls) fall in two states: how the
    timed calls divided between the threads close together (on AMD, one core complex) and
    apart, and where each state's speedups are; empty otherwise (one placement, or no link
    readings)."""
    if not len(df) or "link_ns" not in df or "bus_gbps" not in df:
        return ""
    bus, links = call_readings(zip(df["bus_gbps"], df["link_ns"], strict=True), links_only=True)
    split = bus_split(bus, links) if links else None
    if split is None or split.link_threshold_ns is None:
        return ""
    near_share = split.near_share
    near_gbps, far_gbps = split.near_far_gbps
    return (
        f"The host moved the threads during this run: {near_share:.0%} of the timed calls ran "
        f"with them close together (a cache line's round trip {split.near_ns:.0f} ns, the bus "
        f"{near_gbps:.0f} GB/s), {1 - near_share:.0%} apart "
        f"({split.far_ns:.0f} ns, {far_gbps:.0f} GB/s); speedups that depend on memory differ "
        "between the two, each on its own: kernelbench show --states."
    )


def placement_precision_line(
    df: pd.DataFrame, target: float, states: StateView | None = None
) -> str:
    """One line when the run's calls fall in two placements (link readings): the run's
    precision in each, every speedup from its pairs there alone (:func:`state_precision`);
    empty otherwise. ``states``: ``df``'s :func:`state_view` where the caller has it."""
    states = state_view(df) if states is None else states
    split = states.split
    if split is None or split.link_threshold_ns is None:
        return ""
    precision = state_precision(states.by_row.values(), target)
    near, far = split.near_far_states
    parts = [
        f"{where}: {within} of {total} speedups within ±{target:.0%}, median half-width "
        f"{median:.1%}"
        for where, (within, total, median) in (
            ("threads close together", precision[near]),
            ("apart", precision[far]),
        )
        if total
    ]
    if not parts:
        return ""
    return f"Precision by placement, each speedup from its pairs there: {'; '.join(parts)}."


def headline(df: pd.DataFrame, states: StateView | None = None) -> list[str]:
    """The run in two lines: the fastest backend/method over the 16-bit baseline at the
    smallest and the largest model size of :func:`headline_cell` (speedup with its 95%
    interval), then the run's precision (:func:`precision_line`; with several token counts,
    by token count: :func:`precision_by_tokens_line`), and when its intervals come
    from one or two rounds, :func:`few_rounds_note`; one naming the cells the extra rounds
    left out for their cost (:func:`left_out_note`); then, when the host moved
    the threads during the run, a line saying so (:func:`placement_note`) and one with the
    precision in each placement (:func:`placement_precision_line`); one when a placement the
    run's bandwidth was to be read again in never came (:func:`missed_placement_note`); one
    when the cores read slow before part of the calls (:func:`core_state_note`) and one when
    it waited for fast cores (:func:`core_wait_note`); one with the environment variables
    it ran with that change what is measured (:func:`environment_note`); and one when the
    machine was busy while it ran (:func:`busy_note`). ``states``: ``df``'s
    :func:`state_view` where the caller has it (the placement line's precision needs one)."""
    cell = headline_cell(df)
    if cell is None:
        return ["No row was measured."]
    dclass, layer, tokens = cell
    ok = df[(df["status"] == "ok") & (df["device_class"] == dclass)]
    ok = ok[(ok["layer"] == layer) & (ok["tokens"] == tokens)].dropna(subset=["speedup"])
    ok = ok[~is_baseline(ok)]
    if ok.empty:
        return [f"{dclass} · layer {layer} · {tokens} tokens: no speedup over 16-bit measured."]
    dims = sorted(ok["d_model"].unique())
    ends = []
    for d in dict.fromkeys((dims[0], dims[-1])):
        at = ok[ok["d_model"] == d]
        best = at.loc[at["speedup"].idxmax()]
        ends.append(f"d={d}: {best['backend']} {best['method']} {_speedup_with_interval(best)}")
    first = (
        f"Fastest over 16-bit ({dclass} · layer {layer} · {tokens} tokens): "
        + "; ".join(ends)
        + "."
    )
    target = df.attrs.get("ci_target") or default("ci_target")
    precision = precision_line(df, target)
    lines = [first, precision[:1].upper() + precision[1:] + "."] if precision else [first]
    if by_tokens := precision_by_tokens_line(df, target):
        lines.append(by_tokens)
    if rounds_note := few_rounds_note(df):
        lines.append(rounds_note)
    if left_out := left_out_note(df.attrs.get("extra")):
        lines.append(left_out)
    if placement := placement_note(df):
        lines.append(placement)
        if by_placement := placement_precision_line(df, target, states):
            lines.append(by_placement)
    if missed := missed_placement_note(df.attrs.get("peak_reread")):
        lines.append(missed)
    if cores := core_state_note(df):
        lines.append(cores)
    if waited := core_wait_note(df):
        lines.append(waited)
    if environment := environment_note(df.attrs.get("environment")):
        lines.append(environment)
    load = df.attrs.get("load")
    return [*lines, busy_note(load)] if isinstance(load, dict) and load.get("busy") else lines
