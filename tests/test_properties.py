"""Property tests over shapes, dtypes, alpha and the outlier comparison: every backend that
declares the reference math and runs on CPU, against each other and the float64 oracle
(tolerance: conftest.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbench.backends import all_backends
from kernelbench.quant import QuantConfig

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def backends_here():
    cpu = torch.device("cpu")
    return [
        b
        for b in all_backends().values()
        if b.numerics.reference and b.numerics.exact_int8 and b.availability(cpu)
    ]


@st.composite
def cases(draw):
    m = draw(st.sampled_from([1, 2, 3, 17, 33, 70]))
    k = draw(st.sampled_from([1, 2, 5, 16, 31, 64, 69]))
    n = draw(st.sampled_from([1, 3, 8, 15, 47, 70]))
    return dict(
        m=m,
        k=k,
        n=n,
        dtype=draw(st.sampled_from(DTYPES)),
        alpha=draw(st.sampled_from([0.0, 1.5, 6.0])),
        cmp=draw(st.sampled_from([">", ">="])),
        wmode=draw(st.sampled_from(["fp16", "int8"])),
        kind=draw(st.sampled_from(["gauss", "outliers", "ties"])),
        bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make(c, gen_randn, gen_outliers):
    g = torch.Generator().manual_seed(c["seed"])
    m, k, n, dt = c["m"], c["k"], c["n"], c["dtype"]
    if c["kind"] == "outliers":
        x, _ = gen_outliers(g, m, k, n_outlier_dims=min(3, k), dtype=dt)
    elif c["kind"] == "ties":  # values at exactly +-alpha and on half-steps of the int8 grid
        q = torch.randint(-254, 255, (m, k), generator=g) / 2
        q[:, 0] = 127
        x = (q * 0.125).to(dt)
        x[0, -1] = 6.0 if k > 1 else x[0, -1]
    else:
        x = gen_randn(g, m, k, dtype=dt, scale=2.0)
    w = gen_randn(g, n, k, dtype=dt, scale=0.3)
    bias = gen_randn(g, n, dtype=dt) if c["bias"] else None
    return x, w, bias


@SETTINGS
@given(c=cases())
def test_reference_backends_and_oracle_agree(c, gen_randn, gen_outliers, check_oracle):
    backends = backends_here()
    if len(backends) < 2:
        pytest.skip("needs two reference backends on CPU")
    x, w, bias = make(c, gen_randn, gen_outliers)
    cfg = QuantConfig(c["alpha"], c["cmp"], c["wmode"])
    outs = {}
    for b in backends:
        for method in ("int8_raw", "llm_int8"):
            y = b.runner(method, x, w, bias, cfg).run()
            check_oracle(y, method, x, w, bias, cfg, what=f"{b.name}/{method} {c}", backend=b)
            outs[b.name, method] = y
        pw = b.prepare_weight(w, bias, cfg)
        qa = b.quantize(x, pw, cfg)
        outs[b.name, "q"] = (qa.int8, qa.absmax, qa.outlier_cols, qa.outlier_values)
    # the int8 product and the quantization are bit-identical between the backends; the layer
    # outputs differ at most by fp32 summation order, then one output rounding
    u = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-20}[c["dtype"]]
    scale = (x.double().abs() @ w.double().abs().T) + (
        bias.double().abs() if bias is not None else 0
    )
    first = backends[0].name
    yt = outs[first, "llm_int8"].double()
    bound = u * yt.abs() + (c["k"] + 8) * 2.0**-23 * scale
    for other in (b.name for b in backends[1:]):
        assert torch.equal(outs[first, "int8_raw"], outs[other, "int8_raw"]), (other, c)
        for mine, theirs in zip(outs[first, "q"], outs[other, "q"], strict=True):
            assert torch.equal(mine, theirs), (other, c)
        assert ((yt - outs[other, "llm_int8"].double()).abs() <= bound).all(), (other, c)
