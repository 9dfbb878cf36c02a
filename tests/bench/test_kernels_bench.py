"""Micro-benchmarks of the custom CPU kernels (pytest-benchmark), outside the default test run.

Run and compare them as ``docs/benchmarks.md`` describes. Every input is fresh seeded random data
(never zeros, which some paths would short-cut), built outside the timed region; each benchmark
first checks once that the kernel computes the right thing, so a fast wrong kernel cannot pass.
The shape is m=512 tokens, k=1024, n=4096 unless ``KERNELBENCH_BENCH_SHAPE=m,k,n`` says otherwise.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernelbench.backends import get_backend
from kernelbench.kernels import cpu_ext
from kernelbench.quant import QuantConfig

pytestmark = [
    pytest.mark.skipif(not cpu_ext.available(), reason=cpu_ext.IMPORT_ERROR or "no CPU kernels"),
    pytest.mark.benchmark(group="custom-cpu", min_rounds=5, warmup=True),
]

M, K, N = (int(v) for v in os.environ.get("KERNELBENCH_BENCH_SHAPE", "512,1024,4096").split(","))
DTYPE = torch.bfloat16  # the CPU 16-bit dtype
OUTLIER_COLS = 4  # feature dims with |x| > 6 (LLM.int8()'s alpha), as in real activations


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _activations(seed: int = 0) -> torch.Tensor:
    x = torch.randn(M, K, generator=_gen(seed))
    x[:, torch.arange(OUTLIER_COLS) * (K // OUTLIER_COLS)] *= 20.0  # a few outlier dims
    return x.to(DTYPE).contiguous()


def _int8(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=_gen(seed))


def _info(benchmark, **extra) -> None:
    benchmark.extra_info.update(
        m=M, k=K, n=N, threads=torch.get_num_threads(), isa=cpu_ext.isa(), **extra
    )


def test_quantize_rows(benchmark):
    x = _activations()
    mask = cpu_ext.detect_outliers(x, 6.0, False)
    cols = mask.nonzero().flatten()
    assert cols.numel() == OUTLIER_COLS
    q, amax, vals = cpu_ext.quantize_rows(x, mask, cols)
    assert bool((q[:, cols] == 0).all()) and bool((amax > 0).all())
    assert int(q.abs().max()) == 127
    _info(benchmark, outlier_cols=cols.numel(), bytes_read=x.numel() * x.element_size())
    benchmark(cpu_ext.quantize_rows, x, mask, cols)


def test_quantize_kept(benchmark):
    """The one pass of a call whose outliers are all in the kept dims (a calibrated layer)."""
    x = _activations()
    mask = cpu_ext.detect_outliers(x, 6.0, False)
    kept = cpu_ext.kept_dims(mask.nonzero().flatten(), K)
    got = cpu_ext.quantize_kept(x, kept, 6.0, False)
    assert got is not None
    ref = cpu_ext.quantize_rows(x, mask, kept.cols)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    _info(benchmark, outlier_cols=kept.cols.numel(), bytes_read=x.numel() * x.element_size())
    benchmark(cpu_ext.quantize_kept, x, kept, 6.0, False)


def test_gemm(benchmark):
    a, w = _int8(M, K, 1), _int8(N, K, 2)
    packed = cpu_ext.pack_weight(w)
    out = cpu_ext.gemm(a, packed, N)
    rows = torch.arange(0, M, max(1, M // 8))  # exact check on a slice (int64 reference)
    assert torch.equal(out[rows].long(), a[rows].long() @ w.long().T)
    _info(benchmark, ops=2 * M * K * N)
    benchmark(cpu_ext.gemm, a, packed, N)


def test_dequantize(benchmark):
    acc = torch.randint(-(2**20), 2**20, (M, N), dtype=torch.int32, generator=_gen(3))
    row_absmax = torch.rand(M, generator=_gen(4)) * 4 + 0.5
    col_absmax = torch.rand(N, generator=_gen(5)) * 0.1 + 0.01
    bias = torch.randn(N, generator=_gen(6))
    ox = torch.randn(M, OUTLIER_COLS, generator=_gen(7)) * 20
    ow = torch.randn(OUTLIER_COLS, N, generator=_gen(8)) * 0.05
    args = (acc, cpu_ext.Dequant(row_absmax, col_absmax, DTYPE, bias, ox, ow))
    ref = acc.double() * torch.outer(row_absmax, col_absmax).double() / 127**2
    ref += bias.double() + ox.double() @ ow.double()
    got = cpu_ext.dequantize(*args).double()
    assert torch.allclose(got, ref, rtol=2**-7, atol=1e-3)
    _info(benchmark, outlier_cols=OUTLIER_COLS)
    benchmark(cpu_ext.dequantize, *args)


def test_llm_int8_linear(benchmark):
    x = _activations(9)
    weight = (torch.randn(N, K, generator=_gen(10)) * K**-0.5).to(DTYPE)
    bias = (torch.randn(N, generator=_gen(11)) * 0.1).to(DTYPE)
    runner = get_backend("custom").runner("llm_int8", x, weight, bias, QuantConfig())
    ref = x.double() @ weight.double().T + bias.double()
    err = (runner.run().double() - ref).norm() / ref.norm()
    assert runner.outlier_cols == OUTLIER_COLS and float(err) < 0.05
    _info(benchmark, outlier_cols=runner.outlier_cols, rel_error=float(err))
    benchmark(runner.run)
