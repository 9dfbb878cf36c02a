"""Kernel behaviour below the backends that only a GPU shows (skipped without one).

The backends' contracts on CUDA are the contract tests run with ``device=cuda``
(tests/test_backends.py, tests/test_inputs.py). Here: every element of a poisoned output buffer
is written (cuBLASLt GEMM, outlier detection and quantization, dequantization, the CUTLASS fused
GEMM on each tile); the dequantize kernel keeps ``kernelbench.quant``'s operation order bit for
bit; the CUTLASS epilogue is within 16-bit rounding of float64; the raw kernels keep their shape
and alignment rules on device tensors; cuBLASLt's outer-vector scaling may be NOT_SUPPORTED.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench import oracle, quant
from kernelbench.checks import InputError
from kernelbench.kernels import cuda_ext, cutlass_ext
from kernelbench.quant import DEQUANT_CONSTANT

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(
    cuda_ext.unavailable_reason() is not None,
    reason=f"CUDA kernels unusable here: {cuda_ext.unavailable_reason()}",
)
needs_cutlass = pytest.mark.skipif(
    cutlass_ext.unavailable_reason() is not None,
    reason=f"CUTLASS kernels unusable here: {cutlass_ext.unavailable_reason()}",
)
SENTINEL_I32 = -(2**31) + 7


def _rand_i8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen).cuda()


# --- kernelbench._cuda --------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("m,k,n", [(1, 16, 16), (17, 64, 32), (333, 1024, 48), (128, 4096, 1024)])
def test_int8_gemm_writes_every_output(m, k, n):
    gen = torch.Generator().manual_seed(m * 7 + k + n)
    a, b = _rand_i8(m, k, gen=gen), _rand_i8(n, k, gen=gen)
    out = torch.full((m, n), SENTINEL_I32, dtype=torch.int32, device="cuda")
    cuda_ext.int8_gemm(a, b, out=out)
    assert torch.equal(out.cpu().to(torch.int64), oracle.int_product(a.cpu(), b.cpu()))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cmp", [">", ">="])
@pytest.mark.parametrize("m,k", [(1, 8), (5, 7), (64, 1024), (300, 4104), (0, 16)])
def test_detect_and_quantize_write_every_output(dtype, cmp, m, k):
    """Outlier columns (a kept column forced in), then the row quantization into poisoned
    buffers: kernelbench.quant's result in float32 bit for bit, within one step of float64."""
    gen = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=gen) * 2
    if m:
        x[0, k // 2] = 6.0  # exactly alpha: an outlier for '>=' only
        x[m - 1, k - 1] = -9.0
    x = x.to(dtype).cuda()
    kept = torch.tensor([0], dtype=torch.int64, device="cuda")
    cols, mask = cuda_ext.detect_outliers(x, 6.0, cmp, kept)
    ref_mask = quant.outlier_mask(x, 6.0, cmp)
    ref_mask[0] = True
    assert torch.equal(cols.cpu(), ref_mask.nonzero().flatten().cpu())
    assert torch.equal(mask.bool().cpu(), ref_mask.cpu())
    q0 = torch.full((m, k), 99, dtype=torch.int8, device="cuda")
    a0 = torch.full((m,), float("nan"), device="cuda")
    v0 = torch.full((m, cols.numel()), float("nan"), dtype=dtype, device="cuda")
    q, amax, vals = cuda_ext.quantize_rows(x, mask, cols, out=(q0, a0, v0))
    ref = quant.quantize_activation(x, cols)  # fp32 on the GPU: same operation order
    assert torch.equal(q, ref.int8)
    assert torch.equal(amax, ref.absmax)
    assert torch.equal(vals, ref.outlier_values)
    ref64 = quant.quantize_activation(x.cpu(), cols.cpu(), torch.float64)
    assert int((q.cpu().int() - ref64.int8.int()).abs().max().item() if m else 0) <= 1


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(1, 8), (3, 5), (77, 1024), (128, 1000)])
@pytest.mark.parametrize("with_bias,with_outlier", [(False, False), (True, True), (True, False)])
def test_dequantize_is_quant_order_bit_for_bit(dtype, m, n, with_bias, with_outlier):
    gen = torch.Generator().manual_seed(m * n)
    acc = torch.randint(-(2**20), 2**20, (m, n), generator=gen, dtype=torch.int32).cuda()
    row = (torch.rand(m, generator=gen) * 4).cuda()
    col = (torch.rand(n, generator=gen) * 4).cuda()
    bias = torch.randn(n, generator=gen).cuda() if with_bias else None
    outl = torch.randn(m, n, generator=gen).cuda() if with_outlier else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    y = cuda_ext.dequantize(acc, row, col, bias, outl, dtype, out=out)
    assert not bool(torch.isnan(y).any()), "some outputs were not written"
    ref = quant.dequantize_outer(acc, row, col)
    if bias is not None:
        ref = ref + bias
    if outl is not None:
        ref = ref + outl
    assert torch.equal(y, ref.to(dtype))


