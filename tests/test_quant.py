"""The quantization math (:mod:`kernelbench.quant`) against hand-computed and float64 results."""

from __future__ import annotations

import math

import pytest
import torch

from kernelbench import oracle, quant
from kernelbench.quant import DEQUANT_CONSTANT, Problem, QuantConfig

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
COMPUTE = [pytest.param(F32, id="fp32"), pytest.param(F64, id="fp64")]


def grid(gen, m, k, step=0.25, dtype=BF16):
    """Integers in [-127, 127] times a power of two, with +-127 in every row: absmax is 127*step
    and every value is an exact multiple of absmax/127, so quantization is exact."""
    q = torch.randint(-127, 128, (m, k), generator=gen)
    q = torch.where(q == 0, torch.ones_like(q), q)
    sign = torch.where(torch.rand(m, generator=gen) < 0.5, -1, 1)
    q[torch.arange(m), torch.randint(k, (m,), generator=gen)] = 127 * sign
    return (q.to(F64) * step).to(dtype), q.to(torch.int8)


def step_bound(t, amax, compute):
    """|t - q * amax/127| <= amax/254, plus the rounding of fp32 scale arithmetic."""
    fp = 2.0**-21 if compute == F32 else 2.0**-50
    return amax.to(F64) / 254 * (1 + fp) + t.to(F64).abs() * fp


# --- absmax: tensor-wise, row-wise, vector-wise -------------------------------------------------


@pytest.mark.parametrize("compute", COMPUTE)
def test_tensorwise_exact_on_grid(gen, compute):
    _, q = grid(gen, 5, 9)
    q = q.clamp(-126, 126)
    q[3, 4] = -127  # the one tensor-wide absmax
    x = (q.to(F64) * 0.25).to(BF16)
    got, amax = quant.quantize_tensorwise(x, compute)
    assert got.dtype == torch.int8
    assert float(amax) == 127 * 0.25
    assert torch.equal(got, q)


@pytest.mark.parametrize("compute", COMPUTE)
def test_rowwise_exact_on_grid_with_per_row_scales(gen, compute):
    x, q = grid(gen, 6, 11)
    steps = torch.tensor([2.0**e for e in (-6, -3, 0, 1, 3, 5)], dtype=F64)
    x = (q.to(F64) * steps[:, None]).to(BF16)
    got, amax = quant.quantize_rowwise(x, compute)
    assert torch.equal(got, q)
    assert torch.equal(amax.to(F64), 127 * steps)


def test_vectorwise_exact_on_grid_matches_exact_product(gen):
    """eq. 7 on exactly representable operands reproduces the float64 product exactly."""
    x, _ = grid(gen, 7, 13, step=2.0**-3)
    w, _ = grid(gen, 5, 13, step=2.0**-5)
    bias = torch.randn(5, generator=gen).to(BF16)
    emu = oracle.emulate(Problem("vectorwise_torch", x, w, bias, QuantConfig()))
    assert torch.equal(emu, oracle.exact(x, w, bias))
    emu = oracle.emulate(Problem("vectorwise", x, w, bias, QuantConfig()))
    assert torch.equal(emu, oracle.exact(x, w, bias))


@pytest.mark.parametrize("compute", COMPUTE)
@pytest.mark.parametrize("dtype", [BF16, torch.float16, F32])
@pytest.mark.parametrize("scheme", ["tensorwise", "rowwise"])
def test_absmax_reconstruction_within_half_step(make_randn, compute, dtype, scheme):
    x = make_randn(17, 33, dtype=dtype, scale=3.0)
    fn = quant.quantize_tensorwise if scheme == "tensorwise" else quant.quantize_rowwise
    q, amax = fn(x, compute)
    a = amax.to(F64) if scheme == "tensorwise" else amax.to(F64)[:, None]
    rec = q.to(F64) * a / 127
    assert (q.abs() <= 127).all()
    assert ((x.to(F64) - rec).abs() <= step_bound(x, a, compute)).all()
    assert torch.equal(amax.to(F64), x.to(F64).abs().amax() if a.dim() == 0 else a[:, 0])


