"""The e-graph as the search space: the searched program uses another algebraic form than the one written, where the
cost model prices that form's kernels faster (issue 19). Each graph is searched twice on the CPU: as written alone
(kernel boundaries and schedules only), and with the forms extraction takes from the saturated e-graph."""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import rewrites
from tensorsmith.ir.graph import Graph
from tensorsmith.ir.ops import VIEWS, Op
from tensorsmith.ir.patterns import match_matmul
from tensorsmith.ir.targets import get_target
from tensorsmith.search import canonical_hash, extract_forms, search_program
from tensorsmith.search.beam import BeamConfig, beam
from tensorsmith.search.mcts import MCTSConfig, mcts
from tensorsmith.search.space import CandidateSpace

from form_cases import (chain_left_first, chain_of_four, chain_right_first, rms_norm_linear, row_scaled_linear,
                        shared_operand, shared_weight)

BUDGET_S = 5.0
CHOICE_S = 20.0   # the searches that must find another form's program: at 5 s, CI's two workers on two busy cores
                  # left the second form's beam too little of the budget to find it (2 of 6 cases failed, 2026-12-02);
                  # at 10 s shared_weight failed the same way beside the bench's tests (2026-12-04)


CASES = [row_scaled_linear, chain_left_first, chain_right_first, shared_operand, shared_weight, chain_of_four]


def _searched(graph: Graph) -> tuple[ts.search.SearchResult, ts.search.SearchResult, list[Graph]]:
    forms = [form.graph for form in extract_forms(rewrites.saturate(graph))]
    alone = search_program(graph, budget_s=CHOICE_S)
    return alone, search_program(forms[0], budget_s=CHOICE_S, reference=graph, forms=forms[1:]), forms


def _matmul_flops(graph: Graph) -> int:
    """2 m k n over the graph's contractions (a sum of a broadcast product)."""
    return sum(2 * math.prod(node.srcs[0].shape) for node in graph.nodes()
               if node.op == Op.SUM and node.srcs[0].op == Op.MUL)


@pytest.mark.parametrize("make", CASES, ids=[make.__name__ for make in CASES])
def test_the_search_chooses_another_form_predicted_faster(make: Callable[[], Graph]) -> None:
    graph = make()
    alone, searched, graphs = _searched(graph)
    chosen = graphs[searched.form]
    assert searched.form != 0 and canonical_hash(chosen) != canonical_hash(graph), "the written form won"
    assert searched.predicted_us < alone.predicted_us / 1.05, (searched.predicted_us, alone.predicted_us)
    assert searched.checks and all(check.error <= check.tolerance for check in searched.checks)


def test_reassociation_picks_the_order_with_fewer_flops() -> None:
    graph = chain_left_first()
    _, searched, graphs = _searched(graph)
    assert _matmul_flops(graphs[searched.form]) * 32 < _matmul_flops(graph)


def _reads(node: ts.ir.node.Node, name: str) -> bool:
    return any(n.op == Op.INPUT and n.arg == name for n in ts.ir.node.toposort([node]))


def test_the_row_scale_is_applied_after_the_matmul() -> None:
    """The winner's matmul reads x and w alone in its product (plain operands, copied by TMA), and s only in its
    epilogue, after the sum."""
    _, searched, _ = _searched(row_scaled_linear())
    matmul = next(k for k in searched.program.kernels if k.archetype == "matmul")
    product = next(node for node in matmul.body if node.op == Op.SUM)
    assert not _reads(product, "s") and _reads(product, "x")
    assert any(_reads(out, "s") for _, out in matmul.outputs)


def test_mcts_over_form_choices_finds_a_program_beam_over_boundaries_alone_does_not() -> None:
    """Beam over the written graph's kernel boundaries and schedules, against MCTS whose first move chooses the form
    (the written one or the one with the scale moved) and its boundaries: MCTS's best is of the other form, and no
    candidate the beam found over the written form is as fast."""
    graph = row_scaled_linear()
    forms = extract_forms(rewrites.saturate(graph))
    moved = next(form for form in forms[1:] if canonical_hash(form.graph) != canonical_hash(graph))
    target = get_target("sm90")
    spaces = [CandidateSpace(graph, target), CandidateSpace(moved.graph, target, form=1)]
    found = beam(spaces[0], BeamConfig())
    best_by_beam = min(seconds for seconds, _ in found)
    roots = [(0, spaces[0].greedy()), (0, spaces[0].operands_materialised()), (1, spaces[1].greedy())]
    evaluated = mcts(spaces, roots, lambda c: spaces[c.form].seconds(c), MCTSConfig(iterations=32),
                     time.monotonic() + BUDGET_S)
    seconds, candidate = min(((s, c) for c, s in evaluated.items() if s is not None), key=lambda item: item[0])
    assert candidate.form == 1 and seconds < best_by_beam


def test_the_forms_are_distinct_and_the_graph_as_written_comes_first() -> None:
    graph = chain_left_first()
    forms = extract_forms(rewrites.saturate(graph))
    hashes = [canonical_hash(form.graph) for form in forms]
    assert len(set(hashes)) == len(forms) >= 2 and hashes[0] == canonical_hash(graph) and forms[0].change == ""
    assert forms[1].seconds == min(form.seconds for form in forms)     # then the cheapest by its arithmetic
    assert forms[1].change == "((a @ b) @ c) -> (a @ (b @ c))"


