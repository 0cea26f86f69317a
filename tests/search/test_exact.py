"""The exact check over the integers mod a prime: every right program of the graph cases passes it, and planted
bugs that keep every shape (a transposed operand, an off-by-one slice, a wrong reduction axis, a dropped term)
are each caught, one of them a bug the float check passes."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import CASES
from tensorsmith import pipeline
from tensorsmith.ir import primitives as P
from tensorsmith.ir.kernel_program import Kernel, KernelProgram
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import Op
from tensorsmith.ir.targets import get_target
from tensorsmith.search.exact import (PRIME, ExactMismatch, check_exact, draw_inputs, evaluate_exact, execute_exact,
                                      relative_cost)
from tensorsmith.search.partition import unfused
from tensorsmith.search.verify import random_inputs, verify_program


def _planted(program: KernelProgram, hit: Callable[[Node], bool], replace: Callable[[Node], Node]) -> KernelProgram:
    """`program` with the first node of its kernels' bodies that `hit` accepts replaced by `replace(node)`, the
    nodes above it rebuilt on it."""
    done = False
    kernels = []
    for kernel in program.kernels:
        new: dict[int, Node] = {}
        for node in toposort([n for _, n in kernel.outputs]):
            rebuilt = dataclasses.replace(node, srcs=tuple(new[id(s)] for s in node.srcs))
            if not done and hit(node):
                rebuilt, done = replace(rebuilt), True
            new[id(node)] = rebuilt
        kernels.append(Kernel(kernel.name, kernel.archetype, tuple((b, new[id(n)]) for b, n in kernel.outputs),
                              kernel.schedule))
    assert done, "the planted bug found no node to replace"
    return dataclasses.replace(program, kernels=kernels)


def _graph(name: str, build: Callable[[ts.Graph], ts.Tensor]) -> ts.Graph:
    graph = ts.Graph(name)
    graph.output("y", build(graph))
    return graph


def _reads(name: str) -> Callable[[Node], bool]:
    return lambda node: node.op == Op.INPUT and node.arg == name


PLANTED = {
    "transposed_operand": (lambda g: g.input("x", (16, 64), "float16") @ g.input("w", (64, 64), "float16"),
                           _reads("w"), lambda node: P.contiguous(P.permute(node, (1, 0)))),
    "off_by_one_slice": (lambda g: g.input("x", (16, 66), "float16")[:, 1:65] @ g.input("w", (64, 32), "float16"),
                         lambda node: node.op == Op.SLICE, lambda node: P.slice_(node.srcs[0], [(0, 16), (0, 64)])),
    "wrong_reduction_axis": (lambda g: g.input("x", (48, 48), "float32").sum(axis=1) * 2.0,
                             lambda node: node.op == Op.SUM, lambda node: P.reduce(Op.SUM, node.srcs[0], 0)),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught_by_the_exact_check(bug: str) -> None:
    build, hit, replace = PLANTED[bug]
    graph = _graph(bug, build)
    right = unfused(graph)
    assert all(c.ok for c in check_exact(graph, right, seed=3))
    wrong = _planted(right, hit, replace)
    with pytest.raises(ExactMismatch, match="computes another function"):
        check_exact(graph, wrong, seed=3)


def test_a_dropped_term_passes_the_float_check_and_not_the_exact_one() -> None:
    """A product over K = 16384 that leaves out its last term (a tile loop's off-by-one bound, its operand read
    through a slice and padded back): the result moves by about 1/sqrt(K) = 0.8%, inside float16's 1e-2."""
    k = 16384
    graph = _graph("dropped_term", lambda g: g.input("x", (8, k), "float16") @ g.input("w", (k, 8), "float16"))
    wrong = _planted(unfused(graph), _reads("x"), lambda node: P.pad(P.slice_(node, [(0, 8), (0, k - 1)]),
                                                                     [(0, 0), (0, 1)]))
    checks = verify_program(graph, wrong, seed=0)      # the float check, two draws: passes
    assert all(c.ok for c in checks) and all(c.error > 1e-3 for c in checks)
    with pytest.raises(ExactMismatch):
        check_exact(graph, wrong, seed=0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_compiled_case_matches_its_chosen_graph_exactly(case: str) -> None:
    """The kernel program the search returns computes the graph extraction chose, element for element."""
    context = pipeline.Context(CASES[case](), pipeline.CompileOptions(budget_s=2, profile=False), get_target("sm90"),
                               deadline=time.monotonic() + 2.0)   # as compile() sets it: without, no budget at all
    layered = pipeline.identical_layers(context)                   # layers, saturate and extract, then search
    searched = pipeline.search_stage(context, layered, pipeline._extracted(context, layered))
    assert all(c.ok for c in check_exact(searched.forms.chosen, searched.program, seed=11))


def test_residues_stay_in_the_field_and_views_move_them_unchanged() -> None:
    graph = _graph("views", lambda g: (g.input("a", (4, 6), "float32").transpose(0, 1).reshape(3, 8) * 1.5).exp())
    inputs = draw_inputs(graph, seed=5)
    out = evaluate_exact(graph, inputs, seed=5)["y"]
    assert out.min() >= 0 and out.max() < PRIME and np.array_equal(out, np.round(out))
    assert np.array_equal(out, execute_exact(unfused(graph), inputs, seed=5)["y"])


def test_compile_checks_its_program_exactly_and_says_against_what() -> None:
    program = ts.compile(CASES["tensor_core_mlp"](), profile=False, cache=False)
    exact = program.report["exact"]
    assert exact["modulus"] == PRIME and exact["outputs"] == list(program.outputs)
    assert exact["against"] in ("the user's graph", "the rewritten graph extraction chose")


def test_a_product_whose_operand_is_broadcast_over_rows_and_read_twice() -> None:
    """sum(expand(v) * expand(w)) where v's expand also makes the M rows, and the product is read again elsewhere:
    both sides evaluate it as the graph means (the matmul shortcut reads the broadcast operands themselves)."""
    def build(g: ts.Graph) -> ts.Tensor:
        v, w = g.input("v", (32,), "float16"), g.input("w", (32, 8), "float16")
        product = v.reshape(1, 32, 1).expand(4, 32, 8) * w.reshape(1, 32, 8).expand(4, 32, 8)
        return product.sum(axis=1) + product.max(axis=1)
    graph = _graph("broadcast_rows", build)
    assert all(c.ok for c in check_exact(graph, unfused(graph), seed=2))
    assert evaluate_exact(graph, draw_inputs(graph, 2), 2)["y"].shape == (4, 8)


def _one_hot_pick(tokens: int = 64, vocab: int = 4000) -> ts.Graph:
    """A cross-entropy's pick of each row's target: comparisons over (tokens, vocab), cheap in floats only."""
    g = ts.Graph("pick")
    logits, target = g.input("logits", (tokens, vocab), "float32"), g.input("target", (tokens, 1), "int32")
    hot = (ts.iota((tokens, vocab), axis=1) == target).cast("float32")
    g.output("picked", (logits * hot).sum(axis=1))
    return g


def test_the_exact_checks_cost_is_estimated_from_its_ops_not_as_one_reference() -> None:
    """A one-hot pick's comparisons cost tens of float evaluations over the field; a matrix product about one. The
    estimate is within 4x of the time measured (both sides timed in the same conditions)."""
    pick, product = _one_hot_pick(), ts.Graph("product")
    product.output("y", product.input("x", (256, 1024), "float32") @ product.input("w", (1024, 1024), "float32"))
    assert relative_cost(pick) > 10 > 2 > relative_cost(product)
    inputs, residues = random_inputs(pick, 0), draw_inputs(pick, 0)
    reference_s = _quickest(lambda: ts.evaluate(pick, inputs))   # the quickest of a few: a busy machine's pauses
    exact_s = _quickest(lambda: evaluate_exact(pick, residues, 0))    # fall on single runs, not on all of them
    assert relative_cost(pick) / 4 < exact_s / reference_s < 4 * relative_cost(pick)


def _quickest(run, repeats: int = 5) -> float:
    """The shortest of `repeats` timed runs of `run`, in seconds."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)
