"""The memory a runner's call reads: what a cold-cache timer evicts before each call.

A scan of twice the last-level cache does not evict everything: a last-level cache whose
replacement protects lines that were hit again (scan-resistant, as on AMD Zen 5) keeps a weight
that every call re-reads, while the scan's own lines go first. Measured on a 2-core Zen 5 VM
(32 MB L3), custom ``llm_int8`` at one token, d = 1536 (a 9.5 MB int8 weight): 181 us after the
64 MB scan, 181 us with no eviction at all, 211 us after the scan and a flush of the call's
tensors, 221 us rotating over 29 weight copies as a model's layers do
(``tests/bench/cold_modes.py``). So a cold timer also flushes the lines of the call's own
tensors: those this module finds from ``Runner.run``.

The search follows what a call can reach: a function's closure and default arguments, a bound
method's object, ``functools.partial`` arguments, containers, and the attributes of objects
(dataclasses, prepared weights, modules); never a function's globals. A tensor subclass is
followed into its inner tensors (``__tensor_flatten__``). Memory a backend keeps outside any
tensor (a library's opaque prepacked weight) is not found: :func:`resident_bytes` below the
runner's ``weight_bytes`` says so.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable

import torch

from kernelbench.kernels import cpu_ext

#: How deep the search follows references from ``run``: a closure cell (1), a prepared weight
#: in it (2), that weight's tensors (3), and a few levels of nesting more.
MAX_DEPTH = 8

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.dtype)
_NOT_FOLLOWED = (types.ModuleType, type, torch.device, torch.Generator)

Span = tuple[int, int]  # (first byte's address, bytes)


def reachable_tensors(root: object, max_depth: int = MAX_DEPTH) -> list[torch.Tensor]:
    """The tensors reachable from ``root`` (a runner's ``run``), each once, in the order found."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES + _NOT_FOLLOWED):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            inner = _inner_tensors(obj)
            if inner is None:
                found.append(obj)
            else:
                stack.extend((t, depth) for t in inner)
            continue
        if depth >= max_depth:
            continue
        stack.extend((child, depth + 1) for child in _children(obj))
    return found


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor] | None:
    """A wrapper subclass's inner tensors (``__tensor_flatten__``); ``None`` for a plain one."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return None
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return None
    try:
        names, _ = flatten()
    except Exception:  # noqa: BLE001 - a subclass that cannot flatten: its own storage
        return None
    return [getattr(t, name) for name in names]


def _children(obj: object) -> Iterable[object]:
    if isinstance(obj, types.MethodType):
        return (obj.__self__, obj.__func__)
    if isinstance(obj, types.FunctionType):
        cells = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        return [*cells, *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()]
    if isinstance(obj, functools.partial):
        return (obj.func, *obj.args, *obj.keywords.values())
    if isinstance(obj, dict):
        return obj.values()
    if isinstance(obj, list | tuple | set | frozenset):
        return obj
    children: list[object] = list(getattr(obj, "__dict__", {}).values())
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            children.append(getattr(obj, name))
    return children


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def memory_spans(tensors: Iterable[torch.Tensor], device_type: str = "cpu") -> list[Span]:
    """The address ranges the tensors on ``device_type`` cover (a view: its own extent, not its
    whole storage; torch strides are never negative), overlapping ranges merged. A tensor
    without memory of its own (a wrapper subclass not followed into its inner tensors) or
    whose extent leaves its storage gives none: a flush never touches memory it does not own."""
    ranges: list[Span] = []
    for t in tensors:
        if t.device.type != device_type or t.numel() == 0 or t.layout != torch.strided:
            continue
        try:
            storage = t.untyped_storage()
            low, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            continue
        dims = zip(t.shape, t.stride(), strict=True)
        start = t.data_ptr()
        nbytes = (1 + sum((n - 1) * stride for n, stride in dims)) * t.element_size()
        if low and low <= start and start + nbytes <= low + size:
            ranges.append((start, nbytes))
    merged: list[Span] = []
    for start, nbytes in sorted(ranges):
        if merged and start <= merged[-1][0] + merged[-1][1]:
            end = max(merged[-1][0] + merged[-1][1], start + nbytes)
            merged[-1] = (merged[-1][0], end - merged[-1][0])
        else:
            merged.append((start, nbytes))
    return merged


def resident_bytes(spans: Iterable[Span]) -> int:
    """Bytes the spans cover."""
    return sum(nbytes for _, nbytes in spans)


class TensorEviction:
    """Evicts the CPU tensors' bytes from the caches with ``flush(address, nbytes)`` when
    called. It holds the tensors: an address it flushes is never memory freed since."""

    def __init__(self, tensors: list[torch.Tensor], flush: Callable[[int, int], None]) -> None:
        self.tensors = list(tensors)
        self.spans = memory_spans(self.tensors)
        self.flush = flush

    @property
    def bytes(self) -> int:
        return resident_bytes(self.spans)

    def __call__(self) -> None:
        for start, nbytes in self.spans:
            self.flush(start, nbytes)


def call_eviction(call: Callable[[], object]) -> TensorEviction:
    """What evicts ``call``'s own memory on the CPU: the tensors it reaches, flushed with
    :func:`~kernelbench.kernels.cpu_ext.flush_cache_lines` (the extension must be built)."""
    return TensorEviction(reachable_tensors(call), cpu_ext.flush_cache_lines)
