"""Values computed out of size-0 tensors are folded to the constants they equal."""
from __future__ import annotations

import numpy as np

import tensorsmith as ts
from tensorsmith.ir.empty import empties_folded, is_empty
from tensorsmith.ir.ops import Op


def test_a_sum_over_an_empty_axis_and_a_pad_of_an_empty_tensor_become_constants() -> None:
    g = ts.Graph("folds")
    x = g.input("x", (0, 16), "float16")
    g.output("mean", x.mean(0))                               # a sum over the empty axis, then a division by 0
    g.output("padded", x.pad([(2, 1), (0, 0)]) + 1.0)         # (3, 16) of fill
    g.output("product", x.transpose(0, 1) @ x)                # (16, 16), K = 0
    g.output("same", x * 2.0)                                 # empty: left as it is
    folded = empties_folded(g)
    assert folded is not g and folded.inputs == g.inputs
    for node in folded.nodes():   # nothing with elements reads an empty value any more
        assert is_empty(node) or not any(is_empty(src) for src in node.srcs), node
    constants = [node for node in folded.nodes() if node.op == Op.CONSTANT and node.shape in ((16,), (3, 16))]
    assert constants and all(node.arg == 0.0 for node in constants)
    assert folded.outputs["same"] is g.outputs["same"]
    given = {"x": np.zeros((0, 16), np.float16)}
    want, got = ts.evaluate(g, given), ts.evaluate(folded, given)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert np.isnan(got["mean"]).all() and (got["padded"] == 1).all() and (got["product"] == 0).all()


def test_a_graph_without_empty_values_is_returned_as_it_is() -> None:
    g = ts.Graph("full")
    x = g.input("x", (4, 16), "float32")
    g.output("y", x.sum(0))
    assert empties_folded(g) is g
