"""Shared fixtures: seeded random inputs, App. C-like outlier activations, the backend
parametrization, and the documented tolerance of a backend against the float64 oracle.

Tolerance (``oracle_tolerance``), element-wise for output ``(i, j)``, against
``oracle.emulate`` (float64 scales, exact integer product):

* output rounding: ``u * |ref|`` with ``u`` the unit roundoff of the output dtype
  (bf16 2^-8, fp16 2^-11, fp32 2^-24);
* fp32 arithmetic of the scales, the dequantization and the outlier product (``c`` terms):
  ``(c + 8) * 2^-24 * (|x| @ |w|.T + |bias|)``;
* quantization ties: the backends compute ``x * (127 / absmax)`` in fp32 (relative error
  <= 2^-23, i.e. <= 127 * 2^-23 < 2^-15 in quantized units), the oracle in float64. An element
  whose float64 value lies within 2^-15 of a half-integer ("near tie", frequent with bf16 inputs,
  where ``x / absmax * 127`` is often an exact half-integer) may round to a neighbour. A flipped
  int8 element changes the integer product by at most 127, so the output by at most
  ``absmax_x_i * absmax_w_j / 127``. With ``N_i`` near ties in row ``i`` of ``x`` and ``M_j`` in
  row ``j`` of ``w``: ``(N_i * ax_i + M_j * X_i) * aw_j / 127``, where ``X_i`` is ``ax_i`` except
  for outlier columns whose weights are reconstructed from int8 (``int8`` mode, and ``fp16`` mode
  for dims not kept at prepare time), where a flipped weight is multiplied by the 16-bit
  outlier value (``X_i = max(ax_i, max_{l in O} |x_il|)``).
* a backend that declares ``numerics.sixteen_bit_roundings = s`` (rounding the int8 part, the
  outlier product or the bias sum to the 16-bit dtype, the paper's fig. 2):
  ``s * u * (|x| @ |w|.T + |bias|)`` more.
* 16-bit baselines (``fp16`` is bf16 on CPU): input rounding ``2 * u16 * |x|@|w|.T`` when the
  inputs are cast, plus ``(k + 8) * 2^-24 * |x|@|w|.T`` accumulation.

The total is multiplied by ``(1 + u)`` for the final rounding of the error terms themselves.
"""

from __future__ import annotations

import pytest
import torch

from kernelbench import oracle, quant
from kernelbench.backends import Backend, all_backends, get_backend
from kernelbench.cases import load_case
from kernelbench.core import SkipKind, work_bytes, work_flops
from kernelbench.quant import QuantConfig, method_config
from kernelbench.results import ResultRow

F64 = torch.float64
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
NEAR_TIE = 2.0**-15


# --- random inputs -------------------------------------------------------------------------


@pytest.fixture
def gen(request) -> torch.Generator:
    """A fresh generator per test, seeded from the test's name (reproducible, never shared)."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**31)
    return torch.Generator().manual_seed(seed)


def randn(gen, *shape, dtype=torch.bfloat16, scale=1.0) -> torch.Tensor:
    """Gaussian values with any exact zero replaced (tests never run on zeros)."""
    t = torch.randn(*shape, generator=gen) * scale
    t = torch.where(t == 0, torch.full_like(t, 0.5 * scale), t)
    return t.to(dtype).contiguous()


def outlier_activations(
    gen,
    m: int,
    k: int,
    n_outlier_dims: int = 6,
    share: float = 0.25,
    lo: float = -60.0,
    hi: float = -40.0,
    dtype=torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """App. C-like activations: N(0, 1) columns plus ``n_outlier_dims`` feature dimensions whose
    values on a ``share`` of the positions (at least one) are one-sided outliers in [lo, hi]
    (the 6.7B/13B quartiles of app. C are -44..-35 and -63..-45). Returns (x, outlier dims)."""
    x = torch.randn(m, k, generator=gen)
    dims = torch.randperm(k, generator=gen)[:n_outlier_dims].sort().values
    for d in dims.tolist():
        pos = torch.rand(m, generator=gen) < share
        pos[int(torch.randint(m, (1,), generator=gen))] = True
        vals = lo + (hi - lo) * torch.rand(m, generator=gen)
        x[pos, d] = vals[pos]
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(dtype).contiguous(), dims


@pytest.fixture
def make_randn(gen, device):
    """Seeded Gaussian inputs on the test's device (see :func:`device`)."""
    return lambda *shape, **kw: randn(gen, *shape, **kw).to(device)


@pytest.fixture
def make_outliers(gen, device):
    def make(m, k, **kw):
        x, dims = outlier_activations(gen, m, k, **kw)
        return x.to(device), dims.to(device)

    return make


# --- backends ------------------------------------------------------------------------------


