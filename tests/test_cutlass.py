"""CUTLASS fused int8 GEMM (kernelbench.cutlass_ext) and the ``cutlass`` backend.

CPU part: argument checks (raised before any GPU work) and availability reasons.
GPU part (``-m gpu``): fused output vs the int32 product dequantized in float64, every method
vs ``kernelbench.oracle.emulate``, poisoned output buffers, both tiles, odd shapes padded. The
GPU tests have not run on a GPU yet.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench import cutlass_ext, oracle, quant
from kernelbench.backends import all_backends, get_backend
from kernelbench.backends.base import Availability, method_config
from kernelbench.checks import InputError
from kernelbench.quant import DEQUANT_CONSTANT, QuantConfig

# --- CPU: argument checks and availability ------------------------------------------------


def _args(m=4, k=32, n=32, **over):
    d = dict(
        a=torch.zeros(m, k, dtype=torch.int8),
        b=torch.zeros(n, k, dtype=torch.int8),
        row_absmax=torch.ones(m),
        col_scale=torch.ones(n),
        bias=None,
        outlier=None,
        out_dtype=torch.float16,
    )
    d.update(over)
    return d


def test_rejects_bad_dtypes():
    with pytest.raises(InputError, match="a must be int8"):
        cutlass_ext.fused_int8_linear(**_args(a=torch.zeros(4, 32)))
    with pytest.raises(InputError, match="row_absmax must be float32"):
        cutlass_ext.fused_int8_linear(**_args(row_absmax=torch.ones(4, dtype=torch.float16)))
    with pytest.raises(InputError, match="out_dtype"):
        cutlass_ext.fused_int8_linear(**_args(out_dtype=torch.float32))
    with pytest.raises(InputError, match="bias must be float32"):
        cutlass_ext.fused_int8_linear(**_args(bias=torch.ones(32, dtype=torch.float16)))


@pytest.mark.parametrize("k,n,what", [(20, 32, "k=20"), (32, 24, "n=24"), (8, 8, "k=8")])
def test_rejects_k_n_not_multiple_of_16(k, n, what):
    with pytest.raises(InputError, match=f"multiples of 16.*{what}"):
        cutlass_ext.fused_int8_linear(**_args(k=k, n=n))


def test_rejects_shape_mismatches():
    with pytest.raises(InputError, match="shape mismatch"):
        cutlass_ext.fused_int8_linear(**_args(b=torch.zeros(32, 48, dtype=torch.int8)))
    with pytest.raises(InputError, match="col_scale must have shape"):
        cutlass_ext.fused_int8_linear(**_args(col_scale=torch.ones(16)))
    with pytest.raises(InputError, match="outlier must have shape"):
        cutlass_ext.fused_int8_linear(**_args(outlier=torch.zeros(32, 4)))
    with pytest.raises(InputError, match="contiguous"):
        cutlass_ext.fused_int8_linear(**_args(a=torch.zeros(32, 4, dtype=torch.int8).t()))


def test_rejects_misaligned_pointers():
    buf = torch.zeros(4 * 32 + 1, dtype=torch.int8)
    a = buf[1:].view(4, 32)
    assert a.data_ptr() % 16
    with pytest.raises(InputError, match="a.data_ptr.*16-byte aligned"):
        cutlass_ext.fused_int8_linear(**_args(a=a))
    fbuf = torch.ones(33)
    with pytest.raises(InputError, match="bias.data_ptr.*16-byte aligned"):
        cutlass_ext.fused_int8_linear(**_args(bias=fbuf[1:]))


def test_rejects_unknown_tile_and_cpu_tensors_last():
    with pytest.raises(InputError, match="tile must be one of"):
        cutlass_ext.fused_int8_linear(**_args(), tile="huge")
    with pytest.raises(InputError, match="CUDA device"):
        cutlass_ext.fused_int8_linear(**_args())


def test_col_scale_is_absmax_over_127_squared():
    amax = torch.tensor([127.0, 1.0, 0.0])
    assert torch.equal(cutlass_ext.col_scale(amax), amax * DEQUANT_CONSTANT)


def test_backend_registered_and_shape_rule(monkeypatch):
    be = get_backend("cutlass")
    assert "cutlass" in all_backends()
    assert cutlass_ext.check_shape_rule(1, 64, 64) is None
    assert "multiples of 16" in cutlass_ext.check_shape_rule(1, 20, 64)  # the kernel's rule
    assert "k <= 133144" in cutlass_ext.check_shape_rule(1, 133152, 64)
    cuda = torch.device("cuda")
    monkeypatch.setattr(be, "availability", lambda device: Availability.yes())
    assert be.supports("llm_int8", cuda, torch.float16, 8, 20, 64)  # the backend pads
    why = be.supports("llm_int8", cuda, torch.float32, 8, 64, 64)
    assert not why and "float16/bfloat16" in why.reason
    why = be.supports("llm_int8", cuda, torch.float16, 8, 133145, 64)
    assert not why and "int32" in why.reason


def test_backend_unavailable_here_is_unsupported():
    be = get_backend("cutlass")
    cuda = torch.device("cuda")
    assert bool(be.supports("llm_int8", cuda, torch.float16, 8, 64, 64)) == bool(
        be.availability(cuda)
    )


@pytest.mark.skipif(
    torch.cuda.is_available() and cutlass_ext.extension_built(), reason="CUTLASS usable here"
)
def test_availability_reasons_on_this_machine():
    be = get_backend("cutlass")
    for dev in ("cuda", "cpu"):
        avail = be.availability(torch.device(dev))
        assert not avail
        assert any(w in avail.reason for w in ("CPU build", "no CUDA device", "not built"))
    why = cutlass_ext.unavailable_reason()
    assert why
    if not cutlass_ext.extension_built():
        assert "kernelbench._cutlass" in why
    if torch.version.cuda is None:
        assert "CPU build" in why
    avail = be.availability(torch.device("cpu"))
    assert "CUDA devices only" in avail.reason


# --- GPU ----------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_cutlass = pytest.mark.skipif(
    cutlass_ext.unavailable_reason() is not None,
    reason=f"CUTLASS kernels unusable here: {cutlass_ext.unavailable_reason()}",
)


def _rand_i8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen).cuda()


def _reference(a, b, row, col_scale, bias, outlier) -> torch.Tensor:
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


@gpu
@needs_cutlass
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tile", ["auto", "small_m", "large"])
@pytest.mark.parametrize(
    "m,k,n", [(1, 16, 16), (17, 64, 32), (64, 256, 128), (333, 1024, 48), (2048, 512, 256)]
)
@pytest.mark.parametrize("with_bias,with_outlier", [(False, False), (True, True), (False, True)])
def test_gpu_fused_matches_float64(dtype, tile, m, k, n, with_bias, with_outlier):
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
    _assert_within_16bit_rounding(y, _reference(a, b, row, col, bias, outl))


@gpu
@needs_cutlass
def test_gpu_fused_extremes_and_empty():
    k = 4096
    a = torch.full((32, k), -127, dtype=torch.int8, device="cuda")
    b = torch.full((16, k), -127, dtype=torch.int8, device="cuda")
    row = torch.ones(32, device="cuda")
    col = torch.full((16,), DEQUANT_CONSTANT, device="cuda")
    y = cutlass_ext.fused_int8_linear(a, b, row, col, out_dtype=torch.float16)
    assert torch.allclose(y.float(), torch.full_like(y.float(), float(k)), rtol=1e-3)
    empty = cutlass_ext.fused_int8_linear(a[:0], b, row[:0], col, out_dtype=torch.float16)
    assert empty.shape == (0, 16)


@gpu
@needs_cutlass
def test_gpu_misaligned_rejected_before_launch():
    buf = torch.zeros(1 + 32 * 64, dtype=torch.int8, device="cuda")
    a = buf[1:].view(32, 64)
    with pytest.raises(InputError, match="16-byte aligned"):
        cutlass_ext.fused_int8_linear(
            a,
            torch.zeros(16, 64, dtype=torch.int8, device="cuda"),
            torch.ones(32, device="cuda"),
            torch.ones(16, device="cuda"),
        )


@gpu
@needs_cutlass
@pytest.mark.parametrize("m,k,n", [(8, 20, 33), (3, 5140, 17), (5, 37, 5140)])
def test_gpu_backend_pads_odd_shapes(m, k, n):
    be = get_backend("cutlass")
    assert be.supports("llm_int8", torch.device("cuda"), torch.float16, m, k, n)
    gen = torch.Generator().manual_seed(k * n)
    x = torch.randn(m, k, generator=gen).half().cuda()
    w = (torch.randn(n, k, generator=gen) / k**0.5).half().cuda()
    cfg = QuantConfig()
    y = be.linear(x, be.prepare_weight(w, None, cfg), cfg)
    torch.cuda.synchronize()
    assert y.shape == (m, n)
    ref = oracle.emulate("llm_int8", x, w, None, cfg)
    assert oracle.rel_frobenius(y, ref) < 2e-3


@gpu
@needs_cutlass
@pytest.mark.parametrize("method", ["int8_raw", "vectorwise", "llm_int8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", [(1, 256, 128), (64, 1024, 512), (300, 512, 1024)])
def test_gpu_methods_match_oracle(method, dtype, m, k, n):
    be = get_backend("cutlass")
    gen = torch.Generator().manual_seed(m + k + n)
    x = torch.randn(m, k, generator=gen)
    x[:, 3] *= 20  # an outlier column for llm_int8
    x = x.to(dtype).cuda()
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).cuda()
    bias = torch.randn(n, generator=gen).to(dtype).cuda()
    cfg = QuantConfig()
    kept = torch.tensor([3], dtype=torch.int64, device="cuda")
    runner = be.runner(method, x, w, bias, cfg, kept)
    y = runner.run()
    torch.cuda.synchronize()
    ref = oracle.emulate(method, x, w, bias, cfg, kept)
    if method == "int8_raw":
        # the kernels quantize in float32: exact against quant.py's float32 quantization (the
        # float64 emulation differs in near-tie codes), and near the oracle
        pw = quant.prepare_weight(w.cpu(), None, method_config(method, cfg))
        qa = quant.quantize_activation(x.cpu(), torch.zeros(0, dtype=torch.int64))
        want = oracle.int_product(qa.int8, pw.int8)
        assert torch.equal(y.cpu().to(torch.int64), want)
        assert oracle.rel_frobenius(y, ref) < 1e-3
        return
    assert y.dtype == dtype and y.shape == (m, n)
    # The emulation is float64 throughout; the kernels quantize in fp32 (same rounding rule)
    # and the fused epilogue rounds once to 16 bits. Tolerance: a few output ulps of the scale.
    scale = ref.abs().max().item()
    tol = 4 * torch.finfo(dtype).eps * scale
    assert oracle.max_abs_error(y, ref) <= tol + 0.05 * scale / 127, (
        oracle.max_abs_error(y, ref),
        scale,
    )
    for stage in runner.stages.values():  # the cuBLASLt-served stages still run
        stage()
    torch.cuda.synchronize()
