"""Executors run the harness's work items and stream result rows back.

The harness (:mod:`kernelbench.run.cell`) turns a case into :class:`WorkItem` s and knows how to
measure one; an executor decides where and in which order items run. ``local`` (the default)
measures them in this process, in order, keeping cells prepared between rounds within a memory
budget (:mod:`kernelbench.run.prepared`). :data:`EXECUTORS` lists every executor by module path,
so a module (Ray's) is imported only when its executor is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Protocol

from kernelbench.results.schema import ResultRow
from kernelbench.run.cases import Case
from kernelbench.run.cell import measure_cell
from kernelbench.run.plan import CallEstimator, RunOptions, WorkItem, load_user_activations
from kernelbench.run.prepared import PreparedCells, default_limit_bytes


class Executor(Protocol):
    name: str

    def run(
        self, items: list[WorkItem], case: Case, opts: RunOptions, done: set[tuple]
    ) -> Iterator[tuple[WorkItem, ResultRow]]:
        """Yield (item, row) as rows are measured; rows whose key is in ``done`` are skipped."""
        ...

    def learn(self, rows: list[dict]) -> None:
        """Call times from rows measured before (a resumed run's), for the estimates."""
        ...


class LocalExecutor:
    """Cells in order, in this process; rows streamed back as measured. The call-time
    estimates and the cells kept prepared last from one :meth:`run` to the next: a run's extra
    rounds are later calls, and rebuilding every runner there (quantizing the weights again)
    cost more than the extra pairs."""

    name = "local"

    def __init__(self, **_: object) -> None:
        self.estimator = CallEstimator()
        self.prepared: PreparedCells | None = None

    def learn(self, rows: list[dict]) -> None:
        self.estimator.record_rows(rows)

    def run(self, items, case, opts, done):
        activations = load_user_activations(opts)
        if self.prepared is None:
            limit = opts.keep_prepared_bytes
            self.prepared = PreparedCells(default_limit_bytes() if limit is None else limit)
        for item in items:
            cells = measure_cell(item, case, opts, self.estimator, done, activations, self.prepared)
            for row in cells:
                yield item, row


#: name -> "module:Class"; loaded on demand.
EXECUTORS = {
    "local": "kernelbench.run.executors:LocalExecutor",
    "ray": "kernelbench.run.ray_executor:RayExecutor",
}


def get_executor(name: str, **kwargs: object) -> Executor:
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
    module_name, cls_name = EXECUTORS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"executor {name!r} is not available: {exc}") from None
    return getattr(module, cls_name)(**kwargs)
