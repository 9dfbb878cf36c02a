"""The quantization math of LLM.int8() and its baselines, written once.

Every backend either calls these functions or is tested against them, and the float64 oracle
(:mod:`kernelbench.oracle`) runs the very same functions with ``compute_dtype=torch.float64``.

Conventions (see ``../shared/paper/llm-int8-card.txt``):

* ``x`` is the activation matrix, shape ``(m, k)`` (tokens x in-features).
* ``w`` is the weight in ``nn.Linear`` layout, shape ``(n, k)`` (out-features x in-features), so the
  layer computes ``x @ w.T + bias``. Row ``j`` of ``w`` is output column ``j`` of the paper's ``W``;
  a per-row scale of ``w`` is the paper's per-output-column scale ``c_w`` (eq. 7).
* Absmax scales are stored as the absolute maximum itself (``absmax``), never as ``127 / absmax``:
  ``q = round(x * (127 / absmax))`` and ``x ~= q * absmax / 127``. An all-zero slice has
  ``absmax = 0`` and quantizes to zeros (no inf, no NaN).
* Rounding is round-half-to-even (``torch.round``, and ``cvtps`` / ``nearbyint`` in the kernels).
* The int8 range is the symmetric ``[-127, 127]``; -128 never comes out of a quantizer.
* Outlier feature dimensions (eq. 8) are the columns of ``x`` with some ``|x| > alpha`` (the
  paper's wording) or ``>= alpha`` (bitsandbytes); ``alpha <= 0`` turns decomposition off.
  Row scales of ``x`` leave the whole outlier columns out (the paper is silent; bitsandbytes
  leaves out only the outlier *entries*, so a small value in an outlier column still counts).
* Outlier weight rows are either the original 16-bit rows kept at prepare time (``"fp16"``, paper
  eq. 8) or reconstructed from the int8 weights (``"int8"``, bitsandbytes).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Literal, TypeVar

import torch

from kernelbench import settings

INT8_MAX = 127
# 1/127^2 = 6.2000124e-05 exactly as computed; bitsandbytes writes 6.200124e-05, which differs
# from 1/127^2 by 1.8e-5 relative.
DEQUANT_CONSTANT = 1.0 / (INT8_MAX * INT8_MAX)

# Absmax below this is rescaled by TINY_RESCALE (exactly) before 127 / absmax (quantize_absmax).
TINY_ABSMAX = 2.0**-64
TINY_RESCALE = 2.0**64
# Absmax scales (or 0) for which the float32 dequantization is safe (dequantize_outer).
SCALE_SAFE = (2.0**-32, 2.0**32)


class OutlierTest(str, Enum):
    """The outlier test of eq. 8, one type from the CLI to the kernels: some ``|x| > alpha``
    in a column (the paper's wording) or ``|x| >= alpha`` (bitsandbytes). Compares equal to
    its string; a kernel takes :attr:`inclusive`."""

    GT = ">"
    GE = ">="

    @property
    def inclusive(self) -> bool:
        """``alpha`` itself is an outlier (``>=``)."""
        return self is OutlierTest.GE

    def __str__(self) -> str:
        return self.value


OutlierWeights = Literal["fp16", "int8"]

_Weight = TypeVar("_Weight", bound="PreparedWeight")


@dataclass(frozen=True)
class QuantConfig:
    """The knobs of LLM.int8() that the paper and its official code set differently."""

    alpha: float = settings.default("alpha")
    #: a string ">" / ">=" is converted
    outlier_cmp: OutlierTest = OutlierTest(settings.default("outlier_cmp"))
    outlier_weights: OutlierWeights = settings.default("outlier_weights")

    def __post_init__(self) -> None:
        """Each knob checked against its declared range (:mod:`kernelbench.settings`): a
        :class:`~kernelbench.settings.SettingError` (a ``ValueError``) naming it."""
        cmp = str(getattr(self.outlier_cmp, "value", self.outlier_cmp))
        settings.check("outlier_cmp", cmp, label="outlier_cmp")
        object.__setattr__(self, "outlier_cmp", OutlierTest(cmp))
        settings.check("outlier_weights", self.outlier_weights, label="outlier_weights")
        settings.check("alpha", self.alpha, label="alpha")

    @property
    def decomposition(self) -> bool:
        return self.alpha > 0

    def without_decomposition(self) -> QuantConfig:
        return QuantConfig(0.0, self.outlier_cmp, self.outlier_weights)


def method_config(method: str, cfg: QuantConfig) -> QuantConfig:
    """``vectorwise`` is LLM.int8() with the threshold off; everything else keeps ``cfg``."""
    return cfg.without_decomposition() if method != "llm_int8" else cfg


@dataclass(frozen=True)
class Problem:
    """One layer call to compute: ``method`` on 16-bit activations ``x`` (m, k), ``weight``
    (n, k) and ``bias``, under ``cfg``; ``kept_rows`` are the calibrated outlier dims whose
    16-bit weights ``llm_int8`` keeps. What a backend builds a runner for, the oracle emulates
    and the contract checks."""

    method: str
    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    cfg: QuantConfig = QuantConfig()
    kept_rows: torch.Tensor | None = None

    @property
    def method_cfg(self) -> QuantConfig:
        """The config the method runs with (:func:`method_config`)."""
        return method_config(self.method, self.cfg)

    @property
    def method_kept_rows(self) -> torch.Tensor | None:
        """The kept dims, for ``llm_int8`` only (every other method ignores them)."""
        return self.kept_rows if self.method == "llm_int8" else None

    def cpu(self) -> Problem:
        """The same problem with every tensor on the CPU."""
        return Problem(
            self.method,
            self.x.cpu(),
            self.weight.cpu(),
            self.bias.cpu() if self.bias is not None else None,
            self.cfg,
            self.kept_rows.cpu() if self.kept_rows is not None else None,
        )


# --- absmax ----------------------------------------------------------------------------------


def absmax(t: torch.Tensor, dim: int | None, compute_dtype: torch.dtype) -> torch.Tensor:
    """Largest magnitude over ``dim`` (``None``: whole tensor), in ``compute_dtype``."""
    a = t.to(compute_dtype).abs()
    if dim is None:
        return a.amax() if a.numel() else torch.zeros((), dtype=compute_dtype, device=t.device)
    if a.shape[dim] == 0:
        shape = list(a.shape)
        del shape[dim]
        return torch.zeros(shape, dtype=compute_dtype, device=t.device)
    return a.amax(dim=dim)


def quantize_absmax(
    t: torch.Tensor, amax: torch.Tensor, compute_dtype: torch.dtype
) -> torch.Tensor:
    """``round(t * 127 / amax)`` as int8; ``amax`` broadcasts against ``t``; zero amax gives 0.

    An absmax below ``TINY_ABSMAX`` (where ``127 / amax`` would overflow float32, below about
    3.7e-37) is quantized as ``(t * 2^64) * (127 / (amax * 2^64))``: a power-of-two rescale is
    exact, so those codes are what an exponent-unbounded float32 would give, and every other
    code is unchanged (the kernels do the same)."""
    return _quantize_owned(t.to(compute_dtype, copy=True), amax.to(compute_dtype))


def _quantize_owned(tc: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """:func:`quantize_absmax` of ``tc``, already in the compute dtype, which it overwrites
    (in-place steps: the same arithmetic, without a temporary per step)."""
    tiny = (amax > 0) & (amax < TINY_ABSMAX)
    if bool(tiny.any()):
        pre = torch.where(tiny, TINY_RESCALE, 1.0).to(tc.dtype)
        amax = amax * pre
        tc.mul_(pre)
    # A true division (``127 / tensor`` in torch is reciprocal-then-multiply, which rounds
    # differently): the same ``127.f / absmax`` the kernels compute.
    safe = torch.where(amax > 0, amax, 1)
    inv = torch.where(amax > 0, torch.full_like(safe, INT8_MAX) / safe, 0)
    return tc.mul_(inv).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)


def quantize_tensorwise(t: torch.Tensor, compute_dtype=torch.float32):
    """Absmax over the whole tensor (§2.1): one scale."""
    amax = absmax(t, None, compute_dtype)
    return quantize_absmax(t, amax, compute_dtype), amax


def quantize_rowwise(t: torch.Tensor, compute_dtype=torch.float32):
    """Absmax per row: for ``x`` one scale per token, for ``w`` (n, k) one per output column."""
    amax = absmax(t, 1, compute_dtype)
    return quantize_absmax(t, amax[:, None], compute_dtype), amax


def quantize_offline(t: torch.Tensor, per_row: bool, compute_dtype=torch.float32):
    """:func:`quantize_rowwise` (``per_row``) or :func:`quantize_tensorwise` of a 2-D weight,
    computed in row blocks of about ``WEIGHT_BLOCK_ELEMENTS``: the same codes and scales,
    without full-size float temporaries (at 175B shapes, gigabytes each)."""
    n, k = t.shape
    q = torch.empty((n, k), dtype=torch.int8, device=t.device)
    if per_row:  # each row's scale is its own: one pass
        amax = torch.empty(n, dtype=compute_dtype, device=t.device)
        for rows in row_blocks(n, k):
            block = t[rows].to(compute_dtype, copy=True)
            amax[rows] = absmax(block, 1, compute_dtype)
            q[rows] = _quantize_owned(block, amax[rows, None])
        return q, amax
    amax = torch.zeros((), dtype=compute_dtype, device=t.device)
    for rows in row_blocks(n, k):
        amax = torch.maximum(amax, absmax(t[rows], None, compute_dtype))
    for rows in row_blocks(n, k):
        q[rows] = quantize_absmax(t[rows], amax, compute_dtype)
    return q, amax


def scale_is_safe(amax: torch.Tensor) -> torch.Tensor:
    """Absmax values whose float32 dequantization cannot underflow or overflow in between."""
    return (amax == 0) | ((amax >= SCALE_SAFE[0]) & (amax <= SCALE_SAFE[1]))


def dequantize_outer(
    acc: torch.Tensor, row_amax: torch.Tensor, col_amax: torch.Tensor, compute_dtype=torch.float32
) -> torch.Tensor:
    """eq. 7: ``acc * (row_amax x col_amax) / 127^2`` (``acc`` is the int32 product).

    In float32, ``acc * (row * (col / 127^2))``. A row whose scale is outside ``SCALE_SAFE``
    (or every row, when some column's is) is computed with a float64 scale and rounded once to
    float32: in float32 the scale product could underflow (lose digits) or overflow although
    the output itself is representable. The kernels take the same rows the same way."""
    scale = row_amax.to(compute_dtype)[:, None] * (col_amax.to(compute_dtype) * DEQUANT_CONSTANT)
    y = acc.to(compute_dtype) * scale
    if compute_dtype == torch.float64 or y.numel() == 0:
        return y
    wide = ~scale_is_safe(row_amax)
    if not bool(scale_is_safe(col_amax).all()):
        wide = torch.ones_like(wide)
    if bool(wide.any()):
        f64 = torch.float64
        wide_scale = row_amax[wide].to(f64)[:, None] * (col_amax.to(f64) * DEQUANT_CONSTANT)
        y[wide] = (acc[wide].to(f64) * wide_scale).to(compute_dtype)
    return y


# --- zeropoint (asymmetric) --------------------------------------------------------------------


@dataclass
class ZeropointQuantized:
    """``q = clamp(round(t * nd) + zp, -127, 127)``; ``t ~= (q - zp) / nd``.

    eq. 2 as printed multiplies by the minimum, which is no zero point (see the card's
    "Pitfalls"). This is the textbook form: ``nd = 254 / (max - min)`` (eq. 1) with an integer
    zero point that maps ``min`` to -127. The range is widened to include 0 (as PyTorch's
    observers do), so zero is exact and a constant slice still quantizes; all-zero gives 0.
    """

    q: torch.Tensor  # int8
    nd: torch.Tensor  # per slice (keepdim), compute dtype
    zp: torch.Tensor  # per slice (keepdim), integer-valued, compute dtype


def quantize_zeropoint(
    t: torch.Tensor,
    dim: int | None,
    compute_dtype=torch.float32,
    bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Zeropoint codes of ``t`` per slice along ``dim`` (``None``: one range for the tensor).
    ``bounds`` (min, max) gives the per-tensor range of a larger tensor ``t`` is part of."""
    tc = t.to(compute_dtype)
    if bounds is not None:
        lo = bounds[0].to(compute_dtype).clamp(max=0)
        hi = bounds[1].to(compute_dtype).clamp(min=0)
    elif dim is None:
        lo, hi = tc.amin().clamp(max=0), tc.amax().clamp(min=0)
    else:
        lo = tc.amin(dim=dim, keepdim=True).clamp(max=0)
        hi = tc.amax(dim=dim, keepdim=True).clamp(min=0)
    span = hi - lo
    nd = torch.where(span > 0, 2 * INT8_MAX / torch.where(span > 0, span, 1), 0)
    zp = -torch.round(lo * nd) - INT8_MAX
    zp = torch.where(span > 0, zp, 0)
    q = (torch.round(tc * nd) + zp).clamp_(-INT8_MAX, INT8_MAX)
    return ZeropointQuantized(q.to(torch.int8), nd, zp)


def zeropoint_matmul(
    xq: ZeropointQuantized, wq: ZeropointQuantized, compute_dtype=torch.float32
) -> torch.Tensor:
    """eq. 5: ``(qx - zx)(qw - zw)^T / (ndx ndw)`` expanded around one integer product, as a
    GPU without the eq. 4 instruction must do it. ``xq`` is (m, k) per row or per tensor; ``wq``
    is (n, k) per row or per tensor."""
    qx = xq.q.to(torch.int64)
    qw = wq.q.to(torch.int64)
    k = qx.shape[1]
    acc = exact_int_product(qx, qw).to(compute_dtype)
    zx = xq.zp.reshape(-1, 1)
    zw = wq.zp.reshape(1, -1)
    rx = qx.sum(1, keepdim=True).to(compute_dtype)
    rw = qw.sum(1).reshape(1, -1).to(compute_dtype)
    centered = acc - zw * rx - zx * rw + k * zx * zw
    denom = xq.nd.reshape(-1, 1) * wq.nd.reshape(1, -1)
    return torch.where(denom > 0, centered / torch.where(denom > 0, denom, 1), 0)


# --- outliers and the mixed-precision decomposition ---------------------------------------------


def outlier_mask(x: torch.Tensor, alpha: float, cmp: OutlierTest | str) -> torch.Tensor:
    """Bool mask over the k columns of ``x``: some ``|x| > alpha`` (or ``>=``) in the column."""
    if alpha <= 0 or x.shape[0] == 0:
        return torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
    colmax = x.abs().amax(dim=0).float()
    return colmax >= alpha if OutlierTest(cmp).inclusive else colmax > alpha


def outlier_columns(x: torch.Tensor, alpha: float, cmp: OutlierTest | str) -> torch.Tensor:
    """Sorted int64 indices of the outlier feature dimensions of ``x`` (eq. 8's set O)."""
    return outlier_mask(x, alpha, cmp).nonzero().flatten()


@dataclass
class QuantizedActivation:
    """``x`` after the fused quantization pass of the int8 path."""

    int8: torch.Tensor  # (m, k) int8, outlier columns zeroed
    absmax: torch.Tensor  # (m,) float32, per row over the non-outlier columns
    outlier_cols: torch.Tensor  # (c,) int64, sorted
    outlier_values: torch.Tensor  # (m, c), x's own dtype


@dataclass
class PreparedWeight:
    """Weights quantized once, offline. ``nbytes`` is what the layer keeps in memory: every
    tensor field, so a backend that keeps more (a packed layout, an fp32 bias) subclasses this
    with typed fields of its own (:meth:`extend`) and they are counted.

    A backend that keeps the int8 weights only in a layout of its own sets ``int8`` to ``None``
    and overrides :meth:`int8_columns` to read that layout.
    """

    int8: torch.Tensor | None  # (n, k) int8
    absmax: torch.Tensor  # (n,) float32: per output column, over the rows not kept in 16-bit
    kept_rows: torch.Tensor  # (r,) int64: input dims whose 16-bit weights are kept (eq. 8)
    kept_values: torch.Tensor  # (n, r): the original 16-bit weights of those dims
    bias: torch.Tensor | None  # (n,)
    dtype: torch.dtype  # the layer's 16-bit dtype, also the output dtype
    in_features: int

    @classmethod
    def extend(cls: type[_Weight], pw: PreparedWeight, **own) -> _Weight:
        """``pw``'s fields (overridden by ``own``) plus the subclass's own fields in ``own``."""
        base = {f.name: getattr(pw, f.name) for f in fields(PreparedWeight)}
        return cls(**(base | own))

    @property
    def out_features(self) -> int:
        return self.absmax.shape[0]

    def int8_columns(self, cols: torch.Tensor) -> torch.Tensor:
        """The int8 weights of input dims ``cols``: (n, c)."""
        if self.int8 is None:
            raise NotImplementedError(
                f"{type(self).__name__} keeps no (n, k) int8 weights and reads no layout of its own"
            )
        return self.int8[:, cols]

    @property
    def nbytes(self) -> int:
        tensors = (getattr(self, f.name) for f in fields(self))
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


#: Weight elements :func:`prepare_weight` and :func:`quantize_offline` quantize at a time.
WEIGHT_BLOCK_ELEMENTS = 1 << 20


def row_blocks(n: int, k: int) -> list[slice]:
    """The rows of an (n, k) weight in blocks of about ``WEIGHT_BLOCK_ELEMENTS`` elements."""
    step = max(1, WEIGHT_BLOCK_ELEMENTS // max(k, 1))
    return [slice(lo, lo + step) for lo in range(0, n, step)]


def prepare_weight(
    w: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: QuantConfig,
    kept_rows: torch.Tensor | None = None,
    compute_dtype=torch.float32,
) -> PreparedWeight:
    """Vector-wise int8 weights; with ``outlier_weights="fp16"`` the dims in ``kept_rows`` keep
    their 16-bit weights and are left out of the column absmax (they never go through int8)."""
    k = w.shape[1]
    if not cfg.decomposition or cfg.outlier_weights == "int8" or kept_rows is None:
        kept_rows = torch.zeros(0, dtype=torch.int64, device=w.device)
    kept_rows = kept_rows.to(device=w.device, dtype=torch.int64)
    keep = torch.zeros(k, dtype=torch.bool, device=w.device)
    keep[kept_rows] = True
    n = w.shape[0]
    q = torch.empty((n, k), dtype=torch.int8, device=w.device)
    amax_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    amax = torch.empty(n, dtype=amax_dtype, device=w.device)
    # Each output column's scale is its own, so the weight is quantized a block of columns at a
    # time: the float temporaries stay in cache (a 175B weight in one piece makes several 2.4 GB
    # float32 copies; in blocks of 2^20 elements it quantizes 3.6x faster on a 2-core CPU).
    for rows in row_blocks(n, k):
        w_regular = w[rows].to(compute_dtype, copy=True).masked_fill_(keep[None, :], 0)
        amax[rows] = absmax(w_regular, 1, compute_dtype)
        q[rows] = _quantize_owned(w_regular, amax[rows, None].to(compute_dtype))
    return PreparedWeight(
        int8=q,
        absmax=amax,
        kept_rows=kept_rows,
        kept_values=w[:, kept_rows].contiguous(),
        bias=bias,
        dtype=w.dtype,
        in_features=k,
    )


def decomposition_columns(x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig) -> torch.Tensor:
    """The set O of this call: outliers detected in ``x`` plus the dims kept in 16-bit."""
    if not cfg.decomposition:
        return torch.zeros(0, dtype=torch.int64, device=x.device)
    mask = outlier_mask(x, cfg.alpha, cfg.outlier_cmp)
    mask[pw.kept_rows] = True
    return mask.nonzero().flatten()


def quantize_activation(
    x: torch.Tensor, cols: torch.Tensor, compute_dtype=torch.float32
) -> QuantizedActivation:
    """Row absmax without the columns ``cols``, round, int8 (``cols`` zeroed), gather ``cols``."""
    if cols.numel():
        regular = x.clone()
        regular[:, cols] = 0
    else:
        regular = x
    amax = absmax(regular, 1, compute_dtype)
    q = quantize_absmax(regular, amax[:, None], compute_dtype)
    if compute_dtype != torch.float64:
        amax = amax.float()
    return QuantizedActivation(q, amax, cols, x[:, cols])


def outlier_weight_rows(pw: PreparedWeight, cols: torch.Tensor, compute_dtype) -> torch.Tensor:
    """(n, c) weights of the outlier dims: kept 16-bit rows, else reconstructed from int8
    (``q * (absmax / 127)``; in float64, rounded once, for rows whose absmax is outside
    ``SCALE_SAFE``, where ``absmax / 127`` could be subnormal in float32)."""
    q = pw.int8_columns(cols)
    out = q.to(compute_dtype) * (pw.absmax.to(compute_dtype)[:, None] / INT8_MAX)
    if compute_dtype != torch.float64 and out.numel():
        wide = ~scale_is_safe(pw.absmax)
        if bool(wide.any()):
            wide_scale = pw.absmax[wide].to(torch.float64)[:, None] / INT8_MAX
            out[wide] = (q[wide].to(torch.float64) * wide_scale).to(compute_dtype)
    if pw.kept_rows.numel() and cols.numel():
        pos = torch.searchsorted(cols, pw.kept_rows)
        pos = pos.clamp(max=cols.numel() - 1)
        hit = cols[pos] == pw.kept_rows
        out[:, pos[hit]] = pw.kept_values[:, hit].to(compute_dtype)
    return out


def outlier_product(
    qa: QuantizedActivation, pw: PreparedWeight, compute_dtype=torch.float32
) -> torch.Tensor | None:
    """eq. 8's 16-bit part: ``x[:, O] @ w[:, O].T``; ``None`` when O is empty."""
    if qa.outlier_cols.numel() == 0:
        return None
    w_rows = outlier_weight_rows(pw, qa.outlier_cols, compute_dtype)
    return qa.outlier_values.to(compute_dtype) @ w_rows.T


def dequantize(
    acc: torch.Tensor,
    qa: QuantizedActivation,
    pw: PreparedWeight,
    outlier: torch.Tensor | None,
    compute_dtype=torch.float32,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """eq. 7 + eq. 8: int32 product x outer(scales) / 127^2, + bias, + the outlier product."""
    y = dequantize_outer(acc, qa.absmax, pw.absmax, compute_dtype)
    if pw.bias is not None:
        y = y + pw.bias.to(compute_dtype)
    if outlier is not None:
        y = y + outlier.to(compute_dtype)
    return y.to(out_dtype or pw.dtype)


# --- the accuracy variants: Table 1's schemes and today's W8A8 / W8A16 / fp8 -------------------

#: SmoothQuant's migration strength (its paper's default for OPT / BLOOM).
SMOOTHQUANT_ALPHA = 0.5
#: Floor of the activation and weight column maxima in the smoothing factors (SmoothQuant's).
SMOOTHING_FLOOR = 1e-5
#: Largest finite float8 e4m3fn value: the fp8 code range is ``[-448, 448]``.
FP8_E4M3_MAX = 448.0


def smoothing_factors(
    calibration: torch.Tensor, w: torch.Tensor, alpha: float = SMOOTHQUANT_ALPHA
) -> torch.Tensor:
    """SmoothQuant's per-input-dim factors ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``
    (float64, shape (k,)), from the calibration rows ``X`` and all ``n`` rows of ``w``.
    ``x / s`` times ``(w * s).T`` is the same float product; both halves then span similar
    ranges, so per-token and per-channel int8 lose less on outlier dims."""
    return smoothing_from_maxima(absmax(calibration, 0, calibration.dtype), _col_range(w)[2], alpha)


def smoothed_operands(
    x: torch.Tensor, w: torch.Tensor, calibration: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SmoothQuant as a 16-bit model holds it: (``s``, ``x / s``, ``w * s``), each in its
    operand's dtype. ``s`` is :func:`smoothing_factors` of ``calibration`` (default ``x``) and
    ``w``, rounded to ``x``'s dtype; ``w * s`` is what the model stores (folded offline) and
    ``x / s`` what the previous layer would output (its norm folds the division). A timed
    SmoothQuant row is a vector-wise int8 kernel on these two operands."""
    cal = x if calibration is None else calibration
    s = smoothing_factors(cal, w).to(x.dtype)
    return s, x / s, w * s.to(w.dtype)


def smoothing_from_maxima(
    act_colmax: torch.Tensor, w_colmax: torch.Tensor, alpha: float = SMOOTHQUANT_ALPHA
) -> torch.Tensor:
    """:func:`smoothing_factors` from the per-input-dim maxima ``max|X_j|`` and ``max|W_j|``."""
    act = act_colmax.to(torch.float64).clamp(min=SMOOTHING_FLOOR)
    wmax = w_colmax.to(torch.float64).clamp(min=SMOOTHING_FLOOR)
    return act.pow(alpha) / wmax.pow(1 - alpha)


#: Elements :func:`_col_range` reduces at a time (views, no copies: large blocks reduce faster).
COLUMN_RANGE_BLOCK_ELEMENTS = 1 << 25


def _col_range(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(min, max, max |t|) per column of a 2-D ``t``, in ``t``'s own dtype (exact), a block of
    rows at a time (two reductions per block, no full-size temporary)."""
    n, k = t.shape
    lo = torch.zeros(k, dtype=t.dtype, device=t.device)
    hi = torch.zeros(k, dtype=t.dtype, device=t.device)
    step = max(1, COLUMN_RANGE_BLOCK_ELEMENTS // max(k, 1))
    for start in range(0, n, step):
        block = t[start : start + step]  # amin and amax: several times faster than aminmax on bf16
        block_lo, block_hi = block.amin(0), block.amax(0)
        first = start == 0
        lo = block_lo if first else torch.minimum(lo, block_lo)
        hi = block_hi if first else torch.maximum(hi, block_hi)
    return lo, hi, torch.maximum(hi.abs(), lo.abs())


@dataclass(frozen=True)
class OperandStatistics:
    """What the accuracy variants read of all of ``x`` and all of ``w`` (and the calibration
    rows): per-column ranges, exact in the operands' own dtypes. Computed once per layer
    (:func:`operand_statistics`) and shared by every variant, so a 175B weight is read once,
    not once per variant; the scales derived from them are the very ones a pass over the whole
    operand in ``compute_dtype`` gives (min, max and abs commute with monotone rounding)."""

    x_colmin: torch.Tensor  # (k,)
    x_colmax: torch.Tensor  # (k,)
    x_colabs: torch.Tensor  # (k,) max |x| per input dim
    w_colmin: torch.Tensor  # (k,)
    w_colmax: torch.Tensor  # (k,)
    w_colabs: torch.Tensor  # (k,) max |w| per input dim, over all n output channels
    calibration_colabs: torch.Tensor  # (k,) max |calibration| per input dim

    def x_outliers(self, cfg: QuantConfig) -> torch.Tensor:
        """:func:`outlier_mask` of ``x``."""
        return _exceeds(self.x_colabs, cfg)

    def kept(self, cfg: QuantConfig) -> torch.Tensor:
        """:func:`outlier_columns` of the calibration rows: the dims kept in 16-bit."""
        return _exceeds(self.calibration_colabs, cfg).nonzero().flatten()

    def x_bounds(self, cd: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return _bound(self.x_colmin, cd, min), _bound(self.x_colmax, cd, max)

    def w_bounds(self, cd: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return _bound(self.w_colmin, cd, min), _bound(self.w_colmax, cd, max)


def _bound(col: torch.Tensor, cd: torch.dtype, pick) -> torch.Tensor:
    """Min or max over a whole operand from its per-column one (0 for an empty operand)."""
    if col.numel() == 0:
        return torch.zeros((), dtype=cd, device=col.device)
    return col.to(cd).amin() if pick is min else col.to(cd).amax()


def _exceeds(colabs: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
    if not cfg.decomposition:
        return torch.zeros(colabs.shape, dtype=torch.bool, device=colabs.device)
    colabs = colabs.float()
    return colabs >= cfg.alpha if cfg.outlier_cmp.inclusive else colabs > cfg.alpha


def operand_statistics(
    x: torch.Tensor, w: torch.Tensor, calibration: torch.Tensor | None = None
) -> OperandStatistics:
    """One pass over ``x``, ``w`` and ``calibration`` (default ``x``) for every variant."""
    x_lo, x_hi, x_abs = _col_range(x)
    w_lo, w_hi, w_abs = _col_range(w)
    if calibration is None or calibration is x:
        cal_abs = x_abs
    else:
        cal_abs = absmax(calibration, 0, calibration.dtype)
    return OperandStatistics(x_lo, x_hi, x_abs, w_lo, w_hi, w_abs, cal_abs)


def quantize_fp8_rowwise(
    t: torch.Tensor, compute_dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise scaled float8 e4m3: ``q = fp8(t * (448 / absmax))`` per row (round to nearest
    even; every value is within range, so nothing saturates), ``t ~= q * absmax / 448``.
    Returns (q as ``torch.float8_e4m3fn``, absmax per row); an all-zero row gives zeros."""
    tc = t.to(compute_dtype)
    amax = absmax(tc, 1, compute_dtype)
    safe = torch.where(amax > 0, amax, 1)
    inv = torch.where(amax > 0, torch.full_like(safe, FP8_E4M3_MAX) / safe, 0)
    scaled = (tc * inv[:, None]).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return _round_e4m3(scaled).to(torch.float8_e4m3fn), amax


def _round_e4m3(v: torch.Tensor) -> torch.Tensor:
    """``v`` (``|v| <= 448``) rounded to the nearest float8 e4m3fn value, ties to even, in
    ``v``'s dtype, so the conversion after it is exact: torch converts float64 to float8 through
    float32, and that double rounding moved a value just past a tie onto the tie's even side
    (1.0625 + 2^-40 became 1.0, not 1.125). 3 mantissa bits; below 2^-6 the step is 2^-9."""
    _, e = torch.frexp(v)  # |v| = f * 2^e with f in [0.5, 1): the leading bit is 2^(e - 1)
    quantum = torch.ldexp(torch.ones_like(v), (e - 1).clamp(min=-6) - 3)
    return torch.round(v / quantum) * quantum  # a power of two: exact; round: half to even


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The dequantization scale of :func:`quantize_fp8_rowwise`'s codes: ``amax / 448``, so
    ``t ~= q * fp8_scale(amax)`` (in ``amax``'s dtype; what a scaled fp8 GEMM multiplies its
    product by, once per row of each operand)."""
    return amax / FP8_E4M3_MAX


#: Elements of the right operand converted to float64 at a time: a 175B weight whole is a
#: 4.8 GB float64 copy.
PRODUCT_BLOCK_ELEMENTS = 1 << 24


def _max_code(t: torch.Tensor) -> int:
    """The largest magnitude ``t`` holds (from the dtype where that bounds it)."""
    if t.dtype == torch.int8:
        return 128
    if t.dtype == torch.uint8:
        return 255
    return int(t.abs().max()) if t.numel() else 0


def float64_product(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """``a @ b_nk.T`` in float64, ``b_nk`` converted a block of rows at a time."""
    (m, k), n = a.shape, b_nk.shape[0]
    if not (m and n and k):
        return torch.zeros(m, n, dtype=torch.float64, device=a.device)
    out = torch.empty(m, n, dtype=torch.float64, device=a.device)
    a64 = a.to(torch.float64)
    step = max(1, PRODUCT_BLOCK_ELEMENTS // k)
    for lo in range(0, n, step):
        out[:, lo : lo + step] = a64 @ b_nk[lo : lo + step].to(torch.float64).T
    return out


def exact_int_product(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """``a @ b_nk.T`` of integer codes, exact, as float64 (the reference of every int32 GEMM):
    a float64 GEMM (BLAS-fast) is exact while every partial sum is an integer below 2^53 (int8
    codes: k < 2^39)."""
    k, code_a, code_b = a.shape[1], _max_code(a), _max_code(b_nk)
    if code_a * code_b * k >= 2**53:
        raise ValueError(
            f"k={k} with codes up to {code_a} and {code_b}: partial sums reach 2^53, too "
            "large for an exact float64 product"
        )
    return float64_product(a, b_nk)


def _zeroed(t: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    if cols.numel() == 0:
        return t
    out = t.clone()
    out[:, cols] = 0
    return out


def variant_forward(
    method: str,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: QuantConfig,
    calibration: torch.Tensor | None = None,
    x_rows: torch.Tensor | None = None,
    w_rows: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    stats: OperandStatistics | None = None,
) -> torch.Tensor:
    """The output of one accuracy variant (``core.ACCURACY_VARIANTS``), in ``compute_dtype``.

    Every statistic is taken as a kernel takes it: per-tensor scales over all of ``x`` (m
    tokens) and all of ``w``, outlier dims from all of ``x`` plus those calibrated on
    ``calibration`` (default ``x``; also SmoothQuant's calibration rows). Only the output rows
    ``x_rows`` and columns ``w_rows`` (default: all) are computed, so a 175B layer's error can be
    sampled at a fraction of the cost with the very numbers a full product would give there.
    ``stats`` (:func:`operand_statistics` of the same ``x``, ``w`` and ``calibration``) lets
    several variants share one pass over the whole operands; without it the pass is made here.
    Integer products are exact; fp8 codes are exact in float64.

    * ``zeropoint``: zeropoint per tensor for ``x`` and ``w`` (eq. 1, 5).
    * ``rowwise``: absmax per tensor for ``x``, per output channel (row of ``w``), as FBGEMM's
      row-wise mode (the paper does not spell its row-wise variant out).
    * ``rowwise_decomp``: ``rowwise`` on the regular dims, the outlier dims in 16-bit (eq. 8).
    * ``zeropoint_vectorwise``: zeropoint per token and per output channel.
    * ``zeropoint_llm_int8``: ``zeropoint_vectorwise`` on the regular dims + 16-bit outliers.
    * ``smoothquant``: ``x / s`` per token and ``w * s`` per channel, absmax
      (:func:`smoothing_factors`, folded into ``w`` offline, no 16-bit rounding in between).
    * ``int8_weight_only``: ``w`` per channel absmax int8, dequantized; ``x`` stays 16-bit.
    * ``fp8_e4m3``: :func:`quantize_fp8_rowwise` for ``x`` and ``w``.

    In the decomposed variants the outlier dims' weights are the original 16-bit ones and are
    left out of the weight scales (the dims calibrated on ``calibration``), as ``llm_int8`` with
    ``outlier_weights="fp16"``. ``absmax_torch``, ``vectorwise`` and ``llm_int8`` (Table 1's
    other int8 rows) are the timed methods' math (:func:`kernelbench.oracle.emulate`), here with
    the sampling above.
    """
    cd = compute_dtype
    if stats is None:
        stats = operand_statistics(x, w, calibration)
    xs = x if x_rows is None else x[x_rows]
    ws = w if w_rows is None else w[w_rows]
    bs = None if bias is None else (bias if w_rows is None else bias[w_rows])
    no_cols = torch.zeros(0, dtype=torch.int64, device=x.device)
    decomposed = method in ("rowwise_decomp", "zeropoint_llm_int8") and cfg.decomposition
    if decomposed:
        kept = stats.kept(cfg)
        mask = stats.x_outliers(cfg)
        mask[kept] = True
        cols = mask.nonzero().flatten()
    else:
        kept = cols = no_cols

    if method in ("vectorwise", "llm_int8"):  # the timed methods' own math, sampled
        mcfg = method_config(method, cfg)
        pw = prepare_weight(ws, bs, mcfg, stats.kept(cfg) if mcfg.decomposition else None, cd)
        if mcfg.decomposition:  # decomposition_columns(x, pw, mcfg), from the shared pass
            mask = stats.x_outliers(mcfg)
            mask[pw.kept_rows] = True
            x_cols = mask.nonzero().flatten()
        else:
            x_cols = no_cols
        qa = quantize_activation(xs, x_cols, cd)
        outlier = outlier_product(qa, pw, cd)
        return dequantize(exact_int_product(qa.int8, pw.int8), qa, pw, outlier, cd, cd)
    if method == "absmax_torch":
        x_amax = _bound(stats.x_colabs, cd, max)
        w_amax = _bound(stats.w_colabs, cd, max)
        xq = quantize_absmax(xs, x_amax, cd)
        wq = quantize_absmax(ws, w_amax, cd)
        y = dequantize_outer(
            exact_int_product(xq, wq), x_amax.expand(xs.shape[0]), w_amax.expand(ws.shape[0]), cd
        )
    elif method == "zeropoint":
        xq = quantize_zeropoint(xs, None, cd, bounds=stats.x_bounds(cd))
        wq = quantize_zeropoint(ws, None, cd, bounds=stats.w_bounds(cd))
        y = zeropoint_matmul(xq, wq, cd)
    elif method in ("zeropoint_vectorwise", "zeropoint_llm_int8"):
        xq = quantize_zeropoint(_zeroed(xs, cols), 1, cd)
        wq = quantize_zeropoint(_zeroed(ws, kept), 1, cd)
        y = zeropoint_matmul(xq, wq, cd)
    elif method in ("rowwise", "rowwise_decomp"):
        regular = torch.ones_like(stats.x_colabs, dtype=torch.bool)
        regular[cols] = False
        x_amax = _bound(stats.x_colabs[regular], cd, max)
        xq = quantize_absmax(_zeroed(xs, cols), x_amax, cd)
        w_regular = _zeroed(ws, kept)
        w_amax = absmax(w_regular, 1, cd)
        wq = quantize_absmax(w_regular, w_amax[:, None], cd)
        y = dequantize_outer(exact_int_product(xq, wq), x_amax.expand(xs.shape[0]), w_amax, cd)
    elif method == "smoothquant":
        s = smoothing_from_maxima(stats.calibration_colabs, stats.w_colabs).to(cd)
        xq, x_amax = quantize_rowwise(xs.to(cd) / s, cd)
        wq, w_amax = quantize_rowwise(ws.to(cd) * s, cd)
        y = dequantize_outer(exact_int_product(xq, wq), x_amax, w_amax, cd)
    elif method == "int8_weight_only":
        wq, w_amax = quantize_rowwise(ws, cd)
        w_deq = wq.to(cd) * (w_amax.to(cd)[:, None] / INT8_MAX)
        y = xs.to(cd) @ w_deq.T
    elif method == "fp8_e4m3":
        xq, x_amax = quantize_fp8_rowwise(xs, cd)
        wq, w_amax = quantize_fp8_rowwise(ws, cd)
        acc = float64_product(xq, wq)
        y = acc.to(cd) * fp8_scale(x_amax.to(cd))[:, None] * fp8_scale(w_amax.to(cd))[None, :]
    else:
        raise ValueError(f"{method!r} is no accuracy variant of kernelbench.quant")
    y = y.to(cd)
    if cols.numel():
        y = y + xs[:, cols].to(cd) @ ws[:, cols].to(cd).T
    return y + bs.to(cd) if bs is not None else y
