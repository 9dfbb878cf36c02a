"""Any shape on every CUDA int8 path: zero padding of k and n (kernelbench.kernels.padding), on CPU.

The CUDA kernels cannot run here, so each backend's GEMM (cuBLASLt, CUTLASS, ``torch._int_mm``)
is replaced by a CPU stand-in that enforces the kernel's own shape rule (k, n multiples of 16 or
8) and computes the exact product; everything around it (padding the weight once, the
activation's k tail per call, dropping the extra output columns, the epilogue vectors) is the
backends' real code. Results must equal the unpadded product exactly and match the float64
oracle like any other row.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench import oracle, quant
from kernelbench.backends import get_backend
from kernelbench.backends.base import (
    SMOOTHQUANT_VARIANT,
    Availability,
    join_variants,
    method_config,
)
from kernelbench.backends.cublaslt import CublasLtBackend
from kernelbench.backends.custom_cuda import CustomCudaOps
from kernelbench.backends.cutlass import CutlassBackend, CutlassWeight
from kernelbench.kernels import cuda_ext, cutlass_ext, padding
from kernelbench.quant import QuantConfig

CUDA = torch.device("cuda")
#: GPT-3 13B as printed (d = 5140): ffn1 (k, n) = (d, 4d), ffn2 = (4d, d).
D13B = 5140
ODD = [(1, 1, 1), (3, 13, 7), (17, 31, 5140), (2, 5140, 37), (5, 127, 4099)]


def _gemm_standin(multiple: int):
    """The kernel's shape rule, then the exact product (int64 -> int32)."""

    def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k, n = a.shape[1], b.shape[0]
        assert b.shape[1] == k
        assert k % multiple == 0 and n % multiple == 0, (k, n)
        return oracle.int_product(a, b).to(torch.int32)

    return gemm


def _rand_i8(gen, *shape):
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen)


# --- shape rules --------------------------------------------------------------------------


def _as_if_on_a_gpu(monkeypatch, backend):
    """The backend's rules with its device availability answered yes (no GPU here)."""
    monkeypatch.setattr(backend, "availability", lambda device: Availability.yes())
    return backend


@pytest.mark.parametrize("name", ["custom", "cublaslt", "cutlass", "torch"])
@pytest.mark.parametrize("k,n", [(D13B, 4 * D13B), (4 * D13B, D13B), (13, 7), (1, 1)])
def test_every_cuda_backend_accepts_any_shape(monkeypatch, name, k, n):
    be = _as_if_on_a_gpu(monkeypatch, get_backend(name))
    for method in ("int8_raw", "llm_int8", "smoothquant"):
        avail = be.supports(method, CUDA, torch.float16, 2048, k, n)
        assert avail, f"{name} {method} k={k} n={n}: {avail.reason}"


@pytest.mark.parametrize("name", ["custom", "cublaslt", "cutlass", "torch"])
def test_cuda_shape_rules_still_reject_int32_overflow(monkeypatch, name):
    be = _as_if_on_a_gpu(monkeypatch, get_backend(name))
    avail = be.supports("llm_int8", CUDA, torch.float16, 8, padding.MAX_K + 1, 64)
    assert not avail and "int32" in avail.reason


def test_padded_shape_and_description():
    s = padding.padded_shape(D13B, 4 * D13B, 16)
    assert (s.k_padded, s.n_padded) == (5152, 20560) and s.padded
    assert s.describe() == "padded k 5140->5152, n 20560"
    assert padding.padded_shape(64, 32, 16).describe() == ""
    assert padding.max_k(16) % 16 == 0 and padding.max_k(16) <= padding.MAX_K == 133144
    assert "k must be <=" in padding.shape_rule(padding.max_k(16) + 1, 16, 16)


# --- exactness of pad / unpad -------------------------------------------------------------


