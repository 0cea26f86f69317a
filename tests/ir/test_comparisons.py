"""== and != on tensors build elementwise comparisons, as < does (issue 18, item 5: they returned a Python bool,
so `x * (col == label)` compiled to zeros); IEEE semantics, NaN and infinities included."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts

A = np.array([1, 2, np.nan, np.inf, -np.inf, 0, 5], np.float32)
B = np.array([1, 3, np.nan, np.inf, np.inf, -0.0, np.nan], np.float32)


def _graph() -> ts.Graph:
    g = ts.Graph("comparisons")
    x, y = g.input("x", A.shape, "float32"), g.input("y", B.shape, "float32")
    g.output("eq", x == y)
    g.output("ne", x != y)
    g.output("eq_scalar", 2.0 == x)
    g.output("masked", x * (y == 1.0).cast("float32"))
    return g


def test_equal_and_not_equal_are_elementwise_bool_tensors() -> None:
    g = _graph()
    assert all(node.dtype == ts.DType.BOOL for name, node in g.outputs.items() if name != "masked")
    out = ts.evaluate(g, {"x": A, "y": B})
    np.testing.assert_array_equal(out["eq"], A == B)
    np.testing.assert_array_equal(out["ne"], A != B)
    np.testing.assert_array_equal(out["eq_scalar"], A == 2.0)
    with np.errstate(invalid="ignore"):      # inf * 0 is NaN, in the graph as in numpy
        np.testing.assert_array_equal(out["masked"], A * (B == 1.0))


def test_the_compiled_program_compares_as_the_reference_does() -> None:
    program = ts.compile(_graph(), profile=False, cache=False)
    out = program(device="cpu", x=A, y=B)
    np.testing.assert_array_equal(out["eq"], A == B)
    np.testing.assert_array_equal(out["ne"], A != B)


def test_integer_equality_and_hashing_by_identity() -> None:
    g = ts.Graph("labels")
    labels = g.input("labels", (5,), "int32")
    g.output("hit", labels == 3)
    out = ts.evaluate(g, {"labels": np.array([3, 1, 3, -3, 0], np.int32)})
    np.testing.assert_array_equal(out["hit"], [True, False, True, False, False])
    other = g.input("other", (5,), "int32")
    assert len({labels, other, labels}) == 2          # tensors still key dicts and sets, by identity
    with pytest.raises(TypeError, match="no truth value"):
        bool(labels == other)
