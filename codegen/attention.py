"""The attention archetype: softmax(score(q @ k^T)) @ v as one streaming kernel on tensor cores (FlashAttention-2).

`ir.patterns.match_attention` finds the parts: the q, k and v operands, the score function s of the raw
dot product and of the indices (a scale, a causal mask, ...), the row max and the exponential of the
softmax, and the normalisation. The kernel never writes the scores: each block keeps the Q fragments of
its query rows in registers and streams the K and V tiles of its batch through shared memory, keeping a
running max, a running sum and the unnormalised output per row (the online softmax). Whatever the output
computes from the attention result elementwise (a cast, a residual) becomes the epilogue.

Two variants share the template: prefill (BQ = 64 or 128 queries per block, one warp per 16 rows, every
warp streaming every key tile) and decode (BQ = 16: the block's warps split the key tiles between them and
merge their partial results in shared memory at the end), for few queries per head.

On Hopper a schedule with wgmma = 1 renders attention_tma.cu.j2 instead (FlashAttention-3's design: TMA copies
from a producer warpgroup, wgmma for both products) where TMA can address q, k and v by (head dim, row, batch)
coordinates and the sizes fit its tiling; elsewhere the same schedule renders the mma.sync template.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tensorsmith.ir import primitives as P
from tensorsmith.ir.dtypes import DType
from tensorsmith.ir.kernel_program import Kernel, Schedule
from tensorsmith.ir.node import Node, toposort
from tensorsmith.ir.ops import REDUCE, Op
from tensorsmith.ir.patterns import MASK_LIMIT, AttentionMatch, attention_index, match_attention

from .emit import (Emitter, NotFusable, c_literal, delinearize, is_inline_reduce, pair_store, row_major_strides,
                   stored_through_views)
from .declare import PYTHON
from .matmul import MMA_TYPES, SHARED_LIMIT, TMA_MAX_RANK, WGMMA_ARCH
from .spaces import (MMA_BYTES, SM_COUNT, TMA_BQ, TMA_STAGES, attention_registers,
                     attention_shared_bytes, attention_split, attention_tma_shared_bytes, attention_warps)
from .tensor_map import TensorMapSpec

HEAD_DIM_STEP = 16     # one k16 step of Q K^T and one pair of n8 output tiles
MAX_HEAD_DIM = 256     # the output accumulators of a row (DV / 2 floats per thread) must stay in registers
CHUNK = 8              # fp16/bf16 elements in one 16-byte copy
TMA_THREADS = 128 * (TMA_BQ // 64 + 1)   # and the producer warpgroup
TMA_PINGPONG = True    # the consumer warpgroups take turns to issue their MMAs
TMA_MAX_DV = 128       # a consumer thread holds DV / 2 output accumulators besides BKV / 2 scores


def attention_match(node: Node) -> AttentionMatch | None:
    """An attention the template takes: q, k and v of one tensor-core dtype, head dims multiples of 16 up to 256."""
    match = match_attention(node)
    if match is None or len({match.q.dtype, match.k.dtype, match.v.dtype}) != 1 or match.v.dtype not in MMA_TYPES:
        return None
    _, _, dqk, dv = match.dims
    if dqk % HEAD_DIM_STEP or dv % HEAD_DIM_STEP or max(dqk, dv) > MAX_HEAD_DIM:
        return None
    return match


def kernel_attention(root: Node) -> AttentionMatch | None:
    """The attention that a kernel's output `root` is elementwise over (same shape, no reduction between), or None;
    the output may be a permuted or reshaped view of such a value (`stored_through_views`)."""
    root, _, _ = stored_through_views(root)
    for node in reversed(toposort([root])):
        if (node.op == Op.SUM and node.shape == root.shape and (match := attention_match(node)) is not None
                and _elementwise_over(root, node)):     # (the walk last: a deep body has many sums of its shape)
            return match
    return None


def _elementwise_over(root: Node, output: Node) -> bool:
    """Whether nothing between `root` and `output` reduces cooperatively: a product of an attention of its shape
    (attention(q, k, v) @ w, w square) has that shape too, but the attention kernel's epilogue cannot compute it."""
    above = {id(output)}
    for node in toposort([root], {id(output)}):
        if node is not output and any(id(src) in above for src in node.srcs):
            if node.op in REDUCE and not is_inline_reduce(node):
                return False
            above.add(id(node))
    return True


