"""``custom`` backend: our own kernels.

CPU half (this module + ``csrc/cpu_int8*.cpp``): one fused pass quantizes ``x`` (row absmax
without the outlier columns, round half to even, int8 with the outlier columns zeroed, their
16-bit values gathered). When the kept dims hold every outlier of the call (checked in the same
pass: no other column passes alpha), that pass is all; otherwise a pass finds the outlier
columns and the quantization runs again with them. Then an int8 GEMM with int32 accumulation on
a packed one-byte-per-weight layout (AVX512-VNNI ``vpdpbusd`` where the CPU has it, else AVX2
``vpmaddwd``, else scalar; ``kernelbench._cpu.isa()`` says which), and one fused
dequantization pass (outer product of the scales / 127^2, + bias, + the outlier product of the
few outlier columns, computed in the same pass).

CUDA half: :mod:`kernelbench.backends.custom_cuda`; :attr:`CustomBackend.verified` says where
the backend has been seen to compute right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernelbench import quant
from kernelbench.backends.base import Availability, Backend, join_variants
from kernelbench.checks import InputError
from kernelbench.kernels import cpu_ext
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation

try:  # the CUDA half is optional (module written alongside the CUDA extension)
    from kernelbench.backends.custom_cuda import CustomCudaOps

    _CUDA = CustomCudaOps()
except Exception as exc:  # noqa: BLE001 - any failure only disables the CUDA half
    _CUDA = None
    _CUDA_ERROR = f"{type(exc).__name__}: {exc}"


@dataclass
class PackedWeight(PreparedWeight):
    """The CPU kernels' weight: int8 only in the kernels' packed layout (one byte per weight,
    ``int8`` is ``None``), the bias in float32, as the kernel reads it (``bias`` is then
    ``None``: counted once), and the kept dims' weights as the fused epilogue reads them."""

    packed: torch.Tensor
    bias_f32: torch.Tensor | None
    #: (r, n) float32: ``kept_values`` transposed, the outlier product's weights when a call's
    #: outlier columns are the kept dims (a decode step's always are); gathering them on every
    #: call cost as much as the GEMV at m=1
    kept_t32: torch.Tensor
    #: the kept dims, checked once, for the one-pass quantization of a call
    kept: cpu_ext.KeptDims
    #: the operands of the one-call layer (:func:`cpu_ext.linear_kept`); ``None`` when the kept
    #: dims were not given sorted and unique (``kept_t32`` is in their order)
    one_call: cpu_ext.KeptLinear | None

    def int8_columns(self, cols: torch.Tensor) -> torch.Tensor:
        return cpu_ext.packed_columns(self.packed, self.out_features, self.in_features, cols)


