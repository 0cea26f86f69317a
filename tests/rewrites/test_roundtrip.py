"""Graph -> e-graph -> Graph keeps the program: the same values, the same structure (up to merged duplicates).

An e-graph hash-conses its terms, so two structurally identical subgraphs (say, two `constant 1.0` nodes
made by two `x * 1`) come back as one node: the round trip equals the original with common subexpressions
eliminated (`cse` below), and equals the original itself where it had no duplicates.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import pytest
from graph_cases import CASES, deep_shared_chain

import tensorsmith as ts
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.primitives import constant, rebuild
from tensorsmith.model_loader import load_graph as load_example
from tensorsmith.rewrites import from_egglog, saturate, to_egglog
from tensorsmith.rewrites.eclasses import EClasses, build_graph, cheapest, read_eclasses
from tensorsmith.rewrites.term import constructor_cost
from tensorsmith.search.verify import random_inputs

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))
SEEDS = list(range(12))




def cse(graph: ts.Graph) -> ts.Graph:
    """The graph with structurally identical nodes merged (what an e-graph does to it)."""
    out = ts.Graph(graph.name)
    out.inputs.update(graph.inputs)
    canon: dict[int, Node] = {}
    table: dict[tuple, Node] = {}
    for node in graph.nodes():
        if node.op == ts.ir.Op.INPUT:
            canon[id(node)] = node
            continue
        srcs = tuple(canon[id(src)] for src in node.srcs)
        arg = struct_key(node.arg)
        key = (node.op, arg, node.shape, node.dtype, tuple(id(src) for src in srcs))
        if key not in table:
            table[key] = node if all(a is b for a, b in zip(srcs, node.srcs)) else rebuild(node, srcs)
        canon[id(node)] = table[key]
    out.outputs.update({name: canon[id(node)] for name, node in graph.outputs.items()})
    return out


def struct_key(arg: object) -> object:
    """An arg as a dict key that tells -0.0 from 0.0 and matches nan with nan."""
    return ("float", float(arg).hex()) if isinstance(arg, float) else repr(arg)


def round_trip(graph: ts.Graph) -> ts.Graph:
    egraph, roots = to_egglog(graph)
    return from_egglog(egraph, roots, graph)


def assert_same_program(graph: ts.Graph, back: ts.Graph) -> None:
    assert back.name == graph.name
    assert list(back.outputs) == list(graph.outputs)
    assert all(back.inputs[name] is node for name, node in graph.inputs.items())
    assert back.structural_hash() == cse(graph).structural_hash()
    if len(cse(graph).nodes()) == len(graph.nodes()):
        assert back.structural_hash() == graph.structural_hash()
    inputs = random_inputs(graph, seed=0)
    before, after = ts.evaluate(graph, inputs), ts.evaluate(back, inputs)
    for name in graph.outputs:
        np.testing.assert_array_equal(after[name], before[name])


# random graphs -----------------------------------------------------------------------------------

def _random_view(rng: random.Random, t: ts.Tensor) -> ts.Tensor:
    kind = rng.choice(["permute", "reshape", "slice", "pad", "expand", "contiguous"])
    if kind == "contiguous":
        return t.contiguous()
    if kind == "permute" and t.ndim >= 2:
        axes = list(range(t.ndim))
        rng.shuffle(axes)
        return t.permute(axes)
    if kind == "reshape" and t.ndim >= 1:
        return t.reshape(-1) if rng.random() < 0.5 or t.ndim == 1 else t.reshape(t.shape[0], -1)
    if kind == "slice" and t.ndim >= 1 and t.shape[0] >= 2:
        return t[1:]
    if kind == "pad" and t.ndim >= 1:
        return t.pad([(rng.randint(0, 2), rng.randint(0, 1))] + [(0, 0)] * (t.ndim - 1))
    return t.reshape((1,) + t.shape).expand((rng.randint(2, 3),) + t.shape)


def random_graph(seed: int, steps: int = 30) -> ts.Graph:
    """A seeded mix of unary, binary, reduce, view, cast, constant and iota ops over two inputs."""
    rng = random.Random(seed)
    g = ts.Graph(f"random_{seed}")
    shape = rng.choice([(3, 4), (2, 3, 4), (5,), (4, 1, 3)])
    pool = [g.input("x", shape, "float32"), g.input("y", shape, "float32")]
    for _ in range(steps):
        t = pool[-1] if rng.random() < 0.5 else rng.choice(pool)
        kind = rng.choice(["unary", "binary", "binary", "reduce", "view", "view", "cast", "const", "iota"])
        if kind == "unary":
            t = getattr(t, rng.choice(["exp2", "log2", "sin", "sqrt", "recip"]))()
        elif kind == "binary":
            same = [u for u in pool if u.shape == t.shape and u.dtype == t.dtype]
            u = rng.choice(same)
            t = rng.choice([t + u, t * u, t % u, (t < u).cast(t.dtype), t - u, t / u])
        elif kind == "reduce" and t.ndim >= 1:
            axis = rng.randrange(t.ndim)
            t = t.sum(axis, keepdim=rng.random() < 0.5) if rng.random() < 0.5 else t.max(axis)
        elif kind == "view":
            t = _random_view(rng, t)
        elif kind == "cast":
            t = t.cast(rng.choice(["float16", "int32", "float32"])).cast("float32")
        elif kind == "const":
            t = t + rng.choice([0.0, -0.0, 1.0, math.inf, -1e9, 2.5])
        elif kind == "iota" and t.ndim >= 1:
            t = t * ts.iota(t.shape, rng.randrange(t.ndim)).cast(t.dtype)
        pool.append(t)
    used = {id(src) for node in toposort([t.node for t in pool]) for src in node.srcs}
    sinks = {id(t.node): t for t in pool[2:] if id(t.node) not in used}  # every value feeds an output
    for k, t in enumerate(sinks.values()):
        g.output(f"out{k}", t)
    return g


# tests -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_round_trips(path: Path) -> None:
    graph = load_example(path)
    assert_same_program(graph, round_trip(graph))


def test_examples_are_there_or_skipped() -> None:
    if not EXAMPLES:
        pytest.skip("examples/ holds no model yet")
    assert all(path.suffix == ".py" for path in EXAMPLES)


@pytest.mark.parametrize("case", list(CASES))
def test_every_graph_case_round_trips(case: str) -> None:
    graph = CASES[case]()
    assert_same_program(graph, round_trip(graph))


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graphs_round_trip(seed: int) -> None:
    graph = random_graph(seed)
    assert len(graph.nodes()) > 20
    assert_same_program(graph, round_trip(graph))


@pytest.mark.parametrize("value", [0.0, -0.0, math.inf, -math.inf, math.nan, -1e9, 5e-324, 1 / 3, 65504.0])
def test_float_constants_round_trip_bit_for_bit(value: float) -> None:
    g = ts.Graph("constants")
    g.input("x", (2,), "float32")
    g.outputs["c"] = constant(value, (2, 3), "float32")
    back = round_trip(g)
    arg = back.outputs["c"].arg
    assert isinstance(arg, float) and np.float64(arg).tobytes() == np.float64(value).tobytes()


@pytest.mark.parametrize(("value", "dtype"), [(2**31 - 1, "int32"), (-7, "int32"), (True, "bool"),
                                              (False, "bool")])
def test_int_and_bool_constants_round_trip(value: int, dtype: str) -> None:
    g = ts.Graph("constants")
    g.outputs["c"] = constant(value, (3,), dtype)
    node = round_trip(g).outputs["c"]
    assert node.arg == value and type(node.arg) is type(value) and node.dtype.value == dtype


def test_the_analysis_finds_every_shape_and_dtype() -> None:
    """shape_of and dtype_of, derived by egglog rules for the terms inside the let bindings and for the terms
    that rules create, agree with the IR's own inference on every e-class of saturated random graphs."""
    for seed in SEEDS[:4]:
        graph = random_graph(seed)
        saturated = saturate(graph)
        classes = read_eclasses(saturated.egraph, saturated.roots)
        choice = cheapest(classes, constructor_cost)
        assert set(classes.shapes) == set(classes.nodes) == set(classes.dtypes)
        every = EClasses(classes.nodes, {f"c{c}": c for c in choice}, classes.shapes, classes.dtypes)
        built = build_graph(every, choice, graph)
        for c in choice:
            node = built.outputs[f"c{c}"]
            assert (classes.shapes[c], classes.dtypes[c]) == (node.shape, node.dtype.value), node


def test_a_deep_shared_chain_converts_without_blowing_up() -> None:
    """2000 nodes, each used twice: as a tree the term would have 2**1000 leaves; recursion would overflow."""
    g = deep_shared_chain()
    assert len(g.nodes()) == 2001
    start = time.perf_counter()
    back = round_trip(g)
    assert time.perf_counter() - start < 10
    assert_same_program(g, back)


def test_a_root_that_is_not_let_bound_is_refused() -> None:
    g = ts.Graph("one")
    x = g.input("x", (2,), "float32")
    g.output("y", x.sin())
    egraph, roots = to_egglog(g)
    from tensorsmith.rewrites.term import Sin
    with pytest.raises(ValueError, match="not a let-bound term"):
        from_egglog(egraph, {"y": Sin(roots["y"])}, g)
