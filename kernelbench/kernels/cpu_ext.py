"""Checked Python wrappers around the C++ CPU kernels (``kernelbench._cpu``).

The extension takes raw pointers; every argument is validated here first (device, dtype,
contiguity, shape, alignment), so bad input is a clear :class:`InputError`, never a crash.
Kernel rules: any m >= 0, k >= 1, n >= 1; the packed weight buffer is 32-byte aligned (it is
allocated here); -128 is accepted in both int8 operands (every GEMM path is exact for it).
"""

from __future__ import annotations

import mmap
import weakref
from dataclasses import dataclass

import torch

from kernelbench.checks import InputError, check_int8_operands

try:
    from kernelbench import _cpu as _ext

    IMPORT_ERROR = ""
except ImportError as exc:  # the package was not built (e.g. imported from a bare checkout)
    _ext = None
    IMPORT_ERROR = f"kernelbench._cpu is not built ({exc}); install the package (pip install .)"

_DTYPE_CODE = (
    {torch.float32: _ext.FLOAT32, torch.float16: _ext.FLOAT16, torch.bfloat16: _ext.BFLOAT16}
    if _ext
    else {}
)


NONFINITE_X = "x contains NaN/Inf; quantization needs finite input"


def available() -> bool:
    return _ext is not None


def isa() -> str:
    """The kernel set in use: ``avx512vnni`` (AVX2 kernels + a VNNI GEMM), ``avx2``, ``scalar``."""
    return _ext.isa() if _ext else "unavailable"


def set_isa(name: str) -> None:
    _ext.set_isa(name)


def stream_rows() -> int:
    """Up to this many rows of A the GEMMs take their decode path (the weights streamed once per
    call); above it, the blocked path. Both give the same exact int32 sums."""
    return _ext.stream_rows()


def set_stream_rows(rows: int) -> None:
    """Move the decode path's row limit (0: always the blocked path): tests compare the two paths
    bit for bit with it, and ``tests/bench/ab_decode.py`` measures where one overtakes the
    other."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise InputError(f"stream_rows must be an integer >= 0, got {rows!r}")
    _ext.set_stream_rows(rows)


#: Where the VNNI decode path prefetches its weight stream, by name; the index of each is the
#: extension's code for it.
DECODE_PREFETCH = ("l2", "l1")


def decode_prefetch() -> str:
    """Where the VNNI set's decode path prefetches the weights it streams: ``l2`` (into L2) or
    ``l1`` (into L1; one-row tiles leave it to the hardware prefetcher). A tuning per processor:
    by default ``l1`` on AMD family 26 (Zen 5), ``l2`` elsewhere (measured on Zen 4). The sums
    never depend on it."""
    return DECODE_PREFETCH[_ext.decode_prefetch()]


def default_decode_prefetch() -> str:
    """The decode prefetch this processor gets by default (:func:`decode_prefetch`)."""
    return DECODE_PREFETCH[_ext.default_decode_prefetch()]


def set_decode_prefetch(name: str) -> None:
    """Choose the decode path's prefetch (``l1`` or ``l2``): tests check that both give the same
    numbers, and ``tests/bench/ab_decode.py --other-prefetch`` pairs them."""
    if name not in DECODE_PREFETCH:
        raise InputError(f"decode prefetch must be one of {sorted(DECODE_PREFETCH)}, got {name!r}")
    _ext.set_decode_prefetch(DECODE_PREFETCH.index(name))


def streaming_store_bytes() -> int:
    """From this many bytes of int32 product on, the VNNI GEMM stores it past the caches
    (non-temporal stores): by default half the last-level cache."""
    return _ext.streaming_store_bytes()


def set_streaming_store_bytes(nbytes: int) -> None:
    """Move the streamed-store threshold (0: every product streamed): tests compare the two
    stores bit for bit with it."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InputError(f"streaming_store_bytes must be an integer >= 0, got {nbytes!r}")
    _ext.set_streaming_store_bytes(nbytes)


