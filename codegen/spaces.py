"""Each archetype's schedule space (what search may choose), which schedules in it are valid, and the hardware facts
they are sized by: the bottom of codegen, importing none of it, so that templates, defaults, pruning and the cost
model all read one declaration."""
from __future__ import annotations

from tensorsmith.ir.kernel_program import Schedule

# The parameters each archetype's template takes, and the values search may try.
ARCHETYPES: dict[str, dict[str, tuple[int, ...]]] = {
    "pointwise": {"block": (128, 256, 512), "vec": (1, 2, 4, 8)},
    "row_reduce": {"row_threads": (32, 64, 128, 256, 512, 1024), "block": (32, 64, 128, 256, 512, 1024),
                   "vec": (1, 2, 4, 8)},
    "matmul": {"bm": (32, 64, 128), "bn": (64, 128, 256), "bk": (32, 64), "stages": (2, 3, 4, 6, 8, 12),
               "warps_m": (1, 2, 4), "warps_n": (2, 4), "split_k": (1, 2, 4, 8), "wgmma": (0, 1)},
    # bq = 16: decode (warps split the keys); wgmma = 1: Hopper's wgmma fed by TMA (bq 128, bkv 64 or 128)
    "attention": {"bq": (16, 64, 128), "bkv": (32, 64, 128), "wgmma": (0, 1)},
}
SM_COUNT = 132             # an H100 SXM's or H200's SMs: a grid of at most this many blocks runs in one wave
HOPPER = "sm_90"           # thread-block clusters, TMA and wgmma
VECTOR_BYTES = 16          # the widest load or store one thread issues


def is_valid(archetype: str, schedule: Schedule) -> bool:
    """Whether `schedule` lies in the archetype's space (and row threads divide the block)."""
    space = ARCHETYPES[archetype]
    params = schedule.as_dict()
    if set(params) != set(space) or any(v not in space[k] for k, v in params.items()):
        return False
    if archetype == "row_reduce":
        threads, block = params["row_threads"], params["block"]
        return block % threads == 0 and (threads == 32 or block == threads)
    if archetype == "matmul":
        return matmul_schedule_ok(params)
    if archetype == "attention":   # whole 16-row warps and pairs of n8 score tiles; wgmma's two warpgroups
        wgmma_ok = params["bq"] == 128 and params["bkv"] >= 64
        return params["bq"] % 16 == 0 and params["bkv"] % 16 == 0 and (wgmma_ok or not params["wgmma"])
    return True


MAX_ACCUMULATORS = 128   # fp32 accumulator registers per thread; past this the tile spills


def matmul_schedule_ok(params: dict[str, int]) -> bool:
    """4 or 8 warps whose warp tiles are whole 16x16 fragments, with at most MAX_ACCUMULATORS per thread."""
    bm, bn, warps_m, warps_n = params["bm"], params["bn"], params["warps_m"], params["warps_n"]
    if params.get("wgmma") and not wgmma_schedule_ok(params):
        return False
    if warps_m * warps_n not in (4, 8) or bm % (16 * warps_m) or bn % (16 * warps_n):
        return False
    return (bm // warps_m) * (bn // warps_n) // 32 <= MAX_ACCUMULATORS


def wgmma_schedule_ok(params: dict[str, int]) -> bool:
    """wgmma's tiling (matmul_wgmma.cu.j2): one warpgroup (warps_n = 4) per 64 rows, BK = 64 (one 128-byte
    swizzled row per K slice), a pipeline at least 3 deep; K split only on TMA (matmul_tma.cu.j2). Such a schedule
    is also a valid mma.sync one, which is what renders where the operands rule wgmma (or its split) out."""
    return (params["bk"] == 64 and params["warps_n"] == 4 and params["bm"] == 64 * params["warps_m"]
            and params["stages"] >= 3)
