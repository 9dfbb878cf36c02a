"""Clocks: how one call is timed on a device, and nothing else.

* CPU: a wall clock (``time.perf_counter`` unless another is injected) around the call.
* CPU memory: while calls are timed, glibc's allocator keeps freed memory for the next call
  (:func:`freed_memory_reused`) instead of unmapping it, so a call's fresh output does not pay
  for page faults, as under a caching allocator (CUDA's, jemalloc, tcmalloc); otherwise a
  measured 64 MB int32 output adds 20-30 ms of the kernel's 80 on a 2-core VM, and by how
  much depends on where glibc's mmap threshold happens to be.
* Cold caches (``--cache cold``, the default): before every timed call, outside the timed
  region, the caches are evicted, so the call reads its weights and activations from memory as
  a model's layer does once per token. On the CPU a buffer of twice the last-level cache (read
  from sysfs; a shorter one, flushed after each read, where that is more than
  :data:`MAX_SCAN_BYTES`) is read by every thread
  (:class:`CacheEvictor`), then the cache lines of the call's own tensors are flushed (the
  ``evict_own`` the caller passes): a scan does not evict what a scan-resistant last-level
  cache protects (:mod:`kernelbench.backends.residency`). On
  CUDA the L2 is flushed by writing a buffer twice its size. ``--cache hot`` leaves the caches
  as the previous calls left them (a small weight then stays cache-resident between calls).
* What each timed call saw (:class:`CallUsage`): its page faults and context switches, from
  ``getrusage`` around the call (outside the clock); the steal time of a cell's cycles comes
  from ``/proc/stat`` (:func:`steal_ticks`).
* CUDA: device events around the call, and the SM clock is read after each call so that
  throttled samples can be counted. This path has not run on a GPU yet (see the backends'
  ``verified_on``).

When to stop, pairing and statistics live in :mod:`kernelbench.measure.engine` and
:mod:`kernelbench.statistics`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelbench.kernels import cpu_ext
from kernelbench.settings import SETTINGS, default

Clock = Callable[[], float]  # seconds, monotonic

#: What ``--cache`` may be: ``cold`` (caches evicted before every timed call) or ``hot``.
CACHE_MODES = SETTINGS["cache"].choices


@dataclass(frozen=True)
class CallUsage:
    """What the process did during one timed call besides computing (``getrusage`` deltas,
    all threads): page faults and context switches. Informative: a sample twice as slow as its
    neighbours with thousands of faults was paying for memory, not for arithmetic."""

    minor_faults: int = 0
    major_faults: int = 0
    vol_switches: int = 0  # the process waited (I/O, a lock)
    invol_switches: int = 0  # the process was preempted (another process wanted the CPU)


#: The :class:`CallUsage` fields, in the order rows store them.
USAGE_FIELDS = ("minor_faults", "major_faults", "vol_switches", "invol_switches")

Usage = Callable[[], tuple[int, int, int, int]]


def process_usage() -> tuple[int, int, int, int]:
    """(minor faults, major faults, voluntary, involuntary context switches) so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_minflt, ru.ru_majflt, ru.ru_nvcsw, ru.ru_nivcsw


#: A core probe reading this many times the fastest seen is a slow moment: the cores are not
#: the run's own. On a 2-vCPU Xeon VM whose host shares its cores out, a default sweep's
#: readings fell in two groups, 15-19 us (the bf16 baseline at its usual time) and 25-38 us
#: (the same calls 1.4-1.7x slower), against a fastest of 13.6 us: 1.5x sits in the gap.
CORE_SLOW_FACTOR = 1.5
#: After a wait that ran out, the gate takes the calls of this many times the wait's cap as
#: they come: a slow state that lasts minutes costs at most a sixth of the run's time.
CORE_BACKOFF_FACTOR = 5.0
#: The gate judges its waits by the reading taken just before the call each waited for (after
#: the cache eviction): it backs off as after a wait that ran out when fewer than
#: :data:`CORE_HOLD_MIN_SHARE` of its last :data:`CORE_HOLD_WINDOW` waits held to then. On a
#: 2-vCPU Xeon VM whose cores flipped at millisecond scale, 19% of 17,276 waits held (the calls
#: that did not wait read fast 56% of the time), and the waits took 66 s of a 548 s run; on a
#: Zen 4 VM 58% held, on a quieter Xeon 94%.
CORE_HOLD_WINDOW = 16
CORE_HOLD_MIN_SHARE = 1 / 3


