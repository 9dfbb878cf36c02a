"""Ours vs oneDNN vs bf16 on GPT-3 FFN shapes (pytest-benchmark), outside the default test run.

Per shape (layer ffn1 = (k, n) = (d, 4d) or ffn2 = (4d, d), d, tokens m) one benchmark group:

* ``custom-int8_raw``: our int8 GEMM (``cpu_ext.gemm``, int32 out), ``onednn-int8_raw``:
  ``torch._int_mm`` on the same operands (oneDNN on CPU), ``bf16``: ``x @ w.T`` in bf16,
  ``custom-llm_int8``: our whole LLM.int8() layer (quantize, GEMM with the fused epilogue).
* The custom benchmarks also time a *paired* ratio in the same process (the two calls
  alternated A B B A ..., ``PAIRS`` pairs): ours / oneDNN for ``int8_raw``, ours / bf16 for
  ``llm_int8``, stored in ``extra_info`` as the median ratio and its interquartile range. On a
  shared machine the pytest-benchmark times drift; the paired ratio is the figure to read.

Every benchmark first checks its result (exact int32 product; the layer against float64).
Shapes: ``KERNELBENCH_BENCH_D`` (default ``768,2048``), ``KERNELBENCH_BENCH_TOKENS`` (default
``1,32,2048``), layers ``KERNELBENCH_BENCH_LAYERS`` (default ``ffn1,ffn2``). Run e.g.
``pytest tests/bench/test_vs_onednn.py --benchmark-group-by=group --benchmark-columns=median``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import pytest
import torch

from kernelbench import oracle
from kernelbench.backends import get_backend
from kernelbench.kernels import cpu_ext
from kernelbench.quant import QuantConfig

pytestmark = pytest.mark.skipif(
    not cpu_ext.available(), reason=cpu_ext.IMPORT_ERROR or "no CPU kernels"
)

LAYERS = {"ffn1": (1, 4), "ffn2": (4, 1)}  # (k, n) in units of d
D_MODELS = [int(v) for v in os.environ.get("KERNELBENCH_BENCH_D", "768,2048").split(",")]
TOKENS = [int(v) for v in os.environ.get("KERNELBENCH_BENCH_TOKENS", "1,32,2048").split(",")]
LAYER_NAMES = os.environ.get("KERNELBENCH_BENCH_LAYERS", "ffn1,ffn2").split(",")
PAIRS = 9
SHAPES = [
    pytest.param(layer, d, m, id=f"{layer}-d{d}-m{m}")
    for layer in LAYER_NAMES
    for d in D_MODELS
    for m in TOKENS
]


def paired_ratio(ours: Callable[[], object], other: Callable[[], object]) -> dict[str, float]:
    """Median and quartiles of time(ours) / time(other), the calls alternated A B B A ..."""
    ours(), other()
    ratios = []
    for i in range(PAIRS):
        order = (ours, other) if i % 2 == 0 else (other, ours)
        took = {}
        for f in order:
            t0 = time.perf_counter()
            f()
            took[f] = time.perf_counter() - t0
        ratios.append(took[ours] / took[other])
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    return {"ratio_median": med, "ratio_q1": q1, "ratio_q3": q3, "pairs": PAIRS}


def operands(layer: str, d: int, m: int):
    kf, nf = LAYERS[layer]
    k, n = kf * d, nf * d
    gen = torch.Generator().manual_seed(d * 31 + m)
    x = torch.randn(m, k, generator=gen)
    x[:, torch.arange(4) * (k // 4)] -= 40.0  # four outlier dims (App. C: one-sided, ~-40)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    return x.to(torch.bfloat16), w.to(torch.bfloat16), k, n


def int8_operands(d: int, m: int, k: int, n: int):
    gen = torch.Generator().manual_seed(d * 17 + m)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    return a, w


def _info(benchmark, layer, d, m, k, n, **extra) -> None:
    benchmark.group = f"{layer} d={d} m={m}"
    benchmark.extra_info.update(
        layer=layer, d=d, m=m, k=k, n=n, threads=torch.get_num_threads(), isa=cpu_ext.isa(), **extra
    )


@pytest.mark.parametrize(("layer", "d", "m"), SHAPES)
def test_custom_int8_raw(benchmark, layer, d, m):
    _, _, k, n = operands(layer, d, m)
    a, w = int8_operands(d, m, k, n)
    packed, w_kn = cpu_ext.pack_weight(w), w.t()
    ours = lambda: cpu_ext.gemm(a, packed, n)  # noqa: E731
    onednn = lambda: torch._int_mm(a, w_kn)  # noqa: E731
    assert torch.equal(ours(), onednn())
    _info(benchmark, layer, d, m, k, n, vs="onednn-int8_raw", **paired_ratio(ours, onednn))
    benchmark(ours)


@pytest.mark.parametrize(("layer", "d", "m"), SHAPES)
def test_onednn_int8_raw(benchmark, layer, d, m):
    _, _, k, n = operands(layer, d, m)
    a, w = int8_operands(d, m, k, n)
    w_kn = w.t()
    _info(benchmark, layer, d, m, k, n)
    benchmark(torch._int_mm, a, w_kn)


@pytest.mark.parametrize(("layer", "d", "m"), SHAPES)
def test_bf16(benchmark, layer, d, m):
    x, w, k, n = operands(layer, d, m)
    _info(benchmark, layer, d, m, k, n)
    benchmark(torch.matmul, x, w.t())


@pytest.mark.parametrize(("layer", "d", "m"), SHAPES)
def test_custom_llm_int8(benchmark, layer, d, m):
    x, w, k, n = operands(layer, d, m)
    runner = get_backend("custom").runner("llm_int8", x, w, None, QuantConfig())
    err = oracle.rel_frobenius(runner.run(), oracle.exact(x, w))
    assert runner.outlier_cols == 4 and err < 0.05
    w_t = w.t()
    ratio = paired_ratio(runner.run, lambda: torch.matmul(x, w_t))
    _info(benchmark, layer, d, m, k, n, vs="bf16", rel_error=err, **ratio)
    benchmark(runner.run)
