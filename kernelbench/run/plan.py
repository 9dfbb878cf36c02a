"""What a run will measure: its options, the work items (cells x rounds) of a case, the
(backend, method) pairs, the call-time estimates that skip hopeless rows, and the extra rounds
its uncertain rows get. Measuring one work item is :mod:`kernelbench.run.cell`'s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelbench.backends import all_backends
from kernelbench.core import ALL_METHODS, BASELINE, FP32, METHODS, work_flops
from kernelbench.measure.engine import TimerSettings
from kernelbench.quant import QuantConfig
from kernelbench.run.cases import Case, Size, load_activation_file
from kernelbench.settings import default, recorded
from kernelbench.statistics import rel_halfwidth, rounds_to_narrow

#: The baselines may take this many times ``max_call_s`` per call: every speedup in a cell
#: needs them, and on CPUs without native bf16 the 16-bit baseline is the slowest row.
BASELINE_CALL_FACTOR = 3.0
#: ``--layer all``: every layer of one transformer block of each size.
ALL_LAYERS = "all"


@dataclass(frozen=True)
class RunOptions:
    case: str = "gpt3"
    sizes: tuple[int, ...] | None = None  # d_model values; None = all of the case
    tokens: tuple[int, ...] | None = None
    layer: str | None = None
    dist: str | None = None
    backends: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    device: str = "cpu"
    cfg: QuantConfig = field(default_factory=QuantConfig)
    timer: TimerSettings = field(default_factory=TimerSettings)
    stage_timer: TimerSettings = field(default_factory=TimerSettings.for_stages)
    max_call_s: float = default("max_call_s")
    error_rows: int = default("error_rows")
    activations: Path | None = None
    #: The sweep visits its cells this many times (round 0 in size order, later rounds each in
    #: a fresh shuffled order); a row's pairs are pooled over the rounds.
    rounds: int = default("rounds")
    #: A pooled speedup whose 95% interval is wider than this (half-width, relative) is "wide":
    #: the run measures its cell again while ``extra_rounds`` last, then says so.
    ci_target: float = default("ci_target")
    extra_rounds: int = default("extra_rounds")
    #: Seconds each extra round may take at least (cheapest uncertain cells first;
    #: :class:`CellPacer`); :func:`extra_round_budget` gives a longer sweep more.
    extra_round_budget_s: float = default("extra_round_budget_s")
    #: The extra rounds together may take this share of the planned rounds' wall time.
    extra_share: float = default("extra_share")
    #: Memory (bytes) a local run may keep cells' inputs and runners in between rounds, so that
    #: a later round does not quantize the weights again; ``None``: a share of physical memory
    #: (:func:`kernelbench.run.prepared.default_limit_bytes`), 0: keep nothing.
    keep_prepared_bytes: int | None = None
    #: ``cold``: every timed call finds its weights and activations out of cache (evicted
    #: before it, as a model's layer streams its weights once per token); ``hot``: as the
    #: previous calls left the caches.
    cache: str = default("cache")
    #: The machine's measured fp32 peak (TOPS), where known: fp32's later rounds are chosen by
    #: its calls' time at that peak, the same in every run of the machine (:func:`fp32_in_round`).
    fp32_peak_tops: float | None = None


@dataclass(frozen=True)
class WorkItem:
    """One cell of the sweep; every (backend, method) pair is measured on its inputs."""

    size: Size
    layer: str
    tokens: int
    dist: str
    round: int = 0
    #: Measure only these (backend, method) pairs (and the baseline they pair with); ``None``:
    #: all of the run's pairs. Extra rounds for wide or suspect rows use it.
    only: frozenset[tuple[str, str]] | None = None

    @property
    def label(self) -> str:
        text = f"{self.size.name} d={self.size.d_model} {self.layer} tokens={self.tokens}"
        return f"{text} round {self.round}" if self.round else text


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or auto, got {device!r}")
    return torch.device(device)


def plan(case: Case, opts: RunOptions) -> list[WorkItem]:
    sizes = [case.size(d) for d in opts.sizes] if opts.sizes else list(case.sizes)
    layer = opts.layer or case.default_layer
    if layer != ALL_LAYERS:
        for s in sizes:
            case.shape(layer, s.d_model)  # validates the layer name
    tokens = opts.tokens or case.default_tokens
    dist = opts.dist or case.default_dist
    if opts.activations is not None:
        dist = f"file:{Path(opts.activations).name}"
    layers = [
        (s, lay)
        for s in sizes
        for lay in (case.layer_names(s.d_model) if layer == ALL_LAYERS else (layer,))
    ]
    items = []
    for r in range(opts.rounds):
        # round 0 goes up in size, so that every call-time estimate comes from below; later
        # rounds each in a fresh shuffled order. The token counts of a layer come one after
        # another (in a shuffled order after round 0): they share its prepared weights.
        order = list(layers)
        rng = random.Random(case.seed + r)
        if r:
            rng.shuffle(order)
        for s, lay in order:
            counts = list(tokens)
            if r:
                rng.shuffle(counts)
            items += [WorkItem(s, lay, t, dist, round=r) for t in counts]
    return items


def method_pairs(opts: RunOptions) -> list[tuple[str, str]]:
    """(backend, method) pairs in measuring order: baselines first."""
    backends = list(opts.backends or [n for n, b in all_backends().items() if b.in_default_sweep])
    methods = list(opts.methods or METHODS)
    unknown = [b for b in backends if b not in all_backends()]
    if unknown:
        raise ValueError(f"unknown backend(s) {unknown}; known: {', '.join(all_backends())}")
    bad = [m for m in methods if m not in ALL_METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {bad}; known: {', '.join(ALL_METHODS)}")
    pairs = [(b, m) for b in backends for m in methods]
    first = [p for p in (BASELINE, FP32) if p in pairs]
    return first + [p for p in pairs if p not in first]


class CallEstimator:
    """Throughput of each (backend, method) at each token count seen so far in this run, to
    skip hopeless rows (small token counts run far below the large ones' throughput, so an
    estimate comes only from the same token count)."""

    def __init__(self) -> None:
        self.ops_per_s: dict[tuple[tuple[str, str], int], tuple[float, int]] = {}

    def record(
        self, key: tuple[str, str], ops: float, seconds: float, d_model: int, tokens: int
    ) -> None:
        if seconds > 0:
            self.ops_per_s[(key, tokens)] = (ops / seconds, d_model)

    def record_rows(self, rows: Iterable[dict]) -> None:
        """Learn from rows measured before, in the order written (a resumed run's): a resumed
        run then skips, warms up and measures ``fp32`` in later rounds as the run it continues
        would have, instead of as if nothing had been measured."""
        for r in rows:
            if r.get("status") == "ok" and r.get("median_ms"):
                ops = work_flops(r["m"], r["k"], r["n"])
                pair = (r["backend"], r["method"])
                self.record(pair, ops, r["median_ms"] / 1e3, r["d_model"], r["tokens"])

    def estimate(self, key: tuple[str, str], ops: float, tokens: int) -> tuple[float, int] | None:
        if (key, tokens) not in self.ops_per_s:
            return None
        rate, d_model = self.ops_per_s[(key, tokens)]
        return ops / rate, d_model


def max_call_s(pair: tuple[str, str], limit_s: float) -> float:
    """The longest estimated call ``pair`` may have before its row is skipped, under the run's
    ``max_call_s`` of ``limit_s``."""
    return limit_s * (BASELINE_CALL_FACTOR if pair in (BASELINE, FP32) else 1.0)


#: ``fp32`` is measured in every base round where its call (estimated from this run's latest
#: fp32 call at the same token count) is shorter than this, and in round 0 only where longer:
#: a reference point, not a contender, and at 175B shapes one call takes a 2-core CPU 13-17 s.
#: Measured in one round, its interval covered that round's seconds only: two D.1 runs of one
#: commit on a 2-core Zen 4 disagreed beyond their intervals on 5 of 8 fp32 cells (d = 768:
#: 0.47x then 0.34x), two default sweeps on 20 of 40. A later round costs the row about four
#: calls (its first call and three pairs): under 10 s a cell. Where the machine's fp32 peak is
#: known, a call's time at that peak decides (the least it can take): a call near the limit
#: went one way or the other by the run's estimate (13B at 2048 tokens on that Zen 4: 2.4-2.6 s
#: a call, in three rounds in one D.1 run and one in the next, so that ``compare`` could not
#: judge it).
FP32_REPEAT_MAX_CALL_S = 2.5


def fp32_in_round(
    round_: int, estimate: tuple[float, int] | None, at_peak_s: float | None = None
) -> bool:
    """Whether ``fp32`` is measured in round ``round_`` of a cell whose fp32 call takes
    ``at_peak_s`` at the machine's fp32 peak (``None``: no peak known), or else that this run
    estimates at ``estimate`` (seconds, the size it was measured at; ``None``: not measured
    at this token count yet)."""
    if round_ == 0:
        return True
    if at_peak_s is not None:
        return at_peak_s < FP32_REPEAT_MAX_CALL_S
    return estimate is not None and estimate[0] < FP32_REPEAT_MAX_CALL_S


def load_user_activations(opts: RunOptions) -> torch.Tensor | None:
    return load_activation_file(opts.activations) if opts.activations else None


#: A row of one round (no t interval of rounds to project) whose interval is wider than this
#: many times the run's ``ci_target`` seldom narrows to it in an extra round. Three decode
#: sweeps on a 2-core VM (768-4096 x tokens 1, 8, 32; 3 rounds + 2 extra): of the rows that got
#: extra rounds, 26 of 107 within twice the target reached it, 4 of 120 beyond twice did.
WITHIN_REACH = 2.0


def within_reach(halfwidth: float, rounds: int, target: float, rounds_left: int) -> bool:
    """Whether a wide row can narrow to ``target`` in the extra rounds left: its t interval of
    rounds projected (:func:`~kernelbench.statistics.rounds_to_narrow`), the rounds scattering
    as they did; a one-round row by :data:`WITHIN_REACH`. A fixed factor judged a row by its
    width alone: a 6-round row at twice the target (one more round narrows it 1.13x) came
    before a 3-round row just beyond (1.56x)."""
    if rounds >= 2:
        return rounds_to_narrow(halfwidth, rounds, target, max(rounds_left, 1)) is not None
    return halfwidth <= WITHIN_REACH * target


def followup_items(
    rows: list[dict],
    env: dict,
    items: list[WorkItem],
    next_round: int,
    budget_s: float | None = None,
    row_budget_s: float = 0.0,
    link_now_ns: float | None = None,
    waiting: Collection[tuple[int, str, int]] = (),
) -> list[WorkItem]:
    """Work items of one extra round for the cells whose pooled rows are still uncertain: a
    speedup interval wider than the run's ``ci_target``, or an ordering contradiction (which
    more pairs either resolve or confirm). Each item measures only those rows (and the
    baseline they pair with). When the run's calls fall in two states (the host moved the
    threads between one core complex and two: :mod:`kernelbench.results.states`), a row is
    judged by each state's interval instead of the pooled one, which mixes two speedups no
    extra round narrows: a row narrow in every state it has pairs in is settled, and with
    ``link_now_ns`` (the threads' link read now) a row wide only in the other state comes
    last, as a round now adds pairs to the state the host is in. With ``budget_s``, the rows
    in an ordering contradiction come first (a physics flag the reader sees; a one-round run's
    intervals miss the spread between rounds), then those within reach of the target in the extra
    rounds left (:func:`within_reach`), then the others, each tier's cheapest cells first, and the
    round takes a cell only while its estimated cost fits what is left: more pairs go where
    they can settle a row. A row is estimated as the engine times it: for its budget per round
    (``row_budget_s``, an uncertain row seldom meets its interval target sooner), and at
    least one pair (its time and its baseline's, measured so far). Cells in ``waiting``
    ((d_model, layer, tokens) that an earlier extra round passed over for its budget) come
    first in their tier: cheapest first, a cell dearer than one round's share never got one."""
    from kernelbench.results.physics import ORDERING
    from kernelbench.results.states import state_of
    from kernelbench.results.view import flagged, marked, pooled_view, state_view

    target = float(recorded(env, "ci_target"))
    # this round included
    rounds_left = int(recorded(env, "rounds")) + int(recorded(env, "extra_rounds")) - next_round
    layers = {i.layer for i in items}
    df = pooled_view(rows, env)
    if df.empty:
        return []
    ok = df[(df["status"] == "ok") & df["layer"].isin(layers)]
    ok = ok[[(b, m) != FP32 for b, m in zip(ok["backend"], ok["method"], strict=True)]]
    ordering = flagged(ok, ORDERING)
    candidates = ok[marked(ok, "ci_wide") | ordering]
    states = state_view(df, only=candidates.index)
    now = None
    if states.split is not None and link_now_ns is not None:
        now = state_of(None, states.split, link_now_ns)
    # ordering contradictions, within reach, the others, wide only in the state the host is
    # not in now
    tiers: tuple[dict[tuple, set], ...] = ({}, {}, {}, {})
    costs: tuple[dict[tuple, float], ...] = ({}, {}, {}, {})
    for idx, row in candidates.iterrows():
        in_order = bool(ordering[idx])
        by_state = {s: v for s, v in states.by_row.get(idx, {}).items() if v.pairs >= 2}
        if by_state:
            wide = {
                s: w
                for s, v in by_state.items()
                if (w := rel_halfwidth(v.speedup, v.lo, v.hi)) > target
            }
            if not wide and not in_order:
                continue
            width = wide.get(now, max(wide.values(), default=0.0))
            elsewhere = now is not None and bool(wide) and now not in wide and not in_order
        else:
            width = rel_halfwidth(row["speedup"], row["speedup_lo"], row["speedup_hi"])
            elsewhere = False
        reach = within_reach(width, int(_number(row.get("rounds"), 1)), target, rounds_left)
        tier = 3 if elsewhere else 0 if in_order else 1 if reach else 2
        cell = (row["d_model"], row["layer"], row["tokens"])
        tiers[tier].setdefault(cell, set()).add((row["backend"], row["method"]))
        pair_ms = _number(row["median_ms"], 0.0) + _number(row["baseline_ms"], 0.0)
        costs[tier][cell] = costs[tier].get(cell, 0.0) + max(row_budget_s, pair_ms / 1e3)
    cells = {(i.size.d_model, i.layer, i.tokens): i for i in items}
    chosen: dict[tuple, set[tuple[str, str]]] = {}
    spent = 0.0
    for uncertain, cost in zip(tiers, costs, strict=True):
        for c in sorted(uncertain, key=lambda c: (c not in waiting, cost[c])):
            if c not in cells:
                continue
            if budget_s is not None and spent + cost[c] > budget_s:
                continue
            spent += cost[c]
            chosen.setdefault(c, set()).update(uncertain[c])
    return [
        WorkItem(cells[c].size, c[1], c[2], cells[c].dist, next_round, frozenset(pairs))
        for c, pairs in chosen.items()
    ]


def extra_round_budget(planned_s: float, opts: RunOptions) -> float:
    """Seconds each extra round may take when the planned rounds took ``planned_s``: an even
    split of ``extra_share`` of that time over the extra rounds, at least
    ``extra_round_budget_s``. A fixed budget served a small run's few wide cells whole (a
    6-cell run: 26-32 of its 36 int8 rows within +-5%) but a 60-cell sweep only its cheapest
    few (80 of 240 within), most rows keeping the 3 rounds whose t interval alone is +-7-40%."""
    if opts.extra_rounds <= 0:
        return 0.0
    share = opts.extra_share * max(planned_s, 0.0) / opts.extra_rounds
    return max(opts.extra_round_budget_s, share)


def round_allowance(per_round_s: float, extra: int, spent_s: float) -> float:
    """Seconds extra round ``extra`` (0 first) may take when each has ``per_round_s`` and the
    earlier ones took ``spent_s``: its share and what they left of theirs (less what they
    overspent), never below 0. The extra rounds together stay within their shares, and a cell
    dearer than one share gets a round once the others leave it room: with even shares the
    175B cell of App. D.1 (57 s for its uncertain rows against 50-52 s a round on a 2-core
    Zen 5) kept 3 rounds while cheaper cells took every extra round and left 0-53 s unused."""
    return max(0.0, per_round_s * (extra + 1) - spent_s)


def _number(value, missing: float) -> float:
    """A pooled row's figure, ``missing`` where it has none (NaN in the view)."""
    return float(value) if value is not None and value == value else missing


#: What names a cell in :meth:`CellPacer.memory`.
CELL_FIELDS = ("d_model", "layer", "tokens")


class CellPacer:
    """The wall time each cell took when it was last measured, and an extra round's cells
    started only while they fit its budget: a cell's last time stands for its next, scaled by
    the rows measured then and now, each with the baseline they pair with (an extra round
    measures only a cell's uncertain rows: timing a full cell's time against them left half of
    a default sweep's extra budget unused). A cost estimated from the calls alone misses what a
    cell costs beside them (its inputs, runners, cache evictions: a one-token 175B cell of
    three rows, estimated at 1.5 s from its calls, took 22). Feed the items an executor takes
    one by one through :meth:`paced` and the rows it returns through :meth:`note_row`: the time
    between handing out a cell and being asked for the next is that cell's."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.seconds: dict[tuple[int, str, int], float] = {}
        #: the timed rows of each cell's last measurement, its baseline's included (0: none)
        self.rows: dict[tuple[int, str, int], int] = {}
        #: the cells handed out: rows timed, rows returned
        self._counting: dict[tuple[int, str, int], list[int]] = {}
        #: cells passed over for a budget and not handed out since: their estimate and the
        #: seconds that were left of the budget then
        self.waiting: dict[tuple[int, str, int], tuple[float, float]] = {}

    @staticmethod
    def _key(item: WorkItem) -> tuple[int, str, int]:
        return (item.size.d_model, item.layer, item.tokens)

    def note_row(self, item: WorkItem, timed: bool) -> None:
        """A row of ``item`` came back; ``timed``: it was measured (not skipped or failed)."""
        key = self._key(item)
        if key in self._counting:
            self._counting[key][0] += timed
            self._counting[key][1] += 1

    def estimate(self, item: WorkItem) -> float:
        """The seconds ``item`` should take: its cell's last time (0: never measured), scaled
        to the rows it measures when it measures only some (``item.only``)."""
        key = self._key(item)
        last = self.seconds.get(key, 0.0)
        then = self.rows.get(key, 0)
        if item.only is None or then <= 0:
            return last
        return last * min(1.0, (len(item.only) + 1) / then)  # + 1: the baseline

    def paced(self, items: Iterable[WorkItem], budget_s: float | None = None) -> Iterator[WorkItem]:
        """``items`` in order; with ``budget_s``, those whose estimate still fits in what is
        left of it (a cell never measured counts as free), the others skipped. A cell that
        returned no row (all of them written before a ``--resume``) keeps its last time. A
        cell passed over waits (:attr:`waiting`) until it is handed out."""
        start = self.clock()
        for item in items:
            key = self._key(item)
            began = self.clock()
            estimate = self.estimate(item)
            if budget_s is not None and began - start + estimate > budget_s:
                self.waiting[key] = (estimate, max(0.0, budget_s - (began - start)))
                continue
            self.waiting.pop(key, None)
            self._counting[key] = [0, 0]
            yield item
            timed, returned = self._counting.pop(key)
            if returned:
                self.seconds[key], self.rows[key] = self.clock() - began, timed

    def left_out(self) -> list[dict]:
        """The cells still waiting (passed over for their cost in the last round they were
        offered to), each with its estimate and what was left of that round, as plain data."""
        return [
            {
                **dict(zip(CELL_FIELDS, key, strict=True)),
                "estimate_s": round(estimate, 1),
                "left_s": round(left, 1),
            }
            for key, (estimate, left) in sorted(self.waiting.items())
        ]

    def memory(self) -> list[dict]:
        """Each cell's last time and rows, as plain data (kept in the run's env.json, so that a
        resumed run paces its extra rounds by the cells an earlier process timed)."""
        cells = []
        for key, seconds in sorted(self.seconds.items()):
            cell = dict(zip(CELL_FIELDS, key, strict=True))
            cells.append({**cell, "seconds": round(seconds, 2), "rows": self.rows.get(key, 0)})
        return cells

    def recall(self, memory: object) -> int:
        """Take the cells' times from :meth:`memory`'s data (read from a file: an entry that is
        not a cell's non-negative time is passed over); returns the cells taken. A cell this
        pacer timed itself keeps its own time."""
        taken = 0
        for entry in memory if isinstance(memory, list) else []:
            try:
                d_model, layer, tokens = (entry[f] for f in CELL_FIELDS)
                key = (int(d_model), str(layer), int(tokens))
                seconds, rows = float(entry["seconds"]), int(entry["rows"])
            except (KeyError, TypeError, ValueError):
                continue
            if not (0 <= seconds < float("inf") and rows >= 0) or key in self.seconds:
                continue
            self.seconds[key], self.rows[key] = seconds, rows
            taken += 1
        return taken
