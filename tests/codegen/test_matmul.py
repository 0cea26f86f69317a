"""The matmul archetype renders and compiles to sm_90 cubin for every layout, dtype, edge case and schedule."""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

import tensorsmith as ts

from matmul_cases import MANY_TILE_CASES, MATMUL_CASES, MATMUL_SCHEDULES, expert_tiles, matmul_program
from tensorsmith.codegen import render
from tensorsmith.codegen.matmul import SM_COUNT, matmul_body, shared_bytes, wgmma_shared_bytes
from tensorsmith.codegen.nvrtc import compile_cubin, is_cubin
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.spaces import is_valid
from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.ir.targets import TARGETS
from tensorsmith.search.partition import partition


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_every_case_compiles_at_the_default_schedule(case: str) -> None:
    _, kernel = matmul_program(MATMUL_CASES[case](), None)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))
    instruction = ("wgmma.mma_async" if kernel.arch == "sm_90a" else
                   "mma.sync.aligned.m16n8k8.row.col.f32.tf32" if case.startswith("float32") else
                   "mma.sync.aligned.m16n8k16")
    assert instruction in kernel.source and kernel.shared_bytes > 0


@pytest.mark.parametrize("a_t", [False, True], ids=["a_mk", "a_km"])
@pytest.mark.parametrize("b_t", [False, True], ids=["b_kn", "b_nk"])
@pytest.mark.parametrize("bn", [128, 256])
def test_wgmma_renders_for_every_operand_layout_and_compiles_for_sm90a(a_t: bool, b_t: bool, bn: int) -> None:
    schedule = {"bm": 128, "bn": bn, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(_product_graph(200, 328, 136, a_t, b_t), schedule)
    assert kernel.arch == "sm_90a" and kernel.block == (384, 1, 1)   # a producer and two consumer warpgroups
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.f16.f16" in kernel.source
    assert f"wgmma_m64n{bn}k16<{int(a_t)}, {int(not b_t)}>" in kernel.source   # MN-major operands transposed
    assert kernel.shared_bytes == wgmma_shared_bytes(128, bn, 64, 4)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))
    # TMA: one tensor map per operand, innermost dimension first; a K-major operand is one box of its tile's
    # rows x 64 K, an MN-major one tile / 64 boxes of 64 x 64
    map_a, map_b = kernel.tensor_maps
    assert (map_a.buffer, map_a.dims, map_a.box) == ("a", (200, 136) if a_t else (136, 200),
                                                     (64, 64) if a_t else (64, 128))
    assert (map_b.buffer, map_b.dims, map_b.box) == ("b", (136, 328) if b_t else (328, 136),
                                                     (64, bn) if b_t else (64, 64))
    boxes = kernel.source.count("tma_load(s_")
    assert boxes == (2 if a_t else 1) + (1 if b_t else bn // 64)
    assert "const __grid_constant__ TensorMap tmap_1)" in kernel.source


@pytest.mark.parametrize("bm, bn, split_k", [(64, 128, 8), (128, 256, 2)])
def test_tma_splits_k_across_a_cluster_and_compiles(bm: int, bn: int, split_k: int) -> None:
    schedule = {"bm": bm, "bn": bn, "bk": 64, "stages": 4 if bn == 128 else 3, "warps_m": bm // 64, "warps_n": 4,
                "split_k": split_k, "wgmma": 1}
    _, kernel = matmul_program(_product_graph(16, 1000, 2048, False, False), schedule)
    assert kernel.tensor_maps and kernel.grid[2] == split_k and kernel.block == (128 * (bm // 64 + 1), 1, 1)
    assert f"__cluster_dims__(1, 1, {split_k})" in kernel.source and "load_cluster_shared" in kernel.source
    body = kernel.source.split('extern "C"')[1]
    assert "registers_down<" not in body and "registers_up<" not in body   # every thread joins the reduction
    assert kernel.shared_bytes == max(wgmma_shared_bytes(bm, bn, 64, schedule["stages"]), 4 * bm * (bn + 4) + 1024)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))


def test_tma_boxes_stop_at_each_batch_of_a_shared_weight_product() -> None:
    schedule = {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(MATMUL_CASES["shared_weight"](), schedule)
    map_x, map_w = kernel.tensor_maps
    # x's map is 3-D, so a 128-row box at rows 0..71 of batch b reads zeros past row 71, not batch b + 1
    assert (map_x.dims, map_x.box, map_w.dims) == ((128, 72, 3), (64, 128, 1), (200, 128))
    assert "tma_load(s_a + 0, &tmap_0, &full[stage], k0, (int)block_m, (int)b0);" in kernel.source
    assert kernel.grid == (6, 1, 1)   # persistent: 2 tiles x 3 batches, one block each


@pytest.mark.parametrize("bn, tiles", [(128, 10 * 3 * 5), (256, 10 * 3 * 3)])
def test_tma_kernel_is_persistent_over_the_tiles_of_every_batch(bn: int, tiles: int) -> None:
    """Without a split of K, min(tiles, SM_COUNT) blocks walk the output tiles of all batches (150 tiles: blocks
    0 .. 17 take a second tile, in another batch)."""
    schedule = {"bm": 128, "bn": bn, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(MANY_TILE_CASES["batched_many_tiles"](), schedule)
    assert tiles % SM_COUNT != 0 and kernel.grid == (min(tiles, SM_COUNT), 1, 1)
    assert "constexpr int BATCHES = 10, " in kernel.source and "__cluster_dims__" not in kernel.source
    body = kernel.source.split('extern "C"')[1]
    # producer and consumers walk the same tiles, and the consumers release each tile's last stage
    assert body.count("for (int tile = blockIdx.x; tile < TILES; tile += gridDim.x) {") == 2
    assert body.count("mbarrier_arrive(&empty[(step - 1) % STAGES]);") == 2
    assert f"persistent ({min(tiles, SM_COUNT)} blocks walk the {tiles} output tiles;" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))


def test_tma_kernel_still_renders_one_tile_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """persistent=False renders the one-tile-per-block form (for comparison), on the grid of tiles."""
    def one_tile_per_block(*args: object) -> dict:
        context = matmul_body(*args)
        grid = (-(-context["n"] // context["bn"]), -(-context["m"] // context["bm"]), context["batches"])
        return {**context, "persistent": False, "grid": grid}

    monkeypatch.setattr(render, "matmul_body", one_tile_per_block)
    monkeypatch.setattr(render, "_RENDERED", OrderedDict())   # the kernel rendered by the real matmul_body: not kept
    schedule = {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(MANY_TILE_CASES["batched_many_tiles"](), schedule)
    assert kernel.grid == (5, 3, 10) and "tile += gridDim.x" not in kernel.source
    assert "const int id = blockIdx.y * TILES_N + blockIdx.x, " in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))


def test_wgmma_copies_with_cp_async_where_tma_cannot_address_an_operand() -> None:
    schedule = {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(MATMUL_CASES["row_sliced"](), schedule)
    assert kernel.arch == "sm_90a" and not kernel.tensor_maps and "cp_async_16(s_a" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))
    _, split = matmul_program(MATMUL_CASES["row_sliced"](), {**schedule, "split_k": 2})
    assert split.arch is None and "mma.sync.aligned.m16n8k16" in split.source   # cp.async wgmma does not split


def test_wgmma_falls_back_to_mma_sync_where_an_operand_is_not_a_plain_copy() -> None:
    schedule = {"bm": 128, "bn": 128, "bk": 64, "stages": 3, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, fused = matmul_program(MATMUL_CASES["fused"](), schedule)   # A is scaled first: a prologue
    assert fused.arch is None and "mma.sync.aligned.m16n8k16" in fused.source and "wgmma.mma_async" not in fused.source
    assert not is_valid("matmul", Schedule.of(**{**schedule, "bk": 32}))        # one 128-byte row per K slice
    assert not is_valid("matmul", Schedule.of(**{**schedule, "warps_m": 4, "warps_n": 2}))


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES[1:], ids=lambda s: "x".join(map(str, s.values())))
def test_every_schedule_point_compiles_and_sizes_its_pipeline(schedule: dict[str, int]) -> None:
    assert is_valid("matmul", Schedule.of(**schedule))
    _, kernel = matmul_program(MATMUL_CASES["ragged_bf16_both_transposed"](), schedule)
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90"))
    assert kernel.block == (32 * schedule["warps_m"] * schedule["warps_n"], 1, 1)
    # A is stored (k, m) and B (n, k): the template keeps A as [k][m] and B as [n][k] tiles
    expected = shared_bytes(schedule["bm"], schedule["bn"], schedule["bk"], schedule["stages"], "m", "k",
                            schedule["split_k"])
    assert kernel.shared_bytes == expected
    assert kernel.grid[2] == schedule["split_k"]
    assert ("__cluster_dims__(1, 1, " in kernel.source) == (schedule["split_k"] > 1)
    assert f"constexpr int BM = {schedule['bm']}, BN = {schedule['bn']}, BK = {schedule['bk']}, " \
           f"STAGES = {schedule['stages']}, SPLIT_K = {schedule['split_k']};" in kernel.source


def test_operands_that_are_not_plain_chunked_loads_take_the_prologue_path() -> None:
    _, fused = matmul_program(MATMUL_CASES["fused"](), None)
    assert fused.source.count("cp_async_16(") == 2           # the definition and B's copy; A is scaled first
    _, odd = matmul_program(MATMUL_CASES["k_not_multiple_of_8"](), None)
    assert odd.source.count("cp_async_16(") == 2             # the definition and B's copy (N = 40 is whole chunks)


def test_schedules_that_break_the_warp_tiling_are_invalid() -> None:
    common = {"bk": 32, "stages": 2, "split_k": 1}
    assert not is_valid("matmul", Schedule.of(bm=32, bn=64, warps_m=4, warps_n=2, **common))    # 8-row warp tiles
    assert not is_valid("matmul", Schedule.of(bm=128, bn=256, warps_m=2, warps_n=2, **common))  # 256 accumulators


def test_default_splits_k_across_a_cluster_only_where_output_tiles_are_too_few() -> None:
    _, small = matmul_program(_product_graph(16, 4096, 4096), None)
    _, large = matmul_program(_product_graph(4096, 4096, 4096), None)
    assert small.schedule["split_k"] == 2 and math.prod(small.grid) == 64    # 32 tiles; clusters of two
    assert large.schedule["split_k"] == 1 and "__cluster_dims__" not in large.source
    _, tiny = matmul_program(_product_graph(16, 1024, 4096), None)
    assert tiny.schedule["split_k"] == 4    # 8 tiles: two would leave three quarters of the SMs idle


@pytest.mark.parametrize("m, n, k, tile, split_k, stages", [
    (128, 4096, 4096, (64, 64), 1, 12),     # 64x64 tiles fill the GPU in one wave, K is short: no split
    (128, 4096, 11008, (64, 128), 2, 8),    # K is long: wider tiles split in two, one wave, as deep as fits
    (16, 11008, 4096, (64, 128), 2, 4),     # 172 blocks: two to an SM, so 4 stages
    (4096, 4096, 4096, (128, 256), 1, 4)])  # large M: as before
def test_default_ring_depth_and_tiles_at_llm_shapes(m: int, n: int, k: int, tile: tuple[int, int], split_k: int,
                                                    stages: int) -> None:
    _, kernel = matmul_program(_product_graph(m, n, k), None)
    schedule = kernel.schedule
    assert (schedule["bm"], schedule["bn"], schedule["split_k"], schedule["stages"]) == (*tile, split_k, stages)
    assert kernel.shared_bytes <= TARGETS["sm90"].shared_bytes_per_block and kernel.tensor_maps


def _product_graph(m: int, n: int, k: int, a_t: bool = False, b_t: bool = False) -> ts.Graph:
    """a @ b with a stored (m, k) or, with a_t, (k, m); b stored (k, n) or, with b_t, (n, k)."""
    g = ts.Graph("product")
    a = g.input("a", (k, m) if a_t else (m, k), "float16")
    b = g.input("b", (n, k) if b_t else (k, n), "float16")
    g.output("c", (a.transpose(0, 1) if a_t else a) @ (b.transpose(0, 1) if b_t else b))
    return g


@pytest.mark.parametrize("m", [16, 4096])
def test_an_sm80_compile_uses_no_hopper_feature(m: int) -> None:
    """No thread-block cluster (split K), wgmma or TMA where the target is an A100: the defaults and the
    search's schedules both, so that the program compiles for sm_80."""
    graph = _product_graph(m, 1024, 2048)
    program = ts.compile(graph, target="sm80", profile=False, budget_s=2)
    (kernel,) = program.kernels
    body = kernel.source.split('extern "C"')[1]
    assert kernel.schedule["split_k"] == 1 and kernel.schedule["wgmma"] == 0 and not kernel.tensor_maps
    assert "__cluster_dims__" not in body and "wgmma_m64" not in body
    _, default = matmul_program(graph, None)
    assert default.schedule["wgmma"] == 1 or default.schedule["split_k"] > 1   # on sm90 the default does use them
    assert default_schedule(partition(graph).kernels[0], _shapes(graph), "sm_80")["split_k"] == 1


def _shapes(graph: ts.Graph) -> dict[str, tuple[int, ...]]:
    return {name: buf.shape for name, buf in partition(graph).buffers.items()}


@pytest.mark.parametrize("out_dtype, pairs", [("float16", True), ("float32", False)])
def test_wgmma_epilogue_stores_neighbouring_columns_together(out_dtype: str, pairs: bool) -> None:
    """A 16-bit output whose rows are of even length, not a multiple of 8, takes one 4-byte store per lane's two
    columns; a float32 one keeps the element-wise stores."""
    g = ts.Graph("pairs")
    product = g.input("a", (256, 128), "float16") @ g.input("b", (516, 128), "float16").transpose(0, 1)
    g.output("c", product if out_dtype == "float16" else product.cast(out_dtype))
    schedule = {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(g, schedule)
    assert ("= __floats2half2_rn(low, high);" in kernel.source) == pairs
    assert ("auto output_value = [&](const idx_t m, const idx_t n, const float acc_value)" in kernel.source) == pairs
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))


