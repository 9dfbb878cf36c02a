"""Named run profiles: sets of run settings that differ from their declared defaults.

A setting's default, range and help live once, in :mod:`kernelbench.settings`; a profile names
only what it changes. A profile fills every setting the user did not give; an explicit flag
always wins over the profile (``--quick --error-rows 512`` checks 512 rows). :func:`resolve`
checks every value against its range, so that a run never starts on a silent default or a
nonsense number. Torch-free: ``kernelbench --help`` reads them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kernelbench.settings import SettingError, check, default

__all__ = ["DEFAULT", "PROFILES", "Profile", "SettingError", "check_counts", "resolve"]


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    sizes: tuple[int, ...] | None = None  # model dims; None: every size of the case
    tokens: tuple[int, ...] | None = None  # token counts; None: the case's
    budget_s: float = default("budget_s")
    warmup_s: float = default("warmup_s")
    max_call_s: float = default("max_call_s")
    error_rows: int = default("error_rows")
    rounds: int = default("rounds")
    ci_target: float = default("ci_target")
    extra_rounds: int = default("extra_rounds")
    extra_share: float = default("extra_share")
    extra_round_budget_s: float = default("extra_round_budget_s")
    threads: int | None = default("threads")
    min_pairs: int = default("min_pairs")
    core_wait_s: float = default("core_wait_s")


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("default", "every size of the case at its token counts"),
        Profile(
            "quick",
            "CI-sized: d 768, 1024, 2048 at 256 tokens, short budgets, one round (and a few "
            "seconds more for rows that contradict the work order or are wide)",
            sizes=(768, 1024, 2048),
            tokens=(256,),
            budget_s=0.3,
            max_call_s=5.0,
            error_rows=256,
            rounds=1,
            # one round's intervals miss the spread between rounds: an ordering contradiction
            # (a first run's `suspect`) gets another look before it is reported
            extra_rounds=1,
            extra_round_budget_s=5.0,
        ),
        Profile(
            "full",
            "every size at the case's token counts, long budgets, five rounds",
            budget_s=3.0,
            warmup_s=0.5,
            max_call_s=120.0,
            error_rows=2048,
            rounds=5,
            ci_target=0.02,
        ),
    )
}
DEFAULT = PROFILES["default"]
#: The settings a profile holds (beyond its name, description, sizes and tokens).
PROFILE_SETTINGS = tuple(
    f.name for f in fields(Profile) if f.name not in ("name", "description", "sizes", "tokens")
)


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
    for name in PROFILE_SETTINGS:
        check(name, getattr(chosen, name))
    check_counts("--sizes", chosen.sizes)
    check_counts("--tokens", chosen.tokens)
    return chosen
