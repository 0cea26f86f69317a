"""Each archetype's schedule declared once: the parameters search may choose, the rules a valid schedule meets, the
resource formulas those rules are made of, and the hardware facts they are sized by.

The bottom of codegen, importing none of it. The templates' code, the defaults, the search's enumeration and the
Z3 encoding (search/prune.py) all read these declarations; a rule is one function evaluated over integers or over
Z3 terms (codegen/declare.py). Adding an archetype: declare its space and rules here, write its template and its
context function beside the others, and give it a default in schedules.py.
"""
from __future__ import annotations

from typing import Any

from tensorsmith.ir.kernel_program import Schedule
from tensorsmith.ir.targets import Target

from .declare import Archetype, KernelFacts, Logic, Point, Rule

SM_COUNT = 132             # an H100 SXM's or H200's SMs: a grid of at most this many blocks runs in one wave
HOPPER = "sm_90"           # thread-block clusters, TMA and wgmma
VECTOR_BYTES = 16          # the widest load or store one thread issues
WARP = 32
MAX_ACCUMULATORS = 128     # fp32 accumulator registers per thread; past this the tile spills
BASE_REGISTERS = 32        # what a kernel needs before any row is cached in registers
STATIC_SHARED_BYTES = 48 * 1024   # a block's statically declared __shared__ arrays may not exceed 48 KiB
MMA_BYTES = 2              # 16-bit tensor-core operands (fp16, bf16); a float32 matmul's tiles hold 4-byte ones
WGMMA_ALIGN = 1024         # the 128-byte swizzle repeats every 1024 bytes: a TMA ring's stages start on such a boundary

# matmul.cu.j2
MATMUL_PAD = 8             # elements added to each 16-bit tile row (PAD_A, PAD_B): ldmatrix rows in distinct banks
# float32 tiles (3xTF32): a row along K gets 4 floats (a fragment's eight rows x four K columns in distinct banks), a
# row along M or N gets 8 (its four K rows x eight columns); both keep rows 16-byte aligned for cp.async
TF32_PAD_ALONG_K, TF32_PAD_ACROSS_K = 4, 8
TF32X3_WORK = 6            # a 3xTF32 product's tensor-core work in 16-bit products': three MMAs, each at half the rate
TF32_BK = 32               # a float32 K tile: 128 bytes a row, as a 16-bit tile's 64
PARTIAL_PAD = 4            # floats added to each row of a split block's partial sums

# attention.cu.j2 and attention_tma.cu.j2
ATTENTION_PAD = 8          # elements added to each shared K, V and Q row (the template's PAD)
OUT_PAD = 8                # floats added to each staged output row (the template's O_COLS)
DECODE_BQ = 16             # a block of this many queries splits the key tiles between its warps
DECODE_WARPS = 4
OTHER_REGISTERS = 40       # addresses, indices, the softmax state: what a thread holds besides its fragments
TMA_BQ = 128               # attention_tma.cu.j2: two consumer warpgroups of 64 query rows
TMA_STAGES = (3, 2)        # K and V tiles in flight: the most that fit (a step holds two, the next one loads)


# ---------------------------------------------------------------------------------------------------------------
# Resource formulas: over integers for codegen and the cost model, over Z3 terms for the rules' encoding.

def matmul_pad(operand_bytes: int, along_k: bool) -> int:
    """Elements matmul.cu.j2 adds to a shared tile row: a row along K (`along_k`) or along M or N."""
    if operand_bytes == MMA_BYTES:
        return MATMUL_PAD
    return TF32_PAD_ALONG_K if along_k else TF32_PAD_ACROSS_K


def matmul_shared_bytes(logic: Logic, bm: Any, bn: Any, bk: Any, stages: Any, a_major: str = "k",
                        b_major: str = "n", split_k: Any = 1, operand_bytes: int = MMA_BYTES) -> Any:
    """matmul.cu.j2's dynamic shared memory: `stages` x (A tile + B tile), rows padded as the template pads them;
    with split K at least the block's fp32 partial sums, which reuse the pipeline's memory."""
    along, across = matmul_pad(operand_bytes, True), matmul_pad(operand_bytes, False)
    a_tile = bm * (bk + along) if a_major == "k" else bk * (bm + across)
    b_tile = bk * (bn + across) if b_major == "n" else bn * (bk + along)
    pipeline = operand_bytes * stages * (a_tile + b_tile)
    return logic.If(split_k == 1, pipeline, logic.max(pipeline, split_partial_bytes(bm, bn)))