#: The devices every backend-contract test runs on; one that a backend cannot use here is a
#: skipped test with the backend's reason (on a GPU machine the same tests run on ``cuda``).
DEVICES = ("cpu", "cuda")


def _backend_params(select=lambda backend: True):
    params = []
    for name, backend in all_backends().items():
        if not select(backend):
            continue
        for device in DEVICES:
            avail = backend.availability(torch.device(device))
            marks = () if avail else (pytest.mark.skip(reason=f"{name}: {avail.reason}"),)
            params.append(pytest.param((name, device), id=f"{name}-{device}", marks=marks))
    return params


@pytest.fixture(params=_backend_params())
def backend_on(request):
    """(backend, device) for every registered backend on every device; skipped with the
    backend's availability reason where it cannot run."""
    name, device = request.param
    return all_backends()[name], torch.device(device)


@pytest.fixture(params=_backend_params(lambda b: b.numerics.reference))
def own_backend_on(request):
    """Like :func:`backend_on`, for the backends that declare :mod:`kernelbench.quant`'s math
    (``numerics.reference``): held to the oracle tolerance. Peers with a variant of their own
    have their own tests."""
    name, device = request.param
    return all_backends()[name], torch.device(device)


@pytest.fixture
def backend(backend_on):
    return backend_on[0]


@pytest.fixture
def own_backend(own_backend_on):
    return own_backend_on[0]


@pytest.fixture
def device(request) -> torch.device:
    """The device of the test's backend parameter (CPU for tests without one)."""
    for name in ("backend_on", "own_backend_on"):
        if name in request.fixturenames:
            return request.getfixturevalue(name)[1]
    return torch.device("cpu")


def supported_methods(backend, dtype=torch.bfloat16, m=8, k=8, n=8, device="cpu") -> list[str]:
    dev = torch.device(device)
    return [meth for meth in backend.methods if backend.supports(meth, dev, dtype, m, k, n)]


# --- tolerance against the oracle -----------------------------------------------------------


