"""The backend contract: every backend that declares the reference math, on every device it
runs on, every method it supports, against the float64 oracle (tolerance derived in
``conftest.py`` from what the backend declares); shapes with tails, -128, outliers, alpha
semantics. Plus the bit-exact relations between the CPU backends and kernel sets."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from kernelbench import oracle
from kernelbench.backends import all_backends, get_backend
from kernelbench.cli import app
from kernelbench.core import METHODS, STAGES
from kernelbench.kernels import cpu_ext
from kernelbench.quant import Problem, QuantConfig

BF16 = torch.bfloat16
CFGS = [
    pytest.param(QuantConfig(), id="a6-gt-fp16"),
    pytest.param(QuantConfig(6.0, ">=", "int8"), id="a6-ge-int8"),
    pytest.param(QuantConfig(1.5, ">", "fp16"), id="a1.5-gt-fp16"),
]


def need_custom():
    b = get_backend("custom")
    avail = b.availability(torch.device("cpu"))
    if not avail:
        pytest.skip(avail.reason)
    return b


@pytest.fixture
def backend(own_backend):
    """Here: the backends that declare kernelbench.quant's math; peers are covered by
    tests/test_inputs.py and their own tests."""
    return own_backend


def exact_int8(backend, methods_of, device):
    if "int8_raw" not in methods_of(backend, device=device):
        pytest.skip(f"{backend.name} has no int8_raw on {device}")
    if not backend.numerics.exact_int8:
        pytest.skip(f"{backend.name} does not declare an exact int8 product")


@pytest.fixture
def isa_restored():
    if not cpu_ext.available():
        pytest.skip(cpu_ext.IMPORT_ERROR)
    before = cpu_ext.isa()
    yield
    cpu_ext.set_isa(before)


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_every_method_matches_oracle(
    backend, methods_of, check_oracle, make_outliers, make_randn, device, cfg, dtype
):
    x, dims = make_outliers(24, 72, n_outlier_dims=3, dtype=dtype)
    x[5] *= 0.01  # a small-magnitude token
    w = make_randn(40, 72, dtype=dtype, scale=0.1)
    bias = make_randn(40, dtype=dtype)
    methods = methods_of(backend, dtype, 24, 72, 40, device=device)
    assert methods, f"{backend.name} supports no method on {device}"
    for method in methods:
        for kept in (None, dims) if method == "llm_int8" else (None,):
            r = backend.runner(method, x, w, bias, cfg, kept_rows=kept)
            y = r.run()
            assert r.returns_int32 == (method == "int8_raw")
            if method == "int8_raw":
                assert y.dtype == torch.int32
            elif method == "fp32":
                assert y.dtype == torch.float32
            elif method != "fp16":
                assert y.dtype == dtype, method
            check_oracle(
                y,
                method,
                x,
                w,
                bias,
                cfg,
                kept,
                what=f"{backend.name}/{method} on {device}",
                backend=backend,
            )


#: int8 GEMM shapes: tails of every tile, k = 4096 and beyond, k and n that the CUDA GEMMs pad
#: to multiples of 16.
GEMM_SHAPES = [(33, 65, 19), (1, 16, 16), (17, 64, 32), (128, 4096, 64), (8, 20, 33), (3, 5140, 17)]


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
def test_int8_matmul_is_the_exact_integer_product(
    backend, methods_of, make_outliers, make_randn, device, m, k, n
):
    """Stage by stage: the GEMM on the backend's own operands, bit for bit."""
    exact_int8(backend, methods_of, device)
    x, _ = make_outliers(m, k)
    w = make_randn(n, k)
    cfg = QuantConfig().without_decomposition()
    pw = backend.prepare_weight(w, None, cfg)
    qa = backend.quantize(x, pw, cfg)
    acc = backend.int8_matmul(qa.int8, pw)
    w8 = pw.int8_columns(torch.arange(k, device=device))
    assert acc.dtype == torch.int32
    assert acc.shape == (m, n)
    assert torch.equal(acc.to(torch.int64).cpu(), oracle.int_product(qa.int8.cpu(), w8.cpu()))


