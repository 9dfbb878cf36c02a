"""Paired A/B of the custom backend's ``int8_raw`` against its ``vectorwise`` and oneDNN.

Per shape (m, k, n), in one process: the three calls (custom ``int8_raw`` runner, custom
``vectorwise`` runner, ``torch._int_mm`` on the same int8 operands) are called in a rotated
order every rep, with freed memory reused as the harness times CPU calls (without, each call
faulted in its int32 output: custom ``int8_raw`` read 1.8x its own ``vectorwise`` at
2048x1024x4096). Each rep gives the ratios raw / vectorwise and raw / oneDNN, reported as the
median with its 95% bootstrap interval and the interquartile range (times: medians).
``--cache cold`` evicts the caches before every call, outside the clock, as the harness's
default does (:class:`~kernelbench.measure.timing.CacheEvictor`); with ``hot`` (the default here)
each call finds what the call before it left in cache, so a ratio also measures how two
libraries share the caches: custom ``int8_raw`` at 2048x3072x768 took 5.05 ms after itself and
5.29 ms after oneDNN on the Zen 5 VM.
Run as a script (not collected by pytest)::

    python tests/bench/ab_int8_raw.py --shapes 2048x2048x8192,1x2048x8192 --reps 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kernelbench.backends import get_backend
from kernelbench.measure.timing import CacheEvictor, freed_memory_reused
from kernelbench.quant import QuantConfig
from kernelbench.statistics import median_interval

#: The paired ratios reported: raw / the other call.
RATIOS = {"raw/vec": "vec", "raw/onednn": "onednn"}


def _quartiles(v: list[float]) -> tuple[float, float, float]:
    if len(v) < 2:
        return v[0], v[0], v[0]
    q1, med, q3 = statistics.quantiles(v, n=4)
    return q1, med, q3


def measure(
    m: int, k: int, n: int, reps: int, cold: bool = False
) -> dict[str, tuple[float, float, float]]:
    gen = torch.Generator().manual_seed(m * 7 + k)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)
    backend = get_backend("custom")
    raw = backend.runner("int8_raw", x, w, None, QuantConfig())
    vec = backend.runner("vectorwise", x, w, None, QuantConfig())
    a, w_int8 = raw.operands
    w_kn = w_int8.t()
    calls = {"raw": raw.run, "vec": vec.run, "onednn": lambda: torch._int_mm(a, w_kn)}
    if not torch.equal(raw.run(), calls["onednn"]()):
        raise SystemExit(f"{m}x{k}x{n}: custom int8_raw differs from torch._int_mm")
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    evict = CacheEvictor() if cold else (lambda: None)
    with freed_memory_reused():  # as the harness times: each output reuses freed pages
        for f in calls.values():
            f()
        for i in range(reps):
            order = names[i % 3 :] + names[: i % 3]
            for name in order:
                evict()
                t0 = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - t0)
    ratio = lambda other: [r / o for r, o in zip(times["raw"], times[other], strict=True)]  # noqa: E731
    out = {key: _quartiles(ratio(other)) for key, other in RATIOS.items()}
    out.update({f"{name} ms": _quartiles([t * 1e3 for t in times[name]]) for name in names})
    out.update({f"{key} 95%": median_interval(ratio(other)) for key, other in RATIOS.items()})
    return out


def _cell(key: str, res: dict) -> str:
    q1, med, q3 = res[key]
    ci = res.get(f"{key} 95%")
    interval = f" 95% [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    return f"{key} {med:.3f}{interval} (IQR {q1:.3f}, {q3:.3f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2048x2048x8192,1x2048x8192")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--cache", choices=("hot", "cold"), default="hot")
    args = p.parse_args()
    print(
        f"threads={torch.get_num_threads()} cache={args.cache}  "
        "ratios: median 95% [interval] (IQR); ms: median"
    )
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        res = measure(m, k, n, args.reps, cold=args.cache == "cold")
        cells = [_cell(key, res) for key in RATIOS]
        cells += [f"{key} {res[key][1]:.3f}" for key in res if key.endswith(" ms")]
        print(f"{m}x{k}x{n}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
