"""The reference interpreter: evaluates any Graph in numpy float64. It is the oracle for every test.

Floats are float64 throughout (inputs held narrower, a float16 weight, are widened where an op reads them; a cast
between float dtypes does not round; `evaluate_nodes(rounded=True)`
evaluates at the graph's own precision instead, and `registers=True` as a kernel computes: float32), int32 stays
int32 and bool stays bool. `SEMANTICS` is the one definition of what each op means; a float op computes in the
width of the floats it is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .dtypes import DType, round_to_register
from .errors import InputError
from .graph import Graph
from .host_arrays import cast, cast_into
from .node import Node, toposort
from .ops import VIEWS, Op
from .patterns import (GatherMatch, MatmulMatch, lookup_ids, lookup_reads, match_gather, match_loose_matmul,
                       match_matmul)
from .streaming import (STREAM_ELEMENTS, Region, Stream, blocks, full_region, pad_widths, reduced_region,
                        region_shape, region_slices, streams, view_source_region)


def _host_dtype(dtype: DType) -> type:
    return {DType.INT32: np.int32, DType.BOOL: np.bool_}.get(dtype, np.float64)


def _kept(node: Node, value: np.ndarray) -> np.ndarray:
    """A float op's value in the width its operands had (float64 in the reference, float32 in registers); other
    values in their host dtype."""
    if node.dtype.is_float and value.dtype.kind == "f":
        return value
    return value.astype(_host_dtype(node.dtype), copy=False)


def _cast(x: np.ndarray, node: Node) -> np.ndarray:
    if node.dtype == DType.BOOL:
        return x != 0
    if node.dtype == DType.INT32:
        with np.errstate(invalid="ignore"):
            return np.trunc(x).astype(np.int32) if x.dtype.kind == "f" else x.astype(np.int32)
    return x if x.dtype.kind == "f" else x.astype(np.float64)   # between floats, a value is not rounded


def _iota(node: Node) -> np.ndarray:
    axis = node.arg
    line = np.arange(node.shape[axis], dtype=np.int32).reshape([-1 if a == axis else 1 for a in range(node.ndim)])
    return np.asarray(np.broadcast_to(line, node.shape), order="C")


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[[Node, np.ndarray], np.ndarray]:
    def apply(node: Node, x: np.ndarray) -> np.ndarray:
        return _kept(node, np.asarray(fn(x, axis=node.arg)))
    return apply


def _slice(node: Node, x: np.ndarray) -> np.ndarray:
    return x[tuple(slice(lo, hi) for lo, hi in node.arg)]


# One entry per op: (node, *source values) -> value.
SEMANTICS: dict[Op, Callable[..., np.ndarray]] = {
    Op.EXP2: lambda n, x: np.exp2(x),
    Op.LOG2: lambda n, x: np.log2(x),
    Op.SIN: lambda n, x: np.sin(x),
    Op.SQRT: lambda n, x: np.sqrt(x),
    Op.RECIP: lambda n, x: np.divide(1.0, x),
    Op.ADD: lambda n, a, b: _kept(n, a + b),
    Op.MUL: lambda n, a, b: _kept(n, a * b),
    Op.MOD: lambda n, a, b: _kept(n, np.fmod(a, b)),
    Op.LESS_THAN: lambda n, a, b: np.less(a, b),
    Op.SUM: _reduce(np.sum),
    Op.MAX: _reduce(np.max),
    Op.CONSTANT: lambda n: np.broadcast_to(np.asarray(n.arg, dtype=_host_dtype(n.dtype)), n.shape),   # a read-only view
    Op.IOTA: _iota,
    Op.CAST: lambda n, x: _cast(x, n),
    Op.RESHAPE: lambda n, x: x.reshape(n.arg),
    Op.PERMUTE: lambda n, x: np.transpose(x, n.arg),
    Op.EXPAND: lambda n, x: np.broadcast_to(x, n.arg),
    Op.SLICE: _slice,
    Op.PAD: lambda n, x: np.pad(x, n.arg),
    Op.CONTIGUOUS: lambda n, x: np.asarray(x, order="C"),   # (np.ascontiguousarray makes a 0-d array 1-d)
}


# Elementwise float ops that may write their result over a source's array: SEMANTICS' functions, with `out`
# (tests/ir/test_interpreter.py checks both ways give the same values on every graph case).
IN_PLACE: dict[Op, Callable[..., np.ndarray]] = {
    Op.EXP2: np.exp2, Op.LOG2: np.log2, Op.SIN: np.sin, Op.SQRT: np.sqrt, Op.ADD: np.add, Op.MUL: np.multiply,
    Op.RECIP: lambda x, out: np.divide(1.0, x, out=out),
}


@dataclass(frozen=True)
class Plan:
    """What evaluating `roots` computes: the nodes in order, the matrix products evaluated with np.matmul, the
    reductions evaluated in blocks (streaming.py), and the ids of the nodes whose whole values it holds."""

    order: list[Node]
    matmuls: dict[int, MatmulMatch]
    streamed: dict[int, Stream]
    needed: set[int]
    lookups: dict[int, GatherMatch]

    def sources(self, node: Node) -> list[Node]:
        """The values `node` is computed from: a lookup's table and ids, a matmul's operands, a streamed reduction's
        frontier, else its srcs."""
        if (lookup := self.lookups.get(id(node))) is not None:
            return [lookup.values, lookup.ids]
        if (match := self.matmuls.get(id(node))) is not None:
            return [operand_source(match.lhs), operand_source(match.rhs)]
        if (stream := self.streamed.get(id(node))) is not None:
            return list(stream.frontier)
        return list(node.srcs)


def evaluation_plan(roots: Iterable[Node], stream: bool = True) -> Plan:
    order = toposort(list(roots))
    lookups = {id(n): lookup for n in order if (lookup := match_gather(n)) is not None and _broadcast_table(lookup)}
    matmuls = {id(n): m for n in order if id(n) not in lookups and (m := match_loose_matmul(n)) is not None}
    plan = Plan(order, matmuls, streams(order, set(matmuls) | set(lookups)) if stream else {}, set(), lookups)
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) not in plan.needed:
            plan.needed.add(id(node))
            stack += plan.sources(node)
    return plan


def held_sizes(roots: Iterable[Node]) -> list[int]:
    """Elements of each array evaluating `roots` holds whole (views aside), and of each streamed reduction's block
    (its cone's arrays for one block at once): what the evaluation's memory is made of."""
    plan = evaluation_plan(roots)
    whole = [math.prod(n.shape) for n in plan.order
             if id(n) in plan.needed and n.op not in VIEWS and n.op != Op.INPUT]
    return whole + [STREAM_ELEMENTS * len(s.cone) for s in plan.streamed.values()]


def evaluate_nodes(roots: Iterable[Node], leaves: Mapping[str, np.ndarray],
                   roots_only: bool = False, rounded: bool = False,
                   registers: bool = False, stream: bool = True,
                   watch: Callable[[Node, np.ndarray], None] | None = None) -> dict[int, np.ndarray]:
    """Values of every node needed for `roots`, keyed by id(node); INPUT nodes read `leaves[name]`.

    A matrix product written as sum(expand(a) * expand(b)) is evaluated with np.matmul rather than by
    materialising its (..., M, K, N) product: the same float64 value, without the M*K*N memory. With `stream`,
    another reduction over a large computed source (a broadcast) is evaluated block by block (streaming.py): the
    same value, and the nodes of its source's cone have no value in the result unless something else needs them.
    With `roots_only` the caller reads the roots' values alone, so an elementwise op may compute into the
    array of a source that nothing else reads (large graphs then allocate, and fault in, far less memory);
    the other values are then not to be read. With `registers`, floats are float32 as a kernel's registers hold
    them: constants are float32, a cast between floats changes nothing, and a matrix product's float16 or bfloat16
    operands are rounded to their dtype, as the tensor cores take them; overflow gives inf as on the GPU. With
    `rounded`, as `registers` but every float value an op computes is also rounded to its node's dtype, as memory
    of that dtype would hold it: the graph at its own precision, as a program of one kernel per op computes it
    (float32 sums and products accumulate their rounding as the GPU's do). `watch(node, value)` sees each value
    computed as it is computed, and may raise to end the evaluation early. With `roots_only` and no `watch`, a leaf
    held narrower than the evaluation computes (a float16 weight) is kept so and widened where an op reads it (a
    large matrix operand a block at a time, `widening_matmul`): a real-size model's weights are not copied whole.
    """
    registers = registers or rounded
    width = _width(registers)
    narrow = roots_only and watch is None   # leaves held as given, widened where read (the caller reads the roots)
    roots = list(roots)
    plan = evaluation_plan(roots, stream)
    readers = _readers(plan, roots) if roots_only else {}
    owned: set[int] = set()   # nodes whose value is a float64 array this evaluation allocated
    values: dict[int, np.ndarray] = {}
    scratch: dict[np.dtype, np.ndarray] = {}   # the memory a large weight is widened into, a block at a time
    with np.errstate(all="ignore"):
        for node in plan.order:
            if id(node) not in plan.needed:
                continue
            if node.op == Op.INPUT:
                leaf = leaves[node.arg]
                if narrow and _narrower(leaf, width):
                    values[id(node)] = leaf
                    continue
                value = leaf.astype(np.float32) if registers and leaf.dtype == np.float64 else leaf
            elif node.op in VIEWS and _narrower(source := values[id(node.srcs[0])], width):
                values[id(node)] = SEMANTICS[node.op](node, source)   # a view of a leaf held narrow: narrow too
                continue
            elif id(node) in plan.lookups:
                lookup = plan.lookups[id(node)]
                rows = looked_up(lookup, values[id(lookup.values)], values[id(lookup.ids)])
                if narrow and _narrower(rows, width):   # rows of a table held narrow: narrow too, as a leaf is
                    values[id(node)] = rows
                    continue
                value = _kept(node, rows.astype(np.float32 if registers else np.float64, copy=False)
                              if rows.dtype.kind == "f" else rows)
            elif id(node) in plan.matmuls:
                match = plan.matmuls[id(node)]
                lhs, rhs = matmul_operands(match, values[id(operand_source(match.lhs))],
                                           values[id(operand_source(match.rhs))])
                if registers and match_matmul(node) is not None:   # a single row's product runs in a row kernel
                    lhs, rhs = _mma_operand(lhs, match.lhs.dtype), _mma_operand(rhs, match.rhs.dtype)
                product = widening_matmul(lhs, rhs, width, scratch)   # a batch both sides broadcast: whole, a view
                value = _kept(node, product if product.shape == node.shape else np.broadcast_to(product, node.shape))
            elif id(node) in plan.streamed:
                value = _streamed(plan.streamed[id(node)], values, registers, rounded)
            elif roots_only and node.op in IN_PLACE and node.dtype.is_float:
                sources = [_widened(values[id(s)], width) for s in node.srcs]
                result = np.result_type(*sources)
                spare = next((s for s in node.srcs if id(s) in owned and readers[id(s)] == 1
                              and values[id(s)].shape == node.shape and values[id(s)].dtype == result
                              and isinstance(values[id(s)], np.ndarray) and values[id(s)].flags.writeable), None)
                if spare is not None:
                    value = IN_PLACE[node.op](*sources, out=values.pop(id(spare)))
                    owned.discard(id(spare))
                else:
                    value = np.asarray(SEMANTICS[node.op](node, *sources))
                if value.dtype.kind == "f":
                    owned.add(id(node))
            else:
                value = _computed(node, [values[id(s)] for s in node.srcs], registers)
            values[id(node)] = _settled(node, value, registers, rounded)
            if watch is not None:
                watch(node, values[id(node)])
    for root in roots:   # a root that is a narrow leaf (or a view of one), at the evaluation's width
        values[id(root)] = _widened(values[id(root)], width)
    return values


def _width(registers: bool) -> np.dtype:
    """The float dtype an evaluation computes in: float32 as a kernel's registers, else float64."""
    return np.dtype(np.float32 if registers else np.float64)


def _narrower(value: np.ndarray, width: np.dtype) -> bool:
    """Whether `value` holds floats in fewer bytes than the evaluation computes in (a float16 weight)."""
    return value.dtype.kind == "f" and value.dtype.itemsize < width.itemsize


def _widened(value: np.ndarray, width: np.dtype) -> np.ndarray:
    """`value` at `width`; a broadcast (an axis of stride 0) is widened at its own size and broadcast again."""
    if not _narrower(value, width):
        return value
    if 0 in value.strides and value.size:
        compact = value[tuple(slice(0, 1) if step == 0 else slice(None) for step in value.strides)]
        return np.broadcast_to(compact.astype(width), value.shape)
    return value.astype(width)


def _computed(node: Node, sources: list[np.ndarray], registers: bool) -> np.ndarray:
    """`node`'s value from its sources' (numpy gives a scalar, not a 0-d array, for a rank-0 result: arrays are
    kept, `out=` needs them); a source held narrow is widened first, a view of it stays narrow."""
    if registers and node.op == Op.CONSTANT and node.dtype.is_float:
        return np.broadcast_to(np.float32(node.arg), node.shape)
    if node.op not in VIEWS:
        sources = [_widened(source, _width(registers)) for source in sources]
    return np.asarray(SEMANTICS[node.op](node, *sources))


WIDENED_BLOCK = 1 << 24      # elements of a narrow matrix operand widened at a time
WIDENED_AT_LEAST = 1 << 16   # a narrow operand smaller than this is widened whole


def widening_matmul(lhs: np.ndarray, rhs: np.ndarray, width: np.dtype,
                    scratch: dict[np.dtype, np.ndarray] | None = None) -> np.ndarray:
    """lhs @ rhs at `width`. A large narrow right operand (a weight held as float16, or float32 in the reference)
    is widened on every core a block of its columns at a time, into memory reused across blocks (and across the
    calls that share `scratch`): widened whole, a real-size model's weights were gigabytes of fresh memory, and
    faulting it in was most of a reference's time. A narrow operand of a matrix per batch (each tile's expert
    weight) is multiplied a batch at a time so."""
    lhs = _widened(lhs, width)
    if not _narrower(rhs, width) or rhs.size < WIDENED_AT_LEAST:
        return np.matmul(lhs, _widened(rhs, width))
    if any(s != 0 for s in rhs.strides[:-2]):   # a matrix per batch (an expert's weight per tile): one at a time
        batch = np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2])
        lhs, rhs = np.broadcast_to(lhs, batch + lhs.shape[-2:]), np.broadcast_to(rhs, batch + rhs.shape[-2:])
        out = np.empty(batch + (lhs.shape[-2], rhs.shape[-1]), width)
        for at in np.ndindex(*batch):
            out[at] = widening_matmul(lhs[at], rhs[at], width, scratch)
        return out
    matrix = rhs[(0,) * (rhs.ndim - 2)]   # one matrix, broadcast over the batch
    k, n = matrix.shape
    out = np.empty(np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]) + (lhs.shape[-2], n), width)
    step = max(1, WIDENED_BLOCK // max(k, 1))
    scratch = {} if scratch is None else scratch
    if width not in scratch or scratch[width].size < k * min(step, n):
        scratch[width] = np.empty(k * min(step, n), width)
    memory = scratch[width]
    transposed = matrix.flags.f_contiguous and not matrix.flags.c_contiguous   # x @ W.T: W's rows are its columns
    for start in range(0, n, step):
        cols = min(start + step, n) - start
        if transposed:   # widened as W's rows, whose memory is contiguous
            cast_into(memory[:k * cols].reshape(cols, k), matrix[:, start:start + cols].T)
            block = memory[:k * cols].reshape(cols, k).T
        else:
            block = cast_into(memory[:k * cols].reshape(k, cols), matrix[:, start:start + cols])
        out[..., start:start + cols] = np.matmul(lhs, block)
    return out


def _settled(node: Node, value: np.ndarray, registers: bool, rounded: bool) -> np.ndarray:
    """A computed value as the evaluation keeps it: rounded to its dtype (`rounded`), or float32 (`registers`)."""
    if rounded and node.dtype.is_float and node.op not in VIEWS and node.op != Op.INPUT:
        return round_to_register(value, node.dtype)
    if registers and node.dtype.is_float and value.dtype != np.float32:   # ints cast to floats
        return value.astype(np.float32)
    return value


def _streamed(stream: Stream, values: dict[int, np.ndarray], registers: bool, rounded: bool) -> np.ndarray:
    """A reduction evaluated block by block of its source, each block computed from its cone's blocks."""
    reduction = stream.reduction
    evaluator = _Blocks(values, registers, rounded)
    out: np.ndarray | None = None
    for block in blocks(stream):
        source = _widened(evaluator.value(reduction.srcs[0], block), _width(registers))
        reduced = np.asarray(SEMANTICS[reduction.op](reduction, source))
        if out is None:
            out = np.empty(reduction.shape, reduced.dtype)
        out[region_slices(reduced_region(block, reduction.arg))] = reduced
        evaluator.block_done()
    assert out is not None
    return out


class _Blocks:
    """Regions of the nodes of a streamed cone, computed as evaluate_nodes computes whole values: cut from a value
    held whole (`values`), or computed from their sources' regions."""

    def __init__(self, values: dict[int, np.ndarray], registers: bool, rounded: bool):
        self.values, self.registers, self.rounded = values, registers, rounded
        self.memo: dict[tuple[int, Region], np.ndarray] = {}   # this block's regions, by node and region
        self.whole: dict[int, np.ndarray] = {}   # sources read whole (a reshape that cannot map a block), kept

    def block_done(self) -> None:
        self.memo.clear()

    def value(self, node: Node, region: Region) -> np.ndarray:
        key = (id(node), region)
        if key not in self.memo:
            self.memo[key] = self._computed(node, region)
        return self.memo[key]

    def _computed(self, node: Node, region: Region) -> np.ndarray:
        if id(node) in self.values:   # (a leaf held narrow is widened where read, by the op that reads it)
            return np.asarray(self.values[id(node)])[region_slices(region)]
        if node.op == Op.CONSTANT:
            value = np.broadcast_to(_computed(node, [], self.registers), node.shape)[region_slices(region)]
        elif node.op == Op.IOTA:
            lo, hi = region[node.arg]
            line = np.arange(lo, hi, dtype=np.int32).reshape([-1 if a == node.arg else 1 for a in range(node.ndim)])
            value = np.broadcast_to(line, region_shape(region))
        elif node.op in VIEWS:
            value = self._view(node, region)
        else:
            value = _computed(node, [self.value(s, region) for s in node.srcs], self.registers)
        return _settled(node, value, self.registers, self.rounded)

    def _view(self, node: Node, region: Region) -> np.ndarray:
        """`region` of a view, from the region of its source it reads (the whole source where a reshape cannot
        map the block: computed once for all blocks)."""
        source = node.srcs[0]
        where = view_source_region(node, region)
        if where is None:
            if id(source) not in self.whole:
                self.whole[id(source)] = self.value(source, full_region(source.shape))
            return SEMANTICS[node.op](node, self.whole[id(source)])[region_slices(region)]
        value = self.value(source, where)
        if node.op == Op.PERMUTE:
            return np.transpose(value, node.arg)
        if node.op == Op.EXPAND:
            return np.broadcast_to(value, region_shape(region))
        if node.op == Op.PAD:
            return np.pad(value, pad_widths(node, region))
        if node.op == Op.RESHAPE:
            return value.reshape(region_shape(region))
        return value   # SLICE: the source's region is the slice


def _broadcast_table(lookup: GatherMatch) -> bool:
    """Whether a lookup's values are a broadcast of something smaller than its product (a table, expanded along the
    ids' axes) or an input table too large to sum in one piece (one token's embedding of a vocabulary), which
    `looked_up` reads rows of; values computed at the product's size are summed as any sum is (in blocks,
    streaming.py), not made whole."""
    source = lookup.values
    while source.op in VIEWS:
        source = source.srcs[0]
    product = lookup.reduce.srcs[0].size
    return source.size < product or (source.op == Op.INPUT and product > STREAM_ELEMENTS)   # else summed in blocks


def looked_up(lookup: GatherMatch, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A lookup's value: `table` (the summed product's other operand) at the row each id selects, zero where the id
    is out of range. This is the one-hot sum's value wherever the rows it does not select are finite (a sum would
    turn an inf there into nan), without its product, which for a vocabulary is tokens x rows x width."""
    axis, length = lookup.reduce.arg, lookup.length
    grid = np.indices(lookup.reduce.shape, sparse=True)
    at = [grid[a if a < axis else a - 1] if a is not None else 0 for a in lookup.ids_axes]
    ids = ids[tuple(at)]     # over the result's axes, of size 1 along those the ids do not vary over
    ids = ids.reshape((1,) * (len(lookup.reduce.shape) - ids.ndim) + ids.shape)
    rows = _rows_picked(table, ids, axis, length)
    if rows is not None:
        return rows
    ids = np.broadcast_to(ids, lookup.reduce.shape)
    picked = np.take_along_axis(table, np.expand_dims(np.clip(ids, 0, length - 1), axis), axis=axis)
    return np.where((ids >= 0) & (ids < length), picked.squeeze(axis), 0).astype(table.dtype, copy=False)


def _rows_picked(table: np.ndarray, ids: np.ndarray, axis: int, length: int) -> np.ndarray | None:
    """The lookup as whole slices copied from the table, where the table is the same along every axis the ids vary
    over (a broadcast: an expert's weight picked per tile of rows): each id's slice once, not an index per element
    of the result (for tiles x 14336 x 4096 weights, seconds rather than minutes); None where the table varies
    there too."""
    varying = [a for a in range(ids.ndim) if ids.shape[a] > 1]
    along = [a if a < axis else a + 1 for a in varying]          # the same axes of the table (the summed one kept)
    if any(table.shape[a] > 1 and table.strides[a] != 0 for a in along):
        return None
    plain = table[tuple(0 if a in along else slice(None) for a in range(table.ndim))]   # the table, once
    summed = axis - sum(1 for a in along if a < axis)
    others = [a for a in range(ids.ndim) if a not in varying]     # the result's other axes, in order
    compact = ids.reshape([ids.shape[a] for a in varying])
    picked = np.moveaxis(plain, summed, 0)[np.clip(compact, 0, length - 1)]     # (*ids' axes, *others)
    picked[(compact < 0) | (compact >= length)] = 0
    return np.moveaxis(picked, list(range(len(varying) + len(others))), varying + others)


def operand_source(operand: Node) -> Node:
    """The node whose value a matrix product's operand broadcasts: its expand's source, or the operand itself where
    the product has one row (or one column) and nothing is expanded along it."""
    return operand.srcs[0] if operand.op == Op.EXPAND else operand


def matmul_operands(match: MatmulMatch, lhs: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A matrix product's operands as (..., M, K) and (..., K, N) arrays, from their sources (`operand_source`:
    (..., M, K, 1) and (..., 1, K, N)); an axis a source broadcasts (size 1: a row, a column or K) is made whole, as
    a view."""
    m, n, k = match.dims
    lhs, rhs = lhs[..., 0], rhs[..., 0, :, :]
    return np.broadcast_to(lhs, lhs.shape[:-2] + (m, k)), np.broadcast_to(rhs, rhs.shape[:-2] + (k, n))


def _mma_operand(values: np.ndarray, dtype: DType) -> np.ndarray:
    """A matrix product's operand as the tensor cores take it: float16 and bfloat16 rounded to their dtype (a fused
    prologue computes it in float32 and stores its tile at the operand's dtype); float32, and float16 held as
    float16, as they are."""
    if dtype == DType.FLOAT32 or (dtype == DType.FLOAT16 and values.dtype == np.float16):
        return values
    return round_to_register(values, dtype)


def _readers(plan: Plan, roots: list[Node]) -> dict[int, int]:
    """How many reads each needed node's value gets: one per consuming node, one per root; a streamed reduction
    counts as reading every node of its cone that is held whole (its blocks may be cut from it)."""
    readers = dict.fromkeys(plan.needed, 0)
    for node in plan.order:
        if id(node) in plan.needed:
            stream = plan.streamed.get(id(node))
            for source in plan.sources(node) + (list(stream.cone) if stream else []):
                if id(source) in readers:
                    readers[id(source)] += 1
    for root in roots:
        readers[id(root)] += 1
    return readers


def check_inputs(graph: Graph, inputs: Mapping[str, object], narrow: bool = False) -> dict[str, np.ndarray]:
    """The inputs as host arrays of the reference's dtypes (a table only looked up in keeps its own: its rows are
    widened as they are read, not a vocabulary's worth of them; with `narrow`, every float array keeps its own, for
    an evaluation of the roots alone, which widens them where it reads them), or an InputError naming what is
    wrong."""
    tables = _graph_lookup_reads(graph)
    missing = [name for name in graph.inputs if name not in inputs]
    extra = [name for name in inputs if name not in graph.inputs]
    if missing or extra:
        raise InputError(f"graph {graph.name!r} takes inputs {list(graph.inputs)}; "
                         f"missing {missing}, unexpected {extra}")
    arrays: dict[str, np.ndarray] = {}
    for name, node in graph.inputs.items():
        value = np.asarray(to_numpy(inputs[name]))
        if value.shape != node.shape:
            raise InputError(f"input {name!r} of graph {graph.name!r}: expected shape {node.shape}, got {value.shape}")
        if node.dtype.is_float != (value.dtype.kind == "f") or (node.dtype == DType.BOOL) != (value.dtype == bool):
            raise InputError(f"input {name!r} of graph {graph.name!r}: expected {node.dtype}, got {value.dtype}")
        kept = value.dtype.kind == "f" and value.dtype.itemsize <= 8 and (narrow or name in tables)
        arrays[name] = value if kept else cast(value, _host_dtype(node.dtype))
    for name, rows in graph_lookup_ids(graph).items():
        ids = arrays[name]
        outside = (ids < 0) | (ids >= rows)
        if outside.any():
            at = tuple(int(i) for i in np.argwhere(outside)[0])
            raise InputError(f"input {name!r} of graph {graph.name!r}: id {ids[at]} at {list(at)} is out of range: it"
                             f" looks up a row of a table of {rows} (valid ids are 0 to {rows - 1})")
    return arrays


def graph_lookup_ids(graph: Graph) -> dict[str, int]:
    """The graph's inputs that are lookup ids, with the rows they select from."""
    return _lookup_ids(tuple(graph.outputs.values()))


@lru_cache(maxsize=64)
def _lookup_ids(roots: tuple[Node, ...]) -> dict[str, int]:   # once per graph's outputs: every call checks its ids
    return lookup_ids(list(roots))


def _graph_lookup_reads(graph: Graph) -> dict[str, int]:
    return _lookup_reads(tuple(graph.outputs.values()))


@lru_cache(maxsize=64)
def _lookup_reads(roots: tuple[Node, ...]) -> dict[str, int]:
    return lookup_reads(list(roots))


def to_numpy(value: Any) -> Any:
    """Accept torch tensors (on any device) and cupy arrays as well as numpy arrays."""
    if type(value).__module__.startswith("torch"):
        return value.detach().float().cpu().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    if hasattr(value, "get") and type(value).__module__.startswith("cupy"):
        return value.get()
    return value


def evaluate(graph: Graph, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` in float64: {output name: array}.

    >>> evaluate(g, {"x": np.ones((4,), np.float32)})["y"]
    """
    if not graph.outputs:
        raise InputError(f"graph {graph.name!r} has no outputs")
    try:
        values = evaluate_nodes(graph.outputs.values(), check_inputs(graph, inputs, narrow=True), roots_only=True)
        return {name: np.array(values[id(node)]) for name, node in graph.outputs.items()}
    except MemoryError as err:
        raise InputError(f"graph {graph.name!r} is too large to evaluate in float64 on this machine ({err}); evaluate"
                         f" it at a smaller size") from None
