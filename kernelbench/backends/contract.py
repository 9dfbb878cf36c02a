"""The backend contract as plain functions: what every backend must do, checked against the
float64 oracle. ``kernelbench check-backend NAME`` runs them and prints a table; the sweep runs
them on a third-party backend before its first row; the test suite holds the built-in backends
to the same tolerance (:func:`oracle_tolerance`).

Each contract is a function ``(backend, device, generator) -> None`` that raises
:class:`ContractFailure` with what went wrong, or :class:`NotApplicable` when the backend does
not claim what it checks (no ``int8_raw``, no exact int8 product). Any other exception is a
failure too, named by its type.

Tolerance comes from what the backend declares (:class:`~kernelbench.backends.base.Numerics`):
``reference`` backends are held element-wise to :func:`oracle_tolerance` (with the 16-bit
roundings they declare), ``exact_int8`` ones to the exact integer product bit for bit; a
backend with a variant of its own (``reference=False``) to a relative Frobenius error of
:data:`VARIANT_REL_ERROR` against the exact layer.

Tolerance of ``oracle_tolerance``, element-wise for output ``(i, j)``, against
``oracle.emulate`` (float64 scales, exact integer product):

* output rounding: ``u * |ref|`` with ``u`` the unit roundoff of the output dtype
  (bf16 2^-8, fp16 2^-11, fp32 2^-24);
* fp32 arithmetic of the scales, the dequantization and the outlier product (``c`` terms):
  ``(c + 8) * 2^-24 * (|x| @ |w|.T + |bias|)``;
* quantization ties: ``x * (127 / absmax)`` in fp32 may round an element whose float64 value
  lies within 2^-15 of a half-integer to a neighbour; a flipped int8 element changes the output
  by at most ``absmax_x_i * absmax_w_j / 127``, counted per row (``N_i`` in ``x``, ``M_j`` in
  ``w``; ``X_i`` also covers outlier columns whose weights are reconstructed from int8);
* ``numerics.sixteen_bit_roundings = s``: ``s * u * (|x| @ |w|.T + |bias|)`` more;
* 16-bit baselines: input rounding ``2 * u16 * |x|@|w|.T`` when the inputs are cast, plus
  ``(k + 8) * 2^-24 * |x|@|w|.T`` accumulation.

The total is multiplied by ``(1 + u)`` for the final rounding of the error terms themselves.

``fp8_e4m3`` (:func:`kernelbench.quant.quantize_fp8_rowwise` on both operands, a float product
of the codes, times both row scales ``amax / 448``, + bias) rounds differently from int8: to the
e4m3 grid, whose spacing at ``|v|`` is ``2^(e - 3)`` for ``2^e <= |v|`` (3 mantissa bits,
``torch.finfo(torch.float8_e4m3fn).eps = 2^-3``) and ``2^-9`` below the smallest normal
``2^-6``. Against ``oracle.emulate`` (float64 scaling, the same codes but near ties):

* quantization ties: ``v = x * (448 / absmax)`` in float32 (two roundings) and the oracle's
  float64 value (converted to e4m3 through float32 by torch) round to different e4m3 neighbours
  only where ``v`` lies within :data:`FP8_NEAR_TIE` (relative) of a midpoint of the grid; such
  an element moves by one spacing times ``absmax / 448`` (``D_x``, ``D_w``, zero elsewhere),
  which moves the output by ``D_x @ (|w^| + D_w).T + |x^| @ D_w.T`` (``x^``, ``w^``: the
  oracle's dequantized operands);
* float32 arithmetic: the product of the codes (exact per term) summed over k, both scales,
  their products and the bias: ``(k + 8) * 2^-24 * ((|x^| + D_x) @ (|w^| + D_w).T + |bias|)``
  (float32 accumulation, as on the CPU; a GPU that accumulates fp8 products in fewer bits
  would fail it, and that is worth knowing);
* output rounding ``u * |ref|`` and the declared 16-bit roundings, as above.

A kernel that scales wrongly (no activation scale, reciprocal scales, one scale per tensor)
moves almost every element by an e4m3 rounding error, about ``2^-5`` relative, far beyond this.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernelbench import oracle, quant
from kernelbench.backends import freshness
from kernelbench.backends.base import Backend, Numerics, Runner
from kernelbench.core import ACCURACY_VARIANTS, ALL_METHODS
from kernelbench.quant import Problem, QuantConfig

F64 = torch.float64
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
NEAR_TIE = 2.0**-15
#: Relative distance to a midpoint of the e4m3 grid within which the float32 and float64
#: scalings of an fp8 operand may round to different neighbours (they differ by about 2^-23,
#: the oracle's conversion through float32 by 2^-24 more): 4x margin.
FP8_NEAR_TIE = 2.0**-20
#: Relative Frobenius error against the exact layer allowed to a backend with its own variant.
VARIANT_REL_ERROR = 0.05
INT8_METHODS = ("int8_raw", "vectorwise", "llm_int8")


class ContractFailure(AssertionError):
    """The backend broke a contract; the message says where and how."""


class NotApplicable(Exception):
    """The backend does not claim what this contract checks."""


# --- tolerance against the oracle -----------------------------------------------------------


def _near_ties(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per-row count of elements whose float64 quantized value is within NEAR_TIE of x.5."""
    amax = amax.to(F64)
    v = t.to(F64) * torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, 1.0), 0.0)
    frac = v - torch.floor(v)
    return ((frac - 0.5).abs() <= NEAR_TIE).sum(dim=1).to(F64)


