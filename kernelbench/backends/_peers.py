"""Helpers shared by the peer backends (``bitsandbytes``, ``torchao``, ``torchao_compile``).

Not a backend (not in the registry). The installed versions of the peers are recorded by
:func:`kernelbench.run.env.library_versions` from package metadata.

Peers print on import (bitsandbytes: a missing optional kernel package; torchao: its optional
CUDA libraries; torch: deprecation log lines triggered by torchao). None of that is ours to show
on every command: :func:`captured_output` keeps it, and the backend's availability carries it as
``detail`` (``kernelbench list -v``, ``env.json``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class _Captured:
    """What was said while :func:`captured_output` was active (filled in when it ends)."""

    def __init__(self) -> None:
        self.text = ""


@contextlib.contextmanager
def captured_output() -> Iterator[_Captured]:
    """Keep everything written to stderr/stdout (file descriptors 1 and 2 too, for C code and
    handlers holding the original streams), warnings and log records while active."""
    captured = _Captured()
    py_out, py_err = io.StringIO(), io.StringIO()
    records: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    root = logging.getLogger()
    keep = _Keep()
    saved_root_handlers = root.handlers[:]
    saved_last_resort = logging.lastResort
    with contextlib.ExitStack() as stack:
        fd_file = stack.enter_context(tempfile.TemporaryFile(mode="w+b"))
        saved_fds: list[tuple[int, int]] = []
        for stream in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved_fds.append((fd, os.dup(fd)))
                os.dup2(fd_file.fileno(), fd)
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        stack.enter_context(contextlib.redirect_stdout(py_out))
        stack.enter_context(contextlib.redirect_stderr(py_err))
        root.handlers = [keep]
        logging.lastResort = None
        try:
            yield captured
        finally:
            root.handlers = saved_root_handlers
            logging.lastResort = saved_last_resort
            for stream in (sys.__stdout__, sys.__stderr__):
                with contextlib.suppress(Exception):
                    stream.flush()
            for fd, saved in saved_fds:
                os.dup2(saved, fd)
                os.close(saved)
            fd_file.seek(0)
            raw = fd_file.read().decode("utf-8", "replace")
            lines = [*records, *(f"warning: {w.message}" for w in caught)]
            lines += [py_out.getvalue(), py_err.getvalue(), raw]
            kept = (s.strip() for s in "\n".join(lines).splitlines())
            captured.text = "\n".join(dict.fromkeys(s for s in kept if s))


def quietly(fn: Callable[[], T]) -> tuple[T, str]:
    """``fn()`` and what it printed, warned or logged meanwhile (see :func:`captured_output`)."""
    with captured_output() as said:
        result = fn()
    return result, said.text


class LazyImport:
    """Import an optional module once, on first use; remember the failure as a reason and what
    the import printed, warned or logged as :attr:`output` (never shown on the terminal)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._module = None
        self._error: str | None = None
        self._tried = False
        self.output = ""

    def load(self):
        """The module, or ``None`` (then :attr:`error` says why)."""
        if not self._tried:
            self._tried = True
            try:
                self._module, self.output = quietly(lambda: importlib.import_module(self.name))
            except Exception as exc:  # noqa: BLE001 - any failure only makes the peer unavailable
                self._error = f"{self.name} is not importable: {type(exc).__name__}: {exc}"
        return self._module

    @property
    def error(self) -> str:
        self.load()
        return self._error or ""
