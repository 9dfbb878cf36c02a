"""The CPU kernels of ``custom`` (kernelbench._cpu) and the reference math in ``quant.py`` at the
edges of float32: absmax scales across the whole float range (tiny ones, where ``127 / absmax``
overflows float32, and huge ones), the kernel sets bit for bit on them, and the packed layout."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbench import oracle, quant
from kernelbench.backends import get_backend
from kernelbench.checks import InputError
from kernelbench.kernels import cpu_ext
from kernelbench.quant import QuantConfig

KERNEL_SETS = ("scalar", "avx2", "avx512vnni")
# bf16 and fp32 share float32's exponent range (fp16 cannot hold these scales at all)
WIDE_DTYPES = (torch.bfloat16, torch.float32)

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason=cpu_ext.IMPORT_ERROR or "no _cpu")


@pytest.fixture
def isa_restored():
    before = cpu_ext.isa()
    yield
    cpu_ext.set_isa(before)


def kernel_sets_here() -> list[str]:
    here = []
    before = cpu_ext.isa()
    for name in KERNEL_SETS:
        try:
            cpu_ext.set_isa(name)
            here.append(name)
        except RuntimeError:  # the CPU lacks the instructions
            pass
    cpu_ext.set_isa(before)
    return here


def scaled(gen, rows: int, k: int, exponents, dtype) -> torch.Tensor:
    """Gaussian rows (no zeros), row i multiplied by 10**exponents[i] in float64, then cast."""
    t = torch.randn(rows, k, generator=gen, dtype=torch.float64)
    t = torch.where(t == 0, torch.full_like(t, 0.5), t)
    scale = torch.tensor([10.0**e for e in exponents], dtype=torch.float64)[:, None]
    return (t * scale).to(dtype).contiguous()


def row_errors(y: torch.Tensor, ref: torch.Tensor) -> list[float]:
    return [oracle.rel_frobenius(y[i], ref[i]) for i in range(y.shape[0])]


# --- tiny and huge absmax: every backend we own against the float64 oracle --------------------


@st.composite
def extreme_cases(draw):
    """Weight columns around 10**cw and x rows whose scale keeps every output x_i . w_j between
    about 1e-25 and 1e25 (a normal number in the output dtype, so its rounding is relative like
    any other row's); x rows reach float32's subnormals (1e-40). Weights too, except under
    ``llm_int8``, where the outlier dims' weights are rebuilt from int8 in float32: a weight
    that is itself subnormal there has only the few digits float32 gives it."""
    method = draw(st.sampled_from(["int8_raw", "vectorwise", "llm_int8"]))
    w_lo = -37 if method == "llm_int8" else -40
    cw = draw(st.integers(w_lo, 37))  # randn x 1e37 stays below float32 max (3.4e38)
    lo, hi = max(-40, -20 - cw), min(37, 20 - cw)
    m = draw(st.sampled_from([1, 3, 13]))
    n = draw(st.sampled_from([1, 5, 17, 40]))
    return dict(
        x_exp=draw(st.lists(st.integers(lo, hi), min_size=m, max_size=m)),
        w_exp=[
            min(37, max(w_lo, cw + d))
            for d in draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
        ],
        k=draw(st.sampled_from([1, 7, 64, 69])),
        dtype=draw(st.sampled_from(WIDE_DTYPES)),
        method=method,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(c=extreme_cases())
def test_absmax_across_the_float_range_matches_oracle(c, check_oracle, isa_restored):
    g = torch.Generator().manual_seed(c["seed"])
    x = scaled(g, len(c["x_exp"]), c["k"], c["x_exp"], c["dtype"])
    w = scaled(g, len(c["w_exp"]), c["k"], c["w_exp"], c["dtype"])
    cfg = QuantConfig()
    check_oracle(
        get_backend("torch").runner(c["method"], x, w, None, cfg).run(),
        c["method"],
        x,
        w,
        None,
        cfg,
        what=f"torch {c}",
        backend="torch",
    )
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        y = get_backend("custom").runner(c["method"], x, w, None, cfg).run()
        check_oracle(y, c["method"], x, w, None, cfg, what=f"custom/{isa} {c}", backend="custom")


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("backend", ["torch", "custom"])
def test_row_with_absmax_1e_38_has_the_error_of_any_other_row(gen, dtype, backend):
    """127 / 1e-38 overflows float32: before the rescale every nonzero code of such a row was
    +-127 and its output off by several times its size."""
    x = scaled(gen, 4, 64, [0, -38, -37, -36], dtype)
    w = scaled(gen, 32, 64, [0] * 32, dtype)
    y = get_backend(backend).runner("vectorwise", x, w, None, QuantConfig()).run()
    errs = row_errors(y, oracle.exact(x, w))
    assert max(errs) < 2 * errs[0] + 0.01, errs
    assert errs[1] < 0.03, errs


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_weight_column_with_tiny_absmax(gen, dtype):
    x = scaled(gen, 5, 48, [20] * 5, dtype)
    w = scaled(gen, 6, 48, [0, -38, -39, -30, -45 + 7, 0], dtype)
    y = get_backend("custom").runner("vectorwise", x, w, None, QuantConfig()).run()
    ref = oracle.exact(x, w)
    errs = [oracle.rel_frobenius(y[:, j], ref[:, j]) for j in range(6)]
    assert max(errs) < 0.05, errs


def test_tiny_absmax_codes_are_the_unbounded_float32_codes(gen):
    """Rescaled by 2^64, a tiny row quantizes exactly as the same row times 2^64 does."""
    base = torch.randn(3, 50, generator=gen)
    tiny = base * 2.0**-100
    q_tiny, a_tiny = quant.quantize_rowwise(tiny)
    q_base, _ = quant.quantize_rowwise(tiny * 2.0**100)
    assert torch.equal(q_tiny, q_base)
    assert int(q_tiny.abs().max()) == 127 and bool((a_tiny > 0).all())
    assert int((q_tiny.abs() == 127).sum()) == 3  # one per row, not every nonzero code


# --- kernel sets bit for bit, on the fast and on the float64-scale dequantization path ---------


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("row_exp", [0, -38, 30])
def test_kernel_sets_dequantize_bit_for_bit_on_extreme_scales(
    gen, isa_restored, out_dtype, row_exp
):
    """Rows with safe scales (the float32 path) and rows with extreme ones (the float64-scale
    path) in one call; fp16 output only with scales its range can hold."""
    m, n, c = 9, 37, 3
    acc = torch.randint(-(2**24), 2**24, (m, n), dtype=torch.int32, generator=gen)
    row = torch.rand(m, generator=gen) + 0.5
    if out_dtype != torch.float16:
        row[::3] *= 10.0**row_exp
    col = torch.rand(n, generator=gen) * 0.1 + 0.01
    bias = torch.randn(n, generator=gen)
    ox = torch.randn(m, c, generator=gen)
    ow = torch.randn(c, n, generator=gen) * 0.01
    outs = {}
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        outs[isa] = cpu_ext.dequantize(acc, cpu_ext.Dequant(row, col, out_dtype, bias, ox, ow))
    for isa, out in outs.items():
        assert torch.equal(bits(out), bits(outs["scalar"])), isa
    ref = (quant.dequantize_outer(acc, row, col) + bias + ox @ ow).to(torch.float64)
    err = (outs["scalar"].to(torch.float64) - ref).abs()
    assert bool((err <= 2**-7 * ref.abs() + 1e-6 * ref.abs().max()).all())


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
def test_kernel_sets_quantize_tiny_rows_bit_for_bit(gen, isa_restored, dtype):
    x = scaled(gen, 7, 70, [-38, -40, -30, 0, -45 + 3, 30, -37], dtype)
    ref = quant.quantize_activation(x, torch.zeros(0, dtype=torch.int64))
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        q, amax, _ = cpu_ext.quantize_rows(x, None, torch.zeros(0, dtype=torch.int64))
        assert torch.equal(q, ref.int8), isa
        assert torch.equal(amax, ref.absmax), isa


@pytest.mark.parametrize("m", [1, 70])  # m * k below and above kSerialElems (2^16)
def test_kernel_sets_detect_and_quantize_like_the_reference(gen, isa_restored, make_outliers, m):
    x, dims = make_outliers(m, 1001, n_outlier_dims=5)
    cfg = QuantConfig()
    ref_cols = quant.outlier_columns(x, cfg.alpha, cfg.outlier_cmp)
    ref = quant.quantize_activation(x, ref_cols)
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        mask = cpu_ext.detect_outliers(x, cfg.alpha, False)
        cols = mask.nonzero().flatten()
        q, amax, vals = cpu_ext.quantize_rows(x, mask, cols)
        assert torch.equal(cols, ref_cols), isa
        assert torch.equal(q, ref.int8) and torch.equal(amax, ref.absmax), isa
        assert torch.equal(vals, ref.outlier_values), isa


@pytest.mark.parametrize("m", [0, 1, 70])  # m * k below and above kSerialElems (2^16)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_pass_quantization_gives_the_numbers_of_detect_then_quantize(
    gen, isa_restored, make_outliers, m, dtype
):
    """Kept dims holding every outlier (and a few regular dims): the one pass gives what
    detection and then quantization give with those columns. With an outlier dim left out it
    says so (None), rather than quantize that dim into the row scales."""
    k = 1001
    x, _ = make_outliers(max(m, 1), k, n_outlier_dims=5)
    x = x[:m].to(dtype)
    cfg = QuantConfig()
    detected = quant.outlier_columns(x, cfg.alpha, cfg.outlier_cmp)
    regular = torch.tensor([0, 500, k - 1])
    kept = cpu_ext.kept_dims(torch.cat([detected, regular]).unique(), k)
    ref = quant.quantize_activation(x, kept.cols)
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        q, amax, vals = cpu_ext.quantize_kept(x, kept, cfg.alpha, False)
        assert torch.equal(q, ref.int8) and torch.equal(amax, ref.absmax), isa
        assert torch.equal(vals, ref.outlier_values), isa
        if m:  # every drawn row has outliers beyond alpha
            assert detected.numel(), "the draw planted no outlier beyond alpha"
            fewer = cpu_ext.kept_dims(detected[1:], k)
            assert cpu_ext.quantize_kept(x, fewer, cfg.alpha, False) is None, isa


def test_one_pass_quantization_tests_alpha_as_detection_does(gen, isa_restored):
    """A value of exactly alpha outside the kept dims is an outlier under ``>=`` only."""
    x = torch.rand(3, 40, generator=gen) - 0.5
    x[1, 7] = 6.0
    kept = cpu_ext.kept_dims(torch.tensor([3]), 40)
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        q, amax, _ = cpu_ext.quantize_kept(x, kept, 6.0, ge=False)
        assert amax[1] == 6.0 and q[1, 7] == 127, isa
        assert cpu_ext.quantize_kept(x, kept, 6.0, ge=True) is None, isa


def test_one_pass_quantization_rejects_bad_input(gen):
    x = torch.randn(4, 10, generator=gen)
    kept = cpu_ext.kept_dims(torch.tensor([2]), 10)
    bad = x.clone()
    bad[1, 5] = float("nan")
    with pytest.raises(InputError, match="NaN/Inf"):
        cpu_ext.quantize_kept(bad, kept, 6.0, False)
    with pytest.raises(InputError, match=r"\(m, 10\)"):
        cpu_ext.quantize_kept(torch.randn(4, 11, generator=gen), kept, 6.0, False)
    with pytest.raises(InputError, match="int64"):
        cpu_ext.kept_dims(torch.tensor([1.0]), 10)
    with pytest.raises(InputError, match=r"\[0, 10\)"):
        cpu_ext.kept_dims(torch.tensor([10]), 10)
    assert torch.equal(cpu_ext.kept_dims(torch.tensor([5, 2, 5]), 10).cols, torch.tensor([2, 5]))


@pytest.mark.parametrize("m", [1, 33])
def test_custom_quantizes_like_the_reference_with_and_without_every_outlier_kept(
    make_outliers, make_randn, m
):
    """The backend's quantization in both of its paths: the one pass (kept dims hold every
    outlier) and detection first (an outlier dim not kept)."""
    custom = get_backend("custom")
    x, dims = make_outliers(m, 96)
    w = make_randn(50, 96)
    cfg = QuantConfig()
    for kept in (dims, dims[:1], torch.zeros(0, dtype=torch.int64)):
        pw = custom.prepare_weight(w, None, cfg, kept)
        ref = quant.quantize_activation(x, quant.decomposition_columns(x, pw, cfg))
        qa = custom.quantize(x, pw, cfg)
        assert torch.equal(qa.outlier_cols, ref.outlier_cols)
        assert torch.equal(qa.int8, ref.int8) and torch.equal(qa.absmax, ref.absmax)
        assert torch.equal(qa.outlier_values, ref.outlier_values)


# --- the packed layout -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (15, 3), (17, 64), (33, 129)])
def test_packed_columns_read_back_the_weights(gen, shape):
    n, k = shape
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    packed = cpu_ext.pack_weight(w)
    cols = torch.randperm(k, generator=gen)[: max(1, k // 2)].sort().values
    assert torch.equal(cpu_ext.packed_columns(packed, n, k, cols), w[:, cols])
    assert torch.equal(cpu_ext.packed_columns(packed, n, k, torch.arange(k)), w)
    assert packed.numel() >= n * k and packed.data_ptr() % 64 == 0


def test_a_large_packed_weight_lies_in_huge_pages_and_reads_the_same(gen):
    """A weight of a huge page or more is packed into a huge-page-aligned mapping advised for
    transparent huge pages (where the platform has them); the bytes, and every product, are
    those of the ordinary buffer, and the mapping goes with the last tensor on it."""
    import gc
    import mmap

    n, k = 2048, 1100  # just over one huge page of packed bytes
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    mapped = cpu_ext.huge_page_bytes()
    huge, small = cpu_ext.pack_weight(w), cpu_ext.pack_weight(w, huge_pages=False)
    assert huge.numel() >= cpu_ext.HUGE_PAGE_BYTES and torch.equal(huge, small)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert huge.data_ptr() % cpu_ext.HUGE_PAGE_BYTES == 0
    a = torch.randint(-128, 128, (3, k), dtype=torch.int8, generator=gen)
    assert torch.equal(cpu_ext.gemm(a, huge, n), cpu_ext.gemm(a, small, n))
    if hasattr(mmap, "MADV_HUGEPAGE"):  # counted while mapped (the heap does not see it)
        assert cpu_ext.huge_page_bytes() >= mapped + huge.numel()
    corner = w[:8, :64].contiguous()
    tiny = cpu_ext.pack_weight(corner)  # under a huge page: the ordinary buffer
    assert tiny.data_ptr() % 64 == 0 and torch.equal(tiny, cpu_ext.pack_weight(corner, False))
    try:
        with open("/proc/self/maps") as f:
            before = f.read().count("\n")
    except OSError:
        return
    for _ in range(8):
        huge = cpu_ext.pack_weight(w)
    del huge
    gc.collect()
    with open("/proc/self/maps") as f:
        assert f.read().count("\n") <= before  # no mapping outlives its tensor
    assert cpu_ext.huge_page_bytes() == mapped  # ... nor its count


def test_the_huge_page_setting_is_read_from_the_system(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setattr(cpu_ext, "THP_SETTING", str(setting))
    assert cpu_ext.huge_page_setting() == "madvise"
    monkeypatch.setattr(cpu_ext, "THP_SETTING", str(tmp_path / "missing"))
    assert cpu_ext.huge_page_setting() == ""


def test_packed_columns_reject_bad_input(gen):
    w = torch.randint(-128, 128, (20, 9), dtype=torch.int8, generator=gen)
    packed = cpu_ext.pack_weight(w)
    with pytest.raises(cpu_ext.InputError, match="another shape"):
        cpu_ext.packed_columns(packed, 20, 11, torch.arange(3))
    with pytest.raises(cpu_ext.InputError, match="indices"):
        cpu_ext.packed_columns(packed, 20, 9, torch.tensor([9]))


def test_kernel_set_is_named_and_checked(isa_restored):
    assert cpu_ext.isa() in KERNEL_SETS
    with pytest.raises(ValueError, match="isa must be"):
        cpu_ext.set_isa("sse9")


# --- the GEMM with the dequantization fused into it --------------------------------------------

# m around the 6- and 12-row tiles, k around the 512 / 2048 k blocks (partial sums kept across
# blocks), n around the 16-column panels and the 8-panel chunks; m * k on both sides of
# kSerialElems (2^16: smaller passes run on the calling thread).
FUSED_SHAPES = [
    (1, 1, 1),
    (7, 33, 17),
    (13, 513, 129),
    (25, 2050, 130),
    (3, 4099, 31),
    (4, 515, 257),
    (37, 2051, 40),
    (19, 4099, 107),  # 7 panels: a one-panel tile at the end of a chunk, on one thread or two
    (260, 16391, 40),  # past one group of rows (2 MiB of packed A: 120 rows at this k)
    (1100, 2048, 40),  # one k block, row groups of 252 rows (VNNI) or 1026 (AVX2), the last partial
    (150, 4093, 72),  # one VNNI k block of odd k (a half quad), several AVX2 ones
]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_fused_linear_equals_gemm_then_dequantize_bit_for_bit(gen, isa_restored, shape, out_dtype):
    m, k, n = shape
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    a[0] = -128
    packed = cpu_ext.pack_weight(w)
    row = torch.rand(m, generator=gen) + 0.5
    if out_dtype != torch.float16:
        row[-1] = 1e-38  # a row on the float64-scale path
    col = (torch.rand(n, generator=gen) + 0.5) * 1e-3 / max(1, k) ** 0.5
    bias = torch.randn(n, generator=gen)
    ox, ow = torch.randn(m, 2, generator=gen), torch.randn(2, n, generator=gen) * 0.01
    outs = []
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        for operands in ((bias, ox, ow), (None, None, None)):
            dq = cpu_ext.Dequant(row, col, out_dtype, *operands)
            staged = cpu_ext.dequantize(cpu_ext.gemm(a, packed, n), dq)
            fused = cpu_ext.linear(a, packed, n, dq)
            assert torch.equal(bits(fused), bits(staged)), (isa, operands[0] is None)
            outs.append(fused)
    for out in outs[::2]:
        assert torch.equal(bits(out), bits(outs[0]))


def test_custom_linear_is_its_stages(make_outliers, make_randn):
    custom = get_backend("custom")
    x, dims = make_outliers(40, 96)
    w, bias = make_randn(50, 96), make_randn(50)
    cfg = QuantConfig()
    pw = custom.prepare_weight(w, bias, cfg, dims[:1])
    qa = custom.quantize(x, pw, cfg)
    staged = custom.dequantize(
        custom.int8_matmul(qa.int8, pw), qa, pw, custom.outlier_product(qa, pw)
    )
    assert qa.outlier_cols.numel() == dims.numel()
    assert torch.equal(custom.linear(x, pw, cfg), staged)


def staged_linear(custom, x, pw, cfg):
    """The layer stage by stage: quantize, the outlier operands, the fused GEMM."""
    qa = custom.quantize(x, pw, cfg)
    dq = custom._dequant(qa, pw, custom.outlier_product(qa, pw))
    return cpu_ext.linear(qa.int8, pw.packed, pw.out_features, dq)


@pytest.mark.parametrize("m", [0, 1, 7, 70])  # m * k below and above kSerialElems (2^16)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_call_layer_gives_the_numbers_of_the_stages(
    isa_restored, make_outliers, make_randn, m, dtype
):
    """llm_int8 with every outlier in the kept dims, and vectorwise: the one extension call
    (``cpu_ext.linear_kept``) writes the stages' output bit for bit, with and without bias; with
    an outlier dim not kept it declines (None) and the layer takes the stages."""
    custom = get_backend("custom")
    k, n = 1001, 37
    x, dims = make_outliers(max(m, 1), k, n_outlier_dims=5)
    x = x[:m].to(dtype)
    w, bias = make_randn(n, k).to(dtype), make_randn(n).to(dtype)
    llm, vectorwise = QuantConfig(), QuantConfig(alpha=0.0)
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        for b in (bias, None):
            for cfg, kept in ((llm, dims), (vectorwise, None)):
                pw = custom.prepare_weight(w, b, cfg, kept)
                alpha = cfg.alpha if cfg.decomposition else float("inf")
                one = cpu_ext.linear_kept(x, pw.one_call, alpha, False)
                staged = staged_linear(custom, x, pw, cfg)
                assert one is not None and torch.equal(bits(one), bits(staged)), (isa, cfg)
                assert torch.equal(bits(custom.linear(x, pw, cfg)), bits(staged)), (isa, cfg)
            if m:
                fewer = custom.prepare_weight(w, b, llm, dims[1:])
                assert cpu_ext.linear_kept(x, fewer.one_call, llm.alpha, False) is None, isa
                staged = staged_linear(custom, x, fewer, llm)
                assert torch.equal(bits(custom.linear(x, fewer, llm)), bits(staged)), isa


def test_one_call_layer_checks_its_operands(make_outliers, make_randn):
    custom = get_backend("custom")
    x, dims = make_outliers(3, 64)
    w = make_randn(20, 64).bfloat16()
    cfg = QuantConfig()
    pw = custom.prepare_weight(w, None, cfg, dims)
    bad = x.bfloat16().clone()
    bad[1, 2] = float("inf")
    with pytest.raises(InputError, match="NaN/Inf"):
        custom.linear(bad, pw, cfg)
    with pytest.raises(InputError, match="shape mismatch"):
        cpu_ext.linear_kept(x[:, :63].contiguous(), pw.one_call, cfg.alpha, False)
    one = pw.one_call
    with pytest.raises(InputError, match="column absmax"):
        cpu_ext.kept_linear(
            one.kept, one.packed, 20, one.col_absmax.double(), None, one.kept_t32, torch.bfloat16
        )
    with pytest.raises(InputError, match="kept weights"):
        cpu_ext.kept_linear(
            one.kept,
            one.packed,
            20,
            one.col_absmax,
            None,
            one.kept_t32[:, :19].contiguous(),
            torch.bfloat16,
        )
    with pytest.raises(InputError, match="packed"):
        cpu_ext.kept_linear(
            one.kept, one.packed, 40, one.col_absmax, None, one.kept_t32, torch.bfloat16
        )
    # kept dims given unsorted: no one-call operands (its kept weights follow their order), the
    # stages compute the layer
    shuffled = custom.prepare_weight(w, None, cfg, dims.flip(0))
    assert shuffled.one_call is None
    assert torch.equal(
        custom.linear(x.bfloat16(), shuffled, cfg), custom.linear(x.bfloat16(), pw, cfg)
    )


@pytest.mark.parametrize("m", [1, 8])
def test_outlier_product_reads_the_kept_dims_from_the_prepared_weight(make_outliers, make_randn, m):
    """When a call's outlier columns are exactly the kept dims (a decode step of the layer the
    dims were calibrated on), the fp32 weights come from ``prepare_weight``, not a gather; the
    numbers are those of the gather, and columns beyond the kept dims still take the gather."""
    custom = get_backend("custom")
    x, dims = make_outliers(m, 96)
    w, bias = make_randn(50, 96), make_randn(50)
    cfg = QuantConfig()
    pw = custom.prepare_weight(w, bias, cfg, dims)
    qa = custom.quantize(x, pw, cfg)
    assert torch.equal(qa.outlier_cols, pw.kept_rows)
    values, w_t = custom.outlier_product(qa, pw)
    assert w_t is pw.kept_t32
    gathered = quant.outlier_weight_rows(pw, qa.outlier_cols, torch.float32).T
    assert torch.equal(w_t, gathered)
    assert torch.equal(values, qa.outlier_values.float())

    fewer = custom.prepare_weight(w, bias, cfg, dims[:1])  # the other dims are detected per call
    qa = custom.quantize(x, fewer, cfg)
    assert qa.outlier_cols.numel() > fewer.kept_rows.numel()
    _, w_t = custom.outlier_product(qa, fewer)
    assert torch.equal(w_t, quant.outlier_weight_rows(fewer, qa.outlier_cols, torch.float32).T)


def test_fused_linear_rejects_bad_operands(gen):
    a = torch.randint(-128, 128, (4, 10), dtype=torch.int8, generator=gen)
    packed = cpu_ext.pack_weight(torch.randint(-128, 128, (6, 10), dtype=torch.int8, generator=gen))
    row, col = torch.ones(4), torch.ones(6)
    with pytest.raises(cpu_ext.InputError, match="col_absmax"):
        cpu_ext.linear(a, packed, 6, cpu_ext.Dequant(row, torch.ones(5), torch.bfloat16))
    with pytest.raises(cpu_ext.InputError, match="another shape"):
        cpu_ext.linear(a, packed, 17, cpu_ext.Dequant(row, torch.ones(17), torch.bfloat16))
    with pytest.raises(cpu_ext.InputError, match="fp32, fp16 or bf16"):
        cpu_ext.linear(a, packed, 6, cpu_ext.Dequant(row, col, torch.int32))


# --- the int32 GEMM: the fused path's blocking with an int32 store --------------------------

# k across the 512 / 2048 k blocks and off the multiples of 4 (the padded last quad, as at
# d = 5140), m around the 6- and 12-row tiles, n off the 16-column panels and across the
# 8-panel chunks and the two threads' panel ranges; the last output is large enough (> 4 MiB)
# to be advised to huge pages.
INT32_SHAPES = [
    (1, 5141, 33),
    (2, 3, 161),
    (6, 1027, 300),  # m <= 32: the decode path (whole panels, streamed)
    (32, 515, 47),
    (33, 515, 47),  # the blocked path again
    (12, 2048, 16),
    (13, 4099, 290),
    (25, 2050, 129),
    (1030, 37, 1100),
    (40, 2051, 107),
    # n a multiple of 16: every output row 64-byte aligned (the VNNI set streams them to memory)
    (70, 300, 528),
    (45, 4099, 256),
    (260, 16391, 40),  # three row groups (2 MiB of packed A: 120 rows at this k), the last partial
    (1100, 2048, 40),  # one k block, row groups of 252 rows (VNNI) or 1026 (AVX2), the last partial
    (150, 4093, 72),  # one VNNI k block of odd k (a half quad), several AVX2 ones
    # one VNNI k block, n a multiple of 16 (streamed), two row groups, an odd panel per thread
    (600, 1003, 80),
    (40, 4096, 48),  # k exactly one VNNI block
]


@pytest.fixture
def streaming_store_restored():
    before = cpu_ext.streaming_store_bytes()
    yield
    cpu_ext.set_streaming_store_bytes(before)


@pytest.mark.parametrize("streamed", [False, True], ids=["cached-stores", "streamed-stores"])
@pytest.mark.parametrize("shape", INT32_SHAPES)
def test_int32_gemm_is_the_exact_product_on_every_kernel_set(
    gen, isa_restored, streaming_store_restored, shape, streamed
):
    m, k, n = shape
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    a[0], w[-1] = -128, -128  # the largest products, on the excess-128 correction's edge
    exact = (a.double() @ w.double().T).to(torch.int64)
    packed = cpu_ext.pack_weight(w)
    # 0: every product stored non-temporally (VNNI set); larger than any: none
    cpu_ext.set_streaming_store_bytes(0 if streamed else 1 << 62)
    for isa in kernel_sets_here():
        cpu_ext.set_isa(isa)
        got = cpu_ext.gemm(a, packed, n)
        assert got.dtype == torch.int32 and got.shape == (m, n)
        assert torch.equal(got.to(torch.int64), exact), isa


def test_streaming_store_threshold_is_half_a_cache_and_checked(streaming_store_restored):
    assert cpu_ext.streaming_store_bytes() >= 1 << 14  # half of some cache level, or 16 MiB
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(cpu_ext.InputError, match="streaming_store_bytes"):
            cpu_ext.set_streaming_store_bytes(bad)
    cpu_ext.set_streaming_store_bytes(0)
    assert cpu_ext.streaming_store_bytes() == 0


# --- the decode path (m <= stream_rows) against the blocked path ------------------------------


@pytest.fixture
def stream_rows_restored():
    before = cpu_ext.stream_rows()
    yield
    cpu_ext.set_stream_rows(before)


# k: odd (a half quad and an odd pair at the end), across the 512 / 2048 k blocks of the blocked
# paths; n: a partial last panel, an odd number of panels (a one-panel tile after the pairs),
# more than one 8-panel chunk per thread.
DECODE_KN = [(37, 33), (4099, 290)]


@pytest.mark.parametrize("k, n", DECODE_KN)
def test_decode_path_gives_the_blocked_paths_numbers_for_every_m_up_to_32(
    gen, isa_restored, stream_rows_restored, k, n
):
    assert cpu_ext.stream_rows() >= 32  # every m below runs on the decode path by default
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    w[-1] = -128
    packed = cpu_ext.pack_weight(w)
    a_all = torch.randint(-128, 128, (32, k), dtype=torch.int8, generator=gen)
    a_all[0] = -128  # the largest products, on the excess-128 correction's edge
    row_all = torch.rand(32, generator=gen) + 0.5
    row_all[5] = 1e-38  # a row on the float64-scale path
    col = (torch.rand(n, generator=gen) + 0.5) * 1e-3 / k**0.5
    bias = torch.randn(n, generator=gen)
    for m in range(1, 33):
        a, row = a_all[:m].contiguous(), row_all[:m].contiguous()
        exact = (a.double() @ w.double().T).to(torch.int64)
        dq = cpu_ext.Dequant(row, col, torch.bfloat16, bias)
        fused = {}
        for isa in kernel_sets_here():
            cpu_ext.set_isa(isa)
            for rows in (32, 0):  # the decode path, then the blocked path
                cpu_ext.set_stream_rows(rows)
                got = cpu_ext.gemm(a, packed, n)
                assert torch.equal(got.to(torch.int64), exact), (isa, m, rows)
                fused[isa, rows] = bits(cpu_ext.linear(a, packed, n, dq))
        first = next(iter(fused.values()))
        for key, out in fused.items():
            assert torch.equal(out, first), (key, m)


def test_stream_rows_rejects_bad_values(stream_rows_restored):
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(InputError, match="stream_rows must be an integer >= 0"):
            cpu_ext.set_stream_rows(bad)
    cpu_ext.set_stream_rows(0)
    assert cpu_ext.stream_rows() == 0


@pytest.fixture
def decode_prefetch_restored():
    before = cpu_ext.decode_prefetch()
    yield
    cpu_ext.set_decode_prefetch(before)


@pytest.mark.parametrize("prefetch", sorted(cpu_ext.DECODE_PREFETCH))
def test_decode_prefetch_never_changes_the_numbers(
    gen, isa_restored, stream_rows_restored, decode_prefetch_restored, prefetch
):
    k, n = DECODE_KN[-1]
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    packed = cpu_ext.pack_weight(w)
    cpu_ext.set_stream_rows(32)
    for m in (1, 2, 12, 13, 32):  # one row, one row slice, a partial and full second slice
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
        dq = cpu_ext.Dequant(
            torch.rand(m, generator=gen) + 0.5, torch.rand(n, generator=gen), torch.bfloat16
        )
        exact = (a.double() @ w.double().T).to(torch.int64)
        for isa in kernel_sets_here():
            cpu_ext.set_isa(isa)
            cpu_ext.set_decode_prefetch(prefetch)
            got = cpu_ext.gemm(a, packed, n)
            fused = bits(cpu_ext.linear(a, packed, n, dq))
            cpu_ext.set_stream_rows(0)  # the blocked path, with no decode prefetch at all
            blocked = bits(cpu_ext.linear(a, packed, n, dq))
            cpu_ext.set_stream_rows(32)
            assert torch.equal(got.to(torch.int64), exact), (isa, m)
            assert torch.equal(fused, blocked), (isa, m)


def test_decode_prefetch_is_chosen_per_processor_and_checked(decode_prefetch_restored):
    assert cpu_ext.default_decode_prefetch() in cpu_ext.DECODE_PREFETCH
    assert cpu_ext.decode_prefetch() in cpu_ext.DECODE_PREFETCH
    for bad in ("L1", "l3", 1, None):
        with pytest.raises(InputError, match="decode prefetch must be one of"):
            cpu_ext.set_decode_prefetch(bad)
    for name in cpu_ext.DECODE_PREFETCH:
        cpu_ext.set_decode_prefetch(name)
        assert cpu_ext.decode_prefetch() == name


@pytest.mark.parametrize(
    ("probe", "bad_call", "message"),
    [
        ("thread_round_trip_ns", lambda ext: ext.thread_round_trip_ns(0, 1), "rounds"),
        ("core_probe_ns", lambda ext: ext.core_probe_ns(0), "iters"),
    ],
)
def test_a_two_thread_probe_reads_nanoseconds_or_none_with_one_thread(probe, bad_call, message):
    """The threads' link (two OpenMP threads bounce a cache line: the fastest batch; on a busy
    machine a descheduled thread makes it milliseconds) and the cores' probe (a fixed integer
    chain on two threads, the slower one's time): a positive time, or None where only one
    thread runs."""
    read = getattr(cpu_ext, probe)
    ns = read()
    if torch.get_num_threads() < 2:
        assert ns is None
    else:
        assert ns is not None and 0 < ns < math.inf
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # a one-thread run: nothing to read, no second thread woken
        assert read() is None
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match=message):
        bad_call(cpu_ext._ext)
