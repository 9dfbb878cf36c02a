"""The ``triton`` backend (kernelbench/backends/triton_int8.py): our Triton kernels.

On CPU the kernels run only under the Triton interpreter. ``triton.jit`` picks the interpreter
from TRITON_INTERPRET when a kernel is defined, so the interpreter runs happen in ONE child
process (``tests/triton_interpreter_run.py``, started with TRITON_INTERPRET=1); this pytest
process never sets the variable, and no other test module sees it. The child returns every
stage's output, which is judged here:

* quantize: the outlier columns, the int8 values and the row absmax equal
  :func:`kernelbench.quant.quantize_activation` EXACTLY (both compute the absmax exactly, the
  correctly rounded float32 ``127 / absmax``, one float32 product, and round half to even; so
  there is no tie tolerance: a tie is a tie in both);
* int8_matmul (and the ``int8_raw`` runner): equals the exact integer product;
* the fused GEMM + epilogue (``linear``, ``Runner.run``) and the staged dequantize: within
  ``oracle_tolerance`` of ``oracle.emulate`` (tests/conftest.py) with no 16-bit intermediate
  steps, i.e. element-wise ``u * |ref|`` (final rounding to the layer's dtype: bf16 2^-8,
  fp16 2^-11, fp32 2^-24) ``+ (c + 8) * 2^-24 * (|x| @ |w|.T + |bias|)`` (float32 scales,
  dequantization, bias and the ``c``-term outlier product) ``+`` near-tie flips of the oracle's
  float64 quantization, all times ``(1 + u)``. Everything before the final cast is float32,
  exactly as in the ``custom`` backend;
* under the interpreter the staged dequantize kernel and the fused epilogue are bit-identical
  (same float32 operations in the same order; on a GPU FMA contraction may differ);
* bad input raises :class:`kernelbench.checks.InputError`.

Shape rule: any m >= 0, n >= 1, 1 <= k <= 133144 (int32 accumulator); no alignment required
(ragged tiles are masked), so the cases include m=37, k=40, n=24, and shapes spanning several
tiles in m, n and k (several K iterations, ragged last tiles). A row with an absmax of 1e-38
quantizes as with an unbounded float32 exponent range. The GPU path is not tested here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import kernelbench  # noqa: E402
from kernelbench import oracle, quant  # noqa: E402
from kernelbench.backends import all_backends  # noqa: E402
from kernelbench.backends import triton_int8 as tri  # noqa: E402
from kernelbench.backends.base import SMOOTHQUANT_VARIANT, method_config  # noqa: E402
from kernelbench.checks import InputError  # noqa: E402
from kernelbench.quant import Problem, QuantConfig  # noqa: E402

HELPER = Path(__file__).with_name("triton_interpreter_run.py")
F64 = torch.float64


#: The interpreter helper's argument names, in the order of :func:`_case`'s.
CASE_KEYS = (
    "name",
    "method",
    "x",
    "weight",
    "bias",
    "alpha",
    "outlier_cmp",
    "outlier_weights",
    "kept_rows",
)


def _case(name, method, x, w, bias=None, alpha=6.0, cmp=">", ow="fp16", kept=None):
    """One case for the interpreter helper (its argument names)."""
    if kept is None:
        kept = torch.zeros(0, dtype=torch.int64)
    return dict(zip(CASE_KEYS, (name, method, x, w, bias, alpha, cmp, ow, kept), strict=True))


def _cases(randn, outliers) -> list[dict]:
    g = torch.Generator().manual_seed(20220815)
    bf, f16 = torch.bfloat16, torch.float16
    cases = []
    # App. C-like outliers, bias, calibrated kept dims (one of them also an outlier of x)
    x, dims = outliers(g, 40, 96, n_outlier_dims=4)
    kept = torch.tensor(sorted({int(dims[0]), 5}))
    cases.append(
        _case(
            "llm_int8_bf16_40x96x48",
            "llm_int8",
            x,
            randn(g, 48, 96, dtype=bf),
            randn(g, 48, dtype=bf),
            kept=kept,
        )
    )
    cases.append(
        _case("vectorwise_bf16_16x32x16", "vectorwise", randn(g, 16, 32), randn(g, 16, 32))
    )
    # ragged shape; a column whose max |x| is exactly alpha: an outlier for >=, not for >
    x, _ = outliers(g, 37, 40, n_outlier_dims=2, dtype=f16)
    x[3, 11] = -4.0
    x[:, 11] = x[:, 11].clamp(-4.0, 4.0)
    w, b = randn(g, 24, 40, dtype=f16), randn(g, 24, dtype=f16)
    for cmp, tag in ((">=", "ge"), (">", "gt")):
        cases.append(
            _case(f"llm_int8_fp16_37x40x24_{tag}_int8w", "llm_int8", x, w, b, 4.0, cmp, "int8")
        )
    x, _ = outliers(g, 24, 64, n_outlier_dims=3, dtype=torch.float32)
    w = randn(g, 32, 64, dtype=torch.float32)
    cases.append(_case("llm_int8_fp32_24x64x32", "llm_int8", x, w, randn(g, 32, dtype=w.dtype)))
    cases.append(_case("int8_raw_20x48x16", "int8_raw", randn(g, 20, 48), randn(g, 16, 48)))
    # exact rounding ties: row absmax 254 -> 127/254 = 0.5 exactly; odd integers -> x.5
    ties = torch.arange(-127, 129, 2, dtype=torch.float32)[:64].reshape(2, 32).repeat(8, 1)
    ties[:, 0] = 254.0
    cases.append(_case("ties_bf16_16x32x16", "vectorwise", ties.to(bf), randn(g, 16, 32)))
    cases.append(_case("empty_m0", "llm_int8", randn(g, 0, 32), randn(g, 16, 32)))
    # several tiles in m, n and k: GROUP_M swizzle, K loop, ragged last tiles
    x, _ = outliers(g, 150, 300, n_outlier_dims=3)
    cases.append(_case("multi_llm_int8_bf16_150x300x200", "llm_int8", x, randn(g, 200, 300),
                       randn(g, 200, dtype=bf)))  # fmt: skip
    cases.append(_case("multi_vectorwise_fp16_257x520x130", "vectorwise",
                       randn(g, 257, 520, dtype=f16), randn(g, 130, 520, dtype=f16)))  # fmt: skip
    x, _ = outliers(g, 1, 300, n_outlier_dims=2)
    cases.append(_case("multi_llm_int8_bf16_1x300x260", "llm_int8", x, randn(g, 260, 300)))
    cases.append(_case("multi_int8_raw_130x17x33", "int8_raw", randn(g, 130, 17), randn(g, 33, 17)))
    x, _ = outliers(g, 1100, 40, n_outlier_dims=2, dtype=f16)
    cases.append(_case("multi_llm_int8_fp16_1100x40x24", "llm_int8", x,
                       randn(g, 24, 40, dtype=f16), randn(g, 24, dtype=f16)))  # fmt: skip
    # tiny row absmax: 127 / 1e-38 overflows float32. float32 input: the interpreter's own
    # bf16 -> fp32 conversion mangles bf16 subnormals (a GPU converts them exactly).
    x = randn(g, 4, 64, dtype=torch.float32)
    x[1] = x[1] * 1e-38 / x[1].abs().amax()
    cases.append(_case(TINY, "vectorwise", x, randn(g, 16, 64, dtype=torch.float32)))
    # a weight row (output column) with absmax 1e-30: every row takes the fp64 scale
    w = randn(g, 16, 32, dtype=torch.float32)
    w[3] = w[3] * 1e-30
    cases.append(_case("tiny_column_fp32_8x32x16", "vectorwise", randn(g, 8, 32, dtype=w.dtype), w))
    # SmoothQuant: the vector-wise kernels on x / s and w * s (App. C-like outlier dims)
    x, _ = outliers(g, 40, 96, n_outlier_dims=4)
    cases.append(_case("smoothquant_bf16_40x96x48", "smoothquant", x, randn(g, 48, 96, dtype=bf),
                       randn(g, 48, dtype=bf)))  # fmt: skip
    x, _ = outliers(g, 37, 40, n_outlier_dims=2, dtype=f16)
    cases.append(_case("smoothquant_fp16_37x40x24", "smoothquant", x, randn(g, 24, 40, dtype=f16)))
    x, _ = outliers(g, 150, 300, n_outlier_dims=3)
    cases.append(_case("multi_smoothquant_bf16_150x300x200", "smoothquant", x,
                       randn(g, 200, 300), randn(g, 200, dtype=bf)))  # fmt: skip
    return cases


TINY = "tiny_absmax_fp32_4x64x16"


@pytest.fixture(scope="module")
def interp(tmp_path_factory, gen_randn, gen_outliers):
    """Run every case once under the interpreter in a child process; returns (cases, results)."""
    cases = _cases(gen_randn, gen_outliers)
    d = tmp_path_factory.mktemp("triton_interp")
    torch.save(cases, d / "cases.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = str(Path(kernelbench.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(HELPER), str(d / "cases.pt"), str(d / "results.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"interpreter run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    results = torch.load(d / "results.pt")
    return {c["name"]: c for c in cases}, results


CASE_NAMES = [
    "llm_int8_bf16_40x96x48",
    "vectorwise_bf16_16x32x16",
    "llm_int8_fp16_37x40x24_ge_int8w",
    "llm_int8_fp16_37x40x24_gt_int8w",
    "llm_int8_fp32_24x64x32",
    "int8_raw_20x48x16",
    "ties_bf16_16x32x16",
    "empty_m0",
    "multi_llm_int8_bf16_150x300x200",
    "multi_vectorwise_fp16_257x520x130",
    "multi_llm_int8_bf16_1x300x260",
    "multi_int8_raw_130x17x33",
    "multi_llm_int8_fp16_1100x40x24",
    TINY,
    "tiny_column_fp32_8x32x16",
    "smoothquant_bf16_40x96x48",
    "smoothquant_fp16_37x40x24",
    "multi_smoothquant_bf16_150x300x200",
]
SMOOTHQUANT_CASES = [n for n in CASE_NAMES if "smoothquant" in n]


def _get(interp, name):
    """(case, outputs, method config, kept dims). A ``smoothquant`` case comes back as what its
    kernels compute: ``vectorwise`` on the smoothed operands ``x / s`` and ``w * s`` (its stages
    ran on those; its runner on the case's own operands must give the same)."""
    cases, results = interp
    out = results["cases"][name]
    assert "error" not in out, f"{name}: {out.get('error')}"
    c = cases[name]
    if c["method"] == "smoothquant":
        _, xs, ws = quant.smoothed_operands(c["x"], c["weight"])
        c = dict(c, method="vectorwise", x=xs, weight=ws)
    qcfg = QuantConfig(c["alpha"], c["outlier_cmp"], c["outlier_weights"])
    cfg = method_config(c["method"], qcfg)
    kept = c["kept_rows"] if c["method"] == "llm_int8" else None
    return c, out, cfg, kept


# --- interpreter: every stage against kernelbench.quant / the float64 oracle ----------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_quantize_equals_quant_exactly(interp, name):
    c, out, cfg, kept = _get(interp, name)
    pw = quant.prepare_weight(c["weight"], c["bias"], cfg, kept)
    cols = quant.decomposition_columns(c["x"], pw, cfg)
    ref = quant.quantize_activation(c["x"], cols)
    assert torch.equal(out["cols"], cols)
    assert out["q"].dtype == torch.int8
    assert torch.equal(out["q"], ref.int8), f"{int((out['q'] != ref.int8).sum())} int8 differ"
    assert torch.equal(out["absmax"], ref.absmax)
    assert torch.equal(out["outlier_values"], ref.outlier_values)
    assert out["q"].numel() == 0 or int(out["q"].abs().amax()) <= 127


def test_outlier_comparison_ge_vs_gt(interp):
    """A column whose max |x| equals alpha exactly is an outlier for '>=' only."""
    _, ge, _, _ = _get(interp, "llm_int8_fp16_37x40x24_ge_int8w")
    _, gt, _, _ = _get(interp, "llm_int8_fp16_37x40x24_gt_int8w")
    assert 11 in ge["cols"].tolist()
    assert 11 not in gt["cols"].tolist()


def test_rounding_ties_go_to_even(interp):
    c, out, _, _ = _get(interp, "ties_bf16_16x32x16")
    v = c["x"].float()[:, 1:] * 0.5  # exact x.5 values
    assert bool((v - v.floor() == 0.5).all())
    assert torch.equal(out["q"][:, 1:], torch.round(v).to(torch.int8))  # half to even
    assert bool((out["q"][:, 1:] % 2 == 0).all())


@pytest.mark.parametrize("name", CASE_NAMES)
def test_int8_product_is_exact(interp, name):
    c, out, cfg, kept = _get(interp, name)
    pw = quant.prepare_weight(c["weight"], c["bias"], cfg, kept)
    assert out["acc"].dtype == torch.int32
    assert torch.equal(out["acc"].to(torch.int64), oracle.int_product(out["q"], pw.int8))


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if "int8_raw" not in n])
@pytest.mark.parametrize("what", ["linear", "runner", "staged"])
def test_output_matches_oracle(interp, check_oracle, name, what):
    c, out, cfg, _ = _get(interp, name)
    y = out[what]
    assert y.dtype == c["weight"].dtype
    check_oracle(
        y, c["method"], c["x"], c["weight"], c["bias"], cfg, c["kept_rows"], what=f"{name} {what}"
    )


