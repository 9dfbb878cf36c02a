"""The float64 oracle: the exact layer, and every method's math emulated in float64.

* :func:`exact` is ``x @ w.T + bias`` in float64: the truth every method's error is measured
  against (relative Frobenius norm, :func:`rel_frobenius`).
* :func:`emulate` runs a method's quantization math (:mod:`kernelbench.quant`, the same code the
  backends use or are checked against) in float64 with an exact integer product: what a correct
  implementation of that method computes, up to float32 rounding of its scales.
"""

from __future__ import annotations

import torch

from kernelbench import quant
from kernelbench.core import ACCURACY_VARIANTS, ALL_METHODS
from kernelbench.quant import Problem

F64 = torch.float64


def exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = quant.float64_product(x, weight)
    return y + bias.to(F64) if bias is not None else y


def int_product(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """Exact int8 x int8 product (int64), the reference for every int32 GEMM
    (:func:`~kernelbench.quant.exact_int_product`)."""
    return quant.exact_int_product(a, b_nk).to(torch.int64)


def rel_frobenius(y: torch.Tensor, ref: torch.Tensor) -> float:
    """``||y - ref||_F / ||ref||_F`` in float64 (absolute norm when ``ref`` is all zero)."""
    diff = torch.linalg.vector_norm(y.to(F64) - ref.to(F64))
    denom = torch.linalg.vector_norm(ref.to(F64))
    return float(diff / denom) if denom > 0 else float(diff)


def max_abs_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.to(F64) - ref.to(F64)).abs().max()) if y.numel() else 0.0


def emulate(problem: Problem) -> torch.Tensor:
    """Float64 result of ``problem`` (``int8_raw``: the exact int64 product of the vector-wise
    int8 operands, zero outlier columns)."""
    method = problem.method
    if method not in ALL_METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(ALL_METHODS)}")
    p = problem.cpu()
    x, weight, bias, cfg = p.x, p.weight, p.bias, p.cfg
    if method in ACCURACY_VARIANTS:
        return quant.variant_forward(method, x, weight, bias, cfg, compute_dtype=F64)
    if method in ("fp32", "fp16"):
        return exact(x, weight, bias)
    if method in ("absmax_torch", "vectorwise_torch"):
        scheme = quant.quantize_tensorwise if method == "absmax_torch" else quant.quantize_rowwise
        xq, xa = scheme(x, F64)
        wq, wa = scheme(weight, F64)
        if method == "absmax_torch":
            xa, wa = xa.expand(x.shape[0]), wa.expand(weight.shape[0])
        y = quant.dequantize_outer(int_product(xq, wq), xa, wa, F64)
        return y + bias.to(F64) if bias is not None else y
    mcfg = p.method_cfg
    pw = quant.prepare_weight(weight, bias, mcfg, p.method_kept_rows, compute_dtype=F64)
    cols = quant.decomposition_columns(x, pw, mcfg)
    qa = quant.quantize_activation(x, cols, F64)
    acc = int_product(qa.int8, pw.int8)
    if method == "int8_raw":
        return acc
    outl = quant.outlier_product(qa, pw, F64)
    return quant.dequantize(acc, qa, pw, outl, F64, out_dtype=F64)
