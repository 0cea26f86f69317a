"""The streaming reference: a reduction over a large broadcast is evaluated in blocks, with the value a whole
evaluation gives (bit for bit, in every mode) and with memory near its inputs' and outputs' size."""
import math
import tracemalloc
from typing import Callable

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith.ir import streaming
from tensorsmith.ir.interpreter import check_inputs, evaluate_nodes, evaluation_plan, held_sizes
from tensorsmith.search.verify import random_inputs, verification_bytes


def masked_cumsum(n: int, d: int, dtype: str = "float32") -> ts.Graph:
    """A running sum written as a user might: a (n, n, d) broadcast of x, where j <= i, summed over j (a product
    with the mask would be a matrix product, which the reference evaluates as one)."""
    g = ts.Graph("masked_cumsum")
    x = g.input("x", (n, d), dtype)
    upto = ts.iota((n, n), 1) < ts.iota((n, n), 0) + 1    # upto[i, j] = j <= i
    g.output("y", ts.nn.where(upto[:, :, None], x[None, :, :], 0.0).sum(axis=1))
    return g


def _graph(name: str, build: Callable[[ts.Graph], ts.Tensor], shapes: dict[str, tuple[int, ...]],
           dtype: str = "float32") -> ts.Graph:
    g = ts.Graph(name)
    inputs = {k: g.input(k, s, dtype) for k, s in shapes.items()}
    g.output("y", build(**inputs))
    return g


# Cones through every kind of view, cut in blocks of 64 elements: each must give the whole evaluation's value.
CASES = {
    "masked_cumsum": lambda: masked_cumsum(12, 5),
    "masked_cumsum_float16": lambda: masked_cumsum(12, 5, "float16"),
    "transposed_broadcast": lambda: _graph("t", lambda a, b: (a.T[:, :, None] * b[None, :, :]).exp().sum(axis=1),
                                           {"a": (7, 9), "b": (7, 6)}),
    "max_over_sliced_pad": lambda: _graph("p", lambda a: a[1:, :-1].pad(((2, 1), (0, 3)))[:, None, :].expand(
        (10, 4, 11)).max(axis=2), {"a": (8, 9)}),
    "reshape_split_and_merge": lambda: _graph("r", lambda a, b: (
        (a.reshape(4, 3, 10) + 1.0).reshape(12, 10)[:, None, :]
        * b.reshape(1, 5, 2).reshape(5, 2).sum(axis=1)[None, :, None]).sum(axis=0), {"a": (6, 20), "b": (10,)}),
    "reshape_that_cannot_map_a_block": lambda: _graph("u", lambda a, b: (
        (a + 1.0).reshape(120).reshape(8, 15)[:, None, :] * b[None, :, :]).sum(axis=2), {"a": (6, 20), "b": (4, 15)}),
    "reduced_first_axis": lambda: _graph("f", lambda a, b: (a[:, :, None] - b[:, None, :]).abs().sum(axis=0),
                                         {"a": (9, 8), "b": (9, 7)}),
    "cone_value_also_an_output": lambda: _also_output(),
}


def _also_output() -> ts.Graph:
    g = ts.Graph("o")
    a, b = g.input("a", (6, 8), "float32"), g.input("b", (6, 7), "float32")
    wide = (a[:, :, None] * b[:, None, :]).sin()
    g.output("wide", wide)
    g.output("y", (wide * 2.0).sum(axis=1))
    g.output("z", (wide + 1.0).exp().sum(axis=2))
    return g


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 64)


@pytest.mark.parametrize("mode", [{}, {"registers": True}, {"rounded": True}, {"roots_only": True}])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_streamed_reduction_gives_the_whole_evaluations_value_bit_for_bit(small_blocks: None, case: str,
                                                                             mode: dict) -> None:
    graph = CASES[case]()
    roots = list(graph.outputs.values())
    streams = evaluation_plan(roots).streamed.values()
    assert streams and all(len(list(streaming.blocks(s))) > 1 for s in streams), "the case must stream in blocks"
    leaves = check_inputs(graph, random_inputs(graph, seed=3))
    streamed = evaluate_nodes(roots, leaves, stream=True, **mode)
    whole = evaluate_nodes(roots, leaves, stream=False, **mode)
    for name, node in graph.outputs.items():
        got, want = streamed[id(node)], whole[id(node)]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {name}")


def test_the_masked_cumsum_is_a_cumsum(small_blocks: None) -> None:
    graph = masked_cumsum(12, 5)
    x = np.random.default_rng(0).standard_normal((12, 5)).astype(np.float32)
    np.testing.assert_allclose(ts.evaluate(graph, {"x": x})["y"], np.cumsum(x.astype(np.float64), axis=0), rtol=1e-12)


def test_a_streamed_cone_holds_blocks_not_its_broadcast() -> None:
    """A (1024, 1024, 64) masked sum: 512 MiB per float64 array of its cone held whole, a few blocks streamed."""
    n, d = 1024, 64
    graph = masked_cumsum(n, d)
    x = np.random.default_rng(1).standard_normal((n, d)).astype(np.float32)
    tracemalloc.start()
    try:
        y = ts.evaluate(graph, {"x": x})["y"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(y, np.cumsum(x.astype(np.float64), axis=0), rtol=1e-9, atol=1e-9)
    broadcast = n * n * d * 8
    assert peak < broadcast / 4, f"peak {peak / 2**20:.0f} MiB, one broadcast array {broadcast / 2**20:.0f} MiB"


def test_verification_counts_a_streamed_reductions_blocks_not_its_source() -> None:
    """The issue's case, (4096, 4096, 256): about 64 GiB whole; its verification is judged by its blocks."""
    graph = masked_cumsum(4096, 256)
    source = math.prod((4096, 4096, 256))
    assert max(held_sizes(graph.outputs.values())) < source / 100
    assert verification_bytes(graph) < 2**30


def test_a_single_rows_product_and_a_single_tokens_lookup_are_not_streamed() -> None:
    """A decode step's products have one row, so nothing is expanded along M and the strict matmul match fails: they
    were summed in blocks of their (1, K, N) product, each block's float16 weight widened again (a 2-layer Llama-1B
    step's compile spent 14 of its 31 s so). The plan takes them as matrix products, and one token's embedding of a
    large table as a lookup of the table's row; the values are numpy's, within float64 rounding."""
    g = ts.Graph("decode_step")
    x = g.input("x", (1, 64), "float16")
    w = g.input("w", (96, 64), "float16")
    table = g.input("table", (20000, 64), "float16")     # a vocabulary: more elements than a block
    ids = g.input("ids", (1,), "int32")
    heads = g.input("heads", (4, 1, 16), "float16")
    keys = g.input("keys", (4, 32, 16), "float16")
    g.output("y", ts.nn.linear(x, w))
    g.output("e", ts.nn.embedding(table, ids))
    g.output("s", heads @ keys.transpose(1, 2))
    roots = list(g.outputs.values())
    plan = evaluation_plan(roots)
    assert not plan.streamed and len(plan.matmuls) == 2 and len(plan.lookups) == 1
    inputs = check_inputs(g, random_inputs(g, seed=1))
    values = evaluate_nodes(roots, inputs)
    wide = {name: np.asarray(value, np.float64) for name, value in inputs.items()}
    expected = {"y": wide["x"] @ wide["w"].T, "e": wide["table"][inputs["ids"]],
                "s": wide["heads"] @ wide["keys"].transpose(0, 2, 1)}
    for name, node in g.outputs.items():
        np.testing.assert_allclose(values[id(node)], expected[name], rtol=1e-12, atol=1e-12)
