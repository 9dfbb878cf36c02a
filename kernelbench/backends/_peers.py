"""Helpers shared by the peer backends (``bitsandbytes``, ``torchao``, ``torchao_compile``).

Not a backend (not in the registry). The installed versions of the peers are recorded by
:func:`kernelbench.run.env.library_versions` from package metadata.
"""

from __future__ import annotations

import importlib


class LazyImport:
    """Import an optional module once, on first use; remember the failure as a reason."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._module = None
        self._error: str | None = None
        self._tried = False

    def load(self):
        """The module, or ``None`` (then :attr:`error` says why)."""
        if not self._tried:
            self._tried = True
            try:
                self._module = importlib.import_module(self.name)
            except Exception as exc:  # noqa: BLE001 - any failure only makes the peer unavailable
                self._error = f"{self.name} is not importable: {type(exc).__name__}: {exc}"
        return self._module

    @property
    def error(self) -> str:
        self.load()
        return self._error or ""
