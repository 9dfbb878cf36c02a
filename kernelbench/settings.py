"""Every setting of a run, declared once: its default, type, range and help text.

The command line, the profiles (``run/profiles.py``: named sets of values that differ from these
defaults), the run's options, ``env.json`` and every reader of a saved run take a setting's
default and its check from here, so a setting never has two defaults. A reader of an older run
that did not record a setting uses the declared default (:func:`recorded`).

Torch-free: ``kernelbench --help`` reads these without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class SettingError(ValueError):
    """A setting out of its range (the message names the flag and the value)."""


@dataclass(frozen=True)
class Setting:
    """One setting: ``name`` is its field in profiles, run options and ``env.json``; ``flag``
    its command-line option (``None``: set only through a profile)."""

    name: str
    flag: str | None
    default: Any
    help: str
    low: float | None = None  # numbers: the lower bound
    low_inclusive: bool = True
    high: float | None = None  # numbers: the upper bound (inclusive), if any
    choices: tuple[str, ...] | None = None  # strings: the values allowed

    @property
    def label(self) -> str:
        """How messages name it: the flag a user types, else the field."""
        return self.flag or self.name

    def check(self, value: Any, label: str | None = None) -> None:
        """Raise :class:`SettingError` naming the setting (as ``label``, else its flag) when
        ``value`` is out of range. ``None`` (not set: the default applies) is always allowed."""
        if value is None:
            return
        label = label or self.label
        if self.choices is not None:
            if value not in self.choices:
                allowed = " or ".join(repr(c) for c in self.choices)
                raise SettingError(f"{label} must be {allowed}, got {value!r}")
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise SettingError(f"{label} must be a finite number, got {value}")
        if self.low is not None:
            too_low = value < self.low if self.low_inclusive else value <= self.low
            if too_low or (self.high is not None and value > self.high):
                bound = f">= {self.low:g}" if self.low_inclusive else f"> {self.low:g}"
                upper = f" and <= {self.high:g}" if self.high is not None else ""
                raise SettingError(f"{label} must be {bound}{upper}, got {value:g}")


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "budget_s",
            "--budget",
            0.5,
            "Seconds of timed samples per row and round",
            low=0.0,
            low_inclusive=False,
        ),
        Setting("warmup_s", None, 0.05, "Seconds of warm-up calls before a row's samples", 0.0),
        Setting(
            "stage_budget_s",
            None,
            0.05,
            "Seconds of timed samples of each stage (quantize, int8 product, ...) alone",
            low=0.0,
            low_inclusive=False,
        ),
        Setting(
            "max_call_s",
            "--max-call",
            30.0,
            "Skip rows whose one call is estimated above this many seconds",
            low=0.0,
            low_inclusive=False,
        ),
        Setting(
            "min_pairs",
            None,
            3,
            "Pairs every row takes per round, however long its call (large cells too)",
            1,
            high=1000,
        ),
        Setting(
            "cache",
            "--cache",
            "cold",
            "cold: each timed call reads its weights and activations from memory, as in a "
            "model (caches evicted outside the clock; CUDA: L2 flushed); hot: from cache",
            choices=("cold", "hot"),
        ),
        Setting(
            "core_wait_s",
            "--core-wait",
            2.0,
            "Cold CPU calls: seconds to wait at most, before each, for the cores to run at "
            "their usual speed on a host that shares them out (0: never wait)",
            0.0,
            high=60.0,
        ),
        Setting("error_rows", "--error-rows", 512, "Output rows checked against float64", 1),
        Setting("rounds", "--rounds", 3, "Visits of each cell; rows pooled", 1, high=100),
        Setting(
            "ci_target",
            "--ci-target",
            0.05,
            "Speedup intervals wider than this (relative half-width) get extra rounds, then a flag",
            low=0.0,
            low_inclusive=False,
            high=1.0,
        ),
        Setting(
            "extra_rounds",
            "--extra-rounds",
            3,
            "At most this many extra rounds for rows whose interval is too wide",
            0,
            high=100,
        ),
        Setting(
            "extra_round_budget_s",
            None,
            30.0,
            "Seconds each extra round may take at least: a cell starts only while its last "
            "measured time fits (rows within reach of the target first)",
            0.0,
        ),
        Setting(
            "extra_share",
            "--extra-share",
            0.2,
            "Extra rounds together may take this share of the planned rounds' time (each at "
            "least a fixed minimum): a larger sweep measures more of its wide rows again",
            0.0,
            high=10.0,
        ),
        # kernelbench accuracy (the error study, no timing)
        Setting("seeds", "--seeds", 3, "Input draws per size", 1, high=100),
        Setting("study_tokens", "--tokens", 2048, "Tokens the quantization statistics cover", 1),
        Setting(
            "study_error_rows", "--error-rows", 256, "Sampled output rows (tokens) per layer", 1
        ),
        Setting("study_error_cols", "--error-cols", 2048, "Sampled output columns per layer", 1),
        Setting("threads", "--threads", None, "CPU threads (default: torch's)", 1, high=4096),
        Setting("alpha", "--alpha", 6.0, "Outlier threshold (0 = no decomposition)", 0.0),
        Setting(
            "outlier_cmp",
            "--outlier-cmp",
            ">",
            "'>' (paper) or '>=' (bitsandbytes)",
            choices=(">", ">="),
        ),
        Setting(
            "outlier_weights",
            "--outlier-weights",
            "fp16",
            "fp16 (paper eq. 8) or int8 (bitsandbytes)",
            choices=("fp16", "int8"),
        ),
    )
}


def default(name: str) -> Any:
    """The declared default of setting ``name``."""
    return SETTINGS[name].default


def check(name: str, value: Any, label: str | None = None) -> None:
    """:meth:`Setting.check` of setting ``name``."""
    SETTINGS[name].check(value, label)


def recorded(env: dict, name: str) -> Any:
    """The value of ``name`` a saved run used: what its ``env.json`` recorded (at the top
    level, as a run writes it), else the declared default (a run older than the setting)."""
    value = env.get(name)
    return default(name) if value is None else value
