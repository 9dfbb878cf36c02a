"""``bitsandbytes`` backend: the official LLM.int8() code, measured as its users get it.

Written against bitsandbytes 0.50.2 (``pip install --no-deps bitsandbytes==0.50.2``; it needs
``numpy`` and ``packaging``, nothing else besides torch). ``run`` is the path of its users:
``bnb.nn.Linear8bitLt(k, n, has_fp16_weights=False, threshold=alpha)`` moved to the device (which
quantizes the weights), in eval mode, called under ``torch.inference_mode()``. The per-stage
callables are the functional ops that layer calls: ``int8_vectorwise_quant`` (quantize + outlier
detection), ``int8_linear_matmul`` (int8 x int8 -> int32), ``int8_mm_dequant`` (+ bias) and the
outlier ``addmm``.

Methods: ``int8_raw`` (``int8_linear_matmul`` alone, on its own int8 operands), ``vectorwise``
(``threshold=0.0``, its default: no decomposition) and ``llm_int8`` (``threshold=cfg.alpha``).

The variant it computes (``Runner.variant`` says it per row; the oracle for it is
``oracle.emulate(Problem("llm_int8", ..., QuantConfig(alpha, ">=", "int8")))``):

* outlier test ``|x| >= alpha`` (the paper: ``>``), whatever ``cfg.outlier_cmp`` says;
* outlier weights dequantized from the int8 weights (the paper: 16-bit), whatever
  ``cfg.outlier_weights`` says; calibrated ``kept_rows`` are ignored (its outlier set is per call);
* activations are cast to float16 before quantization (exact for bf16/fp16 inputs in range);
* the row scale leaves out the outlier *entries* (``|x| >= alpha``), not whole outlier columns as
  :func:`kernelbench.quant.quantize_activation` does: a small value in an outlier column still
  counts in its row's absmax. The two agree when every entry of an outlier column is an outlier;
* scales are ``x * (127 / absmax)`` (reciprocal, then multiply): near rounding ties an int8
  value differs by one from our true division (measured: 51 of 131072 values of a randn input);
* the outlier product and the output are in the activation's dtype (bf16 on CPU here).

On CPU, measured (``torch.profiler`` on ``F.int8_linear_matmul``, bitsandbytes 0.50.2, torch
2.13 CPU, an AVX2 machine): the "int8" product is **not an int8 kernel**: the int8 operands are
converted to float32, multiplied by ``aten::mm`` (fp32 sgemm) and cast back to int32 (its
"default" backend). It is exact while every partial sum stays below 2^24. bitsandbytes registers
a real CPU int8 kernel (``torch._int_mm``) only when torch reports AVX512;
:func:`cpu_int8_matmul_kind` reports which one this machine runs, and the description and
``Runner.variant`` carry it. Quantization and dequantization on CPU are plain torch ops.
"""

from __future__ import annotations

import logging
from functools import cache

import torch

from kernelbench.backends._peers import LazyImport
from kernelbench.backends.base import (
    OWN_VARIANT,
    Availability,
    Backend,
    Runner,
    shared_weight,
    stage_accumulator,
    torch_device_availability,
)
from kernelbench.checks import check_activation, check_weight
from kernelbench.quant import PreparedWeight, QuantConfig, QuantizedActivation, method_config

_BNB = LazyImport("bitsandbytes")

#: bitsandbytes logs this warning on every call with non-fp16 activations; we know (see above).
_CAST_WARNING = "MatMul8bitLt: inputs will be cast from"


class _DropCastWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_CAST_WARNING)


@cache
def _bnb():
    """The bitsandbytes module (``None`` when not importable), with its per-call cast warning
    filtered out of its own logger."""
    bnb = _BNB.load()
    if bnb is not None:
        logging.getLogger("bitsandbytes.autograd._functions").addFilter(_DropCastWarning())
    return bnb


@cache
def cpu_int8_matmul_kind() -> str:
    """Which implementation of ``bitsandbytes::int8_linear_matmul`` runs on CPU here."""
    if _bnb() is None:
        return "unavailable"
    if torch._C._dispatch_has_kernel_for_dispatch_key("bitsandbytes::int8_linear_matmul", "CPU"):
        return "int8 kernel (torch._int_mm)"
    return "float32 fallback (int8 -> fp32 mm -> int32)"


