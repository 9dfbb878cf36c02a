"""What a cold-cache timer flushes: the tensors a runner's call reaches, and their bytes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch

from kernelbench.backends import all_backends
from kernelbench.backends.residency import (
    TensorEviction,
    memory_spans,
    reachable_tensors,
    resident_bytes,
)
from kernelbench.core import METHODS
from kernelbench.kernels import cpu_ext
from kernelbench.quant import QuantConfig

GLOBAL_TENSOR = torch.zeros(1000)


@dataclass
class Prepared:
    packed: torch.Tensor
    scales: list[torch.Tensor]


class Owner:
    def __init__(self) -> None:
        self.weight = torch.ones(64, 32)
        self.prepared = Prepared(torch.ones(16, dtype=torch.uint8), [torch.ones(4)])

    def run(self) -> torch.Tensor:
        return self.weight.sum() + GLOBAL_TENSOR.sum()


def _ids(tensors: list[torch.Tensor]) -> set[int]:
    return {id(t) for t in tensors}


def test_a_closure_default_args_and_partial_are_followed_never_globals():
    x = torch.ones(3, 5)
    y = torch.ones(7)

    def call(scale=y):
        return x * scale.sum() + GLOBAL_TENSOR.sum()

    part = functools.partial(torch.add, x, other=y)
    assert _ids(reachable_tensors(call)) == {id(x), id(y)}
    assert _ids(reachable_tensors(part)) == {id(x), id(y)}


def test_a_bound_methods_object_and_its_nested_attributes_are_followed():
    owner = Owner()
    found = _ids(reachable_tensors(owner.run))
    p = owner.prepared
    assert found == {id(owner.weight), id(p.packed), id(p.scales[0])}


def test_each_tensor_is_found_once_and_the_depth_is_bounded():
    t = torch.ones(2)
    nested: object = t
    for _ in range(12):
        nested = [nested, t]
    assert _ids(reachable_tensors(lambda: nested)) == {id(t)}
    deep: object = torch.ones(3)
    for _ in range(12):
        deep = [deep]
    assert reachable_tensors(lambda: deep, max_depth=4) == []


class Wrapper(torch.Tensor):
    """A wrapper subclass whose data is its inner tensor (as torchao's quantized weights)."""

    def __tensor_flatten__(self):
        return ["inner"], None


def test_a_wrapper_subclass_is_followed_into_its_inner_tensors():
    w = torch.Tensor._make_subclass(Wrapper, torch.zeros(2))
    w.inner = torch.ones(5)
    assert _ids(reachable_tensors(lambda: w)) == {id(w.inner)}


class Opaque(torch.Tensor):
    """A wrapper subclass with no storage and no inner tensors to follow."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_wrapper_subclass(cls, (4, 4), dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


def test_a_tensor_without_memory_of_its_own_spans_nothing():
    opaque = Opaque()
    assert reachable_tensors(lambda: opaque) == [opaque]
    assert memory_spans([opaque]) == []


def test_a_view_spans_its_own_extent_and_overlaps_merge():
    base = torch.zeros(100, 10)
    rows = base[:4]  # the first 4 rows: 40 floats
    col = base[:, 0]  # every row's first element: 99 * 10 + 1 floats
    assert memory_spans([rows]) == [(base.data_ptr(), 40 * 4)]
    assert memory_spans([rows, col]) == [(base.data_ptr(), (99 * 10 + 1) * 4)]
    other = torch.zeros(8, dtype=torch.int8)
    spans = memory_spans([rows, other, torch.zeros(0), torch.zeros(3, device="meta")])
    assert resident_bytes(spans) == 160 + 8


def test_an_eviction_flushes_every_span_and_holds_its_tensors():
    seen: list[tuple[int, int]] = []
    t = torch.ones(256)
    evict = TensorEviction([t, t[:10]], lambda address, n: seen.append((address, n)))
    del t
    evict()
    assert seen == evict.spans == [(evict.tensors[0].data_ptr(), 1024)]
    assert evict.bytes == 1024


@pytest.mark.skipif(not cpu_ext.available(), reason="the CPU extension is not built")
def test_flushing_cache_lines_leaves_the_bytes_as_they_were():
    t = torch.randn(100_003)
    before = t.clone()
    evict = TensorEviction([t[1:], t[:7]], cpu_ext.flush_cache_lines)
    evict()
    assert torch.equal(t, before)
    with pytest.raises(cpu_ext.InputError, match="nbytes"):
        cpu_ext.flush_cache_lines(t.data_ptr(), -1)


@pytest.mark.skipif(not cpu_ext.available(), reason="the CPU extension is not built")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("nbytes", [1, 63, 65, 2**20 - 1, 2**20, 2**20 + 1, 3 * 2**20 + 37])
def test_a_flush_split_over_threads_reaches_every_end_and_changes_nothing(threads, nbytes):
    """Large flushes are split over the OpenMP team: unaligned starts and ends, sizes around
    the split, and more threads than cores all leave the bytes intact (a line past either end
    would be another allocation's)."""
    buf = torch.randint(0, 256, (nbytes + 200,), dtype=torch.uint8)
    before = buf.clone()
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_ext.flush_cache_lines(buf.data_ptr() + 37, nbytes)
    finally:
        torch.set_num_threads(was)
    assert torch.equal(buf, before)


@pytest.mark.skipif(not cpu_ext.available(), reason="the CPU extension is not built")
@pytest.mark.parametrize("name", sorted(all_backends()))
def test_every_cpu_backends_runner_flushes_its_weights_and_only_memory_it_owns(name):
    """What the cold timer flushes for each backend's runner: at least its int8 (or 16-bit)
    weight bytes, and never an address outside a tensor's storage (a torchao weight is an
    ``nn.Parameter`` around a wrapper subclass whose own data pointer is 0)."""
    backend = all_backends()[name]
    if not backend.availability(torch.device("cpu")).ok:
        pytest.skip(backend.availability(torch.device("cpu")).reason)
    gen = torch.Generator().manual_seed(7)
    m, k, n = 4, 128, 256
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    built = 0
    for method in METHODS:
        if not backend.supports(method, torch.device("cpu"), torch.bfloat16, m, k, n).ok:
            continue
        try:
            runner = backend.runner(method, x, w, None, QuantConfig())
        except (ValueError, NotImplementedError):
            continue
        built += 1
        evict = TensorEviction(reachable_tensors(runner.run), cpu_ext.flush_cache_lines)
        evict()
        assert evict.bytes >= n * k, method
        runner.run()
    assert built
