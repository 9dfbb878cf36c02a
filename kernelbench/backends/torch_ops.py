"""``torch`` backend: framework ops only, the paper's "PyTorch + NVIDIA" rows.

The int8 product is ``torch._int_mm`` (oneDNN on CPU, cuBLASLt on CUDA); quantization and
dequantization are ordinary torch ops from :mod:`kernelbench.quant`. On CPU ``_int_mm`` calls
oneDNN's gemm API (``ONEDNN_VERBOSE=1``: ``gemm_api``, ``src_s8 wei_s8 dst_s32``), which
takes the weight in its plain layout on every call (no prepacked copy, unlike a matmul
primitive on a reordered weight): near the int8 peak at prefill, slow at decode (torch 2.13,
2-core Zen 5: 5.6-5.7 ms for 8 x 4096 x 16384, 12 GB/s of int8 weights; the custom backend's
prepacked GEMM about 1.3 ms). This backend also owns the ``fp32`` and ``fp16`` baselines
(``fp16`` is bf16 on CPU: the CPU's 16-bit type).

``fp8_e4m3``: :func:`kernelbench.quant.quantize_fp8_rowwise` of the weight offline (e4m3 codes,
one scale ``amax / 448`` per output channel) and of the activations in the call (one per
token), then ``torch._scaled_mm`` with both scale vectors (``scale_a`` (m, 1), ``scale_b``
(1, n), float32) and the bias, out in the layer's dtype: the product of the codes, scaled and
biased in float32, rounded once. The weight operand is the (n, k) codes transposed, a
column-major (k, n) view: the layout CUDA's ``_scaled_mm`` requires, and one the CPU's takes.
CPU (torch 2.13): checked against the float64 oracle (tests/test_backends.py). CUDA: written for
the row-wise kernel (sm_89 and later, bf16 or fp16 out, k and n multiples of 16; other layers
are skipped with that reason), never run: unverified, as the backend's ``verified`` says.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kernelbench import quant
from kernelbench.backends.base import (
    Availability,
    Backend,
    Runner,
    join_variants,
    shared_weight,
    sixteen_bit_dtype,
    stage_accumulator,
    torch_device_availability,
)
from kernelbench.checks import InputError, check_activation, check_int8_operands, check_weight
from kernelbench.core import METHODS, not_implemented_reason
from kernelbench.kernels import padding
from kernelbench.quant import PreparedWeight


def int_mm(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """``a @ b_nk.T`` in int32 through ``torch._int_mm``, with its shape rules checked first.

    CUDA's ``_int_mm`` (cuBLASLt) needs m > 16 and k, n multiples of 8; smaller m is padded with
    zero rows here (the rows are dropped again), other k, n are an error (the backend pads them:
    :data:`CUDA_DIM_MULTIPLE`).
    """
    check_int8_operands(a, b_nk)
    m = a.shape[0]
    if m == 0:
        return torch.zeros((0, b_nk.shape[0]), dtype=torch.int32, device=a.device)
    if a.is_cuda:
        k, n = a.shape[1], b_nk.shape[0]
        if k % 8 or n % 8:
            raise InputError(
                f"torch._int_mm on CUDA needs k and n multiples of 8, got k={k}, n={n}"
            )
        if m <= 16:
            padded = torch.zeros((17, k), dtype=torch.int8, device=a.device)
            padded[:m] = a
            return torch._int_mm(padded, b_nk.t())[:m]
    b_kn = b_nk.t()
    if b_kn.shape[0] == 1:
        # k == 1: the transposed view has strides (1, 1), and oneDNN's AVX512 path of
        # torch._int_mm (torch 2.13, seen on a Zen 5 CPU) then returns garbage instead of the
        # product; a (1, n) tensor with its natural strides is computed correctly.
        b_kn = b_kn.reshape(-1).clone().view(1, -1)
    return torch._int_mm(a, b_kn)


#: k and n of CUDA's ``torch._int_mm`` are zero-padded to multiples of this (exact).
CUDA_DIM_MULTIPLE = 8
#: k and n of CUDA's ``torch._scaled_mm`` must be multiples of this.
FP8_CUDA_DIM_MULTIPLE = 16
#: The compute capability from which CUDA's row-wise scaled fp8 ``torch._scaled_mm`` runs.
FP8_CUDA_CAPABILITY = (8, 9)


def scaled_mm_fp8(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``(xq @ wq.T) * x_scale * w_scale + bias`` through ``torch._scaled_mm``: ``xq`` (m, k)
    and ``wq`` (n, k) row-major e4m3 codes, ``x_scale`` (m, 1) and ``w_scale`` (1, n) float32.
    The weight goes in as ``wq.t()``, a column-major (k, n) view (what CUDA requires)."""
    return torch._scaled_mm(
        xq, wq.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=out_dtype
    )


