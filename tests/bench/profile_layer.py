"""One layer call of one backend in a loop, for a sampling profiler to look at.

The call is the sweep's cell: the case's layer (ffn1 of GPT-3 width d: its weights, bias and
activations with planted outlier dims, the first m rows), ``llm_int8`` with its outlier dims
calibrated as the harness calibrates them. The weights are drawn again into enough copies
(>= 256 MiB) that every call streams its weights from memory, as a model's layers do (``--hot``:
one copy, from cache); as in the harness, the calls' outputs reuse freed memory
(``timing.freed_memory_reused``) instead of faulting in fresh pages. The loop runs for
``--seconds``, prints the median call and the weights' read rate, and the process ends at once
(no interpreter teardown in the profile). ``--method read`` times a plain read of packed
weights of the same size instead (``torch.sum`` as int64: the rate a stream of that length gets).

Where a VM hides the processor's counters, profile with the kernel's software clock, the
extension built with symbols (``-DCMAKE_CXX_FLAGS=-g -DCMAKE_STRIP=/bin/true``) and the
profile started after the setup (``-D`` milliseconds)::

    perf record -e cpu-clock -F 4000 -D 6000 -o /tmp/p.data -- \\
        env PYTHONPATH=. python tests/bench/profile_layer.py --d 2048 --m 8 --seconds 8
    perf report -i /tmp/p.data --sort dso,sym --stdio    # --sort pid,dso: per thread

Run as a script (not collected by pytest).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

from kernelbench.backends import get_backend
from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import freed_memory_reused
from kernelbench.quant import QuantConfig, outlier_columns
from kernelbench.run.cases import layer_inputs, load_case

ROTATE_BYTES = 256 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="custom")
    p.add_argument("--method", default="llm_int8", help="a method, or 'read' (a plain read)")
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--m", type=int, default=8)
    p.add_argument("--layer", default="ffn1")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--hot", action="store_true", help="one weight copy (from cache)")
    p.add_argument("--isa", default=None, help="the CPU extension's kernel set (avx2, ...)")
    args = p.parse_args()
    if args.isa:
        cpu_ext.set_isa(args.isa)
    case = load_case("gpt3")
    cfg = QuantConfig()
    inputs = layer_inputs(
        case, case.size(args.d), args.layer, "outliers", torch.bfloat16, torch.device("cpu")
    )
    kept = outlier_columns(inputs.calibration, cfg.alpha, cfg.outlier_cmp)
    x = inputs.x[: args.m].contiguous()
    gen = torch.Generator().manual_seed(args.d)
    be = get_backend(args.backend)

    def build(weight: torch.Tensor):
        return be.runner(args.method, x, weight, inputs.bias, cfg, kept_rows=kept)

    n, k = inputs.weight.shape
    copies = 1 if args.hot else max(2, math.ceil(ROTATE_BYTES / (n * k)))
    if args.method == "read":
        packed = [
            cpu_ext.pack_weight(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen))
            for _ in range(copies)
        ]
        calls = [lambda b=b: b[: b.numel() // 8 * 8].view(torch.int64).sum() for b in packed]
        weight_bytes = packed[0].numel()
    else:
        std = float(inputs.weight.float().std())
        weights = [inputs.weight] + [
            (torch.randn(n, k, generator=gen) * std).to(inputs.weight.dtype)
            for _ in range(copies - 1)
        ]
        runners = [build(w) for w in weights]
        calls = [r.run for r in runners]
        weight_bytes = runners[0].weight_bytes  # as the backend keeps them (int8, bf16...)
    times: list[float] = []
    with freed_memory_reused():  # as the harness times: outputs reuse freed pages
        for call in calls:
            call()
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            calls[i % len(calls)]()
            times.append(time.perf_counter() - t0)
            i += 1
    med = statistics.median(times)
    what = "read" if args.method == "read" else f"{args.backend} {args.method}"
    rate = f"weights {weight_bytes / 1e6:.1f} MB, {weight_bytes / med / 1e9:.1f} GB/s"
    if args.method != "read":
        rate += f", {2 * args.m * k * n / med / 1e12:.2f} TOPS"
    print(
        f"{what} d={args.d} m={args.m} ({args.m}x{k}x{n}), "
        f"{'hot' if args.hot else f'{copies} weight copies'}, threads={torch.get_num_threads()}: "
        f"{len(times)} calls, median {med * 1e6:.0f} us, {rate}",
        flush=True,
    )
    os._exit(0)


if __name__ == "__main__":
    main()