def _variant(method: str, device: torch.device) -> str:
    mm = cpu_int8_matmul_kind() if device.type == "cpu" else "CUDA kernels"
    if method == "int8_raw":
        return f"bitsandbytes int8_linear_matmul: {mm}"
    if method == "vectorwise":
        return f"bitsandbytes threshold=0 (no decomposition); fp16-cast activations; matmul: {mm}"
    return (
        "bitsandbytes LLM.int8(): outlier test >=, outlier weights from int8, row scale without "
        f"outlier entries, fp16-cast activations; matmul: {mm}"
    )


class BitsandbytesBackend(Backend):
    name = "bitsandbytes"
    library = "bitsandbytes"
    methods = ("int8_raw", "vectorwise", "llm_int8")
    numerics = OWN_VARIANT
    verified = {
        "cpu": "reports/cpu-avx512vnni-2core (kept gpt3 run, bitsandbytes 0.50.2) and "
        "tests/test_peers.py"
    }

    @property
    def description(self) -> str:  # type: ignore[override]
        if _bnb() is None:
            return "official LLM.int8() code (bitsandbytes): not installed"
        return (
            f"official LLM.int8() code (bitsandbytes {_bnb().__version__}, Linear8bitLt): "
            f"outliers >=, int8 outlier weights; CPU matmul: {cpu_int8_matmul_kind()}"
        )

    def availability(self, device: torch.device) -> Availability:
        device = torch.device(device)
        if _bnb() is None:
            return Availability(False, _BNB.error, _BNB.output)
        avail = torch_device_availability(device)
        return Availability(avail.ok, avail.reason, _BNB.output)

    # stages: bitsandbytes' functional ops, wrapped in our dataclasses -------------------------

    def prepare_weight(self, weight, bias, cfg, kept_rows=None) -> PreparedWeight:
        """``int8_vectorwise_quant`` of the fp16 weight, as ``Int8Params`` does; ``kept_rows``
        ignored (bitsandbytes keeps no 16-bit weights)."""
        check_weight(weight, bias)
        F = _bnb().functional
        cb, scb, _ = F.int8_vectorwise_quant(weight.to(torch.float16).contiguous())
        n, k = weight.shape
        return PreparedWeight(
            int8=cb,
            absmax=scb,
            kept_rows=torch.zeros(0, dtype=torch.int64, device=weight.device),
            kept_values=torch.zeros((n, 0), dtype=weight.dtype, device=weight.device),
            bias=bias,
            dtype=weight.dtype,
            in_features=k,
        )

    def quantize(self, x, pw, cfg: QuantConfig) -> QuantizedActivation:
        F = _bnb().functional
        threshold = float(cfg.alpha) if cfg.decomposition else 0.0
        ca, sca, cols = F.int8_vectorwise_quant(x.to(torch.float16), threshold=threshold)
        if cols is None:
            cols = torch.zeros(0, dtype=torch.int64, device=x.device)
        return QuantizedActivation(ca, sca, cols, x[:, cols])

    def int8_matmul(self, a, pw) -> torch.Tensor:
        return _bnb().functional.int8_linear_matmul(a, pw.int8)

    def outlier_product(self, qa, pw):
        """The operands of bitsandbytes' outlier ``addmm``: (x[:, O], dequant(CB[:, O]).T), in
        the activation's dtype; the product is added in :meth:`dequantize`."""
        if qa.outlier_cols.numel() == 0:
            return None
        sub_b = torch.ops.bitsandbytes.int8_vectorwise_dequant.default(
            pw.int8[:, qa.outlier_cols].contiguous(), pw.absmax
        )
        return qa.outlier_values, sub_b.to(qa.outlier_values.dtype).t()

    def dequantize(self, acc, qa, pw, outlier) -> torch.Tensor:
        # the op the layer calls, with the activation's dtype as output dtype (as the layer does;
        # the functional wrapper has no dtype argument and returns fp16)
        out = torch.ops.bitsandbytes.int8_mm_dequant.default(
            acc, qa.absmax, pw.absmax, dtype=qa.outlier_values.dtype, bias=pw.bias
        )
        if outlier is not None:
            out = out.addmm(*outlier)
        return out

    # runners -------------------------------------------------------------------------------

    def _layer(self, weight, bias, threshold: float):
        """``Linear8bitLt`` as its users build it: 16-bit weights in, quantized on ``.to``."""
        bnb = _bnb()
        n, k = weight.shape
        # on the meta device: every parameter is replaced below, and initialising them (kaiming
        # uniform over k x n) took 6 s per layer at 175B shapes on a 2-core CPU
        layer = bnb.nn.Linear8bitLt(
            k, n, bias=bias is not None, has_fp16_weights=False, threshold=threshold, device="meta"
        )
        cb, scb = shared_weight((weight,), (self.name, "Int8Params"), lambda: _int8_params(weight))
        # a layer holding quantized parameters, as after loading a quantized state dict
        layer.weight = bnb.nn.Int8Params(
            cb, requires_grad=False, has_fp16_weights=False, CB=cb, SCB=scb
        )
        if bias is not None:
            layer.bias = torch.nn.Parameter(bias.detach().cpu().clone(), requires_grad=False)
        return layer.to(weight.device).eval()

    def runner(self, method, x, weight, bias, cfg, kept_rows=None) -> Runner:
        check_activation(x, weight)
        check_weight(weight, bias)
        if method not in self.methods:
            raise ValueError(f"backend {self.name!r} has no runner for method {method!r}")
        if _bnb() is None:
            raise RuntimeError(_BNB.error)
        mcfg = method_config(method, cfg)
        threshold = float(mcfg.alpha) if mcfg.decomposition else 0.0
        layer = self._layer(weight, bias, threshold)
        cb, scb = layer.weight.data, layer.weight.SCB
        # the stages share the layer's own int8 weights (one copy)
        pw = PreparedWeight(
            int8=cb,
            absmax=scb,
            kept_rows=torch.zeros(0, dtype=torch.int64, device=x.device),
            kept_values=torch.zeros((cb.shape[0], 0), dtype=weight.dtype, device=x.device),
            bias=layer.bias.data if bias is not None else None,
            dtype=weight.dtype,
            in_features=cb.shape[1],
        )
        with torch.inference_mode():
            qa = self.quantize(x, pw, mcfg)
            acc = stage_accumulator(x.shape[0], cb.shape[0], cb.shape[1], x.device)
            outl = self.outlier_product(qa, pw)
        variant = _variant(method, x.device)
        F = _bnb().functional

        if method == "int8_raw":
            a = qa.int8
            r = Runner(
                run=lambda: F.int8_linear_matmul(a, cb),
                stages={"int8_matmul": lambda: F.int8_linear_matmul(a, cb)},
                weight_bytes=cb.numel() + scb.numel() * 4,
                returns_int32=True,
                operands=(a, cb),
            )
        else:

            def run():
                with torch.inference_mode():
                    return layer(x)

            stages = {
                "quantize": lambda: self.quantize(x, pw, mcfg),
                "int8_matmul": lambda: self.int8_matmul(qa.int8, pw),
                "dequantize": lambda: self.dequantize(acc, qa, pw, outl),
            }
            if qa.outlier_cols.numel():
                stages["outlier_product"] = lambda: self.outlier_product(qa, pw)
            r = Runner(
                run=run,
                stages=stages,
                weight_bytes=pw.nbytes,
                outlier_cols=int(qa.outlier_cols.numel()),
            )
        r.variant = variant
        return r


def _int8_params(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CB, SCB) of ``weight`` quantized as ``Linear8bitLt`` users do: 16-bit ``Int8Params``
    moved to the device (the move quantizes)."""
    param = (
        _bnb()
        .nn.Int8Params(weight.detach().cpu().clone(), requires_grad=False, has_fp16_weights=False)
        .to(weight.device)
    )
    return param.CB, param.SCB


BACKEND = BitsandbytesBackend()