@pytest.mark.parametrize("schedule", [
    {"bm": 128, "bn": 128, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 4, "wgmma": 1},
    {"bm": 64, "bn": 128, "bk": 32, "stages": 3, "warps_m": 2, "warps_n": 2, "split_k": 8, "wgmma": 0}],
    ids=["tma", "mma_sync"])
def test_split_k_reduction_loads_every_peer_before_it_stores(schedule: dict[str, int]) -> None:
    """The cluster's reduction reads the peers' partial sums four floats at a time, all of a thread's loads in
    one unrolled loop ahead of the loop that stores."""
    _, kernel = matmul_program(MATMUL_CASES["b_transposed_small_m"](), schedule)
    body = kernel.source.split('extern "C"')[1]
    loads = body.index("load_cluster_shared4(&s_partial[row][col], peer)")
    assert loads < body.index("output_value(m, n, quad[c])") and "__cluster_dims__" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))


def test_quad_transpose_gives_each_lane_eight_whole_columns_of_one_row() -> None:
    """wgmma.cu.j2's quad_store, lane by lane in Python: after the three shuffle rounds lane t of a quad holds the
    pairs of row t & 1, n8 tile t >> 1, in column order (word[h][x] of lane l: row 8h + l / 4, columns 8x + 2 (l %
    4), + 1 of a 16 x 16 block)."""
    block = np.arange(16 * 16).reshape(16, 16)
    word = {(lane, h, x): tuple(block[8 * h + lane // 4, 8 * x + 2 * (lane % 4):8 * x + 2 * (lane % 4) + 2])
            for lane in range(32) for h in range(2) for x in range(2)}

    def send(lane: int, r: int) -> tuple:   # the template's `send`: the word lane ^ r needs
        need = (lane % 4) ^ r
        return word[lane, need & 1, need >> 1]

    for lane in range(32):
        quad_lane = lane % 4
        got = [send(lane, 0)] + [send(lane ^ r, r) for r in (1, 2, 3)]   # __shfl_xor_sync(send, r)
        chunk = [value for source in range(4) for value in got[source ^ quad_lane]]   # from_lane(0 .. 3)
        row, tile = lane // 4 + 8 * (quad_lane & 1), quad_lane >> 1
        assert chunk == list(block[row, 8 * tile:8 * tile + 8]), lane


def test_wide_stores_render_and_compile() -> None:
    """The wgmma epilogue renders 16-byte stores where N is a multiple of 8, 4-byte pairs elsewhere."""
    schedule = {"bm": 128, "bn": 256, "bk": 64, "stages": 4, "warps_m": 2, "warps_n": 4, "split_k": 1, "wgmma": 1}
    for n, wide in ((512, True), (516, False)):
        g = ts.Graph("wide")
        g.output("c", g.input("a", (256, 128), "float16") @ g.input("b", (128, n), "float16"))
        _, kernel = matmul_program(g, schedule)
        assert ("const uint4 chunk = make_uint4(from_lane(0), from_lane(1), from_lane(2), from_lane(3));"
                in kernel.source) == wide
        assert is_cubin(compile_cubin(kernel.source, kernel.name, arch="sm_90a"))


def test_a_deep_wgmma_ring_that_falls_back_to_mma_sync_keeps_the_stages_that_fit() -> None:
    """Where wgmma cannot take the operands (a prologue scales A), a 12-stage wgmma schedule renders mma.sync with
    as many of its padded stages as fit in shared memory, and says so."""
    schedule = {"bm": 64, "bn": 128, "bk": 64, "stages": 12, "warps_m": 1, "warps_n": 4, "split_k": 1, "wgmma": 1}
    _, kernel = matmul_program(MATMUL_CASES["fused"](), schedule)
    limit = TARGETS["sm90"].shared_bytes_per_block
    assert "mma.sync" in kernel.source and kernel.shared_bytes <= limit
    fitted = int(kernel.source.split("STAGES = ")[1].split(",")[0])
    assert 2 <= fitted < 12 and shared_bytes(64, 128, 64, fitted + 1) > limit
    assert f"a {fitted}-stage cp.async pipeline" in kernel.source
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))


