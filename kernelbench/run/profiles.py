"""Named run profiles: the defaults of ``kernelbench run``, defined once, as data.

A profile fills every setting the user did not give; an explicit flag always wins over the
profile (``--quick --error-rows 512`` checks 512 rows). :func:`resolve` also checks every value
against its range, so that a run never starts on a silent default or a nonsense number. Torch-
free: ``kernelbench --help`` reads the defaults from here without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    sizes: tuple[int, ...] | None  # model dims; None: every size of the case
    tokens: tuple[int, ...] | None  # token counts; None: the case's
    budget_s: float  # seconds of timed samples per row and round
    warmup_s: float  # seconds of warm-up calls before a row's samples
    max_call_s: float  # rows whose one call is estimated above this are skipped
    error_rows: int  # output rows checked against float64
    rounds: int  # times the sweep visits each cell
    ci_target: float  # relative half-width a pooled speedup's 95% interval should reach
    extra_rounds: int  # at most this many more rounds for rows whose interval is too wide
    threads: int | None = None  # CPU threads; None: torch's default
    #: pairs every row takes per round however long its call (large cells too)
    min_pairs: int = 3


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "default",
            "every size of the case at its token counts",
            sizes=None,
            tokens=None,
            budget_s=0.5,
            warmup_s=0.05,
            max_call_s=30.0,
            error_rows=512,
            rounds=3,
            ci_target=0.05,
            extra_rounds=2,
        ),
        Profile(
            "quick",
            "CI-sized: d 768, 1024, 2048 at 256 tokens, short budgets, one round",
            sizes=(768, 1024, 2048),
            tokens=(256,),
            budget_s=0.3,
            warmup_s=0.05,
            max_call_s=5.0,
            error_rows=256,
            rounds=1,
            ci_target=0.05,
            extra_rounds=0,
        ),
        Profile(
            "full",
            "every size at the case's token counts, long budgets, five rounds",
            sizes=None,
            tokens=None,
            budget_s=3.0,
            warmup_s=0.5,
            max_call_s=120.0,
            error_rows=2048,
            rounds=5,
            ci_target=0.02,
            extra_rounds=3,
        ),
    )
}
DEFAULT = PROFILES["default"]


class SettingError(ValueError):
    """A run setting out of its range (the message names the flag and the value)."""


#: (flag, lower bound, whether the bound itself is allowed, upper bound or None)
_RANGES: dict[str, tuple[str, float, bool, float | None]] = {
    "budget_s": ("--budget", 0.0, False, None),
    "warmup_s": ("warmup_s", 0.0, True, None),
    "max_call_s": ("--max-call", 0.0, False, None),
    "error_rows": ("--error-rows", 1, True, None),
    "rounds": ("--rounds", 1, True, 100),
    "extra_rounds": ("--extra-rounds", 0, True, 100),
    "ci_target": ("--ci-target", 0.0, False, 1.0),
    "threads": ("--threads", 1, True, 4096),
    "min_pairs": ("min_pairs", 1, True, 1000),
}


def _check(name: str, value: float) -> None:
    flag, low, inclusive, high = _RANGES[name]
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingError(f"{flag} must be a finite number, got {value}")
    too_low = value < low if inclusive else value <= low
    if too_low or (high is not None and value > high):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        upper = f" and <= {high:g}" if high is not None else ""
        raise SettingError(f"{flag} must be {bound}{upper}, got {value:g}")


def check_counts(flag: str, values: tuple[int, ...] | None) -> None:
    """Token counts and model dims are positive."""
    for v in values or ():
        if v <= 0:
            raise SettingError(f"{flag} values must be positive integers, got {v}")


def resolve(profile: str, **given) -> Profile:
    """The profile named ``profile`` with every setting in ``given`` that is not ``None``
    replacing its value, each checked against its range."""
    if profile not in PROFILES:
        raise SettingError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    known = {f.name for f in fields(Profile)} - {"name", "description"}
    unknown = set(given) - known
    if unknown:
        raise TypeError(f"not profile settings: {sorted(unknown)}")
    chosen = replace(PROFILES[profile], **{k: v for k, v in given.items() if v is not None})
    for name in _RANGES:
        value = getattr(chosen, name)
        if value is not None:
            _check(name, value)
    check_counts("--sizes", chosen.sizes)
    check_counts("--tokens", chosen.tokens)
    return chosen
