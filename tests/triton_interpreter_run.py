"""Runs the ``triton`` backend's kernels under the Triton interpreter, for tests/test_triton.py.

Usage: ``TRITON_INTERPRET=1 python tests/triton_interpreter_run.py CASES.pt RESULTS.pt``

The interpreter is chosen when ``triton.jit`` decorates a kernel, from TRITON_INTERPRET, so it
must be set before the kernels are built; running here, in a child process, keeps it out of the
pytest process and every other test module. ``CASES.pt`` is a list of dicts (name, method, x,
weight, bias, alpha, outlier_cmp, outlier_weights, kept_rows); ``RESULTS.pt`` gets, per case,
every stage's output (or the error's class name and message), plus the results of bad inputs.
A ``smoothquant`` case runs its stages on the smoothed operands (``quant.smoothed_operands``)
and its runner on the case's own ``x`` and ``weight``.
"""

from __future__ import annotations

import os
import sys

import torch


def _err(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the parent test to judge
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def run_case(backend, case: dict) -> dict:
    from kernelbench import quant
    from kernelbench.backends.base import method_config
    from kernelbench.quant import QuantConfig

    cfg = method_config(
        case["method"],
        QuantConfig(case["alpha"], case["outlier_cmp"], case["outlier_weights"]),
    )
    kept = case["kept_rows"] if case["method"] == "llm_int8" else None
    x, w = case["x"], case["weight"]
    if case["method"] == "smoothquant":  # the stages run on the smoothed operands
        _, x, w = quant.smoothed_operands(x, w)
    pw = backend.prepare_weight(w, case["bias"], cfg, kept)
    qa = backend.quantize(x, pw, cfg)
    acc = backend.int8_matmul(qa.int8, pw)
    outl = backend.outlier_product(qa, pw)
    runner = backend.runner(
        case["method"], case["x"], case["weight"], case["bias"], cfg, case["kept_rows"]
    )
    return {
        "q": qa.int8,
        "absmax": qa.absmax,
        "cols": qa.outlier_cols,
        "outlier_values": qa.outlier_values,
        "acc": acc,
        "staged": backend.dequantize(acc, qa, pw, outl),
        "linear": backend.linear(x, pw, cfg),
        "runner": runner.run(),
        "variant": runner.variant,
    }


def bad_inputs(backend) -> dict:
    from kernelbench.quant import QuantConfig

    cfg = QuantConfig()
    w = torch.randn(16, 32, dtype=torch.bfloat16)
    pw = backend.prepare_weight(w, None, cfg)
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    qa = backend.quantize(x, pw, cfg)
    a = qa.int8
    acc = backend.int8_matmul(a, pw)
    big = backend.prepare_weight(torch.zeros(16, 133145, dtype=torch.bfloat16), None, cfg)
    return {
        "x wrong k": _err(lambda: backend.quantize(torch.randn(16, 48).bfloat16(), pw, cfg)),
        "x 1-D": _err(lambda: backend.quantize(torch.randn(32).bfloat16(), pw, cfg)),
        "x int": _err(lambda: backend.quantize(torch.ones(16, 32, dtype=torch.int32), pw, cfg)),
        "x not contiguous": _err(
            lambda: backend.quantize(torch.randn(32, 16).bfloat16().t(), pw, cfg)
        ),
        "k too large": _err(
            lambda: backend.quantize(torch.zeros(1, 133145, dtype=torch.bfloat16), big, cfg)
        ),
        "a float": _err(lambda: backend.int8_matmul(a.float(), pw)),
        "a wrong k": _err(lambda: backend.int8_matmul(a[:, :16].contiguous(), pw)),
        "a not contiguous": _err(lambda: backend.int8_matmul(a.t().contiguous().t(), pw)),
        "acc float": _err(lambda: backend.dequantize(acc.float(), qa, pw, None)),
        "acc wrong n": _err(lambda: backend.dequantize(acc[:, :8].contiguous(), qa, pw, None)),
        "outlier not a pair": _err(lambda: backend.dequantize(acc, qa, pw, torch.zeros(16, 16))),
        "runner NaN x": _err(
            lambda: backend.runner(
                "llm_int8", torch.full((16, 32), float("nan"), dtype=torch.bfloat16), w, None, cfg
            )
        ),
    }


def main(cases_path: str, results_path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("set TRITON_INTERPRET=1 (before triton is imported) to run this script")
    from kernelbench.backends import triton_int8

    backend = triton_int8.BACKEND
    assert triton_int8.interpreting(), "kernels were not built for the interpreter"
    cases = torch.load(cases_path)
    results = {"cases": {}, "bad": bad_inputs(backend), "interpreting": True}
    for case in cases:
        try:
            results["cases"][case["name"]] = run_case(backend, case)
        except Exception as exc:  # noqa: BLE001 - the parent test reports it
            results["cases"][case["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
    torch.save(results, results_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