def test_int8_matmul_extremes_are_exact(backend, methods_of, device):
    """Every product at +-127^2, -128 in the activations (which the GEMM must take exactly;
    weights at -128: tests/test_cpu_kernels.py and the kernel-set test), and the largest sum of
    a k = 4096 row: 127^2 * 4096."""
    exact_int8(backend, methods_of, device)
    cfg = QuantConfig()
    a = torch.full((5, 65), -127, dtype=torch.int8, device=device)
    a[0] = -128
    a[1, ::2] = 127
    signs = torch.ones(3, 65, dtype=BF16, device=device)
    signs[2] = -1
    pb = backend.prepare_weight(signs, None, cfg)
    b = pb.int8_columns(torch.arange(65, device=device))
    assert set(b.unique().tolist()) == {-127, 127}
    got = backend.int8_matmul(a, pb)
    assert torch.equal(got.to(torch.int64).cpu(), oracle.int_product(a.cpu(), b.cpu()))
    k = 4096
    a = torch.full((32, k), -127, dtype=torch.int8, device=device)
    pb = backend.prepare_weight(-torch.ones(16, k, dtype=BF16, device=device), None, cfg)
    got = backend.int8_matmul(a, pb)
    assert got.dtype == torch.int32
    assert bool((got == 127 * 127 * k).all())


def test_int8_raw_runner_equals_oracle_on_tie_free_inputs(backend, methods_of, gen, device):
    """Inputs on the quantization grid (no ties): the runner's int8_raw is oracle.emulate's
    exact int64 product, bit for bit."""
    exact_int8(backend, methods_of, device)
    qx = torch.randint(-127, 128, (21, 37), generator=gen)
    qx[:, 0] = 127
    qw = torch.randint(-127, 128, (11, 37), generator=gen)
    qw[:, 3] = -127
    x, w = (qx * 0.125).to(BF16).to(device), (qw * 2.0**-6).to(BF16).to(device)
    y = backend.runner("int8_raw", x, w, None, QuantConfig()).run()
    ref = oracle.emulate(Problem("int8_raw", x, w, None, QuantConfig()))
    assert torch.equal(y.to(torch.int64).cpu(), ref)
    assert torch.equal(ref, qx @ qw.T)


@pytest.mark.parametrize("m,k", [(29, 67), (1, 8), (40, 4104)])
@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_stages_quantize_like_the_reference(
    backend, methods_of, make_outliers, make_randn, device, m, k, cfg, dtype
):
    """The weight preparation, the outlier columns (a column at exactly alpha included), the
    activation quantization and the int8 product are the ``torch`` backend's (kernelbench.quant's
    math) on the same device, bit for bit, with and without kept 16-bit weight rows."""
    if backend.name == "torch":
        pytest.skip("torch is the reference")
    if "llm_int8" not in methods_of(backend, dtype, m, k, 23, device=device):
        pytest.skip(f"{backend.name} runs no llm_int8 in {dtype} on {device}")
    ref = get_backend("torch")
    x, dims = make_outliers(m, k, dtype=dtype)
    free = [j for j in range(k) if j not in set(dims.tolist())]
    if free:  # a column whose largest magnitude is exactly alpha: an outlier under '>=' only
        x[:, free[0]] = x[:, free[0]].clamp(-cfg.alpha / 2, cfg.alpha / 2)
        x[0, free[0]] = cfg.alpha
    w = make_randn(23, k, dtype=dtype)
    cols = torch.arange(k, device=device)
    for kept in (None, dims):
        pb, pr = backend.prepare_weight(w, None, cfg, kept), ref.prepare_weight(w, None, cfg, kept)
        assert torch.equal(pb.absmax, pr.absmax)
        assert torch.equal(pb.int8_columns(cols), pr.int8_columns(cols))
        assert torch.equal(pb.kept_rows, pr.kept_rows)
        qb, qr = backend.quantize(x, pb, cfg), ref.quantize(x, pr, cfg)
        assert torch.equal(qb.outlier_cols, qr.outlier_cols)
        assert torch.equal(qb.int8, qr.int8)
        assert torch.equal(qb.absmax, qr.absmax)
        assert torch.equal(qb.outlier_values, qr.outlier_values)
        assert torch.equal(backend.int8_matmul(qb.int8, pb), ref.int8_matmul(qr.int8, pr))


