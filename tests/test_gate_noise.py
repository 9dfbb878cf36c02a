"""scripts/gate_noise.py: the draws of disjoint rounds it replays the gate on."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gate_noise.py"


@pytest.fixture(scope="module")
def gate_noise():
    spec = importlib.util.spec_from_file_location("kb_gate_noise", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _valid(draw, n: int, nb: int, g: int) -> bool:
    base, first, both = draw
    confirm = both[g:]
    rounds = set(base) | set(first) | set(confirm)
    return (
        len(base) == nb
        and both[:g] == first
        and len(confirm) == g
        and len(rounds) == nb + 2 * g
        and rounds <= set(range(n))
    )


def test_few_rounds_give_every_draw_once(gate_noise):
    n, nb, g = 7, 2, 2
    total = math.comb(7, 2) * math.comb(5, 2) * math.comb(3, 2)
    draws = gate_noise.sample_draws(n, nb, g, limit=10 * total)
    assert len(draws) == total == len(set(draws))
    assert all(_valid(d, n, nb, g) for d in draws)


def test_many_rounds_are_sampled_without_listing_every_draw(gate_noise, monkeypatch):
    # 20 rounds have 776 million draws: listing them exhausted memory; above the listing bound
    # the draws are sampled, distinct and disjoint, and the same for the same seed
    monkeypatch.setattr(gate_noise, "LISTED_DRAWS", 1000)
    draws = gate_noise.sample_draws(20, 4, 3, limit=500)
    assert len(draws) == 500 == len(set(draws))
    assert all(_valid(d, 20, 4, 3) for d in draws)
    assert draws == gate_noise.sample_draws(20, 4, 3, limit=500)


def test_sampling_stops_at_every_draw_when_asked_for_more(gate_noise, monkeypatch):
    monkeypatch.setattr(gate_noise, "LISTED_DRAWS", 10)
    total = math.comb(7, 2) * math.comb(5, 2) * math.comb(3, 2)
    draws = gate_noise.sample_draws(7, 2, 2, limit=10 * total)
    assert len(draws) == total == len(set(draws))
