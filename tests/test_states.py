"""The memory bus's states: readings split into two groups, each row's pairs split with them."""

from __future__ import annotations

import random

import pytest

from kernelbench.results.states import MIN_SEPARATION, bus_split, state_of, state_speedups


def two_states(slow: float, fast: float, n_slow: int, n_fast: int, jitter: float = 0.05):
    rng = random.Random(0)
    return [slow * (1 + rng.uniform(-jitter, jitter)) for _ in range(n_slow)] + [
        fast * (1 + rng.uniform(-jitter, jitter)) for _ in range(n_fast)
    ]


def test_readings_in_two_groups_far_apart_split_between_them():
    split = bus_split(two_states(45.0, 110.0, 60, 40))
    assert split is not None
    assert 47.25 < split.threshold_gbps < 104.5  # in the gap between the two groups
    assert split.slow_gbps == pytest.approx(45.0, rel=0.05)
    assert split.fast_gbps == pytest.approx(110.0, rel=0.05)
    assert split.slow_share == pytest.approx(0.6)


@pytest.mark.parametrize(
    "readings",
    [
        two_states(60.0, 60.0, 50, 50, jitter=0.2),  # one state with noise
        two_states(60.0, 60.0 * MIN_SEPARATION * 0.9, 50, 50, jitter=0.0),  # too close
        two_states(45.0, 110.0, 97, 3),  # a few outliers are not a state
        two_states(45.0, 110.0, 5, 5),  # too few readings to say
        [],
    ],
    ids=["one-state", "too-close", "outliers", "few", "none"],
)
def test_no_split_without_two_full_groups_far_apart(readings):
    assert bus_split(readings) is None


def test_each_pair_goes_to_the_state_of_the_reading_before_its_call():
    split = bus_split(two_states(45.0, 110.0, 50, 50))
    # int8 at 1 ms throughout; the 16-bit baseline 3 ms in the slow state, 6 in the fast one
    bus = [45.0, 110.0] * 10
    base = [3.0 if b < 70 else 6.0 for b in bus]
    by_state = state_speedups([1.0] * 20, base, bus, split)
    assert by_state["slow"].speedup == pytest.approx(3.0) and by_state["slow"].pairs == 10
    assert by_state["fast"].speedup == pytest.approx(6.0) and by_state["fast"].pairs == 10
    assert by_state["slow"].lo == pytest.approx(3.0) and by_state["fast"].hi == pytest.approx(6.0)
    # misaligned (a round without readings): nothing
    assert state_speedups([1.0] * 20, base, bus[:-1], split) == {}
    # one state only
    only = state_speedups([1.0] * 3, [3.0] * 3, [45.0] * 3, split)
    assert set(only) == {"slow"}


def test_each_state_has_its_share_of_the_roofline():
    from kernelbench.results.view import state_roofline_share

    split = bus_split(two_states(45.0, 110.0, 50, 50))
    # the call itself 2 ms in the slow state, 1 ms in the fast one; pooled median 1.5 ms at 60%
    bus = [45.0, 110.0] * 10
    calls = [2.0 if b < 70 else 1.0 for b in bus]
    by_state = state_speedups(calls, [6.0] * 20, bus, split)
    assert by_state["slow"].median_ms == 2.0 and by_state["fast"].median_ms == 1.0
    row = {"roofline_share": 0.6, "median_ms": 1.5}
    assert state_roofline_share(row, by_state["slow"]) == pytest.approx(0.45)
    assert state_roofline_share(row, by_state["fast"]) == pytest.approx(0.9)
    assert state_roofline_share(row, None) is None
    unknown = {"roofline_share": None, "median_ms": 1.5}
    assert state_roofline_share(unknown, by_state["fast"]) is None


def _paired_run(run_dir, row_factory, baseline_ms, bus, links=None):
    """A cold one-token run: the 16-bit baseline and custom int8_raw at 1 ms a call, paired
    (with a link reading per call when ``links`` is given)."""
    from kernelbench.results.schema import ResultsWriter

    writer = ResultsWriter(run_dir)
    writer.append(row_factory("fp16", "torch", tokens=1, cache="cold"))
    writer.append(
        row_factory(
            "int8_raw",
            "custom",
            tokens=1,
            cache="cold",
            median_ms=1.0,
            raw_ms=[1.0] * len(bus),
            baseline_raw_ms=baseline_ms,
            paired=True,
            bus_gbps=bus,
            link_ns=links or [],
        )
    )
    return run_dir