class CustomBackend(Backend):
    name = "custom"
    description = "our kernels: C++ AVX512-VNNI/AVX2 (CPU); CUDA kernels + cuBLASLt (GPU)"
    verified = {"cpu": "reports/cpu-avx512vnni-2core (kept gpt3 run) and tests/test_backends.py"}

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        if device.type == "cpu":
            if not cpu_ext.available():
                return Availability.no(cpu_ext.IMPORT_ERROR)
            return Availability.yes()
        if device.type == "cuda":
            if _CUDA is None:
                return Availability.no(f"CUDA half not importable: {_CUDA_ERROR}")
            return _CUDA.availability(device)
        return Availability.no(f"device type {device.type!r} is not supported")

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        if avail and torch.device(device).type == "cuda":
            return _CUDA.supports(dtype, m, k, n)
        return avail

    def runner(self, method, x, weight, bias, cfg, kept_rows=None):
        r = super().runner(method, x, weight, bias, cfg, kept_rows)
        if self._is_cuda(x):  # the padded shape the cuBLASLt GEMM multiplies, if padded
            r.variant = join_variants(
                r.variant, _CUDA.padded_shape(weight.shape[1], weight.shape[0]).describe()
            )
        return r

    def _is_cuda(self, t: torch.Tensor) -> bool:
        return t.device.type == "cuda"

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> PreparedWeight:
        pw = super().prepare_weight(weight, bias, cfg, kept_rows)
        if self._is_cuda(weight):
            # int8 (n, k) row-major is the layout the cuBLASLt "TN" GEMM reads (zero-padded to
            # multiples of 16 where needed)
            return _CUDA.prepare(pw)
        packed = cpu_ext.pack_weight(pw.int8)
        bias_f32 = bias.float().contiguous() if bias is not None else None
        kept_t32 = pw.kept_values.float().T.contiguous()
        kept = cpu_ext.kept_dims(pw.kept_rows, pw.in_features)
        one_call = None
        if kept.cols is pw.kept_rows:
            one_call = cpu_ext.kept_linear(
                kept, packed, pw.out_features, pw.absmax, bias_f32, kept_t32, pw.dtype
            )
        return PackedWeight.extend(
            pw,
            int8=None,  # the packed copy is the only one kept: one byte per weight
            bias=None,
            packed=packed,
            bias_f32=bias_f32,
            kept_t32=kept_t32,
            kept=kept,
            one_call=one_call,
        )

    def quantize(self, x, pw, cfg: QuantConfig) -> QuantizedActivation:
        if self._is_cuda(x):
            return _CUDA.quantize(x, pw, cfg)
        if x.shape[1] != pw.in_features:
            raise InputError(
                f"shape mismatch: x is {tuple(x.shape)}, layer in_features={pw.in_features}"
            )
        if cfg.decomposition and isinstance(pw, PackedWeight):
            # every outlier in the kept dims: one pass over x
            one_pass = cpu_ext.quantize_kept(x, pw.kept, cfg.alpha, cfg.outlier_cmp.inclusive)
            if one_pass is not None:
                return QuantizedActivation(one_pass[0], one_pass[1], pw.kept.cols, one_pass[2])
        return self._quantize_detected(x, pw, cfg)

    def _quantize_detected(self, x, pw, cfg: QuantConfig) -> QuantizedActivation:
        """CPU: outlier columns detected first, then quantized with them."""
        mask = None
        cols = torch.zeros(0, dtype=torch.int64)
        if cfg.decomposition:
            mask = cpu_ext.detect_outliers(x, cfg.alpha, cfg.outlier_cmp.inclusive)
            if pw.kept_rows.numel():
                mask[pw.kept_rows] = True
            cols = mask.nonzero().flatten()
        q, amax, vals = cpu_ext.quantize_rows(x, mask, cols)
        return QuantizedActivation(q, amax, cols, vals)

    def int8_matmul(self, a, pw) -> torch.Tensor:
        if self._is_cuda(a):
            return _CUDA.int8_matmul(a, pw)
        if a.dim() != 2 or a.shape[1] != pw.in_features:
            raise InputError(
                f"shape mismatch: a is {tuple(a.shape)}, layer in_features={pw.in_features}"
            )
        return cpu_ext.gemm(a, pw.packed, pw.out_features)

    def outlier_product(self, qa, pw):
        """CPU: the operands of the outlier product, (x[:, O] fp32, w[:, O].T fp32); the
        product itself is fused into :meth:`dequantize` (c FMAs per output element)."""
        if self._is_cuda(qa.int8):  # fp32: the CUDA dequantize kernel adds an fp32 product
            return quant.outlier_product(qa, pw, torch.float32)
        cols = qa.outlier_cols
        if cols.numel() == 0:
            return None
        values = qa.outlier_values.float().contiguous()
        kept = isinstance(pw, PackedWeight) and (
            cols is pw.kept_rows or torch.equal(cols, pw.kept_rows)
        )
        if kept:
            return values, pw.kept_t32
        w_rows = quant.outlier_weight_rows(pw, cols, torch.float32)  # (n, c)
        return values, w_rows.T.contiguous()

    def linear(self, x, pw, cfg: QuantConfig) -> torch.Tensor:
        """CPU: quantize, then the GEMM with the dequantization (scales, bias, the outlier
        product) fused into its tiles: the same numbers as the stages, no int32 product in
        memory. When the kept dims hold every outlier of the call, all of it is one extension
        call (:func:`cpu_ext.linear_kept`)."""
        if self._is_cuda(x):
            return super().linear(x, pw, cfg)
        one_call = pw.one_call if isinstance(pw, PackedWeight) else None
        if one_call is not None and (cfg.decomposition or not pw.kept_rows.numel()):
            alpha = cfg.alpha if cfg.decomposition else math.inf  # inf: vectorwise
            y = cpu_ext.linear_kept(x, one_call, alpha, cfg.outlier_cmp.inclusive)
            if y is not None:
                return y
            qa = self._quantize_detected(x, pw, cfg)  # an outlier outside the kept dims
        else:
            qa = self.quantize(x, pw, cfg)
        outlier = self.outlier_product(qa, pw)
        return cpu_ext.linear(qa.int8, pw.packed, pw.out_features, self._dequant(qa, pw, outlier))

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        if self._is_cuda(acc):
            return _CUDA.dequantize(acc, qa, pw, outlier)
        return cpu_ext.dequantize(acc, self._dequant(qa, pw, outlier))

    def _dequant(self, qa, pw, outlier) -> cpu_ext.Dequant:
        ox, ow = outlier if outlier is not None else (None, None)
        return cpu_ext.Dequant(qa.absmax, pw.absmax, pw.dtype, pw.bias_f32, ox, ow)


BACKEND = CustomBackend()