class CoreGate:
    """Waits, before a timed call, until the cores run at their usual speed (nvbench's wait
    for a throttled GPU to recover, for a CPU whose host shares its cores out).

    ``probe`` reads how fast the cores run (ns for a fixed chain of steps, ``None``: no
    reading); a reading above :data:`CORE_SLOW_FACTOR` times the fastest seen is slow, and the
    gate probes again until one is not, for at most ``max_wait_s``; a wait that runs out is
    counted (``gave_up``) and the calls of the next :data:`CORE_BACKOFF_FACTOR` x
    ``max_wait_s`` seconds go ahead without waiting. So do they when the waits do not hold
    (:meth:`note_reading`: the reading before the call slow again; counted as ``not_held``),
    on a host whose cores change speed faster than a wait and an eviction take. On a 2-vCPU
    Xeon VM the slow moments came and went within 0.1-1.3 s while the probe ran; a call that
    starts in one and its paired baseline call in the other made a ratio neither state has
    (their times followed the probe, Spearman 0.65-0.76, their ratios did not). The wait is
    outside the call's clock; the pairing counts it, as it counts the eviction, as time between
    the calls."""

    def __init__(
        self,
        probe: Callable[[], float | None],
        max_wait_s: float,
        clock: Clock = time.perf_counter,
    ) -> None:
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.probe, self.max_wait_s, self.clock = probe, max_wait_s, clock
        self.fastest_ns: float | None = None
        self.gave_up = 0  # waits that ran out
        self.not_held = 0  # back-offs because the waits did not hold
        self._backoff_until = float("-inf")
        self._waited = False  # the last wait() waited and the cores read fast at its end
        self._held: deque[bool] = deque(maxlen=CORE_HOLD_WINDOW)

    def _is_slow(self, ns: float | None) -> bool:
        if ns is None or ns <= 0:
            return False
        if self.fastest_ns is None or ns < self.fastest_ns:
            self.fastest_ns = ns
        return ns > CORE_SLOW_FACTOR * self.fastest_ns

    def _slow(self) -> bool:
        return self._is_slow(self.probe())

    def _back_off(self) -> None:
        self._backoff_until = self.clock() + CORE_BACKOFF_FACTOR * self.max_wait_s

    def wait(self) -> float:
        """Seconds waited until the cores read fast (0: they did, or the gate is off or backing
        off)."""
        self._waited = False
        if self.max_wait_s <= 0:
            return 0.0
        start = self.clock()
        if start < self._backoff_until or not self._slow():
            return 0.0
        self._waited = True
        while self._slow():
            if self.clock() - start >= self.max_wait_s:
                self.gave_up += 1
                self._waited = False
                self._back_off()
                break
        return self.clock() - start

    def note_reading(self, ns: float | None) -> None:
        """The cores' reading just before the call the last :meth:`wait` was for: whether the
        wait held. When fewer than :data:`CORE_HOLD_MIN_SHARE` of the last
        :data:`CORE_HOLD_WINDOW` waits held, the gate backs off as after a wait that ran out."""
        waited, self._waited = self._waited, False
        if not waited or ns is None or ns <= 0:
            return
        self._held.append(not self._is_slow(ns))
        if len(self._held) == CORE_HOLD_WINDOW and sum(self._held) < CORE_HOLD_MIN_SHARE * (
            CORE_HOLD_WINDOW
        ):
            self.not_held += 1
            self._held.clear()
            self._back_off()