def fp8_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Offline: the weight's e4m3 codes (n, k) and its (1, n) float32 scales ``amax / 448``
    (:func:`kernelbench.quant.quantize_fp8_rowwise`, a block of rows at a time: the same codes
    without full-size float32 temporaries)."""
    n, k = weight.shape
    wq = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=weight.device)
    amax = torch.empty(n, dtype=torch.float32, device=weight.device)
    for rows in quant.row_blocks(n, k):
        wq[rows], amax[rows] = quant.quantize_fp8_rowwise(weight[rows])
    return wq, quant.fp8_scale(amax)[None, :].contiguous()


@functools.cache
def fp8_cpu_reason() -> str:
    """'' when ``torch._scaled_mm`` multiplies row-wise scaled e4m3 on this CPU (a small product
    checked against its exact value), else why not."""
    codes = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.25, -1.5]]).to(torch.float8_e4m3fn)
    scale_a = torch.tensor([[2.0], [0.5]])
    scale_b = torch.tensor([[0.25, 4.0]])
    want = (codes.float() @ codes.float().T) * scale_a * scale_b
    try:
        got = scaled_mm_fp8(codes, scale_a, codes, scale_b, None, torch.float32)
    except Exception as exc:  # noqa: BLE001 - any failure: no fp8 GEMM here
        return (
            f"torch {torch.__version__} has no row-wise scaled fp8 torch._scaled_mm on CPU: "
            f"{type(exc).__name__}: {exc}"
        )
    if not torch.equal(got, want):
        return f"torch {torch.__version__}: torch._scaled_mm on CPU gives a wrong fp8 product"
    return ""


def fp8_rule(device: torch.device, dtype: torch.dtype, k: int, n: int) -> str:
    """Empty when ``fp8_e4m3`` runs on ``device`` for a (k, n) layer in ``dtype``, else why
    not (CUDA: the row-wise kernel's rules, unverified)."""
    device = torch.device(device)
    if device.type == "cpu":
        return fp8_cpu_reason()
    if dtype not in (torch.bfloat16, torch.float16):
        return (
            "row-wise scaled torch._scaled_mm on CUDA is run with bf16 or fp16 output only "
            f"(fp32 needs cuBLAS 12.9 on sm_90), the layer is {dtype}"
        )
    if k % FP8_CUDA_DIM_MULTIPLE or n % FP8_CUDA_DIM_MULTIPLE:
        return (
            f"torch._scaled_mm on CUDA needs k and n multiples of {FP8_CUDA_DIM_MULTIPLE}, "
            f"got k={k}, n={n}"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_CUDA_CAPABILITY:
        return f"row-wise scaled fp8 needs compute capability >= 8.9, got {cap[0]}.{cap[1]}"
    return ""


class TorchBackend(Backend):
    name = "torch"
    description = "framework ops: torch._int_mm (oneDNN / cuBLASLt) + torch quantize/dequantize"
    methods = (*METHODS, "smoothquant", "fp8_e4m3")
    verified = {"cpu": "reports/cpu-avx512vnni-2core (kept gpt3 run) and tests/test_backends.py"}

    def availability(self, device: torch.device) -> Availability:
        return torch_device_availability(device)

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        if not avail:
            return avail
        if method == "vectorwise":
            # a pair that does not apply (not a skip): listed with the others, counted only
            why = "its vector-wise scheme is 'vectorwise_torch', the same computation"
            return Availability.no(not_implemented_reason(self.name, method, why))
        if method == "fp8_e4m3":
            why = fp8_rule(device, dtype, k, n)
            return Availability.no(why) if why else Availability.yes()
        if torch.device(device).type == "cuda" and method not in ("fp32", "fp16"):
            why = padding.shape_rule(k, n, CUDA_DIM_MULTIPLE)  # any k, n: padded to 8
            return Availability.no(why) if why else Availability.yes()
        return Availability.yes()

    # stages --------------------------------------------------------------------------------

    def _compute_dtype(self, pw: PreparedWeight) -> torch.dtype:
        # On CPU without native bf16 the 16-bit matmul is emulated and slow; fp32 is both faster
        # and more accurate there. On CUDA the outlier product runs in the layer's 16-bit dtype
        # as in the paper's fig. 2.
        return pw.dtype if pw.absmax.is_cuda else torch.float32

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> PreparedWeight:
        pw = super().prepare_weight(weight, bias, cfg, kept_rows)
        return padding.pad_prepared(pw, CUDA_DIM_MULTIPLE) if weight.is_cuda else pw

    # quantize and dequantize: the reference stages of the base class (torch ops)

    def int8_matmul(self, a, pw) -> torch.Tensor:
        return padding.padded_gemm(a, padding.gemm_weight(pw), pw.out_features, int_mm)

    def outlier_product(self, qa, pw):
        return quant.outlier_product(qa, pw, self._compute_dtype(pw))

    # runners for the framework-only methods -------------------------------------------------

    def runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        r = self._runner(method, x, weight, bias, cfg, kept_rows)
        if x.is_cuda and method not in ("fp32", "fp16", "fp8_e4m3"):  # _int_mm's padded shape
            shape = padding.padded_shape(weight.shape[1], weight.shape[0], CUDA_DIM_MULTIPLE)
            r.variant = join_variants(r.variant, shape.describe())
        return r

    def _runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        if method in ("fp32", "fp16"):
            check_activation(x, weight)
            check_weight(weight, bias)
            dt = torch.float32 if method == "fp32" else sixteen_bit_dtype(x.device)
            wd, bd = shared_weight(
                (weight, bias),
                (self.name, "cast", dt),
                lambda: (weight.to(dt).contiguous(), bias.to(dt) if bias is not None else None),
            )
            nbytes = wd.numel() * wd.element_size() + (
                bd.numel() * bd.element_size() if bd is not None else 0
            )
            # the activations are cast in the call (a no-op for the 16-bit baseline): the
            # output must follow them (:mod:`kernelbench.backends.freshness`)
            return Runner(run=lambda: F.linear(x.to(dt), wd, bd), weight_bytes=nbytes)
        if method == "fp8_e4m3":
            return self._fp8_runner(x, weight, bias)
        if method == "absmax_torch":
            return self._scaled_runner(x, weight, bias, per_row=False)
        if method == "vectorwise_torch":
            return self._scaled_runner(x, weight, bias, per_row=True)
        return super().runner(method, x, weight, bias, cfg, kept_rows)

    def _fp8_runner(self, x, weight, bias) -> Runner:
        """Row-wise scaled fp8 e4m3 (the module docstring): the weight's codes and scales
        offline, the activations' in the call, one ``torch._scaled_mm``."""
        check_activation(x, weight)
        check_weight(weight, bias)
        why = fp8_rule(x.device, x.dtype, weight.shape[1], weight.shape[0])
        if why:
            raise InputError(why)
        wq, w_scale = shared_weight((weight,), (self.name, "fp8_e4m3"), lambda: fp8_weight(weight))

        def quantize() -> tuple[torch.Tensor, torch.Tensor]:
            xq, x_amax = quant.quantize_fp8_rowwise(x)
            return xq, quant.fp8_scale(x_amax)[:, None]

        def run() -> torch.Tensor:
            xq, x_scale = quantize()
            return scaled_mm_fp8(xq, x_scale, wq, w_scale, bias, x.dtype)

        nbytes = wq.numel() + w_scale.numel() * 4
        if bias is not None:
            nbytes += bias.numel() * bias.element_size()
        # one stage: the scaled GEMM is no int8 product and has the dequantization fused
        return Runner(run=run, stages={"quantize": quantize}, weight_bytes=nbytes)

    def _scaled_runner(self, x, weight, bias, per_row: bool) -> Runner:
        """Absmax (tensor-wise) or vector-wise quantization with plain torch ops, no outliers."""
        check_activation(x, weight)
        check_weight(weight, bias)
        scheme = quant.quantize_rowwise if per_row else quant.quantize_tensorwise
        wq, w_amax = shared_weight(
            (weight,),
            (self.name, "rowwise" if per_row else "tensorwise"),
            lambda: quant.quantize_offline(weight, per_row),
        )
        n = weight.shape[0]
        w_amax = w_amax.expand(n).contiguous() if not per_row else w_amax

        def quantize():
            return scheme(x)

        wq_gemm = wq
        if x.is_cuda:
            shape = padding.padded_shape(weight.shape[1], n, CUDA_DIM_MULTIPLE)
            wq_gemm = padding.pad_weight(wq, shape)

        def matmul(xq):
            return padding.padded_gemm(xq, wq_gemm, n, int_mm)

        def dequantize(acc, x_amax):
            x_amax = x_amax.expand(acc.shape[0]) if not per_row else x_amax
            y = quant.dequantize_outer(acc, x_amax, w_amax)
            if bias is not None:
                y = y + bias.float()
            return y.to(x.dtype)

        def run():
            xq, x_amax = quantize()
            return dequantize(matmul(xq), x_amax)

        xq0, x_amax0 = quantize()
        acc0 = stage_accumulator(x.shape[0], n, x.shape[1], x.device)
        nbytes = wq_gemm.numel() + w_amax.numel() * 4
        return Runner(
            run=run,
            stages={
                "quantize": quantize,
                "int8_matmul": lambda: matmul(xq0),
                "dequantize": lambda: dequantize(acc0, x_amax0),
            },
            weight_bytes=nbytes,
        )


BACKEND = TorchBackend()
