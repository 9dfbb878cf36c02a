"""``cublaslt`` backend: kernelbench's CUDA quantize/dequantize kernels + a cuBLASLt int8 GEMM.

UNVERIFIED: compiled only, not run on a GPU in the session that wrote it. Needs the CUDA
extension ``kernelbench._cuda`` (built with ``KERNELBENCH_CUDA=ON``/``AUTO`` beside a CUDA
torch), a CUDA device, and 16-bit layers with k and n multiples of 16.
"""

from __future__ import annotations

import torch

from kernelbench import quant
from kernelbench.backends.base import INT8_STAGE_METHODS, Availability, Backend
from kernelbench.backends.custom_cuda import CustomCudaOps
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


class CublasLtBackend(Backend):
    name = "cublaslt"
    description = "custom CUDA quantize/dequantize kernels + cuBLASLt int8 GEMM (TN, int32 out)"
    methods = INT8_STAGE_METHODS

    def __init__(self) -> None:
        self.ops = CustomCudaOps()

    def availability(self, device: torch.device) -> Availability:
        return self.ops.availability(device)

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        if not avail:
            return avail
        return self.ops.supports(dtype, m, k, n)

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        return self.ops.quantize(x, pw, cfg)

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        return self.ops.int8_matmul(a, pw)

    def outlier_product(self, qa: QuantizedActivation, pw: PreparedWeight):
        # float32 torch matmul: the dequantize kernel takes the product in float32.
        return quant.outlier_product(qa, pw, torch.float32)

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        return self.ops.dequantize(acc, qa, pw, outlier)


BACKEND = CublasLtBackend()
