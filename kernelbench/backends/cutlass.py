"""``cutlass`` backend: CUTLASS int8 GEMM with the LLM.int8() dequantize fused in its epilogue.

Compiled for sm_80 (CUTLASS 2.x) and sm_90a (CUTLASS 3.x); unverified on a GPU until it has run
on one.

What runs where:

* ``quantize``: kernelbench's CUDA kernels (:class:`CustomCudaOps`: outlier detection, fused
  row quantize), one host sync for the outlier count when decomposition is on.
* ``outlier_product``: a float32 torch matmul of the outlier dims (eq. 8), or ``None``.
* ``linear``: quantize -> outlier product -> **one CUTLASS kernel** (int8 x int8 -> int32 in
  registers, epilogue ``acc * row_absmax * col_absmax / 127^2 + bias + outlier`` -> fp16/bf16;
  no int32 matrix in device memory). This is what ``Runner.run`` times.
* ``int8_matmul`` and ``dequantize`` (the per-stage timings, and the ``int8_raw`` method): the
  fused kernel has no int32 output, so these stages are served by cuBLASLt and kernelbench's CUDA
  dequantize kernel, exactly as in the ``custom`` backend on CUDA. Their per-stage times are NOT
  the CUTLASS kernel's; the difference ``linear - quantize - outlier_product`` is the fused
  GEMM+epilogue.

Methods: ``int8_raw``, ``vectorwise``, ``llm_int8`` and ``smoothquant`` (``linear`` on ``x / s``
with the weight ``w * s`` prepared offline: :meth:`Backend._smoothquant_runner`).

Any shape: k and n are padded with zeros to multiples of 16 (:mod:`kernelbench.kernels.padding`):
the weight, its column scales and the bias once at prepare time, the activation's k tail and (with
outliers) the outlier product's n tail per call; the output's extra columns are dropped. The
row's ``variant`` names the padded shape.

The prepared weight (:class:`CutlassWeight`) keeps two extra (n_p,) float32 vectors (counted
in ``nbytes``): ``col_scale`` = column absmax / 127^2 and ``bias_f32`` = the bias in float32,
both zero-padded, so no per-call conversion runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernelbench import quant
from kernelbench.backends.base import (
    INT8_STAGE_METHODS,
    Availability,
    Backend,
    Runner,
    join_variants,
)
from kernelbench.backends.custom_cuda import CustomCudaOps
from kernelbench.kernels import cutlass_ext
from kernelbench.kernels.padding import (
    PaddedWeight,
    extend_weight,
    gemm_weight,
    pad_cols,
    pad_rows,
    unpad_cols,
)
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


@dataclass
class CutlassWeight(PaddedWeight):
    """:class:`PaddedWeight` plus the epilogue's (n_p,) float32 vectors."""

    col_scale: torch.Tensor  # column absmax / 127^2, zero-padded
    bias_f32: torch.Tensor | None  # the bias in float32, zero-padded


class CutlassBackend(Backend):
    """kernelbench's CUDA quantize kernels, and the fused CUTLASS kernel as ``linear``."""

    name = "cutlass"
    description = (
        "CUTLASS int8 GEMM, dequantize + bias + outlier product fused in the epilogue "
        "(sm_80: 2.x visitor epilogue; sm_90a: 3.x TMA/wgmma + EVT)"
    )
    methods = (*INT8_STAGE_METHODS, "smoothquant")

    def __init__(self, fused_kernel: Callable[..., torch.Tensor] | None = None) -> None:
        self.ops = CustomCudaOps()
        #: The fused kernel on padded operands (``cutlass_ext.fused_int8_linear``); tests put a
        #: CPU stand-in here to check the padding without a GPU.
        self.fused_kernel = fused_kernel or cutlass_ext.fused_int8_linear

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        reasons = []
        ops = self.ops.availability(device)
        if not ops:
            reasons.append(ops.reason)
        why = cutlass_ext.unavailable_reason(device if device.type == "cuda" else None)
        if why:
            reasons.append(why)
        return Availability.no("; ".join(reasons)) if reasons else Availability.yes()

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        if not avail:
            return avail
        avail = self.ops.supports(dtype, m, k, n)  # any k, n: padded to 16 for both kernels
        if not avail:
            return avail
        shape = self.ops.padded_shape(k, n)
        why = cutlass_ext.check_shape_rule(m, shape.k_padded, shape.n_padded)
        return Availability.no(why) if why else Availability.yes()

    def runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        r = super().runner(method, x, weight, bias, cfg, kept_rows)
        n, k = weight.shape
        r.variant = join_variants(r.variant, self.ops.padded_shape(k, n).describe())
        return r

    # --- stages ----------------------------------------------------------------------------

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> PreparedWeight:
        pw = self.ops.prepare(super().prepare_weight(weight, bias, cfg, kept_rows))
        n_p = pw.gemm_int8.shape[0]
        return extend_weight(
            CutlassWeight,
            pw,
            gemm_int8=pw.gemm_int8,
            cols_safe=pw.cols_safe,
            col_scale=pad_rows(cutlass_ext.col_scale(pw.absmax), n_p),
            bias_f32=pad_rows(pw.bias.float().contiguous(), n_p) if pw.bias is not None else None,
        )

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        return self.ops.quantize(x, pw, cfg)

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        return self.ops.int8_matmul(a, pw)

    def outlier_product(self, qa: QuantizedActivation, pw: PreparedWeight):
        # float32: the fused epilogue adds a float32 product.
        return quant.outlier_product(qa, pw, torch.float32)

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        return self.ops.dequantize(acc, qa, pw, outlier)

    def fused(
        self, qa: QuantizedActivation, pw: PreparedWeight, outlier: torch.Tensor | None
    ) -> torch.Tensor:
        """The CUTLASS kernel: int8 GEMM + dequantize + bias + outlier product -> pw.dtype,
        on operands zero-padded to multiples of 16 (the extra output columns dropped)."""
        w = gemm_weight(pw)
        n_p, k_p = w.shape
        if isinstance(pw, CutlassWeight):
            col, bias = pw.col_scale, pw.bias_f32
        else:  # a weight prepared by another backend: converted per call
            col = pad_rows(cutlass_ext.col_scale(pw.absmax), n_p)
            bias = pad_rows(pw.bias.float().contiguous(), n_p) if pw.bias is not None else None
        outl = None
        if outlier is not None:
            outl = pad_cols(outlier.float().contiguous(), n_p)
        y = self.fused_kernel(
            pad_cols(qa.int8, k_p), w, qa.absmax, col, bias, outl, out_dtype=pw.dtype
        )
        return unpad_cols(y, pw.out_features)

    def linear(self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig) -> torch.Tensor:
        qa = self.quantize(x, pw, cfg)
        return self.fused(qa, pw, self.outlier_product(qa, pw))


BACKEND = CutlassBackend()
