"""``cutlass`` backend: CUTLASS int8 GEMM with the LLM.int8() dequantize fused in its epilogue.

UNVERIFIED: compiled only (sm_80 via CUTLASS 2.x, sm_90a via CUTLASS 3.x), never run on a GPU in
the session that wrote it.

What runs where:

* ``quantize``: kernelbench's CUDA kernels (:class:`CustomCudaOps`: outlier detection, fused
  row quantize), one host sync for the outlier count when decomposition is on.
* ``outlier_product``: a float32 torch matmul of the outlier dims (eq. 8), or ``None``.
* ``linear``: quantize -> outlier product -> **one CUTLASS kernel** (int8 x int8 -> int32 in
  registers, epilogue ``acc * row_absmax * col_absmax / 127^2 + bias + outlier`` -> fp16/bf16;
  no int32 matrix in device memory). This is what ``Runner.run`` times.
* ``int8_matmul`` and ``dequantize`` (the per-stage timings, and the ``int8_raw`` method): the
  fused kernel has no int32 output, so these stages are served by cuBLASLt
  (:func:`kernelbench.cuda_ext.int8_gemm`) and kernelbench's CUDA dequantize kernel, exactly as
  in the ``cublaslt`` backend. Their per-stage times are NOT the CUTLASS kernel's; the
  difference ``linear - quantize - outlier_product`` is the fused GEMM+epilogue.

The prepared weight keeps two extra (n,) float32 vectors in ``extra`` (counted in
``nbytes``): ``cutlass_col_scale`` = column absmax / 127^2 and ``cutlass_bias`` = the bias in
float32, so no per-call conversion runs.
"""

from __future__ import annotations

import torch

from kernelbench import cutlass_ext
from kernelbench.backends.base import Availability
from kernelbench.backends.cublaslt import CublasLtBackend
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation


class CutlassBackend(CublasLtBackend):
    """The ``cublaslt`` backend's stages (quantize, int8_matmul, outlier_product, dequantize),
    with ``linear`` replaced by the fused CUTLASS kernel."""

    name = "cutlass"
    description = (
        "CUTLASS int8 GEMM, dequantize + bias + outlier product fused in the epilogue "
        "(sm_80: 2.x visitor epilogue; sm_90a: 3.x TMA/wgmma + EVT)"
    )

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
        avail = super().supports(method, device, dtype, m, k, n)  # cuBLASLt + CUDA kernel rules
        if not avail:
            return avail
        why = cutlass_ext.check_shape_rule(m, k, n)
        return Availability.no(why) if why else Availability.yes()

    # --- stages ----------------------------------------------------------------------------

    def prepare_weight(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        cfg: QuantConfig,
        kept_rows: torch.Tensor | None = None,
    ) -> PreparedWeight:
        pw = super().prepare_weight(weight, bias, cfg, kept_rows)
        pw.extra["cutlass_col_scale"] = cutlass_ext.col_scale(pw.absmax)
        if pw.bias is not None:
            pw.extra["cutlass_bias"] = pw.bias.float().contiguous()
        return pw

    def fused(
        self, qa: QuantizedActivation, pw: PreparedWeight, outlier: torch.Tensor | None
    ) -> torch.Tensor:
        """The CUTLASS kernel: int8 GEMM + dequantize + bias + outlier product -> pw.dtype."""
        col = pw.extra.get("cutlass_col_scale")
        if col is None:  # a weight prepared by another backend
            col = cutlass_ext.col_scale(pw.absmax)
        bias = pw.extra.get("cutlass_bias")
        if bias is None and pw.bias is not None:
            bias = pw.bias.float().contiguous()
        outl = outlier.float().contiguous() if outlier is not None else None
        return cutlass_ext.fused_int8_linear(
            qa.int8, pw.int8, qa.absmax, col, bias, outl, out_dtype=pw.dtype
        )

    def linear(self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig) -> torch.Tensor:
        qa = self.quantize(x, pw, cfg)
        return self.fused(qa, pw, self.outlier_product(qa, pw))


BACKEND = CutlassBackend()