KERNEL_SETS = ("scalar", "avx2", "avx512vnni")


def use_kernel_set(isa: str) -> None:
    try:
        cpu_ext.set_isa(isa)
    except Exception as exc:  # noqa: BLE001 - the CPU lacks the instructions
        pytest.skip(f"kernel set {isa!r} unavailable on this CPU: {exc}")
    assert cpu_ext.isa() == isa


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 5), (33, 129, 47), (64, 256, 48)])
@pytest.mark.parametrize("isa", [s for s in KERNEL_SETS if s != "scalar"])
def test_custom_kernel_sets_agree_with_scalar_exactly(
    isa_restored, make_outliers, make_randn, shape, isa
):
    custom = need_custom()
    m, k, n = shape
    x, _ = make_outliers(m, k, n_outlier_dims=min(3, k))
    w = make_randn(n, k)
    bias = make_randn(n)
    cfg = QuantConfig()
    out = {}
    for kernels in ("scalar", isa):
        use_kernel_set(kernels)
        pw = custom.prepare_weight(w, bias, cfg)
        qa = custom.quantize(x, pw, cfg)
        acc = custom.int8_matmul(qa.int8, pw)
        y = custom.dequantize(acc, qa, pw, custom.outlier_product(qa, pw))
        out[kernels] = (qa.int8, qa.absmax, qa.outlier_cols, acc, y, pw.packed)
    for a, b in zip(out["scalar"], out[isa], strict=True):
        assert torch.equal(a, b)


# Edges of the GEMMs' blocking: m around the 6- and 12-row tiles, k around the pair/quad tails
# and the 512 / 2048 k blocks, n around the 16-column panels and the 2-panel tiles.
GEMM_EDGE_SHAPES = [
    (1, 1, 1),
    (11, 2, 17),
    (12, 5, 16),
    (13, 7, 33),
    (25, 513, 48),
    (6, 2047, 15),
    (7, 2050, 130),
    (3, 4099, 31),
]


@pytest.mark.parametrize("shape", GEMM_EDGE_SHAPES)
@pytest.mark.parametrize("isa", KERNEL_SETS)
def test_gemm_is_the_exact_integer_product_on_every_kernel_set(isa_restored, gen, shape, isa):
    use_kernel_set(isa)
    m, k, n = shape
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    a[0] = -128  # the extremes: (-128)^2 and -128 * 127 products summed over all of k
    b[-1] = -128
    b[0] = 127
    got = cpu_ext.int8_matmul_unpacked(a, b)
    assert torch.equal(got.to(torch.int64), oracle.int_product(a, b)), f"{isa} {shape}"


@pytest.mark.parametrize("method", ["vectorwise", "llm_int8"])
def test_zero_token_gives_bias(backend, methods_of, make_randn, device, method):
    if method not in methods_of(backend, device=device):
        pytest.skip(f"{backend.name} does not run {method}")
    x = make_randn(4, 16)
    x[2] = 0
    w = make_randn(8, 16)
    bias = make_randn(8)
    y = backend.runner(method, x, w, bias, QuantConfig()).run()
    assert torch.isfinite(y).all()
    assert torch.equal(y[2], bias)


def test_weight_bytes_below_16_bit(backend, methods_of, make_outliers, make_randn, device):
    m, k, n = 16, 256, 128
    x, dims = make_outliers(m, k)
    w = make_randn(n, k)
    bias = make_randn(n)
    sixteen = n * k * 2
    for method in methods_of(backend, BF16, m, k, n, device=device):
        if method in ("fp32", "fp16"):
            continue
        r = backend.runner(method, x, w, bias, QuantConfig(), kept_rows=dims)
        assert 0 < r.weight_bytes < sixteen, (method, r.weight_bytes, sixteen)
        # one byte per weight plus O(n): scales, an fp32 bias, int32 column sums (and the kept
        # rows, in 16-bit and at most once more in fp32)
        assert r.weight_bytes <= n * k + n * 12 + n * len(dims) * (2 + 4) + 128, method
    if "fp16" in backend.methods:
        assert backend.runner("fp16", x, w, bias, QuantConfig()).weight_bytes == (n * k + n) * 2