def test_a_matmul_whose_operand_is_a_broadcast_scalar_compiles_and_matches() -> None:
    """mean(x) of a (1, 1) input, expanded into the left operand (found by random graphs: it raised IndexError in
    `_operand`, a scalar's load having no axis)."""
    from tensorsmith import nn
    from tensorsmith.search.verify import random_inputs
    g = ts.Graph("scalar_operand")
    x104, x7 = g.input("x104", (1, 1), "float16"), g.input("x7", (128, 32), "float16")
    g.output("out1", nn.linear(x104.mean(keepdim=True).expand((64, 32)), x7))
    program = ts.compile(g, budget_s=5, profile=False, cache=False, progress=False)
    assert all(is_cubin(kernel.cubin) for kernel in program.kernels)
    inputs = random_inputs(g, seed=4)
    out, ref = program(device="cpu", **inputs)["out1"], ts.evaluate(g, inputs)["out1"]
    assert np.abs(out.astype(np.float64) - ref).max() < 2e-2 * np.abs(ref).max()


@pytest.mark.parametrize("schedule", [None, {"bm": 64, "bn": 128, "bk": 64, "stages": 4, "warps_m": 1, "warps_n": 4,
                                             "split_k": 1, "wgmma": 1}], ids=["default", "wgmma"])
