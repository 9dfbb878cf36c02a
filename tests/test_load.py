"""The machine's load from /proc (injected readings, never this machine's): busy or quiet,
and a peak measured only on a quiet machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from kernelbench.run import load, peak
from kernelbench.run.load import Load, LoadSample, load_between, quiet_check, read_load

HZ = os.sysconf("SC_CLK_TCK")


def fake_proc(path: Path, loadavg: float, busy_s: float, steal_s: float) -> Path:
    """A /proc with a loadavg and a stat whose cpu line has these busy and stolen seconds."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "loadavg").write_text(f"{loadavg} 0.50 0.40 1/300 12345\n")
    user, steal = int(busy_s * HZ), int(steal_s * HZ)
    (path / "stat").write_text(f"cpu  {user} 0 0 999999 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")
    return path


def test_read_load_parses_loadavg_and_stat(tmp_path):
    s = read_load(fake_proc(tmp_path, 1.75, 12.0, 3.0), clock=lambda: 5.0)
    assert s.loadavg_1m == 1.75 and s.at_s == 5.0
    assert s.busy_s == pytest.approx(12.0) and s.steal_s == pytest.approx(3.0)
    gone = read_load(tmp_path / "missing")
    assert gone.loadavg_1m is None and gone.busy_s is None and gone.steal_s is None


def test_other_processes_and_steal_make_the_machine_busy():
    quiet = load_between(LoadSample(0, 0.1, 10, 0, 1), LoadSample(10, 0.2, 11, 0.1, 2), 2)
    assert not quiet.busy and quiet.other_cores == pytest.approx(0.0)  # all of it was ours
    other = load_between(LoadSample(0, 1, 10, 0, 1), LoadSample(10, 2, 21, 0, 2), 2)
    assert other.busy and other.other_cores == pytest.approx(1.0)
    assert "other processes used 1.00 cores" in other.why
    stolen = load_between(LoadSample(0, 0, 10, 0, 1), LoadSample(10, 0, 11, 2.0, 2), 2)
    assert stolen.busy and "stole 0.20 cores" in stolen.why


def test_quiet_check_reads_before_and_after_its_sleep(tmp_path):
    readings = iter([(0.0, 10.0), (1.0, 11.5)])  # 1.5 CPU-seconds in 1 s while we slept
    proc = tmp_path / "proc"

    def sleep(_s):
        fake_proc(proc, 2.0, 11.5, 0.0)

    fake_proc(proc, 2.0, 10.0, 0.0)
    clock = iter(t for t, _ in readings)
    result = quiet_check(1.0, proc, sleep, lambda: next(clock))
    assert result.busy and result.other_cores == pytest.approx(1.5, abs=0.05)


def _load(busy: bool) -> Load:
    return Load(1.0, 1.0 if busy else 0.0, 0.0, 1.0, busy, "other processes used 1.00 cores")


def test_a_peak_is_measured_on_a_quiet_machine_and_records_its_load():
    samples = iter([LoadSample(0, 0.1, 10, 0, 1), LoadSample(30, 0.1, 70, 0, 61)])
    got = peak.measure_quiet_peak(
        torch.device("cpu"),
        measure=lambda dev: {"int8": {"tops": 1.9, "note": "x"}},
        quiet=lambda: _load(False),
        read=lambda: next(samples),
        wait=lambda s: None,
    )
    assert got["int8"]["tops"] == 1.9 and got["int8"]["load"]["busy"] is False


def test_a_busy_machine_is_retried_then_refused():
    measured, waits = [], []
    with pytest.raises(peak.PeakRefused, match="busy .*before measuring.*peak --remeasure"):
        peak.measure_quiet_peak(
            torch.device("cpu"),
            measure=lambda dev: measured.append(dev) or {},
            quiet=lambda: _load(True),
            wait=waits.append,
        )
    assert not measured and len(waits) == peak.QUIET_TRIES - 1


