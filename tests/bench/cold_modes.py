"""How cold is the harness's cold cache? One layer call under four cache settings, paired.

Per shape (m tokens, ffn1 of width d: k = d, n = 4d) in one process, a backend's runner is
built on enough weight copies (different weights, >= 256 MiB and twice the last-level cache in
all) to rotate over, and each
rep times, in a rotating order:

* ``hot``: the same runner again, nothing evicted;
* ``scan``: the same runner after the harness's scan of twice the last-level cache
  (``timing.shared_evictor``), nothing else;
* ``scan+flush``: the harness's ``--cache cold``: the scan, then the cache lines of the tensors
  the call reads flushed (``backends.residency``);
* ``full+flush``: as ``scan+flush`` with a scan of twice the last-level cache, where the
  harness's scan is shorter (``timing.PARTIAL_SCAN_BYTES``): how much colder the long scan is;
* ``rotate``: the next runner in the rotation, nothing evicted: a model's layers, each weight
  read once per token, the reference the others are divided by.

The table shows each setting's median time and its ratio to ``rotate`` (median of the reps'
ratios, 95% bootstrap interval). A ratio well under 1 is a setting that leaves the call's data
in cache. Run as a script (not collected by pytest)::

    PYTHONPATH=. python tests/bench/cold_modes.py --d 768,1536,2048,2560 --m 1,8 --reps 40
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from kernelbench.backends import get_backend
from kernelbench.backends.residency import call_eviction
from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import CacheEvictor, evict_bytes, shared_evictor
from kernelbench.quant import QuantConfig
from kernelbench.statistics import median_interval

FULL_SCAN_BYTES = evict_bytes(flushable=False)
ROTATE_BYTES = max(256 << 20, FULL_SCAN_BYTES + (32 << 20))
SETTINGS = ("hot", "scan", "scan+flush", "full+flush", "rotate")


def measure(backend: str, method: str, d: int, m: int, reps: int) -> dict[str, tuple]:
    gen = torch.Generator().manual_seed(d * 31 + m)
    k, n = d, 4 * d
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    be = get_backend(backend)
    first = be.runner(
        method, x, (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16), None, QuantConfig()
    )
    copies = max(2, math.ceil(ROTATE_BYTES / max(first.weight_bytes, 1)))
    runners = [first] + [
        be.runner(
            method,
            x,
            (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16),
            None,
            QuantConfig(),
        )
        for _ in range(copies - 1)
    ]
    scan = shared_evictor()
    full = scan if scan.bytes >= FULL_SCAN_BYTES else CacheEvictor(FULL_SCAN_BYTES)
    flush = call_eviction(first.run)
    for r in runners:
        r.run()
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    slot = 0
    for i in range(reps):
        for setting in SETTINGS[i % len(SETTINGS) :] + SETTINGS[: i % len(SETTINGS)]:
            run = first.run
            if setting == "rotate":
                slot = slot % (copies - 1) + 1
                run = runners[slot].run
            elif setting in ("scan", "scan+flush"):
                scan()
                scan.settle()
                if setting == "scan+flush":
                    flush()
            elif setting == "full+flush":
                full()
                full.settle()
                flush()
            t0 = time.perf_counter()
            run()
            times[setting].append(time.perf_counter() - t0)
    out = {}
    for setting in SETTINGS:
        ratios = [a / b for a, b in zip(times[setting], times["rotate"], strict=True)]
        lo, hi = median_interval(ratios) or (math.nan, math.nan)
        out[setting] = (statistics.median(times[setting]) * 1e6, statistics.median(ratios), lo, hi)
    return {
        "copies": copies,
        "weight_mb": first.weight_bytes / 1e6,
        "flushed_mb": flush.bytes / 1e6,
        **out,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="custom")
    p.add_argument("--method", default="llm_int8")
    p.add_argument("--d", default="768,1536,2048,2560")
    p.add_argument("--m", default="1,8")
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    if not cpu_ext.available():
        raise SystemExit("the CPU extension is not built: nothing flushes cache lines")
    print(
        f"{args.backend} {args.method}, threads={torch.get_num_threads()}, scan "
        f"{shared_evictor().bytes >> 20} MiB (full {FULL_SCAN_BYTES >> 20} MiB); per setting: "
        "median us, and its time / rotate's: median [95% CI]"
    )
    for d in (int(v) for v in args.d.split(",")):
        for m in (int(v) for v in args.m.split(",")):
            r = measure(args.backend, args.method, d, m, args.reps)
            cols = "  ".join(
                f"{s} {r[s][0]:.0f} ({r[s][1]:.2f} [{r[s][2]:.2f}, {r[s][3]:.2f}])"
                for s in SETTINGS[:-1]
            )
            print(
                f"d={d:>5} m={m:>2} weights {r['weight_mb']:.1f} MB (flushed {r['flushed_mb']:.1f},"
                f" {r['copies']} copies): {cols}  rotate {r['rotate'][0]:.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
