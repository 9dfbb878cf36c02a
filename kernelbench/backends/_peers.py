"""Helpers shared by the peer backends (``bitsandbytes``, ``torchao``, ``torchao_compile``).

Not a backend (leading underscore): the registry skips it. Versions are read from the installed
distributions' metadata, so reporting them never imports the (heavy) packages themselves.
"""

from __future__ import annotations

import importlib
from importlib import metadata

#: Distribution names of the peers we measure ourselves against, plus torch itself.
PEER_DISTRIBUTIONS: tuple[str, ...] = ("torch", "bitsandbytes", "torchao", "triton")

#: The versions the peer backends were written and tested against (``pip install --no-deps``).
TESTED_VERSIONS: dict[str, str] = {"bitsandbytes": "0.50.2", "torchao": "0.18.0"}


def peer_versions() -> dict[str, str]:
    """Distribution name -> installed version, or ``"not installed"``, for every peer."""
    out: dict[str, str] = {}
    for dist in PEER_DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


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
