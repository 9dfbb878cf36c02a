"""``triton`` backend: our own Triton kernels for LLM.int8().

Kernels (built lazily on first use; importing this module never imports triton):

* ``_outlier_kernel``: one program per block of columns of ``x``; column max ``|x|`` over all
  rows, compared with alpha (``>`` or ``>=``, :class:`QuantConfig.outlier_cmp`) in float32 ->
  an int8 mask. The prepared weight's ``kept_rows`` are then set in the mask and its nonzero
  indices taken in torch (one host sync for the outlier count, as every backend does).
* ``_quantize_kernel``: one program per block of rows. Pass 1: row absmax over the non-outlier
  columns. Pass 2: ``q = round_half_even(x * (127 / absmax))`` with a correctly rounded division
  (``tl.math.div_rn``, i.e. ``127.f / absmax``) and the outlier columns zeroed, clamped to [-127,
  127]. A row whose absmax is below 2^-64 (``127 / absmax`` overflows float32 below about 3.7e-37)
  is scaled by 2^64 first, x and absmax alike (exact), as the CUDA kernel does. Rounding is done
  with floor/compare/parity (no libdevice), the same on a GPU and under the interpreter. The outlier
  values ``x[:, O]`` are gathered in torch.
* ``_gemm_kernel``: int8 x int8 ``tl.dot`` with int32 accumulation; with ``EPILOGUE`` the
  dequantization is fused: ``acc * (row_absmax[:, None] * (col_absmax[None, :] / 127^2))``
  (float32, the order of :func:`kernelbench.quant.dequantize_outer`) ``+ bias + outlier``, where
  the outlier product ``x[:, O] @ w[:, O].T`` is computed in the same epilogue as ``c`` rank-1
  float32 updates (``c`` = number of outlier dims), stored in the layer's dtype. Without
  ``EPILOGUE`` it stores the int32 product (the ``int8_matmul`` stage, ``int8_raw``).
* ``_dequantize_kernel``: the same epilogue on an int32 matrix (the ``dequantize`` stage).
  A row whose absmax is outside [2^-32, 2^32] (every row, when some column's is) takes the
  scale product in fp64, rounded once to fp32, as :func:`kernelbench.quant.dequantize_outer`.

``linear`` (what ``Runner.run`` times) = outlier detection + quantize + ONE fused GEMM kernel; no
int32 matrix is written. Methods: ``int8_raw``, ``vectorwise``, ``llm_int8`` and ``smoothquant``
(``linear`` on ``x / s`` with the weight ``w * s`` prepared offline:
:meth:`Backend._smoothquant_runner`). ``outlier_product`` returns the float32 operands
``(x[:, O], w[:, O])`` (gather + int8 reconstruction), the product itself runs in the epilogue.

Shape rule (:data:`MAX_K`): any ``m >= 0``, ``n >= 1``, ``1 <= k <= 133144`` (``k * 127^2`` must
fit the int32 accumulator); no alignment is required: tiles are powers of two >= 16 (``tl.dot``
needs >= 16) and ragged edges are masked (zero-filled K tail). ``x`` and the int8 operands
must be contiguous. Other shapes raise :class:`kernelbench.checks.InputError`.

Devices: timed on CUDA only (``availability``: triton importable, a CUDA device of compute
capability >= 8.0, interpreter off). Every kernel is launched with ``enable_fp_fusion=False``: no
multiply-add is contracted into an FMA, so each float32 product is rounded as in
:mod:`kernelbench.quant` (with fusion, ``v - floor(v)`` and the epilogue's ``acc * scale + bias``
would use the unrounded product and move codes and outputs by one step). On CPU the kernels run only
under the Triton interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which the tests
use for correctness at small sizes. The GPU path is unverified until it has run on a GPU; the
kernels were compiled ahead of time (triton 3.9, no device): the GEMM lowers to int8 ``mma.sync ...
s32.s8.s8.s32`` on sm_80 and ``wgmma ... s32.s8.s8`` on sm_90. The block sizes are an untuned
heuristic.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch

from kernelbench import quant
from kernelbench.backends.base import INT8_STAGE_METHODS, Availability, Backend
from kernelbench.checks import FLOAT_DTYPES
from kernelbench.checks import require as _require
from kernelbench.kernels import padding
from kernelbench.kernels.padding import extend_weight
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation

#: Largest k whose worst-case int32 sum ``k * 127 * 127`` cannot overflow.
MAX_K = padding.MAX_K
#: Launch option of every kernel: no FMA contraction (see the module docstring).
NO_FMA = {"enable_fp_fusion": False}
#: Rows with an absmax below TINY_ABSMAX are scaled by TINY_SCALE before quantizing (exact).
TINY_ABSMAX = 2.0**-64
TINY_SCALE = 2.0**64

CPU_REASON = (
    "triton kernels are timed only on CUDA; on CPU they run under the interpreter in tests only"
)


def shape_rule(m: int, k: int, n: int) -> str:
    """Empty when (m, k, n) is supported, else why not."""
    if m < 0:
        return f"m must be >= 0, got m={m}"
    if n < 1:
        return f"n must be >= 1, got n={n}"
    if not 1 <= k <= MAX_K:
        return f"k must be in [1, {MAX_K}] (int32 accumulator: k * 127^2 < 2^31), got k={k}"
    return ""


@functools.cache
def triton_import_error() -> str:
    """Empty when triton imports, else the error."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure only disables the backend
        return f"triton failed to import: {type(exc).__name__}: {exc}"
    return ""


