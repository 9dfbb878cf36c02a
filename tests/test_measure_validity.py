"""Cold caches, what each sample saw, pre-faulting and the per-row floor of pairs: the engine's
side of measurement validity, on a fake machine (injected clock, usage and eviction)."""

from __future__ import annotations

import math

import pytest

from kernelbench.kernels import cpu_ext
from kernelbench.measure.engine import MeasurementEngine, TimerSettings
from kernelbench.measure.timing import (
    CORE_BACKOFF_FACTOR,
    CORE_HOLD_MIN_SHARE,
    CORE_HOLD_WINDOW,
    MAX_SCAN_BYTES,
    PARTIAL_SCAN_BYTES,
    CacheEvictor,
    CallTimer,
    CoreGate,
    cache_sizes,
    call_timer,
    evict_bytes,
    scan_flushed,
    steal_share,
    steal_ticks,
)


class Machine:
    """A clock advanced by calls; a usage counter that faults ``faults`` pages per call."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []
        self.counters = [0, 0, 0, 0]
        self.faults_next: list[int] = []

    def clock(self) -> float:
        return self.now

    def usage(self) -> tuple[int, int, int, int]:
        return tuple(self.counters)

    def call(self, name: str, ms: float):
        def run():
            self.log.append(name)
            self.now += ms / 1e3
            if self.faults_next:
                self.counters[0] += self.faults_next.pop(0)

        return run

    def evict(self) -> None:
        self.log.append("evict")
        self.now += 0.005  # 5 ms, outside the timed region


def _engine(m: Machine, evict: bool, reuse: bool = False, **settings) -> MeasurementEngine:
    timer = TimerSettings(**settings)
    return MeasurementEngine(
        "cpu",
        timer,
        timer,
        clock=m.clock,
        timer=CallTimer(m.clock, before_call=m.evict if evict else None, usage=m.usage),
        reuse_memory=reuse,
    )


def test_cold_cache_evicts_before_every_timed_call_outside_the_clock():
    m = Machine()
    e = _engine(m, evict=True, warmup_s=0.0, max_samples=4, target_rel_spread=-1.0, ci_target=-1.0)
    cell = e.measure_cell({"a": m.call("a", 2.0)}, baseline=m.call("base", 4.0))
    timed = [name for name in m.log if name != "evict"]
    # every timed call (4 of the row, 5 of the baseline) comes right after an eviction
    assert len(timed) == 9
    assert m.log == [x for name in timed for x in ("evict", name)]
    assert cell.rows["a"].row_ms == pytest.approx((2.0,) * 4)  # the 5 ms eviction is not timed
    # the eviction is a gap the pairing leaves out: the baseline read between equal calls
    assert cell.rows["a"].baseline_ms == pytest.approx((4.0,) * 4)


def test_hot_cache_evicts_nothing():
    m = Machine()
    e = _engine(m, evict=False, warmup_s=0.0, max_samples=3, target_rel_spread=-1.0, ci_target=-1.0)
    e.measure_cell({"a": m.call("a", 2.0)}, baseline=m.call("base", 4.0))
    assert "evict" not in m.log


def test_each_sample_keeps_the_faults_its_call_took():
    m = Machine()
    e = _engine(m, evict=False, warmup_s=0.0, max_samples=3, target_rel_spread=-1.0, ci_target=-1.0)
    m.faults_next = [0, 900, 0, 0, 0, 0, 0]  # baseline, a, baseline, a, ...: a's first faults
    cell = e.measure_cell({"a": m.call("a", 2.0)}, baseline=m.call("base", 4.0))
    assert cell.rows["a"].usage_of("minor_faults") == [900, 0, 0]
    assert cell.baseline.usage_of("minor_faults") == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="no usage field"):
        cell.rows["a"].usage_of("bogus")


def _warm_reusing_engine(m: Machine) -> MeasurementEngine:
    """Memory reused, no eviction, two samples per row whatever their spread."""
    return _engine(
        m,
        evict=False,
        reuse=True,
        warmup_s=0.1,
        max_samples=2,
        target_rel_spread=-1.0,
        ci_target=-1.0,
    )


def test_reused_memory_prefaults_with_one_untimed_call_even_when_warm():
    """A row whose warm-up is already counted (a runner kept from an earlier round) still makes
    one untimed call when the block is entered: that call, not the first sample, faults."""
    m = Machine()
    e = _warm_reusing_engine(m)
    m.faults_next = [500, 700]  # the first call of each after entering faults
    cell = e.measure_cell(
        {"a": m.call("a", 2.0)},
        baseline=m.call("base", 4.0),
        warmed_s={"a": 1.0},
        baseline_warmed_s=1.0,
    )
    assert m.log[:2] == ["a", "base"]  # untimed, before the cycles
    assert cell.rows["a"].usage_of("minor_faults") == [0, 0]
    assert cell.baseline.usage_of("minor_faults") == [0, 0, 0]


def test_the_heap_cushion_counts_what_the_first_calls_faulted_in(monkeypatch):
    """A row's first call (round 0, checked for accuracy) faults its temporaries in, so its
    warm-up in the block faults nothing: the cushion is still sized by what the row needs,
    and only once (the next block starts from its own warm-up)."""
    from kernelbench.measure import engine as engine_module

    asked: list[int] = []
    monkeypatch.setattr(engine_module, "cushion_heap", lambda nbytes: asked.append(nbytes) or 0)
    m = Machine()
    e = _warm_reusing_engine(m)
    m.faults_next = [600]  # the first call faults; every later call reuses its pages
    _, first_s = e.first_call(m.call("a", 2.0))
    e.measure_cell({"a": m.call("a", 2.0)}, m.call("base", 4.0), warmed_s={"a": first_s})
    m.faults_next = [50]  # the next block's warm-up faults 50 pages
    e.measure_cell({"a": m.call("a", 2.0)}, m.call("base", 4.0), warmed_s={"a": 1.0})
    page = engine_module.PAGE_BYTES
    assert asked == [
        engine_module.CUSHION_FACTOR * 600 * page,
        engine_module.CUSHION_FACTOR * 50 * page,
    ]


def test_a_row_at_its_floor_takes_a_pair_more_for_each_faulted_one():
    """The floor of pairs counts pairs whose call did not fault in memory while timed."""
    m = Machine()
    common = dict(warmup_s=0.0, budget_s=0.001, target_rel_spread=-1.0, ci_target=-1.0)
    e = _engine(m, evict=False, min_pairs=3, **common)
    # baseline, a, baseline, a, ...: a's second call faults 1000 pages, the baseline's none
    m.faults_next = [0, 0, 0, 1000] + [0] * 20
    cell = e.measure_cell({"a": m.call("a", 50.0)}, baseline=m.call("base", 50.0))
    assert cell.rows["a"].usage_of("minor_faults") == [0, 1000, 0, 0]
    m.faults_next = [0] + [255, 0] * 3 + [0] * 20  # under the threshold: not faulted
    cell = e.measure_cell({"a": m.call("a", 50.0)}, baseline=m.call("base", 50.0))
    assert len(cell.rows["a"].row_ms) == 3
    m.faults_next = [0] + [5000, 0] * 10  # every call of a faulted: twice the floor, no more
    cell = e.measure_cell({"a": m.call("a", 50.0)}, baseline=m.call("base", 50.0))
    assert len(cell.rows["a"].row_ms) == 6


def test_min_pairs_keeps_sampling_past_the_budget():
    m = Machine()
    common = dict(warmup_s=0.0, budget_s=0.001, target_rel_spread=-1.0, ci_target=-1.0)
    one = _engine(m, evict=False, min_pairs=1, **common).measure_cell(
        {"a": m.call("a", 50.0)}, baseline=m.call("base", 50.0)
    )
    assert len(one.rows["a"].row_ms) == 1  # the budget alone stops a long row at one pair
    three = _engine(m, evict=False, min_pairs=3, **common).measure_cell(
        {"a": m.call("a", 50.0)}, baseline=m.call("base", 50.0)
    )
    assert len(three.rows["a"].row_ms) == 3


def test_cache_sizes_read_from_sysfs(tmp_path):
    for i, (kind, level, size) in enumerate(
        [
            ("Data", 1, "48K"),
            ("Instruction", 1, "32K"),
            ("Unified", 2, "1024K"),
            ("Unified", 3, "32768K"),
        ]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "type").write_text(kind + "\n")
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(size + "\n")
    sizes = cache_sizes(tmp_path)
    assert sizes == {"L1d": 48 * 1024, "L2": 2**20, "L3": 32 * 2**20}
    assert evict_bytes(sizes) == 64 * 2**20
    assert cache_sizes(tmp_path / "missing") == {}
    assert evict_bytes({}) > 0  # no sysfs: a fixed buffer, still evicting


def test_steal_share_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    before = steal_ticks(stat)
    assert before == (40, 1000)
    stat.write_text("cpu  150 0 50 850 10 0 0 90 0 0\n")
    assert steal_share(before, steal_ticks(stat)) == pytest.approx(50 / 150)
    assert steal_ticks(tmp_path / "none") is None
    stat.write_text("cpu 1 2 3\n")  # no steal column
    assert steal_ticks(stat) is None
    assert steal_share(None, (1, 2)) is None


def test_call_timer_refuses_an_unknown_cache_mode():
    with pytest.raises(ValueError, match="cache must be one of cold, hot"):
        call_timer("cpu", cache="warm")
    assert call_timer("cpu", cache="hot").before_call is None
    assert call_timer("cpu", cache="cold").before_call is not None


def test_the_engine_evicts_only_when_asked_on_the_cpu():
    """Peaks (measured with the engine's defaults) keep the CPU's caches warm; a run asks."""
    settings = TimerSettings()
    assert MeasurementEngine("cpu", settings, settings).timer.before_call is None
    cold = MeasurementEngine("cpu", settings, settings, cache="cold")
    assert cold.timer.before_call is not None


class BusMachine(Machine):
    """An eviction that reads 64 MB in a time set per call: the bus's bandwidth moves."""

    def __init__(self, evict_ms: list[float]) -> None:
        super().__init__()
        self.evict_ms = list(evict_ms)

    def evict(self) -> None:
        self.log.append("evict")
        self.now += self.evict_ms.pop(0) / 1e3


def _two_pairs(m: BusMachine, **timer_kw):
    """A cell of one row ``a`` (2 ms) and the baseline (4 ms), two pairs, timed on ``m`` by a
    cold timer with ``timer_kw``."""
    timer = TimerSettings(warmup_s=0.0, max_samples=2, target_rel_spread=-1.0, ci_target=-1.0)
    e = MeasurementEngine(
        "cpu",
        timer,
        timer,
        clock=m.clock,
        timer=CallTimer(m.clock, before_call=m.evict, usage=m.usage, **timer_kw),
    )
    return e.measure_cell({"a": m.call("a", 2.0)}, baseline=m.call("base", 4.0))


def test_each_sample_keeps_the_bus_bandwidth_its_eviction_read():
    # baseline, a, baseline, a, baseline: evictions of 64 MiB in 1, 2, 1, 4, 1 ms
    m = BusMachine([1.0, 2.0, 1.0, 4.0, 1.0])
    cell = _two_pairs(m, probe_bytes=64 * 2**20)
    gb = 64 * 2**20 / 1e9  # what one eviction reads
    assert cell.rows["a"].bus_gbps == pytest.approx((gb / 2e-3, gb / 4e-3))
    assert cell.baseline.bus_gbps == pytest.approx((gb / 1e-3,) * 3)


def test_each_sample_keeps_the_link_reading_taken_after_its_eviction():
    m = BusMachine([1.0] * 5)
    links = iter([50.0, 300.0, 51.0, 310.0, 52.0])

    def probe() -> float:
        m.log.append("link")
        return next(links)

    cell = _two_pairs(m, link_probe=probe)
    # baseline, a, baseline, a, baseline: each call's own reading, aligned with its samples
    assert cell.rows["a"].link_ns == (300.0, 310.0)
    assert cell.baseline.link_ns == (50.0, 51.0, 52.0)
    # every call: the eviction, then the reading, then the call
    timed = m.log[m.log.index("evict") :]
    assert timed == ["evict", "link", "base", "evict", "link", "a"] * 2 + ["evict", "link", "base"]
    # a hot timer takes no reading
    hot = CallTimer(m.clock, link_probe=probe)
    hot(m.call("a", 1.0))
    assert hot.last_link_ns is None and hot.link_probe is None


def test_each_sample_keeps_the_core_reading_taken_after_its_link_reading():
    """How fast the cores ran before each call: read after the eviction and the link probe,
    aligned with the samples; a hot timer reads none."""
    m = BusMachine([1.0] * 5)
    cores = iter([13e3, 26e3, 13e3, 25e3, 14e3])

    def link() -> float:
        m.log.append("link")
        return 100.0

    def core() -> float:
        m.log.append("core")
        return next(cores)

    cell = _two_pairs(m, link_probe=link, core_probe=core)
    assert cell.rows["a"].core_ns == (26e3, 25e3)
    assert cell.baseline.core_ns == (13e3, 13e3, 14e3)
    timed = m.log[m.log.index("evict") :]
    assert timed[:4] == ["evict", "link", "core", "base"]
    hot = CallTimer(m.clock, core_probe=core)
    hot(m.call("a", 1.0))
    assert hot.last_core_ns is None and hot.core_probe is None
    assert hot.last_reading == (None, None, None, 0.0)


class CoreMachine(BusMachine):
    """A core probe whose readings are given in order, each taking 15 us of the clock."""

    def __init__(self, readings: list[float]) -> None:
        super().__init__([1.0] * 100)
        self.readings = list(readings)

    def probe(self) -> float:
        self.log.append("gate")
        self.now += 15e-6
        return self.readings.pop(0)


def test_the_core_gate_waits_until_the_cores_read_fast_again():
    m = CoreMachine([13e3, 14e3, 30e3, 28e3, 13.5e3])
    gate = CoreGate(m.probe, max_wait_s=1.0, clock=m.clock)
    assert gate.wait() == 0.0 and gate.wait() == 0.0  # fast: one reading each
    assert gate.wait() == pytest.approx(45e-6)  # slow, slow, fast: three readings
    assert m.readings == [] and gate.fastest_ns == 13e3 and gate.gave_up == 0


def test_a_core_gate_whose_wait_runs_out_takes_the_next_calls_as_they_come_for_a_while():
    m = CoreMachine([10e3] + [30e3] * 10 + [30e3] + [30e3, 10e3])
    gate = CoreGate(m.probe, max_wait_s=100e-6, clock=m.clock)
    assert gate.wait() == 0.0
    waited = gate.wait()  # slow throughout: gives up once the cap has passed
    assert 100e-6 <= waited < 130e-6 and gate.gave_up == 1
    probes = len(m.readings)
    assert gate.wait() == 0.0 and len(m.readings) == probes  # backing off: not even a probe
    m.now += CORE_BACKOFF_FACTOR * 100e-6
    assert gate.wait() > 0.0 and gate.gave_up == 1  # waits again, and the cores came back


def _waits_then_readings(gate: CoreGate, m: CoreMachine, held: list[bool]) -> None:
    """One wait per entry of ``held`` (slow, then fast at the gate), each followed by the
    reading before its call: fast where it held, slow where it did not."""
    for h in held:
        m.readings += [30e3, 10e3]
        assert gate.wait() > 0.0
        gate.note_reading(10e3 if h else 30e3)


def test_a_core_gate_whose_waits_do_not_hold_takes_the_next_calls_as_they_come_for_a_while():
    """The cores read fast at the end of each wait and slow again just before the call (a host
    that changes their speed faster than a wait and an eviction take): once fewer than a
    third of the last waits held, the gate backs off as after a wait that ran out."""
    m = CoreMachine([10e3])
    gate = CoreGate(m.probe, max_wait_s=1.0, clock=m.clock)
    assert gate.wait() == 0.0
    gate.note_reading(10e3)  # no wait: not counted
    held = math.ceil(CORE_HOLD_MIN_SHARE * CORE_HOLD_WINDOW)  # enough to keep waiting
    pattern = [True] * held + [False] * (CORE_HOLD_WINDOW - held)
    _waits_then_readings(gate, m, pattern)
    assert gate.not_held == 0
    _waits_then_readings(gate, m, [False])  # the window slides: one held fewer
    assert gate.not_held == 1 and gate.gave_up == 0
    m.readings = [30e3]
    assert gate.wait() == 0.0 and m.readings == [30e3]  # backing off: not even a probe
    gate.note_reading(30e3)  # a call taken as it came is not a wait that failed
    m.now += CORE_BACKOFF_FACTOR * 1.0
    m.readings = []
    # waits again, judged on a fresh window: 15 failed waits do not back off yet
    _waits_then_readings(gate, m, [False] * (CORE_HOLD_WINDOW - 1))
    assert gate.not_held == 1
    m.readings = [30e3, 10e3]
    assert gate.wait() > 0.0


def test_the_timer_tells_its_gate_the_reading_before_each_call():
    """Through a cold timer: the reading after the eviction judges the gate's wait."""
    m = CoreMachine([10e3] + [30e3, 10e3] * CORE_HOLD_WINDOW + [30e3])
    gate = CoreGate(m.probe, max_wait_s=1.0, clock=m.clock)
    slow_again = iter([10e3] + [30e3] * (CORE_HOLD_WINDOW + 1))
    timer = CallTimer(
        m.clock, before_call=m.evict, core_probe=lambda: next(slow_again), core_gate=gate
    )
    for _ in range(CORE_HOLD_WINDOW + 1):
        timer(m.call("a", 1.0))
    assert gate.not_held == 1
    timer(m.call("a", 1.0))
    assert timer.last_core_wait_s == 0.0 and m.readings == [30e3]  # backing off


def test_a_core_gate_without_a_wait_or_a_reading_never_waits():
    m = CoreMachine([30e3, 10e3])
    assert CoreGate(m.probe, max_wait_s=0.0, clock=m.clock).wait() == 0.0
    assert m.log == []  # never probed
    assert CoreGate(lambda: None, max_wait_s=1.0, clock=m.clock).wait() == 0.0
    with pytest.raises(ValueError, match="max_wait_s"):
        CoreGate(m.probe, max_wait_s=-1.0)


def test_each_sample_records_its_wait_for_fast_cores_outside_its_clock():
    """The gate runs before the eviction, and its wait is not in the call's time."""
    m = CoreMachine([13e3, 40e3, 13e3, 13e3, 13e3, 13e3])
    gate = CoreGate(m.probe, max_wait_s=1.0, clock=m.clock)
    cell = _two_pairs(m, core_gate=gate)
    # baseline, a (one slow reading, then a fast one: 30 us), baseline, a, baseline
    assert cell.rows["a"].row_ms == pytest.approx((2.0, 2.0))
    assert cell.rows["a"].core_wait_ms == pytest.approx((0.030, 0.0))
    assert cell.baseline.core_wait_ms == pytest.approx((0.0, 0.0, 0.0))
    timed = m.log[m.log.index("gate") :]
    assert timed[:6] == ["gate", "evict", "base", "gate", "gate", "evict"]
    # without a gate the rows record no waits
    plain = _two_pairs(BusMachine([1.0] * 5))
    assert plain.rows["a"].core_wait_ms == () and plain.baseline.core_wait_ms == ()


def test_no_probe_no_bus_readings():
    m = Machine()
    e = _engine(m, evict=True, warmup_s=0.0, max_samples=2, target_rel_spread=-1.0, ci_target=-1.0)
    cell = e.measure_cell({"a": m.call("a", 2.0)}, baseline=m.call("base", 4.0))
    assert cell.rows["a"].bus_gbps == () and cell.baseline.bus_gbps == ()
    hot = CallTimer(m.clock, before_call=None, probe_bytes=1 << 20)
    hot(m.call("a", 1.0))
    assert hot.last_bus_gbps is None and hot.probe_bytes is None


def test_a_cold_cpu_timer_reads_the_bus_with_its_eviction():
    cold = call_timer("cpu", cache="cold")
    assert cold.probe_bytes == cold.before_call.bytes
    assert call_timer("cpu", cache="hot").probe_bytes is None


def test_a_last_level_cache_over_half_the_scan_cap_gets_a_short_scan_only_where_lines_flush():
    huge = {"L1d": 48 * 1024, "L2": 2 * 2**20, "L3": 300 * 2**20}
    assert evict_bytes(huge, flushable=True) == PARTIAL_SCAN_BYTES
    assert evict_bytes(huge, flushable=False) == 600 * 2**20  # nothing flushes: scan it all
    small = {"L3": 16 * 2**20}
    assert evict_bytes(small, flushable=True) == evict_bytes(small, flushable=False) == 32 * 2**20
    at_cap = {"L3": MAX_SCAN_BYTES // 2}  # evicted whole, as far as the cap allows
    assert evict_bytes(at_cap, flushable=True) == MAX_SCAN_BYTES
    just_over = {"L3": MAX_SCAN_BYTES // 2 + 2**20}
    assert evict_bytes(just_over, flushable=True) == PARTIAL_SCAN_BYTES
    # the short scan is the one flushed after each read (where the extension can flush)
    assert scan_flushed(PARTIAL_SCAN_BYTES, huge) == cpu_ext.available()
    assert not scan_flushed(600 * 2**20, huge) and not scan_flushed(32 * 2**20, small)


def test_a_short_scan_is_flushed_after_its_read_outside_the_bus_reading_and_before_the_call():
    """The short scan's buffer is flushed after each read so that the next read comes from
    memory; the flush is not part of the read the bus bandwidth is computed from."""
    m = BusMachine([2.0, 2.0])
    flushed: list[tuple[int, int]] = []

    def flush(address: int, nbytes: int) -> None:
        flushed.append((address, nbytes))

    evictor = CacheEvictor(1 << 20, flush=flush)
    assert flushed == [(evictor.buffer.data_ptr(), 1 << 20)]  # out of cache from the start

    def settle() -> None:
        m.log.append("settle")
        m.now += 0.050  # a slow flush: must not lower the bus reading
        evictor.settle()

    timer = CallTimer(
        m.clock, before_call=m.evict, usage=m.usage, probe_bytes=64 * 10**6, after_probe=settle
    )
    ms = timer(m.call("a", 1.0))
    assert m.log == ["evict", "settle", "a"]
    assert ms == pytest.approx(1.0)
    assert timer.last_bus_gbps == pytest.approx(32.0)  # 64 MB in 2 ms, the flush left out
    assert len(flushed) == 2
    assert CallTimer(m.clock, after_probe=settle).after_probe is None  # hot: nothing to settle


def test_an_eviction_that_took_no_measurable_time_leaves_no_stale_reading():
    m = BusMachine([1.0, 0.0])
    timer = CallTimer(m.clock, before_call=m.evict, usage=m.usage, probe_bytes=64 * 2**20)
    timer(m.call("a", 1.0))
    assert timer.last_bus_gbps is not None
    timer(m.call("a", 1.0))  # the clock did not move: no rate to read
    assert timer.last_bus_gbps is None


def test_each_row_evicts_its_own_memory_after_the_scan_and_outside_the_clock():
    """A scan of the cache leaves what a scan-resistant cache protects: each row's own flush
    runs after it, before that row's timed calls only, and is a gap the pairing leaves out."""
    m = Machine()
    e = _engine(m, evict=True, warmup_s=0.0, max_samples=2, target_rel_spread=-1.0, ci_target=-1.0)

    def flush(name: str):
        def run() -> None:
            m.log.append(f"flush {name}")
            m.now += 0.003

        return run

    cell = e.measure_cell(
        {"a": m.call("a", 2.0), "b": m.call("b", 3.0)},
        baseline=m.call("base", 4.0),
        evict_own={"a": flush("a")},
        baseline_evict_own=flush("base"),
    )
    timed = [x for x in m.log if x in ("a", "b", "base")]
    for i, name in enumerate(m.log):
        if name in ("a", "base"):
            assert m.log[i - 2 : i] == ["evict", f"flush {name}"]
        elif name == "b":
            assert m.log[i - 1] == "evict"
    assert len(timed) == 2 + 2 + 3
    assert cell.rows["a"].row_ms == pytest.approx((2.0, 2.0))
    assert cell.rows["a"].baseline_ms == pytest.approx((4.0, 4.0))
    assert cell.rows["b"].baseline_ms == pytest.approx((4.0, 4.0))


def test_a_hot_timer_never_runs_a_rows_own_eviction():
    m = Machine()
    e = _engine(m, evict=False, warmup_s=0.0, max_samples=2, target_rel_spread=-1.0, ci_target=-1.0)
    e.measure_cell(
        {"a": m.call("a", 2.0)},
        baseline=m.call("base", 4.0),
        evict_own={"a": lambda: m.log.append("flush")},
        baseline_evict_own=lambda: m.log.append("flush"),
    )
    assert "flush" not in m.log


def test_the_bus_reading_times_the_scan_alone():
    m = BusMachine([2.0])
    timer = CallTimer(m.clock, before_call=m.evict, usage=m.usage, probe_bytes=64 * 2**20)

    def flush() -> None:
        m.now += 0.010

    timer(m.call("a", 1.0), flush)
    assert timer.last_bus_gbps == pytest.approx(64 * 2**20 / 1e9 / 2e-3)
    assert timer.last_prepare_s == pytest.approx(0.012)


def test_each_stage_evicts_its_own_memory_when_cold():
    m = Machine()
    e = _engine(m, evict=True, warmup_s=0.0, max_samples=2, target_rel_spread=-1.0, ci_target=-1.0)
    e.time_stages(
        {"quantize": m.call("quantize", 1.0), "dequantize": m.call("dequantize", 1.0)},
        evict_own={"quantize": lambda: m.log.append("flush quantize")},
    )
    for i, name in enumerate(m.log):
        if name == "quantize" and m.log[i - 1].startswith(("evict", "flush")):
            assert m.log[i - 2 : i] == ["evict", "flush quantize"]
    assert m.log.count("flush quantize") >= 2 and "flush dequantize" not in m.log