def test_load_during_the_measurement_refuses_its_figure():
    # other processes took 1 core-second per second while the peak was measured (ours: 2)
    samples = iter([LoadSample(0, 0, 0, 0, 0), LoadSample(10, 0, 30, 0, 20)] * peak.QUIET_TRIES)
    with pytest.raises(peak.PeakRefused, match="while measuring, other processes used 1.00"):
        peak.measure_quiet_peak(
            torch.device("cpu"),
            measure=lambda dev: {"int8": {"tops": 0.5}},
            quiet=lambda: _load(False),
            read=lambda: next(samples),
            wait=lambda s: None,
        )


def test_the_module_reads_proc_by_default():
    assert Path("/proc") == load.PROC


class _FakeGemvBackend:
    """Runs a one-token GEMV in ``seconds`` of an injected clock (or cannot build it)."""

    def __init__(self, clock: list[float], seconds: float, fails: bool = False) -> None:
        self.clock, self.seconds, self.fails = clock, seconds, fails

    def supports(self, method, device, dtype, m, k, n):
        return method == "int8_raw" and m == 1

    def build(self, problem):
        if self.fails:
            raise RuntimeError("no kernel for this shape")

        def run():
            self.clock[0] += self.seconds

        return type("Runner", (), {"run": staticmethod(run)})()


def test_bandwidth_is_the_fastest_gemv_of_any_backend_when_it_beats_the_stream_probes(monkeypatch):
    import kernelbench.backends as backends
    from kernelbench.measure.engine import MeasurementEngine, TimerSettings

    now = [0.0]
    monkeypatch.setattr(peak, "GEMV_SHAPE", (1, 64, 256))  # 16 KiB of int8 weight
    monkeypatch.setattr(
        backends,
        "all_backends",
        lambda: {
            "slow": _FakeGemvBackend(now, 1e-6),
            "fast": _FakeGemvBackend(now, 0.5e-6),
            "broken": _FakeGemvBackend(now, 1e-9, fails=True),
        },
    )
    settings = TimerSettings(budget_s=1e-4, warmup_s=0.0, min_samples=3, max_samples=5)
    engine = MeasurementEngine(
        torch.device("cpu"), settings, settings, clock=lambda: now[0], cache="hot"
    )
    readings = iter(range(1000))
    calls = peak._gemv_calls(engine, torch.device("cpu"), link=lambda: 60.0 + next(readings))
    assert len(calls) == 2 * peak.BANDWIDTH_CALLS  # the broken backend adds none
    best = max(calls, key=lambda c: c.gbs)
    assert best.gbs == pytest.approx(64 * 256 / 0.5e-6 / 1e9)  # the fast backend
    assert best.how.startswith("fast int8_raw GEMV 1x64x256")
    # each call carries the link reading taken just before it
    assert [c.link_ns for c in calls] == [60.0 + i for i in range(len(calls))]
    monkeypatch.setattr(peak, "_stream_calls", lambda *a: [peak.BandwidthCall(1.0, None, "sum")])
    fastest = max(peak._bandwidth_calls(engine, torch.device("cpu")), key=lambda c: c.gbs)
    assert (fastest.gbs, fastest.how) == (best.gbs, best.how)


def test_a_peak_tolerates_more_stolen_time_than_a_run_header():
    """Neighbours stealing 7.5% of two cores: a run says it was busy, a peak (each probe's best
    call) is still measured; 25% stolen refuses both."""
    some = (LoadSample(0, 0, 10, 0, 1), LoadSample(10, 0, 11, 1.5, 2))
    assert load_between(*some, cores=2).busy
    assert not load_between(*some, cores=2, steal_share=peak.PEAK_STEAL_SHARE).busy
    much = (LoadSample(0, 0, 10, 0, 1), LoadSample(10, 0, 11, 5.0, 2))
    assert load_between(*much, cores=2, steal_share=peak.PEAK_STEAL_SHARE).busy


