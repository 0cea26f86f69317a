"""The matmul archetype: recognises sum(a * b) over a shared axis and renders it on tensor cores.

`tensorsmith.nn.matmul` lowers a @ b to SUM(MUL(EXPAND(a'), EXPAND(b')), axis=-2) over a (..., M, K, N)
iteration space, where a' is constant along N and b' along M. Any subgraph may sit under the two
operands (a transpose, a cast, an activation): it becomes the prologue of the tile loads. Whatever the
output computes from the sum elementwise (bias, activation, residual) becomes the epilogue.

Three templates: mma.sync fed by cp.async (matmul.cu.j2) takes any operands, float32 ones as 3xTF32 (each
operand split into two TF32 values, three products on the tensor cores: about float32's accuracy); with a wgmma
schedule, operands that are plain fp16/bf16 buffers are copied by TMA into Hopper's warpgroup MMA (matmul_tma.cu.j2),
or by cp.async where TMA cannot address them by tile coordinates (matmul_wgmma.cu.j2).
"""
from __future__ import annotations

import math
import re
from functools import lru_cache

from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node, squeezed
from tensorsmith.ir.ops import VIEWS, Op
from tensorsmith.ir.patterns import MatmulMatch, lookup_table, match_gather, match_matmul
from tensorsmith.ir.targets import TARGETS

from .emit import Emitter, Gathered, Index, NotFusable, delinearize, linear_index, pair_store
from .declare import PYTHON
from .spaces import (MATMUL, MMA_BYTES, SM_COUNT, VECTOR_BYTES, WGMMA_ALIGN, matmul_pad, matmul_shared_bytes,
                     split_partial_bytes, wgmma_shared_bytes)
from .tensor_map import TensorMapSpec

MMA_TYPES = {DType.FLOAT16: ("__half", "__float2half_rn"), DType.BFLOAT16: ("__nv_bfloat16", "__float2bfloat16_rn")}
# the matmul's tile element types: the 16-bit ones, and float32 kept as it is in shared memory (3xTF32)
MATMUL_TYPES = {**MMA_TYPES, DType.FLOAT32: ("float", "")}
MIN_DIM = 16   # one tensor-core fragment; smaller products stay on the CUDA cores
WGMMA_ARCH = "sm_90a"   # wgmma needs the architecture-specific target
WGMMA_BK = 64           # K elements per tile: one 128-byte swizzled row
WGMMA_BLOCK_BYTES = 64 * 128   # one 64 x 64 block of 16-bit elements
TMA_MAX_RANK = 5
# persistent kernels are rendered for min(work, SM_COUNT) blocks that walk the tiles blockIdx.x, + gridDim.x, ...
# (correct for any grid); the executor launches at most one per SM of the GPU it runs on (executor.launch_grid)


SHARED_LIMIT = TARGETS["sm90"].shared_bytes_per_block   # dynamic shared memory a Hopper block may opt in to


def shared_bytes(bm: int, bn: int, bk: int, stages: int, a_major: str = "k", b_major: str = "n",
                 split_k: int = 1, operand_bytes: int = MMA_BYTES) -> int:
    """matmul.cu.j2's dynamic shared memory for these operand layouts (spaces.matmul_shared_bytes)."""
    return int(matmul_shared_bytes(PYTHON, bm, bn, bk, stages, a_major, b_major, split_k, operand_bytes))


def chunk(dtype: DType) -> int:
    """Elements of `dtype` in one 16-byte copy."""
    return VECTOR_BYTES // dtype.itemsize


def tensor_core_match(node: Node) -> MatmulMatch | None:
    """A matmul that the tensor cores can take: fp16, bf16 or float32 operands of one dtype, every dimension >= 16
    (a lookup written as a one-hot product is no matmul: it reads one row)."""
    match = match_matmul(node)
    if (match is None or match_gather(node) is not None or match.lhs.dtype != match.rhs.dtype
            or match.lhs.dtype not in MATMUL_TYPES):
        return None
    return match if min(match.dims) >= MIN_DIM else None


def kernel_matmul(kernel: Kernel) -> MatmulMatch | None:
    """The tensor-core matmul a kernel computes (the first sum of its body that is one), or None."""
    return next((m for n in kernel.body if n.op == Op.SUM and (m := tensor_core_match(n)) is not None), None)