def test_vectorwise_uses_one_scale_per_row_of_x_and_of_w(make_randn):
    """Vector-wise: c_x per token (row of x), c_w per output unit (row of w, nn.Linear)."""
    x = make_randn(4, 16)
    w = make_randn(3, 16)
    x[2] *= 100  # a large token must not change the other tokens' quantization
    qx, ax = quant.quantize_rowwise(x)
    qx2, _ = quant.quantize_rowwise(torch.cat([x[:2], x[3:]]))
    assert torch.equal(torch.cat([qx[:2], qx[3:]]), qx2)
    _, aw = quant.quantize_rowwise(w)
    assert torch.equal(aw, w.float().abs().amax(dim=1))
    assert torch.equal(ax, x.float().abs().amax(dim=1))


def test_dequantization_constant():
    assert DEQUANT_CONSTANT == 1.0 / 127**2
    # bitsandbytes' literal 6.200124e-05 (card, "Paper vs code") is 1/127^2 = 6.2000124e-05
    # with a digit dropped: 1.8e-5 relative apart. The code uses the exact 1/127^2.
    assert abs(DEQUANT_CONSTANT / 6.200124e-05 - 1) < 2e-5
    acc = torch.tensor([[127 * 127, -127 * 127], [0, 127]], dtype=torch.int32)
    row = torch.tensor([2.0, 0.5])
    col = torch.tensor([4.0, 8.0])
    y = quant.dequantize_outer(acc, row, col, F64)
    expect = torch.tensor([[8.0, -16.0], [0.0, 0.5 * 8.0 / 127]], dtype=F64)
    assert torch.allclose(y, expect, rtol=1e-15, atol=0)


@pytest.mark.parametrize("compute", COMPUTE)
def test_all_zero_row_gives_zeros_not_nan(make_randn, compute):
    x = make_randn(3, 10)
    x[1] = 0
    q, amax = quant.quantize_rowwise(x, compute)
    assert float(amax[1]) == 0
    assert (q[1] == 0).all()
    qt, at = quant.quantize_tensorwise(torch.zeros(2, 3, dtype=BF16), compute)
    assert float(at) == 0 and (qt == 0).all()
    w = make_randn(4, 10)
    bias = make_randn(4)
    for method in ("vectorwise", "llm_int8", "vectorwise_torch", "absmax_torch"):
        y = oracle.emulate(Problem(method, x, w, bias, QuantConfig()))
        assert torch.isfinite(y).all(), method
        if method != "absmax_torch":
            assert torch.equal(y[1], bias.to(F64)), method
    zero_w = torch.zeros(4, 10, dtype=BF16)
    y = oracle.emulate(Problem("llm_int8", x, zero_w, None, QuantConfig()))
    assert torch.equal(y, torch.zeros_like(y))


@pytest.mark.parametrize("compute", COMPUTE)
def test_int8_corners_are_symmetric(make_randn, compute):
    x = make_randn(6, 20, scale=2.0)
    x[0, 3] = -x[0].abs().max() * 1.5  # the row's absmax is a negative value
    x[1, 5] = x[1].abs().max() * 1.5
    q, amax = quant.quantize_rowwise(x, compute)
    assert int(q[0, 3]) == -127 and int(q[1, 5]) == 127
    assert int(q.min()) >= -127  # -128 never comes out
    qt, _ = quant.quantize_tensorwise(-torch.ones(2, 2, dtype=BF16), compute)
    assert (qt == -127).all()


# --- zeropoint -----------------------------------------------------------------------------


@pytest.mark.parametrize("compute", COMPUTE)
def test_zeropoint_is_asymmetric_with_a_real_zero_point(gen, compute):
    # Asymmetric data: [-1, 3] (an absmax scheme would waste a third of the range).
    x = (torch.rand(9, 25, generator=gen) * 4 - 1).to(F32)
    x[0, 0], x[4, 7] = -1.0, 3.0
    zq = quant.quantize_zeropoint(x, None, compute)
    assert int(zq.q[0, 0]) == -127 and int(zq.q[4, 7]) == 127  # min -> -127, max -> 127
    assert float(zq.nd) == pytest.approx(254 / 4.0)
    zp = float(zq.zp)
    assert zp == round(zp) and zp != 0  # an integer, and not the symmetric 0
    rec = (zq.q.to(F64) - zp) / float(zq.nd)
    bound = 1 / float(zq.nd) / 2 + 1e-5
    assert ((x.to(F64) - rec).abs() <= bound).all()
    # zero is exact: q(0) == zp
    z = quant.quantize_zeropoint(torch.tensor([[-1.0, 0.0, 3.0]]), None, compute)
    assert float(z.q[0, 1]) == float(z.zp)