def matmul_padded_bound(logic: Logic, bm: Any, bn: Any, bk: Any, stages: Any, operand_bytes: int = MMA_BYTES) -> Any:
    """`matmul_shared_bytes`' pipeline bounded over both layouts of each operand (a rule needs no layout facts):
    16-bit tiles padded on both axes, float32 ones the larger of their two layouts (padding both would rule out
    the float32 default that fits an A100)."""
    if operand_bytes == MMA_BYTES:
        return MMA_BYTES * stages * ((bm + MATMUL_PAD) * (bk + MATMUL_PAD) + (bk + MATMUL_PAD) * (bn + MATMUL_PAD))
    along, across = matmul_pad(operand_bytes, True), matmul_pad(operand_bytes, False)
    return operand_bytes * stages * (logic.max(bm * (bk + along), bk * (bm + across))
                                     + logic.max(bk * (bn + across), bn * (bk + along)))


def split_partial_bytes(bm: Any, bn: Any) -> Any:
    """A split-K block's fp32 partial sums, rows padded."""
    return 4 * bm * (bn + PARTIAL_PAD)


def wgmma_shared_bytes(bm: Any, bn: Any, bk: Any, stages: Any) -> Any:
    """The TMA/wgmma matmul's ring: unpadded (swizzled) tiles, aligned to the swizzle's period."""
    return MMA_BYTES * stages * (bm + bn) * bk + WGMMA_ALIGN


def attention_split(logic: Logic, bq: Any) -> Any:
    """Warps that share each query row: decode's split of the keys, else one."""
    return logic.If(bq == DECODE_BQ, DECODE_WARPS, 1)


def attention_warps(logic: Logic, bq: Any) -> Any:
    """One warp per 16 query rows, or decode's warps."""
    return logic.If(bq == DECODE_BQ, DECODE_WARPS, logic.div(bq, 16))


def attention_shared_bytes(logic: Logic, bq: Any, bkv: Any, dqk: int, dv: int) -> Any:
    """attention.cu.j2's dynamic shared memory: the Q tile and two K and V tiles per key share (rows padded), or
    the staged fp32 outputs and row statistics at the end, which reuse that memory."""
    split = attention_split(logic, bq)
    tiles = MMA_BYTES * (bq * (dqk + ATTENTION_PAD) + 2 * split * bkv * (dqk + ATTENTION_PAD + dv + ATTENTION_PAD))
    staged = 4 * split * bq * (dv + OUT_PAD + 2)
    return logic.max(tiles, staged)


def attention_registers(logic: Logic, bkv: Any, dqk: int, dv: int) -> Any:
    """An estimate: Q fragments (DQK / 4), output accumulators (DV / 2), scores (BKV / 2), and the rest (ptxas
    reports 174 at head dim 128 and BKV 64, 253 without spills at head dim 256 and BKV 32)."""
    return logic.div(dqk, 4) + logic.div(dv, 2) + logic.div(bkv, 2) + OTHER_REGISTERS


def attention_tma_shared_bytes(bq: Any, bkv: Any, dqk: int, dv: int, stages: Any) -> Any:
    """attention_tma.cu.j2's: the Q tile, a ring of `stages` K and V tiles, and 1024 bytes to align."""
    return MMA_BYTES * (bq * dqk + stages * bkv * (dqk + dv)) + WGMMA_ALIGN


def row_registers(logic: Logic, length: Any, row_threads: Any, vec: Any, preloaded: int) -> Any:
    """An estimate: a base, plus the row slices a vec > 1 row kernel caches (items x vec floats each)."""
    items = logic.div(length + row_threads * vec - 1, row_threads * vec)   # vector loads per thread per row
    return BASE_REGISTERS + logic.If(vec > 1, items * vec * max(1, preloaded) + vec, 0)


