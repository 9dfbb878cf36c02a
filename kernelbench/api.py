"""The public backend API: everything a backend outside this package may import.

A backend is an instance of a :class:`Backend` subclass that declares ``api_version``
(:data:`API_VERSION` when written against this kernelbench), implements
:meth:`Backend.availability` and overrides the stages it runs itself; every other stage is the
reference of :mod:`kernelbench.quant`. ``docs/plugins.md`` walks through one.

What may change only with a new :data:`API_VERSION`: the names below, the stage signatures of
:class:`Backend`, the fields of :class:`Runner`, :class:`Numerics` and :class:`Availability`.
"""

from __future__ import annotations

from kernelbench.backends.base import (
    API_VERSION,
    OWN_VARIANT,
    SUPPORTED_API_VERSIONS,
    Availability,
    Backend,
    Numerics,
    Runner,
    sixteen_bit_dtype,
    stage_accumulator,
    torch_device_availability,
)
from kernelbench.checks import InputError, check_activation, check_int8_operands, check_weight
from kernelbench.quant import PreparedWeight, Problem, QuantConfig, QuantizedActivation

__all__ = [
    "API_VERSION",
    "OWN_VARIANT",
    "SUPPORTED_API_VERSIONS",
    "Availability",
    "Backend",
    "InputError",
    "Numerics",
    "PreparedWeight",
    "Problem",
    "QuantConfig",
    "QuantizedActivation",
    "Runner",
    "check_activation",
    "check_int8_operands",
    "check_weight",
    "sixteen_bit_dtype",
    "stage_accumulator",
    "torch_device_availability",
]