def _near_ties(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per-row count of elements whose float64 quantized value is within NEAR_TIE of x.5."""
    amax = amax.to(F64)
    v = t.to(F64) * torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    frac = v - torch.floor(v)
    return ((frac - 0.5).abs() <= NEAR_TIE).sum(dim=1).to(F64)


def oracle_tolerance(
    method: str,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: QuantConfig,
    kept_rows: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
    sixteen_bit_steps: int = 0,
) -> torch.Tensor:
    """Element-wise bound on ``|backend - oracle.emulate|`` (see the module docstring)."""
    u = UNIT_ROUNDOFF[torch.float32 if method == "fp32" else x.dtype]
    if ref is None:
        ref = oracle.emulate(method, x, w, bias, cfg, kept_rows)
    ref = ref.to(F64)
    xa, wa = x.to(F64).abs(), w.to(F64).abs()
    mag = xa @ wa.T
    if bias is not None:
        mag = mag + bias.to(F64).abs()
    k = x.shape[1]
    if method in ("fp32", "fp16"):
        dt16 = torch.float32 if method == "fp32" else torch.bfloat16
        u_out = UNIT_ROUNDOFF[dt16]
        cast = 2 * u_out if x.dtype != dt16 or w.dtype != dt16 else 0.0
        return u_out * ref.abs() + (1 + u_out) * (cast + (k + 8) * 2.0**-24) * mag
    if method in ("absmax_torch", "vectorwise_torch"):
        scheme = quant.quantize_tensorwise if method == "absmax_torch" else quant.quantize_rowwise
        _, ax = scheme(x, F64)
        _, aw = scheme(w, F64)
        ax = ax.expand(x.shape[0]) if ax.dim() == 0 else ax
        aw = aw.expand(w.shape[0]) if aw.dim() == 0 else aw
        n_i = _near_ties(x, ax[:, None].expand(-1, k))
        m_j = _near_ties(w, aw[:, None].expand(-1, k))
        ties = (n_i[:, None] * ax[:, None] + m_j[None, :] * ax[:, None]) * aw[None, :] / 127
        return u * ref.abs() + (1 + u) * (ties + 8 * 2.0**-24 * mag)
    mcfg = method_config(method, cfg)
    pw = quant.prepare_weight(
        w, bias, mcfg, kept_rows if method == "llm_int8" else None, compute_dtype=F64
    )
    cols = quant.decomposition_columns(x, pw, mcfg)
    qa = quant.quantize_activation(x, cols, F64)
    regular = x.to(F64).clone()
    regular[:, cols] = 0
    w_regular = w.to(F64).clone()
    w_regular[:, pw.kept_rows] = 0
    ax, aw = qa.absmax.to(F64), pw.absmax.to(F64)
    n_i = _near_ties(regular, ax[:, None])
    m_j = _near_ties(w_regular, aw[:, None])
    if method == "int8_raw":
        # Integer units: a flip changes the product by at most 127 per flipped element.
        return 127.0 * (n_i[:, None] + m_j[None, :])
    # outlier columns without kept 16-bit rows use int8-reconstructed weights (the "int8" mode,
    # and the "fp16" mode for dims not kept at prepare time): a weight flip there is multiplied
    # by the 16-bit outlier value
    not_kept = cols[~torch.isin(cols, pw.kept_rows)]
    x_i = torch.maximum(ax, x.to(F64)[:, not_kept].abs().amax(dim=1)) if not_kept.numel() else ax
    ties = (n_i[:, None] * ax[:, None] + m_j[None, :] * x_i[:, None]) * aw[None, :] / 127
    c = int(cols.numel())
    inter = sixteen_bit_steps * u * mag
    return u * ref.abs() + (1 + u) * (ties + (c + 8) * 2.0**-24 * mag + inter)


def assert_matches_oracle(
    y, method, x, w, bias, cfg, kept_rows=None, what="", backend: str | Backend | None = None
):
    """``|y - oracle.emulate| <= oracle_tolerance`` element-wise, with a useful message; the
    16-bit roundings allowed are those ``backend`` declares (none when not given)."""
    y, x, w = y.cpu(), x.cpu(), w.cpu()
    bias = bias.cpu() if bias is not None else None
    kept_rows = kept_rows.cpu() if kept_rows is not None else None
    ref = oracle.emulate(method, x, w, bias, cfg, kept_rows).to(F64)
    if isinstance(backend, str):
        backend = get_backend(backend)
    steps = backend.numerics.sixteen_bit_roundings if backend is not None else 0
    tol = oracle_tolerance(method, x, w, bias, cfg, kept_rows, ref=ref, sixteen_bit_steps=steps)
    assert y.shape == ref.shape, f"{what}: shape {tuple(y.shape)} != {tuple(ref.shape)}"
    err = (y.to(F64) - ref).abs()
    bad = err > tol
    if bad.any():
        i, j = (int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.numel()} elements outside the oracle tolerance; "
            f"first at ({i}, {j}): got {float(y[i, j])}, oracle {float(ref[i, j])}, "
            f"|err| {float(err[i, j]):.3g} > tol {float(tol[i, j]):.3g}; "
            f"rel. Frobenius {oracle.rel_frobenius(y, ref):.3g}"
        )


# --- helpers as fixtures (session-scoped: pure functions, usable inside hypothesis tests) ----


@pytest.fixture(scope="session")
def check_oracle():
    return assert_matches_oracle


@pytest.fixture(scope="session")
def tolerance():
    return oracle_tolerance


@pytest.fixture(scope="session")
def methods_of():
    return supported_methods


@pytest.fixture(scope="session")
def gen_randn():
    """``gen_randn(generator, *shape, dtype=..., scale=...)`` for tests that seed themselves."""
    return randn


@pytest.fixture(scope="session")
def gen_outliers():
    return outlier_activations


# --- result rows ---------------------------------------------------------------------------


def make_row(
    method: str = "llm_int8",
    backend: str = "custom",
    *,
    d_model: int = 768,
    layer: str = "ffn1",
    tokens: int = 8,
    status: str = "ok",
    **fields,
) -> ResultRow:
    """One result row of a real gpt3 cell (size, m, k, n, declared work from the case), on
    ``cpu-test-2core``. An ok row is timed (1 ms, its 16-bit baseline 1 ms, 20 samples) and
    has an error; a skipped row gets the skip kind ``unsupported``. ``fields`` override any of
    it (and set any other field)."""
    case = load_case("gpt3")
    k, n = case.shape(layer, d_model)
    row = dict(
        case="gpt3",
        size=case.size(d_model).name,
        d_model=d_model,
        layer=layer,
        tokens=tokens,
        m=tokens,
        k=k,
        n=n,
        dist="outliers",
        seed=0,
        backend=backend,
        method=method,
        device="cpu",
        device_class="cpu-test-2core",
        dtype="bfloat16",
        status=status,
        flops=work_flops(tokens, k, n),
        bytes=work_bytes(method, tokens, k, n),
    )
    if status == "ok":
        row |= dict(median_ms=1.0, baseline_ms=1.0, speedup=1.0, rel_spread=0.02, samples=20)
        row |= dict(rel_error=4e-3 if method == "fp16" else 1e-3)
    elif status == "skipped":
        row |= dict(skip_kind=SkipKind.UNSUPPORTED.value, reason="not supported here")
    row |= fields
    if "median_ms" in fields and status == "ok" and "speedup" not in fields:
        row["speedup"] = row["baseline_ms"] / row["median_ms"]
    return ResultRow(**row)


@pytest.fixture(scope="session")
def row_factory():
    """:func:`make_row` as a fixture: ``row_factory("fp16", "torch", median_ms=2.0)``."""
    return make_row
