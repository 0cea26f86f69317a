"""Z3 pruning: infeasible schedules never reach codegen, and wrong programs are caught by Z3 or random tests."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from graph_cases import CASES

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.render import render_kernel
from tensorsmith.codegen.spaces import ARCHETYPES, is_valid
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import Op
from tensorsmith.ir.targets import get_target
from tensorsmith.search import engine, space as space_module
from tensorsmith.search.partition import build_program, partition, unfused
from tensorsmith.search.prune import AbstractChecker, feasible_schedules, kernel_facts
from tensorsmith.search.space import CandidateSpace
from tensorsmith.search import verify as verify_module
from tensorsmith.search.verify import VerificationError, large_draw, verify_program

SM90 = get_target("sm90")


def facts_of(graph: ts.Graph, position: int = 0):
    program = partition(graph)
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    return kernel_facts(program.kernels[position], shapes)


def verdict(facts, **params: int) -> str | None:
    wanted = Schedule.of(**params)
    return next(v.violated for v in feasible_schedules(facts, SM90) if v.schedule == wanted)


def softmax_graph(cols: int) -> ts.Graph:
    g = ts.Graph("softmax")
    x = g.input("x", (64, cols), "float16")
    g.output("y", nn.softmax(x, axis=-1))
    return g


def test_schedule_constraints_name_what_they_prune() -> None:
    wide = facts_of(softmax_graph(4096))
    assert verdict(wide, row_threads=256, block=256, vec=8) is None
    assert verdict(wide, row_threads=64, block=32, vec=1) == "row threads divide the block"
    assert verdict(wide, row_threads=32, block=1024, vec=8) == "registers per block"
    odd = facts_of(softmax_graph(1002))               # 1002 = 2 x 501: vec 2 fits, vec 4 does not
    assert verdict(odd, row_threads=128, block=128, vec=2) is None
    assert verdict(odd, row_threads=128, block=128, vec=4) == "vec divides the row length"
    per_row = facts_of(CASES["full_sum"]())            # one value per row: codegen never caches the row
    assert verdict(per_row, row_threads=256, block=256, vec=2) == "vec > 1 only where codegen caches the row"


def test_deep_rings_fit_on_wgmmas_unpadded_tiles_only() -> None:
    """12 stages of 64x64 tiles: wgmma's unpadded tiles fit (193 KiB), mma.sync's padded ones do not (243 KiB)."""
    g = ts.Graph("mm")
    g.output("c", g.input("a", (128, 4096), "float16") @ g.input("b", (4096, 4096), "float16"))
    facts = facts_of(g)
    tile = dict(bm=64, bn=64, bk=64, stages=12, warps_m=1, warps_n=4, split_k=1)
    assert verdict(facts, **tile, wgmma=1) is None
    assert verdict(facts, **tile, wgmma=0) == "dynamic shared memory"
    assert verdict(facts, **{**tile, "bn": 256}, wgmma=1) == "dynamic shared memory"   # 385 KiB


@pytest.mark.parametrize("case", ["norms", "many_short_rows", "matmul", "integers"])
def test_every_schedule_z3_and_is_valid_accept_renders(case: str) -> None:
    program = partition(CASES[case]())
    shapes = {name: buf.shape for name, buf in program.buffers.items()}
    for position, kernel in enumerate(program.kernels):
        verdicts = feasible_schedules(kernel_facts(kernel, shapes), SM90)
        accepted = [v.schedule for v in verdicts if v.violated is None and is_valid(kernel.archetype, v.schedule)]
        assert accepted and len(verdicts) == ARCHETYPES[kernel.archetype].size
        for schedule in accepted:
            trial = dataclasses.replace(program, kernels=[*program.kernels[:position],
                                                          dataclasses.replace(kernel, schedule=schedule),
                                                          *program.kernels[position + 1:]])
            render_kernel(trial, position)


def affine_graph() -> ts.Graph:
    g = ts.Graph("affine")
    x = g.input("x", (16, 24), "float32")
    w = g.input("w", (24,), "float32")
    b = g.input("b", (24,), "float32")
    g.output("y", nn.softmax(x * w + b, axis=-1))
    return g


def rewrite_body(program: KernelProgram, change) -> KernelProgram:
    """A copy of `program` whose kernel bodies have `change(node, new_srcs)` applied to every node."""
    kernels = []
    for kernel in program.kernels:
        copies: dict[int, Node] = {}
        for node in toposort(node for _, node in kernel.outputs):
            srcs = tuple(copies[id(s)] for s in node.srcs)
            copies[id(node)] = change(node, srcs)
        kernels.append(Kernel(kernel.name, kernel.archetype,
                              tuple((name, copies[id(node)]) for name, node in kernel.outputs), kernel.schedule))
    return dataclasses.replace(program, kernels=kernels)


def drop_bias(node: Node, srcs: tuple[Node, ...]) -> Node:
    """x * w + b -> x * w: the planted bug, a dropped term."""
    if node.op == Op.ADD and srcs[0].op == Op.MUL and srcs[0].shape == node.shape and srcs[1].op != Op.MUL:
        return srcs[0]
    return dataclasses.replace(node, srcs=srcs)


def keep(node: Node, srcs: tuple[Node, ...]) -> Node:
    return dataclasses.replace(node, srcs=srcs)


def test_abstract_expressions_accept_every_partition_of_the_graph() -> None:
    checker = AbstractChecker()
    for case in ("norms", "attention", "rope", "integers"):
        g = CASES[case]()
        reference = checker.graph_terms(g)
        for program in (partition(g), unfused(g)):
            assert checker.equivalent(reference, checker.program_terms(program)) is True


def test_a_dropped_term_is_pruned_by_z3_and_rejected_by_random_tests() -> None:
    g = affine_graph()
    wrong = rewrite_body(partition(g), drop_bias)
    assert wrong.kernels[0].ops_summary() != partition(g).kernels[0].ops_summary()
    space = CandidateSpace(g, SM90)
    assert space.check_program(wrong) is False and space.stats.pruned_expression_z3 == 1
    assert space.check_program(rewrite_body(partition(g), keep)) is True
    with pytest.raises(VerificationError, match="affine"):
        verify_program(g, wrong, seed=0)


def test_a_bug_in_index_detail_is_pruned_by_z3_and_rejected_by_random_tests() -> None:
    g = ts.Graph("transpose")
    x = g.input("x", (8, 8), "float32")
    g.output("y", x.transpose(0, 1) * 2)
    # drop the transpose: the abstract expression keeps views, so Z3 sees x[j, i] * 2 against x[i, j] * 2
    wrong = rewrite_body(partition(g), lambda n, s: s[0] if n.op == Op.PERMUTE else dataclasses.replace(n, srcs=s))
    space = CandidateSpace(g, SM90)
    assert space.check_program(wrong) is False and space.stats.pruned_expression_z3 == 1
    assert space.check_program(partition(g)) is True
    with pytest.raises(VerificationError):
        verify_program(g, wrong, seed=0)


def test_search_never_returns_a_planted_wrong_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    g = affine_graph()
    real = space_module.legalise

    def planted(graph, materialised, bodies=None):   # every partition that fuses the bias into the softmax drops it
        program, grown = real(graph, materialised, bodies)
        return rewrite_body(program, drop_bias), grown

    monkeypatch.setattr(space_module, "legalise", planted)
    result = engine.search_program(g, SM90, budget_s=20, seed=0)
    assert result.stats.pruned_expression_z3 >= 1
    verify_program(g, result.program, seed=5)
    assert len(result.program.kernels) > len(partition(g).kernels)    # not the (planted) fused partition


def test_without_z3_random_testing_still_rejects_the_planted_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    g = affine_graph()
    real = space_module.legalise
    monkeypatch.setattr(space_module, "legalise",
                        lambda graph, materialised, bodies=None: (
                            rewrite_body(real(graph, materialised)[0], drop_bias), real(graph, materialised)[1]))
    monkeypatch.setattr(AbstractChecker, "equivalent", lambda self, reference, candidate: None)   # Z3 undecided
    result = engine.search_program(g, SM90, budget_s=20, seed=0)
    assert result.stats.pruned_expression_z3 == 0 and result.stats.failed_verification >= 1
    assert any(entry["verdict"] == "failed verification" for entry in result.history)
    verify_program(g, result.program, seed=5)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_draw_of_large_magnitudes_catches_an_unstable_softmax() -> None:
    g = ts.Graph("softmax")
    x = g.input("x", (2, 50), "float16")
    g.output("y", nn.softmax(x, axis=-1))
    draw = large_draw(g, seed=3)
    assert draw is not None and np.abs(draw[0]["x"].astype(np.float32)).max() > 60
    assert np.allclose(draw[1]["y"], ts.evaluate(g, draw[0])["y"])   # its reference outputs are the graph's
    # the textbook softmax without the max, its exponentials kept in a float16 buffer: exact on small
    # inputs, inf / inf = nan once exp(x) passes 65504
    naive = ts.Graph("softmax")
    x = naive.input("x", (2, 50), "float16")
    e = x.exp()
    naive.output("y", e / e.sum(-1, keepdim=True))
    unstable = build_program(naive, {id(e.node)})[0]
    assert [b.dtype for b in unstable.buffers.values() if b.role == "temp"] == [ts.DType.FLOAT16]
    verify_program(g, unstable, seed=0)                          # the ordinary draws pass
    with pytest.raises(VerificationError):
        verify_program(g, unstable, seed=0, large=True)          # the large draw does not
    assert CandidateSpace(g, SM90).check_program(unstable) is False   # and Z3 sees a different expression
    assert large_draw(CASES["pointwise_math"](), seed=0) is None    # a max of two is not softmax-like


def test_remembered_draws_evaluate_the_reference_once_and_still_catch_a_wrong_program(
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = affine_graph()
    evaluations = []
    real_evaluate = verify_module.evaluate
    monkeypatch.setattr(verify_module, "evaluate", lambda *a: evaluations.append(1) or real_evaluate(*a))
    memo: dict = {}
    verify_program(g, partition(g), seed=0, memo=memo)
    verify_program(g, unfused(g), seed=0, memo=memo)
    assert len(evaluations) == 2 and sorted(memo) == [0, 1]      # two draws, each evaluated once
    with pytest.raises(VerificationError, match="affine"):
        verify_program(g, rewrite_body(partition(g), drop_bias), seed=0, memo=memo)
    assert len(evaluations) == 2
