"""The interface every backend implements: quantize -> decompose -> int8 product -> dequantize.

A backend is one module in :mod:`kernelbench.backends` exposing ``BACKEND``, an instance of a
:class:`Backend` subclass, and one line in the registry (:data:`kernelbench.backends.REGISTRY`).
The harness never imports a backend by name: it asks the registry.

Stages, each separately callable so the harness can time them. The defaults are the readable
reference of :mod:`kernelbench.quant` where one exists; a backend overrides the stages it runs
faster (per device) and is tested against the float64 oracle:

``prepare_weight``   offline: int8 weights, column scales, kept 16-bit rows, backend layouts
``quantize``         activations: outlier columns, row scales, int8 values, outlier values
``int8_matmul``      int8 x int8 -> int32
``outlier_product``  the 16-bit product of the outlier dims (eq. 8), or ``None``
``dequantize``       int32 x outer(scales) / 127^2 + bias + outlier product -> 16-bit
``linear``           the whole layer (a backend may fuse stages here)

:meth:`Backend.runner` turns a (method, inputs) pair into a :class:`Runner`: everything offline
is done there, and the runner holds zero-argument callables to time (tritonbench's pattern).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from kernelbench import quant
from kernelbench.checks import check_activation, check_weight
from kernelbench.core import ALL_METHODS, INT8_STAGE_METHODS, not_implemented_reason
from kernelbench.quant import (
    PreparedWeight,
    Problem,
    QuantConfig,
    QuantizedActivation,
    method_config,
)

__all__ = [
    "Availability",
    "Backend",
    "Numerics",
    "OWN_VARIANT",
    "Runner",
    "SMOOTHQUANT_VARIANT",
    "SharedWeights",
    "join_variants",
    "method_config",
    "shared_weight",
    "sharing_weights",
    "sixteen_bit_dtype",
    "stage_accumulator",
    "torch_device_availability",
]

#: The backend API this kernelbench provides. A backend declaring a newer one is not loaded
#: (it needs a newer kernelbench); one declaring an older one that is still listed in
#: :data:`SUPPORTED_API_VERSIONS` is.
API_VERSION = 1
SUPPORTED_API_VERSIONS = (1,)


T = TypeVar("T")
_Tensors = tuple[torch.Tensor | None, ...]


class SharedWeights:
    """Weights prepared once and shared by every runner built on the same weight tensors while
    this object is active (:func:`sharing_weights`): a sweep builds a runner per method and
    token count of a layer, and quantizing a 175B weight takes a 2-core CPU seconds each time.
    An entry is found only for the very tensors (same objects, unmodified) it was built from."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[_Tensors, tuple[int, ...], Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tensors: _Tensors, key: Hashable, build: Callable[[], T]) -> T:
        versions = tuple(t._version if t is not None else -1 for t in tensors)
        full = (tuple(id(t) for t in tensors), key)
        hit = self._entries.get(full)
        same = hit is not None and all(a is b for a, b in zip(hit[0], tensors, strict=True))
        if same and hit[1] == versions:
            return hit[2]
        value = build()
        self._entries[full] = (tensors, versions, value)
        return value

    def keep_only(self, used: Callable[[Any], bool]) -> None:
        """Let go of every entry whose value ``used`` says nothing needs any more."""
        for full in [k for k, (_, _, value) in self._entries.items() if not used(value)]:
            del self._entries[full]


_ACTIVE_SHARED: ContextVar[SharedWeights | None] = ContextVar("kernelbench_shared", default=None)


@contextmanager
def sharing_weights(shared: SharedWeights | None) -> Iterator[None]:
    """Runners built inside share prepared weights through ``shared`` (``None``: no sharing)."""
    token = _ACTIVE_SHARED.set(shared)
    try:
        yield
    finally:
        _ACTIVE_SHARED.reset(token)


def shared_weight(
    tensors: tuple[torch.Tensor | None, ...], key: Hashable, build: Callable[[], T]
) -> T:
    """``build()``, or what it returned for the same ``tensors`` and ``key`` while the active
    :class:`SharedWeights` lasts. ``key`` names everything else the result depends on (backend,
    layout, quantization settings); without an active one, this is ``build()``."""
    shared = _ACTIVE_SHARED.get()
    return build() if shared is None else shared.get(tensors, key, build)