@needs_cuda
def test_raw_gemm_keeps_its_shape_rule_on_device_tensors():
    """k, n off the multiple of 16 are refused before a launch (the backends pad for it)."""
    a = torch.zeros(8, 20, dtype=torch.int8, device="cuda")
    with pytest.raises(InputError, match="multiples of 16"):
        cuda_ext.int8_gemm(a, torch.zeros(33, 20, dtype=torch.int8, device="cuda"))


@needs_cuda
def test_outer_scaled_gemm_or_not_supported():
    """cuBLASLt's outer-vector scale mode with int8: the scaled product, or cuBLASLt's own
    NOT_SUPPORTED / no algorithm (a skip); any other error fails."""
    gen = torch.Generator().manual_seed(0)
    a, b = _rand_i8(64, 128, gen=gen), _rand_i8(32, 128, gen=gen)
    sa = torch.rand(64, generator=gen).cuda()
    sb = torch.rand(32, generator=gen).cuda()
    try:
        y = cuda_ext.int8_gemm_outer_scaled(a, b, sa, sb, torch.float32)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        if "NOT_SUPPORTED" not in str(exc) and "no algorithm" not in str(exc):
            raise
        pytest.skip(f"cuBLASLt outer-vector scaling with int8 not supported here: {exc}")
    acc = oracle.int_product(a.cpu(), b.cpu()).double()
    ref = acc * sa.cpu().double()[:, None] * sb.cpu()
    if oracle.rel_frobenius(y, acc) < 1e-6:
        pytest.skip("cuBLASLt accepted the outer-vector scale mode for int8 but ignored it")
    assert oracle.rel_frobenius(y, ref) < 1e-5


# --- kernelbench._cutlass -----------------------------------------------------------------


def _fused_reference(a, b, row, col_scale, bias, outlier) -> torch.Tensor:
    """float64: exact int product, then the epilogue."""
    y = oracle.int_product(a.cpu(), b.cpu()).double()
    y = y * row.cpu().double()[:, None] * col_scale.cpu().double()[None, :]
    if bias is not None:
        y = y + bias.cpu().double()
    if outlier is not None:
        y = y + outlier.cpu().double()
    return y


def _assert_within_16bit_rounding(y: torch.Tensor, ref: torch.Tensor) -> None:
    """|y - ref| <= 2 ulps of the output dtype at |ref| (fp32 epilogue + one final rounding)."""
    eps = torch.finfo(y.dtype).eps
    tiny = torch.finfo(y.dtype).tiny
    err = (y.cpu().double() - ref).abs()
    tol = 2 * eps * ref.abs() + tiny + 1e-6 * ref.abs().max().clamp(min=1)
    bad = err > tol
    assert not bool(bad.any()), f"{int(bad.sum())} elements off, max err {float(err.max())}"


@needs_cutlass
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tile", ["auto", "small_m", "large"])
@pytest.mark.parametrize(
    "m,k,n", [(1, 16, 16), (17, 64, 32), (64, 256, 128), (333, 1024, 48), (2048, 512, 256)]
)
@pytest.mark.parametrize("with_bias,with_outlier", [(False, False), (True, True), (False, True)])
def test_fused_gemm_on_every_tile_matches_float64(dtype, tile, m, k, n, with_bias, with_outlier):
    gen = torch.Generator().manual_seed(m * 31 + k + n)
    a, b = _rand_i8(m, k, gen=gen), _rand_i8(n, k, gen=gen)
    row = (torch.rand(m, generator=gen) * 4).cuda()
    col = cutlass_ext.col_scale((torch.rand(n, generator=gen) * 2).cuda())
    bias = (torch.randn(n, generator=gen)).cuda() if with_bias else None
    outl = (torch.randn(m, n, generator=gen) * 3).cuda() if with_outlier else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")  # poisoned
    y = cutlass_ext.fused_int8_linear(a, b, row, col, bias, outl, dtype, out=out, tile=tile)
    torch.cuda.synchronize()
    assert y.data_ptr() == out.data_ptr()
    assert not bool(torch.isnan(y).any())
    _assert_within_16bit_rounding(y, _fused_reference(a, b, row, col, bias, outl))


@needs_cutlass
def test_fused_gemm_extremes_and_empty():
    k = 4096
    a = torch.full((32, k), -127, dtype=torch.int8, device="cuda")
    b = torch.full((16, k), -127, dtype=torch.int8, device="cuda")
    row = torch.ones(32, device="cuda")
    col = torch.full((16,), DEQUANT_CONSTANT, device="cuda")
    y = cutlass_ext.fused_int8_linear(a, b, row, col, out_dtype=torch.float16)
    assert torch.allclose(y.float(), torch.full_like(y.float(), float(k)), rtol=1e-3)
    empty = cutlass_ext.fused_int8_linear(a[:0], b, row[:0], col, out_dtype=torch.float16)
    assert empty.shape == (0, 16)


@needs_cutlass
def test_fused_gemm_refuses_a_misaligned_device_pointer():
    misaligned = torch.zeros(1 + 32 * 64, dtype=torch.int8, device="cuda")[1:].view(32, 64)
    with pytest.raises(InputError, match="16-byte aligned"):
        cutlass_ext.fused_int8_linear(
            misaligned,
            torch.zeros(16, 64, dtype=torch.int8, device="cuda"),
            torch.ones(32, device="cuda"),
            torch.ones(16, device="cuda"),
        )
