"""``torch`` backend: framework ops only, the paper's "PyTorch + NVIDIA" rows.

The int8 product is ``torch._int_mm`` (oneDNN on CPU, cuBLASLt on CUDA); quantization and
dequantization are ordinary torch ops from :mod:`kernelbench.quant`. This backend also owns the
``fp32`` and ``fp16`` baselines (``fp16`` is bf16 on CPU: the CPU's 16-bit type).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelbench import quant
from kernelbench.backends.base import (
    Availability,
    Backend,
    Runner,
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


class TorchBackend(Backend):
    name = "torch"
    description = "framework ops: torch._int_mm (oneDNN / cuBLASLt) + torch quantize/dequantize"
    methods = (*METHODS, "smoothquant")
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
        if x.is_cuda and method not in ("fp32", "fp16"):  # the padded shape _int_mm multiplies
            shape = padding.padded_shape(weight.shape[1], weight.shape[0], CUDA_DIM_MULTIPLE)
            r.variant = shape.describe()
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
        if method == "absmax_torch":
            return self._scaled_runner(x, weight, bias, per_row=False)
        if method == "vectorwise_torch":
            return self._scaled_runner(x, weight, bias, per_row=True)
        return super().runner(method, x, weight, bias, cfg, kept_rows)

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
