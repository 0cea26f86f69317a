"""Each kernel is rendered once per structure and schedule: met again under other buffer names (another kernel
partition, a measured candidate, the chosen program), it comes from the cache, its names filled in."""
from __future__ import annotations

import pytest
from graph_cases import decoder_block, residual_layers

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.emit import NotFusable
from tensorsmith.codegen.render import RENDERS, check_renders, render_kernel, render_program
from tensorsmith.ir.kernel_program import kernel_structure
from tensorsmith.ir.targets import get_target
from tensorsmith.search.beam import BeamConfig
from tensorsmith.search.engine import SearchConfig, search_program
from tensorsmith.search.mcts import MCTSConfig
from tensorsmith.search.partition import build_program, legalise, materialisable, partition
from tensorsmith.search.space import CandidateSpace


def norm_then_matmul(x: str, w: str) -> ts.Graph:
    g = ts.Graph("block")
    h = nn.rms_norm(g.input(x, (64, 256), "float16"), g.input("gain", (256,), "float16"))
    g.output("y", h @ g.input(w, (256, 128), "float16"))
    return g


def test_a_kernel_met_under_other_names_comes_from_the_cache_with_its_own_names() -> None:
    first, second = partition(norm_then_matmul("x", "w")), partition(norm_then_matmul("tokens", "weight"))
    render_program(first, "v1")
    rendered = dict(RENDERS)
    again = render_program(second, "v1")
    assert RENDERS == rendered   # nothing rendered anew
    sources = " ".join(kernel.source for kernel in again)
    assert "tokens" in sources and "weight" in sources and "TSREAD" not in sources and "TSKERNEL" not in sources
    assert {p for kernel in again for p in kernel.params} >= {"tokens", "weight"}


def test_a_kernel_keeps_its_name_and_source_in_every_partition() -> None:
    """So a kernel the search measures in one candidate is the same source in the next, and in the program it
    chooses: compiled once. A kernel is numbered by its node's place in the graph, not by its place in the program."""
    graph = decoder_block(64)
    program, materialised = legalise(graph, set())
    nodes = graph.nodes()
    first_kernel = min(nodes.index(node) for node in nodes if id(node) in materialised)
    extra = next(node for node in materialisable(graph)   # one more buffer, before every kernel but the first
                 if id(node) not in materialised and nodes.index(node) > first_kernel)
    finer, _ = legalise(graph, materialised | {id(extra)})
    assert len(finer.kernels) > len(program.kernels)
    before = {k.name: k.source for k in render_program(program, "v1")}
    new_buffer, = set(finer.buffers) - set(program.buffers)
    untouched = [position for position, kernel in enumerate(finer.kernels)
                 if new_buffer not in kernel.reads and new_buffer not in kernel.writes]
    assert len(untouched) >= len(finer.kernels) // 2
    for position in untouched:   # every kernel but the new one and its readers: the same name, the same source
        kernel = render_kernel(finer, position, "v1")
        assert before.get(kernel.name) == kernel.source, kernel.name


def test_a_refusal_is_cached_and_raised_with_the_kernels_own_node() -> None:
    def unfused() -> tuple:
        g = ts.Graph("softmax_then_matmul")
        p = nn.softmax(g.input("s", (64, 128), "float16"), axis=0)   # a column softmax, then rows through a matmul
        g.output("y", p @ g.input("v", (128, 64), "float16"))
        return build_program(g, set())[0]
    refusals = []
    for program in (unfused(), unfused()):
        with pytest.raises(NotFusable) as refusal:
            for position in range(len(program.kernels)):
                check_renders(program, position)
        refusals.append((refusal.value, program.kernels[position]))
    (first, kernel_one), (second, kernel_two) = refusals
    assert RENDERS[next(key for key in RENDERS if key[0] == kernel_structure(kernel_two, lines=True))] == 1
    assert str(first) == str(second)
    assert any(node is second.node for node in kernel_two.body) and not any(node is first.node
                                                                             for node in kernel_two.body)


def test_a_search_renders_each_structure_and_schedule_once_and_its_winner_from_the_cache() -> None:
    RENDERS.clear()
    config = SearchConfig(BeamConfig(width=3, rounds=2), MCTSConfig(iterations=16))
    result = search_program(decoder_block(64), "sm90", budget_s=20, config=config)
    assert RENDERS and set(RENDERS.values()) == {1}
    searched = set(RENDERS)
    render_program(result.program, "v1")
    # a kernel's schedules are chosen once per structure (space.options) and rendered for the first kernel of that
    # structure met; the winner renders again only where its kernel of that structure has other lines of the user's
    assert {_without_lines(key) for key in RENDERS} == {_without_lines(key) for key in searched}
    assert result.stats.boundary_sets > 1   # so kernels were met again, in other partitions


def test_identical_layers_are_one_function_and_one_build_source_under_their_own_names() -> None:
    """What NVRTC compiles (`build_source`) names no buffer and no kernel, so the kernels of a model's identical
    layers are one compile; each keeps its own name in its file's header and in the report."""
    space = CandidateSpace(residual_layers(3), get_target("sm90"))
    kernels = render_program(space.program(space.computed_once()), "v1")   # the residual stream in buffers
    by_build: dict[str, list] = {}
    for kernel in kernels:
        by_build.setdefault(kernel.build_source, []).append(kernel)
    shared = [group for group in by_build.values() if len(group) > 1]
    assert shared and len(by_build) < len(kernels)
    for group in shared:
        assert len({k.entry for k in group}) == 1 and len({k.name for k in group}) == len(group)
        assert len({k.source for k in group}) == len(group)   # each with its own weights' names
        for kernel in group:
            assert kernel.source.startswith(f"// {kernel.name} --") and f"{kernel.entry}(" in kernel.source
    gains = [k for k in kernels if any(p.startswith("gain") for p in k.params)]
    assert {p for k in gains for p in k.params} >= {"gain0", "gain1", "gain2"}


def _without_lines(key: tuple) -> tuple:
    """A render cache key (structure with lines, graph, index type, schedule) without the user's lines."""
    (archetype, rows, outputs), *rest = key
    return (archetype, tuple(row[:-1] for row in rows), outputs, *rest)