def test_runner_stages_reproduce_run(backend, methods_of, make_outliers, make_randn, device):
    if "llm_int8" not in methods_of(backend, device=device):
        pytest.skip(f"{backend.name} has no llm_int8")
    x, dims = make_outliers(12, 40)
    w = make_randn(10, 40)
    r = backend.runner("llm_int8", x, w, None, QuantConfig())
    assert r.outlier_cols == len(dims)
    assert set(r.stages) == set(STAGES)
    for name, stage in r.stages.items():
        assert stage() is not None, name
    assert torch.equal(r.run(), r.run())


@pytest.mark.parametrize("cmp", [">", ">="])
def test_alpha_semantics(backend, methods_of, make_randn, device, check_oracle, cmp):
    """A column whose largest magnitude is exactly alpha is an outlier under '>=' only; alpha 0
    turns the decomposition off (llm_int8 is then vectorwise)."""
    if "llm_int8" not in methods_of(backend, device=device):
        pytest.skip(f"{backend.name} has no llm_int8")
    x, w, bias = make_randn(6, 24, scale=0.5), make_randn(10, 24), make_randn(10)
    x[:, 3] = 4.0  # exactly alpha
    x[1, 7] = -9.0  # beyond alpha either way
    cfg = QuantConfig(4.0, cmp)
    r = backend.runner("llm_int8", x, w, bias, cfg)
    assert r.outlier_cols == (2 if cmp == ">=" else 1)
    check_oracle(r.run(), "llm_int8", x, w, bias, cfg, what=f"alpha {cmp}", backend=backend)
    off = QuantConfig(0.0, cmp)
    r_off = backend.runner("llm_int8", x, w, bias, off)
    assert r_off.outlier_cols == 0
    assert torch.equal(r_off.run(), backend.runner("vectorwise", x, w, bias, cfg).run())


INT8_METHODS = ("int8_raw", "vectorwise", "llm_int8")


@pytest.mark.parametrize(
    "m,k,n",
    [(1, 64, 32), (7, 100, 37), (257, 1024, 128), (8, 20, 33), (3, 5140, 17), (5, 37, 5140)],
)
def test_gemm_sizes_match_oracle(
    backend, methods_of, check_oracle, make_outliers, make_randn, device, m, k, n
):
    """Every method in fp16 on sizes from one token to n = 5140 (GPT-3 13B's d), with k and n
    that the CUDA GEMMs pad, within the oracle tolerance."""
    methods = methods_of(backend, torch.float16, m, k, n, device=device)
    if not methods:
        pytest.skip(f"{backend.name} runs nothing in fp16 at {m}x{k}x{n} on {device}")
    x, dims = make_outliers(m, k, n_outlier_dims=min(4, k), dtype=torch.float16)
    w = make_randn(n, k, dtype=torch.float16, scale=k**-0.5)
    bias = make_randn(n, dtype=torch.float16)
    cfg = QuantConfig(6.0, ">=")
    for method in methods:
        kept = dims if method == "llm_int8" else None
        y = backend.runner(method, x, w, bias, cfg, kept_rows=kept).run()
        what = f"{backend.name}/{method} {m}x{k}x{n} on {device}"
        check_oracle(y, method, x, w, bias, cfg, kept, what=what, backend=backend)


def test_tiny_absmax_row_matches_oracle(backend, methods_of, check_oracle, make_randn, device):
    """A token with absmax 1e-38 (127 / absmax overflows float32): the other tokens within the
    oracle tolerance, that one within 2% (its outputs are subnormal in 16 bits)."""
    methods = [m for m in methods_of(backend, device=device) if m in ("vectorwise", "llm_int8")]
    if not methods:
        pytest.skip(f"{backend.name} has no vectorwise or llm_int8 on {device}")
    x = make_randn(4, 64, dtype=torch.float32)
    x[1] = x[1] * 1e-38 / x[1].abs().amax()
    x = x.to(BF16)
    w, cfg = make_randn(32, 64, scale=0.125), QuantConfig()
    normal = torch.tensor([0, 2, 3], device=device)
    for method in methods:
        y = backend.runner(method, x, w, None, cfg).run()
        ref = oracle.emulate(Problem(method, x, w, None, cfg))
        assert oracle.rel_frobenius(y[1], ref[1]) < 2e-2, method
        what = f"{backend.name}/{method} normal rows"
        check_oracle(y[normal], method, x[normal], w, None, cfg, what=what, backend=backend)