def _readings(steps: list[tuple[float, float]]):
    """A reader of (seconds since the last reading, other processes' cores meanwhile)."""
    at, busy = [0.0], [100.0]
    seq = iter([(0.0, 0.0), *steps])

    def read() -> LoadSample:
        dt, cores = next(seq)
        at[0] += dt
        busy[0] += dt * cores
        return LoadSample(at[0], 1.0, busy[0], 0.0, 0.0)

    return read


def test_a_run_busy_for_part_of_its_time_is_busy_though_its_average_is_not():
    quiet = load.LoadWatch(_readings([(60.0, 0.0)] * 10))
    for _ in range(9):
        quiet.mark()
    summary = quiet.summary()
    assert not summary["busy"] and summary["busy_share"] == 0.0 and summary["seconds"] == 600.0
    # 4 of 20 minutes with a neighbour on one core: 0.2 cores on average, under the 0.25 bar
    steps = [(60.0, 0.0)] * 8 + [(60.0, 1.0)] * 4 + [(60.0, 0.0)] * 8
    partly = load.LoadWatch(_readings(steps))
    for _ in range(19):
        partly.mark()
    summary = partly.summary()
    assert summary["other_cores"] == pytest.approx(0.2) and summary["busy"]
    assert summary["busy_share"] == pytest.approx(0.2)
    assert "busy for 20% of the run" in summary["why"]
    assert "other processes used 1.00 cores" in summary["why"]
    # readings closer than MIN_INTERVAL_S are pooled: one busy second alone is not judged
    short = load.LoadWatch(_readings([(0.5, 2.0), (0.5, 0.0), (60.0, 0.0)]))
    short.mark()
    short.mark()
    assert short.busy_s == 0.0 and short.last.at_s == 0.0


