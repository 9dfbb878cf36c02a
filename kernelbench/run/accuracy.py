"""The accuracy study: every scheme of ``core.ACCURACY_STUDY`` x model size x seed, its error
against the float64 product next to the 16-bit baseline's, no timing.

Each (size, seed) draws one layer's inputs as a run does (:func:`cases.layer_inputs`, the case
seed offset by the seed index), reads all ``tokens`` rows of ``x`` and all of the weight once
(:func:`kernelbench.quant.operand_statistics`, shared by every method), quantizes with those
statistics (:func:`kernelbench.quant.variant_forward`), and computes the output only on
``error_rows`` x ``error_cols`` sampled entries: the float64 oracle of a 175B layer stays cheap,
and every sampled entry is the one a full product would give. Outputs are rounded to the layer's
16-bit dtype, as a kernel's are. Rows use the run schema (``backend="reference"``; the baseline
is ``torch`` ``fp16``, i.e. the 16-bit ``F.linear``), so ``show``, ``report`` and ``compare``
read the study's directory like a run's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelbench import oracle, quant
from kernelbench.core import ACCURACY_STUDY, BASELINE, STUDY_BACKEND, work_bytes, work_flops
from kernelbench.quant import QuantConfig
from kernelbench.results.schema import ResultRow
from kernelbench.run.cases import Case, layer_inputs
from kernelbench.settings import default

#: The backend name of the study's rows: the reference math of :mod:`kernelbench.quant`.
REFERENCE_BACKEND = STUDY_BACKEND
STUDY_METHODS: tuple[str, ...] = tuple(m for m, _ in ACCURACY_STUDY)


@dataclass(frozen=True)
class StudyOptions:
    case: Case
    d_models: tuple[int, ...]
    layer: str
    dist: str
    seeds: int = default("seeds")
    tokens: int = default("study_tokens")
    error_rows: int = default("study_error_rows")
    error_cols: int = default("study_error_cols")
    methods: tuple[str, ...] = STUDY_METHODS
    dtype: torch.dtype = torch.bfloat16
    cfg: QuantConfig = QuantConfig()
    activations: torch.Tensor | None = None


def _sample(count: int, limit: int, gen: torch.Generator) -> torch.Tensor:
    if count <= limit:
        return torch.arange(count)
    return torch.randperm(count, generator=gen)[:limit].sort().values


def _output(method: str, x, w, b, calibration, x_rows, w_rows, cfg, dtype, stats) -> torch.Tensor:
    """The method's output on the sampled entries, in the layer dtype."""
    xs, ws, bs = x[x_rows], w[w_rows], b[w_rows]
    if method == "fp16":
        return F.linear(xs, ws, bs)
    if method == "fp32":
        return F.linear(xs.float(), ws.float(), bs.float())
    y = quant.variant_forward(method, x, w, b, cfg, calibration, x_rows, w_rows, stats=stats)
    return y.to(dtype)


def study(opts: StudyOptions, device_class: str, on_row: Callable[[ResultRow], None]) -> None:
    """Compute every (seed, size, method) row and hand each to ``on_row`` as it is done."""
    host = socket.gethostname()
    for seed_index in range(opts.seeds):
        case = dataclasses.replace(opts.case, seed=opts.case.seed + seed_index)
        for d_model in opts.d_models:
            size = case.size(d_model)
            k, n = case.shape(opts.layer, d_model)
            li = layer_inputs(
                case, size, opts.layer, opts.dist, opts.dtype, torch.device("cpu"),
                opts.activations, opts.tokens,
            )  # fmt: skip
            x = li.x[: opts.tokens]
            gen = torch.Generator().manual_seed(li.seed)
            x_rows = _sample(x.shape[0], opts.error_rows, gen)
            w_rows = _sample(n, opts.error_cols, gen)
            exact = oracle.exact(x[x_rows], li.weight[w_rows], li.bias[w_rows])
            # one pass over the whole operands, shared by every method of this (size, seed)
            stats = quant.operand_statistics(x, li.weight, li.calibration)
            outliers = int(stats.x_outliers(opts.cfg).sum())
            base_err = None
            for method in ("fp16", *(m for m in opts.methods if m != "fp16")):
                y = _output(
                    method, x, li.weight, li.bias, li.calibration, x_rows, w_rows,
                    opts.cfg, opts.dtype, stats,
                )  # fmt: skip
                err = oracle.rel_frobenius(y, exact)
                base_err = err if method == "fp16" else base_err
                backend = BASELINE[0] if method in ("fp16", "fp32") else REFERENCE_BACKEND
                on_row(
                    ResultRow(
                        case=case.name, size=size.name, d_model=d_model, layer=opts.layer,
                        tokens=x.shape[0], m=x.shape[0], k=k, n=n, dist=opts.dist,
                        seed=li.seed, backend=backend, method=method, device="cpu",
                        device_class=device_class, dtype=str(opts.dtype).removeprefix("torch."),
                        variant=f"error on {len(x_rows)} x {len(w_rows)} sampled outputs",
                        flops=work_flops(x.shape[0], k, n),
                        bytes=work_bytes(method, x.shape[0], k, n),
                        rel_error=err, max_abs_error=oracle.max_abs_error(y, exact),
                        baseline_rel_error=base_err, outlier_cols=outliers,
                        planted_outlier_cols=li.planted_outliers, host=host,
                        timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    )
                )  # fmt: skip
