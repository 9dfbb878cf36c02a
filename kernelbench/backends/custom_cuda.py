"""The CUDA half of the ``custom`` backend: kernelbench's own CUDA kernels around a cuBLASLt GEMM.

Not a backend by itself (no module-level ``BACKEND``): :mod:`kernelbench.backends.custom`
delegates to :class:`CustomCudaOps` for CUDA tensors, and :mod:`kernelbench.backends.cutlass`
uses its quantize kernels in front of the fused CUTLASS GEMM.

Any shape: the cuBLASLt GEMM needs k and n multiples of 16, so :meth:`CustomCudaOps.prepare` pads
the int8 weight to (n_p, k_p) with zeros once (:class:`kernelbench.kernels.padding.PaddedWeight`),
and :meth:`CustomCudaOps.int8_matmul` pads the activation's k tail and drops the extra output
columns (:mod:`kernelbench.kernels.padding`, exact). The quantize and dequantize kernels take any k
and n.

The GPU paths are unverified until they have run on a GPU; the stages follow
:mod:`kernelbench.quant` (same operation order in fp32), which the backend contract tests
(``device=cuda``) and ``tests/test_gpu_kernels.py`` check there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelbench.backends.base import Availability
from kernelbench.checks import require as _require
from kernelbench.kernels import cuda_ext, padding
from kernelbench.kernels.padding import PaddedWeight, gemm_weight, pad_prepared
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


def cuda_availability(device: torch.device | str, what: str) -> Availability:
    """Whether the CUDA extension's kernels run on ``device``; ``what`` starts the reason
    given for a device that is not CUDA (e.g. "cuBLASLt runs")."""
    device = torch.device(device)
    reason = cuda_ext.unavailable_reason()
    if device.type != "cuda":
        why = f"{what} on CUDA devices only, not {device.type!r}"
        return Availability.no(f"{why}; {reason}" if reason else why)
    return Availability.no(reason) if reason else Availability.yes()


def gemm_shape_rule(dtype: torch.dtype, k: int, n: int) -> Availability:
    """The layer rule of a CUDA int8 path that pads k and n to 16 (any shape within int32)."""
    if dtype not in cuda_ext.SIXTEEN_BIT:
        return Availability.no(f"the CUDA kernels take float16/bfloat16 layers, not {dtype}")
    why = padding.shape_rule(k, n, cuda_ext.GEMM_DIM_MULTIPLE)
    return Availability.no(why) if why else Availability.yes()


class CustomCudaOps:
    """quantize / int8_matmul / dequantize on CUDA tensors (16-bit layers only).

    ``gemm`` is the int8 GEMM on padded operands (``cuda_ext.int8_gemm``); tests put a CPU
    stand-in there to check the padding without a GPU."""

    def __init__(self, gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self.gemm = gemm or cuda_ext.int8_gemm

    def availability(self, device: torch.device | str = "cuda") -> Availability:
        return cuda_availability(device, "the CUDA kernels run")

    def supports(self, dtype: torch.dtype, m: int, k: int, n: int) -> Availability:
        """Any m, k, n within the int32 accumulator (k, n padded to 16 for cuBLASLt)."""
        return gemm_shape_rule(dtype, k, n)

    def padded_shape(self, k: int, n: int) -> padding.PaddedShape:
        return padding.padded_shape(k, n, cuda_ext.GEMM_DIM_MULTIPLE)

    def prepare(self, pw: PreparedWeight) -> PaddedWeight:
        """The prepared weight with its int8 matrix padded for the GEMM (when needed)."""
        return pad_prepared(pw, cuda_ext.GEMM_DIM_MULTIPLE)

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
        """``a (m, k) @ w (n, k).T`` in int32 (m, n) through cuBLASLt, on zero-padded operands
        when k or n is not a multiple of 16."""
        _require(
            a.dim() == 2 and a.shape[1] == pw.in_features,
            f"a must be (m, {pw.in_features}), got {tuple(a.shape)}",
        )
        return padding.padded_gemm(a, gemm_weight(pw), pw.out_features, self.gemm)

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
        safe = pw.cols_safe if isinstance(pw, PaddedWeight) else None
        return cuda_ext.dequantize(
            acc, qa.absmax.float(), pw.absmax.float(), bias, outl, pw.dtype, cols_safe=safe
        )
