"""Backend registry: every module in this package that defines ``BACKEND`` is a backend.

Adding a backend is adding one module here; nothing else changes. Importing a backend module
must not fail because an optional dependency or a GPU is missing: it reports that through
:meth:`Backend.availability` instead. A module that fails to import anyway is listed as a
broken backend with the import error as its reason.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

import torch

from kernelbench.backends.base import METHODS, Availability, Backend, Runner

__all__ = ["METHODS", "Availability", "Backend", "Runner", "all_backends", "get_backend"]

_NOT_BACKENDS = {"base"}


class BrokenBackend(Backend):
    """Stands in for a backend module that could not be imported."""

    def __init__(self, name: str, error: str) -> None:
        self.name = name
        self.error = error
        self.methods = ()

    def availability(self, device: torch.device) -> Availability:
        return Availability.no(f"backend module failed to import: {self.error}")


@cache
def all_backends() -> dict[str, Backend]:
    """Name -> backend, in a stable order (``torch`` and ``custom`` first)."""
    found: dict[str, Backend] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in _NOT_BACKENDS:
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:  # report, never crash the listing
            found[info.name] = BrokenBackend(info.name, f"{type(exc).__name__}: {exc}")
            continue
        backend = getattr(module, "BACKEND", None)
        if isinstance(backend, Backend):
            found[backend.name] = backend
    order = {"torch": 0, "custom": 1}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], 2), kv[0])))


def get_backend(name: str) -> Backend:
    backends = all_backends()
    if name not in backends:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(backends)}")
    return backends[name]