def test_a_compile_searches_the_forms_and_says_which_won_and_without_rewrites_only_the_graph_as_written() -> None:
    graph = chain_left_first()
    program = ts.compile(graph, budget_s=BUDGET_S, profile=False, cache=False, progress=False)
    forms = program.report["forms"]
    won = next(form for form in forms if form["won"])
    assert not won["as_written"] and forms[0]["as_written"] and not forms[0]["won"]
    products = [node for kernel in program.kernel_program.kernels for node in kernel.body
                if node.op == Op.SUM and node.srcs[0].op == Op.MUL]
    assert sum(2 * math.prod(node.srcs[0].shape) for node in products) * 32 < _matmul_flops(graph)
    plain = ts.compile(graph, budget_s=BUDGET_S, profile=False, cache=False, progress=False, rewrites=False)
    assert [(form["as_written"], form["won"]) for form in plain.report["forms"]] == [(True, True)]
    assert plain.report["predicted_ms"] > program.report["predicted_ms"] * 1.5


def test_every_forms_best_is_measured_even_when_measuring_takes_the_budget() -> None:
    """A measured candidate outranks every unmeasured one, so each form's best by the model is measured, however
    slow measuring is: the first form's measurement once took the search past its deadline on the H200, and the
    second form, predicted twice as fast, lost unmeasured. The measure here is the cost model, after a sleep that
    outlasts the budget."""
    from tensorsmith.search.cost import program_seconds

    graph = shared_operand()
    forms = [form.graph for form in extract_forms(rewrites.saturate(graph))]
    budget_s = 6.0     # at 3 s, on two busy cores the verification reserve left the second form no time (2026-12-04)

    def slow_measure(program: ts.KernelProgram) -> float:
        time.sleep(budget_s)
        return program_seconds(program, get_target("sm90"))

    result = search_program(forms[0], budget_s=budget_s, reference=graph, forms=forms[1:], measure=slow_measure)
    assert len(result.form_best) == len(forms) >= 2
    assert all(best["measured_us"] is not None for best in result.form_best), result.form_best
    assert result.form != 0 and result.measured_us is not None


@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_a_long_reduction_is_taken_as_the_reduction_of_its_chunks(reduction: str) -> None:
    """x.sum() or x.max() over four million elements is one row: one block's work, the GPU idle. sum_split and
    max_split write it over 2048 chunks, a row kernel of 2048 rows and one of a single row of 2048, predicted
    over 20 times faster; the compile takes that form, says which rule made it, and computes the value."""
    g = Graph(f"long_{reduction}")
    g.output("r", getattr(g.input("x", (1 << 22,), "float32"), reduction)(-1))
    program = ts.compile(g, budget_s=BUDGET_S, cache=False, progress=False)
    written, winner = program.report["forms"][0], next(form for form in program.report["forms"] if form["won"])
    assert not written["won"] and list(winner["derivation"]["rules"]) == [f"{reduction}_split"]
    assert winner["predicted_us"] * 20 < written["predicted_us"]
    assert [kernel.grid[0] for kernel in program.kernels] == [2048, 1]
    inputs = {"x": np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)}
    want = getattr(inputs["x"].astype(np.float64), reduction)()
    assert abs(program(device="cpu", **inputs)["r"] - want) < 1e-2


def _scaled_weights_mlp() -> Graph:
    g = Graph("scaled_weights")
    x = g.input("x", (64, 256), "float16")
    gate, up, down = (g.input(name, shape, "float16") for name, shape in
                      (("gate", (384, 256)), ("up", (256, 384)), ("down", (256, 384))))
    hidden = ts.nn.silu(ts.nn.linear(x, gate * 0.5)) * (x @ (up * 0.25))
    g.output("y", ts.nn.linear(hidden, down * 2.0))
    return g


def _scales_in_products(graph: Graph) -> int:
    """How many matrix products of `graph` multiply a weight scaled first (an operand that is, through views, an
    input weight times a constant)."""
    def scaled(operand: ts.ir.node.Node) -> bool:
        while operand.op in VIEWS:
            operand = operand.srcs[0]
        return operand.op == Op.MUL and {src.op for src in operand.srcs} <= {Op.INPUT, Op.CONSTANT, *VIEWS}
    products = [match for node in graph.nodes() if (match := match_matmul(node)) is not None]
    return sum(scaled(match.lhs) or scaled(match.rhs) for match in products)


def test_a_constant_scale_on_each_weight_leaves_the_products_in_the_cheapest_form() -> None:
    """A gated MLP whose weights are scaled in the graph (one plain, two read transposed as linear layers read them):
    as written each scale is a pass over a whole weight inside its product's operand; the cheapest form the e-graph
    gives multiplies the unscaled weights and scales after the sums, and a compile of it matches the interpreter."""
    graph = _scaled_weights_mlp()
    forms = extract_forms(rewrites.saturate(graph))
    cheapest = min(forms, key=lambda form: form.seconds)
    assert _scales_in_products(forms[0].graph) == 3 and _scales_in_products(cheapest.graph) == 0
    assert cheapest.seconds < forms[0].seconds
    program = ts.compile(graph, budget_s=BUDGET_S, profile=False, cache=False)
    inputs = ts.search.verify.random_inputs(graph, seed=2)
    for check in ts.search.verify.compare(graph, program(device="cpu", **inputs), ts.evaluate(graph, inputs)):
        assert check.ok, check
