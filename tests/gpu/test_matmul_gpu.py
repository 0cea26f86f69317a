"""On the GPU: the matmul archetype under several schedules matches the reference on fresh random inputs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tensorsmith as ts
from graph_cases import decoder_block
from kernel_launch import run_rendered
from matmul_cases import (MANY_TILE_CASES, MATMUL_CASES, MATMUL_SCHEDULES, PERSISTENT_SCHEDULES, expert_tiles,
                          matmul_program)
from tensorsmith.codegen.matmul import takes_wgmma
from tensorsmith.codegen.render import render_program
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.ir.targets import get_target
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import AbstractChecker
from tensorsmith.search.space import CandidateSpace
from tensorsmith.search.verify import random_inputs, relative_l2

pytestmark = pytest.mark.gpu


def _run_matmul_kernel(graph: ts.Graph, schedule: dict[str, int] | None, inputs: dict[str, np.ndarray]) -> np.ndarray:
    program, kernel = matmul_program(graph, schedule)
    assert [k.archetype for k in program.kernels] == ["matmul"], "one kernel: the matmul"
    (out,) = run_rendered(program, [kernel], inputs).values()
    return out


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=lambda s: "default" if s is None else "x".join(map(str, s.values())))
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matmul_matches_reference(case: str, schedule: dict[str, int] | None) -> None:
    graph = MATMUL_CASES[case]()
    for draw in range(2):   # fresh inputs: the kernel computes the function, not one answer
        inputs = random_inputs(graph, seed=100 + draw)
        out = _run_matmul_kernel(graph, schedule, inputs)
        (name,) = graph.outputs
        reference = ts.evaluate(graph, inputs)[name]
        assert not np.isnan(out).any(), "unwritten (poisoned) elements"
        assert relative_l2(out, reference) < 1e-2


@pytest.mark.parametrize("schedule", [s for s in MATMUL_SCHEDULES if s and s["split_k"] > 1],
                         ids=lambda s: "x".join(map(str, s.values())))
def test_cluster_matmul_replayed_as_a_graph_matches_reference(schedule: dict[str, int]) -> None:
    """Split-K kernels run as thread-block clusters (compile-time cluster dimensions); replayed from a CUDA graph,
    as a program's call runs them, the clusters must still be formed."""
    graph = MATMUL_CASES["dividing"]()
    program, kernel = matmul_program(graph, schedule)
    inputs = random_inputs(graph, seed=7)
    (out,) = run_rendered(program, [kernel], inputs, replay=True).values()
    (name,) = graph.outputs
    assert not np.isnan(out).any() and relative_l2(out, ts.evaluate(graph, inputs)[name]) < 1e-2


