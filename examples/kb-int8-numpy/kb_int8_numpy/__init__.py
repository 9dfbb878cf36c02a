"""An example kernelbench backend: the int8 GEMM in numpy, every other stage the reference.

The product of int8 matrices is computed as a float64 BLAS GEMM and converted to int32: every
partial sum is an integer of magnitude at most k * 128^2, exact in float64 while k < 2^39, so
the result is the exact integer product (``numerics.exact_int8``). Quantization, the outlier
product and dequantization are kernelbench's reference stages (``kernelbench.quant``), so the
backend declares the reference numerics and is held to the oracle's tolerance.
"""

from __future__ import annotations

import numpy as np
import torch

from kernelbench.api import (
    API_VERSION,
    Availability,
    Backend,
    PreparedWeight,
    check_int8_operands,
)

__version__ = "0.1.0"


class NumpyInt8Backend(Backend):
    name = "int8_numpy"
    description = "example plugin: int8 GEMM in numpy (exact, float64 BLAS), reference stages"
    api_version = API_VERSION
    # No device has evidence yet: `kernelbench check-backend int8_numpy` is the first step.
    verified: dict[str, str] = {}

    def availability(self, device: torch.device) -> Availability:
        if torch.device(device).type != "cpu":
            return Availability.no("numpy runs on the CPU only")
        return Availability.yes()

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        b = pw.int8_columns(torch.arange(pw.in_features))
        check_int8_operands(a, b)
        acc = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64).T
        return torch.from_numpy(acc.astype(np.int32))


BACKEND = NumpyInt8Backend()
