"""Clocks: how one call is timed on a device, and nothing else.

* CPU: a wall clock (``time.perf_counter`` unless another is injected) around the call.
* CPU memory: while calls are timed, glibc's allocator keeps freed memory for the next call
  (:func:`freed_memory_reused`) instead of unmapping it, so a call's fresh output does not pay
  for page faults, as under a caching allocator (CUDA's, jemalloc, tcmalloc); otherwise a
  measured 64 MB int32 output adds 20-30 ms of the kernel's 80 on a 2-core VM, and by how
  much depends on where glibc's mmap threshold happens to be.
* CUDA: device events around the call; before every call the L2 cache is flushed by writing a
  buffer twice the device's L2 size (outside the timed region), and the SM clock is read after
  each call so that throttled samples can be counted. This path has not run on a GPU yet
  (see the backends' ``verified_on``).

When to stop, pairing and statistics live in :mod:`kernelbench.measure.engine` and
:mod:`kernelbench.statistics`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

Clock = Callable[[], float]  # seconds, monotonic


class CallTimer:
    """Times one call in milliseconds on the CPU with ``clock``."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self.throttled = 0  # samples taken below 90% of the first SM clock reading (CUDA)

    def sync(self) -> None:
        """Wait for the device to finish queued work (nothing to wait for on the CPU)."""

    def __call__(self, fn: Callable[[], object]) -> float:
        return self.timed(fn)[1]

    def timed(self, fn: Callable[[], object]) -> tuple[object, float]:
        """``fn()``'s result and its time in milliseconds, as :meth:`__call__` times it."""
        t0 = self.clock()
        result = fn()
        return result, (self.clock() - t0) * 1e3

    def seconds(self, fn: Callable[[], object]) -> tuple[object, float]:
        """``fn()``'s result and its wall time in seconds, the device synchronised."""
        t0 = self.clock()
        result = fn()
        self.sync()
        return result, self.clock() - t0


class L2Flusher:
    """Evicts the L2 cache by writing a buffer twice the device's L2 size."""

    def __init__(self, device: torch.device) -> None:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.bytes = 2 * l2
        self.buffer = torch.empty(self.bytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.fill_(0x5A)


class CudaCallTimer(CallTimer):
    """Device events around the call, L2 flushed before it, SM clock watched after it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.flush = L2Flusher(device)
        self.stream = torch.cuda.current_stream(device)
        self.first_clock: float | None = None

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def timed(self, fn: Callable[[], object]) -> tuple[object, float]:
        self.flush()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(self.stream)
        result = fn()
        end.record(self.stream)
        end.synchronize()
        self._watch_clock()
        return result, begin.elapsed_time(end)

    def _watch_clock(self) -> None:
        try:
            clock = float(torch.cuda.clock_rate(self.device))  # needs pynvml / amdsmi
        except Exception:  # noqa: BLE001 - clocks are informative, never fatal
            return
        self.first_clock = self.first_clock or clock
        if clock < 0.9 * self.first_clock:
            self.throttled += 1


def call_timer(device: torch.device | str, clock: Clock = time.perf_counter) -> CallTimer:
    """The timer for ``device``: events on CUDA, ``clock`` elsewhere."""
    device = torch.device(device)
    return CudaCallTimer(device) if device.type == "cuda" else CallTimer(clock)


# --- CPU memory while timing ---------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)
_DEFAULT_MMAP_MAX, _DEFAULT_TRIM_THRESHOLD = 65536, 128 * 1024
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: 2 GiB free at the heap's top before trimming

#: How CPU memory is handed to timed calls, as recorded in env.json.
ALLOCATOR_NOTE = (
    "glibc malloc while timing: mmap off, no trimming (a freed output is reused by the next "
    "call, as under a caching allocator); restored and trimmed after each timed block"
)


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()
_reuse_depth = 0


def allocator_note() -> str:
    """What env.json says about CPU memory while timing (empty where glibc is not in use)."""
    return ALLOCATOR_NOTE if _LIBC is not None else ""


@contextmanager
def freed_memory_reused(enabled: bool = True) -> Iterator[None]:
    """While inside, glibc serves large allocations from its heap and keeps freed memory (no
    mmap, no trimming): a call's output reuses the previous call's pages instead of faulting in
    fresh ones. On exit the defaults come back and free memory is returned to the system, so
    the heap does not hold what the timed calls freed. Re-entrant; a no-op off glibc."""
    global _reuse_depth
    if not enabled or _LIBC is None:
        yield
        return
    if _reuse_depth == 0:
        _LIBC.mallopt(_M_MMAP_MAX, 0)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
    _reuse_depth += 1
    try:
        yield
    finally:
        _reuse_depth -= 1
        if _reuse_depth == 0:
            _LIBC.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
            _LIBC.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
            _LIBC.malloc_trim(0)