@pytest.mark.parametrize("grid", [None, 7], ids=["sm_grid", "grid7"])
@pytest.mark.parametrize("schedule", PERSISTENT_SCHEDULES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("case", sorted(MANY_TILE_CASES))
def test_persistent_tma_matmul_walks_several_tiles_per_block(case: str, schedule: dict[str, int],
                                                             grid: int | None) -> None:
    """Blocks of the persistent TMA kernel walk several output tiles (of several batches), with the stage ring
    running on across tiles; on its own grid (min(tiles, SMs)) and on any other (7 blocks)."""
    graph = MANY_TILE_CASES[case]()
    program, kernel = matmul_program(graph, schedule)
    assert kernel.tensor_maps and kernel.grid[1:] == (1, 1), "the persistent TMA kernel"
    if grid is not None:
        kernel = dataclasses.replace(kernel, grid=(grid, 1, 1))
    inputs = random_inputs(graph, seed=200)
    (out,) = run_rendered(program, [kernel], inputs).values()
    (name,) = graph.outputs
    assert not np.isnan(out).any(), "unwritten (poisoned) elements"
    assert relative_l2(out, ts.evaluate(graph, inputs)[name]) < 1e-2


@pytest.mark.parametrize("form", ["greedy", "operands_materialised"])
@pytest.mark.parametrize("tokens", [200, 256])
def test_a_decoder_block_with_its_operands_fused_or_materialised_matches_reference(form: str, tokens: int) -> None:
    """The block's matmuls read a normalised activation and the attention's heads permuted back into rows: computed
    in the tile loads (mma.sync, the greedy form) or materialised first and copied by TMA (wgmma), at 200 tokens
    (no tile divides them) and 256, under codegen's default schedules."""
    graph = decoder_block(tokens=tokens)
    space = CandidateSpace(graph, get_target("sm90"), AbstractChecker())
    program = space.program(getattr(space, form)())
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    program = dataclasses.replace(program, kernels=[dataclasses.replace(k, schedule=default_schedule(k, shapes))
                                                    for k in program.kernels])
    on_tma = [takes_wgmma(k, shapes) for k in program.kernels if k.archetype == "matmul"]
    assert all(on_tma) if form == "operands_materialised" else not all(on_tma)
    for draw in range(2):
        inputs = random_inputs(graph, seed=300 + draw)
        out = run_rendered(program, render_program(program), inputs)["y"]
        assert not np.isnan(out).any(), "unwritten (poisoned) elements"
        assert relative_l2(out, ts.evaluate(graph, inputs)["y"]) < 1e-2


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=lambda s: "default" if s is None else "x".join(map(str, s.values())))
@pytest.mark.parametrize("case", sorted(c for c in MATMUL_CASES if c.startswith("float32")) + ["float32_deep"])
def test_float32_matmul_keeps_float32_accuracy(case: str, schedule: dict[str, int] | None) -> None:
    """3xTF32: against numpy's float32 product the kernel is off by float32's rounding (about 1e-7), where one TF32
    product (10-bit mantissas) would be off by about 3e-4, and one truncating accumulation of every step's three
    products over K = 2048 by about 2e-5; under tiles that do and do not divide the shapes (wgmma schedules fall
    back to mma.sync)."""
    graph = MATMUL_CASES[case]() if case in MATMUL_CASES else _float32_deep()
    inputs = random_inputs(graph, seed=300)
    out = _run_matmul_kernel(graph, schedule, inputs)
    (name,) = graph.outputs
    assert not np.isnan(out).any(), "unwritten (poisoned) elements"
    assert relative_l2(out, ts.evaluate(graph, inputs)[name]) < (2e-6 if case == "float32_deep" else 1e-5)


def _float32_deep() -> ts.Graph:
    g = ts.Graph("float32_deep")
    g.output("c", g.input("a", (192, 2048), "float32") @ g.input("b", (2048, 136), "float32"))
    return g


@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("rows, k", [(1, 2048), (3, 1004), (1, 1000)])
def test_a_matrix_vector_product_with_vector_loads_matches_reference(layout: str, rows: int, k: int) -> None:
    """A decode step's products (one or a few rows) on the row kernel, its weight rows loaded 8 or 4 halves at a
    time where stored (N, K) as nn.Linear stores them, element by element where stored (K, N)."""
    graph = ts.Graph(f"gemv_{layout}")
    x = graph.input("x", (rows, k), "float16")
    w = graph.input("w", (1536, k) if layout == "nk" else (k, 1536), "float16")
    graph.output("y", x @ w.T if layout == "nk" else x @ w)
    program = partition(graph)
    kernels = render_program(program)
    assert [kernel.schedule["vec"] for kernel in kernels] == [8 if k % 8 == 0 else 4]
    for draw in range(2):
        inputs = random_inputs(graph, seed=400 + draw)
        out = run_rendered(program, kernels, inputs)["y"]
        assert not np.isnan(out).any(), "unwritten (poisoned) elements"
        assert relative_l2(out, ts.evaluate(graph, inputs)["y"]) < 1e-2


@pytest.mark.parametrize("schedule", [None, {"bm": 64, "bn": 128, "bk": 64, "stages": 4, "warps_m": 1, "warps_n": 4,
                                             "split_k": 1, "wgmma": 1}], ids=["default", "wgmma"])
def test_tiles_routed_to_no_expert_are_zero_and_the_others_match(schedule: dict[str, int] | None) -> None:
    """The copies of an expert's weight zero-fill a tile whose id is outside the table (padding), as the lookup's
    value is zero there; every other tile is its expert's product."""
    graph = expert_tiles(padded=True)
    rng = np.random.default_rng(9)
    inputs = {"x": rng.standard_normal((6, 64, 136)).astype(np.float16),
              "picks": np.array([1, 0, 4, 2, 0, 3], np.int32),
              "w": (rng.standard_normal((4, 200, 136)) / 12).astype(np.float16)}
    out = _run_matmul_kernel(graph, schedule, inputs)
    assert not out[[1, 4]].any()
    assert relative_l2(out, ts.evaluate(graph, inputs)["y"]) < 1e-2