def test_misaligned_activation_gives_the_same_result(backend, methods_of, make_randn, device):
    """An activation one element off any vector alignment (a view into a larger buffer) gives
    what its aligned copy gives, bit for bit (the kernels' unaligned paths)."""
    methods = [m for m in methods_of(backend, device=device) if m in INT8_METHODS]
    if not methods:
        pytest.skip(f"{backend.name} runs no int8 method on {device}")
    x = make_randn(1 + 32 * 64)[1:].view(32, 64)
    x[:, 9] *= 40  # an outlier column
    w = make_randn(16, 64)
    for method in methods:
        y = backend.runner(method, x, w, None, QuantConfig()).run()
        assert torch.equal(y, backend.runner(method, x.clone(), w, None, QuantConfig()).run())


def test_registry_lists_torch_and_custom():
    names = list(all_backends())
    assert names[:2] == ["torch", "custom"]
    assert set(get_backend("torch").methods) == {*METHODS, "smoothquant", "fp8_e4m3"}
    assert {"int8_raw", "vectorwise", "llm_int8"} <= set(get_backend("custom").methods)
    with pytest.raises(KeyError, match="unknown backend"):
        get_backend("nope")
    avail = get_backend("torch").supports("nope", torch.device("cpu"), BF16, 1, 1, 1)
    assert not avail and "unknown method" in avail.reason


def test_cli_list_runs():
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    assert "torch" in result.output and "custom" in result.output
    assert "CPU kernel set" in result.output


@pytest.mark.slow
def test_custom_llm_int8_d4096_matches_oracle(make_outliers, make_randn, check_oracle):
    """The must-show check: ``custom`` ``llm_int8`` at d = 4096, 2048 tokens, with App. C
    outlier columns, is within the documented tolerance of the float64 oracle (whose integer
    product is an exact float64 GEMM). n is cut to 1024 output columns to keep the suite fast:
    the tolerance is per element, and every column sees the same k = 4096 reduction."""
    custom = need_custom()
    m, k, n = 2048, 4096, 1024
    x, dims = make_outliers(m, k, n_outlier_dims=7, share=0.25)
    w = make_randn(n, k, scale=0.02)
    bias = make_randn(n, scale=0.1)
    cfg = QuantConfig()
    r = custom.runner("llm_int8", x, w, bias, cfg)
    assert r.outlier_cols == len(dims)
    y = r.run()
    check_oracle(y, "llm_int8", x, w, bias, cfg, what="custom/llm_int8 d=4096")
    ref = oracle.exact(x, w, bias)
    assert oracle.rel_frobenius(y, ref) < 0.02


def test_accuracy_variants_are_known_methods_each_backend_skips_with_its_reason():
    """``--methods smoothquant`` is no unknown name: every backend without a kernel for a
    variant says so (or why it cannot run at all here), and the sweep plans the pair."""
    from kernelbench.core import ACCURACY_VARIANTS
    from kernelbench.run.plan import RunOptions, method_pairs

    cpu = torch.device("cpu")
    for name, backend in all_backends().items():
        for method in ACCURACY_VARIANTS:
            avail = backend.supports(method, cpu, BF16, 8, 64, 32)
            if method in backend.methods and backend.availability(cpu):
                assert avail, (name, method, avail.reason)
                continue
            assert not avail, (name, method)
            assert "unknown method" not in avail.reason
            if backend.availability(cpu):
                assert f"does not implement {method!r}" in avail.reason
    assert "smoothquant" in get_backend("custom").methods
    assert "smoothquant" in get_backend("torch").methods
    pairs = method_pairs(RunOptions(backends=("torch", "custom"), methods=("smoothquant",)))
    assert ("custom", "smoothquant") in pairs and ("torch", "smoothquant") in pairs


