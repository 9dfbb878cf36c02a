"""Peer backends (bitsandbytes, torchao) against the float64 oracle, each with the tolerance its
own variant implies. Skipped per peer when it is not installed (``pip install ".[peers]"``)."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from kernelbench import oracle, quant
from kernelbench.backends import BrokenBackend, all_backends, get_backend
from kernelbench.core import STAGES
from kernelbench.quant import Problem, QuantConfig

ALPHA = 6.0
#: bf16 output rounding (relative Frobenius): ~2^-9 / sqrt(3) per element, with margin.
BF16_TOL = 4e-3


def _inputs(m=32, k=64, n=48, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.1).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


def _with_full_outlier_columns(x: torch.Tensor) -> torch.Tensor:
    """Outlier columns whose every entry is an outlier (there bitsandbytes' row scale, which
    leaves out outlier entries, equals ours, which leaves out outlier columns). Column 9 is
    exactly +-alpha: an outlier under '>=' (bitsandbytes) but not under '>' (the paper)."""
    x = x.clone()
    sign = torch.where(torch.arange(x.shape[0]) % 2 == 0, 1.0, -1.0)
    x[:, 5] = (sign * (ALPHA + 1.5 + torch.arange(x.shape[0]) / 8)).to(x.dtype)
    x[:, 9] = (sign * ALPHA).to(x.dtype)
    return x


@pytest.mark.parametrize(
    ("name", "package"),
    [("bitsandbytes", "bitsandbytes"), ("torchao", "torchao"), ("torchao_compile", "torchao")],
)
def test_peer_is_available_exactly_when_its_package_is(name, package):
    """A registered peer loads whether or not its package is installed; it is available on CPU
    when the package imports (and runs with this torch), else its reason names the package."""
    backend = all_backends()[name]
    assert not isinstance(backend, BrokenBackend), backend.availability("cpu").reason
    assert backend.name == name and backend.description
    avail = backend.availability(torch.device("cpu"))
    try:
        importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any import failure makes the peer unavailable
        assert not avail and package in avail.reason
        return
    assert avail or package in avail.reason, avail.reason


# --- bitsandbytes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bnb_backend():
    pytest.importorskip("bitsandbytes")
    backend = get_backend("bitsandbytes")
    assert backend.availability(torch.device("cpu")), backend.availability("cpu").reason
    return backend


def test_bnb_int8_raw_is_exact_on_its_operands(bnb_backend):
    x, w, b = _inputs()
    r = bnb_backend.runner("int8_raw", x, w, b, QuantConfig())
    assert r.returns_int32 and "int8_linear_matmul" in r.variant
    acc = r.run()
    pw = bnb_backend.prepare_weight(w, b, QuantConfig())
    qa = bnb_backend.quantize(x, pw, QuantConfig(0.0))
    assert torch.equal(acc.long(), oracle.int_product(qa.int8, pw.int8))
    # its operands are ours up to one unit (reciprocal-then-multiply rounding near ties)
    xq, x_amax = quant.quantize_rowwise(x)
    assert (qa.int8.int() - xq.int()).abs().max() <= 1
    assert torch.equal(qa.absmax, x_amax)


def test_bnb_vectorwise_matches_emulate(bnb_backend):
    x, w, b = _inputs(seed=1)
    r = bnb_backend.runner("vectorwise", x, w, b, QuantConfig(ALPHA))
    y = r.run()
    assert y.dtype == x.dtype and r.outlier_cols == 0
    ref = oracle.emulate(Problem("vectorwise", x, w, b, QuantConfig(ALPHA)))
    assert oracle.rel_frobenius(y, ref) < BF16_TOL


def test_bnb_llm_int8_is_the_ge_int8_variant(bnb_backend):
    x, w, b = _inputs(seed=2)
    x = _with_full_outlier_columns(x)
    # asked for the paper's variant: bitsandbytes computes its own (and says so)
    r = bnb_backend.runner("llm_int8", x, w, b, QuantConfig(ALPHA, ">", "fp16"))
    assert ">=" in r.variant and "from int8" in r.variant
    assert r.outlier_cols == 2  # column 9 (exactly alpha) counts under '>='
    y = r.run()
    ref_bnb = oracle.emulate(Problem("llm_int8", x, w, b, QuantConfig(ALPHA, ">=", "int8")))
    ref_paper = oracle.emulate(Problem("llm_int8", x, w, b, QuantConfig(ALPHA, ">", "fp16")))
    err_bnb = oracle.rel_frobenius(y, ref_bnb)
    assert err_bnb < BF16_TOL
    assert err_bnb < oracle.rel_frobenius(y, ref_paper) / 2


def test_bnb_stages_compose_to_run(bnb_backend):
    x, w, b = _inputs(seed=3)
    x = _with_full_outlier_columns(x)
    cfg = QuantConfig(ALPHA)
    r = bnb_backend.runner("llm_int8", x, w, b, cfg)
    assert set(r.stages) == set(STAGES)
    for stage in r.stages.values():
        stage()
    pw = bnb_backend.prepare_weight(w, b, cfg)
    y = bnb_backend.linear(x, pw, cfg)
    assert torch.equal(y, r.run())


def test_bnb_llm_int8_partial_outlier_columns_close_to_oracle(bnb_backend):
    """Outliers in a few entries only: bitsandbytes' row scale keeps the small entries of the
    outlier columns, so it is not bit-comparable to ours; its error stays of the same size."""
    x, w, b = _inputs(m=64, seed=4)
    x[3, 7], x[10, 20], x[40, 7] = 9.0, -7.5, 6.5
    cfg = QuantConfig(ALPHA, ">=", "int8")
    y = bnb_backend.runner("llm_int8", x, w, b, cfg).run()
    exact = oracle.exact(x, w, b)
    emul = oracle.rel_frobenius(oracle.emulate(Problem("llm_int8", x, w, b, cfg)), exact)
    assert oracle.rel_frobenius(y, exact) < 1.5 * emul + BF16_TOL


# --- torchao ----------------------------------------------------------------------------------


def _torchao_emulate(x, w, b):
    """torchao's variant in float64: scale = absmax / 127.5 rounded to the input dtype, q in
    [-128, 127] (see kernelbench/backends/torchao.py)."""

    def q(t):
        s = (t.abs().amax(1, keepdim=True) / 127.5).to(t.dtype).double()
        return (t.double() * (1 / s)).round().clamp(-128, 127), s

    xq, xs = q(x)
    wq, ws = q(w)
    return (xq @ wq.T) * xs * ws.T + b.double()


@pytest.fixture(scope="module")
def torchao_backend():
    pytest.importorskip("torchao")
    backend = get_backend("torchao")
    avail = backend.availability(torch.device("cpu"))
    if not avail:
        pytest.skip(avail.reason)
    return backend


def test_torchao_vectorwise(torchao_backend):
    x, w, b = _inputs(seed=5)
    r = torchao_backend.runner("vectorwise", x, w, b, QuantConfig())
    assert "127.5" in r.variant
    y = r.run()
    assert y.dtype == x.dtype
    assert oracle.rel_frobenius(y, _torchao_emulate(x, w, b)) < BF16_TOL
    exact = oracle.exact(x, w, b)
    emul = oracle.rel_frobenius(
        oracle.emulate(Problem("vectorwise", x, w, b, QuantConfig())), exact
    )
    assert oracle.rel_frobenius(y, exact) < 1.5 * emul + BF16_TOL
    assert r.weight_bytes == w.numel() + w.shape[0] * 4 + b.numel() * 2


def test_torchao_rejects_other_methods(torchao_backend):
    x, w, b = _inputs()
    assert not torchao_backend.supports("llm_int8", torch.device("cpu"), x.dtype, 32, 64, 48)
    with pytest.raises(ValueError):
        torchao_backend.runner("llm_int8", x, w, b, QuantConfig())


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("KERNELBENCH_TEST_COMPILE") != "1",
    reason="torch.compile on CPU takes ~75 s cold here; set KERNELBENCH_TEST_COMPILE=1",
)
def test_torchao_compile(torchao_backend):
    x, w, b = _inputs(seed=6)
    r = get_backend("torchao_compile").runner("vectorwise", x, w, b, QuantConfig())
    assert r.compile_seconds > 0
    y = r.run()
    assert oracle.rel_frobenius(y, _torchao_emulate(x, w, b)) < BF16_TOL


def _smoothquant_inputs(seed: int):
    """:func:`_inputs` with two App. C-like outlier dims (-60..-40 on every token)."""
    x, w, b = _inputs(seed=seed)
    g = torch.Generator().manual_seed(seed)
    x[:, [5, 17]] = (-40 - 20 * torch.rand(x.shape[0], 2, generator=g)).to(x.dtype)
    return x, w, b


def test_torchao_smoothquant(torchao_backend):
    """SmoothQuant on torchao's W8A8 layer: built on ``w * s`` (folded offline), called on
    ``x / s``. It computes torchao's own variant on the smoothed operands; its error is of the
    size of the oracle's SmoothQuant (kernelbench.quant's math) and half its plain W8A8's or
    less where outlier dims are planted; the contract's check of a SmoothQuant row passes."""
    from kernelbench.backends.base import SMOOTHQUANT_VARIANT
    from kernelbench.backends.contract import assert_matches_oracle

    x, w, b = _smoothquant_inputs(seed=9)
    cfg = QuantConfig()
    r = torchao_backend.runner("smoothquant", x, w, b, cfg)
    assert "127.5" in r.variant and SMOOTHQUANT_VARIANT in r.variant and "eager" in r.variant
    y = r.run()
    assert y.dtype == x.dtype and y.shape == (x.shape[0], w.shape[0])
    s, xs, ws = quant.smoothed_operands(x, w)
    assert oracle.rel_frobenius(y, _torchao_emulate(xs, ws, b)) < BF16_TOL
    exact = oracle.exact(x, w, b)
    problem = Problem("smoothquant", x, w, b, cfg)
    oracle_err = oracle.rel_frobenius(oracle.emulate(problem), exact)
    err = oracle.rel_frobenius(y, exact)
    assert err < 1.5 * oracle_err + BF16_TOL
    plain = torchao_backend.runner("vectorwise", x, w, b, cfg).run()
    assert err < 0.5 * oracle.rel_frobenius(plain, exact)
    assert_matches_oracle(y, problem, "torchao smoothquant", torchao_backend.numerics)
    assert r.weight_bytes == w.numel() + w.shape[0] * 4 + b.numel() * 2 + s.numel() * 2


