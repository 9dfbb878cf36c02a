"""Checked Python wrappers around the CUTLASS extension ``kernelbench._cutlass``.

The CUTLASS kernels are compiled (sm_80 with CUTLASS 2.x, sm_90a with CUTLASS 3.x) and
unverified on a GPU until the ``cutlass`` backend lists a verified CUDA device; on CPU the
argument checks and the availability reasons are tested.

One operation, :func:`fused_int8_linear`: an int8 x int8 GEMM with int32 accumulation whose
epilogue applies LLM.int8()'s dequantization and writes 16-bit output directly (no int32
matrix in device memory)::

    out[i, j] = float(sum_k a[i, k] * b[j, k]) * row_absmax[i] * (col_absmax[j] / 127^2)
                + bias[j] + outlier[i, j]

Exact rules (checked in this order, before any GPU work, so they fail the same way on a CPU
machine: dtype, rank, contiguity, shapes, sizes, alignment, device, then the extension):

* ``a`` (m, k) and ``b`` (n, k) int8, contiguous (``b`` in nn.Linear layout);
* **k and n positive multiples of 16**, k <= 133144 (``k * 127^2`` fits the int32 accumulator; the
  ``cutlass`` backend pads k and n with zeros); m >= 0 free (m == 0 returns an empty result without
  a launch);
* ``row_absmax`` (m,), ``col_scale`` (n,) (= weight column absmax / 127^2, see
  :func:`col_scale`), ``bias`` (n,) or None, ``outlier`` (m, n) or None: all float32,
  contiguous;
* output float16 or bfloat16 (m, n), contiguous;
* **every data pointer 16-byte aligned** (``data_ptr() % 16 == 0``) -- a, b, out, outlier,
  row_absmax, col_scale, bias: TMA (sm90) and the vectorized broadcast loads need it. With k
  and n multiples of 16 each row of a, b, out and outlier then starts 16-byte aligned too. A
  fresh tensor from the caching allocator is always aligned; a slice may not be (``.clone()``);
* all tensors on one CUDA device, of compute capability 8.x or 9.0.

Streams: the launch is enqueued on ``torch.cuda.current_stream(device)``; sm90 kernels that ask
for a workspace get it from ``cudaMallocAsync`` on that stream. No host sync. Each instance keeps
its last initialized kernel per host thread: a call with the same pointers, sizes and stream only
launches it (no parameter or TMA descriptor rebuild, no ``cudaFuncSetAttribute``).
"""

from __future__ import annotations

import torch

from kernelbench.checks import check_tensor as _check_tensor
from kernelbench.checks import require as _require
from kernelbench.checks import same_cuda_device as _check_device
from kernelbench.kernels.cuda_ext import DTYPE_CODES
from kernelbench.kernels.padding import MAX_K
from kernelbench.quant import DEQUANT_CONSTANT

try:  # only built where nvcc and the CUTLASS headers were found (cmake/cuda.cmake)
    from kernelbench import _cutlass as _ext  # type: ignore[attr-defined]

    IMPORT_ERROR: str | None = None
except Exception as exc:  # ImportError, OSError
    _ext = None
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

#: Byte alignment of every pointer, and the multiple that k and n must be.
ALIGN_BYTES = 16
DIM_MULTIPLE = 16
#: m at or below which the small-M (decode) tile is used by default.
SMALL_M_MAX = 64
#: Tile choices: ``auto`` (by m), ``small_m``, ``large``.
TILES = {"auto": -1, "small_m": 0, "large": 1}
#: Compute capabilities with compiled instances: 8.x (sm_80 cubin) and 9.0 (sm_90a).
SUPPORTED_ARCH = "compute capability 8.x (sm_80 instances) or 9.0 (sm_90a instances)"

SIXTEEN_BIT = (torch.float16, torch.bfloat16)
_DTYPE_CODES = {t: DTYPE_CODES[t] for t in SIXTEEN_BIT}


class CutlassExtensionUnavailable(RuntimeError):
    """``kernelbench._cutlass`` is missing or there is no usable CUDA device."""


def extension_built() -> bool:
    return _ext is not None


def _arch_reason(device: torch.device | None = None) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if major == 8 or (major, minor) == (9, 0):
        return None
    return (
        f"the GPU {torch.cuda.get_device_name(device)!r} is compute capability {major}.{minor}; "
        f"the CUTLASS kernels are built for {SUPPORTED_ARCH} only"
    )


def unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Every reason the CUTLASS kernels cannot run here, joined; ``None`` when they can."""
    reasons = []
    cuda_ok = False
    if torch.version.cuda is None:
        reasons.append(f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)")
    elif not torch.cuda.is_available():
        reasons.append("torch sees no CUDA device (torch.cuda.is_available() is False)")
    else:
        cuda_ok = True
    if _ext is None:
        reasons.append(
            "the extension kernelbench._cutlass was not built with CUTLASS or does not load "
            f"({IMPORT_ERROR}); build with KERNELBENCH_CUDA=ON and the CUTLASS headers "
            "(KERNELBENCH_CUTLASS_ROOT or the nvidia-cutlass wheel, see docs/cuda.md)"
        )
    if cuda_ok:
        dev = torch.device(device) if device is not None else None
        if dev is None or dev.type == "cuda":
            why = _arch_reason(dev)
            if why:
                reasons.append(why)
    return "; ".join(reasons) if reasons else None


def info() -> dict:
    """CUTLASS version and the compiled instances (no GPU needed)."""
    return dict(_require_ext().cutlass_info())


# --- checks ----------------------------------------------------------------------------------


def _check_aligned(t: torch.Tensor | None, name: str) -> None:
    if t is None or t.numel() == 0:
        return
    off = t.data_ptr() % ALIGN_BYTES
    _require(
        off == 0,
        f"{name}.data_ptr() must be {ALIGN_BYTES}-byte aligned for the CUTLASS kernel "
        f"(it is {off} bytes off; use a fresh or .clone()d tensor)",
    )


def _require_ext():
    if _ext is None:
        raise CutlassExtensionUnavailable(
            f"kernelbench._cutlass is not available: {unavailable_reason()}"
        )
    return _ext


def check_shape_rule(m: int, k: int, n: int) -> str | None:
    """The size rule alone: ``None`` when (m, k, n) is allowed, else the reason."""
    if k % DIM_MULTIPLE or n % DIM_MULTIPLE or k < 1 or n < 1:
        return (
            f"the CUTLASS int8 GEMM needs k and n positive multiples of {DIM_MULTIPLE}, "
            f"got k={k}, n={n}"
        )
    if k > MAX_K:
        return f"the CUTLASS int8 GEMM needs k <= {MAX_K} (int32 accumulator), got k={k}"
    if max(m, n, k) >= 2**31:
        return f"the CUTLASS int8 GEMM needs m, n, k < 2^31, got m={m}, n={n}, k={k}"
    return None


def col_scale(col_absmax: torch.Tensor) -> torch.Tensor:
    """``col_absmax * (1/127^2)`` in float32, contiguous: the kernel's per-column factor.
    Computed once per prepared weight, not per call."""
    return (col_absmax.float() * DEQUANT_CONSTANT).contiguous()


def check_fused_operands(
    a: torch.Tensor,
    b: torch.Tensor,
    row_absmax: torch.Tensor,
    col_scale: torch.Tensor,
    bias: torch.Tensor | None,
    outlier: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.device:
    """The :func:`fused_int8_linear` rules (module docstring), without touching the GPU."""
    _check_tensor(a, "a", (torch.int8,), (-1, -1))
    _check_tensor(b, "b", (torch.int8,), (-1, -1))
    m, k = a.shape
    n = b.shape[0]
    _require(b.shape[1] == k, f"shape mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    _check_tensor(row_absmax, "row_absmax", (torch.float32,), (m,))
    _check_tensor(col_scale, "col_scale", (torch.float32,), (n,))
    if bias is not None:
        _check_tensor(bias, "bias", (torch.float32,), (n,))
    if outlier is not None:
        _check_tensor(outlier, "outlier", (torch.float32,), (m, n))
    _require(out_dtype in SIXTEEN_BIT, f"out_dtype must be float16/bfloat16, got {out_dtype}")
    if out is not None:
        _check_tensor(out, "out", (out_dtype,), (m, n))
    why = check_shape_rule(m, k, n)
    _require(why is None, why or "")
    named = [
        ("a", a),
        ("b", b),
        ("row_absmax", row_absmax),
        ("col_scale", col_scale),
        ("bias", bias),
        ("outlier", outlier),
        ("out", out),
    ]
    for name, t in named:
        _check_aligned(t, name)
    return _check_device(named)


def fused_int8_linear(
    a: torch.Tensor,
    b: torch.Tensor,
    row_absmax: torch.Tensor,
    col_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    outlier: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
    out: torch.Tensor | None = None,
    tile: str = "auto",
) -> torch.Tensor:
    """``float(a @ b.T) * outer(row_absmax, col_scale) + bias + outlier`` as ``out_dtype``, in
    one CUTLASS kernel (epilogue-fused dequantize). ``col_scale`` is ``col_absmax / 127^2``
    (:func:`col_scale`). ``tile``: ``auto`` (small-M tile for m <= 64), ``small_m`` or
    ``large``."""
    _require(tile in TILES, f"tile must be one of {', '.join(TILES)}, got {tile!r}")
    dev = check_fused_operands(a, b, row_absmax, col_scale, bias, outlier, out_dtype, out)
    m, k = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0:
        return out
    ext = _require_ext()
    why = _arch_reason(dev)
    if why:
        raise CutlassExtensionUnavailable(why)
    with torch.cuda.device(dev):
        ext.fused_int8_linear(
            a.data_ptr(),
            b.data_ptr(),
            row_absmax.data_ptr(),
            col_scale.data_ptr(),
            0 if bias is None else bias.data_ptr(),
            0 if outlier is None else outlier.data_ptr(),
            out.data_ptr(),
            _DTYPE_CODES[out_dtype],
            m,
            n,
            k,
            TILES[tile],
            torch.cuda.current_stream(dev).cuda_stream,
        )
    return out
