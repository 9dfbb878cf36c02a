"""Zero padding of an int8 GEMM's k and n up to a kernel's alignment: exact by construction.

A kernel that needs k and n to be multiples of some number computes ``a (m, k_p) @ b (n_p, k_p).T``
on zero-padded operands instead: the extra k columns add exactly 0 to every sum, and the extra n
rows only produce output columns that are dropped again. The weight is padded once (prepare
time); the activation's k tail is padded per call, one (m, k_p) int8 copy inside the timed work,
and an output with padded columns is copied out once. :class:`PaddedShape` says what was padded,
for the row's ``variant``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

import torch
import torch.nn.functional as F

from kernelbench import quant
from kernelbench.checks import require
from kernelbench.quant import INT8_MAX, PreparedWeight

#: Largest k whose worst-case int32 sum ``k * 127 * 127`` cannot overflow.
MAX_K = (2**31 - 1) // (INT8_MAX * INT8_MAX)


def round_up(v: int, multiple: int) -> int:
    return -(-v // multiple) * multiple


def max_k(multiple: int) -> int:
    """The largest k that still fits the int32 accumulator after padding to ``multiple``."""
    return MAX_K // multiple * multiple


@dataclass(frozen=True)
class PaddedShape:
    """A layer's (k, n) and the (k, n) its kernel actually multiplies."""

    k: int
    n: int
    k_padded: int
    n_padded: int

    @property
    def padded(self) -> bool:
        return (self.k, self.n) != (self.k_padded, self.n_padded)

    def describe(self) -> str:
        """Empty when nothing is padded, else e.g. ``padded k 5140->5152, n 20560``."""
        if not self.padded:
            return ""
        k = f"{self.k}->{self.k_padded}" if self.k != self.k_padded else str(self.k)
        n = f"{self.n}->{self.n_padded}" if self.n != self.n_padded else str(self.n)
        return f"padded k {k}, n {n}"


def padded_shape(k: int, n: int, multiple: int) -> PaddedShape:
    return PaddedShape(k, n, round_up(k, multiple), round_up(n, multiple))


def shape_rule(k: int, n: int, multiple: int) -> str:
    """Empty when a kernel that pads to ``multiple`` takes this (k, n), else why not."""
    if k < 1 or n < 1:
        return f"k and n must be >= 1, got k={k}, n={n}"
    if k > max_k(multiple):
        return (
            f"k must be <= {max_k(multiple)} (int32 accumulator: k * 127^2 < 2^31 after padding "
            f"k to a multiple of {multiple}), got k={k}"
        )
    return ""


def pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` (rows, c) with zero columns appended up to ``width``; ``t`` itself when c == width."""
    extra = width - t.shape[-1]
    if extra < 0:
        raise ValueError(f"cannot pad {t.shape[-1]} columns down to {width}")
    return t if extra == 0 else F.pad(t, (0, extra)).contiguous()


def pad_rows(t: torch.Tensor, height: int) -> torch.Tensor:
    """``t`` (r, ...) with zero rows appended up to ``height``; ``t`` itself when r == height."""
    extra = height - t.shape[0]
    if extra < 0:
        raise ValueError(f"cannot pad {t.shape[0]} rows down to {height}")
    if extra == 0:
        return t
    return torch.cat([t, t.new_zeros((extra, *t.shape[1:]))]).contiguous()


def pad_weight(w: torch.Tensor, shape: PaddedShape) -> torch.Tensor:
    """The (n, k) int8 weight as (n_p, k_p), zeros outside; ``w`` itself when nothing pads."""
    return pad_rows(pad_cols(w, shape.k_padded), shape.n_padded)


def unpad_cols(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` columns of a (m, n_p) result, contiguous."""
    return t if t.shape[1] == n else t[:, :n].contiguous()


def padded_gemm(
    a: torch.Tensor,
    w_padded: torch.Tensor,
    n: int,
    gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``a (m, k) @ w[:n, :k].T`` in int32 through ``gemm`` on the padded operands:
    ``a`` gets zero columns up to ``w_padded``'s k_p, the (m, n_p) result loses its extra
    columns."""
    return unpad_cols(gemm(pad_cols(a, w_padded.shape[1]), w_padded), n)


_Weight = TypeVar("_Weight", bound=PreparedWeight)


def extend_weight(cls: type[_Weight], pw: PreparedWeight, **own) -> _Weight:
    """``pw``'s :class:`PreparedWeight` fields (overridden by ``own``) plus ``cls``'s own."""
    return cls(**({f.name: getattr(pw, f.name) for f in fields(PreparedWeight)} | own))


@dataclass
class PaddedWeight(PreparedWeight):
    """A GEMM's weight whose int8 matrix is kept only as ``gemm_int8``: the (n, k) matrix
    zero-padded to (n_p, k_p), or the same matrix when nothing pads (``int8`` is ``None``: one
    copy kept and counted). ``cols_safe``: every column absmax is a float32-safe scale
    (:func:`kernelbench.quant.scale_is_safe`), known once here instead of per call."""

    gemm_int8: torch.Tensor
    cols_safe: bool

    def int8_columns(self, cols: torch.Tensor) -> torch.Tensor:
        return self.gemm_int8[: self.out_features, cols]


def pad_prepared(pw: PreparedWeight, multiple: int) -> PaddedWeight:
    """``pw`` with its int8 weight zero-padded to multiples of ``multiple`` (once)."""
    if isinstance(pw, PaddedWeight):
        return pw
    require(pw.int8 is not None, "the prepared weight has no int8 (n, k) matrix")
    shape = padded_shape(pw.in_features, pw.out_features, multiple)
    return extend_weight(
        PaddedWeight,
        pw,
        int8=None,
        gemm_int8=pad_weight(pw.int8, shape),
        cols_safe=bool(quant.scale_is_safe(pw.absmax).all()),
    )


def gemm_weight(pw: PreparedWeight) -> torch.Tensor:
    """The int8 (n_p, k_p) weight a padded GEMM reads: ``gemm_int8``, else ``pw.int8``."""
    if isinstance(pw, PaddedWeight):
        return pw.gemm_int8
    require(pw.int8 is not None, "the prepared weight has no int8 (n, k) matrix")
    return pw.int8
