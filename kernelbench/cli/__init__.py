"""The ``kernelbench`` command: option parsing, progress and the sweep command.

May import everything. ``kernelbench.cli:app`` is the console script's entry point.
"""

from kernelbench.cli.commands import app, main

__all__ = ["app", "main"]
