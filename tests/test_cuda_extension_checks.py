"""The CUDA and CUTLASS extension wrappers on a machine without a GPU: argument checks raised
before any GPU work, the calls made into the extension (a recording stand-in runs nothing), the
shape rules and the availability reasons. What only a GPU shows is tests/test_gpu_kernels.py;
the backends' contracts on CUDA are tests/test_backends.py and tests/test_inputs.py with
``device=cuda``."""

from __future__ import annotations

import contextlib

import pytest
import torch

from kernelbench import quant
from kernelbench.backends import all_backends, get_backend
from kernelbench.backends.base import Availability
from kernelbench.backends.custom_cuda import CustomCudaOps
from kernelbench.checks import InputError
from kernelbench.kernels import cuda_ext, cutlass_ext
from kernelbench.quant import DEQUANT_CONSTANT, QuantConfig

# --- kernelbench._cuda: argument checks, recorded calls -------------------------------------


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


# --- kernelbench._cutlass: argument checks, shape rule ------------------------------------


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


def test_fused_rejects_bad_dtypes():
    with pytest.raises(InputError, match="a must be int8"):
        cutlass_ext.fused_int8_linear(**_args(a=torch.zeros(4, 32)))
    with pytest.raises(InputError, match="row_absmax must be float32"):
        cutlass_ext.fused_int8_linear(**_args(row_absmax=torch.ones(4, dtype=torch.float16)))
    with pytest.raises(InputError, match="out_dtype"):
        cutlass_ext.fused_int8_linear(**_args(out_dtype=torch.float32))
    with pytest.raises(InputError, match="bias must be float32"):
        cutlass_ext.fused_int8_linear(**_args(bias=torch.ones(32, dtype=torch.float16)))


@pytest.mark.parametrize("k,n,what", [(20, 32, "k=20"), (32, 24, "n=24"), (8, 8, "k=8")])
def test_fused_rejects_k_n_not_multiple_of_16(k, n, what):
    with pytest.raises(InputError, match=f"multiples of 16.*{what}"):
        cutlass_ext.fused_int8_linear(**_args(k=k, n=n))


def test_fused_rejects_shape_mismatches():
    with pytest.raises(InputError, match="shape mismatch"):
        cutlass_ext.fused_int8_linear(**_args(b=torch.zeros(32, 48, dtype=torch.int8)))
    with pytest.raises(InputError, match="col_scale must have shape"):
        cutlass_ext.fused_int8_linear(**_args(col_scale=torch.ones(16)))
    with pytest.raises(InputError, match="outlier must have shape"):
        cutlass_ext.fused_int8_linear(**_args(outlier=torch.zeros(32, 4)))
    with pytest.raises(InputError, match="contiguous"):
        cutlass_ext.fused_int8_linear(**_args(a=torch.zeros(32, 4, dtype=torch.int8).t()))


def test_fused_rejects_misaligned_pointers():
    buf = torch.zeros(4 * 32 + 1, dtype=torch.int8)
    a = buf[1:].view(4, 32)
    assert a.data_ptr() % 16
    with pytest.raises(InputError, match="a.data_ptr.*16-byte aligned"):
        cutlass_ext.fused_int8_linear(**_args(a=a))
    fbuf = torch.ones(33)
    with pytest.raises(InputError, match="bias.data_ptr.*16-byte aligned"):
        cutlass_ext.fused_int8_linear(**_args(bias=fbuf[1:]))


def test_fused_rejects_unknown_tile_and_cpu_tensors_last():
    with pytest.raises(InputError, match="tile must be one of"):
        cutlass_ext.fused_int8_linear(**_args(), tile="huge")
    with pytest.raises(InputError, match="CUDA device"):
        cutlass_ext.fused_int8_linear(**_args())


def test_col_scale_is_absmax_over_127_squared():
    amax = torch.tensor([127.0, 1.0, 0.0])
    assert torch.equal(cutlass_ext.col_scale(amax), amax * DEQUANT_CONSTANT)


def test_cutlass_registered_and_shape_rule(monkeypatch):
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


@pytest.mark.parametrize("name", ["cublaslt", "cutlass"])
def test_supports_follows_availability(name):
    be = get_backend(name)
    cuda = torch.device("cuda")
    assert bool(be.supports("llm_int8", cuda, torch.float16, 8, 64, 64)) == bool(
        be.availability(cuda)
    )


# --- availability on this machine ---------------------------------------------------------


@pytest.mark.parametrize(
    "name,ext,module",
    [("cublaslt", cuda_ext, "kernelbench._cuda"), ("cutlass", cutlass_ext, "kernelbench._cutlass")],
)
def test_availability_reasons_on_this_machine(name, ext, module):
    """Without a usable GPU build: unavailable on both devices, with a reason that says why."""
    if torch.cuda.is_available() and ext.extension_built():
        pytest.skip(f"{module} is usable here")
    be = get_backend(name)
    for dev in ("cuda", "cpu"):
        avail = be.availability(torch.device(dev))
        assert not avail
        assert any(w in avail.reason for w in ("CPU build", "no CUDA device", "not built"))
    assert not be.supports("llm_int8", torch.device("cuda"), torch.float16, 8, 64, 64)
    why = ext.unavailable_reason()
    assert why
    if not ext.extension_built():
        assert module in why
    if torch.version.cuda is None:
        assert "CPU build" in why


def test_cpu_device_is_never_available():
    for name in ("cublaslt", "cutlass"):
        avail = get_backend(name).availability(torch.device("cpu"))
        assert not avail and "CUDA devices only" in avail.reason, name
