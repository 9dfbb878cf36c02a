"""Paired A/B of the CPU GEMM's decode path against its blocked path and a plain read.

Per shape (m tokens, ffn1 of width d: k = d, n = 4d) in one process: the fused int8 GEMM +
dequantization (``cpu_ext.linear``, bf16 out: llm_int8's GEMM without its outliers) is called
with the decode path (``stream_rows`` = m) and with the blocked path (``stream_rows`` = 0) on
the same kernel set, and the same packed weight bytes are read once by ``torch.sum`` (as int64:
what the memory gives a plain stream of that length, the decode path's bound), the order
rotating every rep. Each rep gives the ratios decode / blocked and decode / read; the table shows
their medians with 95% bootstrap intervals and the quartiles of the first, and the decode path's
weight bandwidth (int8 weight bytes / time), the read's, and int8 TOPS (medians). The weights
rotate over enough copies (>= 256 MiB in all) that every call streams them from DRAM.
On a machine shared with other work, ``--threads 1 --clock cpu`` times the calling thread's CPU
time instead of the wall clock: the kernel's own speed, without the time it spent descheduled
(with two threads, an OpenMP barrier waiting for a descheduled thread costs a whole time slice).
``--other-prefetch l1|l2`` adds the decode path under that prefetch hint
(``cpu_ext.set_decode_prefetch``) to the rotation: decode/other is the processor's default
against it. ``--other-pages`` adds instead the decode path on weights packed into small pages
(``pack_weight(..., huge_pages=False)``, copies of their own): decode/other is the packed
weights' transparent huge pages against 4 KiB pages (``cpu_ext.huge_page_setting()`` must
allow them: ``madvise`` or ``always``).
``--by-state``: before every rep the harness's cache scan is timed and the threads' link read
(the readings a cold call records), and at the end every ratio is shown again split by the
host's state over all the script's readings (``kernelbench.results.states``): on a host that
moves between two states a tuning can win in one and lose in the other (the decode prefetch
distance did), so
an A/B whose reps fall in one state says nothing about the other.
Run as a script (not collected by pytest); on a shared machine pair many calls::

    PYTHONPATH=. python tests/bench/ab_decode.py --d 1536,4096,12288 --m 1,8,32 --pairs 40
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import call_timer
from kernelbench.results.states import STATES, bus_split, state_of
from kernelbench.statistics import median_interval

COLD_BYTES = 256 << 20
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = CLOCKS["wall"]


def _call(a, packed, n, dq, rows: int) -> float:
    cpu_ext.set_stream_rows(rows)
    t0 = clock()
    cpu_ext.linear(a, packed, n, dq)
    return clock() - t0


def _read(packed: torch.Tensor) -> float:
    words = packed[: packed.numel() // 8 * 8].view(torch.int64)
    t0 = clock()
    words.sum()
    return clock() - t0


def _bus_reading() -> tuple[float | None, float | None]:
    """The readings a cold call records before it (the bus's GB/s, the threads' link in ns):
    the harness's own cold timer, around nothing."""
    timer = call_timer("cpu", cache="cold", link_probe=cpu_ext.thread_round_trip_ns)
    timer.timed(lambda: None)
    return timer.last_reading


def measure(
    m: int,
    d: int,
    pairs: int,
    isa: str,
    other: str | None = None,
    other_pages: bool = False,
    by_state: bool = False,
) -> dict:
    k, n = d, 4 * d
    gen = torch.Generator().manual_seed(d + m)
    copies = max(1, math.ceil(COLD_BYTES / (n * k)))
    int8_weights = [
        torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen) for _ in range(copies)
    ]
    packed = [cpu_ext.pack_weight(w) for w in int8_weights]
    small_pages = [cpu_ext.pack_weight(w, False) for w in int8_weights] if other_pages else []
    del int8_weights
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
    dq = cpu_ext.Dequant(
        torch.rand(m, generator=gen) + 0.5, torch.rand(n, generator=gen) * 1e-3, torch.bfloat16
    )
    cpu_ext.set_isa(isa)
    before = cpu_ext.stream_rows()
    hint = cpu_ext.decode_prefetch()
    try:
        outs = {}
        for rows in (m, 0):  # warm up; the two paths agree bit for bit
            cpu_ext.set_stream_rows(rows)
            outs[rows] = cpu_ext.linear(a, packed[0], n, dq).view(torch.int16)
        if not torch.equal(outs[m], outs[0]):
            raise SystemExit(f"m={m} d={d}: the decode and blocked paths differ")
        ratios, read_ratios, other_ratios, decode_s, read_s, bus = [], [], [], [], [], []
        has_other = bool(other or other_pages)
        calls = ("decode", "blocked", "read") + (("other",) if has_other else ())
        for i in range(pairs):
            order = calls[i % len(calls) :] + calls[: i % len(calls)]
            if by_state:
                bus.append(_bus_reading())
            t = {}
            for j, call in enumerate(order):
                slot = (len(calls) * i + j) % copies
                weights = packed[slot]
                if call == "read":
                    t[call] = _read(weights)
                elif call == "other" and other_pages:
                    t[call] = _call(a, small_pages[slot], n, dq, m)
                elif call == "other":
                    cpu_ext.set_decode_prefetch(other)
                    t[call] = _call(a, weights, n, dq, m)
                    cpu_ext.set_decode_prefetch(hint)
                else:
                    t[call] = _call(a, weights, n, dq, m if call == "decode" else 0)
            if has_other:
                other_ratios.append(t["decode"] / t["other"])
            ratios.append(t["decode"] / t["blocked"])
            read_ratios.append(t["decode"] / t["read"])
            decode_s.append(t["decode"])
            read_s.append(t["read"])
    finally:
        cpu_ext.set_stream_rows(before)
        cpu_ext.set_decode_prefetch(hint)
    lo, hi = median_interval(ratios) or (math.nan, math.nan)
    read_lo, read_hi = median_interval(read_ratios) or (math.nan, math.nan)
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    other_lo, other_hi = median_interval(other_ratios) or (math.nan, math.nan)
    t = statistics.median(decode_s)
    return {
        "other": statistics.median(other_ratios) if other_ratios else math.nan,
        "other_lo": other_lo,
        "other_hi": other_hi,
        "ratio": med,
        "lo": lo,
        "hi": hi,
        "q1": q1,
        "q3": q3,
        "read": statistics.median(read_ratios),
        "read_lo": read_lo,
        "read_hi": read_hi,
        "ms": t * 1e3,
        "GB/s": n * k / t / 1e9,
        "read GB/s": n * k / statistics.median(read_s) / 1e9,
        "TOPS": 2 * m * n * k / t / 1e12,
        "reps": {"blocked": ratios, "read": read_ratios, "other": other_ratios, "bus": bus},
    }


