"""Input validation shared by every backend: a clear error naming the problem, never a crash or
a silent wrong number."""

from __future__ import annotations

import weakref

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class InputError(ValueError):
    """Bad input to a kernel or a method (shape, dtype, layout, device, values)."""


def require(cond: bool, msg: str) -> None:
    """Raise :class:`InputError` with ``msg`` unless ``cond``."""
    if not cond:
        raise InputError(msg)


_require = require


def check_tensor(
    t: torch.Tensor, name: str, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]
) -> None:
    """``t`` is a contiguous tensor of one of ``dtypes`` with ``shape`` (-1: any size)."""
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)}")
    names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
    require(t.dtype in dtypes, f"{name} must be {names}, got {t.dtype}")
    require(t.dim() == len(shape), f"{name} must be {len(shape)}-D, got shape {tuple(t.shape)}")
    require(t.is_contiguous(), f"{name} must be contiguous (call .contiguous())")
    for i, size in enumerate(shape):
        require(
            size < 0 or t.shape[i] == size, f"{name} must have shape {shape}, got {tuple(t.shape)}"
        )


def same_cuda_device(tensors: list[tuple[str, torch.Tensor | None]]) -> torch.device:
    """The one CUDA device all the given (name, tensor) pairs are on (``None`` tensors skipped)."""
    dev = None
    for name, t in tensors:
        if t is None:
            continue
        require(t.is_cuda, f"{name} must be on a CUDA device, got {t.device}")
        if dev is None:
            dev = t.device
        require(t.device == dev, f"{name} is on {t.device}, expected {dev}")
    require(dev is not None, "no tensor given")
    return dev


#: Tensors already found finite, by id: (a weak reference to the tensor, its version counter).
#: A benchmark builds a dozen runners on one weight; at 175B shapes each scan of it takes a
#: second. An in-place change bumps the version, and a freed tensor leaves this table.
_FOUND_FINITE: dict[int, tuple[weakref.ref, int]] = {}


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite, from its minimum and maximum (a NaN makes both
    NaN, an infinity one of them): one vectorized pass. ``torch.isfinite(t).all()`` on a 16-bit
    CPU tensor converts element by element: 12 s for a 175B weight (12288 x 49152) on a 2-core
    VM, against about 0.3 s this way."""
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return bool(torch.isfinite(t).all())
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def check_finite(t: torch.Tensor, name: str) -> None:
    if not t.is_floating_point() or not t.numel():
        return
    seen = _FOUND_FINITE.get(id(t))
    if seen is not None and seen[0]() is t and seen[1] == t._version:
        return
    if not _all_finite(t):
        bad = int((~torch.isfinite(t)).sum())
        raise InputError(f"{name} contains {bad} NaN/Inf value(s); quantization needs finite input")
    key = id(t)
    _FOUND_FINITE[key] = (weakref.ref(t, lambda _ref: _FOUND_FINITE.pop(key, None)), t._version)


def check_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``weight`` is (n, k) in nn.Linear layout, floating point, contiguous, finite."""
    _require(isinstance(weight, torch.Tensor), f"weight must be a torch.Tensor, got {type(weight)}")
    _require(
        weight.dim() == 2,
        f"weight must be 2-D (out_features, in_features), got {tuple(weight.shape)}",
    )
    _require(
        weight.dtype in FLOAT_DTYPES,
        f"weight dtype must be one of fp16/bf16/fp32, got {weight.dtype}",
    )
    _require(weight.is_contiguous(), "weight must be contiguous (call .contiguous())")
    _require(
        weight.shape[0] > 0 and weight.shape[1] > 0, f"weight is empty: shape {tuple(weight.shape)}"
    )
    check_finite(weight, "weight")
    if bias is not None:
        _require(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}",
        )
        _require(
            bias.device == weight.device, f"bias is on {bias.device}, weight on {weight.device}"
        )
        _require(bias.dtype in FLOAT_DTYPES, f"bias dtype must be fp16/bf16/fp32, got {bias.dtype}")
        check_finite(bias, "bias")


def check_activation(
    x: torch.Tensor, weight: torch.Tensor | None = None, in_features: int | None = None
) -> None:
    """``x`` is (m, k), floating point, contiguous, finite; k matches the weight."""
    _require(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x)}")
    _require(x.dim() == 2, f"x must be 2-D (tokens, in_features), got shape {tuple(x.shape)}")
    _require(x.dtype in FLOAT_DTYPES, f"x dtype must be one of fp16/bf16/fp32, got {x.dtype}")
    _require(x.is_contiguous(), "x must be contiguous (call .contiguous())")
    if weight is not None:
        # the weight's own checks come first: its shape is read below
        _require(
            isinstance(weight, torch.Tensor) and weight.dim() == 2,
            f"weight must be 2-D (out_features, in_features), got "
            f"{tuple(getattr(weight, 'shape', ()))}",
        )
    k = (
        in_features
        if in_features is not None
        else (weight.shape[1] if weight is not None else x.shape[1])
    )
    _require(
        x.shape[1] == k, f"shape mismatch: x is {tuple(x.shape)} but the layer has in_features={k}"
    )
    _require(x.shape[1] > 0, f"x has no features: shape {tuple(x.shape)}")
    if weight is not None:
        _require(x.device == weight.device, f"x is on {x.device}, weight on {weight.device}")
        _require(
            x.dtype == weight.dtype, f"dtype mismatch: x is {x.dtype}, weight is {weight.dtype}"
        )
    check_finite(x, "x")


def check_int8_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a`` (m, k) and ``b`` (n, k) int8, contiguous, same device, same k."""
    for name, t in (("a", a), ("b", b)):
        _require(t.dtype == torch.int8, f"{name} must be int8, got {t.dtype}")
        _require(t.dim() == 2, f"{name} must be 2-D, got shape {tuple(t.shape)}")
        _require(t.is_contiguous(), f"{name} must be contiguous")
    _require(
        a.shape[1] == b.shape[1],
        f"shape mismatch: a is {tuple(a.shape)}, b is {tuple(b.shape)} (need the same k)",
    )
    _require(a.device == b.device, f"a is on {a.device}, b on {b.device}")
