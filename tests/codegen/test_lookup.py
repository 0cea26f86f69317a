"""Lookups (`nn.embedding`, `nn.take`): a one-hot sum in the graph, the one row it selects in the kernel, the
reference and the cost model; ids checked as PyTorch checks them."""
from __future__ import annotations

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.render import render_kernel
from tensorsmith.ir.errors import DTypeError, InputError
from tensorsmith.ir.interpreter import check_inputs, evaluate_nodes, evaluation_plan
from tensorsmith.ir.node import toposort
from tensorsmith.ir.patterns import lookup_ids, lookup_reads, match_gather, match_matmul
from tensorsmith.ir.targets import TARGETS
from tensorsmith.ir.tensor import equal, iota, logical_and, logical_not
from tensorsmith.search.cost import kernel_cost
from tensorsmith.search.partition import materialisable, partition, unfused
from tensorsmith.search.verify import random_inputs


def _embedding(vocab: int = 1000, tokens: int = 24, width: int = 64, dtype: str = "float16") -> ts.Graph:
    g = ts.Graph("embedding")
    ids = g.input("ids", (2, tokens), "int32")
    table = g.input("table", (vocab, width), dtype)
    g.output("y", nn.embedding(table, ids))
    return g


def _sums(graph: ts.Graph) -> list:
    return [node for node in toposort(list(graph.outputs.values())) if node.op.value == "sum"]


def test_embedding_is_matched_as_a_lookup_of_its_ids() -> None:
    graph = _embedding()
    (total,) = _sums(graph)
    lookup = match_gather(total)
    assert lookup is not None and lookup.length == 1000
    assert lookup.ids is graph.inputs["ids"] and lookup.ids_axes == (0, 1)
    assert match_matmul(total) is not None      # the graph's form is still a contraction, for the e-graph and Z3
    assert lookup_ids(list(graph.outputs.values())) == {"ids": 1000}
    assert lookup_reads(list(graph.outputs.values())) == {"table": 2 * 24 * 64}


def test_take_along_a_middle_axis_matches_numpy() -> None:
    g = ts.Graph("take")
    x = g.input("x", (4, 30, 6), "float32")
    j = g.input("j", (5,), "int32")
    g.output("y", nn.take(x, j, axis=1))
    lookup = match_gather(_sums(g)[0])
    assert lookup is not None and lookup.length == 30
    values = {"x": np.random.default_rng(0).standard_normal((4, 30, 6)).astype(np.float32),
              "j": np.array([0, 29, 7, 7, 3], np.int32)}
    assert np.array_equal(ts.evaluate(g, values)["y"], np.take(values["x"], values["j"], axis=1))


@pytest.mark.parametrize("selector", ["less_equal", "two_ids", "varying_ids"])
def test_sums_that_are_not_lookups_are_not_matched(selector: str) -> None:
    """A prefix sum (r <= id), a selector of two different ids, and ids that vary along the summed axis."""
    g = ts.Graph(selector)
    x = g.input("x", (8, 16), "float32")
    a = g.input("a", (8, 1), "int32").expand((8, 16))
    r = iota((8, 16), 1)
    if selector == "less_equal":
        hot = logical_not(a < r)
    elif selector == "two_ids":
        hot = logical_and(equal(r, a), equal(r, g.input("b", (8, 1), "int32").expand((8, 16))))
    else:
        hot = equal(r, g.input("c", (8, 16), "int32"))
    g.output("y", (hot.cast("float32") * x).sum(1))
    assert match_gather(_sums(g)[0]) is None


def test_a_lookup_is_as_exact_as_its_one_hot_sum_and_out_of_range_ids_give_zeros() -> None:
    graph = _embedding(vocab=50, dtype="float32")
    ids = np.array([[0, 49, 50, -1, 7] * 4 + [3, 3, 3, 3]] * 2, np.int32)
    table = np.random.default_rng(1).standard_normal((50, 64)).astype(np.float32)
    out = evaluate_nodes(graph.outputs.values(), {"ids": ids, "table": table})[id(graph.outputs["y"])]
    hot = (ids[..., None] == np.arange(50)).astype(np.float64)
    assert np.array_equal(out, hot @ table.astype(np.float64))
    assert not out[ids == 50].any() and not out[ids == -1].any()


def test_a_table_only_looked_up_in_is_not_widened_whole() -> None:
    graph = _embedding(vocab=1000)
    inputs = random_inputs(graph, seed=0)
    assert check_inputs(graph, inputs)["table"].dtype == np.float16      # its rows are widened as they are read
    out = ts.evaluate(graph, inputs)["y"]
    assert out.dtype == np.float64 and np.array_equal(out, inputs["table"][inputs["ids"]].astype(np.float64))


def test_an_out_of_range_id_is_an_input_error_naming_it() -> None:
    graph = _embedding(vocab=100)
    inputs = random_inputs(graph, seed=0)
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 100 and inputs["ids"].max() > 50  # ids drawn as rows
    inputs["ids"][1, 5] = 100
    with pytest.raises(InputError, match=r"'ids'.*id 100 at \[1, 5\].*0 to 99"):
        ts.evaluate(graph, inputs)


