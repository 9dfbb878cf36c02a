"""Backend registry: :data:`REGISTRY` is the one list of backends, in display order.

Adding a backend is one new module that defines ``BACKEND`` (an instance of a
:class:`~kernelbench.backends.base.Backend` subclass) plus one line in :data:`REGISTRY`;
nothing else changes. A module that is not listed is not a backend, whatever it defines.

Importing a backend module must not fail because an optional dependency or a GPU is missing:
it reports that through :meth:`Backend.availability` instead. A listed module that fails to
import anyway, or defines no ``BACKEND`` of the listed name, is a broken backend whose
availability is the reason, on every device.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import torch

from kernelbench.backends.base import Availability, Backend, BrokenBackend, Runner

__all__ = [
    "REGISTRY",
    "Availability",
    "Backend",
    "BrokenBackend",
    "Runner",
    "add_backend_files",
    "all_backends",
    "backend_status",
    "get_backend",
    "load_backends",
]

#: (backend name, module defining ``BACKEND``): every backend, in the order tables list them.
REGISTRY: tuple[tuple[str, str], ...] = (
    ("torch", "kernelbench.backends.torch_ops"),
    ("custom", "kernelbench.backends.custom"),
    ("bitsandbytes", "kernelbench.backends.bitsandbytes"),
    ("cublaslt", "kernelbench.backends.cublaslt"),
    ("cutlass", "kernelbench.backends.cutlass"),
    ("torchao", "kernelbench.backends.torchao"),
    ("torchao_compile", "kernelbench.backends.torchao_compile"),
    ("triton", "kernelbench.backends.triton_int8"),
)


def _load(name: str, module_name: str) -> Backend:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - report, never crash the listing
        return BrokenBackend(name, f"{module_name}: {type(exc).__name__}: {exc}")
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend):
        return BrokenBackend(name, f"{module_name} defines no BACKEND (a Backend instance)")
    if backend.name != name:
        return BrokenBackend(name, f"{module_name}'s BACKEND is named {backend.name!r}")
    return backend


def load_backends(registry: Iterable[tuple[str, str]]) -> dict[str, Backend]:
    """Name -> backend for the (name, module) entries of ``registry``, in its order."""
    found: dict[str, Backend] = {}
    for name, module_name in registry:
        if name in found:
            raise ValueError(f"backend {name!r} is registered twice")
        found[name] = _load(name, module_name)
    return found


@cache
def all_backends() -> dict[str, Backend]:
    """Name -> backend for :data:`REGISTRY`, then the third-party backends (installed plugins
    and ``--backend-file`` files, :mod:`kernelbench.backends.plugins`); loaded once per process."""
    from kernelbench.backends import plugins

    found = load_backends(REGISTRY)
    return found | plugins.discover(set(found))


def add_backend_files(paths: list[Path]) -> None:
    """Load these files' backends too (here and in worker processes started from here)."""
    from kernelbench.backends import plugins

    plugins.record_backend_files(paths)
    all_backends.cache_clear()


def backend_status(
    device: torch.device | str, names: Iterable[str] | None = None
) -> dict[str, dict[str, object]]:
    """Per backend on ``device``: available, the reason when not, what checking printed
    (``detail``: a peer's import-time lines) and its verification status (of ``names`` only,
    when given: a peer's module is imported only when its backend is asked about);
    what a run records in ``env.json`` so that readers show it without importing a backend."""
    device = torch.device(device)
    out: dict[str, dict[str, object]] = {}
    wanted = None if names is None else set(names)
    for name, backend in all_backends().items():
        if wanted is not None and name not in wanted:
            continue
        avail = backend.availability(device)
        out[name] = {
            "available": bool(avail),
            "reason": avail.reason,
            "detail": avail.detail,
            "verification": backend.verification(device),
        }
    return out


def get_backend(name: str) -> Backend:
    backends = all_backends()
    if name not in backends:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(backends)}")
    return backends[name]