def skips_masked_tiles(match: AttentionMatch) -> bool:
    """Whether key tiles past the causal diagonal may be skipped: every row keeps key 0 (offset >= 0; where the
    offset is read at run time, checked then), and a masked score lies so far below it (mask * exp scale <=
    MASK_LIMIT) that its probability is exactly 0."""
    offset = match.causal_offset
    return (offset is not None and (offset >= 0 or match.offset_base is not None)
            and match.mask_value * match.exp_scale <= MASK_LIMIT)


def warps_and_split(bq: int) -> tuple[int, int]:
    """(warps per block, warps that share each query row): one warp per 16 rows, or decode's split of the keys."""
    return attention_warps(PYTHON, bq), attention_split(PYTHON, bq)


def shared_bytes(bq: int, bkv: int, dqk: int, dv: int) -> int:
    """attention.cu.j2's dynamic shared memory (spaces.attention_shared_bytes)."""
    return int(attention_shared_bytes(PYTHON, bq, bkv, dqk, dv))


def registers_per_thread(bkv: int, dqk: int, dv: int) -> int:
    """attention.cu.j2's registers per thread, estimated (spaces.attention_registers)."""
    return int(attention_registers(PYTHON, bkv, dqk, dv))


def attention_body(kernel: Kernel, shapes: dict, schedule: Schedule) -> dict:
    """The template context of an attention kernel: operand rows, score function, epilogue and launch shape."""
    if len(kernel.outputs) != 1:
        raise NotFusable(kernel.outputs[1][1], "an attention kernel writes one output")
    name, out = kernel.outputs[0]
    match = kernel_attention(out)
    if match is None:
        raise NotFusable(out, "the output is not elementwise over one attention")
    tq, tk, dqk, dv = match.dims
    names = attention_index(match.output.srcs[0].shape, ("qi", "kj", "hd"))
    batch, (qn, kn) = names[:-3], names[-3:-1]
    stacked = _stacking(match, schedule)
    heads, q_batch, query, rows_per_head = match.batch_shape, batch, qn, tq
    if stacked is not None:   # a block's rows: the queries of the `group` query heads that share one kv head
        axis, group = stacked
        heads = heads[:axis] + (heads[axis] // group,) + heads[axis + 1:]
        q_batch = batch[:axis] + (f"({batch[axis]}) * {group} + (qi) / {tq}",) + batch[axis + 1:]   # qi: the row
        query, rows_per_head = (f"(qi) % {tq}" if tq > 1 else "0"), tq * group
    coords = [(b, expr) for b, expr in zip(batch, delinearize("batch", heads)) if b != "0"]
    rows = {"q": _row_load(match.q, q_batch + (query, "hd", "0"), match),
            "k": _row_load(match.k, batch + ("0", "hd", kn), match, divide=stacked is None),
            "v": _row_load(match.v, batch + ("0", kn, "hd"), match, divide=stacked is None)}
    # a score that loads an input reads the last row's or key's where the kernel computes past the end (and
    # discards the score), not past the input's end
    score_q, score_k = (query, kn) if not _reads_input(match) else (f"({query} < TQ ? {query} : TQ - 1)",
                                                                     f"({kn} < TK ? {kn} : TK - 1)")
    score = _score_code(shapes, match, match.score, q_batch + (score_q, score_k))
    offset = match.causal_offset
    unmasked = None
    if match.mask is not None:      # tiles every query of a warp sees whole skip the mask's arithmetic
        unmasked = _score_code(shapes, match, _unmasked_score(match.score, match.mask), batch + (score_q, score_k))
    skip = skips_masked_tiles(match)
    runtime_offset = _runtime_offset(shapes, match) if match.mask is not None else None
    bq, bkv = schedule["bq"], schedule["bkv"]
    warps, split = warps_and_split(bq)
    batches = math.prod(heads)
    mma_type, _ = MMA_TYPES[match.v.dtype]
    of_heads = "a head" if stacked is None else "a group of heads"
    how = (f"one block per {bq} queries of {of_heads}, {warps} warps; K and V tiles of {bkv} keys double-buffered by"
           f" cp.async; S = QK^T and O += PV on tensor cores (mma.sync m16n8k16, {mma_type} -> float), online"
           " softmax in registers")
    if split > 1:
        how += f"; the {split} warps split the key tiles and merge their partial results in shared memory"
    if skip:
        how += "; key tiles past the causal diagonal skipped"
    if skip and runtime_offset is not None:
        how += " (the keys past the position read at run time: a decode step reads its cache up to the position)"
    if stacked is not None:
        how += (f"; the {stacked[1]} query heads of each kv head stacked as its {rows_per_head} query rows, so that"
                " its K and V are read once")
    context = {
        "coords": coords, "batch": batches, "tq": rows_per_head, "tk": tk, "dqk": dqk, "dv": dv, "bq": bq, "bkv": bkv,
        "warps": warps, "split": split, "mma_type": mma_type, **rows,
        "score": score, "score_unmasked": unmasked, "mask_offset": offset if match.mask is not None else None,
        "runtime_offset": runtime_offset, "skip_masked": skip, "exp_scale": c_literal(match.exp_scale, DType.FLOAT32),
        "epilogue": _epilogue(shapes, match, name, out, q_batch, query),
        "pair_store": _pair_store(shapes, match, name, out, q_batch, query),
        "block": (32 * warps, 1, 1), "grid": (-(-rows_per_head // bq) * batches, 1, 1),
        "shared_bytes": shared_bytes(bq, bkv, dqk, dv), "strategy": how,
    }
    if schedule.as_dict().get("wgmma"):   # else (or where TMA cannot take the operands) mma.sync, as above
        context.update(_tma(match, batch, qn, kn, context))
    return context


def _runtime_offset(shapes: dict, match: AttentionMatch) -> dict | None:
    """Statements computing the mask's offset base at run time (`AttentionMatch.offset_base`), and its value as
    idx_t, or None where the offset is a constant."""
    if match.offset_base is None:
        return None
    emitter = Emitter(shapes, indent=1)
    value = emitter.value(match.offset_base, ("0",) * match.offset_base.ndim)
    return {"lines": "\n".join(emitter.lines), "value": f"(idx_t)({value})"}


def stacked_heads(match: AttentionMatch) -> tuple[int, int] | None:
    """(batch axis, group) where k and v are both read through one grouped-query head axis (`Strided`) and no mask
    or input read by the score depends on the query: then the `group` query heads that share a kv head can be one
    block's query rows, their queries stacked, and the kv head's K and V tiles serve them all (else each query head
    reads them again)."""
    if match.mask is not None or _reads_input(match):
        return None
    k, v = _strided(match.k), _strided(match.v)
    if k is None or v is None:
        return None
    grouped = {tuple((axis, group) for axis, group in enumerate(layout.groups) if group != 1) for layout in (k, v)}
    if len(grouped) != 1:
        return None
    (axes,) = grouped
    return axes[0] if len(axes) == 1 and axes[0][0] < len(match.batch_shape) else None


def _reads_input(match: AttentionMatch) -> bool:
    """Whether the score loads an input (a bias, a padding mask) besides q and k."""
    return any(node.op == Op.INPUT for node in toposort([match.score], {id(match.qk.reduce)}))


def query_rows(match: AttentionMatch, schedule: Schedule) -> tuple[int, int]:
    """(query rows per block row range, how many such ranges): each head's queries, or where `stacked_heads` applies
    (mma.sync), the queries of each kv head's query heads together."""
    tq = match.dims[0]
    heads = math.prod(match.batch_shape)
    stacked = _stacking(match, schedule)
    return (tq, heads) if stacked is None else (tq * stacked[1], heads // stacked[1])


def _stacking(match: AttentionMatch, schedule: Schedule) -> tuple[int, int] | None:
    """`stacked_heads` where the schedule does not ask for wgmma (attention_tma.cu.j2 copies each head's own rows)."""
    return None if schedule.as_dict().get("wgmma") else stacked_heads(match)


def wgmma_stages(bq: int, bkv: int, dqk: int, dv: int) -> int:
    """The deepest ring of K and V tiles that attention_tma.cu.j2 fits in shared memory."""
    fits = [s for s in TMA_STAGES if attention_tma_shared_bytes(bq, bkv, dqk, dv, s) <= SHARED_LIMIT]
    return fits[0] if fits else TMA_STAGES[-1]


def wgmma_shared_bytes(bq: int, bkv: int, dqk: int, dv: int) -> int:
    """Dynamic shared memory of attention_tma.cu.j2: the Q tile, its ring of K and V tiles, 1024 bytes to align."""
    return attention_tma_shared_bytes(bq, bkv, dqk, dv, wgmma_stages(bq, bkv, dqk, dv))


def takes_wgmma(bq: int, bkv: int, dqk: int, dv: int) -> bool:
    """Whether attention_tma.cu.j2's tiling takes these sizes: two consumer warpgroups of 64 query rows, key
    tiles and head dims in whole 64-element boxes, the output accumulators of a row within a warpgroup's share."""
    return (bq == TMA_BQ and bkv in (64, 128) and dqk % 64 == 0 and dv % 64 == 0 and dv <= TMA_MAX_DV
            and wgmma_shared_bytes(bq, bkv, dqk, dv) <= SHARED_LIMIT)


def _tma(match: AttentionMatch, batch: tuple[str, ...], qn: str, kn: str, context: dict) -> dict:
    """What attention_tma.cu.j2 (Hopper: wgmma fed by TMA) changes in the context, where its tiling takes the
    sizes and each operand is a buffer TMA can address by (head dim, row, batch) coordinates; else nothing."""
    bq, bkv, dqk, dv = context["bq"], context["bkv"], context["dqk"], context["dv"]
    if not takes_wgmma(bq, bkv, dqk, dv) or context["runtime_offset"] is not None:   # the latter: mma.sync's alone
        return {}
    extents = {name: extent for name, extent in zip(batch, match.batch_shape) if name != "0"}
    operands = [(match.q, batch + (qn, "hd", "0"), qn, context["tq"], dqk, bq, "s_q"),
                (match.k, batch + ("0", "hd", kn), kn, context["tk"], dqk, bkv, "s_k"),
                (match.v, batch + ("0", kn, "hd"), kn, context["tk"], dv, bkv, "s_v")]
    starts = {qn: "(int)q0", kn: "(int)k0", **{name: f"(int){name}" for name in extents}}
    specs, loads = [], {}
    for index, (node, where, row, length, dim, rows, stage) in enumerate(operands):
        plan = _tma_operand(node, where, row, {**extents, row: length, "hd": dim}, rows)
        if plan is None:
            return {}
        spec, names = plan
        specs.append(spec)
        loads[f"{stage[-1]}_loads"] = [   # one box per 64 columns of the head dim, BQ or BKV rows each
            {"map": index, "dst": f"{stage} + {block * rows * 128}",
             "coords": [str(64 * block) if name == "hd" else starts[name] if group == 1
                        else f"{starts[name]} / {group}" for name, group in names]}
            for block in range(dim // 64)]
    consumers, stages = bq // 64, wgmma_stages(bq, bkv, dqk, dv)
    tiles = -(-context["tq"] // bq) * context["batch"]
    blocks = min(SM_COUNT, -(-tiles // 2))
    how = (f"persistent: {blocks} blocks walk the {tiles} tiles of {bq} queries of a head in pairs of equal work"
           f" (a head's longest and shortest causal rows); a producer warpgroup copies Q and K and V tiles of {bkv}"
           f" keys by TMA into rings of {stages}, the next tile's Q as the last scores are done; {consumers}"
           " consumer warpgroups of 64 query rows run"
           f" S = QK^T (wgmma m64n{bkv}k16) and O += PV (wgmma m64n{dv}k16, P from registers), {context['mma_type']}"
           " -> float, the online softmax in registers while the previous tile's PV runs"
           + ("; the consumers take turns to issue" if TMA_PINGPONG else ""))
    if context["skip_masked"]:
        how += "; key tiles past the causal diagonal skipped"
    return {"template": "attention_tma", "arch": WGMMA_ARCH, "stages": stages, "block": (TMA_THREADS, 1, 1),
            "grid": (blocks, 1, 1), "persistent": True,
            "pingpong": TMA_PINGPONG,
            "shared_bytes": wgmma_shared_bytes(bq, bkv, dqk, dv), "tensor_maps": specs,
            "tma_ranks": sorted({len(spec.dims) for spec in specs}), **loads, "strategy": how}


def _tma_operand(node: Node, index: tuple[str, ...], row: str, extents: dict[str, int],
                 box_rows: int) -> tuple[TensorMapSpec, list[tuple[str, int]]] | None:
    """The tensor map of one operand, dimensions innermost first (the head dim, then by stride), and their index
    names with their groups (a grouped-query head axis: the coordinate is the head / group); None where TMA cannot
    copy it: not a view of an input buffer from its start, a broadcast or repeated axis, the head dim not
    contiguous, or a stride not in whole 16-byte steps."""
    layout = _strided(node)
    if layout is None or layout.base.op != Op.INPUT or layout.offset != 0:
        return None
    terms = [(name, stride, group) for name, stride, group in zip(index, layout.strides, layout.groups) if name != "0"]
    names = [name for name, _, _ in terms]
    if (len(set(names)) != len(names) or len(terms) > TMA_MAX_RANK or ("hd", 1, 1) not in terms or row not in names
            or any(group != 1 and name == row for name, _, group in terms)
            or any(stride == 0 or stride % CHUNK for name, stride, _ in terms if name != "hd")):
        return None
    ordered = sorted(terms, key=lambda term: (term[0] != "hd", term[1]))
    spec = TensorMapSpec(layout.base.arg, tuple(extents[name] // group for name, _, group in ordered),
                         tuple(MMA_BYTES * stride for _, stride, _ in ordered[1:]),
                         tuple(64 if name == "hd" else box_rows if name == row else 1 for name, _, _ in ordered))
    return spec, [(name, group) for name, _, group in ordered]


def _row_load(node: Node, index: tuple[str, ...], match: AttentionMatch, divide: bool = True) -> dict:
    """Where one row of an operand starts in its buffer: the operand must be views of a buffer of the tensor
    cores' dtype, contiguous along the head dimension in 16-byte chunks; otherwise NotFusable names the node to
    give a buffer of its own. Without `divide`, a grouped axis's index is already the shared head's."""
    layout = _strided(node)
    if layout is not None and layout.base.op == Op.INPUT:
        if not divide:
            layout = dataclasses.replace(layout, groups=(1,) * len(layout.groups))
        rows = _row_offset(index, layout)
        if rows is not None:
            return {"buffer": layout.base.arg, "offset": rows}
    raise NotFusable(_own_buffer(node, index, match),
                     "an attention operand must be a load contiguous along the head dimension")


def _own_buffer(node: Node, index: tuple[str, ...], match: AttentionMatch) -> Node:
    """The node under an operand's views that, in a buffer of its own, is contiguous along the head dimension;
    where there is none, the score matmul (the scores then get a kernel of their own)."""
    layout = _strided(node)
    if layout is None or layout.base.op in (Op.INPUT, Op.CONSTANT, Op.IOTA):
        return match.qk.reduce
    return layout.base if _row_offset(index, layout) is not None else match.qk.reduce


def _row_offset(index: tuple[str, ...], layout: Strided) -> str | None:
    """The C offset of (index with hd = 0) where the head dim has stride 1 and every row starts on 16 bytes."""
    terms = [(name, stride, group) for name, stride, group in zip(index, layout.strides, layout.groups)
             if name != "0" and stride != 0]
    if ((("hd", 1, 1) not in terms) or layout.offset % CHUNK
            or any(stride % CHUNK for name, stride, _ in terms if name != "hd")):
        return None
    return " + ".join([f"({name}) * {stride}" if group == 1 else f"(({name}) / {group}) * {stride}"
                       for name, stride, group in terms if name != "hd"] + [str(layout.offset)])


@dataclass(frozen=True)
class Strided:
    """A view as an address: element i of the view is base[offset + sum((i[a] // groups[a]) * strides[a])], in
    elements of `base`'s own row-major buffer. A group above 1 is a broadcast axis merged into the axis before it,
    as grouped-query attention's repeat_kv merges (kv heads, repeats) into heads: head h reads kv head h // repeats."""

    base: Node
    strides: tuple[int, ...]
    offset: int
    groups: tuple[int, ...]

    @property
    def grouped(self) -> bool:
        return any(group != 1 for group in self.groups)


def _strided(node: Node) -> Strided | None:
    """`node` as a strided view of the first node under its views that is not one; None where a view is a pad, or
    a reshape that no strides (and groups) describe."""
    chain = []
    while node.op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE):
        chain.append(node)
        node = node.srcs[0]
    if node.op == Op.PAD:
        return None
    strides, offset = row_major_strides(node.shape), 0
    groups = (1,) * len(strides)
    for view in reversed(chain):
        src = view.srcs[0]
        if view.op == Op.EXPAND:
            strides = tuple(0 if s != d else stride for s, d, stride in zip(src.shape, view.shape, strides))
        elif view.op == Op.PERMUTE:
            strides, groups = tuple(strides[axis] for axis in view.arg), tuple(groups[axis] for axis in view.arg)
        elif view.op == Op.SLICE:
            if any(lo and group != 1 for (lo, _), group in zip(view.arg, groups)):
                return None
            offset += sum(lo * stride for (lo, _), stride in zip(view.arg, strides))
        else:
            reshaped = _reshape_grouped(src.shape, strides, groups, view.shape)
            if reshaped is None:
                return None
            strides, groups = reshaped
    return Strided(node, strides, offset, groups)


def _reshape_grouped(old: tuple[int, ...], strides: tuple[int, ...], groups: tuple[int, ...],
                     new: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(strides, groups) of a reshape: size-1 axes added or dropped keep every axis as it is; otherwise, without
    groups, PyTorch's strides of a reshape, or a broadcast axis merged into the one before it (a group)."""
    kept = [(size, stride, group) for size, stride, group in zip(old, strides, groups) if size != 1]
    sizes = [size for size in new if size != 1]
    if [size for size, _, _ in kept] != sizes:
        if any(group != 1 for group in groups):
            return None
        plain = _reshape_strides(old, strides, new)
        if plain is not None:
            return plain, (1,) * len(new)
        merged = [kept[:axis] + [(size * repeats, stride, repeats)] + kept[axis + 2:]
                  for axis, ((size, stride, _), (repeats, broadcast, _)) in enumerate(zip(kept, kept[1:]))
                  if broadcast == 0]   # (..., a, b, ...) -> (..., a * b, ...) with b broadcast: a group of b
        kept = next((axes for axes in merged if [size for size, _, _ in axes] == sizes), [])
        if not kept:
            return None
    axes = iter(kept)
    out = [(0, 1) if size == 1 else next(axes)[1:] for size in new]
    return tuple(stride for stride, _ in out), tuple(group for _, group in out)


def _reshape_strides(old: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of a reshape of a strided view, where one exists (PyTorch's computeStride): each run of
    old axes that is contiguous in memory may be split or merged freely."""
    if not old:
        return tuple(1 for _ in new)
    out = [0] * len(new)
    view_axis = len(new) - 1
    chunk_stride = strides[-1]
    old_numel, new_numel = 1, 1
    for axis in range(len(old) - 1, -1, -1):
        old_numel *= old[axis]
        if axis == 0 or (old[axis - 1] != 1 and strides[axis - 1] != old_numel * chunk_stride):
            while view_axis >= 0 and (new_numel < old_numel or new[view_axis] == 1):
                out[view_axis] = new_numel * chunk_stride
                new_numel *= new[view_axis]
                view_axis -= 1
            if new_numel != old_numel:
                return None
            if axis > 0:
                chunk_stride = strides[axis - 1]
                old_numel, new_numel = 1, 1
    return tuple(out) if view_axis == -1 else None


def _score_code(shapes: dict, match: AttentionMatch, score: Node, index: tuple[str, ...]) -> dict:
    """Statements computing the score at (query qi, key kj) from the raw dot product `dot`, and its value."""
    emitter = Emitter(shapes, indent=5)
    emitter.reduced[id(match.qk.reduce)] = (index, "dot")
    value = emitter.value(score, index)
    return {"lines": "\n".join(emitter.lines), "value": value}


def _unmasked_score(score: Node, mask: Node) -> Node:
    """The score where the mask is 0: the sum that adds the mask replaced by its other addend (a score of -0.0
    staying -0.0 instead of becoming +0.0 is all that changes), else the mask replaced by a constant 0."""
    for node in toposort([score]):
        if node.op == Op.ADD and any(src is mask for src in node.srcs):
            other = node.srcs[1] if node.srcs[0] is mask else node.srcs[0]
            if other.shape == node.shape and other.dtype == node.dtype:
                return _replaced(score, node, other)
    return _replaced(score, mask, P.constant(0.0, mask.shape, mask.dtype))


def _replaced(root: Node, target: Node, replacement: Node) -> Node:
    """`root` with `target` replaced by `replacement` (the nodes on the way copied, every other node kept)."""
    new: dict[int, Node] = {id(target): replacement}
    for node in toposort([root], {id(target)}):
        srcs = tuple(new.get(id(src), src) for src in node.srcs)
        if node is not target and any(a is not b for a, b in zip(srcs, node.srcs)):
            new[id(node)] = P.rebuild(node, srcs)
    return new.get(id(root), root)


def _epilogue(shapes: dict, match: AttentionMatch, name: str, out: Node, batch: tuple[str, ...], qn: str) -> str:
    """The output at (query qi, element hd) from `acc` (the unnormalised P V), `l_row` (the row's sum of
    exponentials) and `m_row` (its max score): the normalisation, then whatever the output computes; stored."""
    emitter, index, value = _output_value(shapes, match, name, out, batch, qn, indent=3)
    emitter.store(name, out.dtype, index, value)
    return "\n".join(emitter.lines)


def _pair_store(shapes: dict, match: AttentionMatch, name: str, out: Node, batch: tuple[str, ...],
                qn: str) -> dict | None:
    """The same output as a value of (qi, hd, acc, l_row, m_row), for attention_tma.cu.j2 to store a lane's two
    neighbouring elements (hd even) with one 4-byte store: for a 16-bit output (its rows, DV, are even) whose
    stored rows keep hd last."""
    emitter, index, value = _output_value(shapes, match, name, out, batch, qn, indent=4)
    return pair_store(emitter, value, name, out.dtype, index) if index[-1] == "hd" else None


def _output_value(shapes: dict, match: AttentionMatch, name: str, out: Node, batch: tuple[str, ...], qn: str,
                  indent: int) -> tuple[Emitter, tuple[str, ...], str]:
    """An emitter holding the statements of the output's value at (batch, qi, hd), the index it is stored at
    (through the output's views, `stored_through_views`), and the value."""
    out, order, stored = stored_through_views(out)
    emitter = Emitter({**shapes, name: stored}, indent=indent)
    row = batch + (qn,)
    last = match.score.ndim - 1
    for node in toposort([out]):
        if node.op == Op.MAX and node.srcs[0] is match.score and node.arg == last:
            emitter.reduced[id(node)] = (row, "m_row")
        elif node.op == Op.SUM and node.srcs[0] is match.exp and node.arg == last:
            emitter.reduced[id(node)] = (row, "l_row")
    value = "acc"
    if match.norm is not None:       # the probabilities' factor, constant along the keys (1 / l)
        factor = emitter.value(match.norm, batch + (qn, "0"))
        emitter.line(f"const float o_value = acc * {factor};")
        value = "o_value"
    index = batch + (qn, "hd")
    emitter.reduced[id(match.output)] = (index, value)
    return emitter, tuple(index[axis] for axis in order), emitter.value(out, index)