def test_a_one_hot_sum_written_by_hand_keeps_its_ignored_index() -> None:
    """A loss with an ignored target (-100, PyTorch's ignore_index) is a sum whose out-of-range ids select nothing:
    only the indexing functions' ids are refused out of range."""
    g = ts.Graph("picked")
    logits, targets = g.input("logits", (4, 10), "float32"), g.input("targets", (4,), "int32")
    hot = equal(iota((4, 10), 1), targets.reshape((4, 1)).expand((4, 10))).cast("float32")
    g.output("y", (hot * logits).sum(1))
    assert match_gather(_sums(g)[0]) is not None and lookup_ids(list(g.outputs.values())) == {}
    values = {"logits": np.arange(40, dtype=np.float32).reshape(4, 10), "targets": np.array([3, -100, 7, 1], np.int32)}
    assert ts.evaluate(g, values)["y"].tolist() == [3.0, 0.0, 27.0, 31.0]


def test_only_the_ids_a_lookup_reads_are_checked_and_a_computed_table_is_read_whole() -> None:
    g = ts.Graph("sliced")
    ids, table = g.input("ids", (8,), "int32"), g.input("table", (100, 16), "float16")
    centred = table - table.mean(1, keepdim=True).expand((100, 16))
    g.output("rows", nn.embedding(centred, ids[:4]))
    g.output("scaled", ids[4:].cast("float32") * 2)
    roots = list(g.outputs.values())
    assert lookup_ids(roots) == {} and lookup_reads(roots) == {}     # a slice of the ids; a table computed whole
    values = {"ids": np.array([0, 1, 2, 3, 500, 600, -7, 8], np.int32),
              "table": np.random.default_rng(2).standard_normal((100, 16)).astype(np.float16)}
    table64 = values["table"].astype(np.float64)
    expected = (table64 - table64.mean(1, keepdims=True))[:4]
    assert np.allclose(ts.evaluate(g, values)["rows"], expected, rtol=0, atol=1e-12)


def test_values_computed_at_the_products_size_are_summed_in_blocks_not_made_whole() -> None:
    g = ts.Graph("scaled_inside")
    t, ids = g.input("t", (800, 64), "float32"), g.input("ids", (32,), "int32")
    hot = equal(iota((32, 800), 1), ids.reshape((32, 1)).expand((32, 800))).cast("float32")
    values = t.reshape((1, 800, 64)).expand((32, 800, 64)) * 2.0
    g.output("y", (hot.reshape((32, 800, 1)).expand((32, 800, 64)) * values).sum(1))
    assert match_gather(_sums(g)[0]) is not None
    assert not evaluation_plan(list(g.outputs.values())).lookups


def test_take_needs_integer_ids() -> None:
    g = ts.Graph("float_ids")
    with pytest.raises(DTypeError, match="int32"):
        nn.take(g.input("x", (4, 4), "float32"), g.input("i", (2,), "float32"))


def test_a_lookup_kernel_reads_one_row_and_is_priced_by_it() -> None:
    """GPT-2's vocabulary: one pointwise kernel that loads the selected row, priced by the rows it reads, not by the
    table (77 MB) nor the one-hot product's 20 GFLOP."""
    graph = _embedding(vocab=50257, tokens=256, width=768)
    program = partition(graph)
    (kernel,) = program.kernels
    assert kernel.archetype == "pointwise"
    source = render_kernel(program, 0).source
    assert "row" in source and "50257" in source and "for (int r" not in source
    cost = kernel_cost(kernel, program, TARGETS["sm90"])
    assert cost.dram_bytes < 4 * 2 * 256 * 768 * 2       # ids, the rows read and the output: about 1.6 MB
    assert cost.flops < 10 * 2 * 256 * 768
    assert cost.seconds < 20e-6


def test_compiled_lookup_fused_with_a_norm_matches_the_reference() -> None:
    g = ts.Graph("embedding_norm")
    ids = g.input("ids", (40,), "int32")
    table = g.input("table", (3000, 96), "float16")
    pos = g.input("pos", (40, 96), "float16")
    g.output("y", nn.layer_norm(nn.embedding(table, ids) + pos))
    program = ts.compile(g, budget_s=10, profile=False, progress=False)
    assert len(program.kernels) == 1
    inputs = random_inputs(g, seed=3)
    out = program(device="cpu", **inputs)["y"]
    ref = ts.evaluate(g, inputs)["y"]
    assert np.abs(out.astype(np.float64) - ref).max() < 2e-2
    inputs["ids"][0] = -1
    with pytest.raises(InputError, match="out of range"):
        program(device="cpu", **inputs)


def test_no_program_makes_a_lookups_selector_a_buffer_of_its_own() -> None:
    """The selector (ids compared with the rows' iota, cast) exists only inside its lookup's kernel: made a buffer,
    the lookup would be a sum over every row of the table. Llama-3.2-1B's decode step, its embedding tied to the
    vocabulary projection, was searched into such a program: 204 us predicted for one row of 128256."""
    graph = ts.Graph("tied")
    table = graph.input("table", (32000, 256), "float16")
    ids = graph.input("ids", (1, 1), "int32")
    graph.output("y", (nn.embedding(table, ids) * 2.0) @ table.T)
    (lookup,) = [found for node in toposort(list(graph.outputs.values())) if (found := match_gather(node))]
    selector = {id(node) for node in lookup.selector_nodes()}
    assert {node.op.value for node in lookup.selector_nodes()} >= {"iota", "cast"} and id(lookup.ids) not in selector
    assert not selector & {id(node) for node in materialisable(graph)}
    program = unfused(graph)                      # every node that may be a buffer is one
    (kernel,) = [k for k in program.kernels if k.writes[0].startswith("embedding")]
    assert kernel.archetype == "pointwise" and kernel_cost(kernel, program, TARGETS["sm90"]).dram_bytes < 4 * 256 * 2
