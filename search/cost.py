"""The analytical cost model: a time per kernel from what its schedule makes the GPU do.

A kernel's work is counted the way the emitter renders it (`kernel_work`): every evaluation of every
node in every loop, so that recomputation under fusion (a value expanded along an axis, a row re-read by
each strided loop) costs what it costs on the device. Its time (`kernel_cost`) is then a roofline per wave:

- blocks per SM from threads, registers and shared memory (occupancy);
- waves = blocks / (SMs x blocks per SM), rounded up: a ragged last wave costs a wave whose SMs are partly idle;
  blocks in thread-block clusters fit fewer at once (cluster_slots);
- each wave is bound by DRAM bytes (at the bandwidth that the bytes in flight per SM sustain, Little's law),
  by bytes re-read from the caches, by FP32 work, and by a block's critical path (the dependent load
  rounds of its row loops and the reductions between them);
- plus one launch.

The figures it uses are the target's (ir/targets.py); the per-op weights below are this model's own.
"""
from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass
from functools import lru_cache

from tensorsmith.codegen.emit import NotFusable, is_inline_reduce
from tensorsmith.codegen import attention
from tensorsmith.codegen.matmul import WGMMA_ARCH, matmul_body, tensor_core_match
from tensorsmith.codegen.pointwise import launched_shape, pointwise_blocks
from tensorsmith.codegen.row_reduce import row_plan
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.declare import PYTHON
from tensorsmith.codegen.spaces import (BASE_REGISTERS, MMA_BYTES, TF32X3_WORK, VECTOR_BYTES, WARP, row_registers,
                                        row_scratch_bytes)
from tensorsmith.ir.kernel_program import Kernel, KernelProgram, Schedule
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import COMPUTE, Op, REDUCE, UNARY, VIEWS
from tensorsmith.ir.patterns import lookup_reads, match_gather
from tensorsmith.ir.targets import Target

LAUNCH_SECONDS = 3e-6          # kept for callers; the target's launch_s is what the model uses
TRANSCENDENTAL_FLOPS = 8       # exp2/log2/sin/sqrt/recip run on the special-function unit at 1/8 the FMA rate
STRIDED_UNROLL = 4             # loads in flight per thread in a strided loop (the compiler unrolls ~4 deep)
ALU_WARPS = 16                 # warps per SM that keep the FP32 pipes busy
ATTENTION_STEP_S = 0.4e-6     # one key tile's fixed cost in its block: barriers, the wait for its copies, the
                               # online softmax's rescale (fitted to 18 schedules measured on the H200, see
                               # tests/search/test_cost_calibration.py)
TENSOR_WARPS = 8               # and the tensor cores (mma.sync 4096^3 on the H200: 8 warps 278 TFLOP/s, 16 warps 295)
TMA_DRAM_SHARE = 1.5           # an SM copying by TMA draws up to 1.5x its even share of HBM bandwidth when others
                               # idle (16 x 11008 x 4096 fp16 on the H200: 43 blocks moved 90 MB at 2.2 TB/s)
REDUCE_SYNC_S = 80e-9          # warp shuffles of one row reduction
BLOCK_SYNC_S = 120e-9          # and, past one warp, the shared-memory exchange with two barriers
PROLOGUE_LATENCY_SHARE = 0.8   # of a DRAM latency, what each element of a computed operand's tile costs a thread
                               # per K step: its loads wait before the tile's store to shared memory (H200, 2048
                               # x 5632 x 2048 fp16, RMSNorm computed in A's loads, 64x64x32 tiles: 7.7 us a step
                               # for 16 elements a thread)
SHALLOW_RING = 3               # a matmul ring this deep or less exposes a whole step's latency (calibrated: with 2,
                               # the 109 rows of 3- and 4-stage rings fit worse, 1.22x in the median against 1.17x)


@dataclass(frozen=True)
class Work:
    """What one kernel does, independent of how its threads are arranged (but for register caching)."""

    flops: float
    loads: tuple[tuple[str, float], ...]   # buffer -> element loads, every loop counted
    passes: int                            # loops over a row one after another (1 for pointwise)
    preloaded: int                         # buffers a vec > 1 row kernel caches in registers (read by several loops)


