"""Slices sunk toward the inputs: the same values, fewer elements computed, nothing computed twice."""
from __future__ import annotations

import numpy as np

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.patterns import match_gather, match_matmul
from tensorsmith.ir.sliced import slices_sunk
from tensorsmith.search.verify import random_inputs


def _computed(graph: ts.Graph) -> int:
    return sum(node.size for node in graph.nodes() if node.op.name in ("SUM", "MUL", "ADD"))


def _last_logits(shared: bool) -> ts.Graph:
    """A norm and a vocabulary projection of 8 positions, of which the last two positions' logits are kept (and,
    with `shared`, the normalised rows are an output too)."""
    g = ts.Graph("last_logits")
    x = g.input("x", (1, 8, 16), "float32")
    normed = nn.rms_norm(x, g.input("norm", (16,), "float32"))
    g.output("last", nn.linear(normed, g.input("w", (100, 16), "float32"))[:, -2:])
    if shared:
        g.output("normed", normed)
    return g


def test_the_last_positions_logits_are_computed_alone_and_stay_a_matrix_product() -> None:
    graph = _last_logits(shared=False)
    sunk = slices_sunk(graph)
    assert _computed(sunk) * 4 == _computed(graph)     # two positions of eight: the norm's and the product's work
    assert any(match_matmul(node) is not None for node in sunk.nodes())
    inputs = random_inputs(graph, seed=2)
    assert np.allclose(ts.evaluate(sunk, inputs)["last"], ts.evaluate(graph, inputs)["last"], rtol=1e-12)


def test_a_value_another_output_reads_is_computed_whole_once_and_sliced() -> None:
    graph = _last_logits(shared=True)
    sunk = slices_sunk(graph)
    assert _computed(sunk) < _computed(graph)   # the product's rows sliced, the norm computed whole, once:
    assert [node.shape for node in sunk.nodes() if node.op.name == "SUM"] == [(1, 8), (1, 2, 100)]
    inputs = random_inputs(graph, seed=3)
    for name in ("last", "normed"):
        assert np.allclose(ts.evaluate(sunk, inputs)[name], ts.evaluate(graph, inputs)[name], rtol=1e-12)


def test_a_graph_with_nothing_to_sink_is_returned_as_it_is() -> None:
    g = ts.Graph("plain")
    g.output("y", g.input("x", (4, 8), "float32").exp()[1:3] + 1)   # exp2 of an input: sunk to the input
    assert slices_sunk(g) is not g
    h = ts.Graph("iota")
    h.output("y", ts.iota((4, 8), 0)[1:3])                        # an iota's values depend on where it starts
    assert slices_sunk(h) is h
    rows = ts.Graph("iota_rows")
    rows.output("y", (ts.iota((4, 8), 1) * 2)[1:3])               # sliced across its axis: a smaller iota
    (iota,) = [node for node in slices_sunk(rows).nodes() if node.op.name == "IOTA"]
    assert iota.shape == (2, 8) and np.array_equal(ts.evaluate(slices_sunk(rows), {})["y"],
                                                    ts.evaluate(rows, {})["y"])


def test_a_lookup_is_not_sliced_into_a_product_over_the_vocabulary() -> None:
    """An embedding lookup is a one-hot sum that codegen reads as the row it selects; its rows sliced below it,
    the pattern would be lost and the sum computed over the whole vocabulary, so the slice stays above it."""
    g = ts.Graph("embedded")
    g.output("y", nn.embedding(g.input("table", (100, 16), "float32"), g.input("ids", (1, 8), "int32"))[:, -1])
    assert [node.shape for node in slices_sunk(g).nodes() if match_gather(node)] == [(1, 8, 16)]
