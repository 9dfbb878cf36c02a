"""Prepared cells kept between rounds: a cell's inputs and built runners, reused by its later
rounds while they fit in a memory budget.

Building a runner quantizes (and packs) the cell's 16-bit weight. At 175B shapes on a 2-core CPU
that takes about ten seconds per runner, two minutes per cell and round: more than the timing
itself. A cell's inputs and weights are the same in every round (same seed), so a later round
that finds the cell kept skips the building and only times. Nothing measured is kept: rows,
samples and accuracy are each round's own. What is kept is bounded by ``limit_bytes`` (the
memory the cell's inputs and runners hold: what the heap handed out while they were built and
did not get back); a cell that does not fit is built again in its next round, as if there were
no cache.
"""

from __future__ import annotations

import gc
import os
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from kernelbench.backends.base import Runner, SharedWeights
from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import (
    available_after_release,
    available_bytes,
    heap_live_bytes,
    release_free_memory,
)
from kernelbench.run.cases import CellInputs, LayerInputs

#: Share of the machine's physical memory a run may keep prepared cells in, by default.
DEFAULT_SHARE = 0.55


def default_limit_bytes() -> int:
    """``DEFAULT_SHARE`` of physical memory (0 where the platform does not say)."""
    try:
        return int(DEFAULT_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def memory_in_use(device: torch.device) -> int | None:
    """Memory in use now: CUDA allocations on CUDA; on the CPU what the heap has handed out
    (:func:`~kernelbench.measure.timing.heap_live_bytes`) and the huge page mappings of packed
    weights (:func:`~kernelbench.kernels.cpu_ext.huge_page_bytes`), else the process's resident set
    (which also counts the freed pages the heap keeps for the next timed block: a kept cell
    measured that way grew by whatever its cycles left free). ``None`` where the platform does
    not say."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    live = heap_live_bytes()
    if live is not None:
        return live + cpu_ext.huge_page_bytes()  # packed weights live outside the heap
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class PreparedCell:
    """One cell's inputs, its calibrated outlier dims and the runners built on them."""

    inputs: CellInputs
    kept_rows: torch.Tensor
    runners: dict[tuple[str, str], Runner] = field(default_factory=dict)
    nbytes: int = 0


@dataclass
class PreparedLayer:
    """What the cells of one layer (every token count) share: its inputs, the outlier dims
    ``llm_int8`` keeps (calibrated on the layer's activations) and the weights prepared from
    them so far."""

    inputs: LayerInputs
    kept_rows: torch.Tensor
    shared: SharedWeights = field(default_factory=SharedWeights)


class PreparedCells:
    """Prepared cells by cell key, within ``limit_bytes``. A cell that does not fit may push out
    the least recently used smaller ones (keeping a large cell saves more building than keeping
    a small one); otherwise it is not kept."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(0, int(limit_bytes))
        self._cells: OrderedDict[Hashable, PreparedCell] = OrderedDict()
        self._layer: tuple[Hashable, PreparedLayer] | None = None

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._cells.values())

    def __len__(self) -> int:
        return len(self._cells)

    def get(self, key: Hashable) -> PreparedCell | None:
        cell = self._cells.get(key)
        if cell is not None:
            self._cells.move_to_end(key)
        return cell

    def layer(self, key: Hashable) -> PreparedLayer | None:
        """The layer held under ``key``, if it is the one held."""
        return self._layer[1] if self._layer is not None and self._layer[0] == key else None

    def hold_layer(self, key: Hashable, layer: PreparedLayer) -> None:
        """Hold ``layer`` (one layer at a time: its prepared weights are gigabytes at 175B)."""
        self.release_layer()
        self._layer = (key, layer)

    def release_layer(self, unless: Hashable = None) -> None:
        """Let the held layer go, unless it is ``unless``."""
        if self._layer is not None and self._layer[0] != unless:
            self._layer = None
            gc.collect()

    def make_room(
        self,
        needed_bytes: int,
        keep: Hashable = None,
        available=None,
        release=None,
    ) -> None:
        """Let kept cells go (least recently used first) while the system has less than
        ``needed_bytes`` free (after giving back the heap's free pages): a cell about to be
        built must never run out of memory because of what an earlier one left here. Never
        ``keep``, the cell about to be measured: its caller holds it, so letting it go would
        free nothing and only cost its next round the building."""
        others = [k for k in self._cells if k != keep]
        if not others:
            return
        available = available or available_bytes
        release = release or release_free_memory
        free = available_after_release(needed_bytes, available, release)
        while others and free is not None and free < needed_bytes:
            victim = others.pop(0)
            del self._cells[victim]
            gc.collect()
            # what the cell held may sit in the heap (allocated while timing reused freed
            # memory): given back, or the system's free memory would not show it
            free = available_after_release(needed_bytes, available, release)

    def offer(self, key: Hashable, cell: PreparedCell) -> bool:
        """Keep ``cell`` under ``key`` if it fits (pushing out smaller cells); True if kept."""
        self._cells.pop(key, None)
        if not self.limit_bytes or cell.nbytes > self.limit_bytes:
            return False
        smaller = [k for k, c in self._cells.items() if c.nbytes < cell.nbytes]
        free = self.limit_bytes - self.nbytes
        if free + sum(self._cells[k].nbytes for k in smaller) < cell.nbytes:
            return False
        for k in smaller:
            if free >= cell.nbytes:
                break
            free += self._cells.pop(k).nbytes
        self._cells[key] = cell
        return True
