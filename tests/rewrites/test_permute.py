"""Regression: permutes of rank 4 (and every rank up to MAX_RANK) keep their shapes through the analysis, compose
correctly, and extract to graphs that evaluate like the original.

On the GPU machine (Python 3.12) a causal attention graph failed in extraction with
`permute: (0, 1, 2, 2) is not a permutation of 4 axes`: composed permutations and permuted shapes were built by
mapping a partially applied `vec-get` over a Vec (`UnstableFn`), which went wrong there. They are now written out
per rank with `vec-get` at constant positions.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith.ir.ops import Op
from tensorsmith.rewrites import saturate
from tensorsmith.rewrites.eclasses import EClasses, ENode, ExtractionError, build_graph, cheapest, read_eclasses
from tensorsmith.rewrites.term import MAX_RANK, constructor_cost
from tensorsmith.search import extract


def inputs_for(graph: ts.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(node.shape).astype(np.float32) for name, node in graph.inputs.items()}


def assert_extracts_alike(graph: ts.Graph) -> ts.Graph:
    saturated = saturate(graph)
    classes = read_eclasses(saturated.egraph, saturated.roots)
    best = extract(saturated)
    inputs = inputs_for(graph)
    before, after = ts.evaluate(graph, inputs), ts.evaluate(best, inputs)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-5, atol=1e-6)
    # every e-class has, in the analysis, the shape that the IR infers for its cheapest term
    choice = cheapest(classes, constructor_cost)
    every = EClasses(classes.nodes, {f"c{c}": c for c in choice}, classes.shapes, classes.dtypes)
    built = build_graph(every, choice, graph)
    for c in choice:
        assert classes.shapes.get(c) == built.outputs[f"c{c}"].shape, f"e-class {c}: {classes.nodes[c]}"
    return best


def test_the_causal_attention_graph_from_the_gpu_report_extracts() -> None:
    assert_extracts_alike(CASES["attention"]())


def test_transpose_inside_matmul_extracts() -> None:
    g = ts.Graph("qk")
    q = g.input("q", (2, 3, 5, 4), "float32")
    k = g.input("k", (2, 3, 7, 4), "float32")
    g.output("s", q @ k.transpose(-1, -2))
    g.output("t", (q @ k.transpose(-1, -2)).transpose(-1, -2).transpose(-1, -2))
    assert_extracts_alike(g)


PERMS4 = list(itertools.permutations(range(4)))


@pytest.mark.parametrize("seed", range(6))
def test_chains_of_4d_permutes_compose_and_extract(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = ts.Graph("chain")
    x = g.input("x", (2, 3, 4, 5), "float32")
    t = x
    for _ in range(4):
        t = t.permute(*PERMS4[rng.integers(len(PERMS4))])
    g.output("y", t * 2.0)
    g.output("z", t.sum(axis=int(rng.integers(4))))
    best = assert_extracts_alike(g)
    # a chain of permutes collapses into at most one
    assert sum(node.op == Op.PERMUTE for node in best.nodes()) <= 2


@pytest.mark.parametrize("rank", range(1, MAX_RANK + 1))
def test_a_permute_and_its_inverse_cancel_at_every_rank(rank: int) -> None:
    axes = tuple(reversed(range(rank)))
    shifted = tuple(range(1, rank)) + (0,)
    inverse = tuple(int(i) for i in np.argsort(shifted))
    g = ts.Graph("inverse")
    x = g.input("x", tuple(range(2, 2 + rank)), "float32")
    g.output("y", x.permute(*axes).permute(*axes).permute(*shifted).permute(*inverse).exp2())
    best = assert_extracts_alike(g)
    assert Op.PERMUTE not in {node.op for node in best.nodes()}


def test_an_ill_formed_choice_raises_a_clear_error_not_a_fallback() -> None:
    g = ts.Graph("bad")
    x = g.input("x", (2, 3, 4, 5), "float32")
    g.output("y", x.permute(0, 1, 3, 2).exp2())
    saturated = saturate(g)
    classes = read_eclasses(saturated.egraph, saturated.roots)
    choice = cheapest(classes, constructor_cost)
    broken = {c: (ENode("Permute", e.children, ((0, 1, 2, 2),)) if e.op == "Permute" else e)
              for c, e in choice.items()}
    with pytest.raises(ExtractionError, match=r"e-class \d+ .*Permute.*not a valid node.*not falling back"):
        build_graph(classes, broken, g)