@dataclass(frozen=True)
class Availability:
    """ "Can this run here?" with the reason when not (nvbench's ``state.skip(reason)``)."""

    ok: bool
    reason: str = ""
    #: What checking printed, warned or logged (a peer's import-time lines): kept for
    #: ``kernelbench list -v`` and ``env.json``, never printed on the terminal.
    detail: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> Availability:
        return cls(True, "")

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


def torch_device_availability(device: torch.device | str) -> Availability:
    """Whether plain torch ops run on ``device`` here (CPU always; CUDA with a CUDA torch and
    a GPU); backends made of torch ops (and peers built on them) start from this."""
    device = torch.device(device)
    if device.type == "cpu":
        return Availability.yes()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return Availability.no("torch has no CUDA device here (CPU build or no GPU)")
        return Availability.yes()
    return Availability.no(f"device type {device.type!r} is not supported")


def sixteen_bit_dtype(device: torch.device | str) -> torch.dtype:
    """The device's 16-bit baseline dtype: fp16 on CUDA, bf16 on CPU."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16


def stage_accumulator(m: int, n: int, k: int, device: torch.device) -> torch.Tensor:
    """A stand-in int32 product (m, n) for timing the dequantize stage alone.

    Dequantization does the same work whatever the values, so its stage is timed on random
    int32 values of a product's typical magnitude (127^2 sqrt(k)) instead of computing the
    real int8 product a second time, which at large shapes costs as much as the whole row.
    """
    bound = int(min(2**31 - 1, 127 * 127 * max(1, int(k**0.5))))
    gen = torch.Generator(device="cpu").manual_seed(m * 1_000_003 + n * 7919 + k)
    return torch.randint(-bound, bound, (m, n), generator=gen, dtype=torch.int32).to(device)


@dataclass(frozen=True)
class Numerics:
    """What a backend computes, as the contract tests hold it to the float64 oracle.

    ``reference``: the quantization math of :mod:`kernelbench.quant` (the oracle's), so its
    layer outputs are held to the oracle's derived tolerance; a backend with a variant of its
    own (a peer's outlier test, scale or rounding; ``Runner.variant`` says which) is not.
    ``exact_int8``: its int8 product is the exact integer product, -128 included.
    ``sixteen_bit_roundings``: how many intermediate results (the int8 part, the outlier
    product, the bias sum) it rounds to the layer's 16-bit dtype before the output (0: float32
    intermediates, one final rounding)."""

    reference: bool = True
    exact_int8: bool = True
    sixteen_bit_roundings: int = 0


#: A backend with a quantization variant of its own (a peer library).
OWN_VARIANT = Numerics(reference=False, exact_int8=False)


#: What a SmoothQuant runner computes beyond the vector-wise stages (``Runner.variant``).
SMOOTHQUANT_VARIANT = "x / s in the call, w * s folded offline (both in the layer dtype)"


def join_variants(*parts: str) -> str:
    """``Runner.variant`` of several notes (a method's, a padded shape's): the non-empty ones
    joined with ``"; "``, so a backend adding its own note keeps the method's."""
    return "; ".join(p for p in parts if p)


@dataclass
class Runner:
    """A method made ready on fixed inputs. ``run`` is what is timed; ``stages`` are the same
    work split up (inputs of each stage precomputed), for per-stage timing."""

    run: Callable[[], torch.Tensor]
    stages: dict[str, Callable[[], object]] = field(default_factory=dict)
    weight_bytes: int = 0
    outlier_cols: int = 0
    #: True when ``run`` returns the exact int32 product rather than the layer output.
    returns_int32: bool = False
    #: For int32 runners: the int8 operands (a (m, k), b (n, k)) whose exact product ``run``
    #: must equal.
    operands: tuple[torch.Tensor, torch.Tensor] | None = None
    #: What the backend actually computed when it differs from the asked-for configuration
    #: (a peer's own outlier test, weights or rounding), recorded with the row.
    variant: str = ""
    #: One-off compile time spent building ``run`` (outside every timed region), if any.
    compile_seconds: float | None = None


class Backend:
    """Base class: the readable default of every stage (:mod:`kernelbench.quant`'s reference).
    Subclasses implement :meth:`availability` and override the stages they run faster; the
    composite :meth:`linear` and the runners for ``INT8_STAGE_METHODS`` are written once here."""

    name: str = "?"
    description: str = ""
    #: Methods this backend can run at all (before device/dtype/shape checks). ``smoothquant``
    #: is its vector-wise kernel on smoothed operands (:meth:`runner`).
    methods: tuple[str, ...] = (*INT8_STAGE_METHODS, "smoothquant")
    #: Part of a sweep when ``--backends`` is not given. Off for backends whose one-off set-up
    #: (e.g. a minute of torch.compile per shape) would dominate a default sweep's time.
    in_default_sweep: bool = True
    #: Device type -> the evidence that this backend ran there and matched the float64 oracle
    #: (a kept report, a test run). A device type missing here is unverified: the code may
    #: compile and pass its tests elsewhere, but has never been seen to compute right there.
    verified: ClassVar[dict[str, str]] = {}
    #: What its results are held to against the float64 oracle.
    numerics: ClassVar[Numerics] = Numerics()
    #: The distribution whose code this backend measures (a peer such as ``"bitsandbytes"``);
    #: ``""`` for kernelbench's own code. ``kernelbench list`` shows that distribution's version.
    library: ClassVar[str] = ""

    def verification(self, device: torch.device | str) -> str:
        """``"verified: <evidence>"`` for ``device``'s type, or ``"unverified"``."""
        evidence = self.verified.get(torch.device(device).type)
        return f"verified: {evidence}" if evidence else "unverified"

    # --- availability ----------------------------------------------------------------------

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend can run on ``device`` at all."""
        raise NotImplementedError

    def supports(
        self, method: str, device: torch.device, dtype: torch.dtype, m: int, k: int, n: int
    ) -> Availability:
        """Whether ``method`` runs here for an (m x k) @ (k x n) layer in ``dtype``. Any method
        of ``ALL_METHODS`` is known (the accuracy study's variants too); one the backend does
        not implement is unsupported, with that reason."""
        if method not in ALL_METHODS:
            return Availability.no(f"unknown method {method!r}; known: {', '.join(ALL_METHODS)}")
        avail = self.availability(device)
        if not avail:
            return avail
        if method not in self.methods:
            return Availability.no(not_implemented_reason(self.name, method))
        return Availability.yes()

    # --- stages ----------------------------------------------------------------------------

    def prepare_weight(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        cfg: QuantConfig,
        kept_rows: torch.Tensor | None = None,
    ) -> PreparedWeight:
        check_weight(weight, bias)
        # one reference quantization per weight and config, whichever backends build on it
        # (custom packs it, torch multiplies it as is): 7 s each at 175B shapes on 2 cores
        return shared_weight(
            (weight, bias, kept_rows),
            ("quant.prepare_weight", cfg),
            lambda: quant.prepare_weight(weight, bias, cfg, kept_rows),
        )

    def quantize(
        self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig
    ) -> QuantizedActivation:
        """The set O of this call (``cfg``'s outlier test plus ``pw.kept_rows``), then the
        row-wise int8 quantization of ``x`` without those columns (the reference)."""
        return quant.quantize_activation(x, quant.decomposition_columns(x, pw, cfg))

    def int8_matmul(self, a: torch.Tensor, pw: PreparedWeight) -> torch.Tensor:
        """``a`` (m, k) int8 times the prepared weight's int8 (n, k), transposed: int32 (m, n).
        The reference is an exact int64 product (slow; devices with no int64 matmul, such as
        CUDA, need an override)."""
        b = pw.int8_columns(torch.arange(pw.in_features, device=a.device))
        return (a.long() @ b.long().T).to(torch.int32)

    def outlier_product(self, qa: QuantizedActivation, pw: PreparedWeight) -> torch.Tensor | None:
        return quant.outlier_product(qa, pw)

    def dequantize(
        self,
        acc: torch.Tensor,
        qa: QuantizedActivation,
        pw: PreparedWeight,
        outlier: torch.Tensor | None,
    ) -> torch.Tensor:
        return quant.dequantize(acc, qa, pw, outlier)

    def linear(self, x: torch.Tensor, pw: PreparedWeight, cfg: QuantConfig) -> torch.Tensor:
        """The whole layer through the stages; backends may override with a fused path."""
        qa = self.quantize(x, pw, cfg)
        acc = self.int8_matmul(qa.int8, pw)
        return self.dequantize(acc, qa, pw, self.outlier_product(qa, pw))

    # --- runners ---------------------------------------------------------------------------

    def build(self, problem: Problem) -> Runner:
        """The runner of ``problem``: :meth:`runner` on its fields (what the sweep and the
        contract call; a backend overrides :meth:`runner`)."""
        p = problem
        return self.runner(p.method, p.x, p.weight, p.bias, p.cfg, kept_rows=p.kept_rows)

    def runner(
        self,
        method: str,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        cfg: QuantConfig,
        kept_rows: torch.Tensor | None = None,
    ) -> Runner:
        """Prepare ``method`` on these inputs; ``kept_rows`` are the calibrated outlier dims
        whose 16-bit weights ``llm_int8`` keeps (ignored by other methods)."""
        check_activation(x, weight)
        if method == "smoothquant":
            return self._smoothquant_runner(x, weight, bias, cfg)
        mcfg = method_config(method, cfg)
        if method not in INT8_STAGE_METHODS:
            raise ValueError(f"backend {self.name!r} has no runner for method {method!r}")
        rows = kept_rows if method == "llm_int8" else None
        pw = shared_weight(
            (weight, bias, rows),
            (self.name, "prepare_weight", mcfg),
            lambda: self.prepare_weight(weight, bias, mcfg, rows),
        )
        qa = self.quantize(x, pw, mcfg)
        if method == "int8_raw":
            a = qa.int8
            return Runner(
                run=lambda: self.int8_matmul(a, pw),
                stages={"int8_matmul": lambda: self.int8_matmul(a, pw)},
                weight_bytes=pw.out_features * pw.in_features + pw.absmax.numel() * 4,
                outlier_cols=0,
                returns_int32=True,
                operands=(a, pw.int8_columns(torch.arange(pw.in_features, device=a.device))),
            )
        acc = stage_accumulator(x.shape[0], pw.out_features, pw.in_features, x.device)
        outl = self.outlier_product(qa, pw)
        stages: dict[str, Callable[[], object]] = {
            "quantize": lambda: self.quantize(x, pw, mcfg),
            "int8_matmul": lambda: self.int8_matmul(qa.int8, pw),
            "dequantize": lambda: self.dequantize(acc, qa, pw, outl),
        }
        if qa.outlier_cols.numel():
            stages["outlier_product"] = lambda: self.outlier_product(qa, pw)
        return Runner(
            run=lambda: self.linear(x, pw, mcfg),
            stages=stages,
            weight_bytes=pw.nbytes,
            outlier_cols=int(qa.outlier_cols.numel()),
        )

    def _smoothquant_runner(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: QuantConfig
    ) -> Runner:
        """SmoothQuant W8A8 on this backend's vector-wise stages: the smoothing factors ``s``
        calibrated on the activations the runner is built with, ``w * s`` prepared offline
        (:func:`quant.smoothed_operands`), and ``x / s`` computed in the timed call. A model
        folds that division into the previous layer's norm, so the timing is an upper bound by
        one element-wise pass over ``x``; computing it in the call keeps the output following
        the activations (:mod:`kernelbench.freshness`)."""
        check_weight(weight, bias)
        mcfg = cfg.without_decomposition()
        s, x_smooth, w_smooth = quant.smoothed_operands(x, weight)
        with sharing_weights(None):  # w * s is this runner's own: nothing to share, nor to hold
            pw = self.prepare_weight(w_smooth, bias, mcfg, None)
        del w_smooth
        qa = self.quantize(x_smooth, pw, mcfg)
        acc = stage_accumulator(x.shape[0], pw.out_features, pw.in_features, x.device)
        return Runner(
            run=lambda: self.linear(x / s, pw, mcfg),
            stages={
                "quantize": lambda: self.quantize(x / s, pw, mcfg),
                "int8_matmul": lambda: self.int8_matmul(qa.int8, pw),
                "dequantize": lambda: self.dequantize(acc, qa, pw, None),
            },
            weight_bytes=pw.nbytes + s.numel() * s.element_size(),
            variant=SMOOTHQUANT_VARIANT,
        )


class BrokenBackend(Backend):
    """Stands in for a listed backend that could not be loaded; never available."""

    def __init__(self, name: str, error: str) -> None:
        self.name = name
        self.error = error
        self.methods = ()

    def availability(self, device: torch.device) -> Availability:
        return Availability.no(f"backend {self.name!r} failed to load: {self.error}")
