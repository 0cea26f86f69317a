"""The e-graph's global names cannot collide in egglog's fresh names (the cause of the rare "Illegal merge attempted
for function shape_of" and of the ill-formed terms that extraction refused), and a conflict leaves an e-graph that
extracts to the graph.

egglog 13 names the query variable of a global as the global's name followed by a per-name counter (include zero),
so the 31st use of `$g1` and the first of `$g13` are both `$g130`, and one command that uses both reads one global for
the other (egraphs-good/egglog#1006). egglog-python let-binds every literal that a term repeats as `$__expr_<k>`
with k counting from 0, and rules that mention the literal (the axis indices of permute_permute's gather, the
analysis's permute shapes) then use those globals: a composed permutation came out as (0, 2, 0), a keepdim shape
as (32, 32, 2048, 1). `to_egglog` gives every global a name of one width, which no counter can extend into another.
"""
from __future__ import annotations

import re
from itertools import permutations

import numpy as np
import pytest
from egglog import String, Vec, bindings, i64, rewrite, var

import tensorsmith as ts
from tensorsmith.ir.interpreter import evaluate
from tensorsmith.rewrites import RULES, saturate
from tensorsmith.rewrites.eclasses import read_eclasses
from tensorsmith.rewrites.rule import Rule
from tensorsmith.rewrites.term import Exp2, Input, Reshape, TExpr, to_egglog, vec
from tensorsmith.search import extract

from test_saturation import ROOT, inputs_for, load


def _vec_global(program: str, name: str) -> tuple[int, ...]:
    egraph = bindings.EGraph()
    egraph.run_program(*egraph.parse_program(program))
    row = egraph.freeze().functions[name].rows[0]
    return tuple(egraph.value_to_i64(v) for v in egraph.value_to_vec(row.output))


def _vec_of_two_globals(first: str, second: str, uses_before: int) -> tuple[int, ...]:
    """(vec-of first second) after `first` has been used `uses_before` times: (1, 32) unless the names collide."""
    program = (f"(sort V (Vec i64))\n(let {first} 1)\n(let {second} 32)\n"
               + "".join(f"(let $use{k}x (vec-of {first}))\n" for k in range(uses_before))
               + f"(let $probe (vec-of {first} {second}))\n")
    return _vec_global(program, "$probe")


@pytest.mark.parametrize("uses_before", [0, 3, 30, 31])
def test_globals_of_one_width_read_back_right_however_often_used(uses_before: int) -> None:
    # the names to_egglog makes egglog-python use: one width, so no name + counter is another name
    assert _vec_of_two_globals("$__expr_1000000001", "$__expr_1000000013", uses_before) == (1, 32)


def _global_names(graph: ts.Graph) -> list[str]:
    egraph, _ = to_egglog(graph)
    return [name for name in egraph._egraph.freeze().functions if name.startswith("$")]


def test_no_global_name_is_another_followed_by_digits() -> None:
    # deterministic: every graph with more than ten shared literals had `$__expr_1` and `$__expr_10`...
    example = load(ROOT / "examples" / "transformer_block.py", "transformer_block_names")
    graph = example.build()  # type: ignore[attr-defined]
    names = _global_names(graph)
    assert len(names) > 20, "the graph should need many globals for this test to mean anything"
    extended = [(a, b) for a in names for b in names if a != b and re.fullmatch(re.escape(a) + r"\d+", b)]
    assert not extended, f"globals whose names egglog's fresh names can confuse: {extended[:5]}"


def test_composed_permutations_stay_permutations() -> None:
    # permute_permute gathers with literal indices 0..rank-1: the rule that produced (0, 2, 0)
    g = ts.Graph("permutes")
    outputs = []
    for rank in (2, 3, 4):
        x = g.input(f"x{rank}", tuple(range(2, 2 + rank)), "float32")
        perms = [p for p in permutations(range(rank)) if p != tuple(range(rank))]
        outputs += [x.permute(*p).permute(*q).exp2() for p in perms[:3] for q in perms[-3:]]
    for k, out in enumerate(outputs):
        g.output(f"y{k}", out)
    saturated = saturate(g)
    assert saturated.report.stopped != "conflict"
    classes = read_eclasses(saturated.egraph, saturated.roots)
    for c, enodes in classes.nodes.items():
        for enode in enodes:
            if enode.op == "Permute":
                (child,), (axes,) = enode.children, enode.lits
                assert sorted(axes) == list(range(len(classes.shapes[child]))), f"e-class {c}: {enode}"
    data = inputs_for(g)
    got, want = evaluate(extract(saturated), data), evaluate(g, data)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


def test_a_conflict_found_after_an_ill_formed_term_still_extracts_the_graph() -> None:
    # an unsound rule plants an ill-formed term whose shape agrees with its class (no conflict yet), and a second
    # one, a stage later, merges terms of different shapes: the call that conflicts is rolled back, but the planted
    # term is older and the cheapest, so extraction used to raise ExtractionError
    x, shape = var("x", TExpr), var("shape", Vec[i64])
    name, dtype, s = var("name", String), var("dtype", String), var("s", Vec[i64])
    plant = Rule("plant", "exp2(reshape(x, s)) -> reshape(b, s), b of 5 elements (wrong on purpose)",
                 rewrite(Exp2(Reshape(x, shape))).to(Reshape(Input("b", vec((5,)), "float32"), shape)), (),
                 lambda: None)
    merge = Rule("merge", "reshape(input, s) -> input, whatever the shapes (wrong on purpose)",
                 rewrite(Reshape(Input(name, s, dtype), shape)).to(Input(name, s, dtype)), (), lambda: None,
                 stage="patterns")
    g = ts.Graph("planted")
    a, _ = g.input("a", (2, 6), "float32"), g.input("b", (5,), "float32")
    g.output("y", a.reshape(3, 4).exp2())
    saturated = saturate(g, rules=(*RULES, plant, merge))
    assert saturated.report.stopped == "conflict"
    assert dict(saturated.report.stage_stops)["patterns"] == "conflict"
    data = inputs_for(g)
    np.testing.assert_allclose(evaluate(extract(saturated), data)["y"], evaluate(g, data)["y"])
