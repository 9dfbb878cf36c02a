"""The backend contract on bad input: a clear :class:`InputError` naming the problem, on every
backend and every device it runs on (skipped with the backend's reason elsewhere)."""

from __future__ import annotations

import pytest
import torch

from kernelbench.checks import InputError, check_finite
from kernelbench.quant import QuantConfig

BF16 = torch.bfloat16
CFG = QuantConfig()


def methods(backend, methods_of, device):
    ms = methods_of(backend, device=device)
    if not ms:
        pytest.skip(f"{backend.name} runs no method on {device}")
    return ms


def expect_error(backend, ms, x, w, bias, match):
    for method in ms:
        with pytest.raises(InputError, match=match):
            backend.runner(method, x, w, bias, CFG).run()


def test_nan_inf_in_x_or_w(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    for bad in (float("nan"), float("inf"), float("-inf")):
        x, w = make_randn(4, 8), make_randn(6, 8)
        x[1, 2] = bad
        expect_error(backend, ms, x, w, None, r"x contains 1 NaN/Inf")
        x, w = make_randn(4, 8), make_randn(6, 8)
        w[0, 0] = bad
        expect_error(backend, ms, x, w, None, r"weight contains 1 NaN/Inf")
    bias = torch.full((6,), float("nan"), dtype=BF16, device=device)
    expect_error(backend, ms, make_randn(4, 8), make_randn(6, 8), bias, r"bias contains")


def test_m_zero_gives_empty_output(backend, methods_of, make_randn, device):
    """Documented (cpu_ext: 'any m >= 0'): zero tokens give an empty (0, n) output."""
    ms = methods(backend, methods_of, device)
    x = torch.empty(0, 8, dtype=BF16, device=device)
    for method in ms:
        y = backend.runner(method, x, make_randn(6, 8), make_randn(6), CFG).run()
        assert tuple(y.shape) == (0, 6), method


def test_shape_mismatch(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    expect_error(backend, ms, make_randn(4, 9), make_randn(6, 8), None, r"shape mismatch")
    expect_error(backend, ms, make_randn(8), make_randn(6, 8), None, r"x must be 2-D")


def test_one_d_weight(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    expect_error(backend, ms, make_randn(4, 8), make_randn(48), None, r"weight must be 2-D")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64])
def test_wrong_dtype(backend, methods_of, make_randn, device, dtype):
    ms = methods(backend, methods_of, device)
    x = make_randn(4, 8, dtype=torch.float32).mul(10).to(dtype)
    expect_error(backend, ms, x, make_randn(6, 8), None, r"x dtype must be one of")
    w = make_randn(6, 8, dtype=torch.float32).mul(10).to(dtype)
    expect_error(backend, ms, make_randn(4, 8), w, None, r"dtype (mismatch|must be one of)")


def test_dtype_mismatch(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    x = make_randn(4, 8, dtype=torch.float16)
    expect_error(backend, ms, x, make_randn(6, 8), None, r"dtype mismatch")


def test_non_contiguous(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    xt = make_randn(8, 4).T
    expect_error(backend, ms, xt, make_randn(6, 8), None, r"x must be contiguous")
    wt = make_randn(8, 6).T
    expect_error(backend, ms, make_randn(4, 8), wt, None, r"weight must be contiguous")


def test_bias_of_wrong_shape(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    for bias in (make_randn(5), make_randn(1, 6), make_randn(7)):
        expect_error(
            backend, ms, make_randn(4, 8), make_randn(6, 8), bias, r"bias must have shape \(6,\)"
        )


def test_empty_weight(backend, methods_of, make_randn, device):
    ms = methods(backend, methods_of, device)
    w = torch.empty(0, 8, dtype=BF16, device=device)
    expect_error(backend, ms, make_randn(4, 8), w, None, r"weight is empty")
    x = torch.empty(4, 0, dtype=BF16, device=device)
    w = torch.empty(6, 0, dtype=BF16, device=device)
    expect_error(backend, ms, x, w, None, r"no features|empty")


@pytest.mark.parametrize("k", [1, 3, 7, 65])
def test_any_k(own_backend, methods_of, check_oracle, make_randn, device, k):
    """Any K >= 1 works (odd K: the custom CPU kernel zero-pads its packed k pairs; CUDA GEMMs
    pad k and n to their multiples), within the oracle tolerance."""
    backend = own_backend
    x, w, bias = make_randn(5, k, scale=3.0), make_randn(9, k), make_randn(9)
    for method in methods_of(backend, BF16, 5, k, 9, device=device):
        y = backend.runner(method, x, w, bias, CFG).run()
        check_oracle(
            y, method, x, w, bias, CFG, what=f"{backend.name}/{method} k={k}", backend=backend
        )


def test_a_tensor_found_finite_is_checked_again_once_it_changes():
    w = torch.randn(4, 4)
    check_finite(w, "weight")
    check_finite(w, "weight")  # remembered: no second scan
    w[1, 2] = float("nan")  # an in-place change bumps the version counter
    with pytest.raises(InputError, match="weight contains 1 NaN/Inf"):
        check_finite(w, "weight")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_single_nan_or_infinity_is_found_in_every_float_dtype(dtype, bad):
    w = torch.randn(33, 65).to(dtype)
    check_finite(w, "weight")
    w[32, 64] = bad
    with pytest.raises(InputError, match="weight contains 1 NaN/Inf"):
        check_finite(w, "weight")
    w[32, 64] = 0.5
    w[0, 0] = bad
    with pytest.raises(InputError, match="weight contains 1 NaN/Inf"):
        check_finite(w, "weight")