@pytest.mark.parametrize("m,k,n", ODD)
@pytest.mark.parametrize("multiple", [8, 16])
def test_padded_gemm_is_exact(m, k, n, multiple):
    gen = torch.Generator().manual_seed(m * 7 + k * 3 + n)
    a, w = _rand_i8(gen, m, k), _rand_i8(gen, n, k)
    w_p = padding.pad_weight(w, padding.padded_shape(k, n, multiple))
    assert torch.equal(w_p[:n, :k], w) and int(w_p.abs().sum()) == int(w.abs().sum())
    acc = padding.padded_gemm(a, w_p, n, _gemm_standin(multiple))
    assert acc.shape == (m, n) and acc.is_contiguous()
    assert torch.equal(acc.to(torch.int64), oracle.int_product(a, w))


@pytest.mark.parametrize("m,k,n", ODD)
def test_custom_cuda_int8_matmul_pads_exactly(m, k, n):
    gen = torch.Generator().manual_seed(m + k + n)
    ops = CustomCudaOps(gemm=_gemm_standin(cuda_ext.GEMM_DIM_MULTIPLE))
    w = torch.randn(n, k, generator=gen).to(torch.float16)
    pw = ops.prepare(quant.prepare_weight(w, None, QuantConfig()))
    assert pw.int8 is None  # one int8 copy kept: the padded one
    a = _rand_i8(gen, m, k)
    want = oracle.int_product(a, pw.int8_columns(torch.arange(k)))
    assert torch.equal(ops.int8_matmul(a, pw).to(torch.int64), want)


def test_torch_int_mm_on_cuda_is_padded_to_8(monkeypatch):
    """The torch backend's int8 stage on a padded weight, with ``_int_mm``'s CUDA rule."""
    from kernelbench.backends import torch_ops

    monkeypatch.setattr(torch_ops, "int_mm", _gemm_standin(torch_ops.CUDA_DIM_MULTIPLE))
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(37, 5140, generator=gen).to(torch.float16)
    pw = padding.pad_prepared(quant.prepare_weight(w, None, QuantConfig()), 8)
    assert pw.gemm_int8.shape == (40, 5144)
    a = _rand_i8(gen, 3, 5140)
    got = torch_ops.BACKEND.int8_matmul(a, pw)
    assert torch.equal(
        got.to(torch.int64), oracle.int_product(a, pw.int8_columns(torch.arange(5140)))
    )


@pytest.mark.parametrize("method", ["int8_raw", "vectorwise", "llm_int8", "smoothquant"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 13, 31), (3, 5140, 17), (33, 97, 5140)])
def test_cublaslt_backend_any_shape_matches_oracle(check_oracle, gen_outliers, method, m, k, n):
    """The whole ``cublaslt`` pipeline (torch-op quantize/dequantize around the padded GEMM) on
    CPU tensors with the stand-in GEMM: the runner's answer vs the float64 oracle (SmoothQuant:
    the vector-wise oracle on the smoothed operands, ``x / s`` and ``w * s``)."""
    gen = torch.Generator().manual_seed(m * 31 + k + n)
    x, _ = gen_outliers(gen, m, k, n_outlier_dims=min(2, k), dtype=torch.float16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.float16)
    bias = torch.randn(n, generator=gen).to(torch.float16)
    cfg = QuantConfig()
    kept = torch.tensor([0], dtype=torch.int64)
    be = CublasLtBackend(gemm=_gemm_standin(cuda_ext.GEMM_DIM_MULTIPLE))
    r = be.runner(method, x, w, bias, cfg, kept)
    padded = padding.padded_shape(k, n, 16).describe()
    if method == "smoothquant":  # the method's note, then the padded shape
        assert r.variant == join_variants(SMOOTHQUANT_VARIANT, padded)
    else:
        assert r.variant == padded
    y = r.run()
    if method == "int8_raw":
        a, b = r.operands
        assert torch.equal(y.to(torch.int64), oracle.int_product(a, b))
        return
    assert y.shape == (m, n) and y.dtype == torch.float16
    mcfg = method_config(method, cfg)
    check_oracle(y, method, x, w, bias, mcfg, kept, what=f"cublaslt {m}x{k}x{n}")


