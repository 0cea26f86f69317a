"""The abstract-expression check keeps views and axes: it refutes programs and forms that really differ, and never
refutes equal ones (they come out True, or None where a law it does not know is needed)."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import pytest

import tensorsmith as ts
from tensorsmith.ir import primitives as P
from tensorsmith.ir.ops import Op
from tensorsmith.ir.targets import get_target
from tensorsmith import search
from tensorsmith.search import engine
from tensorsmith.search.partition import partition, unfused
from tensorsmith.search.abstract import MAX_TERMS
from tensorsmith.search.prune import AbstractChecker
from tensorsmith.search.space import CandidateSpace
from tensorsmith.search.verify import VerificationError

SM90 = get_target("sm90")
SQUARE = {"x": (4, 4), "y": (4, 4)}
MATMUL = {"x": (4, 6), "w": (6, 5), "s": (4, 1)}


def graph_of(body: Callable[..., ts.Tensor], shapes: dict[str, tuple[int, ...]], name: str = "g") -> ts.Graph:
    g = ts.Graph(name)
    g.output("out", body(*(g.input(n, shape, "float32") for n, shape in shapes.items())))
    return g


def verdict(first: Callable, second: Callable, shapes: dict[str, tuple[int, ...]]) -> bool | None:
    checker = AbstractChecker()
    return checker.equivalent(checker.graph_terms(graph_of(first, shapes)),
                              checker.graph_terms(graph_of(second, shapes)))


DIFFERENT = {
    "transposed operand": (lambda x, y: x.transpose(0, 1) + y, lambda x, y: x + y),
    "sum over the other axis": (lambda x, y: x.sum(0), lambda x, y: x.sum(1)),
    "max over the other axis": (lambda x, y: x.max(0) + y.sum(0), lambda x, y: x.max(1) + y.sum(0)),
    "slice off by one": (lambda x, y: x[0:3], lambda x, y: x[1:4]),
    "expand of a column, not a row": (lambda x, y: x[:, 0:1].expand(4, 4) + y, lambda x, y: x[0:1, :].expand(4, 4) + y),
    "reshape of the transpose": (lambda x, y: x.transpose(0, 1).reshape(2, 8), lambda x, y: x.reshape(2, 8)),
    "pad on the other side": (lambda x, y: x.pad(((1, 0), (0, 0))), lambda x, y: x.pad(((0, 1), (0, 0)))),
    "a dropped term": (lambda x, y: (x * y).sum(1) + x.sum(1), lambda x, y: (x * y).sum(1)),
}


@pytest.mark.parametrize("case", sorted(DIFFERENT))
def test_programs_that_differ_in_views_and_axes_are_refuted(case: str) -> None:
    first, second = DIFFERENT[case]
    assert verdict(first, second, SQUARE) is False


EQUAL = {
    "permute pushed through an add": (lambda x, y: (x + y).transpose(0, 1),
                                      lambda x, y: x.transpose(0, 1) + y.transpose(0, 1)),
    "composed reshapes": (lambda x, y: x.reshape(8, 2).reshape(16).reshape(2, 8), lambda x, y: x.reshape(2, 8)),
    "a sum of a sum": (lambda x, y: (x + y).sum(1), lambda x, y: x.sum(1) + y.sum(1)),
    "a sum of a broadcast": (lambda x, y: x[:, 0:1].expand(4, 4).sum(1), lambda x, y: x[:, 0] * 4),
    "sum over the axis of a permute": (lambda x, y: x.transpose(0, 1).sum(0), lambda x, y: x.sum(1)),
    "slices of a slice": (lambda x, y: x[1:4][0:2, 1:3], lambda x, y: x[1:3, 1:3]),
}


@pytest.mark.parametrize("case", sorted(EQUAL))
def test_equal_programs_are_the_same_term(case: str) -> None:
    first, second = EQUAL[case]
    assert verdict(first, second, SQUARE) is True


def test_a_matmul_and_the_transpose_of_its_operands_roles_are_equal() -> None:
    shapes = {"a": (4, 6), "b": (6, 5)}
    assert verdict(lambda a, b: a @ b, lambda a, b: (b.transpose(0, 1) @ a.transpose(0, 1)).transpose(0, 1),
                   shapes) is True


def test_a_row_scale_leaves_the_matmul() -> None:
    """The e-graph's rmsnorm_matmul rule: (x * s) @ W = s * (x @ W) for s constant along the contracted axis."""
    assert verdict(lambda x, w, s: s * (x @ w), lambda x, w, s: (x * s) @ w, MATMUL) is True
    assert verdict(lambda x, w, s: s * (x @ w), lambda x, w, s: (x * s.reshape(1, 4)[:, 0:1]) @ w, MATMUL) is False


