"""CUDA extension, cublaslt backend and CustomCudaOps.

CPU part: argument checks (raised before any GPU work) and availability reasons.
CPU part: the calls made into the extension, with a recording stand-in for it.
GPU part (``-m gpu``): exact int32 products, each stage against kernelbench.quant / the float64
oracle, poisoned output buffers, odd (padded) and misaligned shapes. The GPU tests have not run
on a GPU yet.
"""

from __future__ import annotations

import contextlib

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


def test_gemm_rejects_k_beyond_the_int32_accumulator():
    k = 133152  # a multiple of 16 above 133144: k * 127^2 may overflow int32
    with pytest.raises(InputError, match="k must be <= 133144"):
        cuda_ext.int8_gemm(_i8(1, k), _i8(16, k))


class _RecordingExtension:
    """Stands in for kernelbench._cuda: records every call, runs nothing."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, args))


@pytest.fixture
def recorded(monkeypatch):
    ext = _RecordingExtension()
    monkeypatch.setattr(cuda_ext, "_ext", ext)
    monkeypatch.setattr(cuda_ext, "_check_device", lambda pairs: torch.device("cpu"))
    monkeypatch.setattr(cuda_ext, "_stream", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    return ext


def test_quantize_rows_without_rows_makes_no_call(recorded):
    """Zero rows but outlier columns (an empty batch with kept rows): the empty results, no
    call into the extension (whose null-pointer check would raise on the empty outputs)."""
    x = torch.zeros(0, 16, dtype=torch.float16)
    mask = torch.zeros(16, dtype=torch.uint8)
    mask[[3, 5]] = 1
    q, amax, vals = cuda_ext.quantize_rows(x, mask, torch.tensor([3, 5]))
    assert (q.shape, amax.shape, vals.shape) == ((0, 16), (0,), (0, 2))
    assert recorded.calls == []


@pytest.mark.parametrize("col,safe", [((1.0, 2.0, 0.0), True), ((1.0, 1e-38, 1.0), False)])
def test_dequantize_tells_the_kernel_whether_columns_are_safe(recorded, col, safe):
    """A column absmax outside [2^-32, 2^32] sends every row to the fp64 scale (as quant.py)."""
    acc = torch.ones(2, 3, dtype=torch.int32)
    cuda_ext.dequantize(acc, torch.ones(2), torch.tensor(col), None, None, torch.float16)
    ((name, args),) = recorded.calls
    assert name == "dequantize" and args[-2] is safe
    w = torch.tensor(col).view(3, 1).repeat(1, 4).bfloat16()
    pw = CustomCudaOps().prepare(quant.prepare_weight(w, None, QuantConfig()))
    assert pw.cols_safe is safe


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


def test_supports_any_shape_within_int32():
    ops = CustomCudaOps()
    assert ops.supports(torch.float16, 8, 64, 64)
    assert ops.supports(torch.float16, 8, 20, 33)  # padded to (32, 48)
    assert ops.padded_shape(20, 33).describe() == "padded k 20->32, n 33->48"
    why = ops.supports(torch.float16, 8, 133145, 64)
    assert not why and "int32" in why.reason
    why = ops.supports(torch.float32, 8, 64, 64)
    assert not why and "float16/bfloat16" in why.reason


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
@pytest.mark.parametrize("name", ["cublaslt", "custom"])
@pytest.mark.parametrize("method", ["int8_raw", "vectorwise", "llm_int8"])
@pytest.mark.parametrize("cmp", [">", ">="])
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (40, 256, 128), (257, 1024, 512), (7, 100, 37)])
def test_gpu_backend_methods_match_oracle(name, method, cmp, m, k, n):
    gen = torch.Generator().manual_seed(m + 3 * k + 5 * n)
    x = torch.randn(m, k, generator=gen)
    x[:, 5] *= 12  # an outlier column
    w = torch.randn(n, k, generator=gen) / k**0.5
    bias = torch.randn(n, generator=gen)
    x, w, bias = (t.half().cuda() for t in (x, w, bias))
    cfg = QuantConfig(alpha=6.0, outlier_cmp=cmp)
    kept = torch.tensor([5], dtype=torch.int64)
    be = get_backend(name)
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
@pytest.mark.parametrize("m,k,n", [(8, 20, 33), (3, 5140, 17), (1, 1, 1)])
def test_gpu_odd_shapes_are_padded_exactly(m, k, n):
    ops = CustomCudaOps()
    gen = torch.Generator().manual_seed(k + n)
    pw = ops.prepare(quant.prepare_weight(torch.randn(n, k, generator=gen).half().cuda(), None,
                                          QuantConfig()))  # fmt: skip
    a = _rand_i8(m, k, gen=gen)
    want = oracle.int_product(a.cpu(), pw.int8_columns(torch.arange(k, device="cuda")).cpu())
    assert torch.equal(ops.int8_matmul(a, pw).cpu().to(torch.int64), want)
    with pytest.raises(InputError, match="multiples of 16"):  # the raw GEMM keeps its rule
        cuda_ext.int8_gemm(a, quant.prepare_weight(torch.ones(n, k).half().cuda(), None,
                                                   QuantConfig()).int8)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["cublaslt", "custom"])
def test_gpu_tiny_absmax_row_matches_oracle(name):
    """A row with absmax 1e-38 (127/absmax overflows float32): the oracle's answer."""
    gen = torch.Generator().manual_seed(38)
    x = torch.randn(4, 64, generator=gen)
    x[1] = x[1] * 1e-38 / x[1].abs().amax()
    x = x.bfloat16().cuda()
    w = (torch.randn(32, 64, generator=gen) / 8).bfloat16().cuda()
    cfg = QuantConfig()
    y = get_backend(name).runner("vectorwise", x, w, None, cfg).run()
    ref = oracle.emulate("vectorwise", x, w, None, cfg.without_decomposition())
    for i in range(4):
        assert oracle.rel_frobenius(y[i], ref[i]) < 2e-2, i


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
    except RuntimeError as exc:  # only cuBLASLt saying "not supported" is a skip
        if "NOT_SUPPORTED" not in str(exc) and "no algorithm" not in str(exc):
            raise
        pytest.skip(f"cuBLASLt outer-vector scaling with int8 not supported here: {exc}")
    acc = oracle.int_product(a.cpu(), b.cpu()).double()
    ref = acc * sa.cpu().double()[:, None] * sb.cpu()
    if oracle.rel_frobenius(y, acc) < 1e-6:
        pytest.skip("cuBLASLt accepted the outer-vector scale mode for int8 but ignored it")
    assert oracle.rel_frobenius(y, ref) < 1e-5