@dataclass(frozen=True)
class KernelCost:
    """The model's account of one kernel under one schedule."""

    seconds: float
    dram_bytes: float
    cache_bytes: float
    flops: float
    blocks: int
    blocks_per_sm: int
    waves: int
    occupancy: float          # resident warps / the SM's maximum, in a full wave
    critical_path_s: float
    bound: str                # what bounds a full wave: "dram", "cache", "compute" or "latency"


def schedule_of(kernel: Kernel, shapes: dict[str, tuple[int, ...]], target: Target) -> Schedule:
    """The kernel's schedule, or codegen's default where search has not chosen one."""
    return kernel.schedule if kernel.schedule.params else default_schedule(kernel, shapes, target.arch)


def kernel_flops(kernel: Kernel) -> float:
    """FP32 work of one kernel as rendered (recomputation included), transcendentals weighted."""
    return kernel_work(kernel, 1).flops


def kernel_bytes(kernel: Kernel, program: KernelProgram) -> float:
    """Device-memory traffic: every buffer the kernel touches, read or written once; of a table it only looks rows
    up in, the rows it reads; of a point write's outputs and the buffers of their shape (read at their index), the
    slice it writes in place."""
    tables = _lookup_reads(kernel)
    share = _written_share(kernel)
    sliced = {node.arg for _, out in kernel.outputs for node in toposort([out]) if node.op == Op.INPUT
              and node.shape == out.shape} if share < 1 else set()
    return float(sum(buffer.dtype.itemsize * tables[name] if name in tables
                     else buffer.nbytes * (share if name in sliced or name in kernel.writes else 1.0)
                     for name in kernel.reads + kernel.writes for buffer in (program.buffers[name],)))


def _written_share(kernel: Kernel) -> float:
    """The share of its outputs' elements a pointwise kernel writes, as it runs in place: a point write's slice."""
    if kernel.archetype != "pointwise":
        return 1.0
    shape = kernel.outputs[0][1].shape
    return math.prod(launched_shape(kernel, shape)) / max(1, math.prod(shape))


@lru_cache(maxsize=4096)
def _lookup_reads(kernel: Kernel) -> dict[str, int]:
    return lookup_reads([node for _, node in kernel.outputs])


def kernel_seconds(kernel: Kernel, program: KernelProgram, target: Target) -> float:
    """The model's time for one kernel (inf if its archetype cannot take it)."""
    return kernel_cost(kernel, program, target).seconds


def program_seconds(program: KernelProgram, target: Target) -> float:
    """Kernels run one after another on one stream, so their times add."""
    return sum(kernel_seconds(kernel, program, target) for kernel in program.kernels)


def kernel_cost(kernel: Kernel, program: KernelProgram, target: Target) -> KernelCost:
    """Occupancy, waves and the roofline of each wave for `kernel` under its schedule."""
    pricing = KernelPricing(kernel, program, target)
    try:
        schedule = schedule_of(kernel, pricing.shapes, target)
    except NotFusable:
        return ILLEGAL
    return pricing.cost(schedule)


ILLEGAL = KernelCost(math.inf, 0.0, 0.0, 0.0, 0, 0, 0, 0.0, math.inf, "illegal")


def corrected(seconds: float, archetype: str, target: Target) -> float:
    """The model's time for a kernel of `archetype` (its launch apart) as refitted to the target's measured kernels
    (unchanged where none were fitted)."""
    for name, scale, power in target.corrections:
        if name == archetype:
            return scale * seconds ** power
    return seconds


def kernel_features(kernel: Kernel, program: KernelProgram, target: Target) -> dict:
    """A kernel as a kernel-time record keeps it, for the cost model to be refitted from: its archetype, schedule,
    buffers' shapes and dtypes, and the uncorrected model's account of it (its time without the launch, as kernels
    are measured; `work_flops` in 16-bit tensor-core products' units for matmuls)."""
    cost = kernel_cost(kernel, program, dataclasses.replace(target, corrections=()))

    def described(names: tuple[str, ...]) -> list:
        return [[list(program.buffers[name].shape), program.buffers[name].dtype.value] for name in names]
    return {"archetype": kernel.archetype, "schedule": kernel.schedule.as_dict(), "reads": described(kernel.reads),
            "writes": described(kernel.writes), "predicted_s": cost.seconds - target.launch_s,
            "dram_bytes": cost.dram_bytes, "cache_bytes": cost.cache_bytes, "work_flops": cost.flops,
            "blocks": cost.blocks, "waves": cost.waves, "occupancy": cost.occupancy, "bound": cost.bound}


