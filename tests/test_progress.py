"""The sweep's progress ETA: the cost model of a row follows the engine (budget, or one call
when longer, plus the first round's first call), per token count, and skipped rows cost
nothing; the ETA scales the remaining cost by the seconds the finished cost took."""

from __future__ import annotations

from rich.progress import Progress

from kernelbench.cli.progress import CostModel, _EtaColumn

PAIR = ("custom", "llm_int8")


def test_a_row_longer_than_its_budget_costs_its_calls_not_a_multiple_of_them():
    model = CostModel(budget_s=0.5)
    model.record(PAIR, flops=10e9, tokens=2048, d_model=768, median_ms=4000.0)  # 4 s per call
    assert model.cost(PAIR, 10e9, 2048, runs_here=True, first_round=True) == 8.0
    assert model.cost(PAIR, 10e9, 2048, runs_here=True, first_round=False) == 4.0
    assert model.cost(PAIR, 10e9, 2048, runs_here=False, first_round=True) == 0.0


def test_a_fast_row_costs_its_budget():
    model = CostModel(budget_s=0.5)
    model.record(PAIR, flops=1e6, tokens=1, d_model=768, median_ms=0.1)
    assert model.cost(PAIR, 1e6, 1, True, first_round=False) == 0.5
    assert abs(model.cost(PAIR, 1e6, 1, True, first_round=True) - 0.5001) < 1e-9


def test_call_lengths_come_from_the_same_token_count():
    model = CostModel(budget_s=0.5)
    model.record(PAIR, flops=1e12, tokens=2048, d_model=768, median_ms=1000.0)  # 1 TFLOP/s at 2048
    # one token runs far below that throughput: unknown until measured, so the budget
    assert model.cost(PAIR, 1e9, 1, True, first_round=False) == 0.5
    model.record(PAIR, flops=1e9, tokens=1, d_model=768, median_ms=2000.0)
    assert model.cost(PAIR, 1e9, 1, True, first_round=False) == 2.0


def test_a_row_the_harness_will_skip_costs_nothing():
    model = CostModel(budget_s=0.5, max_call_s=lambda pair: 30.0)
    model.record(PAIR, flops=1e12, tokens=2048, d_model=768, median_ms=10_000.0)
    assert model.cost(PAIR, 2e12, 2048, True, first_round=False) == 20.0
    assert model.cost(PAIR, 4e12, 2048, True, first_round=False) == 0.0  # 40 s > 30 s


def test_eta_scales_the_remaining_cost_by_the_seconds_the_finished_cost_took():
    now = [100.0]
    column = _EtaColumn(started=100.0, clock=lambda: now[0])
    progress = Progress()
    task_id = progress.add_task("t", total=30.0)
    assert column.render(progress.tasks[0]).plain == "ETA -:--"
    progress.update(task_id, completed=10.0)
    now[0] = 120.0  # 10 units took 20 s: 20 units left take 40 s
    assert column.render(progress.tasks[0]).plain == "ETA 0:40"
    # 15 units took 20 s: 2715 left take 3620 s
    progress.update(task_id, completed=15.0, total=2730.0)
    assert column.render(progress.tasks[0]).plain == "ETA 1:00:20"


def test_eta_counts_down_while_a_long_cell_runs():
    """Nothing finishes while a cell is timed: the estimate made when the bar last moved
    counts down (it used to grow with the elapsed time), and stops at zero."""
    now = [120.0]
    column = _EtaColumn(started=100.0, clock=lambda: now[0])
    progress = Progress()
    task_id = progress.add_task("t", total=30.0)
    progress.update(task_id, completed=10.0)
    assert column.render(progress.tasks[0]).plain == "ETA 0:40"
    now[0] = 130.0
    assert column.render(progress.tasks[0]).plain == "ETA 0:30"
    now[0] = 200.0
    assert column.render(progress.tasks[0]).plain == "ETA 0:00"
    progress.update(task_id, completed=20.0)  # 20 units in 100 s: 10 left take 50 s
    assert column.render(progress.tasks[0]).plain == "ETA 0:50"