def test_an_experts_weight_selected_by_a_tile_is_copied_from_its_rows(schedule: dict[str, int] | None) -> None:
    """Tiles of routed tokens times the weight of each tile's expert: the lookup stays in the matmul kernel and the
    weight's tiles are copied asynchronously from the selected expert's rows (zero-filled for an id outside the
    table), not gathered into a buffer of their own first (a copy of a whole expert weight per tile)."""
    graph = expert_tiles(padded=True)
    program, kernel = matmul_program(graph, schedule)
    assert [k.archetype for k in program.kernels] == ["matmul"]
    assert (kernel.arch == "sm_90a") if schedule else ("A and B copied asynchronously" in kernel.source)
    copy = next(line for line in kernel.source.splitlines() if "cp_async_16" in line and "g_w[" in line)
    assert "(row" in copy and "&& (" in copy and ">= 0 &&" in copy, copy
    # the expert is picked per tile, so a tile routed to none skips its K loop: zero K tiles, not zeros multiplied
    assert "bool picked = true;" in kernel.source and ("!picked ? 0 : " + ("K_TILES" if schedule else "min(")
                                                        in kernel.source)
    assert "picked" not in matmul_program(MATMUL_CASES["dividing"](), schedule)[1].source   # a plain product
    assert is_cubin(compile_cubin(kernel.source, kernel.name, arch=kernel.arch or "sm_90"))
    rng = np.random.default_rng(5)
    inputs = {"x": rng.standard_normal((6, 64, 136)).astype(np.float16),
              "picks": np.array([1, 0, 4, 2, 0, 3], np.int32),            # tiles 1 and 4: no expert
              "w": (rng.standard_normal((4, 200, 136)) / 12).astype(np.float16)}
    out = program.execute(inputs)["y"]
    reference = ts.evaluate(graph, inputs)["y"]
    assert not out[[1, 4]].any() and all(out[tile].any() for tile in (0, 2, 3, 5))
    assert np.linalg.norm(out - reference) / np.linalg.norm(reference) < 1e-3
