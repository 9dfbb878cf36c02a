"""Outputs computed in the timed call: the inputs change in place, the output must follow.

A runner is built once on its inputs and then called many times; nothing in its interface
stops it from computing its output (or part of it, such as the activations' quantization)
while it is built and returning that from every call. So between calls the harness (and
``kernelbench check-backend``) redraws the activations in place (:func:`redraw_`: a random sign
per row and per column, so the magnitudes, and with them the scales, the outlier columns and
the work, stay as they were while the values are fresh) and holds a later output to the float64
oracle on the new values (:class:`SpotCheck`): an output nearer the oracle on the values the
runner was built with than on the values it was given is not computed in the call.

The check looks at a few output rows and columns only (:data:`SPOT_ROWS` x :data:`SPOT_COLS`),
so its oracle costs next to nothing even at 175B shapes. ``int8_raw`` runners multiply int8
operands made at build time (by design): their first operand is redrawn instead, and their
output held to the exact integer product.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import torch

from kernelbench import oracle

F64 = torch.float64

#: Output rows and columns a spot check compares (fewer when the output is smaller).
SPOT_ROWS = 4
SPOT_COLS = 64


class StaleOutput(RuntimeError):
    """A runner's output did not follow its input: it was not computed in the call."""


def spot_block(m: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the output a spot check compares, drawn with ``gen``."""
    rows = torch.randperm(m, generator=gen)[:SPOT_ROWS].sort().values
    cols = torch.randperm(n, generator=gen)[:SPOT_COLS].sort().values
    return rows, cols


def redraw_(t: torch.Tensor, gen: torch.Generator) -> Callable[[], None]:
    """Give ``t`` (m, k) fresh values in place: each row and each column times a random sign
    (element (0, 0) always flips, so something always changes). Magnitudes are kept: the same
    scales, outlier columns and work; exact in every dtype (int8 -128 stays -128). Returns
    what restores the old values exactly (the same signs once more)."""
    m, k = t.shape
    row = torch.randint(0, 2, (m,), generator=gen, dtype=torch.int8) * 2 - 1
    col = torch.randint(0, 2, (k,), generator=gen, dtype=torch.int8) * 2 - 1
    col[0] = -row[0]
    row_signs, col_signs = row.to(t.device, t.dtype)[:, None], col.to(t.device, t.dtype)[None, :]

    def flip() -> None:
        # a tensor made under torch.inference_mode (some peers build their operands so) may
        # be updated in place only inside it
        with torch.inference_mode(t.is_inference()):
            t.mul_(row_signs).mul_(col_signs)

    flip()
    return flip


def layer_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rows: torch.Tensor,
    cols: torch.Tensor,
) -> torch.Tensor:
    """The exact layer (float64, on the CPU) on output ``rows`` x ``cols``."""
    dev = x.device
    w = weight[cols.to(dev)]
    b = bias[cols.to(dev)] if bias is not None else None
    return oracle.exact(x[rows.to(dev)], w, b).cpu()


def int_reference(
    a: torch.Tensor, b_nk: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> torch.Tensor:
    """The exact int8 product ``a @ b_nk.T`` (float64, on the CPU) on ``rows`` x ``cols``."""
    return oracle.int_product(a[rows.to(a.device)], b_nk[cols.to(b_nk.device)]).to(F64).cpu()


@dataclass(frozen=True)
class SpotCheck:
    """The oracle on a block of the output, on the values a runner was built with
    (``before``) and on the values it is given now (``after``)."""

    rows: torch.Tensor
    cols: torch.Tensor
    before: torch.Tensor
    after: torch.Tensor

    def verify(self, y: torch.Tensor) -> None:
        """Raise :class:`StaleOutput` unless ``y`` is nearer the oracle on the new values."""
        if torch.equal(self.before, self.after):
            return  # the redraw changed nothing here: nothing to tell apart
        got = y[self.rows.to(y.device)][:, self.cols.to(y.device)].to(F64).cpu()
        to_new = float(torch.linalg.vector_norm(got - self.after))
        to_old = float(torch.linalg.vector_norm(got - self.before))
        if not to_new < to_old:  # NaN fails too
            scale = float(torch.linalg.vector_norm(self.after)) or 1.0
            raise StaleOutput(
                "output not computed from its current input: after its activations were "
                f"redrawn in place, its output is {to_old / scale:.3g} (relative) from the "
                f"oracle on the values it was built with and {to_new / scale:.3g} from the "
                "oracle on the new ones (an output or quantization kept from build time?)"
            )


def redraw_and_check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    keys: list[Hashable],
    int_operands: Mapping[Hashable, tuple[torch.Tensor, torch.Tensor] | None],
    gen: torch.Generator,
) -> tuple[dict[Hashable, SpotCheck], Callable[[], None]]:
    """Redraw ``x`` (and each distinct first int8 operand of the ``int_operands`` rows) in
    place; return each key's :class:`SpotCheck` for its next output, and what restores the
    old values. Keys in ``int_operands`` return the int8 product (``None``: no operands given,
    not checked); the others the layer."""
    rows, cols = spot_block(x.shape[0], weight.shape[0], gen)
    layer_before = layer_reference(x, weight, bias, rows, cols)
    pairs = {k: ops for k, ops in int_operands.items() if ops is not None and k in keys}
    int_before = {k: int_reference(*ops, rows, cols) for k, ops in pairs.items()}
    undo = [redraw_(x, gen)]
    redrawn: set[int] = set()
    try:
        for a, _ in pairs.values():
            if id(a) not in redrawn:
                undo.append(redraw_(a, gen))
                redrawn.add(id(a))
    except Exception:
        for flip in undo:  # every tensor back to its drawn values before the error goes on
            flip()
        raise
    checks = {}
    layer_after = layer_reference(x, weight, bias, rows, cols)
    for key in keys:
        if key in pairs:
            after = int_reference(*pairs[key], rows, cols)
            checks[key] = SpotCheck(rows, cols, int_before[key], after)
        elif key not in int_operands:
            checks[key] = SpotCheck(rows, cols, layer_before, layer_after)

    def restore() -> None:
        for flip in undo:
            flip()

    return checks, restore