def _interval_text(values: list[float]) -> str:
    if not values:
        return "-"
    interval = median_interval(values)
    lo, hi = interval if interval else (math.nan, math.nan)
    return f"{statistics.median(values):.3f} [{lo:.3f}, {hi:.3f}] n={len(values)}"


def print_by_state(results: dict[tuple[int, int], dict], other: str | None) -> None:
    """Every shape's ratios again, split by the state of the bus reading before each rep."""
    readings = [reading for r in results.values() for reading in r["reps"]["bus"]]
    split = bus_split([b for b, _ in readings], [link for _, link in readings])
    if split is None:
        print("by state: the readings show no two states (one state: the ratios above stand)")
        return
    by_link = f", by the threads' link cut at {split.link_threshold_ns:.0f} ns"
    print(
        f"by state: bus medians {split.slow_gbps:.0f} and {split.fast_gbps:.0f} GB/s"
        f"{by_link if split.link_threshold_ns else ''} ({split.slow_share:.0%} of the readings "
        "slow)"
    )
    names = ["blocked", "read"] + (["other"] if other else [])
    for (d, m), r in results.items():
        reps = r["reps"]
        for state in STATES:
            keep = [state_of(b, split, link) == state for b, link in reps["bus"]]
            cells = [
                f"decode/{other if name == 'other' else name} "
                + _interval_text([v for v, k in zip(reps[name], keep, strict=True) if k])
                for name in names
            ]
            print(f"d={d:>5} m={m:>2} {state}: " + "  ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", default="1536,4096,12288")
    p.add_argument("--m", default="1,8,32")
    p.add_argument("--pairs", type=int, default=40)
    p.add_argument("--isa", default=cpu_ext.isa())
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    other = p.add_mutually_exclusive_group()
    other.add_argument("--other-prefetch", choices=sorted(cpu_ext.DECODE_PREFETCH), default=None)
    other.add_argument("--other-pages", action="store_true")
    p.add_argument("--by-state", action="store_true")
    args = p.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu times the calling thread only: use it with --threads 1")
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    print(
        f"isa={args.isa} threads={torch.get_num_threads()} clock={args.clock} "
        f"decode prefetch={cpu_ext.decode_prefetch()} "
        f"huge pages={cpu_ext.huge_page_setting() or 'none'}; "
        "decode/blocked: median [95% CI] (quartiles); decode/read: median [95% CI]; "
        "decode path: median ms, weight GB/s, the read's GB/s, int8 TOPS"
    )
    results = {}
    name = "4k-pages" if args.other_pages else args.other_prefetch
    for d in (int(v) for v in args.d.split(",")):
        for m in (int(v) for v in args.m.split(",")):
            r = measure(
                m, d, args.pairs, args.isa, args.other_prefetch, args.other_pages, args.by_state
            )
            results[(d, m)] = r
            vs_other = (
                f"  decode/{name} {r['other']:.3f} [{r['other_lo']:.3f}, {r['other_hi']:.3f}]"
                if name
                else ""
            )
            print(
                f"d={d:>5} m={m:>2}: {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] "
                f"({r['q1']:.3f}, {r['q3']:.3f})  read {r['read']:.3f} "
                f"[{r['read_lo']:.3f}, {r['read_hi']:.3f}]  {r['ms']:.3f} ms  "
                f"{r['GB/s']:.1f} GB/s (read {r['read GB/s']:.1f})  {r['TOPS']:.2f} TOPS"
                f"{vs_other}",
                flush=True,
            )
    if args.by_state:
        print_by_state(results, name)


if __name__ == "__main__":
    main()