def row_scratch_bytes(logic: Logic, row_threads: Any) -> Any:
    """A row reduction's static shared scratch: float and int, two of each, per warp of a row."""
    return 2 * 2 * 4 * logic.If(row_threads > WARP, logic.div(row_threads, WARP), 1)


def matmul_threads(p: Point) -> Any:
    return WARP * p.warps_m * p.warps_n


# ---------------------------------------------------------------------------------------------------------------
# The declarations

POINTWISE = Archetype("pointwise", {"block": (128, 256, 512), "vec": (1, 2, 4, 8)}, (
    Rule("block <= max threads", lambda p: p.block <= p.gpu.max_threads_per_block, launch=True),
    Rule("vec divides the last axis", lambda p: p.kernel.row_length % p.vec == 0, launch=True),
))


def _vector_chunk(p: Point) -> Any:
    """Elements per 16-byte access."""
    size = p.kernel.itemsize
    return p.logic.If(p.vec * size <= VECTOR_BYTES, p.vec, VECTOR_BYTES // size)


def _row_registers(p: Point) -> Any:
    return row_registers(p.logic, p.kernel.row_length, p.row_threads, p.vec, p.kernel.preloaded)


ROW_REDUCE = Archetype("row_reduce", {"row_threads": (32, 64, 128, 256, 512, 1024),
                                      "block": (32, 64, 128, 256, 512, 1024), "vec": (1, 2, 4, 8)}, (
    Rule("row threads divide the block", lambda p: p.block % p.row_threads == 0),
    Rule("block <= max threads", lambda p: p.block <= p.gpu.max_threads_per_block, launch=True),
    Rule("vec > 1 only where codegen caches the row", lambda p: p.logic.Or(p.vec == 1, p.kernel.vectorisable),
         launch=True),
    Rule("vec divides the row length", lambda p: p.kernel.row_length % p.vec == 0, launch=True),
    Rule("16-byte aligned vector accesses",
         lambda p: p.logic.And((p.kernel.row_length * p.kernel.itemsize) % (_vector_chunk(p) * p.kernel.itemsize) == 0,
                               _vector_chunk(p) * p.kernel.itemsize <= VECTOR_BYTES), launch=True),
    Rule("registers per thread", lambda p: _row_registers(p) <= p.gpu.max_registers_per_thread, launch=True),
    Rule("registers per block", lambda p: _row_registers(p) * p.block <= p.gpu.registers_per_sm, launch=True),
    Rule("static shared memory", lambda p: row_scratch_bytes(p.logic, p.row_threads)
         <= min(STATIC_SHARED_BYTES, p.gpu.shared_bytes_per_block), launch=True),
    # past one warp a row's threads meet at block barriers, so such a row has its block to itself
    Rule("a row of more than one warp has its block to itself",
         lambda p: p.logic.Or(p.row_threads == WARP, p.block == p.row_threads)),
))

MATMUL = Archetype("matmul", {"bm": (32, 64, 128), "bn": (64, 128, 256), "bk": (32, 64), "stages": (2, 3, 4, 6, 8, 12),
                              "warps_m": (1, 2, 4), "warps_n": (2, 4), "split_k": (1, 2, 4, 8), "wgmma": (0, 1)}, (
    Rule("4 or 8 warps", lambda p: p.logic.Or(p.warps_m * p.warps_n == 4, p.warps_m * p.warps_n == 8)),
    Rule("warp tiles of whole 16x16 fragments",
         lambda p: p.logic.And(p.bm % (16 * p.warps_m) == 0, p.bn % (16 * p.warps_n) == 0)),
    Rule("block <= max threads", lambda p: matmul_threads(p) <= p.gpu.max_threads_per_block, launch=True),
    # mma.sync's padded tiles; wgmma's are unpadded (where wgmma falls back to mma.sync, codegen renders as many of
    # the stages as fit)
    Rule("dynamic shared memory", lambda p: p.logic.If(p.wgmma == 1, wgmma_shared_bytes(p.bm, p.bn, p.bk, p.stages),
                                                       matmul_padded_bound(p.logic, p.bm, p.bn, p.bk, p.stages,
                                                                           p.kernel.operand_bytes))
         <= p.gpu.shared_bytes_per_block, launch=True),
    Rule("accumulators per thread", lambda p: p.logic.div(p.bm * p.bn, matmul_threads(p)) <= MAX_ACCUMULATORS),
    Rule("split-K partial sums fit in shared memory",
         lambda p: p.logic.Or(p.split_k == 1, split_partial_bytes(p.bm, p.bn) <= p.gpu.shared_bytes_per_block),
         launch=True),
    # wgmma's tiling (matmul_wgmma.cu.j2): one warpgroup (warps_n = 4) per 64 rows, BK = 64 (one 128-byte swizzled
    # row per K slice), a pipeline at least 3 deep. Such a schedule is also a valid mma.sync one, which is what
    # renders where the operands rule wgmma (or its split) out.
    Rule("wgmma: a warpgroup per 64 rows, BK 64, 3+ stages",
         lambda p: p.logic.Implies(p.wgmma == 1, p.logic.And(p.bk == 64, p.warps_n == 4, p.bm == 64 * p.warps_m,
                                                             p.stages >= 3))),
    Rule("wgmma only on Hopper (sm_90a)", lambda p: p.logic.Or(p.wgmma == 0, p.gpu.arch == HOPPER), launch=True),
    Rule("wgmma only for 16-bit operands (float32 runs as 3xTF32 on mma.sync)",
         lambda p: p.logic.Or(p.wgmma == 0, p.kernel.operand_bytes == MMA_BYTES), launch=True),
    Rule("K split across a thread-block cluster only on Hopper (sm_90)",
         lambda p: p.logic.Or(p.split_k == 1, p.gpu.arch == HOPPER), launch=True),
))

ATTENTION = Archetype("attention", {"bq": (16, 64, 128), "bkv": (32, 64, 128), "wgmma": (0, 1)}, (
    # bq = 16: decode (warps split the keys); wgmma = 1: Hopper's wgmma fed by TMA (bq 128, bkv 64 or 128)
    Rule("block <= max threads", lambda p: WARP * attention_warps(p.logic, p.bq) <= p.gpu.max_threads_per_block,
         launch=True),
    Rule("dynamic shared memory", lambda p: attention_shared_bytes(p.logic, p.bq, p.bkv, *p.kernel.head_dims)
         <= p.gpu.shared_bytes_per_block, launch=True),
    Rule("registers per thread", lambda p: attention_registers(p.logic, p.bkv, *p.kernel.head_dims)
         <= p.gpu.max_registers_per_thread, launch=True),
    Rule("wgmma attention only on Hopper (sm_90a)", lambda p: p.logic.Or(p.wgmma == 0, p.gpu.arch == HOPPER),
         launch=True),
    Rule("wgmma attention: 128 queries per block, key tiles of 64 or 128",
         lambda p: p.logic.Implies(p.wgmma == 1, p.logic.And(p.bq == TMA_BQ, p.bkv >= 64))),
    Rule("wgmma attention: Q and two K and V tiles in shared memory",
         lambda p: p.logic.Implies(p.wgmma == 1, attention_tma_shared_bytes(p.bq, p.bkv, *p.kernel.head_dims,
                                                                             TMA_STAGES[-1])
                                   <= p.gpu.shared_bytes_per_block), launch=True),
    Rule("whole 16-row warps and pairs of n8 score tiles", lambda p: p.logic.And(p.bq % 16 == 0, p.bkv % 16 == 0)),
))

ARCHETYPES: dict[str, Archetype] = {a.name: a for a in (POINTWISE, ROW_REDUCE, MATMUL, ATTENTION)}


def is_valid(archetype: str, schedule: Schedule, facts: KernelFacts | None = None,
             target: Target | None = None) -> bool:
    """Whether `schedule` lies in the archetype's space and meets its rules (with facts and target, all of them)."""
    return ARCHETYPES[archetype].violation(schedule, facts, target) is None


