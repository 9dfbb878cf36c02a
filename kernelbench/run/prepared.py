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
from kernelbench.backends.residency import reachable_tensors
from kernelbench.kernels import cpu_ext
from kernelbench.measure.timing import (
    RELEASE_STEPS,
    available_after_release,
    available_bytes,
    heap_live_bytes,
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


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    """The addresses of the storages under ``tensors`` (those that have one)."""
    found = set()
    for t in tensors:
        try:
            address = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            continue
        if address:
            found.add(address)
    return found


@dataclass
class PreparedCell:
    """One cell's inputs, its calibrated outlier dims and the runners built on them."""

    inputs: CellInputs
    kept_rows: torch.Tensor
    runners: dict[tuple[str, str], Runner] = field(default_factory=dict)
    nbytes: int = 0
    #: the key of the layer whose weights (and weights prepared from them) the runners share
    layer_key: Hashable = None


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
    a small one); otherwise it is not kept.

    Layers: the layer being measured is held whole; another layer stays only while a cell of
    it is kept (its inputs are those cells' own, and of the weights prepared from them it keeps
    only what their runners hold), so that a later round's cell of it that was not kept is
    built from the same prepared weights instead of drawing the layer and quantizing its
    weights again (half a minute at 175B shapes on 2 cores, and a second copy in memory)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = max(0, int(limit_bytes))
        self._cells: OrderedDict[Hashable, PreparedCell] = OrderedDict()
        self._layers: dict[Hashable, PreparedLayer] = {}
        self._current: Hashable = None

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
        """The layer held under ``key``, if any."""
        return self._layers.get(key)

    def hold_layer(self, key: Hashable, layer: PreparedLayer) -> None:
        """Hold ``layer`` as the one being measured (another held under ``key`` is replaced)."""
        self._layers[key] = layer
        self.release_layer(unless=key)

    def release_layer(self, unless: Hashable = None) -> None:
        """``unless`` becomes the layer being measured; the one measured before is let go
        unless a kept cell of it remains, and then keeps only the prepared weights the runners
        of its kept cells hold (one layer's whole set at a time: gigabytes at 175B)."""
        previous, self._current = self._current, unless
        if previous != unless and previous in self._layers:
            self._park(previous)
            gc.collect()

    def _park(self, key: Hashable) -> None:
        """Layer ``key`` (not being measured) keeps what its kept cells' runners hold, or goes
        when it has none."""
        cells = [c for c in self._cells.values() if c.layer_key == key]
        if not cells:
            del self._layers[key]
            return
        held = _storages(reachable_tensors([r.run for c in cells for r in c.runners.values()]))
        self._layers[key].shared.keep_only(
            lambda value: bool(_storages(reachable_tensors(value)) & held)
        )

    def _let_go(self, key: Hashable) -> None:
        """Drop the kept cell ``key``; a parked layer keeps no more than its other cells need."""
        layer_key = self._cells.pop(key).layer_key
        if layer_key != self._current and layer_key in self._layers:
            self._park(layer_key)

    def make_room(
        self,
        needed_bytes: int,
        keep: Hashable = None,
        available=None,
        release=None,
        keep_layer: Hashable = None,
    ) -> None:
        """Let kept cells go (least recently used first) while the system has less than
        ``needed_bytes`` free (after giving back the heap's free pages, its top first, then
        its holes; ``release``: what gives them back instead, in one step): a cell about to be
        built must never run out of memory because of what an earlier one left here. Never
        ``keep``, the cell about to be measured: its caller holds it, so letting it go would
        free nothing and only cost its next round the building; nor the cells of
        ``keep_layer`` (the layer being measured): their runners share its prepared weights,
        so letting them go frees only their activations."""
        others = [
            k
            for k, c in self._cells.items()
            if k != keep and (keep_layer is None or c.layer_key != keep_layer)
        ]
        if not others:
            return
        available = available or available_bytes
        releases = (release,) if release else RELEASE_STEPS
        free = available_after_release(needed_bytes, available, releases)
        while others and free is not None and free < needed_bytes:
            self._let_go(others.pop(0))
            gc.collect()
            # what the cell held may sit in the heap (allocated while timing reused freed
            # memory): given back, or the system's free memory would not show it
            free = available_after_release(needed_bytes, available, releases)

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
            free += self._cells[k].nbytes
            self._let_go(k)
        self._cells[key] = cell
        return True