def _outlier_layer(seed: int = 5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 256, generator=gen)
    x[:, [3, 77, 200]] = -torch.rand(48, 3, generator=gen) * 20 - 40  # App. C-like dims
    w = torch.randn(96, 256, generator=gen) / 16
    b = torch.randn(96, generator=gen) * 0.1
    return x.to(BF16), w.to(BF16), b.to(BF16)


@pytest.mark.parametrize("name", ["custom", "torch"])
def test_smoothquant_is_the_vectorwise_kernel_on_smoothed_operands(name):
    """The timed SmoothQuant row: bit for bit the backend's vector-wise kernel on ``x / s`` and
    ``w * s``, with less error than plain vector-wise where outliers are planted."""
    from kernelbench import quant

    backend = get_backend(name)
    x, w, b = _outlier_layer()
    cfg = QuantConfig()
    got = backend.runner("smoothquant", x, w, b, cfg).run()
    _, xs, ws = quant.smoothed_operands(x, w)
    want = backend.runner("vectorwise", xs, ws, b, cfg).run()
    assert got.dtype == BF16 and torch.equal(got, want)
    exact = oracle.exact(x, w, b)
    plain = backend.runner("vectorwise", x, w, b, cfg).run()
    assert oracle.rel_frobenius(got, exact) < 0.5 * oracle.rel_frobenius(plain, exact)


def test_smoothed_operands_keep_the_float_product():
    """``x / s`` times ``(w * s).T`` is the layer's product up to the 16-bit rounding of the
    two smoothed operands."""
    from kernelbench import quant

    x, w, _ = _outlier_layer(7)
    s, xs, ws = quant.smoothed_operands(x, w)
    assert s.dtype == xs.dtype == ws.dtype == BF16
    before = x.double() @ w.double().T
    after = xs.double() @ ws.double().T
    mag = x.double().abs() @ w.double().abs().T
    assert ((after - before).abs() <= 2 * 2.0**-8 * mag).all()
    assert not torch.equal(xs, x)  # the outlier dims were divided down
    assert xs.float().abs().amax() < x.float().abs().amax() / 2


def test_contract_holds_smoothquant_to_the_smoothed_vectorwise_oracle():
    """The contract's check of a SmoothQuant output can fail: plain vector-wise is rejected."""
    from kernelbench.backends.contract import ContractFailure, assert_matches_oracle

    backend = get_backend("custom")
    x, w, b = _outlier_layer(11)
    cfg = QuantConfig()
    problem = Problem("smoothquant", x, w, b, cfg)
    assert_matches_oracle(backend.build(problem).run(), problem, what="smoothquant")
    plain = backend.runner("vectorwise", x, w, b, cfg).run()
    with pytest.raises(ContractFailure, match="outside the oracle tolerance"):
        assert_matches_oracle(plain, problem, what="smoothquant")


# --- fp8 e4m3 on the torch backend (torch._scaled_mm) ---------------------------------------


def _fp8_layer(gen, m, k, n, dtype=BF16):
    from kernelbench.backends.contract import outlier_activations, randn

    x, _ = outlier_activations(gen, m, k, n_outlier_dims=min(3, k), dtype=dtype)
    return x, randn(gen, n, k, dtype=dtype, scale=0.1), randn(gen, n, dtype=dtype)


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 5), (33, 129, 47), (64, 4096, 96)])
def test_torch_fp8_matches_the_float64_oracle(check_oracle, dtype, m, k, n):
    """``torch._scaled_mm`` on e4m3 codes of quant.quantize_fp8_rowwise (weights offline,
    activations in the call), out in the layer dtype: within the fp8 tolerance of the oracle
    (contract.oracle_tolerance), and within fp8's own error of the exact layer."""
    from kernelbench.backends.torch_ops import fp8_cpu_reason

    if fp8_cpu_reason():
        pytest.skip(fp8_cpu_reason())
    gen = torch.Generator().manual_seed(m + 3 * k + 7 * n)
    x, w, b = _fp8_layer(gen, m, k, n, dtype)
    r = get_backend("torch").runner("fp8_e4m3", x, w, b, QuantConfig())
    y = r.run()
    assert y.dtype == dtype and y.shape == (m, n) and not r.returns_int32
    assert set(r.stages) == {"quantize"}
    assert r.weight_bytes == n * k + 4 * n + n * b.element_size()
    check_oracle(y, "fp8_e4m3", x, w, b, QuantConfig(), what=f"torch fp8 {m}x{k}x{n}")
    # e4m3 keeps 3 mantissa bits: a few percent of the layer at most
    assert oracle.rel_frobenius(y, oracle.exact(x, w, b)) < 0.1