@pytest.mark.parametrize("compute", COMPUTE)
def test_zeropoint_rowwise_reconstruction(gen, compute):
    lo = -torch.rand(5, 1, generator=gen) * 3
    hi = torch.rand(5, 1, generator=gen) * 10 + 0.1
    x = lo + (hi - lo) * torch.rand(5, 40, generator=gen)
    x[:, 0], x[:, 1] = lo[:, 0], hi[:, 0]
    zq = quant.quantize_zeropoint(x, 1, compute)
    assert (zq.q[:, 0] == -127).all() and (zq.q[:, 1] == 127).all()
    rec = (zq.q.to(F64) - zq.zp.to(F64)) / zq.nd.to(F64)
    assert ((x.to(F64) - rec).abs() <= 1 / zq.nd.to(F64) / 2 + 1e-5).all()


def test_zeropoint_matmul_is_the_product_of_the_dequantized_operands(gen):
    """eq. 5's expansion equals (qx - zx)(qw - zw)^T / (ndx ndw) computed directly."""
    x = torch.rand(6, 14, generator=gen) * 5 - 1
    w = torch.rand(4, 14, generator=gen) * 2 - 1.5
    for dim in (None, 1):
        zx = quant.quantize_zeropoint(x, dim, F64)
        zw = quant.quantize_zeropoint(w, dim, F64)
        dx = (zx.q.to(F64) - zx.zp.reshape(-1, 1)) / zx.nd.reshape(-1, 1)
        dw = (zw.q.to(F64) - zw.zp.reshape(-1, 1)) / zw.nd.reshape(-1, 1)
        y = quant.zeropoint_matmul(zx, zw, F64)
        assert torch.allclose(y, dx @ dw.T, rtol=1e-12, atol=1e-12)
        assert oracle.rel_frobenius(y, oracle.exact(x, w)) < 0.02


def test_zeropoint_constant_and_zero_slices():
    z = quant.quantize_zeropoint(torch.zeros(2, 3), 1, F64)
    assert (z.q == 0).all() and torch.isfinite(z.nd).all()
    c = quant.quantize_zeropoint(torch.full((1, 4), 2.5), 1, F64)  # range widened to [0, 2.5]
    rec = (c.q.to(F64) - c.zp) / c.nd
    assert torch.allclose(rec, torch.full((1, 4), 2.5, dtype=F64), atol=2.5 / 254)


# --- outliers and the decomposition ---------------------------------------------------------


@pytest.mark.parametrize("alpha", [6.0, 1.5])
def test_outlier_comparison_at_exactly_alpha(make_randn, alpha):
    x = make_randn(4, 8, scale=0.1)
    x[1, 2] = alpha
    x[3, 5] = -alpha
    x[0, 6] = alpha + 2.0 ** (math.floor(math.log2(alpha)) - 7)  # next bf16 above alpha
    assert float(x[0, 6]) > alpha and float(x[1, 2]) == alpha
    gt = quant.outlier_columns(x, alpha, ">")
    ge = quant.outlier_columns(x, alpha, ">=")
    assert gt.tolist() == [6]
    assert ge.tolist() == [2, 5, 6]


def test_alpha_zero_turns_decomposition_off(make_randn, make_outliers):
    x, dims = make_outliers(16, 32)
    w = make_randn(8, 32)
    cfg = QuantConfig(alpha=0.0)
    assert not cfg.decomposition
    assert not quant.outlier_mask(x, 0.0, ">=").any()
    pw = quant.prepare_weight(w, None, cfg, kept_rows=dims)
    assert pw.kept_rows.numel() == 0
    assert quant.decomposition_columns(x, pw, cfg).numel() == 0
    y0 = oracle.emulate(Problem("llm_int8", x, w, None, cfg, kept_rows=dims))
    assert torch.equal(y0, oracle.emulate(Problem("vectorwise", x, w, None, QuantConfig())))
    assert QuantConfig(alpha=6.0).without_decomposition().alpha == 0.0