def test_the_order_of_nested_sums_is_canonical() -> None:
    """The sum_sum rule (two sums swapped, on a rectangle and three deep), a weighted double sum whose inner sums take
    out different factors, and a reassociated matmul chain (matmul_assoc) are one term."""
    rectangle, cube = {"x": (3, 5), "y": (5,)}, {"x": (2, 3, 4), "y": (4,)}
    chain = {"a": (3, 4), "b": (4, 5), "c": (5, 2)}
    assert verdict(lambda x, y: x.sum(1).sum(0), lambda x, y: x.sum(0).sum(0), rectangle) is True
    assert verdict(lambda x, y: x.max(1).max(0), lambda x, y: x.max(0).max(0), rectangle) is True
    assert verdict(lambda x, y: x.permute(2, 0, 1).sum(1).sum(0).sum(0), lambda x, y: x.sum(1).sum(0).sum(0),
                   cube) is True
    assert verdict(lambda x, y: (x * y).sum(1).sum(0), lambda x, y: (x * y).sum(0).sum(0), rectangle) is True
    assert verdict(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c), chain) is True
    assert verdict(lambda a, b, c: (a @ b) @ c, lambda a, b, c: a @ (b @ c) + a[:, 0:2], chain) is False


def test_laws_the_abstraction_does_not_know_leave_a_form_undecided() -> None:
    """exp2(a) * exp2(b) = exp2(a + b); two sums swapped over a body whose own max binds a name of the chain:
    right rewrites the terms do not show equal are never refuted."""
    checker = AbstractChecker(timeout_ms=500)
    pairs = [(lambda x, y: x.exp2() * y.exp2(), lambda x, y: (x + y).exp2()),
             (lambda x, y: (x - x.max(1, keepdim=True)).exp2().sum(1).sum(0),
              lambda x, y: (x - x.max(1, keepdim=True)).exp2().sum(0).sum(0))]
    for first, second in pairs:
        assert checker.form_equivalent(graph_of(first, SQUARE), graph_of(second, SQUARE)) is None


def test_a_form_with_an_operand_transposed_is_refuted_by_the_index_blind_and_exact_checks() -> None:
    checker = AbstractChecker()
    written = graph_of(lambda x, y: x.transpose(0, 1) @ y + x, SQUARE)
    assert checker.form_equivalent(written, graph_of(lambda x, y: x @ y + x, SQUARE)) is False
    assert checker.form_equivalent(written, graph_of(lambda x, y: x.transpose(0, 1) @ y + x, SQUARE)) is True


def test_every_partition_of_a_form_is_its_graphs_term() -> None:
    checker = AbstractChecker()
    g = graph_of(lambda x, w, s: ts.nn.softmax((x * s) @ w, axis=-1).transpose(0, 1), MATMUL)
    reference = checker.graph_terms(g)
    for program in (partition(g), unfused(g)):
        assert checker.program_terms(program) == reference


def test_search_prunes_a_wrong_form_and_keeps_a_right_one() -> None:
    shapes = {"x": (4, 4), "w": (4, 4), "s": (4, 1)}
    written = graph_of(lambda x, w, s: s * (x @ w), shapes, "scaled")
    wrong = graph_of(lambda x, w, s: s * (x.transpose(0, 1) @ w), shapes, "scaled")   # an operand transposed
    result = engine.search_program(written, SM90, budget_s=10, seed=0, forms=[wrong])
    assert result.stats.pruned_expression_z3 == 1 and result.form == 0
    assert not any(entry["description"].startswith("form 1") for entry in result.history)
    right = graph_of(lambda x, w, s: (x * s) @ w, shapes, "scaled")                   # rmsnorm_matmul's rewrite
    result = engine.search_program(written, SM90, budget_s=10, seed=0, forms=[right])
    assert result.stats.pruned_expression_z3 == 0 and result.stats.expression_undecided == 0
    assert any(entry["description"].startswith("form 1") for entry in result.history)
    with pytest.raises(VerificationError, match="every form"):   # the compiler then compiles the graph as written
        engine.search_program(wrong, SM90, budget_s=10, seed=0, reference=written)


