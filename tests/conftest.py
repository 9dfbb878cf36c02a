"""Shared fixtures: seeded random inputs, App. C-like outlier activations, the backend
parametrization, and the documented tolerance of a backend against the float64 oracle.

Tolerance: :func:`kernelbench.backends.contract.oracle_tolerance` (derived and documented there; the
same bound ``kernelbench check-backend`` holds a third-party backend to).
"""

from __future__ import annotations

import pytest
import torch

from kernelbench.backends import Backend, all_backends, contract, get_backend
from kernelbench.backends.base import Numerics
from kernelbench.backends.contract import oracle_tolerance, outlier_activations, randn
from kernelbench.core import SkipKind, work_bytes, work_flops
from kernelbench.quant import Problem
from kernelbench.results.schema import ResultRow
from kernelbench.run.cases import load_case
from kernelbench.run.env import device_class
from kernelbench.run.peak import cache_path

# --- the device's peaks ----------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _no_peak_measurement(tmp_path_factory):
    """A run in a test must not measure this machine's peaks (``kernelbench peak`` takes
    minutes on some CPUs, and its figures depend on the machine): the tests use a cache of their
    own that knows no peak for the CPU, so their runs have no rooflines. Tests of rooflines
    give their peaks explicitly."""
    root = tmp_path_factory.mktemp("kernelbench-cache")
    path = cache_path(device_class(torch.device("cpu")), root)
    path.parent.mkdir(parents=True)
    path.write_text("{}", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERNELBENCH_CACHE", str(root))
        yield


@pytest.fixture(autouse=True)
def _no_wait_for_fast_cores(request):
    """Cold CPU timers in tests never wait for fast cores: on a busy machine the run's wait
    (up to ``core_wait_s`` before each call) would make the suite's time follow the load, and no
    test of rows or reports needs it. Tests of the wait itself are marked ``core_wait``."""
    if request.node.get_closest_marker("core_wait"):
        yield
        return
    from kernelbench.measure import timing
    from kernelbench.run import peak

    def never_waits(probe, max_wait_s):
        return timing.CoreGate(probe, 0.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing, "shared_core_gate", never_waits)
        patch.setattr(peak, "shared_core_gate", never_waits)
        yield


# --- random inputs -------------------------------------------------------------------------


@pytest.fixture
def gen(request) -> torch.Generator:
    """A fresh generator per test, seeded from the test's name (reproducible, never shared)."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**31)
    return torch.Generator().manual_seed(seed)


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
    """One parameter per backend and device; a ``cuda`` one carries the ``gpu`` mark, so
    ``pytest -m gpu`` selects the contract tests on the GPU."""
    params = []
    for name, backend in all_backends().items():
        if not select(backend):
            continue
        for device in DEVICES:
            avail = backend.availability(torch.device(device))
            marks = [pytest.mark.gpu] if device == "cuda" else []
            if not avail:
                marks.append(pytest.mark.skip(reason=f"{name}: {avail.reason}"))
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


def assert_matches_oracle(
    y, method, x, w, bias, cfg, kept_rows=None, what="", backend: str | Backend | None = None
):
    """``|y - oracle.emulate| <= oracle_tolerance`` element-wise, with a useful message; the
    16-bit roundings allowed are those ``backend`` declares (none when not given)."""
    if isinstance(backend, str):
        backend = get_backend(backend)
    steps = backend.numerics.sixteen_bit_roundings if backend is not None else 0
    numerics = Numerics(sixteen_bit_roundings=steps)
    problem = Problem(method, x, w, bias, cfg, kept_rows)
    contract.assert_matches_oracle(y, problem, what, numerics)


# --- helpers as fixtures (session-scoped: pure functions, usable inside hypothesis tests) ----


@pytest.fixture(scope="session")
def check_oracle():
    return assert_matches_oracle


def tolerance_of(method, x, w, bias, cfg, kept_rows=None, ref=None, sixteen_bit_steps=0):
    """:func:`oracle_tolerance` of the problem these arguments make."""
    problem = Problem(method, x, w, bias, cfg, kept_rows)
    return oracle_tolerance(problem, ref=ref, sixteen_bit_steps=sixteen_bit_steps)


@pytest.fixture(scope="session")
def tolerance():
    return tolerance_of


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
    case: str = "gpt3",
    d_model: int = 768,
    layer: str = "ffn1",
    tokens: int = 8,
    status: str = "ok",
    **fields,
) -> ResultRow:
    """One result row of a real cell of ``case`` (size, m, k, n, declared work from the case),
    on ``cpu-test-2core``. An ok row is timed (1 ms, its 16-bit baseline 1 ms, 20 samples) and
    has an error; a skipped row gets the skip kind ``unsupported``. ``fields`` override any of
    it (and set any other field)."""
    spec = load_case(case)
    k, n = spec.shape(layer, d_model)
    row = dict(case=case, size=spec.size(d_model).name, d_model=d_model, layer=layer)
    row |= dict(tokens=tokens, m=tokens, k=k, n=n, dist="outliers", seed=0, dtype="bfloat16")
    row |= dict(backend=backend, method=method, device="cpu", device_class="cpu-test-2core")
    row |= dict(status=status, flops=work_flops(tokens, k, n))
    row |= dict(bytes=work_bytes(method, tokens, k, n))
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
