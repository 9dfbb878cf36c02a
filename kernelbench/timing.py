"""Clocks: how one call is timed on a device, and nothing else.

* CPU: a wall clock (``time.perf_counter`` unless another is injected) around the call.
* CUDA: device events around the call; before every call the L2 cache is flushed by writing a
  buffer twice the device's L2 size (outside the timed region), and the SM clock is read after
  each call so that throttled samples can be counted. This path has not run on a GPU yet
  (see the backends' ``verified_on``).

When to stop, pairing and statistics live in :mod:`kernelbench.measure` and
:mod:`kernelbench.statistics`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
