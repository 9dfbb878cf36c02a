"""The accuracy variants (:func:`kernelbench.quant.variant_forward`) against an independent
float64 computation: each operand quantized and dequantized elementwise in plain float64 (no
integer product, no shared helper), then multiplied."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelbench import oracle, quant
from kernelbench.core import ACCURACY_VARIANTS
from kernelbench.quant import Problem, QuantConfig

F64 = torch.float64
CFG = QuantConfig()


def _absmax_fake(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """``round(t * (127 / amax)) * amax / 127`` (the codes' convention), 0 where amax is 0."""
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    q = torch.round(t * _div(127.0, safe)).clamp(-127, 127)
    return torch.where(amax > 0, q * safe / 127.0, torch.zeros_like(t))


def _div(num: float, den: torch.Tensor) -> torch.Tensor:
    """A true division (``num / tensor`` in torch is reciprocal-then-multiply, which can move
    an exact .5 tie of the codes)."""
    return torch.full_like(den, num) / den


def _zeropoint_fake(t: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """eq. 1 with an integer zero point; the range widened to include 0."""
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    span = hi - lo
    safe = torch.where(span > 0, span, torch.ones_like(span))
    nd = 254.0 / safe  # as eq. 1 is computed in quant (scalar / tensor)
    zp = -torch.round(lo * nd) - 127
    q = (torch.round(t * nd) + zp).clamp(-127, 127)
    return torch.where(span > 0, (q - zp) / nd, torch.zeros_like(t))


def _e4m3(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest float8 e4m3fn value (ties to even) by its definition: 3 mantissa
    bits, smallest normal exponent -6 (subnormal step 2^-9), |v| <= 448 here."""
    a = v.abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=-6)
    quantum = torch.pow(2.0, e - 3)
    return torch.round(v / quantum) * quantum  # torch.round: half to even


def _outlier_cols(x: torch.Tensor) -> torch.Tensor:
    return (x.abs().amax(0) > CFG.alpha).nonzero().flatten()


def reference(method: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, w, b = x.to(F64), w.to(F64), b.to(F64)
    cols = torch.zeros(0, dtype=torch.int64)
    if method in ("rowwise_decomp", "zeropoint_llm_int8"):
        cols = _outlier_cols(x)
    xr, wr = x.clone(), w.clone()
    xr[:, cols] = 0
    wr[:, cols] = 0
    if method == "zeropoint":
        xh = _zeropoint_fake(x, x.min(), x.max())
        wh = _zeropoint_fake(w, w.min(), w.max())
    elif method in ("zeropoint_vectorwise", "zeropoint_llm_int8"):
        xh = _zeropoint_fake(xr, xr.amin(1, keepdim=True), xr.amax(1, keepdim=True))
        wh = _zeropoint_fake(wr, wr.amin(1, keepdim=True), wr.amax(1, keepdim=True))
    elif method in ("rowwise", "rowwise_decomp"):
        xh = _absmax_fake(xr, xr.abs().max())
        wh = _absmax_fake(wr, wr.abs().amax(1, keepdim=True))
    elif method == "smoothquant":
        s = (x.abs().amax(0).clamp(min=1e-5) ** 0.5) / (w.abs().amax(0).clamp(min=1e-5) ** 0.5)
        xs, ws = x / s, w * s
        xh = _absmax_fake(xs, xs.abs().amax(1, keepdim=True))
        wh = _absmax_fake(ws, ws.abs().amax(1, keepdim=True))
    elif method == "int8_weight_only":
        xh, wh = x, _absmax_fake(w, w.abs().amax(1, keepdim=True))
    elif method == "fp8_e4m3":
        xa, wa = x.abs().amax(1, keepdim=True), w.abs().amax(1, keepdim=True)
        xa1, wa1 = torch.where(xa > 0, xa, 1.0), torch.where(wa > 0, wa, 1.0)
        xh = _e4m3(x * _div(448.0, xa1)) * xa1 / 448.0
        wh = _e4m3(w * _div(448.0, wa1)) * wa1 / 448.0
    else:
        raise AssertionError(method)
    y = xh @ wh.T + b
    if cols.numel():
        y = y + x[:, cols] @ w[:, cols].T
    return y


@st.composite
def layers(draw):
    m = draw(st.integers(1, 9))
    k = draw(st.integers(1, 24))
    n = draw(st.integers(1, 9))
    scale = draw(st.sampled_from([1e-3, 0.1, 1.0, 3.0]))
    outliers = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen, dtype=F64) * scale
    if outliers:
        col = int(torch.randint(k, (1,), generator=gen))
        x[:, col] = torch.empty(m, dtype=F64).uniform_(7.0, 60.0, generator=gen) * -1
    w = torch.randn(n, k, generator=gen, dtype=F64) * draw(st.sampled_from([0.01, 0.3, 2.0]))
    b = torch.randn(n, generator=gen, dtype=F64) * 0.1
    # bf16-representable inputs, as a layer's are
    return x.bfloat16(), w.bfloat16(), b.bfloat16()


@settings(max_examples=60, deadline=None)
@given(layers(), st.sampled_from(ACCURACY_VARIANTS))
def test_variant_matches_independent_float64(layer, method):
    x, w, b = layer
    got = quant.variant_forward(method, x, w, b, CFG)
    want = reference(method, x, w, b)
    assert got.dtype == F64 and got.shape == want.shape
    # Same codes: only float64 summation order differs.
    scale = (x.double().abs() @ w.double().abs().T).max().item() + 1.0
    assert torch.allclose(got, want, rtol=0, atol=1e-12 * scale), (got - want).abs().max()


@settings(max_examples=30, deadline=None)
@given(layers(), st.sampled_from(ACCURACY_VARIANTS), st.integers(0, 2**31 - 1))
def test_sampled_outputs_are_the_full_products_entries(layer, method, seed):
    """Computing only some output rows / columns gives exactly those entries of the full
    product: the per-tensor statistics still come from all of x and w."""
    x, w, b = layer
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(x.shape[0], generator=gen)[: max(1, x.shape[0] // 2)]
    cols = torch.randperm(w.shape[0], generator=gen)[: max(1, w.shape[0] // 2)]
    full = quant.variant_forward(method, x, w, b, CFG)
    part = quant.variant_forward(method, x, w, b, CFG, x_rows=rows, w_rows=cols)
    assert torch.allclose(part, full[rows][:, cols], rtol=1e-12, atol=1e-300)


@settings(max_examples=40, deadline=None)
@given(layers())
def test_smoothing_leaves_the_float_product_unchanged(layer):
    x, w, _ = layer
    s = quant.smoothing_factors(x, w)
    assert s.shape == (x.shape[1],) and bool((s > 0).all()) and bool(torch.isfinite(s).all())
    before = x.double() @ w.double().T
    after = (x.double() / s) @ (w.double() * s).T
    tol = 1e-12 * ((x.double().abs() @ w.double().abs().T).max().item() + 1e-300)
    assert torch.allclose(after, before, rtol=0, atol=tol)


def test_smoothing_balances_an_outlier_dim():
    """alpha = 0.5: after smoothing, dim j's activation and weight maxima are equal."""
    x = torch.tensor([[1.0, 60.0], [-2.0, 30.0]])
    w = torch.tensor([[0.5, 0.1], [-0.25, 0.2]])
    s = quant.smoothing_factors(x, w)
    assert torch.allclose((x.double() / s).abs().amax(0), (w.double() * s).abs().amax(0))


def test_fp8_codes_are_e4m3_values_and_the_row_max_is_448():
    x = torch.tensor([[1.0, -0.3, 0.0171, 5.0], [0.0, 0.0, 0.0, 0.0]])
    q, amax = quant.quantize_fp8_rowwise(x)
    assert q.dtype == torch.float8_e4m3fn
    assert amax.tolist() == [5.0, 0.0]
    assert q.float()[0, 3].item() == 448.0 and q.float()[1].abs().sum().item() == 0.0
    assert torch.equal(q.double()[0], _e4m3(x[0].double() * (448.0 / 5.0)))


def test_fp8_codes_of_float64_are_rounded_once():
    """Just past a tie (1.0625, halfway between 1 and 1.125) a float64 value rounds up; torch's
    own float64 -> float8 conversion goes through float32, which lands on the tie and rounds to
    even (1.0). Ties themselves still go to even."""
    x = torch.tensor([[1.0625 + 2**-40, -1.0625, 1.1875, 448.0]], dtype=torch.float64)
    q, _ = quant.quantize_fp8_rowwise(x, torch.float64)
    assert q.double()[0].tolist() == [1.125, -1.0, 1.25, 448.0]
    assert torch.equal(q.double()[0], _e4m3(x[0]))


def test_decomposed_variants_are_exact_on_the_outlier_dims():
    """A layer whose only non-zero activations are outliers is computed in 16-bit: no error."""
    x = torch.zeros(3, 4, dtype=torch.bfloat16)
    x[:, 2] = torch.tensor([-40.0, 12.0, 7.5])
    w = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)).bfloat16()
    exact = oracle.exact(x, w)
    for method in ("rowwise_decomp", "zeropoint_llm_int8"):
        assert torch.allclose(quant.variant_forward(method, x, w, None, CFG), exact, atol=1e-12)
    plain = quant.variant_forward("rowwise", x, w, None, CFG)
    assert not torch.allclose(plain, exact, atol=1e-6)


def test_oracle_emulates_every_variant_and_rejects_unknown_names():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).bfloat16()
    w = torch.randn(3, 8, generator=torch.Generator().manual_seed(3)).bfloat16()
    for method in ACCURACY_VARIANTS:
        y = oracle.emulate(Problem(method, x, w, None, CFG))
        assert y.shape == (4, 3) and oracle.rel_frobenius(y, oracle.exact(x, w)) < 0.05
    with pytest.raises(ValueError, match="no accuracy variant"):
        quant.variant_forward("int8_raw", x, w, None, CFG)


@settings(max_examples=30, deadline=None)
@given(layers(), st.sampled_from(["absmax_torch", "vectorwise", "llm_int8"]))
def test_timed_methods_sampled_equal_the_oracle(layer, method):
    """Table 1's rows that are also timed methods: the study's sampled path computes exactly
    what the oracle's emulation (the timed rows' reference) computes."""
    x, w, b = layer
    kept = quant.outlier_columns(x, CFG.alpha, CFG.outlier_cmp)
    want = oracle.emulate(Problem(method, x, w, b, CFG, kept_rows=kept))
    rows, cols = torch.arange(0, x.shape[0], 2), torch.arange(w.shape[0] - 1, -1, -1)
    got = quant.variant_forward(method, x, w, b, CFG, x_rows=rows, w_rows=cols)
    assert torch.allclose(got, want[rows][:, cols], rtol=1e-12, atol=1e-12)