def test_row_scales_exclude_outlier_columns(make_randn, make_outliers):
    x, dims = make_outliers(12, 40)
    w = make_randn(5, 40)
    cfg = QuantConfig()
    pw = quant.prepare_weight(w, None, cfg)
    cols = quant.decomposition_columns(x, pw, cfg)
    assert torch.equal(cols, dims)
    qa = quant.quantize_activation(x, cols)
    regular = x.float().clone()
    regular[:, cols] = 0
    assert torch.equal(qa.absmax, regular.abs().amax(dim=1))
    assert float(qa.absmax.max()) < 6  # the -40..-60 outliers did not set any row scale
    assert (qa.int8[:, cols] == 0).all()
    assert torch.equal(qa.outlier_values, x[:, cols])
    assert qa.outlier_values.dtype == x.dtype


def test_outlier_weights_fp16_uses_the_kept_rows_exactly(make_randn, make_outliers):
    x, dims = make_outliers(10, 24)
    w = make_randn(6, 24)
    w[:, dims[0]] = 50.0  # a large weight in a kept dim must not set the column scale
    cfg = QuantConfig(outlier_weights="fp16")
    pw = quant.prepare_weight(w, None, cfg, kept_rows=dims, compute_dtype=F64)
    assert torch.equal(pw.kept_rows, dims)
    assert torch.equal(pw.kept_values, w[:, dims])
    regular = w.to(F64).clone()
    regular[:, dims] = 0
    assert torch.equal(pw.absmax, regular.abs().amax(dim=1))
    rows = quant.outlier_weight_rows(pw, dims, F64)
    assert torch.equal(rows, w[:, dims].to(F64))
    # the 16-bit part of eq. 8 is then exact
    qa = quant.quantize_activation(x, dims, F64)
    assert torch.equal(
        quant.outlier_product(qa, pw, F64), x[:, dims].to(F64) @ w[:, dims].T.to(F64)
    )


def test_outlier_weights_int8_reconstructs_from_int8(make_randn, make_outliers):
    x, dims = make_outliers(10, 24)
    w = make_randn(6, 24)
    cfg = QuantConfig(outlier_weights="int8")
    pw = quant.prepare_weight(w, None, cfg, kept_rows=dims, compute_dtype=F64)
    assert pw.kept_rows.numel() == 0 and pw.kept_values.numel() == 0
    assert torch.equal(pw.absmax, w.to(F64).abs().amax(dim=1))
    rows = quant.outlier_weight_rows(pw, dims, F64)
    rec = pw.int8[:, dims].to(F64) * pw.absmax[:, None] / 127
    assert torch.allclose(rows, rec, rtol=1e-15, atol=0)
    err = (rows - w[:, dims].to(F64)).abs()
    assert (err <= pw.absmax[:, None] / 254 * (1 + 1e-12)).all()
    assert not torch.equal(rows, w[:, dims].to(F64))  # int8-rounded, not the originals


def test_fp16_mode_without_kept_rows_falls_back_to_int8_rows(make_randn, make_outliers):
    """Dims detected at call time that were not kept at prepare time have no 16-bit rows: the
    ``fp16`` mode then reconstructs them from int8, like the ``int8`` mode."""
    x, _ = make_outliers(10, 24)
    w = make_randn(6, 24)
    y16 = oracle.emulate(Problem("llm_int8", x, w, None, QuantConfig(outlier_weights="fp16")))
    y8 = oracle.emulate(Problem("llm_int8", x, w, None, QuantConfig(outlier_weights="int8")))
    assert torch.equal(y16, y8)


def test_llm_int8_beats_vectorwise_with_app_c_outliers(make_randn, make_outliers):
    """The paper's claim (§3.2, tab. 1): with outlier features, vector-wise int8 loses the
    small values of every row that holds an outlier; the decomposition keeps them."""
    # d = 4096 (the 6.7B row of app. C). At small d the few outlier dims dominate the output
    # norm and the gap shrinks (about 4x at d = 256); at 4096 it is about 7x.
    x, dims = make_outliers(32, 4096, share=0.25)
    w = make_randn(32, 4096, scale=0.05)
    bias = make_randn(32, scale=0.1)
    ref = oracle.exact(x, w, bias)
    cfg = QuantConfig()
    e_llm = oracle.rel_frobenius(oracle.emulate(Problem("llm_int8", x, w, bias, cfg)), ref)
    e_llm_kept = oracle.rel_frobenius(
        oracle.emulate(Problem("llm_int8", x, w, bias, cfg, dims)), ref
    )
    e_vec = oracle.rel_frobenius(oracle.emulate(Problem("vectorwise", x, w, bias, cfg)), ref)
    e_abs = oracle.rel_frobenius(oracle.emulate(Problem("absmax_torch", x, w, bias, cfg)), ref)
    assert e_llm * 5 < e_vec, (e_llm, e_vec)
    assert e_llm_kept * 5 < e_vec, (e_llm_kept, e_vec)
    assert e_vec <= e_abs * 1.01
    assert e_llm < 0.02


