"""Domain facts every part of kernelbench shares, free of torch and of any backend.

Methods, stages, the baseline a speedup divides by, the kinds of a skipped row and the work a
row declares (flops, bytes) live here once; readers, tables, reports and the CI gate import
them from here, so none of them needs torch to print a number.
"""

from __future__ import annotations

from enum import Enum

#: The methods, i.e. the rows of the paper's Table 5 (App. D.1) plus ``fp32``, in the paper's
#: order. Tables list methods in this order.
METHODS: tuple[str, ...] = (
    "fp32",
    "fp16",
    "int8_raw",
    "absmax_torch",
    "vectorwise_torch",
    "vectorwise",
    "llm_int8",
)

#: Each method as the paper's App. D.1 Table 5 names it, true on any device (the paper's
#: "Absmax PyTorch + NVIDIA" rows are quantization written in PyTorch ops, run here on
#: whatever device the run used).
METHOD_LABELS: dict[str, str] = {
    "fp32": "32-bit (not in the paper's table)",
    "fp16": "16-bit baseline",
    "int8_raw": "Int8 matmul, no quantization overhead",
    "absmax_torch": "Absmax, PyTorch ops",
    "vectorwise_torch": "Vector-wise, PyTorch ops",
    "vectorwise": "Vector-wise",
    "llm_int8": "LLM.int8() (vector-wise + decomp)",
}

#: The schemes of the accuracy study (``kernelbench accuracy``) beyond ``METHODS``: the rest of
#: Table 1's int8 variants and the schemes users weigh today. Their math is
#: ``kernelbench.quant.variant_forward``; no built-in backend times them, so they stay out of
#: the default sweep (a backend that implements one is timed when ``--methods`` names it).
ACCURACY_VARIANTS: tuple[str, ...] = (
    "zeropoint",
    "rowwise",
    "zeropoint_vectorwise",
    "rowwise_decomp",
    "zeropoint_llm_int8",
    "smoothquant",
    "int8_weight_only",
    "fp8_e4m3",
)

#: Every method some part of kernelbench knows: timed methods first, then the study's variants.
ALL_METHODS: tuple[str, ...] = METHODS + ACCURACY_VARIANTS

METHOD_LABELS.update(
    {
        "zeropoint": "Int8 zeropoint (per tensor)",
        "rowwise": "Absmax row-wise",
        "zeropoint_vectorwise": "Zeropoint vector-wise",
        "rowwise_decomp": "Row-wise + decomposition",
        "zeropoint_llm_int8": "Zeropoint LLM.int8()",
        "smoothquant": "SmoothQuant W8A8 (alpha 0.5)",
        "int8_weight_only": "Int8 weight-only (W8A16)",
        "fp8_e4m3": "FP8 e4m3, row-wise scaled",
    }
)

#: The accuracy study's rows in Table 1's order: (method, the paper's wording), then the schemes
#: the paper did not have.
ACCURACY_STUDY: tuple[tuple[str, str], ...] = (
    ("fp32", "32-bit float"),
    ("absmax_torch", "int8 absmax"),
    ("zeropoint", "int8 zeropoint"),
    ("rowwise", "absmax row-wise"),
    ("vectorwise", "absmax vector-wise"),
    ("zeropoint_vectorwise", "zeropoint vector-wise"),
    ("rowwise_decomp", "row-wise + decomp"),
    ("llm_int8", "absmax LLM.int8()"),
    ("zeropoint_llm_int8", "zeropoint LLM.int8()"),
    ("smoothquant", "SmoothQuant W8A8"),
    ("int8_weight_only", "int8 weight-only"),
    ("fp8_e4m3", "fp8 e4m3 row-wise"),
)

#: The backend name of the accuracy study's rows (the reference math of ``kernelbench.quant``);
#: a run holding such rows gets the report's accuracy section.
STUDY_BACKEND = "reference"

#: Table 1: C4 validation perplexity of OPT-like models per method and size (model-level, for
#: orientation beside the study's kernel-level errors). Keyed by method, then size name.
TABLE1_PERPLEXITY: dict[str, dict[str, float]] = {
    "fp32": {"125M": 25.65, "1.3B": 15.91, "2.7B": 14.43, "6.7B": 13.30, "13B": 12.45},
    "absmax_torch": {"125M": 87.76, "1.3B": 16.55, "2.7B": 15.11, "6.7B": 14.59, "13B": 19.08},
    "zeropoint": {"125M": 56.66, "1.3B": 16.24, "2.7B": 14.76, "6.7B": 13.49, "13B": 13.94},
    "rowwise": {"125M": 30.93, "1.3B": 17.08, "2.7B": 15.24, "6.7B": 14.13, "13B": 16.49},
    "vectorwise": {"125M": 35.84, "1.3B": 16.82, "2.7B": 14.98, "6.7B": 14.13, "13B": 16.48},
    "zeropoint_vectorwise": {
        "125M": 25.72,
        "1.3B": 15.94,
        "2.7B": 14.36,
        "6.7B": 13.38,
        "13B": 13.47,
    },
    "rowwise_decomp": {"125M": 30.76, "1.3B": 16.19, "2.7B": 14.65, "6.7B": 13.25, "13B": 12.46},
    "llm_int8": {"125M": 25.83, "1.3B": 15.93, "2.7B": 14.44, "6.7B": 13.24, "13B": 12.45},
    "zeropoint_llm_int8": {
        "125M": 25.69,
        "1.3B": 15.92,
        "2.7B": 14.43,
        "6.7B": 13.24,
        "13B": 12.45,
    },
}