class CallTimer:
    """Times one call in milliseconds on the CPU with ``clock``; ``before_call`` (a cache
    eviction) runs before the clock starts; ``usage`` is read around the call, outside it.

    ``probe_bytes``: how many bytes ``before_call`` reads from memory. Its read rate is then
    kept as ``last_bus_gbps``, the memory bus's bandwidth just before the call: on a VM whose
    bus is shared with other guests it moves by 2x over minutes, and a call that streams its
    weights can only be judged against what the bus gave at that moment. A reading, not a
    bound: the eviction re-reads one buffer of twice the last-level cache and part of it can
    still hit there (on a 2-core Zen 5, 57-63 GB/s against 45-49 GB/s rotating over three such
    buffers), while a long stream can read faster than this 1-ms sum (a one-token GEMV over
    604 MB of weights: 1.03-1.10x its rate).

    ``link_probe``: a reading of where the threads run, taken after the eviction and kept as
    ``last_link_ns`` (the round trip of a cache line between two threads: on the 2-vCPU Zen 5
    VM about 50-70 ns while the host keeps both vCPUs on one core complex, whose one link to
    memory reads 40-65 GB/s, and about 300 ns while it spreads them over two, 70-110 GB/s).

    ``core_probe``: a reading of how fast the cores run, taken after the link's and kept as
    ``last_core_ns`` (a fixed chain of integer steps on two threads: on a 2-vCPU Xeon VM whose
    host shares its cores out, about 13-17 us or 22-35 us, the bf16 calls 2-3x slower in the
    latter; the steal count showed nothing).

    ``after_probe``: runs after the read, outside its clock, before the call (a short scan's
    buffer flushed again: :meth:`CacheEvictor.settle`).

    ``core_gate``: waits before the eviction (before the call, without one) until the cores
    run at their usual speed (:class:`CoreGate`); the seconds it waited are kept as
    ``last_core_wait_s``."""

    @property
    def last_reading(self) -> tuple[float | None, float | None, float | None, float]:
        """``(last_bus_gbps, last_link_ns, last_core_ns, last_core_wait_s)``: what the timer
        read just before the last call, and how long it waited for fast cores first."""
        return self.last_bus_gbps, self.last_link_ns, self.last_core_ns, self.last_core_wait_s

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        before_call: Callable[[], None] | None = None,
        usage: Usage = process_usage,
        probe_bytes: int | None = None,
        link_probe: Callable[[], float | None] | None = None,
        after_probe: Callable[[], None] | None = None,
        core_probe: Callable[[], float | None] | None = None,
        core_gate: CoreGate | None = None,
    ) -> None:
        self.clock = clock
        self.before_call = before_call
        self.after_probe = after_probe if before_call is not None else None
        self.usage = usage
        self.probe_bytes = probe_bytes if before_call is not None else None
        self.link_probe = link_probe if before_call is not None else None
        self.last_link_ns: float | None = None  # link_probe's reading (None: no probe)
        self.core_probe = core_probe if before_call is not None else None
        self.last_core_ns: float | None = None  # core_probe's reading (None: no probe)
        self.core_gate = core_gate
        self.last_core_wait_s = 0.0  # seconds core_gate waited before the last call
        self.throttled = 0  # samples taken below 90% of the first SM clock reading (CUDA)
        self.last_usage = CallUsage()
        self.last_prepare_s = 0.0  # seconds ``before_call`` took before the last timed call
        self.last_bus_gbps: float | None = None  # before_call's read rate (None: no probe)

    def sync(self) -> None:
        """Wait for the device to finish queued work (nothing to wait for on the CPU)."""

    def __call__(
        self, fn: Callable[[], object], evict_own: Callable[[], None] | None = None
    ) -> float:
        return self.timed(fn, evict_own)[1]

    def _prepare(self, evict_own: Callable[[], None] | None = None) -> None:
        start = self.clock()
        self.last_core_wait_s = self.core_gate.wait() if self.core_gate is not None else 0.0
        if self.before_call is None:
            self.last_prepare_s = self.clock() - start
            self.last_bus_gbps = self.last_link_ns = self.last_core_ns = None
            return
        t0 = self.clock()
        self.before_call()
        self.sync()
        t1 = self.clock()
        if self.after_probe is not None:
            self.after_probe()
        self.last_link_ns = self.link_probe() if self.link_probe is not None else None
        self.last_core_ns = self.core_probe() if self.core_probe is not None else None
        if self.core_gate is not None:
            self.core_gate.note_reading(self.last_core_ns)
        if evict_own is not None:
            evict_own()
        self.last_prepare_s = self.clock() - start
        read_s = t1 - t0
        readable = self.probe_bytes and read_s > 0
        self.last_bus_gbps = self.probe_bytes / read_s / 1e9 if readable else None

    def timed(
        self, fn: Callable[[], object], evict_own: Callable[[], None] | None = None
    ) -> tuple[object, float]:
        """``fn()``'s result and its time in milliseconds, as :meth:`__call__` times it.
        ``evict_own``: evicts the call's own memory (its weights and activations) after the
        timer's eviction, when it has one (cold caches)."""
        self._prepare(evict_own)
        u0 = self.usage()
        t0 = self.clock()
        result = fn()
        ms = (self.clock() - t0) * 1e3
        u1 = self.usage()
        self.last_usage = CallUsage(*(b - a for a, b in zip(u0, u1, strict=True)))
        return result, ms

    def seconds(self, fn: Callable[[], object]) -> tuple[object, float]:
        """``fn()``'s result and its wall time in seconds, the device synchronised."""
        t0 = self.clock()
        result = fn()
        self.sync()
        return result, self.clock() - t0