def fp8_spacing(v: torch.Tensor) -> torch.Tensor:
    """The spacing of the e4m3 grid at ``|v|`` (float64): ``2^(e - 3)`` for ``2^e <= |v| <
    2^(e + 1)``, ``2^-9`` below the smallest normal ``2^-6`` (from ``torch.finfo``)."""
    fi = torch.finfo(torch.float8_e4m3fn)
    _, exp = torch.frexp(v.to(F64).abs().clamp(min=fi.tiny))  # |v| = m 2^exp, m in [0.5, 1)
    return fi.eps * torch.pow(2.0, (exp - 1).to(F64))


def fp8_tie_flips(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per element of ``t`` (rows scaled by ``448 / amax``): how far its dequantized fp8 value
    may move between a float32 and a float64 quantization, i.e. one grid spacing times
    ``amax / 448`` where the scaled value is within :data:`FP8_NEAR_TIE` of a midpoint of the
    e4m3 grid, else 0."""
    amax = amax.to(F64)[:, None]
    inv = torch.where(amax > 0, quant.FP8_E4M3_MAX / torch.where(amax > 0, amax, 1.0), 0.0)
    v = (t.to(F64) * inv).abs()
    spacing = fp8_spacing(v)
    units = v / spacing  # exact: a power-of-two division
    near = ((units - torch.floor(units)) - 0.5).abs() <= FP8_NEAR_TIE * units
    return torch.where(near, spacing * quant.fp8_scale(amax), 0.0)


def _fp8_tolerance(problem: Problem, ref: torch.Tensor, u: float, steps: int) -> torch.Tensor:
    """:func:`oracle_tolerance` of ``fp8_e4m3`` (the module docstring's derivation)."""
    x, w, bias = problem.x, problem.weight, problem.bias
    xq, ax = quant.quantize_fp8_rowwise(x, F64)
    wq, aw = quant.quantize_fp8_rowwise(w, F64)
    x_hat = xq.to(F64).abs() * quant.fp8_scale(ax)[:, None]
    w_hat = wq.to(F64).abs() * quant.fp8_scale(aw)[:, None]
    d_x, d_w = fp8_tie_flips(x, ax), fp8_tie_flips(w, aw)
    ties = d_x @ (w_hat + d_w).T + x_hat @ d_w.T
    mag = (x_hat + d_x) @ (w_hat + d_w).T
    if bias is not None:
        mag = mag + bias.to(F64).abs()
    k = x.shape[1]
    return u * ref.abs() + (1 + u) * (ties + (k + 8) * 2.0**-24 * mag + steps * u * mag)


def computed_problem(problem: Problem) -> Problem:
    """The problem a backend's kernels compute for ``problem``: ``smoothquant`` is the
    vector-wise kernel on the smoothed operands (:func:`kernelbench.quant.smoothed_operands`,
    each in its operand's dtype); every other method is itself."""
    if problem.method != "smoothquant":
        return problem
    _, xs, ws = quant.smoothed_operands(problem.x, problem.weight)
    return dataclasses.replace(problem, method="vectorwise", x=xs, weight=ws)


def oracle_tolerance(
    problem: Problem, ref: torch.Tensor | None = None, sixteen_bit_steps: int = 0
) -> torch.Tensor:
    """Element-wise bound on ``|backend - oracle.emulate|`` (see the module docstring); for
    ``smoothquant`` that of :func:`computed_problem` (``ref``, when given, is its oracle)."""
    problem = computed_problem(problem)
    method, x, w, bias = problem.method, problem.x, problem.weight, problem.bias
    if method in ACCURACY_VARIANTS and method != "fp8_e4m3":
        raise ValueError(
            f"no tolerance is derived for {method!r}: a backend timing it is held to its own "
            "variant (numerics.reference=False)"
        )
    u = UNIT_ROUNDOFF[torch.float32 if method == "fp32" else x.dtype]
    if ref is None:
        ref = oracle.emulate(problem)
    ref = ref.to(F64)
    if method == "fp8_e4m3":
        return _fp8_tolerance(problem, ref, u, sixteen_bit_steps)
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
    mcfg = problem.method_cfg
    pw = quant.prepare_weight(w, bias, mcfg, problem.method_kept_rows, compute_dtype=F64)
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
    not_kept = cols[~torch.isin(cols, pw.kept_rows)]
    x_i = torch.maximum(ax, x.to(F64)[:, not_kept].abs().amax(dim=1)) if not_kept.numel() else ax
    ties = (n_i[:, None] * ax[:, None] + m_j[None, :] * x_i[:, None]) * aw[None, :] / 127
    c = int(cols.numel())
    inter = sixteen_bit_steps * u * mag
    return u * ref.abs() + (1 + u) * (ties + (c + 8) * 2.0**-24 * mag + inter)


def assert_matches_oracle(
    y: torch.Tensor, problem: Problem, what: str = "", numerics: Numerics | None = None
) -> None:
    """``y``, the output of ``problem``, against the float64 oracle, held to what ``numerics``
    declares (the reference math with no 16-bit roundings when not given); raises
    :class:`ContractFailure`."""
    numerics = numerics or Numerics()
    # smoothquant: the backend's vector-wise kernel on the smoothed operands
    y, problem = y.cpu(), computed_problem(problem.cpu())
    method, x, w, bias = problem.method, problem.x, problem.weight, problem.bias
    ref = oracle.emulate(problem).to(F64)
    if tuple(y.shape) != tuple(ref.shape):
        raise ContractFailure(f"{what}: shape {tuple(y.shape)}, expected {tuple(ref.shape)}")
    if not numerics.reference and method != "int8_raw":
        err = oracle.rel_frobenius(y, oracle.exact(x, w, bias))
        if not err <= VARIANT_REL_ERROR:
            raise ContractFailure(
                f"{what}: relative Frobenius error {err:.3g} against the exact layer "
                f"> {VARIANT_REL_ERROR} (a backend with its own variant)"
            )
        return
    tol = oracle_tolerance(problem, ref=ref, sixteen_bit_steps=numerics.sixteen_bit_roundings)
    err = (y.to(F64) - ref).abs()
    bad = ~(err <= tol)  # NaN is bad
    if bad.any():
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ContractFailure(
            f"{what}: {int(bad.sum())} of {err.numel()} elements outside the oracle tolerance; "
            f"first at ({i}, {j}): got {float(y[i, j])}, oracle {float(ref[i, j])}, "
            f"|err| {float(err[i, j]):.3g} > tol {float(tol[i, j]):.3g}; "
            f"rel. Frobenius {oracle.rel_frobenius(y, ref):.3g}"
        )


# --- inputs ----------------------------------------------------------------------------------


def randn(gen, *shape, dtype=torch.bfloat16, scale=1.0) -> torch.Tensor:
    """Gaussian values with any exact zero replaced (contracts never run on zeros)."""
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
    dims = torch.randperm(k, generator=gen)[: min(n_outlier_dims, k)].sort().values
    for d in dims.tolist():
        pos = torch.rand(m, generator=gen) < share
        pos[int(torch.randint(m, (1,), generator=gen))] = True
        vals = lo + (hi - lo) * torch.rand(m, generator=gen)
        x[pos, d] = vals[pos]
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.to(dtype).contiguous(), dims


def supported_methods(backend: Backend, device, dtype=torch.bfloat16, m=8, k=8, n=8) -> list[str]:
    dev = torch.device(device)
    return [meth for meth in backend.methods if backend.supports(meth, dev, dtype, m, k, n)]


def _build(backend: Backend, problem: Problem) -> Runner:
    """The backend's own runner for ``problem`` (not the sweep's contract guard around it)."""
    runner = getattr(backend, "unchecked_runner", backend.runner)
    p = problem
    return runner(p.method, p.x, p.weight, p.bias, p.cfg, kept_rows=p.kept_rows)


def _run_checked(backend: Backend, problem: Problem, what: str = "") -> Runner:
    """Run ``problem`` and hold its output (dtype, shape, values) to the oracle."""
    method, x = problem.method, problem.x
    r = _build(backend, problem)
    y = r.run()
    if r.returns_int32 != (method == "int8_raw"):
        raise ContractFailure(f"{what}: returns_int32 is {r.returns_int32} for {method}")
    want = {"int8_raw": torch.int32, "fp32": torch.float32}.get(method, x.dtype)
    if method != "fp16" and y.dtype != want:
        raise ContractFailure(f"{what}: output dtype {y.dtype}, expected {want}")
    if method == "int8_raw" and not backend.numerics.reference:
        if r.operands is None:
            raise ContractFailure(f"{what}: an int8_raw runner must give its operands")
        exact = oracle.int_product(*(t.cpu() for t in r.operands))
        if not torch.equal(y.cpu().to(torch.int64), exact):
            raise ContractFailure(f"{what}: not the exact product of its own operands")
        return r
    assert_matches_oracle(y, problem, what, backend.numerics)
    return r


def _methods_or_skip(backend, device, wanted, dtype=torch.bfloat16, m=8, k=8, n=8) -> list[str]:
    methods = [m_ for m_ in supported_methods(backend, device, dtype, m, k, n) if m_ in wanted]
    if not methods:
        raise NotApplicable(f"runs none of {', '.join(wanted)} here")
    return methods


# --- the contracts ---------------------------------------------------------------------------

CFGS = (
    QuantConfig(),
    QuantConfig(outlier_cmp=">=", outlier_weights="int8"),
    QuantConfig(1.5, ">", "fp16"),
)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Shapes (m, k, n) with tails: sizes that are no multiple of any vector width or tile.
TAIL_SHAPES = ((1, 1, 1), (7, 3, 5), (13, 37, 19), (33, 129, 47), (5, 67, 17))


def check_declaration(backend: Backend, device, gen) -> None:
    """A name, known methods, declared numerics and verified devices, an Availability."""
    from kernelbench.backends.base import Availability

    if not isinstance(backend.name, str) or not backend.name.isidentifier():
        raise ContractFailure(f"name must be an identifier, got {backend.name!r}")
    unknown = [m for m in backend.methods if m not in ALL_METHODS]
    if not backend.methods or unknown:
        raise ContractFailure(
            f"methods must be a non-empty subset of ALL_METHODS; unknown {unknown}"
        )
    if not isinstance(backend.numerics, Numerics):
        raise ContractFailure(f"numerics must be a Numerics, got {type(backend.numerics).__name__}")
    if set(backend.verified) - {"cpu", "cuda"}:
        raise ContractFailure(f"verified names unknown devices: {sorted(backend.verified)}")
    if not isinstance(backend.availability(torch.device(device)), Availability):
        raise ContractFailure("availability() must return an Availability")


def check_methods(backend: Backend, device, gen) -> None:
    """Every method it runs, in bf16, fp16 and fp32, three outlier configurations."""
    for dtype in DTYPES:
        x, dims = outlier_activations(gen, 24, 72, n_outlier_dims=3, dtype=dtype)
        x[5] *= 0.01  # a small-magnitude token
        w, bias = randn(gen, 40, 72, dtype=dtype, scale=0.1), randn(gen, 40, dtype=dtype)
        x, w, bias, dims = (t.to(device) for t in (x, w, bias, dims))
        methods = supported_methods(backend, device, dtype, 24, 72, 40)
        for cfg in CFGS:
            for method in methods:
                for kept in (None, dims) if method == "llm_int8" else (None,):
                    what = f"{method} {str(dtype)[6:]} alpha={cfg.alpha}{cfg.outlier_cmp}"
                    _run_checked(backend, Problem(method, x, w, bias, cfg, kept), what)


def check_tails(backend: Backend, device, gen) -> None:
    """Shapes that are no multiple of any vector width or tile, down to 1 x 1 x 1."""
    for m, k, n in TAIL_SHAPES:
        methods = _methods_or_skip(backend, device, INT8_METHODS, torch.bfloat16, m, k, n)
        x, _ = outlier_activations(gen, m, k, n_outlier_dims=min(2, k))
        w, bias = randn(gen, n, k, scale=0.1), randn(gen, n)
        x, w, bias = x.to(device), w.to(device), bias.to(device)
        for method in methods:
            _run_checked(backend, Problem(method, x, w, bias), f"{method} {m}x{k}x{n}")


def check_int8_extremes(backend: Backend, device, gen) -> None:
    """The int8 GEMM is the exact integer product: +-127^2 everywhere, -128 in activations."""
    _methods_or_skip(backend, device, ("int8_raw",))
    if not backend.numerics.exact_int8:
        raise NotApplicable("does not declare an exact int8 product")
    cfg = QuantConfig()
    a = torch.full((5, 65), -127, dtype=torch.int8, device=device)
    a[0] = -128
    a[1, ::2] = 127
    signs = torch.ones(3, 65, dtype=torch.bfloat16, device=device)
    signs[2] = -1
    pw = backend.prepare_weight(signs, None, cfg)
    b = pw.int8_columns(torch.arange(65, device=device))
    got = backend.int8_matmul(a, pw)
    if got.dtype != torch.int32:
        raise ContractFailure(f"int8_matmul returns {got.dtype}, expected torch.int32")
    exact = oracle.int_product(a.cpu(), b.cpu())
    if not torch.equal(got.cpu().to(torch.int64), exact):
        bad = (got.cpu().to(torch.int64) != exact).nonzero()[0].tolist()
        raise ContractFailure(f"int8_matmul with -128 operands is not exact (first at {bad})")


def check_outliers(backend: Backend, device, gen) -> None:
    """llm_int8 finds the planted outlier dims and meets the oracle, with and without kept
    16-bit weight rows, with 16-bit and int8 outlier weights."""
    _methods_or_skip(backend, device, ("llm_int8",))
    x, dims = outlier_activations(gen, 40, 96, n_outlier_dims=5)
    w, bias = randn(gen, 24, 96, scale=0.1), randn(gen, 24)
    x, w, bias, dims = (t.to(device) for t in (x, w, bias, dims))
    for cfg in (QuantConfig(), QuantConfig(outlier_weights="int8")):
        for kept in (None, dims):
            what = f"llm_int8 weights={cfg.outlier_weights} kept={kept is not None}"
            r = _run_checked(backend, Problem("llm_int8", x, w, bias, cfg, kept), what)
            if r.outlier_cols != len(dims):
                raise ContractFailure(
                    f"{what}: {r.outlier_cols} outlier columns, {len(dims)} planted"
                )


def check_alpha(backend: Backend, device, gen) -> None:
    """A column whose largest magnitude is exactly alpha is an outlier under '>=' only;
    alpha 0 turns the decomposition off (llm_int8 is then vectorwise)."""
    _methods_or_skip(backend, device, ("llm_int8",))
    if not backend.numerics.reference:
        raise NotApplicable("declares an outlier test of its own (numerics.reference is False)")
    x, w, bias = randn(gen, 6, 24, scale=0.5), randn(gen, 10, 24), randn(gen, 10)
    x[:, 3] = 4.0  # exactly alpha
    x[1, 7] = -9.0  # beyond alpha either way
    x, w, bias = x.to(device), w.to(device), bias.to(device)
    for cmp, expected in ((">", 1), (">=", 2)):
        cfg = QuantConfig(4.0, cmp)
        r = _run_checked(backend, Problem("llm_int8", x, w, bias, cfg), f"alpha 4 {cmp}")
        if r.outlier_cols != expected:
            raise ContractFailure(
                f"alpha 4 {cmp}: {r.outlier_cols} outlier columns, not {expected}"
            )
        off = _build(backend, Problem("llm_int8", x, w, bias, QuantConfig(0.0, cmp)))
        if off.outlier_cols != 0:
            raise ContractFailure(f"alpha 0 {cmp}: {off.outlier_cols} outlier columns, not 0")
        if "vectorwise" in backend.methods:
            vec = _build(backend, Problem("vectorwise", x, w, bias, cfg)).run()
            if not torch.equal(off.run(), vec):
                raise ContractFailure(f"alpha 0 {cmp}: llm_int8 differs from vectorwise")


def check_zero_token(backend: Backend, device, gen) -> None:
    """An all-zero token gives exactly the bias (no 0/0 in its scale)."""
    methods = _methods_or_skip(backend, device, ("vectorwise", "llm_int8"))
    x, w, bias = randn(gen, 4, 16), randn(gen, 8, 16), randn(gen, 8)
    x[2] = 0
    x, w, bias = x.to(device), w.to(device), bias.to(device)
    for method in methods:
        y = _build(backend, Problem(method, x, w, bias, QuantConfig())).run()
        if not torch.isfinite(y).all() or not torch.equal(y[2], bias):
            raise ContractFailure(
                f"{method}: a zero token gives {y[2, :3].tolist()}..., not the bias"
            )


def check_bad_inputs(backend: Backend, device, gen) -> None:
    """Bad input is a ValueError or TypeError naming the problem, never a crash or a number."""
    method = _methods_or_skip(backend, device, INT8_METHODS)[0]
    w = randn(gen, 8, 16).to(device)
    nan = randn(gen, 4, 16)
    nan[1, 2] = float("nan")
    cases = {
        "k mismatch": randn(gen, 4, 15),
        "NaN in x": nan,
        "integer x": torch.ones(4, 16, dtype=torch.int32),
        "1-D x": randn(gen, 16),
    }
    for what, x in cases.items():
        try:
            _build(backend, Problem(method, x.to(device), w, None, QuantConfig())).run()
        except (ValueError, TypeError) as exc:
            if not str(exc):
                raise ContractFailure(f"{what}: {type(exc).__name__} without a message") from None
            continue
        except Exception as exc:  # noqa: BLE001 - the wrong kind of error is the finding
            raise ContractFailure(
                f"{what}: raised {type(exc).__name__} ({exc}), not ValueError/TypeError"
            ) from None
        raise ContractFailure(f"{what}: accepted (returned a result)")


def check_stages(backend: Backend, device, gen) -> None:
    """The runner's stages run, and repeated runs give the same result."""
    methods = _methods_or_skip(backend, device, INT8_METHODS)
    x, _ = outlier_activations(gen, 12, 40, n_outlier_dims=2)
    w = randn(gen, 10, 40).to(device)
    x = x.to(device)
    for method in methods:
        r = _build(backend, Problem(method, x, w, None, QuantConfig()))
        for stage in r.stages.values():
            stage()
        if not torch.equal(r.run(), r.run()):
            raise ContractFailure(f"{method}: two runs on the same inputs differ")


def check_follows_input(backend: Backend, device, gen) -> None:
    """Every method computes its output in the call: after its activations (``int8_raw``: its
    first int8 operand) are redrawn in place, its next output follows the new values (no output
    or quantization kept from build time)."""
    methods = _methods_or_skip(backend, device, ALL_METHODS, torch.bfloat16, 16, 64, 24)
    x0, dims = outlier_activations(gen, 16, 64, n_outlier_dims=2)
    w, bias = randn(gen, 24, 64, scale=0.1).to(device), randn(gen, 24).to(device)
    for method in methods:
        x = x0.clone().to(device)
        kept = dims.to(device) if method == "llm_int8" else None
        r = _build(backend, Problem(method, x, w, bias, QuantConfig(), kept_rows=kept))
        r.run()
        if r.returns_int32 and r.operands is None:
            raise ContractFailure(f"{method}: an int8_raw runner must give its operands")
        ops = {method: r.operands} if r.returns_int32 else {}
        spot = freshness.redraw_and_check(x, w, bias, [method], ops, gen)[0][method]
        try:
            spot.verify(r.run())
        except freshness.StaleOutput as exc:
            raise ContractFailure(f"{method}: {exc}") from None


@dataclass(frozen=True)
class Contract:
    name: str
    check: Callable[[Backend, torch.device, torch.Generator], None]

    @property
    def description(self) -> str:
        return " ".join((self.check.__doc__ or "").split())


CONTRACTS: tuple[Contract, ...] = (
    Contract("declaration", check_declaration),
    Contract("methods", check_methods),
    Contract("tails", check_tails),
    Contract("int8_extremes", check_int8_extremes),
    Contract("outliers", check_outliers),
    Contract("alpha", check_alpha),
    Contract("zero_token", check_zero_token),
    Contract("bad_inputs", check_bad_inputs),
    Contract("stages", check_stages),
    Contract("follows_input", check_follows_input),
)


@dataclass(frozen=True)
class ContractResult:
    name: str
    status: str  # "pass" | "fail" | "n/a"
    detail: str
    seconds: float


def run_contract(
    backend: Backend, device: str | torch.device = "cpu", seed: int = 0
) -> list[ContractResult]:
    """Every contract on ``backend`` and ``device``, each on fresh seeded inputs. A backend
    unavailable on ``device`` fails only the declaration with the reason."""
    device = torch.device(device)
    avail = backend.availability(device)
    if not avail:
        return [
            ContractResult("declaration", "fail", f"unavailable on {device}: {avail.reason}", 0)
        ]
    results = []
    for i, contract in enumerate(CONTRACTS):
        gen = torch.Generator().manual_seed(seed * 1000 + i)
        start = time.perf_counter()
        try:
            contract.check(backend, device, gen)
            status, detail = "pass", ""
        except NotApplicable as exc:
            status, detail = "n/a", str(exc)
        except ContractFailure as exc:
            status, detail = "fail", str(exc)
        except Exception as exc:  # noqa: BLE001 - any error is a failed contract, reported
            status, detail = "fail", f"{type(exc).__name__}: {exc}"
        results.append(ContractResult(contract.name, status, detail, time.perf_counter() - start))
    return results
