"""The bound on what rounding may move an output (search/error_bound.py): it holds the real rounding error of the
programs of a graph, grows with reduction length as floating-point error does, and does not excuse a bug."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import nn
from tensorsmith.search.error_bound import relative_error_bounds
from tensorsmith.search.partition import partition, unfused
from tensorsmith.search.verify import random_inputs, relative_l2


@pytest.mark.parametrize("case", ["norms", "matmul", "tensor_core_mlp", "column_sum", "full_sum", "rope"])
def test_the_bound_holds_the_rounding_error_of_fused_and_unfused_programs(case: str) -> None:
    graph = CASES[case]()
    for seed in range(3):
        inputs = random_inputs(graph, seed)
        reference = ts.evaluate(graph, inputs)
        bounds = relative_error_bounds(graph, inputs, reference)
        for program in (partition(graph), unfused(graph)):
            outputs = program.execute(inputs)
            for name in graph.outputs:
                assert relative_l2(outputs[name], reference[name]) <= bounds[name], (name, seed)


def _sum_of(length: int) -> ts.Graph:
    g = ts.Graph(f"sum_{length}")
    g.output("s", g.input("x", (4, length), "float32").sum(axis=1))
    return g


def test_the_bound_of_a_float32_sum_grows_with_its_length() -> None:
    """K terms summed in float32: each of the K - 1 additions may round, so the bound scales with K."""
    short, long = _sum_of(256), _sum_of(65536)
    bound = {}
    for graph in (short, long):
        inputs = {"x": np.abs(random_inputs(graph, 0)["x"])}   # positive terms: no cancellation, only length
        bound[graph] = relative_error_bounds(graph, inputs, ts.evaluate(graph, inputs))["s"]
    assert 100 < bound[long] / bound[short] < 400   # 256x the length


def test_the_bound_does_not_excuse_a_wrong_program() -> None:
    """A softmax over the wrong axis lies O(1) away; the bound, a few dozen float16 units, does not allow it."""
    g = ts.Graph("softmax_rows")
    x = g.input("x", (64, 64), "float16")
    g.output("y", nn.softmax(x, axis=-1))
    wrong = ts.Graph("softmax_rows")
    wrong.output("y", nn.softmax(wrong.input("x", (64, 64), "float16"), axis=0))
    inputs = random_inputs(g, 1)
    reference = ts.evaluate(g, inputs)
    bound = relative_error_bounds(g, inputs, reference)["y"]
    assert relative_l2(partition(wrong).execute(inputs)["y"], reference["y"]) > 10 * bound


def test_a_lookup_is_bounded_by_the_rows_it_picks() -> None:
    """An embedding of a computed (float16-rounded) table: the lookup picks rows, so its bound is theirs; the one-hot
    product it is written as is never evaluated, and the bound must not need it (it once raised KeyError)."""
    g = ts.Graph("embedded")
    table = g.input("table", (64, 32), "float32")
    rounded = (table * 3.0).cast("float16")
    g.output("y", nn.embedding(rounded, g.input("ids", (2, 8), "int32")).cast("float32") * 2.0)
    inputs = random_inputs(g, 0)
    reference = ts.evaluate(g, inputs)
    bound = relative_error_bounds(g, inputs, reference)["y"]
    assert 2.0**-12 < bound < 2.0**-9        # the float16 rounding of the rows, a few float32 units more
    assert relative_l2(partition(g).execute(inputs)["y"], reference["y"]) <= bound
