"""This device's measured limits: int8, 16-bit and fp32 GEMM peaks and memory bandwidth.

Each peak is the best throughput of any single call over a few large square-ish GEMMs (every
backend that runs ``int8_raw`` here is tried for int8; torch's matmul for 16-bit and fp32), and
bandwidth is the best of a large tensor copy (bytes read plus written), a read-only sum and a
one-token int8 GEMV over a weight far larger than the caches (weight bytes read), also kept
per placement of the threads the probes' calls ran in (:func:`bandwidth_placements`). The
best call, not the median: a peak is what the device can do, and on a shared machine a median
measures the load.
The figures are cached per device class (``$KERNELBENCH_CACHE`` or ``~/.cache/kernelbench``)
and copied into every run's ``env.json``, where :mod:`kernelbench.results.physics` reads them as
each row's roofline.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kernelbench.core import work_flops
from kernelbench.measure.engine import MeasurementEngine, TimerSettings
from kernelbench.measure.timing import CallTimer, shared_core_gate
from kernelbench.quant import Problem, QuantConfig
from kernelbench.results.compare import peak_readings, processor_key
from kernelbench.results.states import LINK_MAX_NS, link_threshold, same_placement
from kernelbench.run.env import cpu_identity, device_class
from kernelbench.run.load import Load, LoadSample, load_between, quiet_check, read_load
from kernelbench.settings import default
from kernelbench.statistics import stats

#: GEMM shapes (m, k, n) tried for each peak; the best is kept. Large ones, and mid-sized ones
#: whose operands stay in cache longer (on the 2-core CI VM, int8 GEMMs at 2048 x 1536 x 6144
#: ran 9.5% faster than the best of the large shapes), down to the sweep's smallest prefill
#: cell (fp32 at 2048 x 768 x 3072 ran 10% above the best of the larger shapes), and 256-token
#: ones (the quick profile's): on an AVX2 CPU torch's bf16 GEMM ran at 0.020 TOPS at
#: 256 x 5120 x 5120, 0.017 at best at the 2048-token shapes. And two of the sweep's own large
#: prefill cells: without them the sweep's int8 rows at d >= 5140 read up to 9% above the peak
#: (a Zen 5 VM: 2.03 TOPS at d = 12288 against a 1.92 peak); on a Zen 4 VM, torch's int8 GEMM
#: interleaved call by call over one minute: best 0.83 TOPS at 2048 x 12288 x 12288, 0.79 at
#: 2048 x 5140 x 20560, 0.76 at 2048 x 4096 x 16384, 0.65 at 2048 x 1536 x 6144. And the d = 2048
#: prefill cell: on a 2-vCPU Xeon VM (AMX) torch's fp32 GEMM read 0.38 TOPS there in a D.1 run,
#: its interval's slow end above the 0.359 best of the other shapes.
PEAK_SHAPES = (
    (256, 5120, 5120),
    (256, 4096, 16384),
    (2048, 768, 3072),
    (2048, 1024, 4096),
    (2048, 1536, 6144),
    (2048, 2048, 8192),
    (2048, 4096, 4096),
    (4096, 4096, 4096),
    (2048, 4096, 16384),
    (2048, 5140, 20560),
    (2048, 12288, 12288),
)
COPY_BYTES = 1 << 30  # large enough to leave every cache behind
FIRST_TOUCH_BYTES = 1 << 28  # an output the size of a large int32 GEMM product
#: A shape whose call is estimated above this many seconds is not tried (see _best_of_shapes).
PEAK_MAX_CALL_S = 2.0
#: A peak is a device figure, not a run's row: its own stopping rules, tighter than a run's.
_SETTINGS = TimerSettings(budget_s=1.0, warmup_s=0.2, min_samples=5, max_samples=20, ci_target=0.02)


def cache_path(dclass: str, root: Path | None = None) -> Path:
    if root is None:
        root = Path(os.environ.get("KERNELBENCH_CACHE", Path.home() / ".cache" / "kernelbench"))
    return root / "peak" / (re.sub(r"[^A-Za-z0-9._-]+", "_", dclass) + ".json")


#: Calls timed per shape at the least, however long one takes: a peak from one call is that
#: call's luck (fp32 at 4096^3 takes a second here, the whole budget).
MIN_PEAK_CALLS = 3


def _samples_ms(engine: MeasurementEngine, call, at_least: int = MIN_PEAK_CALLS) -> list[float]:
    """``call`` timed after its first call, at least ``at_least`` times."""
    _, first = engine.first_call(call)
    samples = list(engine.measure(call, first).row_ms)
    while len(samples) < at_least:
        samples.append(engine.timer(call))
    return samples


def _best_s(engine: MeasurementEngine, call, at_least: int = MIN_PEAK_CALLS) -> float:
    return min(_samples_ms(engine, call, at_least)) / 1e3


def _int8_raw_call(backend, device: torch.device, m: int, k: int, n: int):
    """``backend``'s ``int8_raw`` built on fresh (m, k) x (n, k) operands, or ``None`` when it
    does not run that shape here."""
    if not backend.supports("int8_raw", device, torch.bfloat16, m, k, n):
        return None
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    return backend.build(Problem("int8_raw", x, w, None, QuantConfig(alpha=0.0))).run


def _best_of_shapes(engine: MeasurementEngine, make_call, label: str) -> tuple[float, str]:
    """Best TOPS of ``make_call(m, k, n)`` (``None``: cannot run that shape) over
    :data:`PEAK_SHAPES`, smallest work first. A shape whose call would take longer than
    :data:`PEAK_MAX_CALL_S` at the best rate so far is not tried: a slow path (torch's bf16 GEMM
    or oneDNN int8 on a CPU without the native instructions) would otherwise hold ``peak`` for
    many minutes, and its rate hardly changes with the shape."""
    best, how, skipped = 0.0, "", 0
    for m, k, n in sorted(PEAK_SHAPES, key=lambda s: work_flops(*s)):
        if best > 0 and work_flops(m, k, n) / (best * 1e12) > PEAK_MAX_CALL_S:
            skipped += 1
            continue
        try:
            call = make_call(m, k, n)
            if call is None:
                continue
            tops = work_flops(m, k, n) / _best_s(engine, call) / 1e12
        except Exception:  # noqa: BLE001 - a path that cannot run here adds no peak
            continue
        if tops > best:
            best, how = tops, f"{label} {m}x{k}x{n}"
    if skipped and best > 0:
        how += f" ({skipped} larger shapes over {PEAK_MAX_CALL_S:g} s per call not tried)"
    return best, how


def _int8_tops(engine: MeasurementEngine, device: torch.device) -> tuple[float, str]:
    from kernelbench.backends import all_backends

    best, how = 0.0, ""
    for name, backend in all_backends().items():

        def make_call(m, k, n, backend=backend):
            return _int8_raw_call(backend, device, m, k, n)

        tops, label = _best_of_shapes(engine, make_call, f"{name} int8_raw")
        if tops > best:
            best, how = tops, label
    return best, how


def _matmul_tops(engine: MeasurementEngine, device: torch.device, dtype: torch.dtype):
    """``F.linear(x, w)`` with ``w`` stored (n, k): the layout of every baseline row (on AVX2
    CPUs torch's bf16 ``x @ w`` with ``w`` stored (k, n) ran 18x slower than this)."""

    def make_call(m, k, n):
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        return lambda: F.linear(x, w)

    return _best_of_shapes(engine, make_call, f"F.linear {str(dtype).replace('torch.', '')}")


#: The int8 weight a decode-shaped (one token) GEMV streams for the bandwidth probe: 256 MiB,
#: 8x a 32 MB last-level cache, so no call finds any of it in cache.
GEMV_SHAPE = (1, 8192, 32768)
#: Timed calls of each bandwidth probe: on a VM the memory bus is shared with other guests, and
#: one machine read 35-58 GB/s from the same 1 GiB sum within seconds. The peak is the best
#: call, so more calls spread over time find the uncontended figure more often.
BANDWIDTH_CALLS = 20

Link = Callable[[], float | None] | None


@dataclass(frozen=True)
class BandwidthCall:
    """One timed call of a bandwidth probe: its rate, where the threads ran just before it
    (the cache line's round trip between two of them; ``None`` without a probe) and what it
    was."""

    gbs: float
    link_ns: float | None
    how: str


def _timed_calls(engine: MeasurementEngine, call, nbytes: int, how: str, link: Link):
    """``call`` after an untimed first call, timed :data:`BANDWIDTH_CALLS` times, each with a
    link reading just before it."""
    engine.first_call(call)
    calls = []
    for _ in range(BANDWIDTH_CALLS):
        link_ns = link() if link is not None else None
        seconds = engine.timer(call) / 1e3
        calls.append(BandwidthCall(nbytes / seconds / 1e9, link_ns, how))
    return calls


def _gemv_calls(engine: MeasurementEngine, device: torch.device, link: Link = None):
    """Every backend's one-token ``int8_raw`` GEMV over a weight far larger than the caches,
    counted in weight bytes: how a decode call streams its weights (read-only, with the
    prefetching a GEMM kernel does), which a reduction can understate (one CPU read 50 GB/s
    through an int8 GEMV while ``torch.sum`` read 42)."""
    from kernelbench.backends import all_backends

    m, k, n = GEMV_SHAPE
    calls: list[BandwidthCall] = []
    for name, backend in all_backends().items():
        try:
            run = _int8_raw_call(backend, device, m, k, n)
            if run is None:
                continue
            how = f"{name} int8_raw GEMV {m}x{k}x{n} ({n * k >> 20} MiB of weight)"
            calls += _timed_calls(engine, run, n * k, how, link)
            del run  # one backend's weight in memory at a time
        except Exception:  # noqa: BLE001 - a path that cannot run here adds no probe
            continue
    return calls


def _stream_calls(engine: MeasurementEngine, device: torch.device, link: Link = None):
    """A large copy (bytes read plus written) and a read-only sum over the same buffer."""
    src = torch.rand(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    size = f"{COPY_BYTES >> 20} MiB"
    copy = _timed_calls(
        engine, lambda: dst.copy_(src), 2 * COPY_BYTES, f"copy (read + write) of {size}", link
    )
    return [*copy, *_timed_calls(engine, src.sum, COPY_BYTES, f"read-only sum of {size}", link)]


def _bandwidth_calls(engine: MeasurementEngine, device: torch.device, link: Link = None):
    """The calls of every bandwidth probe: a copy, a read-only reduction and one-token int8
    GEMVs. A decode call streams its weights read-only, which many machines do faster than
    they copy, and a GEMM kernel's prefetching streams faster than a reduction."""
    return [*_stream_calls(engine, device, link), *_gemv_calls(engine, device, link)]


def _by_placement(items: list, link_of: Callable[[object], float | None]) -> list[list]:
    """``items`` with a link reading (of a running thread: at most :data:`~kernelbench.results.
    states.LINK_MAX_NS`), in one group, or in two where their readings fall in two
    (:func:`~kernelbench.results.states.link_threshold`), nearest placement first."""
    placed = [x for x in items if (v := link_of(x)) is not None and v <= LINK_MAX_NS]
    if not placed:
        return []
    threshold = link_threshold([link_of(x) for x in placed])
    if threshold is None:
        return [placed]
    near = [x for x in placed if link_of(x) < threshold]
    return [near, [x for x in placed if link_of(x) >= threshold]]


def bandwidth_placements(calls: list[BandwidthCall], when: str) -> list[dict]:
    """The best call of each placement of the threads the probes ran in: the calls with a link
    reading, split where those fall in two groups (:func:`~kernelbench.results.states.
    link_threshold`), each group as ``{"link_ns": its median reading, "gbs": its best call,
    "calls": how many, "note": what that call was, and when}``, nearest placement first. A VM
    whose host moves its two vCPUs between one core complex and two reads its bus at about
    half the rate on one (a 2-vCPU Zen 4 VM: 33-34 GB/s peaks one day, 63 another), so each
    row is judged against the figure of the placement its calls ran in
    (:mod:`kernelbench.results.physics`). Empty without link readings (one thread, CUDA, no
    extension)."""
    out = []
    for group in _by_placement(calls, lambda c: c.link_ns):
        best = max(group, key=lambda c: c.gbs)
        out.append(
            {
                "link_ns": round(statistics.median(c.link_ns for c in group), 1),
                "gbs": best.gbs,
                "calls": len(group),
                "note": f"best call of {best.how}, round trip {best.link_ns:.0f} ns, {when}",
            }
        )
    return out


def merge_placements(previous: object, fresh: list[dict]) -> list[dict]:
    """The placements of ``previous`` (a cache entry's list) and ``fresh``, one entry per
    placement (medians within :func:`~kernelbench.results.states.same_placement` of each other
    are one), each keeping its higher best call: like the figure itself, a placement's best
    call only rises as the host is measured again."""
    merged = [dict(p) for p in fresh]
    for old in previous if isinstance(previous, list) else []:
        if not isinstance(old, dict) or not isinstance(old.get("link_ns"), (int, float)):
            continue
        if not isinstance(old.get("gbs"), (int, float)):
            continue
        twin = next((p for p in merged if same_placement(p["link_ns"], old["link_ns"])), None)
        if twin is None:
            merged.append(dict(old))
        elif old["gbs"] > twin["gbs"]:
            merged[merged.index(twin)] = dict(old)
    return sorted(merged, key=lambda p: p["link_ns"])


def _first_touch_gbs(engine: MeasurementEngine) -> float:
    """Bytes per second of a fresh allocation's first write (page faults included): what a call
    pays for an output it allocates, beyond what it computes. CPU only (CUDA's caching allocator
    hands out memory already touched)."""

    def touch():
        return torch.empty(FIRST_TOUCH_BYTES, dtype=torch.uint8).fill_(1)

    # the median, not the best call: page faults vary with the memory's state, and this rate
    # is an allowance (what a typical call pays), not a ceiling
    median_ms = stats(_samples_ms(engine, touch)).median_ms
    return FIRST_TOUCH_BYTES / (median_ms / 1e3) / 1e9


def processor(device: torch.device) -> str | None:
    """What a peak was measured on, finer than its device class: the GPU's name, or the CPU's
    vendor, family, model and stepping (``None`` where /proc/cpuinfo does not say)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return processor_key({"cpu": {"identity": cpu_identity()}})


def _engine(device: torch.device, reuse_memory: bool | None = None) -> MeasurementEngine:
    """The peaks' engine: hot caches and, on the CPU, a wait for fast cores before each call
    (:func:`~kernelbench.measure.timing.shared_core_gate`): on a 2-vCPU Xeon VM whose host
    shares its cores out (bf16 calls 2-3x slower in its slow state), the best fp32 call of
    5-20 read 0.333 TOPS twice, 0.354 and 0.382 in one day's measurements, without waiting."""
    from kernelbench.run.cell import core_probe

    probe = core_probe(device)
    timer = CallTimer(core_gate=shared_core_gate(probe, default("core_wait_s"))) if probe else None
    return MeasurementEngine(device, _SETTINGS, _SETTINGS, timer=timer, reuse_memory=reuse_memory)


def _placement_text(best: BandwidthCall, around: list[float] | None) -> str:
    """Where the host ran the threads for the best bandwidth call, for the peak's note: the
    cache line's round trip between two of them just before that call, and before and after
    all the probes (``around``). A VM whose host moves its two vCPUs between one core complex
    and two reads its bus at about half the rate on one (a 2-vCPU Zen 4 VM: 37 GB/s on one and
    64.5 on two within one measurement, which read about 60 ns before and after its probes),
    so the figure is of the placement it was read in. Empty where there is no reading (one
    thread, CUDA, no extension)."""
    parts = []
    if best.link_ns is not None:
        parts.append(f"{best.link_ns:.0f} ns just before it")
    if around is not None:
        parts.append(f"{around[0]:.0f} before the probes and {around[1]:.0f} after")
    return f", the threads' cache-line round trip {', '.join(parts)}" if parts else ""


def _bandwidth_peak(
    engine: MeasurementEngine, device: torch.device, threads: str, when: str
) -> dict | None:
    """The bandwidth probes' best call as a peak entry (without device class and processor),
    with the placements of the threads its calls ran in; ``None`` when no probe ran."""
    from kernelbench.run.cell import link_probe

    link = link_probe(device)
    before = link() if link else None
    calls = _bandwidth_calls(engine, device, link)
    after = link() if link else None
    around = None if before is None or after is None else [round(before, 1), round(after, 1)]
    best = max(calls, key=lambda c: c.gbs, default=None)
    if best is None:
        return None
    where = _placement_text(best, around)
    entry: dict = {
        "gbs": best.gbs,
        "source": "measured",
        "note": f"best call of {best.how}, {threads}{where}, {when}",
    }
    if around is not None:
        entry["link_ns"] = around
    placements = bandwidth_placements(calls, when)
    if placements:
        entry["placements"] = placements
    return entry


def measure_peak(device: torch.device) -> dict:
    """The device's peaks in env.json's ``peak`` format (source ``measured``)."""
    engine = _engine(device)
    dclass = device_class(device)
    chip = processor(device)
    sixteen = torch.float16 if device.type == "cuda" else torch.bfloat16
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    threads = torch.get_num_threads()
    peak = {}
    for kind, (tops, how) in (
        ("int8", _int8_tops(engine, device)),
        ("16bit", _matmul_tops(engine, device, sixteen)),
        ("fp32", _matmul_tops(engine, device, torch.float32)),
    ):
        if tops > 0:
            note = f"best call of {how}, {threads} threads, {when}"
            peak[kind] = {
                "tops": tops,
                "source": "measured",
                "note": note,
                "device_class": dclass,
                "processor": chip,
            }
    bandwidth = _bandwidth_peak(engine, device, f"{threads} threads", when)
    if bandwidth is not None:
        peak["bandwidth"] = {**bandwidth, "device_class": dclass, "processor": chip}
    if device.type == "cpu":
        fresh = _engine(device, reuse_memory=False)
        peak["first_touch"] = {
            "gbs": _first_touch_gbs(fresh),
            "source": "measured",
            "note": f"median allocate + first write of {FIRST_TOUCH_BYTES >> 20} MiB, {when}",
            "device_class": dclass,
            "processor": chip,
        }
    return peak


#: Stolen time a peak tolerates, as a share of the cores (a run's header calls a machine busy
#: above :data:`kernelbench.run.load.BUSY_STEAL_SHARE`): a peak is each probe's best call, which
#: a few percent of stolen time seldom reaches, and a VM whose neighbours steal 5% of its time
#: for hours would otherwise never get one. The stolen share is recorded with every figure.
PEAK_STEAL_SHARE = 0.10


class PeakRefused(RuntimeError):
    """The machine stayed too busy to measure its peaks (the message says why)."""


#: Attempts at a quiet measurement, and the wait between them.
QUIET_TRIES = 3
QUIET_RETRY_S = 10.0


def measure_quiet_peak(
    device: torch.device,
    measure: Callable[[torch.device], dict] = measure_peak,
    quiet: Callable[[], Load] = lambda: quiet_check(steal_share=PEAK_STEAL_SHARE),
    read: Callable[[], LoadSample] = read_load,
    wait: Callable[[float], None] = time.sleep,
) -> dict:
    """:func:`measure_peak` on a quiet machine only: the load is checked before (this process
    sleeping a second) and over the measurement (other processes' CPU, steal); a busy machine
    is waited for and tried again, then refused (:class:`PeakRefused`). The load over the
    measurement is recorded with every figure (``load``)."""
    why = ""
    for attempt in range(QUIET_TRIES):
        if attempt:
            wait(QUIET_RETRY_S)
        before = quiet()
        if before.busy:
            why = f"before measuring, {before.why}"
            continue
        start = read()
        peak = measure(device)
        during = load_between(start, read(), steal_share=PEAK_STEAL_SHARE)
        if during.busy:
            why = f"while measuring, {during.why}"
            continue
        for entry in peak.values():
            entry["load"] = during.as_dict()
        return peak
    raise PeakRefused(
        f"not measuring this device's peaks: the machine is busy ({why}; {QUIET_TRIES} tries); "
        "a peak measured under load would flag every later run's rows. Stop other jobs, then "
        "run kernelbench peak --remeasure"
    )


#: The figures that are a best call (a lower bound of what the device can do); ``first_touch``
#: is a median.
BEST_CALL_FIGURES = ("int8", "16bit", "fp32", "bandwidth")


#: Quiet readings of each best-call figure kept in the cache (newest last): the range over which
#: one host's peak moves, against which ``compare`` tells another host apart
#: (:func:`kernelbench.results.compare.peak_gap`).
PEAK_READINGS_KEPT = 12


def keep_best(previous: dict, fresh: dict) -> dict:
    """``fresh``, except that a best-call figure the ``previous`` peaks read higher on the same
    processor is kept, with the fresh reading beside it (``remeasured``): a best call is a lower
    bound of what the device can do, and a shared VM moves between states for minutes (on a
    2-core Zen 5 VM: int8 2.02 TOPS and bandwidth 78.5 GB/s one day, 2.13 and 54.2 the next,
    quiet both times), so a re-measurement in the slower state must not lower a roofline that
    rows measured in the faster one reach. Each best-call figure of the same processor also
    keeps its last :data:`PEAK_READINGS_KEPT` readings (``readings``): the best only rises,
    the readings say how far this host's own figure moves (on a 2-vCPU Xeon VM, fp32 read 0.359
    and then 0.455 TOPS). Figures without a recorded processor are replaced."""
    out = {}
    for kind, entry in fresh.items():
        old = previous.get(kind)
        unit = "gbs" if "gbs" in entry else "tops"
        same_chip = isinstance(old, dict) and old.get("processor") is not None
        same_chip = same_chip and old.get("processor") == entry.get("processor")
        if kind in BEST_CALL_FIGURES and same_chip and old.get(unit, 0) > entry[unit]:
            kept = {k: v for k, v in old.items() if k != "remeasured"}
            kept["remeasured"] = {
                unit: entry[unit],
                "note": entry["note"],
                "load": entry.get("load"),
            }
            out[kind] = kept
        else:
            out[kind] = dict(entry)
        if kind in BEST_CALL_FIGURES:
            earlier = peak_readings(old, unit) if same_chip else []
            out[kind]["readings"] = [*earlier, entry[unit]][-PEAK_READINGS_KEPT:]
        placements = merge_placements(
            old.get("placements") if same_chip else None, entry.get("placements") or []
        )
        if placements:
            out[kind]["placements"] = placements
    return out


def cached_peak_exists(device: torch.device) -> bool:
    return cache_path(device_class(device)).exists()


def _read_cache(path: Path) -> dict | None:
    """The cache at ``path`` (``None`` when missing or unreadable)."""
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a missing or unreadable cache is measured
    return previous if isinstance(previous, dict) else None


def store_peak(device: torch.device, fresh: dict) -> dict:
    """``fresh`` figures merged into this device class's cache (:func:`keep_best`; figures
    it does not measure stay as they were); returns the cache as written."""
    path = cache_path(device_class(device))
    previous = _read_cache(path) or {}
    peak = {**previous, **keep_best(previous, fresh)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(peak, indent=2), encoding="utf-8")
    return peak


def cached_peak(device: torch.device, remeasure: bool = False) -> dict:
    """The cached peaks of this device class, measured (and cached) when missing or asked to
    (``remeasure``: a figure the cache read higher on the same processor stays, see
    :func:`keep_best`); raises :class:`PeakRefused` when the machine is too busy to measure."""
    path = cache_path(device_class(device))
    previous = _read_cache(path)
    if previous is not None and not remeasure:
        return previous  # ({} knows no peak: runs have no rooflines)
    return store_peak(device, measure_quiet_peak(device))


def measure_bandwidth(device: torch.device) -> dict:
    """The bandwidth peak alone, in env.json's ``peak`` format (empty when no probe ran)."""
    when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    entry = _bandwidth_peak(_engine(device), device, f"{torch.get_num_threads()} threads", when)
    if entry is None:
        return {}
    chip = processor(device)
    return {"bandwidth": {**entry, "device_class": device_class(device), "processor": chip}}


#: How long a run whose rows are above the bandwidth figure of a placement of the threads waits
#: at most for the host to run its threads there, to read the bus in that placement again: a
#: run's re-measurement of every peak reads the bus in the placement the host gives then (on a
#: 2-vCPU Zen 4 VM it ran with the threads together, 35 GB/s, while the rows it was to judge had
#: streamed 45-52 GB/s with them apart, against a figure for apart read at 39 GB/s hours earlier; a
#: re-measurement apart read 62), and the host moves them every few minutes.
PLACEMENT_WAIT_S = 300.0
#: Seconds between two readings of where the threads run while waiting.
PLACEMENT_POLL_S = 2.0
#: Bandwidth measurements at most while waiting (each loads the machine for seconds; one whose
#: probes ran elsewhere than the reading before them said is tried again).
PLACEMENT_TRIES = 3


@dataclass
class PlacementReread:
    """The bandwidth read again in the placements a run's rows ran in: the cache after,
    each placement's round trip read again (``read``) and those the host did not run the
    threads in while it was waited for (``missed``), and how long that took."""

    peak: dict
    read: list[float]
    missed: list[float]
    waited_s: float


def placements_of(links: list[float]) -> list[float]:
    """The placements of the threads among link readings: each group's median round trip
    (:func:`_by_placement`); readings of a thread that was not running are left out."""
    return [round(statistics.median(g), 1) for g in _by_placement(links, lambda v: v)]


def reread_bandwidth(
    device: torch.device,
    placements_ns: list[float],
    wait_s: float | None = None,
    link: Link = None,
    measure: Callable[[torch.device], dict] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> PlacementReread:
    """Read the bandwidth again in each of ``placements_ns`` (round trips between two of the
    threads): wait, reading ``link`` every :data:`PLACEMENT_POLL_S`, until the host runs the
    threads in one still to read, then measure the bandwidth alone (``measure``: quiet-checked
    by default) and keep its figures in the cache; a placement counts as read when the probes'
    own calls ran in it. Stops when every placement is read, after :data:`PLACEMENT_TRIES`
    measurements, or after ``wait_s`` (:data:`PLACEMENT_WAIT_S`). Raises :class:`PeakRefused`
    when the machine is too busy to measure."""
    from kernelbench.run.cell import link_probe

    wait_s = PLACEMENT_WAIT_S if wait_s is None else wait_s
    link = link if link is not None else link_probe(device)
    if measure is None:
        measure = functools.partial(measure_quiet_peak, measure=measure_bandwidth)
    pending = list(placements_ns)
    read: list[float] = []
    path = cache_path(device_class(device))
    peak = _read_cache(path)
    start, tries = clock(), 0
    while pending and link is not None:
        now = link()
        if now is not None and any(same_placement(now, p) for p in pending):
            fresh = measure(device)
            peak = store_peak(device, fresh)
            tries += 1
            seen = [p["link_ns"] for p in fresh.get("bandwidth", {}).get("placements") or []]
            met = [p for p in pending if any(same_placement(p, s) for s in seen)]
            read += met
            pending = [p for p in pending if p not in met]
            if not seen or tries >= PLACEMENT_TRIES:  # no probe says where it ran, or enough
                break
        if not pending or clock() - start >= wait_s:
            break
        sleep(PLACEMENT_POLL_S)
    return PlacementReread(peak or {}, read, pending, clock() - start)