@pytest.mark.parametrize("name", SMOOTHQUANT_CASES)
def test_smoothquant_runner_is_the_fused_kernel_on_smoothed_operands(interp, check_oracle, name):
    """The SmoothQuant runner (``x / s`` in the call, ``w * s`` prepared offline) gives the fused
    vector-wise kernel's output on the smoothed operands bit for bit, and meets the contract's
    SmoothQuant check on the case's own operands."""
    cases, results = interp
    c, out = cases[name], results["cases"][name]
    assert "error" not in out, f"{name}: {out.get('error')}"
    assert out["variant"] == SMOOTHQUANT_VARIANT
    assert torch.equal(out["runner"], out["linear"])
    cfg = QuantConfig(c["alpha"], c["outlier_cmp"], c["outlier_weights"]).without_decomposition()
    check_oracle(out["runner"], "smoothquant", c["x"], c["weight"], c["bias"], cfg, what=name)


def test_tiny_absmax_row_quantizes_like_an_unbounded_exponent(interp):
    """Row 1 has absmax 1e-38: 127/absmax overflows float32. The kernel scales the row by 2^64
    (exact), so its codes are float32's with an unbounded exponent range: those of the scaled
    row, and within one near-tie step of the float64 oracle's; never +-127 everywhere."""
    c, out, _, _ = _get(interp, TINY)
    x = c["x"]
    cols = torch.zeros(0, dtype=torch.int64)
    scaled = quant.quantize_activation(x.float() * 2.0**64, cols)
    assert torch.equal(out["q"][1], scaled.int8[1])
    assert torch.equal(out["q"][[0, 2, 3]], quant.quantize_activation(x, cols).int8[[0, 2, 3]])
    assert float(out["absmax"][1]) == float(x[1].float().abs().amax())
    ref64 = quant.quantize_activation(x, cols, torch.float64).int8
    assert int((out["q"].int() - ref64.int()).abs().max()) <= 1
    assert int((out["q"][1].abs() == 127).sum()) < 8