def test_quant_config_validation():
    with pytest.raises(ValueError, match="outlier_cmp"):
        QuantConfig(outlier_cmp="<")
    with pytest.raises(ValueError, match="outlier_weights"):
        QuantConfig(outlier_weights="fp8")
    with pytest.raises(ValueError, match="alpha"):
        QuantConfig(alpha=float("nan"))


@pytest.mark.parametrize("per_row", [True, False])
def test_offline_quantization_in_blocks_matches_the_one_pass_schemes(per_row, monkeypatch):
    from kernelbench import quant

    monkeypatch.setattr(quant, "WEIGHT_BLOCK_ELEMENTS", 64)  # many blocks, one partial
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(37, 24, generator=gen).to(torch.bfloat16)
    w[3] = 0.0  # a zero row
    w[5] *= 1e-38  # a row below float32's reciprocal range
    w[9, 4] = -500.0  # the tensor's absmax
    scheme = quant.quantize_rowwise if per_row else quant.quantize_tensorwise
    want_q, want_amax = scheme(w)
    got_q, got_amax = quant.quantize_offline(w, per_row)
    assert torch.equal(got_q, want_q) and torch.equal(got_amax, want_amax)


def _int64_product(a: torch.Tensor, b_nk: torch.Tensor) -> torch.Tensor:
    """The product in int64 arithmetic, a column of k at a time: slow, exact by construction."""
    out = torch.zeros(a.shape[0], b_nk.shape[0], dtype=torch.int64)
    for j in range(a.shape[1]):
        out += a[:, j : j + 1].long() * b_nk[:, j].long()[None, :]
    return out


def test_exact_int_product_is_exact_where_one_float32_sum_is_not(monkeypatch):
    """2999 products of 127 * 127 sum to an odd 48,370,871 > 2^24, which no float32 holds;
    the exact product gives it, from blocks of rows of the right operand as from one."""
    gen = torch.Generator().manual_seed(0)
    a = torch.full((3, 2999), 127, dtype=torch.int8)
    a[1] = -128
    a[2] = torch.randint(-128, 128, (2999,), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (37, 2999), generator=gen, dtype=torch.int8)
    b[0] = 127
    want = _int64_product(a, b)
    assert not torch.equal((a.float() @ b.float().T).long(), want)  # what float32 would give
    got = quant.exact_int_product(a, b)
    assert got.dtype == F64 and torch.equal(got.long(), want)
    assert torch.equal(oracle.int_product(a, b), want)
    monkeypatch.setattr(quant, "PRODUCT_BLOCK_ELEMENTS", 5 * 2999)  # 5 rows of b a block
    assert torch.equal(oracle.int_product(a, b), want)


def test_exact_int_product_of_wide_codes_and_empty_operands():
    """Codes beyond int8 (the zero-point scheme's int64) and operands with a zero dimension
    give the exact product; partial sums that could reach 2^53 are refused."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (4, 700), generator=gen, dtype=torch.int8)
    b = torch.randint(-128, 128, (23, 700), generator=gen, dtype=torch.int8)
    wide_a, wide_b = a.long() * 1000, b.long() * 1000
    assert torch.equal(
        quant.exact_int_product(wide_a, wide_b).long(), _int64_product(wide_a, wide_b)
    )
    assert quant.exact_int_product(a[:, :0], b[:, :0]).shape == (4, 23)
    assert not quant.exact_int_product(a[:, :0], b[:, :0]).any()
    assert quant.exact_int_product(a[:0], b).shape == (0, 23)
    with pytest.raises(ValueError, match="2\\^53"):
        quant.exact_int_product(torch.full((1, 4), 2**26), torch.full((1, 4), 2**26))
