"""The default schedule of a kernel, before search tunes it: a sensible point of its archetype's space (spaces.py)."""
from __future__ import annotations

import math

from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.ops import REDUCE

from .attention import attention_body, kernel_attention
from .emit import NotFusable
from .matmul import kernel_matmul, takes_wgmma
from .pointwise import pointwise_vector_width
from .row_reduce import vector_width
from .spaces import HOPPER, MATMUL, SM_COUNT, TF32_BK, WGMMA_ALIGN, wgmma_shared_bytes

BUSY_BLOCKS = 128          # blocks that keep every SM of an H100/H200 busy
DEEP_RING_BYTES = 192 * 1024   # a one-wave TMA matmul's ring: the deepest that fits in this much shared memory
SHORT_K = 4096             # at most this deep, a small-M matmul's 64x64 tiles beat a split of K (_matmul_default)
MIN_TILES_PER_SPLIT = 4    # K tiles each block of a split keeps, so its pipeline fills
ELEMENTS_PER_THREAD = 8    # aim for this many elements of a row per thread in each strided loop


def default_schedule(kernel: Kernel, shapes: dict[str, tuple[int, ...]], arch: str = HOPPER) -> Schedule:
    """A sensible schedule before search tunes it, for the target architecture `arch` (NVRTC's name): enough
    threads per row to keep ~8 elements each; for a matmul, Hopper's features only on Hopper."""
    if kernel.archetype == "pointwise":   # 16-byte accesses where the last axis allows
        return Schedule.of(block=256, vec=pointwise_vector_width(kernel, shapes))
    if kernel.archetype == "matmul":
        return _matmul_default(kernel, shapes, arch == HOPPER)
    if kernel.archetype == "attention":
        return _attention_default(kernel, shapes, arch == HOPPER)
    vec = vector_width(kernel, shapes)
    longest = max((n.srcs[0].shape[n.arg] for n in kernel.body if n.op in REDUCE), default=1)
    per_thread = ELEMENTS_PER_THREAD if vec == 1 else 2 * vec
    row_threads = 32
    while row_threads < 1024 and row_threads * per_thread < longest:
        row_threads *= 2
    # past one warp a row's threads meet at block barriers, so such a row has its block to itself
    return Schedule.of(row_threads=row_threads, block=row_threads if row_threads > 32 else 256, vec=vec)