def test_int8_raw_runner_is_exact(interp, tolerance):
    """Exact against the float32 quantization of kernelbench.quant; against the float64 oracle
    within its documented near-tie allowance (127 per flipped int8 element)."""
    c, out, cfg, _ = _get(interp, "int8_raw_20x48x16")
    pw = quant.prepare_weight(c["weight"], None, cfg)
    qa = quant.quantize_activation(c["x"], torch.zeros(0, dtype=torch.int64))
    assert out["runner"].dtype == torch.int32
    assert torch.equal(out["runner"].to(torch.int64), oracle.int_product(qa.int8, pw.int8))
    ref = oracle.emulate(Problem("int8_raw", c["x"], c["weight"], None, cfg))
    err = (out["runner"].to(F64) - ref.to(F64)).abs()
    assert bool((err <= tolerance("int8_raw", c["x"], c["weight"], None, cfg)).all())


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if "int8_raw" not in n])
def test_staged_dequantize_equals_fused_epilogue(interp, name):
    _, out, _, _ = _get(interp, name)
    assert torch.equal(out["staged"], out["linear"])


def test_empty_m(interp):
    c, out, _, _ = _get(interp, "empty_m0")
    assert out["q"].shape == (0, 32) and out["linear"].shape == (0, 16)


BAD = [
    "x wrong k",
    "x 1-D",
    "x int",
    "x not contiguous",
    "k too large",
    "a float",
    "a wrong k",
    "a not contiguous",
    "acc float",
    "acc wrong n",
    "outlier not a pair",
    "runner NaN x",
]