def _broken_fp8(kind: str, x, w, b):
    """fp8 kernels that scale wrongly, each a plausible bug: the weight as the torch backend
    prepares it, the activations scaled ``kind``'s way, the same ``torch._scaled_mm``."""
    from kernelbench import quant
    from kernelbench.backends.torch_ops import fp8_weight, scaled_mm_fp8

    wq, w_scale = fp8_weight(w)
    xq, x_amax = quant.quantize_fp8_rowwise(x)
    x_scale = quant.fp8_scale(x_amax)[:, None]
    m = x.shape[0]
    if kind == "no activation scaling":  # x cast to e4m3 as it is
        xq, x_scale = x.float().clamp(-448, 448).to(torch.float8_e4m3fn), torch.ones(m, 1)
    elif kind == "reciprocal scales":  # 448 / amax where amax / 448 belongs
        x_scale, w_scale = 1 / x_scale, 1 / w_scale
    elif kind == "scales swapped":  # each operand's scales on the other (m == n here)
        x_scale, w_scale = w_scale.reshape(m, 1).clone(), x_scale.reshape(1, m).clone()
    elif kind == "per-tensor activation scale":
        amax = x.float().abs().amax()
        xq = (x.float() * (quant.FP8_E4M3_MAX / amax)).to(torch.float8_e4m3fn)
        x_scale = quant.fp8_scale(amax).expand(m, 1).contiguous()
    return scaled_mm_fp8(xq, x_scale, wq, w_scale, b, x.dtype)


@pytest.mark.parametrize(
    "kind",
    ["no activation scaling", "reciprocal scales", "scales swapped", "per-tensor activation scale"],
)
def test_fp8_tolerance_catches_a_wrong_kernel(kind):
    """The fp8 tolerance is derived from e4m3's precision (near ties of its grid, float32
    arithmetic), not from its error: a kernel that scales wrongly is rejected, the right one on
    the same inputs passes."""
    from kernelbench.backends.contract import ContractFailure, assert_matches_oracle
    from kernelbench.backends.torch_ops import fp8_cpu_reason

    if fp8_cpu_reason():
        pytest.skip(fp8_cpu_reason())
    gen = torch.Generator().manual_seed(17)
    x, w, b = _fp8_layer(gen, 40, 72, 40)  # the contract's methods shape, with m == n
    problem = Problem("fp8_e4m3", x, w, b)
    assert_matches_oracle(get_backend("torch").build(problem).run(), problem, "fp8")
    with pytest.raises(ContractFailure, match="outside the oracle tolerance"):
        assert_matches_oracle(_broken_fp8(kind, x, w, b), problem, f"fp8 {kind}")


