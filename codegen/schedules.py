"""Each archetype's schedule space (what search may choose) and the default choice for a kernel."""
from __future__ import annotations

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.ops import REDUCE

# The parameters each archetype's template takes, and the values search may try.
ARCHETYPES: dict[str, dict[str, tuple[int, ...]]] = {
    "pointwise": {"block": (128, 256, 512)},
    "row_reduce": {"row_threads": (32, 64, 128, 256, 512, 1024), "block": (32, 64, 128, 256, 512, 1024),
                   "vec": (1, 2, 4, 8)},
    "matmul": {"bm": (32, 64, 128), "bn": (64, 128, 256), "bk": (32, 64), "stages": (2, 3, 4),
               "warps_m": (1, 2, 4), "warps_n": (2, 4)},
}
ELEMENTS_PER_THREAD = 8   # aim for this many elements of a row per thread in each strided loop


def default_schedule(kernel: Kernel, shapes: dict[str, tuple[int, ...]]) -> Schedule:
    """A sensible schedule before search tunes it: enough threads per row to keep ~8 elements each."""
    if kernel.archetype == "pointwise":
        return Schedule.of(block=256)
    if kernel.archetype == "matmul":
        (_, out), = kernel.outputs
        tile_m = 128 if out.shape[-2] >= 128 else 64 if out.shape[-2] > 32 else 32
        tile_n = 128 if out.shape[-1] >= 128 else 64
        return Schedule.of(bm=tile_m, bn=tile_n, bk=32, stages=4, warps_m=2 if tile_m > 32 else 1, warps_n=4)
    from .render import vector_width   # render imports this module
    vec = vector_width(kernel, shapes)
    longest = max((n.srcs[0].shape[n.arg] for n in kernel.body if n.op in REDUCE), default=1)
    per_thread = ELEMENTS_PER_THREAD if vec == 1 else 2 * vec
    row_threads = 32
    while row_threads < 1024 and row_threads * per_thread < longest:
        row_threads *= 2
    # past one warp a row's threads meet at block barriers, so such a row has its block to itself
    return Schedule.of(row_threads=row_threads, block=row_threads if row_threads > 32 else 256, vec=vec)


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
    return True


MAX_ACCUMULATORS = 128   # fp32 accumulator registers per thread; past this the tile spills


def matmul_schedule_ok(params: dict[str, int]) -> bool:
    """4 or 8 warps whose warp tiles are whole 16x16 fragments, with at most MAX_ACCUMULATORS per thread."""
    bm, bn, warps_m, warps_n = params["bm"], params["bn"], params["warps_m"], params["warps_n"]
    if warps_m * warps_n not in (4, 8) or bm % (16 * warps_m) or bn % (16 * warps_n):
        return False
    return (bm // warps_m) * (bn // warps_n) // 32 <= MAX_ACCUMULATORS