def _sync_threads() -> None:
    # One thread count for torch (oneDNN/MKL) and our OpenMP kernels: the harness pins it.
    n = torch.get_num_threads()
    if _ext.get_max_threads() != n:
        _ext.set_num_threads(n)


def _empty_output(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """A fresh output tensor, as torch's own ops allocate theirs. (Advising large outputs to
    transparent huge pages made first touch faster alone, but in a sweep's cycles, among the
    other rows' allocations, it made the int32 GEMM bimodal: 140-258 ms against 165-205 ms
    without it, at 2048 x 2560 x 10240.)"""
    return torch.empty(shape, dtype=dtype)


def _check_cpu(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise InputError(f"the CPU kernels need CPU tensors, got one on {t.device}")
        if not t.is_contiguous():
            raise InputError("the CPU kernels need contiguous tensors")


def _float_code(dtype: torch.dtype, name: str) -> int:
    if dtype not in _DTYPE_CODE:
        raise InputError(f"{name} must be fp32, fp16 or bf16, got {dtype}")
    return _DTYPE_CODE[dtype]


#: Size of a transparent huge page (x86-64 Linux).
HUGE_PAGE_BYTES = 2 << 20

THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_setting() -> str:
    """The system's transparent huge page setting (``always``, ``madvise`` or ``never``; empty
    where the platform has none): with ``never`` :func:`pack_weight` gets small pages only."""
    try:
        with open(THP_SETTING) as f:
            text = f.read()
    except OSError:
        return ""
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else ""


_huge_page_mapped = [0]  # bytes mapped by _huge_page_buffer and not yet unmapped


def huge_page_bytes() -> int:
    """Bytes of packed weights in huge page mappings now: memory the C heap's own accounting
    (``timing.heap_live_bytes``) does not see."""
    return _huge_page_mapped[0]


def _unmapped(nbytes: int) -> None:
    _huge_page_mapped[0] -= nbytes


def _huge_page_buffer(nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of zeroed memory starting on a huge page boundary and advised to the kernel
    for transparent huge pages (a private anonymous mapping, unmapped when the last tensor on
    it goes); ``None`` where the platform cannot advise it."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    try:
        region = mmap.mmap(
            -1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        )
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        return None
    _huge_page_mapped[0] += len(region)
    weakref.finalize(region, _unmapped, len(region))
    buf = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
    offset = (-buf.data_ptr()) % HUGE_PAGE_BYTES
    return buf[offset : offset + nbytes]


def flush_cache_lines(address: int, nbytes: int) -> None:
    """Write back and invalidate the cache lines of ``nbytes`` from ``address`` in every cache
    (all cores, all levels; ``clflushopt``): the next read comes from memory. Over 1 MB the
    lines are split among torch's threads (a flush is bound by each core's rate of flushes).
    The caller keeps that memory alive (a cold-cache timer flushes the tensors a call reads)."""
    if nbytes < 0:
        raise InputError(f"nbytes must be >= 0, got {nbytes}")
    _sync_threads()
    _ext.flush_cache_lines(address, nbytes)


#: Round trips per batch and batches of :func:`thread_round_trip_ns` (5-25 us a reading).
ROUND_TRIPS, ROUND_TRIP_BATCHES = 8, 8


def thread_round_trip_ns() -> float | None:
    """How long a cache line takes to go from one of the kernels' OpenMP threads to another and
    back, in ns (the fastest of a few batches): which cores the threads run on, read without
    touching memory. On a VM whose host moves its two vCPUs between one core complex (shared
    L3, one link to memory) and two, it reads about 50-70 or 300 ns, and with it the memory bus
    about 40-65 or 70-110 GB/s. ``None`` when torch runs one thread, or without the extension."""
    if _ext is None or torch.get_num_threads() < 2:
        return None
    ns = _ext.thread_round_trip_ns(ROUND_TRIPS, ROUND_TRIP_BATCHES)
    return ns if ns > 0 else None


#: Steps of the core probe: about 13-17 us on a 2-vCPU Xeon VM when its cores are its own.
CORE_PROBE_STEPS = 50_000


def core_probe_ns() -> float | None:
    """How long the slower of two of the kernels' OpenMP threads takes for a fixed chain of
    integer steps in registers, in ns: how fast the cores run right now, read without touching
    memory. On a 2-vCPU Xeon VM whose host shares its cores out it reads about 13-17 us, or
    22-35 us in the slow state,
    and bf16 GEMMs ran 2.4x (int8 1.8x) slower in the slow reading. ``None`` when torch runs
    one thread, or without the extension."""
    if _ext is None or torch.get_num_threads() < 2:
        return None
    ns = _ext.core_probe_ns(CORE_PROBE_STEPS)
    return ns if ns > 0 else None


def pack_weight(w_int8: torch.Tensor, huge_pages: bool = True) -> torch.Tensor:
    """Int8 weights (n, k) -> the GEMM's packed panel layout: one byte per weight plus one int32
    column sum per column (a uint8 buffer, 64-byte aligned; ``kb::PackedLayout`` in
    ``csrc/cpu_int8.h``).

    With ``huge_pages`` a buffer of a huge page or more is placed in transparent huge pages
    where the system allows them (:func:`huge_page_setting` ``madvise`` or ``always``): a decode
    call streams the whole weight once, and with 4 KiB pages it crosses a page (a TLB miss, and
    the end of a hardware prefetch stream) every 4 KiB. Measured paired on an AMD Zen 5 at
    tokens 1-32 (``tests/bench/ab_decode.py --other-pages``): 0.89-0.97x the time."""
    _check_cpu(w_int8)
    if w_int8.dtype != torch.int8 or w_int8.dim() != 2:
        raise InputError(f"weights must be 2-D int8, got {w_int8.dtype} {tuple(w_int8.shape)}")
    n, k = w_int8.shape
    if n == 0 or k == 0:
        raise InputError(f"weights are empty: shape {(n, k)}")
    nbytes = _ext.packed_bytes(n, k)
    packed = _huge_page_buffer(nbytes) if huge_pages and nbytes >= HUGE_PAGE_BYTES else None
    if packed is None:
        buf = torch.empty(nbytes + 64, dtype=torch.uint8)
        offset = (-buf.data_ptr()) % 64
        packed = buf[offset : offset + nbytes]
    _ext.pack_b(w_int8.data_ptr(), n, k, packed.data_ptr())
    return packed


def packed_columns(packed: torch.Tensor, n: int, k: int, cols: torch.Tensor) -> torch.Tensor:
    """The int8 weights ``w[:, cols]`` (n, c) read back from ``pack_weight(w)``'s buffer."""
    _check_cpu(packed, cols)
    _check_packed(packed, n, k)
    c = cols.numel()
    if c and (cols.dtype != torch.int64 or int(cols.min()) < 0 or int(cols.max()) >= k):
        raise InputError(f"columns must be int64 indices in [0, {k})")
    out = torch.empty((n, c), dtype=torch.int8)
    if c:
        _ext.gather_packed_columns(packed.data_ptr(), n, k, cols.data_ptr(), c, out.data_ptr())
    return out


def _check_packed(packed: torch.Tensor, n: int, k: int) -> None:
    if packed.numel() != _ext.packed_bytes(n, k):
        raise InputError(f"packed weights do not match k={k}, n={n} (packed for another shape)")
    if packed.data_ptr() % 32:
        raise InputError("packed weights must be 32-byte aligned (use pack_weight)")


def detect_outliers(x: torch.Tensor, alpha: float, ge: bool) -> torch.Tensor:
    """Bool mask (k,) of columns with some ``|x| > alpha`` (``>=`` when ``ge``)."""
    _check_cpu(x)
    code = _float_code(x.dtype, "x")
    _sync_threads()
    mask = torch.empty(x.shape[1], dtype=torch.uint8)
    if not _ext.detect_outliers(
        x.data_ptr(), code, x.shape[0], x.shape[1], float(alpha), ge, mask.data_ptr()
    ):
        raise InputError(NONFINITE_X)
    return mask.view(torch.bool)


def quantize_rows(x: torch.Tensor, mask: torch.Tensor | None, cols: torch.Tensor):
    """Fused pass: (int8 (m, k) with ``cols`` zeroed, row absmax (m,), x[:, cols] (m, c))."""
    _check_cpu(x, cols)
    code = _float_code(x.dtype, "x")
    m, k = x.shape
    c = cols.numel()
    if c and (cols.dtype != torch.int64 or int(cols.min()) < 0 or int(cols.max()) >= k):
        raise InputError(f"outlier columns must be int64 indices in [0, {k})")
    if mask is not None:
        _check_cpu(mask)
        if mask.shape != (k,) or mask.dtype != torch.bool:
            raise InputError(f"outlier mask must be bool of shape ({k},)")
    _sync_threads()
    q = torch.empty((m, k), dtype=torch.int8)
    amax = torch.empty(m, dtype=torch.float32)
    vals = torch.empty((m, c), dtype=x.dtype)
    ok = _ext.quantize_rows(
        x.data_ptr(),
        code,
        m,
        k,
        mask.data_ptr() if (mask is not None and c) else 0,
        cols.data_ptr() if c else 0,
        c,
        q.data_ptr(),
        amax.data_ptr(),
        vals.data_ptr() if c else 0,
    )
    if not ok:
        raise InputError(NONFINITE_X)
    return q, amax, vals


@dataclass(frozen=True)
class KeptDims:
    """Input dims that are outlier columns on every call (``llm_int8``'s dims kept in 16-bit),
    checked once (:func:`kept_dims`): ``cols`` sorted, unique int64 indices into ``k`` columns."""

    cols: torch.Tensor
    k: int


def kept_dims(cols: torch.Tensor, k: int) -> KeptDims:
    """The kept dims ``cols`` of a layer with ``k`` input features, sorted and unique (``cols``
    itself when it already is)."""
    _check_cpu(cols)
    if cols.dtype != torch.int64 or cols.dim() != 1:
        raise InputError(f"kept dims must be 1-D int64, got {cols.dtype} {tuple(cols.shape)}")
    if cols.numel() and (int(cols.min()) < 0 or int(cols.max()) >= k):
        raise InputError(f"kept dims must be indices in [0, {k})")
    unique = torch.unique(cols)  # sorted
    return KeptDims(cols if torch.equal(unique, cols) else unique, k)


def _kept_operands(x: torch.Tensor, kept: KeptDims) -> tuple[int, int, int, int]:
    """Check ``x`` for a call with the kept dims ``kept``; (dtype code, m, k, c)."""
    _check_cpu(x)
    code = _float_code(x.dtype, "x")
    if x.dim() != 2 or x.shape[1] != kept.k:
        raise InputError(f"shape mismatch: x is {tuple(x.shape)}, must be (m, {kept.k})")
    _sync_threads()
    return code, x.shape[0], kept.k, kept.cols.numel()


def _kept_quantized(status: int) -> bool:
    """The extension's answer to a kept-dims call (csrc/cpu_int8.cpp, KeptQuantization): 0 x
    not finite (raised), 1 quantized, 2 an outlier outside the kept dims."""
    if status == 0:
        raise InputError(NONFINITE_X)
    return status == 1


def quantize_kept(
    x: torch.Tensor, kept: KeptDims, alpha: float, ge: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``llm_int8``'s quantization in one pass over ``x`` when its outlier columns are the kept
    dims: (int8 (m, k) with ``kept.cols`` zeroed, row absmax (m,), x[:, kept.cols] (m, c)), the
    numbers of :func:`detect_outliers` + :func:`quantize_rows`. ``None`` when some other column
    has a value beyond ``alpha`` (``>=`` when ``ge``): the caller then detects the columns."""
    code, m, k, c = _kept_operands(x, kept)
    q = torch.empty((m, k), dtype=torch.int8)
    amax = torch.empty(m, dtype=torch.float32)
    vals = torch.empty((m, c), dtype=x.dtype)
    status = _ext.quantize_kept(
        x.data_ptr(),
        code,
        m,
        k,
        float(alpha),
        ge,
        kept.cols.data_ptr() if c else 0,
        c,
        q.data_ptr(),
        amax.data_ptr(),
        vals.data_ptr() if c else 0,
    )
    return (q, amax, vals) if _kept_quantized(status) else None


@dataclass(frozen=True)
class KeptLinear:
    """A layer's weight-side operands of :func:`linear_kept`, checked once (:func:`kept_linear`):
    the kept dims, the packed int8 weights (n, k), the column absmax (n,) and bias (n,) in
    float32, the kept dims' weights transposed, (c, n) float32, and the output dtype."""

    kept: KeptDims
    packed: torch.Tensor
    n: int
    col_absmax: torch.Tensor
    bias_f32: torch.Tensor | None
    kept_t32: torch.Tensor
    out_dtype: torch.dtype


def kept_linear(
    kept: KeptDims,
    packed: torch.Tensor,
    n: int,
    col_absmax: torch.Tensor,
    bias_f32: torch.Tensor | None,
    kept_t32: torch.Tensor,
    out_dtype: torch.dtype,
) -> KeptLinear:
    _check_cpu(packed, col_absmax, kept_t32)
    _check_packed(packed, n, kept.k)
    if col_absmax.dtype != torch.float32 or col_absmax.shape != (n,):
        raise InputError(f"column absmax must be float32 of shape ({n},)")
    if bias_f32 is not None:
        _check_cpu(bias_f32)
        if bias_f32.dtype != torch.float32 or bias_f32.shape != (n,):
            raise InputError(f"bias must be float32 of shape ({n},)")
    c = kept.cols.numel()
    if kept_t32.dtype != torch.float32 or kept_t32.shape != (c, n):
        raise InputError(f"kept weights must be float32 (c, n) = ({c}, {n})")
    _float_code(out_dtype, "out")
    return KeptLinear(kept, packed, n, col_absmax, bias_f32, kept_t32, out_dtype)


def linear_kept(x: torch.Tensor, layer: KeptLinear, alpha: float, ge: bool) -> torch.Tensor | None:
    """The whole layer in one call when ``x``'s outlier columns are the kept dims:
    :func:`quantize_kept`, then :func:`linear` with the dequantization and the outlier product
    (x[:, kept.cols] in float32 times ``kept_t32``), the same numbers bit for bit. ``None`` when
    some other column has a value beyond ``alpha`` (the caller then detects); ``alpha = inf``
    with no kept dims is vectorwise quantization."""
    kept = layer.kept
    code, m, k, c = _kept_operands(x, kept)
    out = _empty_output((m, layer.n), layer.out_dtype)
    status = _ext.linear_kept(
        x.data_ptr(),
        code,
        m,
        k,
        float(alpha),
        ge,
        kept.cols.data_ptr() if c else 0,
        c,
        layer.kept_t32.data_ptr() if c else 0,
        layer.packed.data_ptr(),
        layer.n,
        layer.col_absmax.data_ptr(),
        layer.bias_f32.data_ptr() if layer.bias_f32 is not None else 0,
        out.data_ptr(),
        _DTYPE_CODE[layer.out_dtype],
    )
    return out if _kept_quantized(status) else None


def _check_gemm_operands(a: torch.Tensor, packed: torch.Tensor, n: int) -> tuple[int, int]:
    """Check ``a`` (m, k) int8 against packed (n, k) weights; return (m, k)."""
    _check_cpu(a, packed)
    if a.dtype != torch.int8 or a.dim() != 2:
        raise InputError(f"a must be 2-D int8, got {a.dtype} {tuple(a.shape)}")
    m, k = a.shape
    if k == 0:
        raise InputError("k must be >= 1")
    _check_packed(packed, n, k)
    return m, k


def gemm(a: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """``a`` (m, k) int8 times packed (n, k) weights, transposed: int32 (m, n), exact."""
    m, k = _check_gemm_operands(a, packed, n)
    _sync_threads()
    c = _empty_output((m, n), torch.int32)
    if m:
        _ext.gemm_s8s8s32(a.data_ptr(), m, k, packed.data_ptr(), n, c.data_ptr())
    return c


def int8_matmul_unpacked(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """Convenience for tests: pack ``b_nk`` and multiply."""
    check_int8_operands(a, b_nk)
    return gemm(a, pack_weight(b_nk), b_nk.shape[0])


@dataclass(frozen=True)
class Dequant:
    """The dequantization of an (m, n) int32 product: ``acc * row x col / 127^2 + bias +
    outlier_x @ outlier_w``, written in ``out_dtype``. ``row_absmax`` (m,) and ``col_absmax``
    (n,) float32; ``bias_f32`` (n,) float32; ``outlier_x`` (m, c) and ``outlier_w`` (c, n)
    float32, c small (the outlier dims)."""

    row_absmax: torch.Tensor
    col_absmax: torch.Tensor
    out_dtype: torch.dtype
    bias_f32: torch.Tensor | None = None
    outlier_x: torch.Tensor | None = None
    outlier_w: torch.Tensor | None = None

    def outlier_dims(self, m: int, n: int) -> int:
        """Validates the operands against an (m, n) output; returns c (outlier dims)."""
        row, col, bias = self.row_absmax, self.col_absmax, self.bias_f32
        _check_cpu(row, col)
        for t, name, size in ((row, "row_absmax", m), (col, "col_absmax", n)):
            if t.dtype != torch.float32 or t.shape != (size,):
                raise InputError(
                    f"{name} must be float32 of shape ({size},), got {t.dtype} {tuple(t.shape)}"
                )
        if bias is not None:
            _check_cpu(bias)
            if bias.dtype != torch.float32 or bias.shape != (n,):
                raise InputError(f"bias must be float32 of shape ({n},)")
        ox, ow = self.outlier_x, self.outlier_w
        if ox is None:
            return 0
        _check_cpu(ox, ow)
        c = ox.shape[1]
        if ox.dtype != torch.float32 or ox.shape != (m, c):
            raise InputError(f"outlier_x must be float32 (m, c) = ({m}, {c})")
        if ow.dtype != torch.float32 or ow.shape != (c, n):
            raise InputError(f"outlier_w must be float32 (c, n) = ({c}, {n})")
        return c

    def output(self, m: int, n: int) -> tuple[torch.Tensor, tuple]:
        """Check the operands of an (m, n) product; return the output tensor and the kernel's
        pointer arguments (row, col, bias, outlier_x, outlier_w, c, out, out dtype code)."""
        c = self.outlier_dims(m, n)
        code = _float_code(self.out_dtype, "out")
        out = _empty_output((m, n), self.out_dtype)
        ptrs = (
            self.row_absmax.data_ptr(),
            self.col_absmax.data_ptr(),
            self.bias_f32.data_ptr() if self.bias_f32 is not None else 0,
            self.outlier_x.data_ptr() if c else 0,
            self.outlier_w.data_ptr() if c else 0,
            c,
            out.data_ptr(),
            code,
        )
        return out, ptrs


def dequantize(acc: torch.Tensor, dq: Dequant) -> torch.Tensor:
    """The int32 product ``acc`` (m, n) dequantized by ``dq`` in one fused pass."""
    _check_cpu(acc)
    if acc.dtype != torch.int32 or acc.dim() != 2:
        raise InputError(f"acc must be 2-D int32, got {acc.dtype} {tuple(acc.shape)}")
    m, n = acc.shape
    out, ptrs = dq.output(m, n)
    _sync_threads()
    if m:
        _ext.dequantize(acc.data_ptr(), m, n, *ptrs)
    return out


def linear(a: torch.Tensor, packed: torch.Tensor, n: int, dq: Dequant) -> torch.Tensor:
    """:func:`gemm` then :func:`dequantize` in one kernel, the same numbers bit for bit: each
    tile of int32 sums is dequantized while it is in cache (no (m, n) int32 product)."""
    m, k = _check_gemm_operands(a, packed, n)
    out, ptrs = dq.output(m, n)
    _sync_threads()
    if m:
        _ext.linear(a.data_ptr(), m, k, packed.data_ptr(), n, *ptrs)
    return out