def test_show_states_prints_each_states_speedup_and_precision(tmp_path, row_factory):
    from typer.testing import CliRunner

    from kernelbench.cli import app

    bus = [45.0, 110.0] * 15
    base = [3.0 if b < 70 else 6.0 for b in bus]
    run = _paired_run(tmp_path / "two", row_factory, base, bus)
    result = CliRunner().invoke(app, ["show", str(run), "--states"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Bus states: 30 readings" in out and "the slow state (50% of them" in out
    assert "3.00 ±0.00 n=15" in out and "6.00 ±0.00 n=15" in out
    assert "1 tokens · slow state (under" in out and "fast state (" in out
    assert "Precision in the slow state: 1 of 1 speedups within ±5%" in out
    # a run in one state: said, no tables
    flat = _paired_run(tmp_path / "flat", row_factory, [3.0] * 30, [45.0] * 30)
    flat_out = CliRunner().invoke(app, ["show", str(flat), "--states"]).output
    assert "No two states in this run's 30 calls" in flat_out


def test_report_shows_each_states_speedup_beside_the_other(tmp_path, row_factory):
    from kernelbench.report import write_report

    bus = [45.0, 110.0] * 15
    base = [3.0 if b < 70 else 6.0 for b in bus]
    html = write_report([_paired_run(tmp_path / "two", row_factory, base, bus)]).read_text()
    section = html[html.index('class="section-states"') : html.index('class="section-suspects"')]
    assert "Bus states: 30 readings" in section
    assert "Precision in the slow state: 1 of 1 speedups within ±5%" in section
    assert 'data-slow="3.0"' in section and 'data-fast="6.0"' in section
    assert "3.00 | 6.00" in section and "[3.00, 3.00] n=15 | [6.00, 6.00] n=15" in section
    assert "grid-state-shares" not in section  # the rows have no roofline (no peaks)
    # one state: no such section
    flat = _paired_run(tmp_path / "flat", row_factory, [3.0] * 30, [45.0] * 30)
    assert "section-states" not in write_report([flat]).read_text()


def test_report_grid_of_each_states_share_of_the_roofline():
    import pandas as pd

    from kernelbench.report.tables import state_share_grids
    from kernelbench.results.states import BusSplit, StateSpeedup
    from kernelbench.results.view import StateView

    rows = pd.DataFrame(
        [
            {
                "backend": "custom",
                "method": "int8_raw",
                "layer": "ffn1",
                "tokens": t,
                "d_model": 768,
                "size": "125M",
                "roofline_share": 0.6,
                "median_ms": 1.5,
            }
            for t in (1, 8)
        ]
    )
    split = BusSplit(70.0, 45.0, 110.0, 0.5)
    by_row = {
        0: {
            "slow": StateSpeedup(3.0, 2.9, 3.1, 10, 2.0),
            "fast": StateSpeedup(6.0, 5.9, 6.1, 10, 1.0),
        },
        1: {"slow": StateSpeedup(3.0, 2.9, 3.1, 10, 1.5)},
    }
    (grid,) = state_share_grids(rows, StateView(40, split, by_row))
    assert grid.row_header == "tokens" and [r.label for r in grid.rows] == ["1 tokens", "8 tokens"]
    assert [r.cells[0].text for r in grid.rows] == ["45% | 90%", "60% | –"]
    assert state_share_grids(rows, StateView(40, None, {})) == []


def test_the_link_reading_decides_the_state_where_the_bus_readings_overlap():
    """On the 2-vCPU VM the bus of one state drifts into the other's range (a slow state at
    60-72 GB/s, a fast one at 72-105): the link between the threads (about 50 ns on one core
    complex, 300 on two) classes each call where the bus cannot."""
    rng = random.Random(1)
    # 60 calls on one complex (bus 50-75 GB/s), 40 on two (bus 70-105)
    bus = [rng.uniform(50, 75) for _ in range(60)] + [rng.uniform(70, 105) for _ in range(40)]
    links = [rng.uniform(45, 60) for _ in range(60)] + [rng.uniform(250, 400) for _ in range(40)]
    split = bus_split(bus, links)
    assert split is not None and split.link_threshold_ns is not None
    assert 60 < split.link_threshold_ns < 250 and split.slow_is_near
    assert split.slow_share == pytest.approx(0.6)
    assert [state_of(b, split, v) for b, v in zip(bus, links, strict=True)] == ["slow"] * 60 + [
        "fast"
    ] * 40
    # the bus alone misclasses the overlap
    by_bus = bus_split(bus)
    assert by_bus is None or [state_of(b, by_bus) for b in bus] != ["slow"] * 60 + ["fast"] * 40
    # 16-bit 3 ms on one complex, 6 ms on two, int8 1 ms: each state's speedup exactly
    base = [3.0] * 60 + [6.0] * 40
    by_state = state_speedups([1.0] * 100, base, bus, split, links)
    assert by_state["slow"].speedup == 3.0 and by_state["slow"].pairs == 60
    assert by_state["fast"].speedup == 6.0 and by_state["fast"].pairs == 40
    # a call without its link reading falls back to the bus threshold
    assert state_of(40.0, split, None) == "slow" and state_of(200.0, split, None) == "fast"


def test_the_state_with_the_faster_bus_is_the_fast_one_whichever_link_it_has():
    bus = [90.0] * 30 + [50.0] * 30
    links = [50.0] * 30 + [300.0] * 30  # here the near threads read the faster bus
    split = bus_split(bus, links)
    assert split is not None and not split.slow_is_near
    assert state_of(90.0, split, 50.0) == "fast" and state_of(50.0, split, 300.0) == "slow"


def test_calls_without_a_link_reading_each_leave_the_bus_split():
    bus = two_states(45.0, 110.0, 50, 50)
    partial = [50.0] * 50 + [None] * 50
    assert bus_split(bus, partial) == bus_split(bus) is not None
    assert bus_split(bus, [50.0] * 99) == bus_split(bus)  # not aligned


def test_a_state_whose_rounds_disagree_has_an_interval_that_covers_them():
    """Pairs of one state from two rounds 20% apart: resampling only the pairs claims under
    +-1%; with the rounds known the interval spans both."""
    bus = [45.0] * 80
    split = bus_split(two_states(45.0, 110.0, 50, 50))
    base = [3.0 + 0.01 * (i % 5) for i in range(60)] + [3.6 + 0.01 * (i % 5) for i in range(20)]
    pooled_pairs = state_speedups([1.0] * 80, base, bus, split)["slow"]
    by_round = state_speedups([1.0] * 80, base, bus, split, round_samples=[60, 20])["slow"]
    assert pooled_pairs.hi - pooled_pairs.lo < 0.05
    assert by_round.lo <= 3.05 and by_round.hi >= 3.6
    # sizes that do not add up: as if one round
    assert state_speedups([1.0] * 80, base, bus, split, round_samples=[60]) == {
        "slow": pooled_pairs
    }


def test_a_few_calls_on_two_complexes_are_a_state_and_one_placement_is_one_state():
    """Link readings are sharp: 2% of the calls across complexes form their own state (the bus
    threshold needs a tenth), and calls all on one complex are one state even where the bus
    readings spread over two groups (neighbours' traffic within one placement)."""
    bus = [50.0] * 98 + [100.0] * 2
    few_far = [50.0] * 98 + [320.0] * 2
    assert bus_split(bus) is None  # 2%: too few for the bus
    # too few calls to say (a group needs LINK_MIN_CALLS)
    assert bus_split(bus, few_far) is None
    bus = [50.0] * 490 + [100.0] * 10
    split = bus_split(bus, [50.0] * 490 + [320.0] * 10)
    assert split is not None and split.slow_share == pytest.approx(0.98)
    assert state_of(50.0, split, 320.0) == "fast"
    # one placement, the bus in two groups: no split (the bus alone would make two)
    spread = two_states(45.0, 70.0, 60, 40)
    assert bus_split(spread) is not None
    assert bus_split(spread, [50.0 + (i % 9) for i in range(100)]) is None


def test_the_headline_says_when_the_host_moved_the_threads(tmp_path, row_factory):
    """A run whose calls met both placements says so under its precision line, with each
    one's share; a run on one placement, or without link readings, says nothing of it."""
    from kernelbench.results.view import headline, load_view

    bus = [45.0, 110.0] * 15
    base = [3.0 if b < 70 else 6.0 for b in bus]
    links = [50.0 if b < 70 else 330.0 for b in bus]
    moved = _paired_run(tmp_path / "moved", row_factory, base, bus, links)
    lines = headline(load_view(moved))
    assert any(
        "The host moved the threads during this run: 50% of the timed calls" in line
        for line in lines
    )
    assert "kernelbench show --states" in lines[-2]
    # each placement's pairs alone: 3.0 / 1.0 on one complex, 6.0 / 1.0 on two, no scatter
    assert lines[-1] == (
        "Precision by placement, each speedup from its pairs there: threads close together: "
        "1 of 1 speedups within ±5%, median half-width 0.0%; apart: 1 of 1 speedups within "
        "±5%, median half-width 0.0%."
    )
    still = _paired_run(tmp_path / "still", row_factory, base, bus, [50.0] * 30)
    bare = _paired_run(tmp_path / "bare", row_factory, base, bus)
    for run in (still, bare):
        assert not any("moved the threads" in line for line in headline(load_view(run)))


def test_a_link_reading_from_a_descheduled_thread_is_no_placement():
    """On a busy machine a round trip can take milliseconds (a thread not running): such a
    reading neither makes a state nor disables the split, and its call's state is unknown."""
    from kernelbench.results.states import LINK_MAX_NS

    bus = [50.0] * 50 + [100.0] * 50 + [50.0] * 3
    links = [50.0] * 50 + [330.0] * 50 + [7.4e6] * 3
    split = bus_split(bus, links)
    assert split is not None and 50 < split.link_threshold_ns < 330
    assert split.slow_share == pytest.approx(0.5)
    assert state_of(50.0, split, 7.4e6) is None and LINK_MAX_NS < 7.4e6
    # one placement and a few such readings: still one state
    assert bus_split([50.0] * 103, [50.0] * 100 + [7.4e6] * 3) is None