class KernelPricing:
    """`kernel_cost` of one kernel under many schedules: what does not depend on the schedule (its buffers' shapes
    and bytes, its work per vector width) is worked out once (search prices hundreds of schedules per kernel)."""

    def __init__(self, kernel: Kernel, program: KernelProgram, target: Target):
        self.kernel, self.target = kernel, target
        touched = dict.fromkeys(kernel.reads + kernel.writes)
        self.shapes = {name: program.buffers[name].shape for name in touched}
        self.dram = kernel_bytes(kernel, program)
        self.read_bytes = float(sum(program.buffers[name].nbytes for name in kernel.reads))
        self.itemsizes = {name: program.buffers[name].dtype.itemsize for name in touched}
        self._work: dict[int, tuple[Work, float]] = {}

    def _work_at(self, vec: int) -> tuple[Work, float]:
        """The kernel's work at vector width `vec`, and the bytes it loads beyond its buffers (from the caches)."""
        if vec not in self._work:
            work = kernel_work(self.kernel, vec)
            loaded = sum(count * self.itemsizes[name] for name, count in work.loads)
            self._work[vec] = work, max(0.0, loaded - self.read_bytes)
        return self._work[vec]

    def cost(self, schedule: Schedule) -> KernelCost:
        """The model's account of the kernel under `schedule`."""
        kernel, target, shapes, dram = self.kernel, self.target, self.shapes, self.dram
        try:
            geometry = launch_geometry(kernel, shapes, schedule)
        except NotFusable:
            return ILLEGAL
        if kernel.archetype == "matmul":
            work, cache = _matmul_work(kernel, schedule, self.read_bytes)
        elif kernel.archetype == "attention":
            work, cache = _attention_work(kernel, schedule, shapes, self.read_bytes, target)
        else:
            work, cache = self._work_at(schedule.as_dict().get("vec", 1))
        blocks, threads = geometry.blocks, geometry.threads
        registers = registers_per_thread(kernel, schedule, shapes, work)
        per_sm = blocks_per_sm(target, threads, registers, geometry.shared_bytes)
        if per_sm == 0:
            return KernelCost(math.inf, dram, cache, work.flops, blocks, 0, 0, 0.0, math.inf, "illegal")
        slots = geometry.slots or cluster_slots(target, per_sm, _cluster_size(kernel, schedule))
        waves = -(-blocks // slots)
        warps = -(-threads // WARP)
        in_flight_per_warp = WARP * geometry.access_bytes * geometry.loads_in_flight
        critical = critical_path(kernel, geometry, work, target)

        def wave(blocks_in_wave: int) -> tuple[float, str]:
            busy = min(target.sm_count, blocks_in_wave)
            resident = -(-blocks_in_wave // busy)
            share = blocks_in_wave / blocks / busy          # this wave's share of the kernel, per busy SM
            share_cap = TMA_DRAM_SHARE if geometry.engine == "wgmma" else 1.0
            sm_bandwidth = min(target.hbm_bytes_per_s / busy, share_cap * target.hbm_bytes_per_s / target.sm_count,
                               resident * warps * in_flight_per_warp / target.dram_latency_s)
            rate, busy_warps = {"wgmma": (target.wgmma_flops, TENSOR_WARPS),
                                "mma": (target.mma_sync_flops, TENSOR_WARPS),
                                "cuda": (target.fp32_flops, ALU_WARPS)}[geometry.engine]
            alu = rate / target.sm_count * min(1.0, resident * warps / busy_warps)
            times = {"dram": dram * share / sm_bandwidth,
                     "cache": cache * share / (target.l2_bytes_per_s / target.sm_count),
                     "compute": work.flops * share / alu + geometry.tile_steps * share * ATTENTION_STEP_S / resident,
                     "latency": critical}
            bound = max(times, key=times.__getitem__)
            return times[bound], bound

        full_time, bound = wave(min(blocks, slots))
        tail_blocks = blocks - (waves - 1) * slots
        seconds = corrected((waves - 1) * full_time + wave(tail_blocks)[0], kernel.archetype, target) + target.launch_s
        occupancy = min(blocks, slots) / target.sm_count * warps / (target.max_threads_per_sm // WARP)
        return KernelCost(seconds, dram, cache, work.flops, blocks, per_sm, waves, min(1.0, occupancy), critical,
                          bound)


@dataclass(frozen=True)
class Geometry:
    """How a schedule lays a kernel out: blocks, threads, shared memory, and its loads."""

    blocks: int
    threads: int
    shared_bytes: int
    access_bytes: int         # bytes per thread per load
    loads_in_flight: int      # independent loads a thread has outstanding
    row_iterations: int       # strided-loop trips per thread per pass (1 for pointwise)
    engine: str = "cuda"      # what does the arithmetic: "cuda" cores, "mma" (mma.sync) or "wgmma" tensor cores
    tile_steps: float = 0.0   # attention: key-tile steps of all blocks, each with a fixed cost in its block
    slots: int = 0            # a persistent kernel: the blocks it launches, each walking `blocks` / slots tiles
    ring: int = 0             # a matmul's pipeline stages: tiles a block has in flight while it computes on one
    computed_per_step: int = 0   # a matmul's operand elements each thread computes from loads per K step (a prologue)


def launch_geometry(kernel: Kernel, shapes: dict[str, tuple[int, ...]], schedule: Schedule) -> Geometry:
    """The grid that codegen launches for `kernel` under `schedule` (raises NotFusable as codegen would)."""
    params = schedule.as_dict()
    itemsize = max((n.dtype.itemsize for n in kernel.body if n.op == Op.INPUT), default=4)
    if kernel.archetype == "pointwise":   # VEC elements per thread: one access of up to 16 bytes per operand each
        reads, vec = max(1, len(kernel.reads)), params.get("vec", 1)
        access = min(VECTOR_BYTES, vec * itemsize)
        return Geometry(pointwise_blocks(kernel, shapes[kernel.writes[0]], params["block"], vec), params["block"], 0,
                        access, reads * (vec * itemsize // access), 1)
    if kernel.archetype == "matmul":
        launch = matmul_body(kernel, shapes, schedule)
        threads, bk = launch["block"][0], params["bk"]
        tile_loads = params["stages"] * params["bm"] * bk // threads   # elements in flight per thread
        persistent = launch.get("persistent", False)   # then `blocks` counts output tiles, the grid walks them
        computed = ((params["bm"] * bk if launch["computed_a"] and not launch["copy_a"] else 0)
                    + (bk * params["bn"] if launch["computed_b"] and not launch["copy_b"] else 0))
        return Geometry(launch["tiles"] if persistent else math.prod(launch["grid"]), threads, launch["shared_bytes"],
                        launch["operand_bytes"], max(1, tile_loads), -(-launch["kdim"] // bk),
                        "wgmma" if launch.get("arch") == WGMMA_ARCH else "mma",
                        slots=launch["grid"][0] if persistent else 0, ring=launch["stages"],
                        computed_per_step=-(-computed // threads))
    if kernel.archetype == "attention":   # 16-byte copies of K and V tiles; a block walks its key tiles in turn
        match = _attention_of(kernel)
        _, _, dqk, dv = match.dims
        warps, split = attention.warps_and_split(params["bq"])
        rows, heads = attention.query_rows(match, schedule)
        tiles = _attention_key_tiles(match, params["bq"], params["bkv"], rows)
        steps = sum(tiles) * heads / split
        if _attention_on_wgmma(kernel, shapes, schedule):   # TMA copies a whole tile at once: one load in flight
            return Geometry(len(tiles) * heads, attention.TMA_THREADS,
                            attention.wgmma_shared_bytes(params["bq"], params["bkv"], dqk, dv), 16,
                            attention.wgmma_stages(params["bq"], params["bkv"], dqk, dv), max(tiles), "wgmma", steps)
        copies = params["bkv"] * (dqk + dv) // 8 // (WARP * warps // split)
        return Geometry(len(tiles) * heads, WARP * warps,
                        attention.shared_bytes(params["bq"], params["bkv"], dqk, dv), 16, max(1, copies),
                        -(-max(tiles) // split), "mma", steps)
    plan = row_plan(kernel)
    rows = max(1, math.prod(plan.row_shape))
    row_threads, block, vec = params["row_threads"], params["block"], params.get("vec", 1)
    length = max((r.srcs[0].shape[r.arg] for r in plan.reduces), default=1)
    scratch = row_scratch_bytes(PYTHON, row_threads)
    blocks = -(-rows // max(1, block // row_threads))
    if vec > 1:
        items = -(-length // (row_threads * vec))
        access = min(VECTOR_BYTES, vec * itemsize)
        return Geometry(blocks, block, scratch, access, items * (vec * itemsize // access), items)
    iterations = -(-length // row_threads)
    return Geometry(blocks, block, scratch, itemsize, min(STRIDED_UNROLL, iterations), iterations)


def cluster_slots(target: Target, per_sm: int, cluster: int) -> int:
    """Blocks that run at once in clusters of `cluster`. A cluster's blocks share one GPC, and the GPCs of a
    Hopper die differ in size, so a GPC wastes the SMs it has left over a whole number of clusters: (cluster - 1)
    / 2 per GPC on average, an estimate. On the H200, 32 clusters of four one-block-per-SM blocks (128 of 132
    SMs) ran in two waves (Nsight Compute: the SMs were active 46% of the kernel's time), 64 clusters of two in
    one (128 x 4096 x 4096: 30.3 against 25.0 us)."""
    if cluster <= 1:
        return target.sm_count * per_sm
    usable = (target.sm_count - target.gpcs * (cluster - 1) / 2) * per_sm
    return max(cluster, int(usable // cluster) * cluster)


def _cluster_size(kernel: Kernel, schedule: Schedule) -> int:
    """Blocks per thread-block cluster: a matmul's K split runs on a cluster of split_k blocks."""
    return schedule.as_dict().get("split_k", 1) if kernel.archetype == "matmul" else 1


def blocks_per_sm(target: Target, threads: int, registers: int, shared_bytes: int) -> int:
    """Resident blocks per SM: the least of the block, thread, register and shared-memory limits."""
    if threads > target.max_threads_per_block or registers > target.max_registers_per_thread:
        return 0
    limits = [target.max_blocks_per_sm, target.max_threads_per_sm // threads,
              target.registers_per_sm // (registers * threads)]
    if shared_bytes:
        limits.append(target.shared_bytes_per_sm // shared_bytes)
    return max(0, min(limits))


def registers_per_thread(kernel: Kernel, schedule: Schedule, shapes: dict[str, tuple[int, ...]],
                         work: Work | None = None) -> int:
    """An estimate: a base, plus the row slices a vec > 1 row kernel caches (items x vec floats each)."""
    params = schedule.as_dict()
    vec = params.get("vec", 1)
    if kernel.archetype == "attention" and not _attention_on_wgmma(kernel, shapes, schedule):
        _, _, dqk, dv = _attention_of(kernel).dims
        return attention.registers_per_thread(params["bkv"], dqk, dv)
    if kernel.archetype != "row_reduce" or vec == 1:
        return BASE_REGISTERS
    work = work or kernel_work(kernel, vec)
    length = max((r.srcs[0].shape[r.arg] for r in row_plan(kernel).reduces), default=1)
    return row_registers(PYTHON, length, params["row_threads"], vec, work.preloaded)


def critical_path(kernel: Kernel, geometry: Geometry, work: Work, target: Target) -> float:
    """The least time one block takes: its rounds of dependent loads and the reductions between passes."""
    rounds = -(-geometry.row_iterations // max(1, geometry.loads_in_flight))
    if kernel.archetype == "pointwise":
        return target.dram_latency_s
    if kernel.archetype in ("matmul", "attention"):   # each step loads a tile, waits at a barrier, runs the MMAs
        step = target.cache_latency_s + BLOCK_SYNC_S
        if geometry.ring > SHALLOW_RING:   # a deeper ring hides more of each step's wait (Little's law)
            step *= SHALLOW_RING / geometry.ring
        step += geometry.computed_per_step * PROLOGUE_LATENCY_SHARE * target.dram_latency_s   # no ring hides these
        return target.dram_latency_s + geometry.row_iterations * step
    sync = REDUCE_SYNC_S + (BLOCK_SYNC_S if geometry.threads > WARP and geometry.loads_in_flight else 0.0)
    if work.preloaded:   # one round of vector loads, then every pass reads registers
        return target.dram_latency_s + work.passes * sync
    first = rounds * target.dram_latency_s
    return first + (work.passes - 1) * rounds * target.cache_latency_s + work.passes * sync


def kernel_work(kernel: Kernel, vec: int) -> Work:
    """Flops and loads of `kernel` as the emitter renders it, with `vec` > 1 caching rows in registers."""
    if kernel.schedule.params:   # the work does not depend on the schedule: share it between schedules
        kernel = dataclasses.replace(kernel, schedule=Schedule())
    return _work(kernel, vec)


@lru_cache(maxsize=4096)
def _work(kernel: Kernel, vec: int) -> Work:
    if kernel.archetype != "row_reduce":
        regions = [(node, float(node.size) * _written_share(kernel)) for _, node in kernel.outputs]
        stops: frozenset[int] = frozenset()
        preloadable: set[str] = set()
    else:
        plan = row_plan(kernel)
        stops = frozenset(id(r) for r in plan.reduces)
        regions = [(r.srcs[0], float(r.srcs[0].size)) for r in plan.reduces] + [(plan.out, float(plan.out.size))]
        preloadable = _preloadable(kernel, plan.out, vec) if vec > 1 and not plan.per_row_output else set()
    flops = 0.0
    loads: dict[str, float] = {}
    cached: dict[str, float] = {}
    loops_reading: dict[str, int] = {}
    for root, base in regions:
        counts = _evaluations(root, base, stops)
        for name in {node.arg for node, count in counts.values() if node.op == Op.INPUT and count}:
            loops_reading[name] = loops_reading.get(name, 0) + 1
        for node, count in counts.values():
            flops += _flops(node, count)
            if node.op == Op.INPUT:
                if node.arg in preloadable:
                    cached[node.arg] = max(cached.get(node.arg, 0.0), count)
                else:
                    loads[node.arg] = loads.get(node.arg, 0.0) + count
    for name, count in cached.items():
        loads[name] = loads.get(name, 0.0) + count
    flops += sum(float(r.srcs[0].size) for r in kernel.body if id(r) in stops)  # each cooperative combine
    # a row that one loop reads is loaded in that loop; only rows that several loops read stay in registers
    registers_rows = sum(1 for name in preloadable if loops_reading.get(name, 0) > 1)
    return Work(flops, tuple(sorted(loads.items())), len(regions) if kernel.archetype == "row_reduce" else 1,
                registers_rows)


def _matmul_work(kernel: Kernel, schedule: Schedule, read_bytes: float) -> tuple[Work, float]:
    """Tensor-core FLOPs of whole tiles (in 16-bit products': a float32 one is 3xTF32's work), and the operand
    tiles that every block re-reads from the caches."""
    m, n, k, batches, itemsize = _matmul_dims(kernel.outputs)
    bm, bn = schedule["bm"], schedule["bn"]
    rereads = batches * k * (m * (-(-n // bn)) + n * (-(-m // bm))) * itemsize
    cache = max(0.0, rereads - read_bytes)
    padded_m, padded_n = -(-m // bm) * bm, -(-n // bn) * bn   # the tensor cores compute whole tiles
    work = 1 if itemsize == MMA_BYTES else TF32X3_WORK
    return Work(2.0 * batches * padded_m * padded_n * k * work, (), 1, 0), cache


@lru_cache(maxsize=1024)
def _matmul_dims(outputs: tuple) -> tuple[int, int, int, int, int]:
    """(M, N, K, batches, operand bytes) of the kernel's tensor-core matmul."""
    body = toposort([node for _, node in outputs])
    match = next(found for n in body if n.op == Op.SUM and (found := tensor_core_match(n)) is not None)
    m, n, k = match.dims
    return m, n, k, max(1, math.prod(match.batch_shape)), match.lhs.dtype.itemsize


ATTENTION_SCORE_FLOPS = 24     # per score: the score function, max, exp2 (at TRANSCENDENTAL_FLOPS), sum, rescale


def _attention_of(kernel: Kernel) -> attention.AttentionMatch:
    match = attention.kernel_attention(kernel.outputs[0][1])
    if match is None:
        raise NotFusable(kernel.outputs[0][1], "the output is not elementwise over one attention")
    return match


def _attention_on_wgmma(kernel: Kernel, shapes: dict[str, tuple[int, ...]], schedule: Schedule) -> bool:
    """Whether `schedule` renders the kernel on attention_tma.cu.j2 (else the mma.sync template, same tiles)."""
    if not schedule.as_dict().get("wgmma"):
        return False
    return _renders_attention_tma(kernel.name, kernel.outputs, tuple(sorted(shapes.items())), schedule)


@lru_cache(maxsize=1024)
def _renders_attention_tma(name: str, outputs: tuple, shapes_key: tuple, schedule: Schedule) -> bool:
    """Rendering the context once per kernel and schedule: a costing asks three times (launch, registers, work)."""
    kernel = Kernel(name, "attention", outputs, schedule)
    return attention.attention_body(kernel, dict(shapes_key), schedule).get("template") == "attention_tma"


def _attention_key_tiles(match: attention.AttentionMatch, bq: int, bkv: int, rows: int | None = None) -> list[int]:
    """Key tiles each query tile visits, as the template counts them (skipping tiles past a causal diagonal; all
    where the diagonal's offset is read at run time, a decode step's position);
    `rows`: the query rows of a block's head or heads (`attention.query_rows`), the queries of one head if None."""
    tq, tk, _, _ = match.dims
    all_tiles = -(-tk // bkv)
    if not attention.skips_masked_tiles(match) or match.offset_base is not None:   # the latter: known at run time
        return [all_tiles] * -(-(rows or tq) // bq)
    offset = match.causal_offset or 0
    return [min(all_tiles, (min(q0 + bq, tq) - 1 + offset) // bkv + 1) for q0 in range(0, tq, bq)]


def _attention_work(kernel: Kernel, schedule: Schedule, shapes: dict[str, tuple[int, ...]], read_bytes: float,
                    target: Target) -> tuple[Work, float]:
    """Tensor-core FLOPs of S = QK^T and O += PV over the tiles the kernel visits (whole 16-row warp tiles), the
    softmax's FP32 work in tensor-core units, and the K and V tiles every query tile re-reads from the caches."""
    match = _attention_of(kernel)
    _, _, dqk, dv = match.dims
    bq, bkv = schedule["bq"], schedule["bkv"]
    rows, batches = attention.query_rows(match, schedule)
    tiles = sum(_attention_key_tiles(match, bq, bkv, rows))
    scores = float(batches * tiles * bq * bkv)
    tensor_rate = target.wgmma_flops if _attention_on_wgmma(kernel, shapes, schedule) else target.mma_sync_flops
    flops = 2.0 * scores * (dqk + dv) + scores * ATTENTION_SCORE_FLOPS * tensor_rate / target.fp32_flops
    rereads = batches * tiles * bkv * (dqk + dv) * MMA_BYTES
    cache = max(0.0, rereads - read_bytes)
    return Work(flops, (), 1, 0), cache


def _preloadable(kernel: Kernel, out: Node, vec: int) -> set[str]:
    """Float buffers read along the row, whose rows a vec > 1 kernel loads once into registers."""
    length = out.shape[-1]
    return {n.arg for n in kernel.body
            if n.op == Op.INPUT and n.dtype.is_float and n.shape and n.shape[-1] == length and length % vec == 0}


def _evaluations(root: Node, base: float, stops: frozenset[int]) -> dict[int, tuple[Node, float]]:
    """How often each node of `root`'s cone is evaluated in one loop (values reduced cooperatively are registers).

    A node is evaluated once per index its consumers ask for it at: consumers that are elementwise ask at the
    same index (the emitter computes it once), views ask at their own indices, a reduction at each element.
    """
    order = toposort([root], stops)
    same_index: dict[int, float] = {id(root): base}
    own_index: dict[int, float] = {}
    counts: dict[int, tuple[Node, float]] = {}
    for node in reversed(order):
        count = same_index.get(id(node), 0.0) + own_index.get(id(node), 0.0)
        counts[id(node)] = (node, count)
        if id(node) in stops:
            continue
        for src in node.srcs:
            if node.op in REDUCE:   # each element of the row; a lookup reads the one it selects
                length = 1 if match_gather(node) is not None else src.shape[node.arg]
                own_index[id(src)] = own_index.get(id(src), 0.0) + count * length
            elif node.op in VIEWS:
                own_index[id(src)] = own_index.get(id(src), 0.0) + count
            else:
                same_index[id(src)] = max(same_index.get(id(src), 0.0), count)
    return counts


def _flops(node: Node, count: float) -> float:
    if node.op not in COMPUTE:
        return 0.0
    if node.op in REDUCE and match_gather(node) is not None:
        return count            # the select of the one element it reads
    if node.op in REDUCE:
        return count * node.srcs[0].shape[node.arg] if is_inline_reduce(node) else 0.0
    return count * (TRANSCENDENTAL_FLOPS if node.op in UNARY else 1)
