"""Tensor-core matmuls for the matmul archetype's tests: layouts, dtypes, edges, fusion, and schedule points.

Each case is a graph whose output kernel is one matmul; shapes either divide every tile or divide none.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.render import RenderedKernel, render_kernel
from tensorsmith.ir.kernel_program import KernelProgram, Schedule
from tensorsmith.search.partition import partition


def _product(name: str, m: int, n: int, k: int, dtype: str = "float16", a_t: bool = False,
             b_t: bool = False) -> ts.Graph:
    """a @ b with a stored (m, k) or, with a_t, (k, m); b stored (k, n) or, with b_t, (n, k)."""
    g = ts.Graph(name)
    a = g.input("a", (k, m) if a_t else (m, k), dtype)
    b = g.input("b", (n, k) if b_t else (k, n), dtype)
    g.output("c", (a.transpose(0, 1) if a_t else a) @ (b.transpose(0, 1) if b_t else b))
    return g


def _fused() -> ts.Graph:
    """A per-row scale on the left operand (its prologue), bias and GELU and a residual after (the epilogue)."""
    g = ts.Graph("fused")
    x = g.input("x", (70, 96), "float16")
    scale = g.input("scale", (70, 1), "float16")
    w = g.input("w", (96, 120), "float16")
    bias = g.input("bias", (120,), "float16")
    residual = g.input("residual", (70, 120), "float16")
    g.output("y", nn.gelu((x * scale) @ w + bias) + residual)
    return g


def _batched() -> ts.Graph:
    g = ts.Graph("batched")
    a = g.input("a", (2, 3, 40, 56), "bfloat16")
    b = g.input("b", (2, 3, 56, 72), "bfloat16")
    g.output("c", a @ b)
    return g


def _shared_weight() -> ts.Graph:
    """A batch of activations against one weight (an LLM projection): 72 rows per batch, fewer than a tile's."""
    g = ts.Graph("shared_weight")
    g.output("c", g.input("x", (3, 72, 128), "float16") @ g.input("w", (128, 200), "float16"))
    return g


def _row_sliced() -> ts.Graph:
    """A's rows start 3 rows into its buffer: plain 16-byte copies, but not a box TMA can address by tile
    coordinates, so wgmma schedules copy it with cp.async (matmul_wgmma.cu.j2)."""
    g = ts.Graph("row_sliced")
    a = g.input("a", (131, 64), "float16")
    g.output("c", a[3:] @ g.input("b", (64, 136), "float16"))
    return g


def _unit_axes(residual: bool) -> ts.Graph:
    """A model's (1, T, N) view of its (T, N) product, ragged in every tile: with a residual added to it (the add
    is the epilogue), or as the graph's output itself (stored where the product is, with no copy kernel after)."""
    g = ts.Graph("unit_axes_residual" if residual else "unit_axes_output")
    product = g.input("x", (200, 136), "float16") @ g.input("w", (328, 136), "float16").transpose(0, 1)
    if residual:
        g.output("y", product.reshape((1, 200, 328)) + g.input("r", (1, 200, 328), "float16"))
    else:
        g.output("y", product.reshape((1, 200, 1, 328)))
    return g


def expert_tiles(padded: bool = False) -> ts.Graph:
    """Tiles of routed tokens, each multiplied by the weight of the expert it was routed to (stored (N, K) per expert,
    as nn.Linear stores it): a batched product whose right operand is a lookup, copied from the selected expert's
    rows; ragged N and K. `padded`: the ids are computed (picks - 1), so that a tile routed to no expert (-1, a
    padding tile) is possible, and gets zeros."""
    g = ts.Graph("expert_tiles_padded" if padded else "expert_tiles")
    x, picks = g.input("x", (6, 64, 136), "float16"), g.input("picks", (6,), "int32")
    experts = nn.take(g.input("w", (4, 200, 136), "float16"), picks - 1 if padded else picks, 0)   # (6, 200, 136)
    g.output("y", x @ experts.transpose(1, 2))
    return g