def test_torchao_smoothquant_output_follows_its_input(torchao_backend):
    """``x / s`` and torchao's activation quantization run in the call: after ``x`` is redrawn
    in place, the next output follows the new values; an output kept from build time does not
    pass the same check."""
    from kernelbench.backends import freshness

    x, w, b = _smoothquant_inputs(seed=10)
    r = torchao_backend.runner("smoothquant", x, w, b, QuantConfig())
    kept = r.run()
    gen = torch.Generator().manual_seed(0)
    spots, restore = freshness.redraw_and_check(x, w, b, ["sq"], {}, gen)
    spots["sq"].verify(r.run())
    with pytest.raises(freshness.StaleOutput):
        spots["sq"].verify(kept)
    restore()
    assert torch.equal(r.run(), kept)


def _torchao_weight_only_emulate(x, w, b):
    """torchao's int8 weight-only in float64: its per-row weight codes and scales (as in
    :func:`_torchao_emulate`), the activations as they are."""
    s = (w.abs().amax(1, keepdim=True) / 127.5).to(w.dtype).double()
    wq = (w.double() * (1 / s)).round().clamp(-128, 127)
    return x.double() @ (wq * s).T + b.double()


def test_torchao_int8_weight_only(torchao_backend):
    """W8A16: torchao's weight-only layer computes its own variant; with an outlier dim in the
    activations it is far closer to the exact layer than its W8A8 one (the activations keep
    16 bits, so the outlier costs the other dims of a token no precision)."""
    x, w, b = _inputs(seed=8)
    x[:, 5] = -50.0
    r = torchao_backend.runner("int8_weight_only", x, w, b, QuantConfig())
    assert "Int8WeightOnlyConfig" in r.variant
    y = r.run()
    assert y.dtype == x.dtype
    assert oracle.rel_frobenius(y, _torchao_weight_only_emulate(x, w, b)) < BF16_TOL
    exact = oracle.exact(x, w, b)
    w8a8 = torchao_backend.runner("vectorwise", x, w, b, QuantConfig()).run()
    assert oracle.rel_frobenius(y, exact) < 0.5 * oracle.rel_frobenius(w8a8, exact)
    assert r.weight_bytes == w.numel() + w.shape[0] * 4 + b.numel() * 2
    compiled = get_backend("torchao_compile")
    assert not compiled.supports("int8_weight_only", torch.device("cpu"), x.dtype, 32, 64, 48)