def test_a_temporary_written_in_the_wrong_layout_is_pruned() -> None:
    """A kernel that writes its matmul's result transposed into a square buffer that the next kernel reads as is."""
    g = graph_of(lambda x, y: (x @ y).exp2() + x, SQUARE)
    program = unfused(g)
    position, (name, node) = next((p, k.outputs[0]) for p, k in enumerate(program.kernels)
                                  if k.outputs[0][1].op == Op.SUM and program.buffers[k.outputs[0][0]].role == "temp")
    wrong = dataclasses.replace(program.kernels[position], outputs=((name, P.contiguous(P.permute(node, (1, 0)))),))
    kernels = [*program.kernels[:position], wrong, *program.kernels[position + 1:]]
    space = CandidateSpace(g, SM90)
    assert space.check_program(dataclasses.replace(program, kernels=kernels)) is False
    assert space.check_program(program) is True and space.stats.pruned_expression_z3 == 1


def test_a_compile_prunes_a_form_from_an_unsound_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extraction planted with a form an unsound rule would make (the matmul's operand transposed), cheapest of all:
    the compile prunes it and compiles a right program from the other forms."""
    shapes = {"x": (64, 64), "s": (64, 1), "w": (64, 64)}
    written = graph_of(lambda x, s, w: (x * s) @ w, shapes, "scaled")
    planted = graph_of(lambda x, s, w: (x.transpose(0, 1) * s) @ w, shapes, "scaled")
    real = search.extract_forms
    monkeypatch.setattr(search, "extract_forms", lambda saturated, target, **options: [
        *real(saturated, target, **options), search.Form(planted, 0.0, "unsound")])
    program = ts.compile(written, "sm90", budget_s=10, cache=False, progress=False, profile=False)
    assert program.report["search"]["pruned_expression_z3"] == 1
    assert program.report["forms"][-1]["change"] == "unsound" and not program.report["forms"][-1]["won"]
    assert program.report["forms"][-1]["predicted_us"] is None     # its space yielded no candidates


def test_a_check_past_its_term_or_time_bound_is_left_undecided_not_refuted() -> None:
    """A Hugging Face model's nested reductions took Z3 minutes to build as lambdas: a check too large to build is
    abandoned (None: left to random testing), in a space too, where it neither prunes nor stops the search."""
    written = graph_of(lambda x, y: x.transpose(0, 1) @ y + x, SQUARE)
    wrong = graph_of(lambda x, y: x @ y + x, SQUARE)
    assert AbstractChecker().form_equivalent(written, wrong) is False
    few_terms = AbstractChecker(max_terms=3)
    assert few_terms.graph_terms(written) is None and few_terms.form_equivalent(written, wrong) is None
    assert few_terms.equivalent(None, AbstractChecker().graph_terms(written)) is None
    no_time = AbstractChecker(timeout_ms=0)      # the terms are made, the Z3 expressions are not
    assert no_time.graph_terms(written) is not None and no_time.form_equivalent(written, wrong) is None
    space = CandidateSpace(written, SM90, AbstractChecker(max_terms=3))
    assert space.check_program(unfused(written)) is True and space.check_form(written) is True
    assert space.stats.expression_undecided == 1 and space.stats.pruned_expression_z3 == 0
    assert CandidateSpace(wrong, SM90, AbstractChecker(max_terms=3)).check_form(written) is True   # undecided


def _stacked_blocks(layers: int) -> ts.Graph:
    """Attention and an MLP (8 x 8) per layer, with residuals: nested matmul chains over everything before them."""
    g = ts.Graph("stacked")
    x = g.input("x", (8, 8), "float32")
    for layer in range(layers):
        def w(name: str) -> ts.Tensor:
            return g.input(f"{name}{layer}", (8, 8), "float32")
        h = ts.nn.rms_norm(x, g.input(f"norm{layer}", (8,), "float32"))
        scores = ts.nn.softmax((h @ w("q")) @ (h @ w("k")).transpose(0, 1), axis=-1)
        x = x + (scores @ (h @ w("v"))) @ w("o")
        x = x + (x @ w("up")) @ w("down")
    g.output("out", x)
    return g


def test_the_terms_of_deep_nested_reductions_are_built_once_per_renaming() -> None:
    """Renaming a chain's variables rebuilds the reductions inside it; memoised, four stacked blocks (63,389 terms)
    build in about 2 s, where without the memo they took 110 s. Past the default bound the check is not made."""
    checker = AbstractChecker(max_terms=200_000)
    checker.build_s = 30.0   # the memo is what is tested, not the 2 s a check may build for (1.2 s idle, over 2 s
    start = time.monotonic()  # beside CI's other worker on two cores)
    assert checker.graph_terms(_stacked_blocks(4)) is not None
    assert time.monotonic() - start < 30
    assert len(checker.terms.nodes) > MAX_TERMS and AbstractChecker().graph_terms(_stacked_blocks(4)) is None
