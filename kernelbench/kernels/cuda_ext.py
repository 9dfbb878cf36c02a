"""Checked Python wrappers around the CUDA extension ``kernelbench._cuda``.

The kernels are compiled for sm_80 and sm_90a and unverified on a GPU until a backend lists a
verified CUDA device; on CPU the argument checks, the availability reasons and the calls made
into the extension (with a recording stand-in) are tested.

The extension takes raw device pointers, so every wrapper validates its arguments first and
raises :class:`kernelbench.checks.InputError` with the problem named. Checks run in this order
(so a bad shape or dtype is reported even on a machine without a GPU): dtype, rank, contiguity,
shapes, the size/alignment rules below, device, then the extension's presence.

Exact rules:

* ``int8_gemm(a, b)``: ``a`` (m, k) and ``b`` (n, k) int8, contiguous, on one CUDA device; **k and n
  multiples of 16** and k <= 133144 (``k * 127^2`` fits the int32 accumulator; the backends pad k
  and n with zeros, :mod:`kernelbench.kernels.padding`), ``a.data_ptr()``, ``b.data_ptr()`` (and
  ``out``'s) multiples of 16 bytes; m >= 0 is free (m == 0 returns an empty result without a
  launch). cuBLASLt's heuristic is told the operands are 16-byte aligned, and with k, n multiples
  of 16 every row of a, b and the int32 output starts 16-byte aligned too.
* ``detect_outliers`` / ``quantize_rows``: ``x`` (m, k) float16 or bfloat16, contiguous, CUDA, any m
  >= 0 and k >= 1 (m == 0: empty results, no call into the extension). The 16-byte vector path is
  taken when k % 8 == 0 and the pointers are 16-byte aligned; otherwise a scalar path runs (same
  results).
* ``dequantize``: ``acc`` (m, n) int32; scales, bias and the outlier product float32; output
  float16 or bfloat16; any n >= 1 (vector path when n % 8 == 0 and all pointers are 16-byte
  aligned).

Streams: every call is enqueued on ``torch.cuda.current_stream(device)``. The only host sync is
:func:`detect_outliers` reading the outlier count.
"""

from __future__ import annotations

import torch

from kernelbench import quant
from kernelbench.checks import check_tensor as _check_tensor
from kernelbench.checks import require as _require
from kernelbench.checks import same_cuda_device as _check_device
from kernelbench.kernels.padding import MAX_K

try:  # the module is only built where a CUDA toolchain was found (cmake/cuda.cmake)
    from kernelbench import _cuda as _ext  # type: ignore[attr-defined]

    IMPORT_ERROR: str | None = None
except Exception as exc:  # ImportError, or OSError when libcublasLt cannot be loaded
    _ext = None
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

#: Byte alignment of pointers, and the multiple that k and n must be for the int8 GEMM.
GEMM_ALIGN_BYTES = 16
GEMM_DIM_MULTIPLE = 16

#: Element type codes of every kernelbench extension (csrc/kb_dtype.h: kb::DType).
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
SIXTEEN_BIT = (torch.float16, torch.bfloat16)


class CudaExtensionUnavailable(RuntimeError):
    """``kernelbench._cuda`` is missing or there is no usable CUDA device."""


def extension_built() -> bool:
    return _ext is not None


def unavailable_reason() -> str | None:
    """Every reason the CUDA kernels cannot run here, joined; ``None`` when they can."""
    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)")
    elif not torch.cuda.is_available():
        reasons.append("torch sees no CUDA device (torch.cuda.is_available() is False)")
    if _ext is None:
        reasons.append(
            "the CUDA extension kernelbench._cuda was not built or does not load "
            f"({IMPORT_ERROR}); build with KERNELBENCH_CUDA=ON and nvcc + cuBLASLt present"
        )
    return "; ".join(reasons) if reasons else None


def info() -> dict:
    """Versions reported by the extension (needs a CUDA driver for the runtime part)."""
    ext = _require_ext()
    out = dict(ext.cublaslt_info())
    out.update(ext.runtime_info())
    return out


# --- checks ----------------------------------------------------------------------------------


def _check_aligned(t: torch.Tensor, name: str) -> None:
    _require(
        t.data_ptr() % GEMM_ALIGN_BYTES == 0,
        f"{name}.data_ptr() must be {GEMM_ALIGN_BYTES}-byte aligned for the int8 GEMM "
        f"(it is {t.data_ptr() % GEMM_ALIGN_BYTES} bytes off; use a fresh or .clone()d tensor)",
    )