def cache_sizes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """The CPU's cache sizes in bytes by level name (``L1d``, ``L2``, ``L3``), read from sysfs
    (empty where it is not readable). Instruction caches are left out: data is what a GEMM
    keeps resident."""
    sizes: dict[str, int] = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = (index / "level").read_text().strip()
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        try:
            size = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        except (ValueError, IndexError):
            continue
        sizes[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return sizes


#: The eviction buffer when sysfs names no cache (twice a 32 MB last-level cache).
DEFAULT_EVICT_BYTES = 64 * 2**20

#: The most the eviction scan reads where cache lines can be flushed: a last-level cache up to
#: half of it is scanned twice over (evicted whole; the 2-core Zen 5 VM's 32 MB L3).
MAX_SCAN_BYTES = 64 * 2**20

#: The scan where the last-level cache is larger than half of :data:`MAX_SCAN_BYTES`. No scan of
#: bounded cost evicts it there (on a 2-vCPU Xeon VM that reports a 300 MB L3, a 600 MB scan
#: took 23-29 ms before every timed call, most of a sweep's time): what makes a call cold is the
#: flush of its own tensors after the scan; the scan empties the private caches (eight times
#: the two 2 MB L2s there) and reads the bus. Its buffer is flushed after each read, so the next
#: read comes from memory again and stays a reading of the bus. A longer scan evicts more of
#: what a model keeps in cache between layers (activations, temporaries, the interpreter).
#: Measured there (``tests/bench/cold_modes.py --d 768,2048,5140 --m 1,256``: time over
#: rotating through 640 MB of weight copies as a model does), custom ``llm_int8``, bf16 and
#: torch ``llm_int8``: at one token 0.98-1.17 after this scan and the flush, 1.00-1.24 after a
#: 64 MB scan, 0.99-1.57 after the 600 MB one; at 256 tokens 0.93-1.03, 0.97-1.11 and
#: 1.00-1.24. In one process, calls after this scan took 0.81-0.98 of those after a 64 MB one
#: (the scans and flushes 1.4-2.1 ms a call instead of 5.0-5.8).
PARTIAL_SCAN_BYTES = 16 * 2**20


def evict_bytes(sizes: dict[str, int] | None = None, flushable: bool | None = None) -> int:
    """Bytes the eviction scan reads: twice the largest cache (the last level); where cache
    lines can be flushed (``flushable``; by default, whether the CPU extension is built) and
    that is more than :data:`MAX_SCAN_BYTES`, :data:`PARTIAL_SCAN_BYTES`."""
    sizes = cache_sizes() if sizes is None else sizes
    full = 2 * max(sizes.values()) if sizes else DEFAULT_EVICT_BYTES
    if flushable is None:
        flushable = cpu_ext.available()
    return PARTIAL_SCAN_BYTES if flushable and full > MAX_SCAN_BYTES else full


def scan_flushed(nbytes: int, sizes: dict[str, int] | None = None) -> bool:
    """Whether a scan of ``nbytes`` is flushed after each read: shorter than twice the
    last-level cache (which would keep it), with the CPU extension to flush it."""
    return nbytes < evict_bytes(sizes, flushable=False) and cpu_ext.available()


class CacheEvictor:
    """Evicts the CPU caches by reading a buffer of ``nbytes`` (twice the last-level cache,
    or :data:`PARTIAL_SCAN_BYTES` where that is over :data:`MAX_SCAN_BYTES`) on all of torch's
    threads: afterwards the private caches hold none of the next call's data, and an LRU
    last-level cache none either when the buffer is twice its size; a scan-resistant one (AMD
    Zen 5) keeps data that every call re-reads, so the timer also flushes each call's own
    tensors after the scan. Reading (not writing) leaves
    no dirty lines for the timed call to write back. On a 2-core VM with a 32 MB L3, one
    eviction takes a few milliseconds, outside the timed region. A sequential read of twice the
    last-level cache misses it throughout, so the eviction's time is also a reading of the
    memory bus's bandwidth (:class:`CallTimer`'s ``probe_bytes``).

    ``flush`` (``flush(address, nbytes)``): given when the buffer is smaller than twice the
    last-level cache, which would keep it; :meth:`settle` then flushes it after each read
    (outside the read's clock), so the next read comes from memory."""

    def __init__(
        self, nbytes: int | None = None, flush: Callable[[int, int], None] | None = None
    ) -> None:
        self.bytes = int(nbytes or evict_bytes())
        # float32 so that the reduction runs vectorised on every thread
        self.buffer = torch.ones(self.bytes // 4, dtype=torch.float32)
        self.flush = flush
        self.settle()

    def __call__(self) -> None:
        self.sink = float(self.buffer.sum())

    def settle(self) -> None:
        """Flush the buffer out of every cache level (when the evictor has a ``flush``)."""
        if self.flush is not None:
            self.flush(self.buffer.data_ptr(), self.buffer.numel() * 4)


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
    """Device events around the call, L2 flushed before it (``cold``), SM clock watched after
    it."""

    def __init__(self, device: torch.device, cold: bool = True) -> None:
        super().__init__(before_call=L2Flusher(device) if cold else None)
        self.device = device
        self.stream = torch.cuda.current_stream(device)
        self.first_clock: float | None = None

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def timed(
        self, fn: Callable[[], object], evict_own: Callable[[], None] | None = None
    ) -> tuple[object, float]:
        self._prepare(evict_own)
        u0 = self.usage()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record(self.stream)
        result = fn()
        end.record(self.stream)
        end.synchronize()
        u1 = self.usage()
        self.last_usage = CallUsage(*(b - a for a, b in zip(u0, u1, strict=True)))
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


def call_timer(
    device: torch.device | str,
    clock: Clock = time.perf_counter,
    cache: str = default("cache"),
    link_probe: Callable[[], float | None] | None = None,
    core_probe: Callable[[], float | None] | None = None,
    core_wait_s: float = 0.0,
) -> CallTimer:
    """The timer for ``device``: events on CUDA, ``clock`` elsewhere; with ``cache="cold"``
    the caches are evicted before every timed call (and on the CPU ``link_probe`` and
    ``core_probe`` read after each eviction, :class:`CallTimer`; with ``core_wait_s`` and a
    ``core_probe``, the process's :func:`shared_core_gate` waits up to that long for fast
    cores before each eviction)."""
    if cache not in CACHE_MODES:
        raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}, got {cache!r}")
    device = torch.device(device)
    cold = cache == "cold"
    if device.type == "cuda":
        return CudaCallTimer(device, cold)
    if not cold:
        return CallTimer(clock)
    evictor = shared_evictor()
    return CallTimer(
        clock,
        before_call=evictor,
        probe_bytes=evictor.bytes,
        link_probe=link_probe,
        after_probe=evictor.settle if evictor.flush is not None else None,
        core_probe=core_probe,
        core_gate=shared_core_gate(core_probe, core_wait_s) if core_probe and core_wait_s else None,
    )


_CORE_GATES: dict[tuple[object, float], CoreGate] = {}


def shared_core_gate(probe: Callable[[], float | None], max_wait_s: float) -> CoreGate:
    """One :class:`CoreGate` per probe and wait for the process: the fastest reading one cell
    saw is the next cell's reference too."""
    key = (probe, float(max_wait_s))
    if key not in _CORE_GATES:
        _CORE_GATES[key] = CoreGate(probe, max_wait_s)
    return _CORE_GATES[key]


_EVICTORS: dict[int, CacheEvictor] = {}


def shared_evictor(nbytes: int | None = None) -> CacheEvictor:
    """One :class:`CacheEvictor` per size for the process: every cell's timer reads the same
    buffer instead of allocating its own."""
    size = int(nbytes or evict_bytes())
    if size not in _EVICTORS:
        flush = cpu_ext.flush_cache_lines if scan_flushed(size) else None
        _EVICTORS[size] = CacheEvictor(size, flush)
    return _EVICTORS[size]


def steal_ticks(path: str | Path = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) CPU ticks of all CPUs so far, from ``/proc/stat``'s ``cpu`` line (``None``
    where it is not readable or has no steal column): the hypervisor's share of a span is the
    difference of two readings."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    try:
        ticks = [int(v) for v in fields[1:]]
    except ValueError:
        return None
    # guest time is already counted in user time
    return ticks[7], sum(ticks[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two :func:`steal_ticks` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


# --- CPU memory while timing ---------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)
_DEFAULT_MMAP_MAX, _DEFAULT_TRIM_THRESHOLD = 65536, 128 * 1024
#: A trim threshold of -1 disables trimming completely (mallopt(3)). mallopt takes an int, so no
#: positive threshold reaches past 2 GiB: with 2**31 - 1 (and a pad as large) glibc trimmed
#: whatever one free left beyond 2 GiB at the heap's top, and the next call faulted it in
#: again (a 2.25 GB temporary at 175B: 65,536 page faults and 131 ms a call to allocate and
#: fill it, against none and 39 ms untrimmed).
_NEVER_TRIM = -1

#: How CPU memory is handed to timed calls, as recorded in env.json.
ALLOCATOR_NOTE = (
    "glibc malloc while timing: mmap off, no trimming (a freed output is reused by the next "
    "call, as under a caching allocator); the heap keeps freed memory resident between timed "
    "blocks and gives it back when the run needs memory, its top first"
)


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not all(hasattr(libc, f) for f in ("mallopt", "malloc_trim", "malloc", "free")):
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    return libc if malloc_is_libcs(libc) else None


def malloc_is_libcs(libc) -> bool:
    """Whether the process's ``malloc`` is ``libc``'s own, not an allocator preloaded over it
    (jemalloc, tcmalloc, mimalloc through ``LD_PRELOAD``): with one, glibc's ``mallopt`` and
    ``malloc_trim`` govern a heap no tensor lives in, and the memory handling here is off."""
    try:
        process = ctypes.CDLL(None)  # the global scope: a preloaded malloc comes first
    except OSError:
        return True
    return _address(process.malloc) == _address(libc.malloc)


def _address(function) -> int | None:
    return ctypes.cast(function, ctypes.c_void_p).value


_LIBC = _glibc()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo2():
    fn = getattr(_LIBC, "mallinfo2", None) if _LIBC is not None else None  # glibc >= 2.33
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()
_reuse_depth = 0
_heap_kept = False  # the heap is set never to trim (since the first reuse block)


def heap_live_bytes() -> int | None:
    """Bytes the C heap has handed out and not had back (glibc ``mallinfo2``: in use in its
    arenas plus its mmapped blocks; tensors' CPU memory comes from there). Unlike the resident
    set it leaves out the freed pages the heap keeps between timed blocks, which are no one's.
    ``None`` off glibc 2.33+."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def allocator_note() -> str:
    """What env.json says about CPU memory while timing (empty where glibc's malloc is not the
    process's: off glibc, or another allocator preloaded over it)."""
    return ALLOCATOR_NOTE if _LIBC is not None else ""


def available_bytes() -> int | None:
    """Memory the system can still give (``MemAvailable``; ``None`` where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: Share of the memory still available that a heap cushion may take.
CUSHION_SHARE = 0.25


def cushion_heap(nbytes: int, available: Callable[[], int | None] = available_bytes) -> int:
    """Inside :func:`freed_memory_reused`: touch ``nbytes`` at the top of the heap and free
    them, so that a later call whose temporaries land past the heap's extent so far (the calls
    of a block allocate in a different order each cycle, and the heap's free space fragments)
    finds resident pages instead of faulting them in while timed. At most ``CUSHION_SHARE`` of
    the available memory; nothing outside a reuse block (there a large block is mmapped, not
    taken from the heap) or off glibc.
    Returns the bytes touched."""
    if _LIBC is None or _reuse_depth == 0 or nbytes <= 0:
        return 0
    free = available()
    nbytes = int(min(nbytes, CUSHION_SHARE * free)) if free is not None else int(nbytes)
    if nbytes <= 0:
        return 0
    block = torch.empty(nbytes, dtype=torch.uint8)
    block.fill_(1)
    del block
    return nbytes


@contextmanager
def freed_memory_reused(enabled: bool = True) -> Iterator[None]:
    """While inside, glibc serves large allocations from its heap (no mmap) and never trims
    it: a call's output reuses the previous call's pages instead of faulting in fresh ones.
    On exit large allocations go back to mmap, but the heap keeps what the block freed,
    resident, until :func:`release_free_memory` (called when the run needs memory): the next
    block reuses those pages. Trimming after each block left the heap's top and holes in it
    to be faulted in again by the next block's calls, mid-cycle. Re-entrant; a no-op off
    glibc."""
    global _reuse_depth, _heap_kept
    if not enabled or _LIBC is None:
        yield
        return
    if _reuse_depth == 0:
        _LIBC.mallopt(_M_MMAP_MAX, 0)
        if not _heap_kept:
            _LIBC.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
            _heap_kept = True
    _reuse_depth += 1
    try:
        yield
    finally:
        _reuse_depth -= 1
        if _reuse_depth == 0:
            _LIBC.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)


def _trim_as_by_default() -> bool:
    """Outside a reuse block on glibc: the heap trimmed as glibc does by default again (True);
    else nothing to give back (False)."""
    global _heap_kept
    if _LIBC is None or _reuse_depth > 0:
        return False
    if _heap_kept:
        _LIBC.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
        _heap_kept = False
    return True


#: A chunk this large, freed, makes glibc's free() check the heap's top against the trim
#: threshold (it does so for a chunk of 64 KiB or more, FASTBIN_CONSOLIDATION_THRESHOLD).
_TRIM_TRIGGER_BYTES = 1 << 20


def release_heap_top() -> None:
    """Return only the free memory at the top of the heap to the system (outside a reuse
    block; off glibc nothing): with the trim threshold back at its default, freeing a large
    chunk trims the top (mallopt(3)). The free holes below live memory stay resident, for
    the next block's calls to reuse: :func:`release_free_memory` gives them back too, and
    the calls that land in them fault them in again while timed (a sweep of d=768-2560 at
    2048 tokens, 3 rounds, with every free page given back before each cell: 66 of 1,168
    samples faulted; with the top alone given back: 1 of 1,162; never given back: 0 of 989)."""
    if not _trim_as_by_default():
        return
    _LIBC.mallopt(_M_MMAP_MAX, 0)  # from the heap: its free() is what trims the top
    try:
        chunk = _LIBC.malloc(_TRIM_TRIGGER_BYTES)
    finally:
        _LIBC.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    if chunk:
        _LIBC.free(chunk)


def release_free_memory() -> None:
    """Return all of the heap's free pages to the system, its holes too, and trim it as glibc
    does by default again (outside a reuse block; off glibc nothing)."""
    if _trim_as_by_default():
        _LIBC.malloc_trim(0)


#: How the heap's free pages are given back when the run needs memory, one step at a time.
RELEASE_STEPS = (release_heap_top, release_free_memory)


def available_after_release(
    needed: int,
    available: Callable[[], int | None] = available_bytes,
    releases: Sequence[Callable[[], None]] = RELEASE_STEPS,
) -> int | None:
    """The memory available (``available``), read again after each of ``releases`` while it
    is below ``needed``: the heap's free pages cost nothing to give back, its top first (the
    holes left resident are what the next block's calls reuse), then all of them."""
    free = available()
    for release in releases:
        if free is None or free >= needed:
            break
        release()
        free = available()
    return free
