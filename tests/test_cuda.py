"""CUDA extension, cublaslt backend and CustomCudaOps.

CPU part: argument checks (raised before any GPU work) and availability reasons.
GPU part (``-m gpu``): exact int32 products, each stage against kernelbench.quant / the float64
oracle, poisoned output buffers, odd and misaligned shapes. The GPU tests were written without a
GPU and have not been run yet.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench import cuda_ext, oracle, quant
from kernelbench.backends import all_backends, get_backend
from kernelbench.backends.custom_cuda import CustomCudaOps
from kernelbench.checks import InputError
from kernelbench.quant import QuantConfig

# --- CPU: argument checks and availability ------------------------------------------------


def _i8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int8)


def test_gemm_rejects_bad_dtype():
    with pytest.raises(InputError, match="int8"):
        cuda_ext.int8_gemm(torch.zeros(32, 32), _i8(32, 32))


def test_gemm_rejects_k_not_multiple_of_16():
    with pytest.raises(InputError, match="multiples of 16.*k=20"):
        cuda_ext.int8_gemm(_i8(4, 20), _i8(32, 20))


def test_gemm_rejects_n_not_multiple_of_16():
    with pytest.raises(InputError, match="n=24"):
        cuda_ext.int8_gemm(_i8(4, 32), _i8(24, 32))


def test_gemm_rejects_shape_mismatch_and_noncontiguous():
    with pytest.raises(InputError, match="shape mismatch"):
        cuda_ext.int8_gemm(_i8(4, 32), _i8(32, 48))
    with pytest.raises(InputError, match="contiguous"):
        cuda_ext.int8_gemm(_i8(32, 4).t(), _i8(32, 32))


def test_gemm_rejects_misaligned_pointer():
    buf = _i8(4 * 32 + 1)
    a = buf[1:].view(4, 32)
    assert a.data_ptr() % 16 != 0
    with pytest.raises(InputError, match="16-byte aligned"):
        cuda_ext.int8_gemm(a, _i8(32, 32))


def test_gemm_rejects_cpu_tensors_after_shape_checks():
    with pytest.raises(InputError, match="CUDA device"):
        cuda_ext.int8_gemm(_i8(4, 32), _i8(32, 32))


def test_quantize_and_dequantize_argument_checks():
    with pytest.raises(InputError, match="float16/bfloat16"):
        cuda_ext.detect_outliers(torch.zeros(4, 8), 6.0, ">")
    with pytest.raises(InputError, match="cmp"):
        cuda_ext.detect_outliers(torch.zeros(4, 8, dtype=torch.float16), 6.0, ">>")
    with pytest.raises(InputError, match="CUDA device"):
        cuda_ext.detect_outliers(torch.zeros(4, 8, dtype=torch.float16), 6.0, ">")
    with pytest.raises(InputError, match="needs the mask"):
        cuda_ext.quantize_rows(
            torch.zeros(4, 8, dtype=torch.float16), None, torch.tensor([1], dtype=torch.int64)
        )
    acc = torch.zeros(4, 8, dtype=torch.int32)
    ones4, ones8 = torch.ones(4), torch.ones(8)
    with pytest.raises(InputError, match="acc must be int32"):
        cuda_ext.dequantize(acc.float(), ones4, ones8, None, None, torch.float16)
    with pytest.raises(InputError, match="col_absmax must have shape"):
        cuda_ext.dequantize(acc, ones4, ones4, None, None, torch.float16)
    with pytest.raises(InputError, match="out_dtype"):
        cuda_ext.dequantize(acc, ones4, ones8, None, None, torch.float32)
    with pytest.raises(InputError, match="bias must be float32"):
        cuda_ext.dequantize(acc, ones4, ones8, ones8.half(), None, torch.float16)


def test_custom_cuda_ops_is_not_a_registered_backend():
    assert "custom_cuda" not in all_backends()
    assert "cublaslt" in all_backends()


def test_supports_names_the_shape_rule():
    ops = CustomCudaOps()
    assert ops.supports(torch.float16, 8, 64, 64)
    why = ops.supports(torch.float16, 8, 20, 64)
    assert not why and "multiples of 16" in why.reason
    assert not ops.supports(torch.float32, 8, 64, 64)


@pytest.mark.skipif(
    torch.cuda.is_available() and cuda_ext.extension_built(), reason="CUDA kernels are usable here"
)
def test_availability_reason_on_this_machine():
    be = get_backend("cublaslt")
    for dev in ("cuda", "cpu"):
        avail = be.availability(torch.device(dev))
        assert not avail
        assert any(w in avail.reason for w in ("CPU build", "no CUDA device", "not built"))
    assert not be.supports("llm_int8", torch.device("cuda"), torch.float16, 8, 64, 64)
    if not cuda_ext.extension_built():
        assert "kernelbench._cuda" in cuda_ext.unavailable_reason()
        with pytest.raises(InputError):  # the checks still come first
            cuda_ext.int8_gemm(_i8(4, 20), _i8(32, 20))


def test_cpu_device_is_never_available():
    avail = get_backend("cublaslt").availability(torch.device("cpu"))
    assert not avail and "CUDA devices only" in avail.reason


# --- GPU ----------------------------------------------------------------------------------

SENTINEL_I32 = -(2**31) + 7


def _rand_i8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen).cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("m,k,n", [(1, 16, 16), (17, 64, 32), (333, 1024, 48), (128, 4096, 1024)])
def test_gpu_int8_gemm_exact(m, k, n):
    gen = torch.Generator().manual_seed(m * 7 + k + n)
    a, b = _rand_i8(m, k, gen=gen), _rand_i8(n, k, gen=gen)
    out = torch.full((m, n), SENTINEL_I32, dtype=torch.int32, device="cuda")
    cuda_ext.int8_gemm(a, b, out=out)
    ref = oracle.int_product(a.cpu(), b.cpu())
    assert torch.equal(out.cpu().to(torch.int64), ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_int8_gemm_extremes_and_empty():
    k = 4096
    a = torch.full((32, k), -127, dtype=torch.int8, device="cuda")
    b = torch.full((16, k), -127, dtype=torch.int8, device="cuda")
    assert bool((cuda_ext.int8_gemm(a, b) == 127 * 127 * k).all())
    assert cuda_ext.int8_gemm(a[:0], b).shape == (0, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cmp", [">", ">="])
@pytest.mark.parametrize("m,k", [(1, 8), (5, 7), (64, 1024), (300, 4104), (0, 16)])
def test_gpu_detect_and_quantize_match_quant(dtype, cmp, m, k):
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_quantize_misaligned_input_takes_scalar_path():
    buf = torch.randn(1 + 32 * 64, dtype=torch.float16, device="cuda")
    x = buf[1:].view(32, 64)
    assert x.data_ptr() % 16
    cols = torch.zeros(0, dtype=torch.int64, device="cuda")
    q, amax, _ = cuda_ext.quantize_rows(x, None, cols)
    ref = quant.quantize_activation(x, cols)
    assert torch.equal(q, ref.int8) and torch.equal(amax, ref.absmax)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(1, 8), (3, 5), (77, 1024), (128, 1000)])
@pytest.mark.parametrize("with_bias,with_outlier", [(False, False), (True, True), (True, False)])
def test_gpu_dequantize_matches_quant(dtype, m, n, with_bias, with_outlier):
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["int8_raw", "vectorwise", "llm_int8"])
@pytest.mark.parametrize("cmp", [">", ">="])
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (40, 256, 128), (257, 1024, 512)])
def test_gpu_backend_methods_match_oracle(method, cmp, m, k, n):
    gen = torch.Generator().manual_seed(m + 3 * k + 5 * n)
    x = torch.randn(m, k, generator=gen)
    x[:, 5] *= 12  # an outlier column
    w = torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen)
    x, w, bias = (t.half().cuda() for t in (x, w, bias))
    cfg = QuantConfig(alpha=6.0, outlier_cmp=cmp)
    kept = torch.tensor([5], dtype=torch.int64)
    be = get_backend("cublaslt")
    assert be.supports(method, torch.device("cuda"), torch.float16, m, k, n), be.availability(
        torch.device("cuda")
    ).reason
    runner = be.runner(method, x, w, bias, cfg, kept.cuda())
    y = runner.run()
    ref = oracle.emulate(method, x, w, bias, cfg, kept)
    if method == "int8_raw":
        assert y.dtype == torch.int32
        # fp32 vs float64 scale rounding may move a quantized value by one step at most
        assert oracle.rel_frobenius(y, ref) < 1e-3
    else:
        assert y.dtype == torch.float16 and y.shape == (m, n)
        assert oracle.rel_frobenius(y, ref) < 2e-3
        torch_y = get_backend("torch").runner(method, x, w, bias, cfg, kept.cuda()).run()
        assert oracle.rel_frobenius(y, torch_y) < 2e-3
    for name, stage in runner.stages.items():
        assert stage() is not None, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_odd_shapes_rejected_with_input_error():
    ops = CustomCudaOps()
    x = torch.randn(8, 20, dtype=torch.float16, device="cuda")
    w = torch.randn(32, 20, dtype=torch.float16, device="cuda")
    pw = quant.prepare_weight(w, None, QuantConfig())
    qa = ops.quantize(x, pw, QuantConfig())  # quantize handles any k
    with pytest.raises(InputError, match="multiples of 16"):
        ops.int8_matmul(qa.int8, pw)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_outer_scaled_gemm_experimental():
    gen = torch.Generator().manual_seed(0)
    a, b = _rand_i8(64, 128, gen=gen), _rand_i8(32, 128, gen=gen)
    sa = torch.rand(64, generator=gen).cuda()
    sb = torch.rand(32, generator=gen).cuda()
    try:
        y = cuda_ext.int8_gemm_outer_scaled(a, b, sa, sb, torch.float32)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        pytest.skip(f"cuBLASLt outer-vector scaling with int8 not supported here: {exc}")
    ref = oracle.int_product(a.cpu(), b.cpu()).double() * sa.cpu().double()[:, None] * sb.cpu()
    assert oracle.rel_frobenius(y, ref) < 1e-5