def _fused_standin(a, b, row, col, bias, outlier, out_dtype):
    """The CUTLASS kernel's rule and its fp32 epilogue: acc * row * col + bias + outlier."""
    why = cutlass_ext.check_shape_rule(a.shape[0], a.shape[1], b.shape[0])
    assert why is None, why
    y = oracle.int_product(a, b).to(torch.float32) * (row[:, None] * col[None, :])
    if bias is not None:
        y = y + bias
    if outlier is not None:
        y = y + outlier
    return y.to(out_dtype)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (9, 13, 31), (4, 5140, 23), (3, 41, 5140)])
def test_cutlass_fused_pads_exactly(check_oracle, gen_outliers, m, k, n):
    gen = torch.Generator().manual_seed(m + 5 * k + n)
    x, _ = gen_outliers(gen, m, k, n_outlier_dims=min(2, k), dtype=torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    cfg = QuantConfig()
    be = CutlassBackend(fused_kernel=_fused_standin)
    pw = be.prepare_weight(w, bias, cfg)
    assert isinstance(pw, CutlassWeight) and pw.col_scale.shape == pw.gemm_int8.shape[:1]
    qa = quant.quantize_activation(x, quant.decomposition_columns(x, pw, cfg))
    outl = be.outlier_product(qa, pw)
    y = be.fused(qa, pw, outl)
    # the same epilogue on the unpadded operands: padding changes nothing, bit for bit
    plain = quant.prepare_weight(w, bias, cfg)
    col = cutlass_ext.col_scale(plain.absmax)
    want = oracle.int_product(qa.int8, plain.int8).to(torch.float32) * (qa.absmax[:, None] * col)
    want = want + bias.float()
    if outl is not None:
        want = want + outl
    assert torch.equal(y, want.to(torch.bfloat16))
    check_oracle(y, "llm_int8", x, w, bias, cfg, None, what=f"cutlass {m}x{k}x{n}")


def _quantize_standin(x, pw, cfg):
    """The CUDA quantize kernel's result (tests/test_gpu_kernels.py holds the kernel to it bit
    for bit): :mod:`kernelbench.quant`'s reference quantization."""
    return quant.quantize_activation(x, quant.decomposition_columns(x, pw, cfg))


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (9, 13, 31), (4, 5140, 23), (33, 96, 64)])
def test_cutlass_smoothquant_runner_matches_the_smoothed_oracle(
    monkeypatch, check_oracle, gen_outliers, m, k, n
):
    """``cutlass`` SmoothQuant on CPU tensors, with stand-ins for the two CUDA kernels (the
    quantize kernel and the fused GEMM): the runner prepares ``w * s`` padded, divides ``x`` by
    ``s`` in the call and runs the fused path; its output equals the fused path on the smoothed
    operands bit for bit and meets the vector-wise oracle on them."""
    gen = torch.Generator().manual_seed(3 * m + k + 7 * n)
    x, _ = gen_outliers(gen, m, k, n_outlier_dims=min(2, k), dtype=torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    cfg = QuantConfig()
    be = CutlassBackend(fused_kernel=_fused_standin)
    monkeypatch.setattr(be.ops, "quantize", _quantize_standin)
    r = be.runner("smoothquant", x, w, bias, cfg)
    assert r.variant == join_variants(SMOOTHQUANT_VARIANT, be.ops.padded_shape(k, n).describe())
    y = r.run()
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    _, xs, ws = quant.smoothed_operands(x, w)
    plain = cfg.without_decomposition()
    assert torch.equal(y, be.linear(xs, be.prepare_weight(ws, bias, plain), plain))
    check_oracle(y, "smoothquant", x, w, bias, plain, None, what=f"cutlass sq {m}x{k}x{n}")