#: Methods built from a backend's own int8 stages (any int8 backend can run these).
INT8_STAGE_METHODS: tuple[str, ...] = ("int8_raw", "vectorwise", "llm_int8")

#: Within one backend and cell each method does strictly more work than the one before it:
#: the int8 product alone; plus quantize and dequantize; plus outlier detection and the 16-bit
#: outlier product. A row measured faster than its predecessor beyond the intervals is suspect.
WORK_ORDER: tuple[str, ...] = ("int8_raw", "vectorwise", "llm_int8")

#: The cell the paper's App. D.1 Table 5 measured: the first FFN layer at (most likely) 2048
#: tokens (batch 1 x sequence 2048). Paper figures are shown for this cell only.
PAPER_LAYER = "ffn1"
PAPER_TOKENS = 2048

#: The stage names a runner may expose for per-stage timing.
STAGES: tuple[str, ...] = ("quantize", "int8_matmul", "dequantize", "outlier_product")

#: The (backend, method) every speedup divides by: the device's 16-bit baseline (fp16 on CUDA,
#: bf16 on CPU).
BASELINE: tuple[str, str] = ("torch", "fp16")
#: The 32-bit reference, shown as absolute time (never as an unpaired speedup).
FP32: tuple[str, str] = ("torch", "fp32")


class SkipKind(str, Enum):
    """Why a row was not measured; stored in the row's ``skip_kind`` (``None`` unless skipped).

    ``unsupported``: the backend, method, shape or device cannot run here (re-running will not
    change that). ``over_budget``: one call was estimated above ``--max-call`` (a larger budget
    may measure it; ``--resume`` tries it again). ``not_run``: the row's baseline or an earlier
    stage of the run was missing (e.g. an executor could not start)."""

    UNSUPPORTED = "unsupported"
    OVER_BUDGET = "over_budget"
    NOT_RUN = "not_run"


_NOT_IMPLEMENTED = "does not implement"


#: Reasons that earlier versions wrote for pairs that do not apply, in words of their own
#: (results files keep them): read as :func:`not_implemented_reason`'s.
_OLD_NOT_APPLICABLE = (
    "on the torch backend 'vectorwise' is the same computation as 'vectorwise_torch'",
)


def not_implemented_reason(backend: str, method: str, why: str = "") -> str:
    """The skip reason of a (backend, method) pair that does not apply: the backend has no
    such method (nothing is missing; readers leave these rows out of skip lists); ``why``,
    when given, follows after a colon."""
    return f"backend {backend!r} {_NOT_IMPLEMENTED} {method!r}" + (f": {why}" if why else "")


def is_not_applicable(reason: object) -> bool:
    """Whether a skip ``reason`` is :func:`not_implemented_reason`'s (or one of the words
    earlier versions wrote for such a pair)."""
    if not isinstance(reason, str):
        return False
    return (reason.startswith("backend ") and f" {_NOT_IMPLEMENTED} " in reason) or (
        reason in _OLD_NOT_APPLICABLE
    )


def precision_class(method: str) -> str:
    """Which compute peak bounds ``method``: ``fp32``, ``16bit`` or ``int8`` (fp8 shares int8's
    dense peak on Hopper-class GPUs; weight-only int8 multiplies in 16-bit)."""
    return {"fp16": "16bit", "fp32": "fp32", "int8_weight_only": "16bit"}.get(method, "int8")


def work_flops(m: int, k: int, n: int) -> float:
    """Arithmetic of one (m, k) x (k, n) product: one multiply and one add per term."""
    return 2.0 * m * k * n


#: Bytes per element of the operands as each precision class reads and writes them.
_ELEMENT_BYTES = {"fp32": (4, 4, 4), "16bit": (2, 2, 2), "int8": (2, 1, 2)}


def output_bytes(method: str, m: int, n: int) -> float:
    """Bytes of one call's output: int32 for ``int8_raw``, else the method's output type."""
    return float(
        (4 if method == "int8_raw" else _ELEMENT_BYTES[precision_class(method)][2]) * m * n
    )


def work_bytes(method: str, m: int, k: int, n: int) -> float:
    """The least memory traffic of one call: activations read once, weights read once, output
    written once. int8 methods read 16-bit activations (they quantize them) and int8 weights
    and write 16-bit outputs; ``int8_raw`` reads int8 activations and writes int32."""
    if method == "int8_raw":
        return float(m * k + k * n + 4 * m * n)
    if method == "int8_weight_only":  # 16-bit activations and output, int8 weights
        return float(2 * m * k + k * n + 2 * m * n)
    act, weight, out = _ELEMENT_BYTES[precision_class(method)]
    return float(act * m * k + weight * k * n + out * m * n)


def roofline_ops(flops: float, nbytes: float, peak_ops: float, bandwidth: float) -> float:
    """The attainable ops/s of a row: its precision's compute peak, or bandwidth times its
    arithmetic intensity when that is lower (the roofline model)."""
    return min(peak_ops, bandwidth * flops / nbytes) if nbytes > 0 else peak_ops
