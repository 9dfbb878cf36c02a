"""The CUDA half of the ``custom`` backend: kernelbench's own CUDA kernels + cuBLASLt.

Not a backend by itself (no module-level ``BACKEND``): :mod:`kernelbench.backends.custom`
delegates to :class:`CustomCudaOps` for CUDA tensors, and :mod:`kernelbench.backends.cublaslt`
wraps it as the ``cublaslt`` backend.

UNVERIFIED: every GPU path here was compiled only, never run on a GPU in the session that wrote
it. The stages follow :mod:`kernelbench.quant` exactly (same operation order in fp32), which the
GPU tests in ``tests/test_cuda.py`` check.
"""

from __future__ import annotations

import torch

from kernelbench import cuda_ext
from kernelbench.backends.base import Availability
from kernelbench.checks import require as _require
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


class CustomCudaOps:
    """quantize / int8_matmul / dequantize on CUDA tensors (16-bit layers only)."""

    def availability(self, device: torch.device | str = "cuda") -> Availability:
        device = torch.device(device)
        reason = cuda_ext.unavailable_reason()
        if device.type != "cuda":
            why = f"the CUDA kernels run on CUDA devices only, not {device.type!r}"
            return Availability.no(f"{why}; {reason}" if reason else why)
        return Availability.no(reason) if reason else Availability.yes()

    def supports(self, dtype: torch.dtype, m: int, k: int, n: int) -> Availability:
        """Shape and dtype rules of the kernels (see :mod:`kernelbench.cuda_ext`)."""
        if dtype not in cuda_ext.SIXTEEN_BIT:
            return Availability.no(f"the CUDA kernels take float16/bfloat16 layers, not {dtype}")
        mult = cuda_ext.GEMM_DIM_MULTIPLE
        if k % mult or n % mult:
            return Availability.no(
                f"the cuBLASLt int8 GEMM needs k and n multiples of {mult} (k={k}, n={n})"
            )
        return Availability.yes()

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        """Outlier columns (``cfg``'s threshold plus ``pw.kept_rows``), row absmax without
        them, int8 with them zeroed, and their 16-bit values. One host sync when
        decomposition is on (the outlier count)."""
        _require(x.dtype in cuda_ext.SIXTEEN_BIT, f"x must be float16/bfloat16, got {x.dtype}")
        _require(
            x.dim() == 2 and x.shape[1] == pw.in_features,
            f"x must be (m, {pw.in_features}), got {tuple(x.shape)}",
        )
        if cfg.decomposition:
            kept = pw.kept_rows if pw.kept_rows.numel() else None
            cols, mask = cuda_ext.detect_outliers(x, cfg.alpha, cfg.outlier_cmp, kept)
        else:
            cols = torch.zeros(0, dtype=torch.int64, device=x.device)
            mask = None
        q, amax, vals = cuda_ext.quantize_rows(x, mask, cols)
        return QuantizedActivation(int8=q, absmax=amax, outlier_cols=cols, outlier_values=vals)

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        """``a (m, k) @ pw.int8 (n, k).T`` in int32 through cuBLASLt (k, n multiples of 16)."""
        return cuda_ext.int8_gemm(a, pw.int8)

    def dequantize(
        self,
        acc: torch.Tensor,
        qa: QuantizedActivation,
        pw: PreparedWeight,
        outlier: torch.Tensor | None,
    ) -> torch.Tensor:
        """Fused eq. 7 + bias + outlier product, output in ``pw.dtype`` (fp16/bf16). A bias or
        outlier product that is not float32 is converted first (one extra small pass)."""
        _require(
            pw.dtype in cuda_ext.SIXTEEN_BIT,
            f"the CUDA dequantize kernel writes float16/bfloat16, the layer is {pw.dtype}",
        )
        bias = pw.bias.float().contiguous() if pw.bias is not None else None
        outl = outlier.float().contiguous() if outlier is not None else None
        return cuda_ext.dequantize(acc, qa.absmax.float(), pw.absmax.float(), bias, outl, pw.dtype)
