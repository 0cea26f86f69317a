"""A model's many identical layers (issue 41): each kernel structure scheduled once, no value computed in every layer
again, partitions remade only where they change, and term building bounded in time."""
from __future__ import annotations

import sys

import pytest
from graph_cases import residual_layers as layers

from tensorsmith.ir.kernel_program import kernel_structure
from tensorsmith.ir.targets import get_target
from tensorsmith.search.partition import build_program, legalise, materialisable, recomputed
from tensorsmith.search.prune import AbstractChecker
from tensorsmith.search.space import CandidateSpace

SM90 = get_target("sm90")
partition_module = sys.modules["tensorsmith.search.partition"]   # the package exports a function of that name


def test_each_kernel_structure_is_scheduled_once_however_many_layers() -> None:
    """The kernels of identical layers are one structure under other buffer names, scheduled (costed, rendered) once:
    with the residual stream computed once, 8 layers schedule as many kernel structures as 4, two."""
    scheduled = []
    for depth in (4, 8):
        space = CandidateSpace(layers(depth), SM90)
        start = space.computed_once()
        space.best_rank(start)
        kernels = space.program(start).kernels
        assert space.stats.kernels_scheduled == len({kernel_structure(kernel) for kernel in kernels})
        scheduled.append(space.stats.kernels_scheduled)
    assert scheduled == [2, 2] and len(kernels) == 16


def test_a_residual_stream_is_computed_once_with_the_add_in_the_matmuls_epilogue() -> None:
    """Fused as far as codegen allows, each layer's kernels would add up every earlier layer's outputs again (reads
    growing with depth); `computed_once` gives each residual value one buffer, written by its matmul's epilogue."""
    space = CandidateSpace(layers(6), SM90)
    fused = space.program(space.operands_materialised())
    assert max(len(kernel.reads) for kernel in fused.kernels) >= 6        # the last norm re-adds every layer
    once = space.program(space.computed_once())
    assert max(len(kernel.reads) for kernel in once.kernels) <= 3
    assert [k.archetype for k in once.kernels] == ["row_reduce", "matmul"] * 6
    assert len({kernel_structure(kernel) for kernel in once.kernels}) == 2   # every layer the same two kernels
    assert not recomputed(space.graph, {id(space.nodes[p]) for p in space.computed_once()})
    big = CandidateSpace(layers(16, 512, 2048), SM90)
    assert big.best_rank(big.computed_once()) < 0.9 * big.best_rank(big.operands_materialised())


def test_legalisation_remakes_only_the_kernels_whose_cones_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour one node away rebuilds its program from the bodies kept by root: only kernels whose cone holds
    the moved node are made again."""
    graph = layers(8)
    made = []
    real = partition_module._kernel_body
    monkeypatch.setattr(partition_module, "_kernel_body", lambda root, buffers: made.append(root) or real(root, buffers))
    bodies: partition_module.Bodies = {}
    program, materialised = legalise(graph, set(), bodies)
    first = len(made)
    made.clear()
    free = [node for node in materialisable(graph) if id(node) not in materialised]
    middle = free[len(free) // 2]               # a node of a middle layer
    finer, grown = legalise(graph, materialised | {id(middle)}, bodies)
    assert len(finer.kernels) > len(program.kernels)
    assert 1 <= len(made) <= 4 < len(program.kernels) <= first
    fresh, _ = build_program(graph, grown)
    assert [(k.name, k.outputs[0][1].op) for k in fresh.kernels] == [(k.name, k.outputs[0][1].op)
                                                                      for k in finer.kernels]


def test_building_a_graphs_terms_is_bounded_in_time_and_done_once() -> None:
    """The abstract check's terms of a 4-layer Llama took 5 s each, several times a search: past its share of the
    budget (`build_s`) a check is left undecided, and a graph's terms are built once."""
    assert AbstractChecker(budget_s=10).build_s == 0.25 and AbstractChecker(budget_s=60).build_s == 1.2
    graph = layers(8)
    checker = AbstractChecker()
    first = checker.graph_terms(graph)
    assert first is not None and checker.graph_terms(graph) is first
    hurried = AbstractChecker()
    hurried.build_s = 0.0
    assert hurried.graph_terms(graph) is None and hurried.graph_terms(layers(1)) is None
