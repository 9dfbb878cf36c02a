"""``torchao`` backend: PyTorch's own int8 dynamic-activation x int8-weight linear, eager.

Written against torchao 0.18.0 (``pip install --no-deps torchao==0.18.0``; no other
dependencies). The layer is an ``nn.Linear`` in the weight's dtype passed through
``quantize_(model, Int8DynamicActivationInt8WeightConfig())``: per-row (per-output-channel) int8
weights, per-token int8 activations quantized on every call, the int8 product by
``torch._int_mm`` (oneDNN on CPU, measured with ``torch.profiler``: ``aten::_int_mm`` is called),
then ``* x_scale`` (cast to the output dtype) ``* w_scale + bias``.

Methods: ``vectorwise`` (torchao has no outlier decomposition, and its bare int8 product is
``torch._int_mm``: the ``torch`` backend's ``int8_raw``) and, eager only, ``int8_weight_only``
(``Int8WeightOnlyConfig``: the same per-row int8 weights, 16-bit activations) and
``smoothquant`` (the same W8A8 layer built on the smoothed weight ``w * s``, folded offline, and
called on ``x / s``, computed in the timed call: :func:`kernelbench.quant.smoothed_operands`,
the convention of :meth:`Backend._smoothquant_runner`). The variant it computes
(``Runner.variant``), measured against :mod:`kernelbench.quant`:

* symmetric absmax, but the scale is ``absmax / 127.5`` (``(qmax - qmin) / 2`` for int8's
  [-128, 127]), **computed in the input's dtype** (bf16 here) and then stored as float32, and
  ``q = clamp(round(x * (1 / scale)), -128, 127)``: -128 can occur, unlike in the paper;
* the partial result ``acc * x_scale`` is rounded to the output dtype before ``* w_scale``.

Its cost on CPUs with AVX512-VNNI and no AMX (torch >= 2.12; torchao's
``_int_scaled_matmul_cpu``): the activations are shifted to uint8 for ``torch._int_mm`` and
``128 * w.sum(dim=0)`` is subtracted, **the sum computed on every call** over the whole int8
weight. Eager, through an int32 copy of the weight (4 bytes a weight of temporaries): on a 2-core
Zen 5, one token at d = 4096 (4096 x 16384) took 16.1 ms against 1.5 ms for ``torch._int_mm``
alone (hot, memory reused as the harness does; ``torch.profiler``: ``aten::sum`` and its
``_to_copy`` over the (4096, 16384) weight); at d = 12288 a 2.25 GB temporary and 82-84 ms a
call against 10-11 ms for ``_int_mm`` alone (the harness's sweep, one token). Compiled
(``torchao_compile``) the sum is fused and still runs every call: 2.9 ms at d = 4096 (1.2 ms of
it ``_int_mm``). Without VNNI (the AVX2 class) or with AMX it takes ``torch._int_mm`` on the
int8 activations, no sum.

``torchao_compile`` (:mod:`kernelbench.backends.torchao_compile`) is the same layer under
``torch.compile``.
"""

from __future__ import annotations

import time
import warnings
from functools import cache

import torch

from kernelbench import quant
from kernelbench.backends._peers import LazyImport, quietly
from kernelbench.backends.base import (
    OWN_VARIANT,
    SMOOTHQUANT_VARIANT,
    Availability,
    Backend,
    Runner,
    join_variants,
    shared_weight,
    torch_device_availability,
)
from kernelbench.checks import check_activation, check_weight

_TORCHAO = LazyImport("torchao")
#: The one warning compiling torchao's layer gives on every first call (torch 2.13).
_NO_STABLE_HASH = r"Int8Tensor does not implement _stable_hash_for_caching"

VARIANT = (
    "torchao Int8DynamicActivationInt8WeightConfig: per-token/per-channel symmetric int8, "
    "scale = absmax/127.5 in the input dtype, range [-128, 127], torch._int_mm, no decomposition"
)
WEIGHT_ONLY_VARIANT = (
    "torchao Int8WeightOnlyConfig: per-channel symmetric int8 weights, scale = absmax/127.5 in "
    "the weight dtype, range [-128, 127]; activations stay 16-bit"
)


@cache
def _smoke_test() -> tuple[str, str]:
    """('' when torchao's int8 linear runs with this torch on CPU, else the reason; what the
    test printed, warned or logged)."""
    return quietly(_smoke_test_reason)