def test_a_run_beside_a_busy_machine_says_so_and_records_it(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from kernelbench.cli import app

    monkeypatch.setattr(load, "read_load", _readings([(10.0, 2.0)] * 10_000))
    out = tmp_path / "run"
    said = _tiny_run(out)
    assert "The machine was busy while this run ran: other processes used" in said
    recorded = json.loads((out / "env.json").read_text())["load"]
    assert recorded["busy"] and recorded["other_cores"] > 1.5
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert "The machine was busy" in " ".join(shown.output.split())


def test_a_busy_run_resumed_on_a_quiet_machine_stays_busy(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from kernelbench.cli import app

    monkeypatch.setattr(load, "read_load", _readings([(10.0, 2.0)] * 10_000))
    out = tmp_path / "run"
    _tiny_run(out)
    first = json.loads((out / "env.json").read_text())["load"]
    monkeypatch.setattr(load, "read_load", _readings([(10.0, 0.0)] * 10_000))
    _tiny_run(out, "--resume")
    recorded = json.loads((out / "env.json").read_text())["load"]
    assert recorded["busy"] and recorded["processes"] == 2
    assert recorded["seconds"] > first["seconds"]
    assert 0 < recorded["other_cores"] < first["other_cores"]  # weighted by each part's time
    shown = CliRunner().invoke(app, ["show", str(out)])
    assert "The machine was busy" in " ".join(shown.output.split())


def test_combined_load_weights_each_part_by_its_time():
    quiet = load.Load(300.0, 0.0, 0.0, 0.1, False, "").as_dict() | {"busy_share": 0.0}
    why = "other processes used 1.00 cores"
    busy = load.Load(100.0, 1.0, 0.2, 2.0, True, why).as_dict() | {"busy_share": 1.0}
    got = load.combined_load(busy, quiet)
    assert got["seconds"] == 400.0 and got["other_cores"] == pytest.approx(0.25)
    assert got["steal_cores"] == pytest.approx(0.05) and got["loadavg_1m"] == 0.1
    assert got["busy"] and got["why"] == busy["why"] and got["busy_share"] == pytest.approx(0.25)
    assert load.combined_load(None, quiet) == quiet  # a run's first process
    calm = load.combined_load(quiet, quiet)
    assert not calm["busy"] and calm["processes"] == 2
    # neither part busy alone, their busy intervals together over BUSY_TIME_SHARE: busy
    part = dict(quiet, busy_share=0.08)
    mixed = load.combined_load(part, dict(quiet, busy_share=0.14))
    assert mixed["busy"] and "busy for 11% of the run" in mixed["why"]
    assert load.combined_load(part, dict(quiet, other_cores=None))["other_cores"] is None


def _entry(value: float, chip: str | None = "AuthenticAMD-26-2-1", unit: str = "tops") -> dict:
    return {unit: value, "source": "measured", "note": f"best call {value}", "processor": chip}


def test_a_remeasurement_keeps_a_higher_best_call_of_the_same_processor():
    previous = {
        "int8": _entry(2.13),
        "16bit": _entry(1.00),
        "bandwidth": _entry(78.5, unit="gbs"),
        "first_touch": _entry(40.0, unit="gbs"),
    }
    fresh = {
        "int8": _entry(2.02),  # a slower moment: the earlier best stays, the reading beside it
        "16bit": _entry(1.06),  # higher: replaces
        "bandwidth": _entry(54.2, unit="gbs"),
        "first_touch": _entry(33.3, unit="gbs"),  # a median, not a best call: always the fresh
    }
    got = peak.keep_best(previous, fresh)
    assert got["int8"]["tops"] == 2.13 and got["int8"]["remeasured"]["tops"] == 2.02
    assert got["16bit"] == {**fresh["16bit"], "readings": [1.00, 1.06]}
    assert got["bandwidth"]["gbs"] == 78.5 and got["bandwidth"]["remeasured"]["gbs"] == 54.2
    assert got["first_touch"] == fresh["first_touch"]  # a median: no readings kept
    # every quiet reading is kept beside the best, which only rises
    assert got["int8"]["readings"] == [2.13, 2.02] and got["bandwidth"]["readings"] == [78.5, 54.2]
    # kept twice: the newest lower reading, never a chain of them; the readings grow
    again = peak.keep_best(got, {"int8": _entry(2.05)})
    assert again["int8"]["remeasured"] == {"tops": 2.05, "note": "best call 2.05", "load": None}
    assert again["int8"]["readings"] == [2.13, 2.02, 2.05]
    # an entry written before readings were kept: its best and its remeasured reading count
    legacy = {"int8": {**_entry(2.13), "remeasured": {"tops": 1.9, "note": "", "load": None}}}
    assert peak.keep_best(legacy, {"int8": _entry(2.3)})["int8"]["readings"] == [2.13, 1.9, 2.3]


def test_a_remeasurement_keeps_each_placement_s_best_of_the_same_processor_only():
    near = {"link_ns": 61.0, "gbs": 34.5, "calls": 60, "note": "sum"}
    far = {"link_ns": 290.0, "gbs": 63.1, "calls": 60, "note": "gemv"}
    previous = {"bandwidth": {**_entry(63.1, unit="gbs"), "placements": [far]}}
    fresh = {"bandwidth": {**_entry(34.5, unit="gbs"), "placements": [near]}}
    got = peak.keep_best(previous, fresh)["bandwidth"]
    assert got["gbs"] == 63.1 and got["placements"] == [near, far]
    lower_near = {"bandwidth": {**_entry(30.0, unit="gbs"), "placements": [{**near, "gbs": 30.0}]}}
    assert peak.keep_best({"bandwidth": got}, lower_near)["bandwidth"]["placements"] == [near, far]
    another_chip = {
        "bandwidth": {**_entry(63.1, "GenuineIntel-6-207-2", "gbs"), "placements": [far]}
    }
    assert peak.keep_best(another_chip, fresh)["bandwidth"]["placements"] == [near]
    assert (
        "placements" not in peak.keep_best({}, {"bandwidth": _entry(34.5, unit="gbs")})["bandwidth"]
    )


def test_a_peak_keeps_its_last_readings_only():
    cached = {"int8": _entry(3.0)}
    for i in range(peak.PEAK_READINGS_KEPT + 5):
        cached = peak.keep_best(cached, {"int8": _entry(2.0 + i / 100)})
    readings = cached["int8"]["readings"]
    assert len(readings) == peak.PEAK_READINGS_KEPT and readings[-1] == 2.0 + 16 / 100
    assert cached["int8"]["tops"] == 3.0  # the best stays though its reading aged out


def test_a_remeasurement_replaces_figures_of_another_or_unknown_processor():
    other = {"int8": _entry(2.13, chip="AuthenticAMD-25-17-1")}
    unknown = {"int8": _entry(2.13, chip=None)}
    fresh = {"int8": _entry(1.0)}
    # another host's readings are not this one's spread
    own = {"int8": {**fresh["int8"], "readings": [1.0]}}
    assert peak.keep_best(other, fresh) == own
    assert peak.keep_best(unknown, fresh) == own
    assert peak.keep_best({"int8": _entry(2.13)}, {"int8": _entry(1.0, chip=None)}) == {
        "int8": {**_entry(1.0, chip=None), "readings": [1.0]}
    }


def test_cached_peak_measures_once_and_keeps_the_best_when_remeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELBENCH_CACHE", str(tmp_path))
    readings = iter([{"int8": _entry(2.13)}, {"int8": _entry(2.02)}])
    monkeypatch.setattr(peak, "measure_quiet_peak", lambda device: next(readings))
    cpu = torch.device("cpu")
    assert peak.cached_peak(cpu)["int8"]["tops"] == 2.13
    assert peak.cached_peak(cpu)["int8"]["tops"] == 2.13  # cached: not measured again
    assert peak.cached_peak(cpu)["int8"]["readings"] == [2.13]  # the first reading is kept too
    kept = peak.cached_peak(cpu, remeasure=True)["int8"]
    assert kept["tops"] == 2.13 and kept["remeasured"]["tops"] == 2.02
    assert kept["readings"] == [2.13, 2.02]
    assert peak.cached_peak(cpu)["int8"] == kept  # what was written is what is read


def test_a_measured_peak_records_its_processor():
    assert peak.processor(torch.device("cpu")) == peak.processor_key(
        {"cpu": {"identity": peak.cpu_identity()}}
    )


def test_kernelbench_peak_prints_the_range_of_its_readings(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from kernelbench.cli import app

    monkeypatch.setenv("KERNELBENCH_CACHE", str(tmp_path))
    chip = peak.processor(torch.device("cpu"))
    near = {"link_ns": 61.0, "gbs": 34.5, "calls": 40, "note": "sum"}
    bus = {**_entry(34.5, chip, unit="gbs"), "placements": [near]}
    readings = iter([{"int8": _entry(2.13, chip), "bandwidth": bus}, {"int8": _entry(2.02, chip)}])
    monkeypatch.setattr(peak, "measure_quiet_peak", lambda device: next(readings))
    first = CliRunner().invoke(app, ["peak", "--device", "cpu"])
    assert first.exit_code == 0 and "quiet readings" not in first.output
    assert "round trip about 61 ns: best 34.5 GB/s (40 calls)" in " ".join(first.output.split())
    again = CliRunner().invoke(app, ["peak", "--device", "cpu", "--remeasure"])
    text = " ".join(again.output.split())
    assert again.exit_code == 0 and "2 quiet readings on this processor: 2.02-2.13" in text


def _low_then(fresh_tops: float, tmp_path, monkeypatch) -> list:
    """A peak cache whose figures any row exceeds, and a re-measurement reading ``fresh_tops``
    (bandwidth 1000x that in GB/s); returns the list the re-measurements are counted in."""
    import json

    cpu = torch.device("cpu")
    chip = peak.processor(cpu)
    low = {k: _entry(1e-6, chip) for k in ("int8", "16bit", "fp32")}
    low["bandwidth"] = _entry(1e-3, chip, unit="gbs")
    monkeypatch.setenv("KERNELBENCH_CACHE", str(tmp_path / "cache"))
    path = peak.cache_path(peak.device_class(cpu))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(low), encoding="utf-8")
    calls = []
    # the threads in one placement throughout: no wait for another
    import kernelbench.run.cell as cell

    monkeypatch.setattr(cell, "link_probe", lambda device: lambda: 100.0)

    def measure(device, measure=None):
        calls.append(device)
        fresh = {k: _entry(fresh_tops, chip) for k in ("int8", "16bit", "fp32")}
        return {**fresh, "bandwidth": _entry(fresh_tops * 1e3, chip, unit="gbs")}

    monkeypatch.setattr(peak, "measure_quiet_peak", measure)
    return calls


def _tiny_run(out, *more: str) -> str:
    """A one-cell, one-round run into ``out`` (``more``: further flags); its output on one
    line."""
    from typer.testing import CliRunner

    from kernelbench.cli import app

    args = ["run", "--sizes", "768", "--tokens", "8", "--backends", "torch,custom"]
    args += ["--methods", "fp16,llm_int8", "--out", str(out), "--budget", "0.02"]
    args += ["--rounds", "1", "--extra-rounds", "0", "--no-report", *more]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_rows_above_a_stale_cached_peak_make_the_run_measure_it_again(tmp_path, monkeypatch):
    """A peak cached in a slower moment of the machine: the run measures the peaks again once
    and reads its rows against them, instead of leaving them flagged."""
    import json

    from kernelbench.results.view import load_view

    calls = _low_then(1e6, tmp_path, monkeypatch)
    out = tmp_path / "run"
    said = _tiny_run(out)
    assert len(calls) == 1 and "faster than the cached peaks allow" in said
    assert "still above" in said and "0 of the" in said
    assert json.loads((out / "env.json").read_text())["peak"]["int8"]["tops"] == 1e6
    assert not load_view(out)["suspect"].fillna(False).astype(bool).any()
    # the cache keeps the new best: the next run finds nothing above it
    calls.clear()
    again = _tiny_run(tmp_path / "again")
    assert not calls and "faster than the cached peaks allow" not in again


def test_a_run_chooses_fp32s_rounds_by_the_cached_fp32_peak(tmp_path, monkeypatch):
    """The run hands its cells the machine's cached fp32 peak: fp32's later rounds are chosen
    by a call's time at it (kernelbench.run.plan.fp32_in_round)."""
    import kernelbench.run.cell as cell
    from kernelbench.core import work_flops

    _low_then(1e6, tmp_path, monkeypatch)
    peak.cached_peak(torch.device("cpu"), remeasure=True)  # the cache now holds 1e6 TOPS
    seen, real = [], cell.fp32_in_round
    monkeypatch.setattr(cell, "fp32_in_round", lambda *a: seen.append(a[2]) or real(*a))
    _tiny_run(tmp_path / "run")
    assert seen == [pytest.approx(work_flops(8, 768, 3072) / 1e18)]


def test_rows_still_above_a_peak_measured_again_stay_flagged(tmp_path, monkeypatch):
    from kernelbench.results.view import load_view

    calls = _low_then(1e-6, tmp_path, monkeypatch)
    out = tmp_path / "run"
    said = _tiny_run(out)
    # measured again, then the bus read again in the rows' placement: still above
    assert len(calls) == 2 and "still above" in said and " 0 of the" not in said
    assert "against the bandwidth read again" in said and "0 row(s) still above" not in said
    flagged = load_view(out)["suspect_reason"].fillna("").str.contains("above roofline")
    assert flagged.any()


def test_the_bandwidth_peak_records_where_the_host_ran_the_threads(monkeypatch):
    """The bus gives about half the rate with both vCPUs on one core complex: the peak says
    which placement it was read in (the threads' round trip before and after its probes)."""
    import kernelbench.run.cell as cell

    monkeypatch.setattr(peak, "_int8_tops", lambda engine, device: (1.0, "int8"))
    monkeypatch.setattr(peak, "_matmul_tops", lambda engine, device, dtype: (0.5, "linear"))
    monkeypatch.setattr(peak, "_first_touch_gbs", lambda engine: 20.0)

    def probes(engine, device, link):  # 20 calls on one core complex, 20 on two
        calls = [peak.BandwidthCall(30.0 + i / 10, link(), "read-only sum") for i in range(20)]
        return calls + [peak.BandwidthCall(60.0 + i / 10, link(), "GEMV") for i in range(20)]

    monkeypatch.setattr(peak, "_bandwidth_calls", probes)
    readings = iter([60.4, *[61.0] * 20, *[290.0] * 20, 281.0])
    monkeypatch.setattr(cell, "link_probe", lambda device: lambda: next(readings))
    bandwidth = peak.measure_peak(torch.device("cpu"))["bandwidth"]
    assert bandwidth["gbs"] == pytest.approx(61.9) and bandwidth["link_ns"] == [60.4, 281.0]
    assert "best call of GEMV" in bandwidth["note"]
    assert (
        "round trip 290 ns just before it, 60 before the probes and 281 after" in bandwidth["note"]
    )
    near, far = bandwidth["placements"]
    assert (near["link_ns"], near["gbs"], near["calls"]) == (61.0, pytest.approx(31.9), 20)
    assert (far["link_ns"], far["gbs"], far["calls"]) == (290.0, pytest.approx(61.9), 20)

    def unplaced(engine, device, link):
        return [peak.BandwidthCall(34.0, None, "read-only sum")]

    monkeypatch.setattr(peak, "_bandwidth_calls", unplaced)
    monkeypatch.setattr(cell, "link_probe", lambda device: None)  # one thread, no extension
    bandwidth = peak.measure_peak(torch.device("cpu"))["bandwidth"]
    assert "link_ns" not in bandwidth and "round trip" not in bandwidth["note"]
    assert "placements" not in bandwidth


class _Clock:
    """A clock that advances only when slept on."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _cache_with_placements(tmp_path, monkeypatch, placements: list[dict]) -> None:
    import json

    cpu = torch.device("cpu")
    monkeypatch.setenv("KERNELBENCH_CACHE", str(tmp_path / "cache"))
    path = peak.cache_path(peak.device_class(cpu))
    path.parent.mkdir(parents=True)
    bus = {**_entry(max(p["gbs"] for p in placements), peak.processor(cpu), unit="gbs")}
    path.write_text(json.dumps({"bandwidth": {**bus, "placements": placements}}), "utf-8")


def _bus_read_in(link_ns: float, gbs: float) -> dict:
    chip = peak.processor(torch.device("cpu"))
    placed = [{"link_ns": link_ns, "gbs": gbs, "calls": 20, "note": "sum"}]
    return {"bandwidth": {**_entry(gbs, chip, unit="gbs"), "placements": placed}}


def test_the_bandwidth_is_read_again_once_the_host_runs_the_threads_where_the_rows_ran(
    tmp_path, monkeypatch
):
    """The threads together (60 ns) for three readings, then apart (290 ns), where the rows
    ran: the bus is read once, then, and the apart figure rises; the together one stays."""
    _cache_with_placements(
        tmp_path,
        monkeypatch,
        [{"link_ns": 60.0, "gbs": 35.0, "calls": 40}, {"link_ns": 290.0, "gbs": 39.0, "calls": 40}],
    )
    links = iter([61.0, 58.0, 62.0, 288.0])
    measured = []

    def measure(device):
        measured.append(device)
        return _bus_read_in(295.0, 62.0)

    clock = _Clock()
    got = peak.reread_bandwidth(
        torch.device("cpu"), [292.3], 60.0, lambda: next(links), measure, clock, clock.sleep
    )
    assert len(measured) == 1 and got.read == [292.3] and got.missed == []
    assert got.waited_s == 3 * peak.PLACEMENT_POLL_S
    by_link = {p["link_ns"]: p["gbs"] for p in got.peak["bandwidth"]["placements"]}
    assert by_link == {60.0: 35.0, 295.0: 62.0}
    assert peak.cached_peak(torch.device("cpu")) == got.peak  # kept in the cache


def test_a_placement_the_host_never_gives_is_missed_after_the_wait(tmp_path, monkeypatch):
    _cache_with_placements(tmp_path, monkeypatch, [{"link_ns": 290.0, "gbs": 39.0, "calls": 40}])
    measured = []

    def measure(device):  # the probes ran with the threads together although polled apart
        measured.append(device)
        return _bus_read_in(60.0, 35.0)

    readings = iter([290.0, *[60.0] * 100])
    clock = _Clock()
    got = peak.reread_bandwidth(
        torch.device("cpu"), [290.0], 10.0, lambda: next(readings), measure, clock, clock.sleep
    )
    assert len(measured) == 1 and got.read == [] and got.missed == [290.0]
    assert got.waited_s == pytest.approx(10.0)
    assert {p["link_ns"] for p in got.peak["bandwidth"]["placements"]} == {60.0, 290.0}


def test_the_placements_of_link_readings_are_their_groups_medians():
    assert peak.placements_of([]) == [] and peak.placements_of([5e6]) == []
    assert peak.placements_of([60.0, 61.0, 59.0]) == [60.0]
    together, apart = [58.0 + i % 5 for i in range(30)], [280.0 + i % 20 for i in range(30)]
    assert peak.placements_of(together + apart) == [60.0, 287.0]


def test_rows_above_the_figure_of_their_placement_make_the_run_read_the_bus_there(
    tmp_path, monkeypatch
):
    """The run's re-measurement of every peak reads the bus with the threads together; the
    rows ran apart, above that placement's stale figure: the run waits until the host runs the
    threads apart, reads the bandwidth there and the rows are no longer above."""
    import json

    import kernelbench.run.cell as cell
    from kernelbench.results.view import load_view

    cpu = torch.device("cpu")
    chip = peak.processor(cpu)
    high = {k: _entry(1e6, chip) for k in ("int8", "16bit", "fp32")}
    stale = [{"link_ns": 60.0, "gbs": 1e-3, "calls": 40}, {"link_ns": 290.0, "gbs": 1e-3}]
    _cache_with_placements(tmp_path, monkeypatch, stale)
    path = peak.cache_path(peak.device_class(cpu))
    path.write_text(json.dumps({**json.loads(path.read_text()), **high}), "utf-8")
    monkeypatch.setattr(cell, "link_probe", lambda device: lambda: 290.0)  # rows and wait apart
    calls = []

    def measure(device, measure=None):
        calls.append(measure)
        if measure is None:  # every peak, read with the threads together
            return {**high, **_bus_read_in(60.0, 2e-3)}
        return _bus_read_in(290.0, 1e6)

    monkeypatch.setattr(peak, "measure_quiet_peak", measure)
    out = tmp_path / "run"
    said = _tiny_run(out)
    assert calls == [None, peak.measure_bandwidth]
    assert re.search(r"measured again: (\d+) of the \1 row\(s\) still above", said)
    assert "against the bandwidth read again: 0 row(s) still above" in said
    env = json.loads((out / "env.json").read_text())
    assert env["peak_reread"] == {
        "placements_ns": [290.0],
        "read": [290.0],
        "missed": [],
        "waited_s": pytest.approx(0.0, abs=1.0),
    }
    assert not load_view(out)["suspect"].fillna(False).astype(bool).any()
    cached = peak.cached_peak(cpu)  # the bandwidth read alone leaves the other figures
    assert cached["int8"]["tops"] == 1e6 and cached["bandwidth"]["gbs"] == 1e6