def _require_ext():
    if _ext is None:
        raise CudaExtensionUnavailable(
            f"kernelbench._cuda is not available: {unavailable_reason()}"
        )
    return _ext


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


def _stream(dev: torch.device) -> int:
    return torch.cuda.current_stream(dev).cuda_stream


# --- wrappers --------------------------------------------------------------------------------


def check_gemm_operands(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The :func:`int8_gemm` rules (see the module docstring), without touching the GPU."""
    _check_tensor(a, "a", (torch.int8,), (-1, -1))
    _check_tensor(b, "b", (torch.int8,), (-1, -1))
    m, k = a.shape
    n = b.shape[0]
    _require(b.shape[1] == k, f"shape mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    _require(
        k % GEMM_DIM_MULTIPLE == 0 and n % GEMM_DIM_MULTIPLE == 0,
        f"the cuBLASLt int8 GEMM needs k and n multiples of {GEMM_DIM_MULTIPLE}, got k={k}, n={n}",
    )
    _require(k <= MAX_K, f"k must be <= {MAX_K} (int32 accumulator: k * 127^2 < 2^31), got k={k}")
    _check_aligned(a, "a")
    _check_aligned(b, "b")
    if out is not None:
        _check_tensor(out, "out", (torch.int32,), (m, n))
        _check_aligned(out, "out")
    _check_device([("a", a), ("b", b), ("out", out)])


def int8_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a (m, k) @ b (n, k).T`` exactly, int32 (m, n), through cuBLASLt."""
    check_gemm_operands(a, b, out)
    m, k = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.int32, device=a.device)
    if m == 0:
        return out
    ext = _require_ext()
    with torch.cuda.device(a.device):
        ext.int8_gemm(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, _stream(a.device))
    return out


