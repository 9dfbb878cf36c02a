"""The machine's load from /proc: is anything else using the CPUs while we measure?

A peak measured while another process ran is a peak of what was left (a 16-bit peak of 0.553
TOPS cached under load, 0.826 quiet, then flagged every later run's rows ``suspect``). The
figures here are read from ``/proc/loadavg`` and ``/proc/stat`` (a directory given for tests):
the 1-minute load average, the CPU time of every other process (all non-idle time less this
process's own) and the time the hypervisor stole, each as cores over an interval. A peak is
measured only when quiet (:func:`quiet_check`); a run records the load it ran under
(:class:`LoadWatch`) and says when it was busy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

PROC = Path("/proc")
#: Other processes using more than this many cores on average make the machine busy.
BUSY_OTHER_CORES = 0.25
#: Stolen time above this share of the machine's cores makes it busy.
BUSY_STEAL_SHARE = 0.05


@dataclass(frozen=True)
class LoadSample:
    """One reading: when, the load average, the machine's non-idle and stolen CPU seconds
    (``None`` where unreadable) and this process's own CPU seconds."""

    at_s: float
    loadavg_1m: float | None
    busy_s: float | None
    steal_s: float | None
    own_s: float


def read_load(proc: Path = PROC, clock: Callable[[], float] = time.monotonic) -> LoadSample:
    try:
        loadavg = float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        loadavg = None
    busy = steal = None
    try:
        line = (proc / "stat").read_text().splitlines()[0].split()
        ticks = [int(v) for v in line[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal ...
        busy = (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / hz
        steal = ticks[7] / hz if len(ticks) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return LoadSample(clock(), loadavg, busy, steal, t.user + t.system)


@dataclass(frozen=True)
class Load:
    """The machine's load over an interval: other processes' and stolen CPU in cores (average),
    the load average at its end, and whether that is busy (with why)."""

    seconds: float
    other_cores: float | None
    steal_cores: float | None
    loadavg_1m: float | None
    busy: bool
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def load_between(
    before: LoadSample,
    after: LoadSample,
    cores: int | None = None,
    steal_share: float = BUSY_STEAL_SHARE,
) -> Load:
    """The load between two readings; stolen time above ``steal_share`` of the cores, or
    other processes above :data:`BUSY_OTHER_CORES`, make it busy."""
    cores = cores or os.cpu_count() or 1
    seconds = max(after.at_s - before.at_s, 1e-9)
    other = steal = None
    if before.busy_s is not None and after.busy_s is not None:
        own = after.own_s - before.own_s
        other = max(0.0, (after.busy_s - before.busy_s - own) / seconds)
    if before.steal_s is not None and after.steal_s is not None:
        steal = max(0.0, (after.steal_s - before.steal_s) / seconds)
    why = []
    if other is not None and other > BUSY_OTHER_CORES:
        why.append(f"other processes used {other:.2f} cores")
    if steal is not None and steal > steal_share * cores:
        why.append(f"the hypervisor stole {steal:.2f} cores")
    return Load(seconds, other, steal, after.loadavg_1m, bool(why), "; ".join(why))


def quiet_check(
    seconds: float = 1.0,
    proc: Path = PROC,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    steal_share: float = BUSY_STEAL_SHARE,
) -> Load:
    """The load while this process sleeps ``seconds``: everything busy then is someone else."""
    before = read_load(proc, clock)
    sleep(seconds)
    return load_between(before, read_load(proc, clock), steal_share=steal_share)


#: A run busy for more than this share of its time is busy, even when its whole average is not
#: (a neighbour busy for minutes of a half-hour run).
BUSY_TIME_SHARE = 0.1
#: Readings closer than this are pooled with the next: /proc/stat counts in 10 ms ticks.
MIN_INTERVAL_S = 2.0


class LoadWatch:
    """The machine's load over a run, read between its rows: the whole run's load and the
    share of its time spent in intervals that were busy on their own."""

    def __init__(self, read: Callable[[], LoadSample] | None = None) -> None:
        self._read = read if read is not None else read_load
        self.start = self.last = self._read()
        self.busy_s = 0.0
        self.busiest: Load | None = None

    def mark(self) -> None:
        """Read the load now; the interval since the last reading counts once it is long
        enough to judge."""
        now = self._read()
        if now.at_s - self.last.at_s < MIN_INTERVAL_S:
            return
        part = load_between(self.last, now)
        self.last = now
        if part.busy:
            self.busy_s += part.seconds
            if self.busiest is None or _weight(part) > _weight(self.busiest):
                self.busiest = part

    def summary(self) -> dict:
        """env.json's ``load``: the whole run's :class:`Load`, the share of its time in busy
        intervals, and whether the run was busy (with why)."""
        self.mark()
        whole = load_between(self.start, self.last)
        share = min(1.0, self.busy_s / whole.seconds) if whole.seconds > 0 else 0.0
        busy, why = whole.busy, whole.why
        if not busy and share > BUSY_TIME_SHARE and self.busiest is not None:
            busy = True
            why = f"busy for {share:.0%} of the run (at worst {self.busiest.why})"
        return {**whole.as_dict(), "busy": busy, "why": why, "busy_share": share}


def combined_load(earlier: dict | None, later: dict) -> dict:
    """The ``load`` of a run whose rows several processes measured (``--resume``): each part's
    figures weighted by its seconds, the latest load average, and busy where a part was busy
    or the busy intervals together pass :data:`BUSY_TIME_SHARE` (a run busy before it was
    resumed stays busy)."""
    if not isinstance(earlier, dict) or not earlier.get("seconds"):
        return later
    parts = (earlier, later)
    seconds = [float(p.get("seconds") or 0.0) for p in parts]
    total = sum(seconds)
    if total <= 0:
        return later

    def weighted(key: str) -> float | None:
        values = [p.get(key) for p in parts]
        if any(v is None for v in values):
            return None
        return sum(v * s for v, s in zip(values, seconds, strict=True)) / total

    share = weighted("busy_share") or 0.0
    whys = [p.get("why") or "busy" for p in parts if p.get("busy")]
    busy = bool(whys) or share > BUSY_TIME_SHARE
    if busy and not whys:
        whys = [f"busy for {share:.0%} of the run"]
    return {
        "seconds": total,
        "other_cores": weighted("other_cores"),
        "steal_cores": weighted("steal_cores"),
        "loadavg_1m": later.get("loadavg_1m"),
        "busy": busy,
        "why": "; ".join(dict.fromkeys(whys)),
        "busy_share": share,
        "processes": int(earlier.get("processes") or 1) + int(later.get("processes") or 1),
    }


def _weight(load: Load) -> float:
    return (load.other_cores or 0.0) + (load.steal_cores or 0.0)