tl = None  # triton.language, bound by _kernels()


@functools.cache
def _kernels():
    """Define the kernels (on first use: ``triton.jit`` reads TRITON_INTERPRET at this point)."""
    why = triton_import_error()
    if why:
        raise RuntimeError(why)
    # The kernels resolve names (``tl``, the helper jit functions) through this module's
    # globals, as triton's compiler and interpreter both do: bind them there.
    global tl, _round_half_even, _epilogue, _to_bf16
    import triton
    import triton.language as tl

    @triton.jit
    def _round_half_even(v):
        # exact for |v| < 2^23: v - floor(v) is exact, ties go to the even integer
        f = tl.floor(v)
        d = v - f
        fi = f.to(tl.int32)
        up = (d > 0.5) | ((d == 0.5) & ((fi & 1) == 1))
        return fi + up.to(tl.int32)

    @triton.jit
    def _to_bf16(y):
        # float32 -> bfloat16, round to nearest even, done on the bits (finite y): the Triton
        # interpreter's own fp32 -> bf16 cast truncates; this is the same on a GPU and there.
        u = y.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.to(tl.uint16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _outlier_kernel(
        x_ptr, mask_ptr, M, K, stride_xm, alpha,
        GE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        offs_k = pid * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        cmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for m0 in range(0, M, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
            ok = (offs_m[:, None] < M) & k_ok[None, :]
            v = tl.abs(tl.load(ptrs, mask=ok, other=0.0).to(tl.float32))
            cmax = tl.maximum(cmax, tl.max(v, axis=0))
        hit = cmax >= alpha if GE else cmax > alpha
        tl.store(mask_ptr + offs_k, hit.to(tl.int8), mask=k_ok)

    @triton.jit
    def _quantize_kernel(
        x_ptr, mask_ptr, q_ptr, amax_ptr, M, K, stride_xm, stride_qm, TINY_ABSMAX, TINY_SCALE,
        HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        rows = offs_m[:, None].to(tl.int64)
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            ok = m_ok[:, None] & (offs_k[None, :] < K)
            v = tl.abs(tl.load(x_ptr + rows * stride_xm + offs_k[None, :], mask=ok, other=0.0))
            v = v.to(tl.float32)
            if HAS_MASK:
                outl = tl.load(mask_ptr + offs_k, mask=offs_k < K, other=0) != 0
                v = tl.where(outl[None, :], 0.0, v)
            amax = tl.maximum(amax, tl.max(v, axis=1))
        pos = amax > 0
        pre = tl.where(amax < TINY_ABSMAX, TINY_SCALE, 1.0)  # 127 / absmax stays finite
        inv = tl.where(pos, tl.math.div_rn(tl.full((BLOCK_M,), 127.0, tl.float32),
                                           tl.where(pos, amax * pre, 1.0)), 0.0)  # fmt: skip
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            ok = m_ok[:, None] & (offs_k[None, :] < K)
            v = tl.load(x_ptr + rows * stride_xm + offs_k[None, :], mask=ok, other=0.0)
            v = (v.to(tl.float32) * pre[:, None]) * inv[:, None]
            if HAS_MASK:
                outl = tl.load(mask_ptr + offs_k, mask=offs_k < K, other=0) != 0
                v = tl.where(outl[None, :], 0.0, v)
            q = tl.minimum(tl.maximum(_round_half_even(v), -127), 127)
            tl.store(q_ptr + rows * stride_qm + offs_k[None, :], q.to(tl.int8), mask=ok)
        tl.store(amax_ptr + offs_m, amax, mask=m_ok)

    @triton.jit
    def _epilogue(
        acc, offs_m, offs_n, m_ok, n_ok, row_ptr, col_ptr, bias_ptr, xo_ptr, wo_ptr, C, dq,
        HAS_BIAS: tl.constexpr, HAS_OUTLIER: tl.constexpr, ALL_WIDE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        row = tl.load(row_ptr + offs_m, mask=m_ok, other=0.0)
        col = tl.load(col_ptr + offs_n, mask=n_ok, other=0.0)
        scale = row[:, None] * (col * dq)[None, :]  # dq: 1/127^2 as float32
        y = acc.to(tl.float32) * scale
        # rows whose scale is outside [2^-32, 2^32] (all rows with ALL_WIDE: some column's is)
        # take an fp64 scale, rounded once to fp32, as quant.dequantize_outer
        wide = (row != 0) & ((row < 2.3283064365386963e-10) | (row > 4294967296.0))
        if ALL_WIDE:
            wide = offs_m >= 0
        if tl.max(wide.to(tl.int32), axis=0) > 0:
            dq64 = tl.full((BLOCK_N,), 1.0, tl.float64) / 16129.0
            s64 = row.to(tl.float64)[:, None] * (col.to(tl.float64) * dq64)[None, :]
            y = tl.where(wide[:, None], (acc.to(tl.float64) * s64).to(tl.float32), y)
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_OUTLIER:
            o = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for c in range(0, C):
                xo = tl.load(xo_ptr + offs_m.to(tl.int64) * C + c, mask=m_ok, other=0.0)
                wo = tl.load(wo_ptr + offs_n.to(tl.int64) * C + c, mask=n_ok, other=0.0)
                o += xo[:, None] * wo[None, :]
            y = y + o
        return y

    @triton.jit
    def _gemm_kernel(
        a_ptr, b_ptr, out_ptr, row_ptr, col_ptr, bias_ptr, xo_ptr, wo_ptr,
        M, N, K, C, dq, stride_am, stride_bn, stride_om,
        EPILOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_OUTLIER: tl.constexpr,
        ALL_WIDE: tl.constexpr, OUT_BF16: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        grid_m = tl.cdiv(M, BLOCK_M)
        grid_n = tl.cdiv(N, BLOCK_N)
        width = GROUP_M * grid_n
        group = pid // width
        first_m = group * GROUP_M
        size_m = tl.minimum(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % width) % size_m
        pid_n = (pid % width) // size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        n_ok = offs_n < N
        a_rows = a_ptr + offs_m[:, None].to(tl.int64) * stride_am
        b_cols = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            a = tl.load(a_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
            b = tl.load(b_cols + offs_k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        ok = m_ok[:, None] & n_ok[None, :]
        if EPILOGUE:
            y = _epilogue(acc, offs_m, offs_n, m_ok, n_ok, row_ptr, col_ptr, bias_ptr, xo_ptr,
                          wo_ptr, C, dq, HAS_BIAS, HAS_OUTLIER, ALL_WIDE, BLOCK_M,
                          BLOCK_N)  # fmt: skip
            if OUT_BF16:
                tl.store(out, _to_bf16(y), mask=ok)
            else:
                tl.store(out, y.to(out_ptr.dtype.element_ty), mask=ok)
        else:
            tl.store(out, acc, mask=ok)

    @triton.jit
    def _dequantize_kernel(
        acc_ptr, out_ptr, row_ptr, col_ptr, bias_ptr, xo_ptr, wo_ptr, M, N, C, dq,
        stride_am, stride_om,
        HAS_BIAS: tl.constexpr, HAS_OUTLIER: tl.constexpr, ALL_WIDE: tl.constexpr,
        OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        n_ok = offs_n < N
        ok = m_ok[:, None] & n_ok[None, :]
        rows = offs_m[:, None].to(tl.int64)
        acc = tl.load(acc_ptr + rows * stride_am + offs_n[None, :], mask=ok, other=0)
        y = _epilogue(acc, offs_m, offs_n, m_ok, n_ok, row_ptr, col_ptr, bias_ptr, xo_ptr,
                      wo_ptr, C, dq, HAS_BIAS, HAS_OUTLIER, ALL_WIDE, BLOCK_M, BLOCK_N)  # fmt: skip
        out = out_ptr + rows * stride_om + offs_n[None, :]
        if OUT_BF16:
            tl.store(out, _to_bf16(y), mask=ok)
        else:
            tl.store(out, y.to(out_ptr.dtype.element_ty), mask=ok)

    interpret = type(_gemm_kernel).__name__ == "InterpretedFunction"
    return {
        "outlier": _outlier_kernel,
        "quantize": _quantize_kernel,
        "gemm": _gemm_kernel,
        "dequantize": _dequantize_kernel,
        "interpret": interpret,
    }


def interpreting() -> bool:
    """Whether the kernels run under the Triton interpreter (TRITON_INTERPRET=1 at build)."""
    return bool(_kernels()["interpret"])


def _pow2_at_least(v: int, lo: int, hi: int) -> int:
    p = lo
    while p < v and p < hi:
        p *= 2
    return p


def _gemm_config(m: int, n: int, k: int) -> dict:
    """Untuned heuristic tiles (powers of two, >= 16 as ``tl.dot`` requires)."""
    bm = _pow2_at_least(m, 16, 128)
    bn = _pow2_at_least(n, 16, 128)
    bk = _pow2_at_least(k, 32, 128)
    warps = 8 if bm * bn >= 128 * 128 else 4
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=3)


def _check_device(t: torch.Tensor, name: str) -> None:
    k = _kernels()
    if t.device.type == "cpu":
        _require(
            k["interpret"],
            f"{name} is a CPU tensor: the triton kernels run on CUDA; on CPU only under the "
            "Triton interpreter (TRITON_INTERPRET=1 set before triton is imported)",
        )
    else:
        _require(t.device.type == "cuda", f"{name} is on {t.device}; triton needs CUDA tensors")


def _check_float(t: torch.Tensor | None, name: str, shape: tuple[int, ...]) -> None:
    if t is None:
        return
    _require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)}")
    _require(t.dtype == torch.float32, f"{name} must be float32, got {t.dtype}")
    _require(tuple(t.shape) == shape, f"{name} must have shape {shape}, got {tuple(t.shape)}")
    _require(t.is_contiguous(), f"{name} must be contiguous")


@dataclass
class TritonWeight(PreparedWeight):
    """The prepared weight plus whether every column absmax is a float32-safe scale
    (:func:`kernelbench.quant.scale_is_safe`), known once here instead of per call."""

    cols_safe: bool


def _all_wide(pw: PreparedWeight) -> bool:
    """Whether every output row takes the fp64 scale (some column's scale is not safe)."""
    if isinstance(pw, TritonWeight):
        return not pw.cols_safe
    return not bool(quant.scale_is_safe(pw.absmax).all())  # one host sync


class TritonBackend(Backend):
    name = "triton"
    description = (
        "our Triton kernels: fused outlier detection + row quantize; int8 tl.dot GEMM with the "
        "dequantize + bias + outlier product fused in the epilogue (CUDA; unverified)"
    )
    methods = (*INT8_STAGE_METHODS, "smoothquant")

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        if device.type == "cpu":
            return Availability.no(CPU_REASON)
        if device.type != "cuda":
            return Availability.no(f"device type {device.type!r} is not supported")
        if not torch.cuda.is_available():
            return Availability.no("no CUDA device (torch.cuda.is_available() is False)")
        why = triton_import_error()
        if why:
            return Availability.no(why)
        try:
            cap = torch.cuda.get_device_capability(device)
        except Exception as exc:  # noqa: BLE001
            return Availability.no(f"cannot query {device}: {type(exc).__name__}: {exc}")
        if cap < (8, 0):
            return Availability.no(f"int8 tl.dot needs compute capability >= 8.0, got {cap}")
        if interpreting():
            return Availability.no("TRITON_INTERPRET=1 is set: the kernels would be interpreted")
        return Availability.yes()

    def supports(self, method, device, dtype, m, k, n) -> Availability:
        avail = super().supports(method, device, dtype, m, k, n)
        if not avail:
            return avail
        if dtype not in FLOAT_DTYPES:
            return Availability.no(f"dtype {dtype} is not fp16/bf16/fp32")
        why = shape_rule(m, k, n)
        return Availability.no(why) if why else Availability.yes()

    # --- stages ----------------------------------------------------------------------------

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> TritonWeight:
        pw = super().prepare_weight(weight, bias, cfg, kept_rows)
        safe = bool(quant.scale_is_safe(pw.absmax).all())
        return extend_weight(TritonWeight, pw, cols_safe=safe)

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        _require(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x)}")
        _require(x.dim() == 2, f"x must be 2-D (tokens, in_features), got {tuple(x.shape)}")
        _require(x.dtype in FLOAT_DTYPES, f"x dtype must be one of fp16/bf16/fp32, got {x.dtype}")
        _require(x.is_contiguous(), "x must be contiguous (call .contiguous())")
        m, k = x.shape
        _require(
            k == pw.in_features,
            f"shape mismatch: x is {tuple(x.shape)}, layer in_features={pw.in_features}",
        )
        why = shape_rule(m, k, pw.out_features)
        _require(not why, why)
        _check_device(x, "x")
        kern = _kernels()
        dev = x.device
        mask = None
        cols = torch.zeros(0, dtype=torch.int64, device=dev)
        if cfg.decomposition:
            mask = torch.zeros(k, dtype=torch.int8, device=dev)
            if m:
                bk = 64
                kern["outlier"][(triton_cdiv(k, bk),)](
                    x, mask, m, k, x.stride(0), float(cfg.alpha),
                    GE=cfg.outlier_cmp == ">=", BLOCK_M=32, BLOCK_K=bk, **NO_FMA,
                )  # fmt: skip
            if pw.kept_rows.numel():
                mask[pw.kept_rows.to(dev)] = 1
            cols = mask.nonzero().flatten()
            if cols.numel() == 0:
                mask = None
        q = torch.empty((m, k), dtype=torch.int8, device=dev)
        amax = torch.empty((m,), dtype=torch.float32, device=dev)
        if m:
            bm = 16 if m <= 16 else 32
            kern["quantize"][(triton_cdiv(m, bm),)](
                x, mask if mask is not None else q, q, amax, m, k, x.stride(0), q.stride(0),
                TINY_ABSMAX, TINY_SCALE, HAS_MASK=mask is not None, BLOCK_M=bm, BLOCK_K=128,
                **NO_FMA,
            )  # fmt: skip
        return QuantizedActivation(q, amax, cols, x[:, cols])

    def _check_a(self, a: torch.Tensor, pw: PreparedWeight) -> None:
        _require(isinstance(a, torch.Tensor), f"a must be a torch.Tensor, got {type(a)}")
        _require(a.dtype == torch.int8, f"a must be int8, got {a.dtype}")
        _require(a.dim() == 2, f"a must be 2-D, got shape {tuple(a.shape)}")
        _require(a.is_contiguous(), "a must be contiguous")
        _require(
            a.shape[1] == pw.in_features,
            f"shape mismatch: a is {tuple(a.shape)}, layer in_features={pw.in_features}",
        )
        _require(pw.int8 is not None, "the prepared weight has no int8 (n, k) matrix")
        _require(
            pw.int8.dtype == torch.int8 and pw.int8.is_contiguous(),
            "the prepared weight's int8 matrix must be contiguous int8",
        )
        _require(a.device == pw.int8.device, f"a is on {a.device}, weight on {pw.int8.device}")
        why = shape_rule(a.shape[0], a.shape[1], pw.out_features)
        _require(not why, why)
        _check_device(a, "a")

    def _launch_gemm(self, a, pw, out, row=None, col=None, bias=None, xo=None, wo=None):
        m, k = a.shape
        n = pw.out_features
        if m == 0:
            return out
        cfg = _gemm_config(m, n, k)
        grid = (triton_cdiv(m, cfg["BLOCK_M"]) * triton_cdiv(n, cfg["BLOCK_N"]),)
        c = xo.shape[1] if xo is not None else 0
        dummy = out
        _kernels()["gemm"][grid](
            a, pw.int8, out,
            row if row is not None else dummy, col if col is not None else dummy,
            bias if bias is not None else dummy,
            xo if xo is not None else dummy, wo if wo is not None else dummy,
            m, n, k, c, quant.DEQUANT_CONSTANT, a.stride(0), pw.int8.stride(0), out.stride(0),
            EPILOGUE=row is not None, HAS_BIAS=bias is not None, HAS_OUTLIER=c > 0,
            ALL_WIDE=row is not None and _all_wide(pw), OUT_BF16=out.dtype == torch.bfloat16,
            **cfg, **NO_FMA,
        )  # fmt: skip
        return out

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        """``a`` (m, k) int8 times the weight's int8 (n, k), transposed: exact int32 (m, n)."""
        self._check_a(a, pw)
        out = torch.empty((a.shape[0], pw.out_features), dtype=torch.int32, device=a.device)
        return self._launch_gemm(a, pw, out)

    def outlier_product(self, qa: QuantizedActivation, pw: PreparedWeight):
        """The float32 operands ``(x[:, O] (m, c), w[:, O] (n, c))`` of eq. 8's product, or
        ``None``; the product itself runs in the GEMM / dequantize epilogue."""
        if qa.outlier_cols.numel() == 0:
            return None
        w_rows = quant.outlier_weight_rows(pw, qa.outlier_cols, torch.float32)
        return qa.outlier_values.float().contiguous(), w_rows.contiguous()

    def _epilogue_args(self, qa, pw, outlier, m):
        n = pw.out_features
        _check_float(qa.absmax, "row absmax", (m,))
        _check_float(pw.absmax, "column absmax", (n,))
        bias = pw.bias
        if bias is not None:
            _require(
                bias.dtype in FLOAT_DTYPES and tuple(bias.shape) == (n,) and bias.is_contiguous(),
                f"bias must be a contiguous ({n},) float tensor",
            )
        xo = wo = None
        if outlier is not None:
            _require(
                isinstance(outlier, tuple) and len(outlier) == 2,
                "outlier must be the (x[:, O], w[:, O]) pair from TritonBackend.outlier_product",
            )
            xo, wo = outlier
            c = xo.shape[1] if xo.dim() == 2 else -1
            _check_float(xo, "outlier x[:, O]", (m, c))
            _check_float(wo, "outlier w[:, O]", (n, c))
            if c == 0:
                xo = wo = None
        return qa.absmax, pw.absmax, bias, xo, wo

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        _require(isinstance(acc, torch.Tensor), f"acc must be a torch.Tensor, got {type(acc)}")
        _require(acc.dtype == torch.int32, f"acc must be int32, got {acc.dtype}")
        _require(acc.dim() == 2 and acc.shape[1] == pw.out_features,
                 f"acc must be (m, {pw.out_features}), got {tuple(acc.shape)}")  # fmt: skip
        _require(acc.is_contiguous(), "acc must be contiguous")
        _check_device(acc, "acc")
        m, n = acc.shape
        row, col, bias, xo, wo = self._epilogue_args(qa, pw, outlier, m)
        out = torch.empty((m, n), dtype=pw.dtype, device=acc.device)
        if m == 0:
            return out
        bm, bn = 32, 64
        c = xo.shape[1] if xo is not None else 0
        _kernels()["dequantize"][(triton_cdiv(m, bm), triton_cdiv(n, bn))](
            acc, out, row, col, bias if bias is not None else out,
            xo if xo is not None else out, wo if wo is not None else out,
            m, n, c, quant.DEQUANT_CONSTANT, acc.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, HAS_OUTLIER=c > 0, ALL_WIDE=_all_wide(pw),
            OUT_BF16=out.dtype == torch.bfloat16,
            BLOCK_M=bm, BLOCK_N=bn, **NO_FMA,
        )  # fmt: skip
        return out

    def fused(self, qa: QuantizedActivation, pw: PreparedWeight, outlier) -> torch.Tensor:
        """One kernel: int8 GEMM + dequantize + bias + outlier product -> ``pw.dtype``."""
        self._check_a(qa.int8, pw)
        m = qa.int8.shape[0]
        row, col, bias, xo, wo = self._epilogue_args(qa, pw, outlier, m)
        out = torch.empty((m, pw.out_features), dtype=pw.dtype, device=qa.int8.device)
        return self._launch_gemm(qa.int8, pw, out, row, col, bias, xo, wo)

    def linear(self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig) -> torch.Tensor:
        qa = self.quantize(x, pw, cfg)
        return self.fused(qa, pw, self.outlier_product(qa, pw))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


BACKEND = TritonBackend()