@pytest.mark.parametrize("what", BAD)
def test_bad_input_raises_input_error(interp, what):
    got = interp[1]["bad"][what]
    assert got.startswith("InputError: "), f"{what}: {got}"


# --- this process: no interpreter, no kernels run ------------------------------------------


def test_registered_and_cpu_reason():
    backend = all_backends()["triton"]
    assert backend is tri.BACKEND
    avail = backend.availability(torch.device("cpu"))
    assert not avail
    assert avail.reason == (
        "triton kernels are timed only on CUDA; on CPU they run under the interpreter in tests only"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_unavailable_reason():
    avail = tri.BACKEND.availability(torch.device("cuda"))
    assert not avail and "CUDA" in avail.reason


def test_shape_rule():
    assert tri.MAX_K == 133144 and tri.MAX_K * 127 * 127 < 2**31 <= (tri.MAX_K + 1) * 127 * 127
    assert tri.shape_rule(0, 1, 1) == ""
    assert tri.shape_rule(37, 40, 24) == ""
    assert "k must be" in tri.shape_rule(1, tri.MAX_K + 1, 16)
    assert "k must be" in tri.shape_rule(1, 0, 16)
    assert "n must be" in tri.shape_rule(1, 16, 0)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 set for this process"
)
def test_cpu_tensors_without_interpreter_raise_input_error():
    assert not tri.interpreting()  # the child's TRITON_INTERPRET did not leak into this process
    cfg = QuantConfig()
    w = torch.randn(16, 32, dtype=torch.bfloat16)
    pw = tri.BACKEND.prepare_weight(w, None, cfg)
    with pytest.raises(InputError, match="TRITON_INTERPRET"):
        tri.BACKEND.quantize(torch.randn(16, 32, dtype=torch.bfloat16), pw, cfg)
    with pytest.raises(InputError, match="TRITON_INTERPRET"):
        tri.BACKEND.int8_matmul(torch.zeros(16, 32, dtype=torch.int8), pw)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 set for this process"
)
def test_fused_gemm_compiles_for_sm90_without_a_gpu():
    """Ahead-of-time compile (no device needed) of the fused bf16 GEMM for sm_90, with the
    options the backend launches it with (no fp fusion): it must lower to int8 wgmma.
    Compiling is all this checks; running on a GPU is unverified."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "*i8" for n in ("a_ptr", "b_ptr")}
    sig.update(out_ptr="*bf16", row_ptr="*fp32", col_ptr="*fp32", bias_ptr="*bf16")
    sig.update(xo_ptr="*fp32", wo_ptr="*fp32", dq="fp32")
    sig.update({n: "i32" for n in ("M", "N", "K", "C", "stride_am", "stride_bn", "stride_om")})
    consts = dict(EPILOGUE=True, HAS_BIAS=True, HAS_OUTLIER=True, ALL_WIDE=False, OUT_BF16=True)
    consts.update(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)
    sig.update({n: "constexpr" for n in consts})
    order = tri._kernels()["gemm"].arg_names
    src = ASTSource(fn=tri._kernels()["gemm"], signature={n: sig[n] for n in order},
                    constexprs=consts)  # fmt: skip
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=tri.NO_FMA)
    except FileNotFoundError as exc:  # a triton wheel without its bundled ptxas
        pytest.skip(f"no ptxas: {exc}")
    assert "wgmma.mma_async.sync.aligned" in compiled.asm["ptx"]
    assert ".s32.s8.s8" in compiled.asm["ptx"]
