"""The ``kernelbench`` command (typer + rich)."""

from __future__ import annotations

import torch
import typer
from rich.console import Console
from rich.table import Table

from kernelbench.backends import all_backends

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()


@app.callback()
def _root() -> None:
    """kernelbench: int8 matmul kernels, timed and checked against a float64 oracle."""


def _devices() -> list[torch.device]:
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    return devices


@app.command("list")
def list_backends() -> None:
    """Every backend, per device: available, or the reason why not."""
    table = Table(title="kernelbench backends")
    table.add_column("backend")
    table.add_column("device")
    table.add_column("available")
    table.add_column("methods / reason")
    for name, backend in all_backends().items():
        for device in ("cpu", "cuda"):
            avail = backend.availability(torch.device(device))
            detail = ", ".join(backend.methods) if avail else avail.reason
            table.add_row(name, device, "yes" if avail else "no", detail)
    console.print(table)
    from kernelbench import cpu_ext

    console.print(
        f"CPU kernel set: {cpu_ext.isa()}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; CUDA device: "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
