"""What a shared host is doing to this machine, minute by minute: one line per few seconds.

Each line is the median over a few rounds of, back to back in one process:

* ``scalar``: a dependent chain of Python integer additions (latency-bound scalar code: what
  moves it is the core's clock);
* ``scan``: the harness's cold-cache scan (twice the last-level cache read), in GB/s;
* ``link``: the round trip of a cache line between two of the kernels' threads, in ns (where
  the host runs them: one core complex, or two);
* ``int8 GEMV``: custom ``llm_int8`` at one token (ffn1 of width ``--d``), weight GB/s, two
  weight copies alternated so each call streams from memory;
* ``bf16 GEMV`` and ``bf16 m=32``: torch's bf16 ``F.linear`` at one and 32 tokens on the same
  shape (the harness's 16-bit baseline), weight GB/s and TOPS.

On a VM whose speedups move between rounds (``kernelbench show --wide``), run it for a few
minutes: a state in which the int8 calls and the scan read faster while the bf16 calls run
slower, with the scalar chain unchanged, is the host's doing, not the harness's (on the 2-core
Zen 5 VM, two such states within seconds of each other: scan 63-72 vs 39-46 GB/s, int8 GEMV
61-74 vs 42-49, bf16 GEMV 23-25 vs 30-33, bf16 at 32 tokens 0.46-0.50 vs 0.55-0.61 TOPS, the
scalar chain 172-177 us in both). The link column says which: on that VM about 300 ns in the
first state (the vCPUs on two core complexes, each with its own link to memory) and 50-70 ns in
the second (one complex). Run as a script (not
collected by pytest)::

    PYTHONPATH=. python tests/bench/host_states.py --seconds 300
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kernelbench.backends import get_backend
from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import shared_evictor
from kernelbench.quant import QuantConfig

SCALAR_STEPS = 20_000


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=6, help="calls of each probe per line")
    args = p.parse_args()
    d = args.d
    gen = torch.Generator().manual_seed(d)
    x1 = torch.randn(1, d, generator=gen).to(torch.bfloat16)
    x32 = torch.randn(32, d, generator=gen).to(torch.bfloat16)
    weights = [(torch.randn(4 * d, d, generator=gen) * 0.02).to(torch.bfloat16) for _ in (0, 1)]
    custom = get_backend("custom")
    int8 = [custom.runner("llm_int8", x1, w, None, QuantConfig()) for w in weights]
    scan = shared_evictor()
    n_weights = 4 * d * d
    print(
        f"d={d}, threads={torch.get_num_threads()}; columns: time, scalar us ({SCALAR_STEPS} "
        "additions), scan GB/s, link ns, int8 GEMV GB/s, bf16 GEMV GB/s, bf16 m=32 TOPS",
        flush=True,
    )
    end = time.time() + args.seconds
    i = 0
    while time.time() < end:
        names = ("scalar", "scan", "link", "int8", "bf16", "m32")
        cols: dict[str, list[float]] = {k: [] for k in names}
        for _ in range(args.rounds):
            i += 1
            cols["scalar"].append(_seconds(lambda: sum(range(SCALAR_STEPS))) * 1e6)
            cols["scan"].append(scan.bytes / _seconds(scan) / 1e9)
            cols["link"].append(cpu_ext.thread_round_trip_ns() or float("nan"))
            cols["int8"].append(n_weights / _seconds(int8[i % 2].run) / 1e9)
            w = weights[(i + 1) % 2]
            cols["bf16"].append(2 * n_weights / _seconds(lambda w=w: F.linear(x1, w)) / 1e9)
            w = weights[i % 2]
            m32 = _seconds(lambda w=w: F.linear(x32, w))
            cols["m32"].append(2 * 32 * n_weights / m32 / 1e12)
        med = {k: statistics.median(v) for k, v in cols.items()}
        print(
            f"{time.strftime('%H:%M:%S')}  {med['scalar']:6.0f}  {med['scan']:5.1f}  "
            f"{med['link']:5.0f}  "
            f"{med['int8']:5.1f}  {med['bf16']:5.1f}  {med['m32']:.3f}",
            flush=True,
        )
        time.sleep(2.0)


if __name__ == "__main__":
    main()
