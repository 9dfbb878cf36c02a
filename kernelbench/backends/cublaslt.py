"""``cublaslt`` backend: framework-op quantize/dequantize around a direct cuBLASLt int8 GEMM.

The paper's "PyTorch + NVIDIA" arrangement with the GEMM called directly: quantization,
outlier decomposition and dequantization are the torch ops of :mod:`kernelbench.quant` (as in
the ``torch`` backend); the int8 product is kernelbench's own cuBLASLt call
(:func:`kernelbench.kernels.cuda_ext.int8_gemm`: "TN" IMMA, int32 out, plan cached per shape)
instead of ``torch._int_mm``. ``custom`` runs kernelbench's fused CUDA kernels around the same
GEMM, so the two names measure different computations around one GEMM.

Methods: ``int8_raw``, ``vectorwise``, ``llm_int8`` and ``smoothquant`` (the vector-wise stages
on ``x / s`` and ``w * s``: :meth:`Backend._smoothquant_runner`; its ``variant`` says so, then
the padded shape).

Any shape: k and n are padded with zeros to multiples of 16 (:mod:`kernelbench.kernels.padding`,
exact); the row's ``variant`` names the padded shape. Needs the CUDA extension
``kernelbench._cuda``, a CUDA device, and a 16-bit layer. Unverified on a GPU until it has run
on one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelbench import quant
from kernelbench.backends.base import (
    INT8_STAGE_METHODS,
    Availability,
    Backend,
    Runner,
    join_variants,
)
from kernelbench.backends.custom_cuda import cuda_availability, gemm_shape_rule
from kernelbench.kernels import cuda_ext
from kernelbench.kernels.padding import gemm_weight, pad_prepared, padded_gemm, padded_shape
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


class CublasLtBackend(Backend):
    name = "cublaslt"
    description = "torch-op quantize/dequantize + a direct cuBLASLt int8 GEMM (TN, int32 out)"
    methods = (*INT8_STAGE_METHODS, "smoothquant")

    def __init__(self, gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        #: The int8 GEMM on padded operands; tests put a CPU stand-in here.
        self.gemm = gemm or cuda_ext.int8_gemm

    def availability(self, device: torch.device) -> Availability:
        return cuda_availability(device, "cuBLASLt runs")

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        return gemm_shape_rule(dtype, k, n) if avail else avail

    def runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        r = super().runner(method, x, weight, bias, cfg, kept_rows)
        n, k = weight.shape
        r.variant = join_variants(
            r.variant, padded_shape(k, n, cuda_ext.GEMM_DIM_MULTIPLE).describe()
        )
        return r

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> PreparedWeight:
        pw = super().prepare_weight(weight, bias, cfg, kept_rows)
        return pad_prepared(pw, cuda_ext.GEMM_DIM_MULTIPLE)

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        return quant.quantize_activation(x, quant.decomposition_columns(x, pw, cfg))

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        return padded_gemm(a, gemm_weight(pw), pw.out_features, self.gemm)

    def outlier_product(self, qa: QuantizedActivation, pw: PreparedWeight):
        # float32, as the other CUDA backends: one final rounding to the layer's dtype
        return quant.outlier_product(qa, pw, torch.float32)

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        return quant.dequantize(acc, qa, pw, outlier)


BACKEND = CublasLtBackend()