MATMUL_CASES: dict[str, Callable[[], ts.Graph]] = {
    "dividing": lambda: _product("dividing", 128, 256, 128),
    "ragged": lambda: _product("ragged", 100, 72, 40),
    "ragged_bf16_both_transposed": lambda: _product("ragged_t", 77, 200, 136, "bfloat16", a_t=True, b_t=True),
    "a_transposed": lambda: _product("a_t", 96, 64, 48, a_t=True),
    "b_transposed_small_m": lambda: _product("small_m", 16, 384, 256, b_t=True),
    # N even but not a multiple of 8 (B transposed, so TMA still copies it): 4-byte pair stores, not 16-byte
    "n_not_multiple_of_8": lambda: _product("n_even", 64, 100, 64, b_t=True),
    "k_not_multiple_of_8": lambda: _product("k_odd", 48, 40, 36),     # no 16-byte copies: the prologue path
    "fused": _fused,
    "batched": _batched,
    "row_sliced": _row_sliced,
    "shared_weight": _shared_weight,
    "unit_axes_residual": lambda: _unit_axes(residual=True),
    "unit_axes_output": lambda: _unit_axes(residual=False),
    "expert_tiles": expert_tiles,
    # float32 as 3xTF32: 4-float copies, ragged tiles, every operand layout, and K in no whole copy (the prologue)
    "float32_ragged": lambda: _product("f32_ragged", 100, 72, 40, "float32"),
    "float32_b_transposed": lambda: _product("f32_b_t", 128, 256, 128, "float32", b_t=True),
    "float32_both_transposed": lambda: _product("f32_t", 77, 200, 136, "float32", a_t=True, b_t=True),
    "float32_k_odd": lambda: _product("f32_k_odd", 48, 40, 37, "float32"),
}

def _batched_many_tiles() -> ts.Graph:
    """10 batches of 300 x 192 @ 192 x 520: with 128 x 128 tiles 150 output tiles, ragged in M and N."""
    g = ts.Graph("batched_many_tiles")
    g.output("c", g.input("a", (2, 5, 300, 192), "float16") @ g.input("b", (2, 5, 192, 520), "float16"))
    return g


# More output tiles than the 132 blocks of a persistent TMA grid, so that blocks walk several tiles.
MANY_TILE_CASES: dict[str, Callable[[], ts.Graph]] = {
    "square": lambda: _product("square", 4096, 4096, 320),   # 128 x 256 tiles: 512, blocks walk 3 or 4
    "batched_many_tiles": _batched_many_tiles,
}

# Points of the schedule space that differ in every parameter; `None` is codegen's default.
MATMUL_SCHEDULES: list[dict[str, int] | None] = [
    None,
    {"bm": 32, "bn": 64, "bk": 64, "stages": 2, "warps_m": 1, "warps_n": 4, "split_k": 1, "wgmma": 0},
    {"bm": 64, "bn": 128, "bk": 32, "stages": 3, "warps_m": 2, "warps_n": 2, "split_k": 1, "wgmma": 0},
    {"bm": 128, "bn": 256, "bk": 32, "stages": 3, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 0},
    {"bm": 128, "bn": 64, "bk": 64, "stages": 4, "warps_m": 4, "warps_n": 2, "split_k": 1, "wgmma": 0},
    {"bm": 32, "bn": 64, "bk": 32, "stages": 2, "warps_m": 1, "warps_n": 4, "split_k": 4, "wgmma": 0},
    {"bm": 64, "bn": 128, "bk": 32, "stages": 3, "warps_m": 2, "warps_n": 2, "split_k": 8, "wgmma": 0},  # splits without tiles
    # wgmma (sm_90a) where both operands are plain copies, else mma.sync under the same tile
    {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1},
    {"bm": 64, "bn": 128, "bk": 64, "stages": 3, "warps_m": 1, "warps_n": 4, "split_k": 1, "wgmma": 1},
    # and K split across a cluster on TMA (mma.sync's split where TMA cannot copy the operands)
    {"bm": 128, "bn": 256, "bk": 64, "stages": 3, "warps_m": 2, "warps_n": 4, "split_k": 2, "wgmma": 1},
    {"bm": 64, "bn": 128, "bk": 64, "stages": 4, "warps_m": 1, "warps_n": 4, "split_k": 8, "wgmma": 1},
]


# TMA schedules (split_k = 1: persistent) with two and one consumer warpgroups, and rings of 3 and 4 stages
PERSISTENT_SCHEDULES: list[dict[str, int]] = [
    {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1},
    {"bm": 128, "bn": 256, "bk": 64, "stages": 3, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1},
    {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1},
    {"bm": 64, "bn": 128, "bk": 64, "stages": 4, "warps_m": 1, "warps_n": 4, "split_k": 1, "wgmma": 1},
]


def matmul_program(graph: ts.Graph, schedule: dict[str, int] | None) -> tuple[KernelProgram, RenderedKernel]:
    """The graph as kernels with its one matmul kernel under `schedule`, and that kernel rendered."""
    program = partition(graph)
    position = next(p for p, kernel in enumerate(program.kernels) if kernel.archetype == "matmul")
    if schedule is not None:
        kernels = list(program.kernels)
        kernels[position] = dataclasses.replace(kernels[position], schedule=Schedule.of(**schedule))
        program = dataclasses.replace(program, kernels=kernels)
    return program, render_kernel(program, position)