def int8_gemm_outer_scaled(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """EXPERIMENTAL: ``outer(a_scale, b_scale) * (a @ b.T)`` in one cuBLASLt call
    with the OUTER_VEC_32F scale mode. cuBLASLt may not support this mode for int8: the call then
    raises RuntimeError with cuBLASLt's status. Nothing in kernelbench depends on it."""
    check_gemm_operands(a, b)
    m, n = a.shape[0], b.shape[0]
    _check_tensor(a_scale, "a_scale", (torch.float32,), (m,))
    _check_tensor(b_scale, "b_scale", (torch.float32,), (n,))
    _require(out_dtype in DTYPE_CODES, f"out_dtype must be fp16/bf16/fp32, got {out_dtype}")
    dev = _check_device([("a", a), ("a_scale", a_scale), ("b_scale", b_scale)])
    out = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0:
        return out
    ext = _require_ext()
    with torch.cuda.device(dev):
        ext.int8_gemm_outer_scaled(
            a.data_ptr(),
            b.data_ptr(),
            a_scale.data_ptr(),
            b_scale.data_ptr(),
            out.data_ptr(),
            DTYPE_CODES[out_dtype],
            m,
            n,
            a.shape[1],
            _stream(dev),
        )
    return out


def detect_outliers(
    x: torch.Tensor,
    alpha: float,
    cmp: str,
    kept_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted int64 outlier columns of ``x`` (some ``|x| > alpha``, or ``>=``) plus
    ``kept_rows``, and the (k,) uint8 mask. One host sync (the count)."""
    _check_tensor(x, "x", SIXTEEN_BIT, (-1, -1))
    _require(x.shape[1] > 0, f"x has no columns: shape {tuple(x.shape)}")
    _require(cmp in (">", ">="), f"cmp must be '>' or '>=', got {cmp!r}")
    if kept_rows is not None:
        _check_tensor(kept_rows, "kept_rows", (torch.int64,), (-1,))
    dev = _check_device([("x", x), ("kept_rows", kept_rows)])
    m, k = x.shape
    colmax = torch.empty(k, dtype=torch.float32, device=dev)
    mask = torch.empty(k, dtype=torch.uint8, device=dev)
    cols = torch.empty(k, dtype=torch.int64, device=dev)
    count = torch.empty(1, dtype=torch.int32, device=dev)
    r = 0 if kept_rows is None else kept_rows.numel()
    ext = _require_ext()
    with torch.cuda.device(dev):
        c = ext.detect_outliers(
            _ptr(x),
            m,
            k,
            DTYPE_CODES[x.dtype],
            float(alpha),
            cmp == ">=",
            _ptr(kept_rows),
            r,
            colmax.data_ptr(),
            mask.data_ptr(),
            cols.data_ptr(),
            count.data_ptr(),
            _stream(dev),
        )
    return cols[:c], mask


def quantize_rows(
    x: torch.Tensor,
    mask: torch.Tensor | None,
    cols: torch.Tensor,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8 (m, k) with the ``mask`` columns zeroed, float32 row absmax over the other columns,
    and ``x[:, cols]`` (m, c). ``out`` = preallocated (int8, absmax, values). With m == 0 the
    (empty) outputs are returned without a call into the extension."""
    _check_tensor(x, "x", SIXTEEN_BIT, (-1, -1))
    m, k = x.shape
    _require(k > 0, f"x has no columns: shape {tuple(x.shape)}")
    _check_tensor(cols, "cols", (torch.int64,), (-1,))
    c = cols.numel()
    _require(c <= k, f"{c} outlier columns for k={k}")
    if mask is not None:
        _check_tensor(mask, "mask", (torch.uint8, torch.bool), (k,))
    _require(c == 0 or mask is not None, "quantize_rows needs the mask when cols is not empty")
    if out is None:
        dev = x.device
        out = (
            torch.empty((m, k), dtype=torch.int8, device=dev),
            torch.empty(m, dtype=torch.float32, device=dev),
            torch.empty((m, c), dtype=x.dtype, device=dev),
        )
    q, amax, vals = out
    _check_tensor(q, "out int8", (torch.int8,), (m, k))
    _check_tensor(amax, "out absmax", (torch.float32,), (m,))
    _check_tensor(vals, "out values", (x.dtype,), (m, c))
    dev = _check_device(
        [("x", x), ("mask", mask), ("cols", cols), ("q", q), ("absmax", amax), ("values", vals)]
    )
    if m == 0:
        return q, amax, vals
    ext = _require_ext()
    with torch.cuda.device(dev):
        ext.quantize_rows(
            _ptr(x),
            m,
            k,
            DTYPE_CODES[x.dtype],
            _ptr(mask) if c else 0,
            _ptr(cols),
            c,
            _ptr(q),
            _ptr(amax),
            _ptr(vals),
            _stream(dev),
        )
    return q, amax, vals


def dequantize(
    acc: torch.Tensor,
    row_absmax: torch.Tensor,
    col_absmax: torch.Tensor,
    bias: torch.Tensor | None,
    outlier: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
    cols_safe: bool | None = None,
) -> torch.Tensor:
    """``acc * row_absmax x col_absmax / 127^2 + bias + outlier`` in fp32, stored as
    ``out_dtype`` (fp16/bf16). ``bias`` (n,) and ``outlier`` (m, n) float32 or None.
    ``cols_safe``: whether every column absmax is a float32-safe scale
    (:func:`kernelbench.quant.scale_is_safe`; else every row takes an fp64 scale, as
    :func:`kernelbench.quant.dequantize_outer`); ``None`` computes it here (one host sync)."""
    _check_tensor(acc, "acc", (torch.int32,), (-1, -1))
    m, n = acc.shape
    _require(n > 0, f"acc has no columns: shape {tuple(acc.shape)}")
    _check_tensor(row_absmax, "row_absmax", (torch.float32,), (m,))
    _check_tensor(col_absmax, "col_absmax", (torch.float32,), (n,))
    if bias is not None:
        _check_tensor(bias, "bias", (torch.float32,), (n,))
    if outlier is not None:
        _check_tensor(outlier, "outlier", (torch.float32,), (m, n))
    _require(out_dtype in SIXTEEN_BIT, f"out_dtype must be float16/bfloat16, got {out_dtype}")
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=acc.device)
    _check_tensor(out, "out", (out_dtype,), (m, n))
    dev = _check_device(
        [
            ("acc", acc),
            ("row_absmax", row_absmax),
            ("col_absmax", col_absmax),
            ("bias", bias),
            ("outlier", outlier),
            ("out", out),
        ]
    )
    if m == 0:
        return out
    ext = _require_ext()
    if cols_safe is None:
        cols_safe = bool(quant.scale_is_safe(col_absmax).all())
    with torch.cuda.device(dev):
        ext.dequantize(
            acc.data_ptr(),
            m,
            n,
            row_absmax.data_ptr(),
            col_absmax.data_ptr(),
            _ptr(bias),
            _ptr(outlier),
            out.data_ptr(),
            DTYPE_CODES[out_dtype],
            cols_safe,
            _stream(dev),
        )
    return out
