"""Model-family cases: explicit per-size layers, ``--layer all`` and the per-block rows."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_row

from kernelbench.checks import InputError
from kernelbench.results.schema import ResultRow
from kernelbench.results.view import block_rows
from kernelbench.run.cases import load_case
from kernelbench.run.plan import ALL_LAYERS, RunOptions, plan


def test_gpt3_default_sweep_has_decode_and_prefill_tokens():
    case = load_case("gpt3")
    assert case.default_tokens == (1, 8, 32, 256, 2048)
    assert case.layer_names(4096) == ("ffn1", "ffn2", "attn_qkv", "attn_out")


@pytest.mark.parametrize(
    ("case", "size", "layer", "shape"),
    [
        ("llama", "llama2-7b", "ffn_gate", (4096, 11008)),
        ("llama", "llama2-7b", "qkv", (4096, 12288)),  # no GQA at 7B
        ("llama", "llama2-70b", "qkv", (8192, 10240)),  # 64 q heads + 2 x 8 kv heads of 128
        ("llama", "llama2-70b", "ffn_down", (28672, 8192)),
        ("llama3", "llama3-8b", "qkv", (4096, 6144)),
        ("llama3", "llama3-8b", "ffn_up", (4096, 14336)),
        ("opt", "175B", "ffn1", (12288, 49152)),
        ("opt", "30B", "attn_qkv", (7168, 21504)),
    ],
)
def test_model_family_layer_shapes(case, size, layer, shape):
    c = load_case(case)
    d = next(s.d_model for s in c.sizes if s.name == size)
    assert c.shape(layer, d) == shape


def test_every_family_has_its_outlier_statistics():
    for name in ("opt", "llama", "llama3"):
        case = load_case(name)
        assert all(s.outliers in case.outlier_stats for s in case.sizes)
        assert case.default_layer == ALL_LAYERS


def test_layer_all_plans_every_layer_of_every_size_and_unknown_layers_are_named():
    case = load_case("llama")
    items = plan(case, RunOptions(case="llama", sizes=(4096,), tokens=(8,), layer="all", rounds=1))
    assert [i.layer for i in items] == ["qkv", "attn_out", "ffn_gate", "ffn_up", "ffn_down"]
    with pytest.raises(InputError, match="unknown layer 'ffn1'.*qkv"):
        plan(case, RunOptions(case="llama", sizes=(4096,), layer="ffn1", rounds=1))


def test_the_token_counts_of_a_layer_follow_one_another_in_every_round():
    case = load_case("gpt3")
    opts = RunOptions(sizes=(768, 1024), tokens=(1, 8, 2048), rounds=3)
    items = plan(case, opts)
    round0 = [(i.size.d_model, i.tokens) for i in items if i.round == 0]
    assert round0 == [(768, 1), (768, 8), (768, 2048), (1024, 1), (1024, 8), (1024, 2048)]
    orders = set()
    for r in (1, 2):
        cells = [(i.size.d_model, i.tokens) for i in items if i.round == r]
        assert sorted(cells) == sorted(round0)
        sizes = [d for d, _ in cells]
        assert sizes in ([768] * 3 + [1024] * 3, [1024] * 3 + [768] * 3)  # a layer's cells together
        orders.add(tuple(cells))
    assert len(orders | {tuple(round0)}) > 1  # later rounds in fresh orders


def _layer_row(layer: str, method: str, ms: float, speedup: float) -> ResultRow:
    """A llama2-7b layer row taking ``ms``, ``speedup`` times faster than its 16-bit baseline
    (95% interval +-10%)."""
    return make_row(
        method,
        case="llama",
        d_model=4096,
        layer=layer,
        seed=1,
        median_ms=ms,
        baseline_ms=ms * speedup,
        speedup=speedup,
        speedup_lo=speedup * 0.9,
        speedup_hi=speedup * 1.1,
        paired=True,
        samples=5,
    )


def test_block_row_sums_the_layers_and_weighs_their_speedups_by_time():
    rows = [_layer_row("qkv", "llm_int8", 1.0, 2.0), _layer_row("ffn_up", "llm_int8", 3.0, 1.0)]
    (block,) = block_rows(rows)
    assert block.layer == "block" and block.median_ms == 4.0
    # baseline time: 2.0 * 1 ms + 1.0 * 3 ms = 5 ms over 4 ms of int8 time
    assert block.speedup == pytest.approx(5.0 / 4.0)
    assert block.speedup_lo == pytest.approx(0.9 * 5.0 / 4.0)
    assert "qkv" in block.reason and "ffn_up" in block.reason
    # a method missing one layer (skipped, failed) gets no block row
    skipped = dataclasses.replace(rows[1], status="skipped", median_ms=None)
    assert block_rows([rows[0], skipped]) == []


def test_quick_profile_sizes_fall_back_to_what_the_case_has():
    from pathlib import Path

    from kernelbench.cli.sweep import RunRequest, _sizes
    from kernelbench.run import profiles

    def request(case: str, dims=None) -> RunRequest:
        chosen = profiles.resolve("quick", sizes=dims)
        return RunRequest(
            profile=chosen,
            case=case,
            device="cpu",
            out=Path("x"),
            executor="local",
            layer="all",
            sizes_given=dims is not None,
        )

    assert _sizes(request("gpt3"), load_case("gpt3")) == (768, 1024, 2048)
    assert _sizes(request("opt"), load_case("opt")) == (768, 1024, 2048)
    assert _sizes(request("llama"), load_case("llama")) == (4096, 5120)  # its two smallest
    assert _sizes(request("llama", (999,)), load_case("llama")) == (
        999,
    )  # the user's: checked later
