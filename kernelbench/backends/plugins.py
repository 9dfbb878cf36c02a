"""Backends from outside this package: installed plugins and single files.

Two ways in, both loaded into the registry next to the built-in backends
(:func:`kernelbench.backends.all_backends`):

* an installed package names its backend in the ``kernelbench.backends`` entry-point group::

      [project.entry-points."kernelbench.backends"]
      int8_numpy = "kb_int8_numpy:BACKEND"

  (the entry point's name is the backend's name; the object is a :class:`Backend` instance, a
  subclass of it, or a module defining ``BACKEND``);
* ``--backend-file path.py`` on the command line (or the ``KERNELBENCH_BACKEND_FILES``
  environment variable, paths separated by ``os.pathsep``): a Python file defining
  ``BACKEND``. It is executed as code, like any script the user runs.

A backend that fails to load, declares no or an unsupported ``api_version``, or clashes with a
known name becomes a :class:`~kernelbench.backends.base.BrokenBackend` carrying the reason (its rows
are skipped with it). A third-party backend that loads is held to the backend contract
(:mod:`kernelbench.backends.contract`) before its first row: if it breaks it, every one of its rows
is a failed row naming the broken contract, and the sweep goes on.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

from kernelbench import __version__
from kernelbench.backends.base import API_VERSION, SUPPORTED_API_VERSIONS, Backend, BrokenBackend

ENTRY_POINT_GROUP = "kernelbench.backends"
BACKEND_FILES_ENV = "KERNELBENCH_BACKEND_FILES"


@dataclass(frozen=True)
class Origin:
    """Where a backend came from: ``builtin``, ``plugin`` (an installed distribution) or
    ``file`` (a ``--backend-file``), with the source (distribution or path) and its version."""

    kind: str
    source: str = "kernelbench"
    version: str = __version__

    @property
    def third_party(self) -> bool:
        return self.kind != "builtin"

    def label(self) -> str:
        """``builtin``, ``plugin kb-int8-numpy 0.1.0`` or ``file /path/x.py``: written to rows."""
        if self.kind == "builtin":
            return "builtin"
        return " ".join(v for v in (self.kind, self.source, self.version) if v)


BUILTIN = Origin("builtin")
_origins: dict[str, Origin] = {}
_guard_lock = threading.RLock()


def origin_of(name: str) -> Origin:
    """The origin of a loaded backend (built-in for every name not loaded from outside)."""
    return _origins.get(name, BUILTIN)


def api_problem(backend: object) -> str | None:
    """Why ``backend``'s declared ``api_version`` cannot be used here, or ``None``."""
    declared = getattr(backend, "api_version", None)
    if declared is None:
        return (
            f"declares no api_version (set api_version = {API_VERSION} on the Backend class; "
            "see docs/plugins.md)"
        )
    if not isinstance(declared, int) or isinstance(declared, bool):
        return f"api_version must be an int, got {declared!r}"
    if declared > API_VERSION:
        return (
            f"needs kernelbench backend API {declared}, but kernelbench {__version__} provides "
            f"API {API_VERSION}: upgrade kernelbench to use it"
        )
    if declared not in SUPPORTED_API_VERSIONS:
        return (
            f"was written for backend API {declared}, which kernelbench {__version__} no longer "
            f"supports (supported: {', '.join(map(str, SUPPORTED_API_VERSIONS))})"
        )
    return None


