"""Call every kernel of the given backends once per method, dtype and odd shape: the workload
that scripts/gpu_check.sh runs under ``compute-sanitizer`` (memcheck, racecheck).

Each case builds the backend's runner (prepare, quantize) and calls ``run`` and every stage
once, then synchronizes. A case the backend declines (``supports``) or refuses with an
InputError is listed, not counted as a failure; any other exception is. On CPU (``--device
cpu``) the same walk is the dry run's stand-in. Exit status: 1 when any case failed.
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

from kernelbench.backends import get_backend
from kernelbench.checks import InputError
from kernelbench.core import INT8_STAGE_METHODS
from kernelbench.quant import QuantConfig

#: (m, k, n): a row, odd m around tile edges (16/64/128), k and n multiples of 16 but not of
#: the tile sizes, k and n off the 16-multiple rule (padded or declined), one empty batch.
SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, 16, 16),
    (5, 33, 35),
    (3, 48, 32),
    (17, 80, 48),
    (65, 144, 96),
    (130, 272, 48),
    (0, 32, 16),
)
GPU_BACKENDS = ("custom", "cublaslt", "cutlass", "triton")


def make_inputs(m: int, k: int, n: int, dtype: torch.dtype, device: str, seed: int):
    """Random activations with two planted outlier columns (|x| ~ 10 > alpha 6), a weight,
    a bias and one kept (calibrated) weight row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    if m:
        x[:, [0, k // 2]] *= 10.0
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g) * 0.1
    kept = torch.tensor([k - 1], dtype=torch.int64)
    return (
        x.to(device=device, dtype=dtype),
        w.to(device=device, dtype=dtype),
        bias.to(device=device, dtype=dtype),
        kept.to(device),
    )


def run_case(backend, method: str, shape, dtype: torch.dtype, device: str) -> str:
    """``ok``, ``declined: why`` or ``refused: why``; raises on anything else."""
    m, k, n = shape
    why = backend.supports(method, torch.device(device), dtype, m, k, n)
    if not why:
        return f"declined: {why.reason}"
    x, w, bias, kept = make_inputs(m, k, n, dtype, device, seed=m * 7919 + k * 31 + n)
    try:
        runner = backend.runner(method, x, w, bias, QuantConfig(), kept_rows=kept)
        runner.run()
        for stage in runner.stages.values():
            stage()
    except InputError as exc:
        return f"refused: {exc}"
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return "ok"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backends", default=",".join(GPU_BACKENDS))
    ap.add_argument("--dtypes", default="float16,bfloat16")
    args = ap.parse_args(argv)
    failed = 0
    for name in args.backends.split(","):
        backend = get_backend(name)
        avail = backend.availability(torch.device(args.device))
        if not avail:
            print(f"{name}: not available on {args.device}: {avail.reason}")
            continue
        for method in INT8_STAGE_METHODS:
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                for shape in SHAPES:
                    label = f"{name} {method} {dtype_name} m,k,n={shape}"
                    try:
                        print(f"{label}: {run_case(backend, method, shape, dtype, args.device)}")
                    except Exception:
                        failed += 1
                        print(f"{label}: FAILED\n{traceback.format_exc()}")
                    sys.stdout.flush()
    print(f"kernel_workload: {failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
