"""Measure the effect of kernelbench's two standing departures from the paper's LLM.int8() math
on a case layer (default: gpt3 6.7B ffn1, outliers distribution, bf16):

1. the scale computed before rounding, ``round(x * (127 / absmax))``, against the paper's
   ``round(127 * x / absmax)`` (float32): the share of weight codes that differ;
2. ``llm_int8``'s weight column scale over the regular (non-outlier) k rows only, against the
   absmax over all k rows: the output's relative error either way (float64 oracle).

Usage: python scripts/paper_departures.py [d_model] [layer]
"""

from __future__ import annotations

import sys

import torch

from kernelbench import oracle, quant
from kernelbench.quant import Problem, QuantConfig
from kernelbench.run.cases import layer_inputs, load_case


def main(d_model: int = 4096, layer: str = "ffn1") -> None:
    case = load_case("gpt3")
    li = layer_inputs(
        case, case.size(d_model), layer, "outliers", torch.bfloat16, torch.device("cpu")
    )
    w = li.weight.float()
    amax = w.abs().amax(1, keepdim=True)
    ours = torch.round(w * (torch.full_like(amax, 127.0) / amax))
    paper = torch.round(127.0 * w / amax)
    differ = ours != paper
    t = 127.0 * w.double() / amax.double()
    ties = (t - t.floor() == 0.5) & differ
    print(
        f"1. codes that differ: {int(differ.sum())} of {w.numel()} "
        f"({100 * float(differ.float().mean()):.4f}%); exact ties among them: {int(ties.sum())}"
    )
    cfg = QuantConfig()
    x = li.x[:2048]
    kept = quant.outlier_columns(x, cfg.alpha, cfg.outlier_cmp)
    exact = oracle.exact(x[:256], li.weight, li.bias)
    regular = oracle.emulate(Problem("llm_int8", x[:256], li.weight, li.bias, cfg, kept_rows=kept))
    # all k rows in the scale: the same dims decomposed, their 16-bit weights used, but the
    # column absmax taken over every row (int8 weights then rescaled for the kept dims only)
    pw = quant.prepare_weight(li.weight, li.bias, cfg, None, compute_dtype=torch.float64)
    pw.kept_rows, pw.kept_values = kept, li.weight[:, kept].contiguous()
    cols = quant.decomposition_columns(x[:256], pw, cfg)
    qa = quant.quantize_activation(x[:256], cols, torch.float64)
    acc = oracle.int_product(qa.int8, pw.int8)
    y_all = quant.dequantize(
        acc, qa, pw, quant.outlier_product(qa, pw, torch.float64), torch.float64, torch.float64
    )
    e_reg, e_all = oracle.rel_frobenius(regular, exact), oracle.rel_frobenius(y_all, exact)
    print(
        f"2. llm_int8 rel. error, column scale over the regular rows: {e_reg:.6e}; over all k "
        f"rows: {e_all:.6e} ({len(kept)} kept dims; ratio {e_all / e_reg:.6f})"
    )


if __name__ == "__main__":
    main(*(int(a) if i == 0 else a for i, a in enumerate(sys.argv[1:])))