def _smoke_test_reason() -> str:
    ao = _TORCHAO.load()
    if ao is None:
        return _TORCHAO.error
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        lin = torch.nn.Linear(32, 16).to(torch.bfloat16)
        quantize_(lin, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
        with torch.inference_mode():
            y = lin(torch.randn(4, 32, dtype=torch.bfloat16))
        if y.shape != (4, 16) or not torch.isfinite(y).all():
            return (
                f"torchao {ao.__version__} int8 linear: wrong result on torch {torch.__version__}"
            )
        return ""
    except Exception as exc:  # noqa: BLE001 - any failure: incompatible with this torch
        return (
            f"torchao {getattr(ao, '__version__', '?')} does not run with torch "
            f"{torch.__version__}: {type(exc).__name__}: {exc}"
        )


def quantized_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    set_inductor_config: bool,
    weight_only: bool = False,
):
    """An ``nn.Linear`` holding ``weight``/``bias`` (their dtype and device), quantized by
    torchao's int8 dynamic-activation int8-weight config (``weight_only``: its int8
    weight-only config), in eval mode."""
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    n, k = weight.shape
    # on the meta device, then given copies of weight and bias: initialising the parameters
    # (kaiming uniform over k x n) took 6 s per layer at 175B shapes on a 2-core CPU
    lin = torch.nn.Linear(k, n, bias=bias is not None, device="meta", dtype=weight.dtype)
    lin.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    if bias is not None:
        lin.bias = torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
    config = Int8WeightOnlyConfig if weight_only else Int8DynamicActivationInt8WeightConfig
    quantize_(lin, config(set_inductor_config=set_inductor_config))
    return lin.eval()


def weight_bytes(lin: torch.nn.Linear) -> int:
    w = lin.weight
    total = w.qdata.numel() * w.qdata.element_size() + w.scale.numel() * w.scale.element_size()
    if lin.bias is not None:
        total += lin.bias.numel() * lin.bias.element_size()
    return total


class TorchaoBackend(Backend):
    name = "torchao"
    library = "torchao"
    methods: tuple[str, ...] = ("vectorwise", "int8_weight_only", "smoothquant")
    numerics = OWN_VARIANT
    compile: bool = False
    verified = {
        "cpu": "reports/cpu-avx512vnni-2core (kept gpt3 run, torchao 0.18.0) and "
        "tests/test_peers.py"
    }

    @property
    def description(self) -> str:  # type: ignore[override]
        ao = _TORCHAO.load()
        version = ao.__version__ if ao is not None else "not installed"
        how = "torch.compile" if self.compile else "eager"
        return f"torchao {version} int8 dynamic activation x int8 weight ({how}); {VARIANT}"

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        reason, said = _smoke_test()
        detail = "\n".join(s for s in (_TORCHAO.output, said) if s)
        if reason:
            return Availability(False, reason, detail)
        avail = torch_device_availability(device)
        return Availability(avail.ok, avail.reason, detail)

    def runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        """``cfg`` and ``kept_rows`` are ignored: torchao has no outlier decomposition."""
        check_activation(x, weight)
        check_weight(weight, bias)
        if method not in self.methods:
            raise ValueError(f"backend {self.name!r} has no runner for method {method!r}")
        reason, _ = _smoke_test()
        if reason:
            raise RuntimeError(reason)
        weight_only = method == "int8_weight_only"
        variant = WEIGHT_ONLY_VARIANT if weight_only else VARIANT
        if method == "smoothquant":
            # s calibrated on the runner's own activations; w * s is this runner's weight
            s, _, w_smooth = quant.smoothed_operands(x, weight)
            lin = quantized_linear(w_smooth, bias, self.compile)
            del w_smooth
            variant = join_variants(variant, "SmoothQuant: " + SMOOTHQUANT_VARIANT)
        else:
            s = None
            lin = shared_weight(
                (weight, bias),
                (self.name, "quantized_linear", self.compile, weight_only),
                lambda: quantized_linear(weight, bias, self.compile, weight_only),
            )
        fn = lin
        compile_seconds = None
        if self.compile:
            fn = torch.compile(lin)
            t0 = time.perf_counter()
            with torch.inference_mode(), warnings.catch_warnings():
                # torch's AOT-autograd cache advises torchao's Int8Tensor to define a stable
                # hash (a key for its on-disk cache, not a result): not the person's to act on
                warnings.filterwarnings("ignore", _NO_STABLE_HASH, UserWarning)
                fn(x if x.shape[0] else x.new_ones((1, x.shape[1])))  # compiles, untimed
            if x.is_cuda:
                torch.cuda.synchronize()
            compile_seconds = time.perf_counter() - t0

        def run():
            if x.shape[0] == 0:  # torchao's Int8Tensor linear fails on zero tokens with a bias
                return torch.empty((0, weight.shape[0]), dtype=x.dtype, device=x.device)
            with torch.inference_mode():
                # SmoothQuant: x / s in the call, so the output follows the activations
                # (kernelbench.backends.freshness)
                return fn(x if s is None else x / s)

        nbytes = weight_bytes(lin) + (s.numel() * s.element_size() if s is not None else 0)
        return Runner(
            run=run,
            weight_bytes=nbytes,
            variant=join_variants(variant, "torch.compile" if self.compile else "eager"),
            compile_seconds=compile_seconds,  # the first (compiling) call, never timed
        )


BACKEND = TorchaoBackend()