def _matmul_default(kernel: Kernel, shapes: dict[str, tuple[int, ...]], hopper: bool) -> Schedule:
    """128x128 tiles where M is large; narrower ones, with K split across a cluster, where tiles are too few.
    Where both operands are plain copies, Hopper's wgmma on TMA (measured on the H200 at 4096^3 fp16: 232 us
    against mma.sync's 540), with 128x256 tiles where those still fill the GPU. Where M is at most 128 (an LLM's
    decode and small batches), 64-row tiles, and a ring as deep as fits when the grid runs in one wave (measured on
    the H200, 2026-11-30, against cuBLAS: 128 x 4096 x 11008 with 64x128 tiles split in two, 8 stages 0.92 and
    4 stages 0.82; 16 x 4096 x 4096 split in two, 0.98 and 0.81); where 64x64 tiles alone fill the GPU in one wave
    and K is short, those without a split (128 x 4096 x 4096: 0.89, against 0.85 for 64x128 tiles split in two:
    the split's cluster and reduction cost more than the narrower tiles' extra traffic; at K = 11008, 0.88 and
    0.92, the traffic costs more). There K splits in two, into more only where two would leave three quarters
    of the SMs idle: clusters of four do not all fit on the GPCs at once (16 x 4096 x 4096: split in two with
    8 stages 0.98, in four with 4 stages 0.93)."""
    match = kernel_matmul(kernel)
    if match is None:
        raise NotFusable(kernel.outputs[0][1], "the output is not elementwise over one matmul")
    rows, cols, depth = match.dims
    batches = math.prod(match.batch_shape)
    if match.lhs.dtype.itemsize == 4:
        return _tf32x3_default(rows, cols, depth, hopper)
    tile_m = 128 if rows > 128 else 64 if rows > 32 else 32   # 128 rows: two tiles, so K splits in two, not four
    tile_n = 128 if cols >= 128 else 64
    tiles = -(-rows // tile_m) * -(-cols // tile_n) * batches
    bk, split_k = 64, 1
    while (hopper and split_k < 8 and tiles * split_k < BUSY_BLOCKS   # a split needs a cluster: Hopper
           and depth // (bk * split_k * 2) >= MIN_TILES_PER_SPLIT
           and (rows > 128 or split_k < 2 or tiles * split_k < BUSY_BLOCKS // 4)):
        split_k *= 2
    if hopper and (split_k > 1 or rows >= 128) and takes_wgmma(kernel, shapes):
        narrow = -(-rows // 64) * -(-cols // 64) * batches   # 64x64 tiles
        if rows <= 128 and BUSY_BLOCKS <= narrow <= SM_COUNT and depth <= SHORT_K:
            return _wgmma_schedule(64, 64, 1, one_wave=True)
        wide = split_k == 1 and cols >= 256 and tiles // 2 >= BUSY_BLOCKS
        bm = 128 if tile_m == 128 else 64
        one_wave = rows <= 128 and tiles * split_k <= SM_COUNT
        return _wgmma_schedule(bm, 256 if wide else 128, split_k, one_wave)
    return Schedule.of(bm=tile_m, bn=tile_n, bk=bk, stages=3 if tile_m == 128 else 4,
                       warps_m=2 if tile_m > 32 else 1, warps_n=4, split_k=split_k, wgmma=0)


def _tf32x3_default(rows: int, cols: int, depth: int, hopper: bool) -> Schedule:
    """A float32 (3xTF32) matmul: K tiles of 32 floats; 128x256 tiles where M is large, and where it is at most 128
    narrower tiles with K split across a cluster: each tile does three products' work, so small M wants more blocks
    than 16-bit does. Measured on an H100 (2026-12-06) against cuBLAS's float32 (no TF32): 4096^3 at 128x256 tiles
    1.18x (128x128: 0.94x); 16 x 4096 x 4096 at 32x64 split in four 1.59x (32x128 split in two: 1.13x);
    128 x 4096 x 4096 at 64x128 with one warp of rows, split in two, 0.91x (two warps of rows: 0.84x)."""
    if rows > 128:
        wide = cols >= 256
        return Schedule.of(bm=128, bn=256 if wide else 128, bk=TF32_BK, stages=3, warps_m=2, warps_n=4, split_k=1,
                           wgmma=0)
    bm, bn, split_k = (32, 64, 4) if rows <= 32 else (64, 128, 2)
    while split_k > 1 and (not hopper or depth // (TF32_BK * split_k) < MIN_TILES_PER_SPLIT):
        split_k //= 2
    return Schedule.of(bm=bm, bn=bn, bk=TF32_BK, stages=4, warps_m=1, warps_n=4, split_k=split_k, wgmma=0)


def _wgmma_schedule(bm: int, bn: int, split_k: int, one_wave: bool) -> Schedule:
    """A TMA matmul schedule: 4 stages, or with `one_wave` (every block on its own SM) the deepest ring of the
    space within DEEP_RING_BYTES."""
    stages = max(s for s in MATMUL.space["stages"]
                 if s == 4 or one_wave and wgmma_shared_bytes(bm, bn, 64, s) - WGMMA_ALIGN <= DEEP_RING_BYTES)
    return Schedule.of(bm=bm, bn=bn, bk=64, stages=stages, warps_m=bm // 64, warps_n=4, split_k=split_k, wgmma=1)


def _attention_default(kernel: Kernel, shapes: dict[str, tuple[int, ...]], hopper: bool) -> Schedule:
    """Decode's split of the keys for a few queries per head (head dims up to 128, whose four warps' tiles fit in
    shared memory); on Hopper, wgmma fed by TMA where it takes the operands (measured on the H200, causal prefill
    4x32x2048x2048x128 fp16: 372 us against mma.sync's 672); else 128 queries per block (64 for short ones), and
    key tiles of 128 (32 where the head dim is past 128, to keep the accumulators in registers; mma.sync, same
    shape: key tiles of 128 713 us, of 64 898 us, of 32 856 us)."""
    (_, out), = kernel.outputs
    match = kernel_attention(out)
    queries, head_dim = (match.dims[0], max(match.dims[2:])) if match is not None else (128, 128)
    if queries <= 16 and head_dim <= 128:
        return Schedule.of(bq=16, bkv=32, wgmma=0)
    wgmma = Schedule.of(bq=128, bkv=128, wgmma=1)
    if hopper and queries >= 128 and attention_body(kernel, shapes, wgmma).get("template") == "attention_tma":
        return wgmma
    return Schedule.of(bq=128 if queries >= 128 else 64, bkv=128 if head_dim <= 128 else 32, wgmma=0)