def test_fp8_near_ties_are_where_the_e4m3_grid_has_midpoints():
    """The tie allowance marks only elements whose scaled value lies at a midpoint of the e4m3
    grid (spacing 2^(e-3), 2^-9 below 2^-6), and moves each by one spacing times amax / 448."""
    from kernelbench.backends.contract import fp8_spacing, fp8_tie_flips

    v = torch.tensor([1.0, 1.0625, 1.07, 3.0 * 2.0**-10, 2.0**-8, 232.0, 448.0, 0.0])
    assert fp8_spacing(v).tolist() == [
        2.0**-3, 2.0**-3, 2.0**-3, 2.0**-9, 2.0**-9, 2.0**4, 2.0**5, 2.0**-9
    ]  # fmt: skip
    row = torch.cat([v, torch.tensor([-448.0])])[None, :]  # amax 448: scale 1
    flips = fp8_tie_flips(row, torch.tensor([448.0]))[0]
    # 1.0625 is halfway between 1 and 1.125; 3 * 2^-10 between two subnormals; 232 between
    # 224 and 240 (spacing 16 from 128 on)
    assert flips.tolist() == [0.0, 2.0**-3, 0.0, 2.0**-9, 0.0, 16.0, 0.0, 0.0, 0.0]
    scaled = fp8_tie_flips(row * 2, torch.tensor([896.0]))[0]  # same codes, scale 2
    assert torch.equal(scaled, 2 * flips)


def test_oracle_tolerance_is_derived_only_where_the_math_is_known():
    from kernelbench.backends.contract import oracle_tolerance

    gen = torch.Generator().manual_seed(2)
    x, w, b = _fp8_layer(gen, 4, 16, 8)
    assert oracle_tolerance(Problem("fp8_e4m3", x, w, b)).shape == (4, 8)
    with pytest.raises(ValueError, match="no tolerance is derived for 'int8_weight_only'"):
        oracle_tolerance(Problem("int8_weight_only", x, w, b))


def _as_if_on_a_gpu(monkeypatch, capability=(9, 0)):
    from kernelbench.backends.base import Availability

    backend = get_backend("torch")
    monkeypatch.setattr(backend, "availability", lambda device: Availability.yes())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    return backend


def test_torch_fp8_cuda_rules(monkeypatch):
    """CUDA's row-wise scaled ``_scaled_mm`` (written, never run here: unverified): bf16 or
    fp16 out, k and n multiples of 16, compute capability 8.9 or later; other layers are
    skipped with that reason."""
    cuda = torch.device("cuda")
    backend = _as_if_on_a_gpu(monkeypatch)
    assert backend.supports("fp8_e4m3", cuda, BF16, 2048, 4096, 16384)
    assert backend.supports("fp8_e4m3", cuda, torch.float16, 2048, 4096, 16384)
    avail = backend.supports("fp8_e4m3", cuda, torch.float32, 2048, 4096, 16384)
    assert not avail and "bf16 or fp16 output only" in avail.reason
    avail = backend.supports("fp8_e4m3", cuda, BF16, 2048, 5140, 20560)
    assert not avail and "multiples of 16" in avail.reason and "k=5140" in avail.reason
    old = _as_if_on_a_gpu(monkeypatch, capability=(8, 0))
    avail = old.supports("fp8_e4m3", cuda, BF16, 2048, 4096, 16384)
    assert not avail and ">= 8.9" in avail.reason
    assert "cuda" not in backend.verified  # unverified on a GPU, as data


def test_scaled_mm_gets_the_weight_column_major(monkeypatch):
    """The layout CUDA's ``_scaled_mm`` requires: ``a`` row-major (m, k), ``b`` a column-major
    (k, n) view of the (n, k) codes, scales (m, 1) and (1, n) float32."""
    seen = {}

    def record(a, b, **kw):
        seen.update(a=a, b=b, **kw)
        return torch.zeros(a.shape[0], b.shape[1], dtype=kw["out_dtype"])

    monkeypatch.setattr(torch, "_scaled_mm", record)
    gen = torch.Generator().manual_seed(4)
    x, w, b = _fp8_layer(gen, 6, 32, 48)
    get_backend("torch").runner("fp8_e4m3", x, w, b, QuantConfig()).run()
    assert seen["a"].shape == (6, 32) and seen["a"].stride() == (32, 1)
    assert seen["b"].shape == (32, 48) and seen["b"].stride() == (1, 32)
    assert seen["a"].dtype == seen["b"].dtype == torch.float8_e4m3fn
    assert seen["scale_a"].shape == (6, 1) and seen["scale_b"].shape == (1, 48)
    assert seen["scale_a"].dtype == seen["scale_b"].dtype == torch.float32
    assert seen["out_dtype"] == BF16 and seen["bias"] is b