def backend_files() -> list[Path]:
    """The ``--backend-file`` paths of this process (and its workers), in the order given."""
    raw = os.environ.get(BACKEND_FILES_ENV, "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def record_backend_files(paths: list[Path]) -> None:
    """Add these files to this process's backend files (inherited by its worker processes);
    :func:`kernelbench.backends.add_backend_files` also loads them."""
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise ValueError(f"--backend-file: no such file: {', '.join(missing)}")
    known = [str(p) for p in backend_files()]
    new = [str(Path(p).resolve()) for p in paths]
    os.environ[BACKEND_FILES_ENV] = os.pathsep.join(dict.fromkeys(known + new))


def _as_backend(obj: object, where: str) -> Backend:
    """A backend from an entry point's object: an instance, a subclass, or a module."""
    if isinstance(obj, ModuleType):
        obj = getattr(obj, "BACKEND", None)
    if inspect.isclass(obj) and issubclass(obj, Backend):
        obj = obj()
    if not isinstance(obj, Backend):
        raise TypeError(f"{where} is not a kernelbench Backend (got {type(obj).__name__})")
    return obj


def _load_file(path: Path) -> Backend:
    module_name = f"kernelbench_user_backend_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    if not hasattr(module, "BACKEND"):
        raise AttributeError(f"{path} defines no BACKEND (a Backend instance)")
    return _as_backend(module.BACKEND, f"{path}'s BACKEND")


def _entry_points() -> list[tuple[str, Origin, object]]:
    """(name, origin, loader) of every installed ``kernelbench.backends`` entry point."""
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = Origin(
            "plugin", dist.name if dist else ep.value, dist.version if dist else "unknown"
        )
        found.append((ep.name, origin, lambda ep=ep: _as_backend(ep.load(), ep.value)))
    return found


def _file_sources() -> list[tuple[str, Origin, object]]:
    return [
        (p.stem, Origin("file", str(p), ""), lambda p=p: _load_file(p)) for p in backend_files()
    ]


def discover(taken: set[str]) -> dict[str, Backend]:
    """Name -> backend for every plugin and backend file, each checked; ``taken`` are the names
    already registered (a plugin may not replace one)."""

    found: dict[str, Backend] = {}
    for name, origin, load in _entry_points() + _file_sources():
        where = f"{origin.kind} {origin.source}"
        try:
            backend = load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal
            backend = BrokenBackend(name, f"{where}: {type(exc).__name__}: {exc}")
        else:
            if origin.kind == "file":
                name = backend.name  # a file's backend keeps its own name
                version = getattr(backend, "version", "")
                origin = Origin("file", origin.source, version if isinstance(version, str) else "")
            problem = api_problem(backend)
            if problem:
                backend = BrokenBackend(name, f"{where} {problem}")
            elif backend.name != name:
                backend = BrokenBackend(
                    name, f"{where}: entry point {name!r} loads a backend named {backend.name!r}"
                )
        if name in taken or name in found:
            owner = "a built-in backend" if name in taken else "another plugin"
            name = f"{name}@{origin.source}"
            backend = BrokenBackend(name, f"{where}: the name is already used by {owner}")
        if not isinstance(backend, BrokenBackend):
            guard(backend)
        _origins[name] = origin
        found[name] = backend
    return found


class ContractViolation(RuntimeError):
    """A third-party backend broke the backend contract: none of its rows are measured."""


def guard(backend: Backend) -> None:
    """Hold ``backend`` to the contract on each device before its first runner: its
    ``runner`` runs :func:`kernelbench.backends.contract.run_contract` once per device type and
    raises :class:`ContractViolation` naming the failed contracts if any failed."""
    inner = backend.runner
    verdicts: dict[str, str | None] = {}

    def checked_runner(method, x, *args, **kwargs):
        device = x.device.type if hasattr(x, "device") else "cpu"
        with _guard_lock:
            if device not in verdicts:  # the contract calls the unchecked runner
                verdicts[device] = _contract_verdict(backend, device)
        if verdicts[device]:
            raise ContractViolation(verdicts[device])
        return inner(method, x, *args, **kwargs)

    backend.runner = checked_runner  # type: ignore[method-assign]
    backend.unchecked_runner = inner  # type: ignore[attr-defined]


def _contract_verdict(backend: Backend, device: str) -> str | None:
    from kernelbench.backends.contract import run_contract

    failed = [r for r in run_contract(backend, device) if r.status == "fail"]
    if not failed:
        return None
    names = ", ".join(r.name for r in failed)
    first = failed[0]
    return (
        f"backend {backend.name!r} fails the contract ({names}): {first.name}: {first.detail}"
        f" [kernelbench check-backend {backend.name}]"
    )[:480]