def matmul_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> dict:
    """The template context of a matmul kernel: the prologue loads, the epilogue, and the launch shape."""
    plan = _matmul_plan(kernel.name, kernel.outputs, tuple(sorted(shapes.items())))
    coords, load_a, value_a, load_b, value_b = (plan[key] for key in ("coords", "load_a", "value_a", "load_b", "value_b"))
    a_major, b_major, copy_a, copy_b, epilogue = (plan[key] for key in ("a_major", "b_major", "copy_a", "copy_b",
                                                                         "epilogue"))
    match: MatmulMatch = plan["match"]
    m, n, k = match.dims
    bm, bn, bk, stages, split_k = (schedule[p] for p in ("bm", "bn", "bk", "stages", "split_k"))
    mma_type, to_mma = MATMUL_TYPES[match.lhs.dtype]
    operand_bytes, tf32x3 = match.lhs.dtype.itemsize, match.lhs.dtype == DType.FLOAT32
    a_layout, b_layout = ("k" if a_major == "kk" else "m"), ("n" if b_major == "n" else "k")
    copies = " and ".join(name for name, copy in (("A", copy_a), ("B", copy_b)) if copy) or "neither operand"
    products = ("3xTF32: mma.sync m16n8k8 three times per product, float -> float" if tf32x3
                else f"mma.sync m16n8k16, {mma_type} -> float")
    context = {
        "coords": coords, "batches": math.prod(match.batch_shape), "m": m, "n": n, "kdim": k,
        "bm": bm, "bn": bn, "bk": bk, "stages": stages, "split_k": split_k,
        "warps_m": schedule["warps_m"], "warps_n": schedule["warps_n"], "mma_type": mma_type, "to_mma": to_mma,
        "tf32x3": tf32x3, "operand_bytes": operand_bytes, "pad_a": matmul_pad(operand_bytes, a_layout == "k"),
        "pad_b": matmul_pad(operand_bytes, b_layout == "k"),
        "load_a": "\n".join(load_a), "value_a": value_a, "load_b": "\n".join(load_b), "value_b": value_b,
        "a_major": a_layout, "b_major": b_layout, "copy_a": copy_a, "copy_b": copy_b,
        "picked_per_block": [copy for copy in (copy_a, copy_b) if copy and copy.get("per_block")],
        "computed_a": plan["computed_a"], "computed_b": plan["computed_b"],
        "epilogue": "\n".join(epilogue.lines), "pair_store": plan["pair_store"],
        # wgmma epilogues: 16-byte stores (a quad of lanes transposes its pairs by shuffles) where N is a multiple of 8
        "wide_store": plan["pair_store"] is not None and n % 8 == 0,
        "block": (32 * schedule["warps_m"] * schedule["warps_n"], 1, 1),
        "grid": (-(-n // bn), -(-m // bm), math.prod(match.batch_shape) * split_k),
        "shared_bytes": shared_bytes(bm, bn, bk, stages, a_layout, b_layout, split_k, operand_bytes),
        **({"cluster": (1, 1, split_k)} if split_k > 1 else {}),
        "strategy": (f"{bm}x{bn} tiles on tensor cores ({products}), K in steps of "
                     f"{bk} through a {stages}-stage cp.async pipeline ({copies} copied asynchronously)"
                     + (f", K split between the {split_k} blocks of a cluster" if split_k > 1 else "")),
    }
    if schedule.as_dict().get("wgmma"):
        broken = MATMUL.violation(schedule)
        if broken is not None:
            raise ValueError(f"{schedule} is not a matmul schedule: it breaks the rule '{broken}'")
        if _takes_wgmma(plan):   # else mma.sync under the same tile (see takes_wgmma)
            wgmma = {**context, **_wgmma(context)}
            tma = _tma(wgmma, batch_names=[name for name, _ in coords])
            if tma or split_k == 1:   # the cp.async wgmma template does not split K: mma.sync does
                context.update({**wgmma, **tma})
                return context
        # mma.sync under a wgmma schedule: its padded tiles may not fit as deep a ring as wgmma's unpadded ones
        while context["stages"] > 2 and context["shared_bytes"] > SHARED_LIMIT:
            deep, fewer = context["stages"], context["stages"] - 1
            context.update(stages=fewer, shared_bytes=shared_bytes(bm, bn, bk, fewer, a_layout, b_layout, split_k,
                                                                   operand_bytes),
                           strategy=context["strategy"].replace(f"a {deep}-stage", f"a {fewer}-stage"))
    return context


def takes_wgmma(kernel: Kernel, shapes: dict) -> bool:
    """Whether a wgmma schedule renders `kernel` with wgmma: both operands plain 16-byte copies of 16-bit buffers.

    A schedule with wgmma=1 for operands that are not (a prologue to compute, a contiguous axis not in whole
    16-byte chunks, float32) is not an error: the kernel falls back to mma.sync under the same tile (every valid wgmma
    schedule is a valid mma.sync one), so search needs no operand facts to stay sound.
    """
    return _takes_wgmma(_matmul_plan(kernel.name, kernel.outputs, tuple(sorted(shapes.items()))))


def _takes_wgmma(plan: dict) -> bool:
    return plan["copy_a"] is not None and plan["copy_b"] is not None and plan["match"].lhs.dtype in MMA_TYPES


def _wgmma(context: dict) -> dict:
    """What the wgmma template (matmul_wgmma.cu.j2, sm_90a) changes in the context: BM / 64 warpgroups."""
    bm, bn, bk, stages = context["bm"], context["bn"], context["bk"], context["stages"]
    return {
        "template": "matmul_wgmma", "arch": WGMMA_ARCH, "block": (128 * (bm // 64), 1, 1),
        "shared_bytes": wgmma_shared_bytes(bm, bn, bk, stages),
        "strategy": (f"{bm}x{bn} tiles on Hopper's warpgroup MMA (wgmma m64n{bn}k16 from 128-byte swizzled shared "
                     f"memory, {context['mma_type']} -> float), K in steps of {bk} through a {stages}-stage cp.async "
                     f"pipeline"),
    }


def _tma(context: dict, batch_names: list[str]) -> dict:
    """What the TMA template (matmul_tma.cu.j2) changes in a wgmma context, where both operands are buffers
    indexed by plain tile and batch coordinates (else nothing: the cp.async wgmma template stays). Without a split
    of K the kernel is persistent: a grid of min(output tiles, SM_COUNT) blocks, each walking several tiles."""
    a = _tma_operand(context["copy_a"], "m", "block_m", context["bm"], batch_names, 0, "s_a")
    b = _tma_operand(context["copy_b"], "n", "block_n", context["bn"], batch_names, 1, "s_b")
    if a is None or b is None:
        return {}
    (spec_a, loads_a), (spec_b, loads_b) = a, b
    threads, split_k = context["block"][0] + 128, context["split_k"]
    partials = split_partial_bytes(context["bm"], context["bn"]) + WGMMA_ALIGN   # split K: fp32 partial sums
    tiles_n, tiles_m, _ = context["grid"]
    tiles = tiles_n * tiles_m * context["batches"]   # output tiles over all batches
    persistent = split_k == 1   # else the cluster's blocks meet once, over their one tile
    how = ("warp-specialised (one producer warpgroup, BM / 64 consumer warpgroups)"
           + (f" and persistent ({min(tiles, SM_COUNT)} blocks walk the {tiles} output tiles; the producer loads the "
              f"next tile's K tiles while the consumers run the epilogue)" if persistent else ""))
    return {
        "template": "matmul_tma", "block": (threads, 1, 1), "tensor_maps": [spec_a, spec_b],
        "tma_loads": loads_a + loads_b, "tma_ranks": sorted({len(spec_a.dims), len(spec_b.dims)}),
        "shared_bytes": max(context["shared_bytes"], partials) if split_k > 1 else context["shared_bytes"],
        "persistent": persistent, "tiles": tiles,
        **({"grid": (min(tiles, SM_COUNT), 1, 1)} if persistent else {}),
        "strategy": context["strategy"].replace("cp.async pipeline", f"TMA pipeline, {how}")
                    + (f", K split between the {split_k} blocks of a cluster" if split_k > 1 else ""),
    }


def _tma_operand(copy: dict, tile_axis: str, tile_start: str, tile: int, batch_names: list[str], map_index: int,
                 stage: str) -> tuple[TensorMapSpec, list[dict]] | None:
    """The tensor map of one operand and the TMA copies of one K tile into its stage, as matmul_wgmma.cu.j2 lays
    the stage out: K-major, one box of `tile` rows x 64 K; MN-major, tile / 64 boxes of 64 K rows x 64."""
    where, shape = copy["where"], copy["shape"]
    plain = set(batch_names) | {"0", tile_axis, "kk"}
    if len(shape) > TMA_MAX_RANK or not set(where) <= plain or where.count(tile_axis) != 1 or where.count("kk") != 1:
        return None
    k_major = where[-1] == "kk"
    extent = {"kk": WGMMA_BK, tile_axis: tile if k_major else 64}   # the box: 128 contiguous bytes x rows
    spec = TensorMapSpec.of_buffer(copy["buffer"], shape, [extent.get(name, 1) for name in reversed(where)])
    starts = {"kk": "k0", "0": "0", tile_axis: f"(int){tile_start}", **{name: f"(int){name}" for name in batch_names}}
    if k_major:
        blocks = [(0, starts)]
    else:
        blocks = [(j * WGMMA_BLOCK_BYTES, {**starts, tile_axis: f"(int){tile_start} + {64 * j}"})
                  for j in range(tile // 64)]
    loads = [{"map": map_index, "dst": f"{stage} + {offset}", "coords": [coords[name] for name in reversed(where)]}
             for offset, coords in blocks]
    return spec, loads


@lru_cache(maxsize=1024)
def _matmul_plan(kernel_name: str, outputs: tuple, shapes_key: tuple) -> dict:
    """What does not depend on the schedule: the match, the operands' loads and copy plans, the epilogue
    (search prices hundreds of schedules per kernel, so this is shared between them)."""
    kernel = Kernel(kernel_name, "matmul", outputs)
    shapes = dict(shapes_key)
    if len(kernel.outputs) != 1:
        raise NotFusable(kernel.outputs[1][1], "a matmul kernel writes one output")
    name, out = kernel.outputs[0]
    reduces = [n for n in kernel.body if n.op in (Op.SUM, Op.MAX) and tensor_core_match(n)]
    match = tensor_core_match(reduces[0]) if reduces else None
    if match is None or squeezed(out.shape) != squeezed(match.reduce.shape):
        raise NotFusable(reduces[0] if reduces else out, "the output is not elementwise over one matmul")
    batch = tuple(f"b{axis}" for axis in range(len(match.batch_shape)))
    at = batch + ("m", "n")
    out_at = _output_index(out.shape, match.reduce.shape, at)
    coords = list(zip(batch, delinearize("batch", match.batch_shape)))
    load_a, value_a, a_major, copy_a = _operand(shapes, match.lhs, batch + ("m", "kk", "0"), ("kk", "m"))
    load_b, value_b, b_major, copy_b = _operand(shapes, match.rhs, batch + ("0", "kk", "n"), ("n", "kk"))
    computed = {"computed_a": not _plain_load(load_a), "computed_b": not _plain_load(load_b)}
    m, n, k = match.dims
    fast, elements = {"kk": k, "m": m, "n": n}, chunk(match.lhs.dtype)
    copy_a = copy_a if fast[a_major] % elements == 0 else None   # whole 16-byte chunks, in or out of the matrix
    copy_b = copy_b if fast[b_major] % elements == 0 else None
    epilogue = Emitter(shapes, indent=5)
    epilogue.reduced[id(match.reduce)] = (at, "acc_value")
    epilogue.store(name, out.dtype, out_at, epilogue.value(out, out_at))
    return {"match": match, "coords": coords, "load_a": load_a, "value_a": value_a, "load_b": load_b,
            "value_b": value_b, "a_major": a_major, "b_major": b_major, "copy_a": copy_a, "copy_b": copy_b,
            "epilogue": epilogue, "pair_store": _pair_store(shapes, match, name, out, at, out_at), **computed}


def _output_index(out: tuple[int, ...], product: tuple[int, ...], names: tuple[str, ...]) -> tuple[str, ...]:
    """The output's index where it has the product's axes (at `names`) but for unit ones that come or go on the way
    (a model's (1, T, N) view of its (T, N) product): the epilogue computes the output at the product's element and
    stores it at the same offset, with no copy kernel after (the emitter reads a unit axis at any index)."""
    if out == product:
        return names
    kept = iter(name for name, size in zip(names, product) if size != 1)
    return tuple("0" if size == 1 else next(kept) for size in out)


def _plain_load(lines: list[str]) -> bool:
    """Whether an operand's statements are one load and nothing computed from it (it may still not be copyable)."""
    return len(lines) == 1


def _pair_store(shapes: dict, match: MatmulMatch, name: str, out: Node, at: tuple[str, ...],
                out_at: tuple[str, ...]) -> dict | None:
    """The epilogue as a value of (m, n, acc_value), for the wgmma templates to store two neighbouring columns
    with one 4-byte store, where the output is 16-bit and N is even; else None."""
    if match.dims[1] % 2:
        return None
    emitter = Emitter(shapes, indent=1)
    emitter.reduced[id(match.reduce)] = (at, "acc_value")
    return pair_store(emitter, emitter.value(out, out_at), name, out.dtype, out_at)


def _operand(shapes: dict, node: Node, index: tuple[str, ...],
             axes: tuple[str, str]) -> tuple[list[str], str, str, dict | None]:
    """One operand at `index`: its statements, its value, which tile axis is contiguous, and a copy plan.

    The contiguous axis is the one that indexes the innermost dimension of the operand's largest load,
    so that consecutive threads of the tile loader read consecutive addresses. The copy plan is set when
    the operand is nothing but a load of a buffer of the tensor cores' dtype, contiguous along that axis
    in whole 16-byte chunks: then tiles are copied 16 bytes at a time, with no conversion.
    """
    emitter = Emitter(shapes, indent=3)
    value = emitter.value(node, index)
    loads = sorted((access for access in emitter.accesses if access[1]), key=lambda access: -access[0].size)
    innermost = loads[0][1][-1] if loads else axes[0]      # (a scalar's load, at index (), has no axis)
    major = axes[1] if innermost == axes[1] else axes[0]
    copy = None
    if len(loads) == 1 and len(emitter.accesses) == 1 and len(emitter.lines) == 1 and loads[0][0].dtype == node.dtype:
        copy = _copy_plan(shapes, *loads[0], major, node.dtype)
    elif (gathered := _gathered_rows(emitter, node)) is not None:
        table = [(leaf, where) for leaf, where in loads if gathered.row in where]
        if len(table) == 1 and table[0][0].dtype == node.dtype:
            copy = _copy_plan(shapes, *table[0], major, node.dtype)
            if copy is not None:
                lines = "\n".join(emitter.lines[:gathered.lines])
                copy.update(lines=lines, valid=gathered.valid, per_block=not _reads_any(lines + gathered.valid, axes))
    return emitter.lines, value, major, copy


def _reads_any(code: str, names: tuple[str, ...]) -> bool:
    """Whether the statements read any of the variables `names` (a tile loader's element coordinates): those that
    read none select the same rows for the whole block (a tile's expert), and are computed once for it."""
    return re.search(r"\b(" + "|".join(names) + r")\b", code) is not None


def _copy_plan(shapes: dict, leaf: Node, where: Index, major: str, dtype: DType) -> dict | None:
    """The copy of an operand read from `leaf` at `where` in 16-byte chunks along `major`, where it is contiguous."""
    shape = shapes[leaf.arg]
    while len(shape) > 1 and shape[-1] == 1 and where[-1] == "0":   # a matrix kept with a trailing unit axis
        shape, where = shape[:-1], where[:-1]
    if where[-1] != major or shape[-1] % chunk(dtype) != 0:
        return None
    return {"buffer": leaf.arg, "offset": linear_index(where, shape), "where": where, "shape": shape, "lines": "",
            "valid": ""}   # a gathered operand's: the statements that select its row, and when that row is there


def _gathered_rows(emitter: Emitter, node: Node) -> Gathered | None:
    """The one lookup an operand is, through views, where the emitter read nothing but its ids and its table's row:
    the rows of an expert's weight that a tile of routed tokens selects. Its tiles are copied as a buffer's are, from
    the selected row (its statements first), and zero-filled where the id is out of the table."""
    while node.op in VIEWS:
        node = node.srcs[0]
    if len(emitter.gathers) != 1 or emitter.gathers[0].lookup.reduce is not node:
        return None
    return emitter.gathers[0] if lookup_table(emitter.gathers[0].lookup) is not None else None
